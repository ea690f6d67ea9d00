"""NumPy mirror of tformer.nn.pooling: one vector per text from the encoder's token vectors.

Shape legend: B batch, S length, D model dim.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from tformer.config import POOLING_MODES
from tformer.reference.masks import Mask


def pool(h: np.ndarray, mask: Mask | None, modes: Sequence[str]) -> np.ndarray:
    """Pool token vectors into one vector per text; modes are concatenated in order.

    Shape:
        h: (B, S, D), zeros at padding; returns (B, len(modes) * D)
    """
    padding = None if mask is None else mask.padding  # (B, S) True = real token, or None
    if padding is None:
        count = np.full((h.shape[0], 1), h.shape[1], dtype=h.dtype)
    else:
        count = np.maximum(mask.lengths[:, None].astype(h.dtype), 1e-9)  # (B, 1)
    out = []
    for mode in modes:
        if mode == "cls":
            out.append(h[:, 0])  # (B, D)
        elif mode == "max":
            # Padding must never win the max: fill it with a very negative number.
            hm = h if padding is None else np.where(padding[..., None], h, -1e9).astype(h.dtype)
            out.append(hm.max(axis=1))  # (B, D)
        elif mode == "mean":
            out.append(h.sum(axis=1) / count)  # (B, D)
        elif mode == "mean_sqrt_len":
            out.append(h.sum(axis=1) / np.sqrt(count))  # (B, D)
        else:
            raise ValueError(f"pooling: expected one of {', '.join(POOLING_MODES)}, got {mode!r}")
    return np.concatenate(out, axis=-1)


def pool_backward(dpooled: np.ndarray, h: np.ndarray, mask: Mask | None,
                  modes: Sequence[str]) -> np.ndarray:
    """Shape: dpooled (B, len(modes) * D) -> dh (B, S, D).

    cls sends its gradient to position 0; a mean spreads it evenly over the real tokens; max
    sends it to the position that won (the first, on ties).
    """
    b, s, d = h.shape
    padding = None if mask is None else mask.padding
    count = np.full((b, 1), s, h.dtype) if padding is None else np.maximum(
        mask.lengths[:, None].astype(h.dtype), 1e-9)
    real = np.ones((b, s, 1), h.dtype) if padding is None else padding[..., None].astype(h.dtype)
    dh = np.zeros_like(h)
    for i, mode in enumerate(modes):
        g = dpooled[:, i * d : (i + 1) * d]  # (B, D)
        if mode == "cls":
            dh[:, 0] += g
        elif mode == "max":
            hm = h if padding is None else np.where(padding[..., None], h, -1e9)
            won = hm.argmax(axis=1)  # (B, D)
            np.put_along_axis(dh, won[:, None, :],
                              np.take_along_axis(dh, won[:, None, :], axis=1) + g[:, None], axis=1)
        elif mode == "mean":
            dh += g[:, None, :] * real / count[:, None]
        elif mode == "mean_sqrt_len":
            dh += g[:, None, :] * real / np.sqrt(count)[:, None]
        else:
            raise ValueError(f"pooling: expected one of {', '.join(POOLING_MODES)}, got {mode!r}")
    return dh
