"""NumPy mirror of tformer.masks. One convention: boolean, True = may attend."""

from __future__ import annotations

import numpy as np

_ADDITIVE_BLOCKED = -1e4


def from_key_padding_mask(key_padding_mask: np.ndarray) -> np.ndarray:
    """PyTorch's ``key_padding_mask`` (True = pad) -> ``attention_mask`` (True = real)."""
    if key_padding_mask.dtype != np.bool_:
        raise TypeError(
            f"key_padding_mask: expected a bool array (True = pad), got {key_padding_mask.dtype}"
        )
    return ~key_padding_mask


def from_hf_attention_mask(attention_mask: np.ndarray) -> np.ndarray:
    """HuggingFace ``attention_mask`` (1 = real, 0 = pad) -> bool (True = real)."""
    if np.issubdtype(attention_mask.dtype, np.floating):
        if not ((attention_mask == 0) | (attention_mask == 1)).all():
            raise ValueError("attention_mask: expected only 0 and 1 values")
    return attention_mask != 0


def from_additive_mask(mask: np.ndarray) -> np.ndarray:
    """Additive float mask (0 = attend, -inf or very negative = blocked) -> bool."""
    if not np.issubdtype(mask.dtype, np.floating):
        raise TypeError(f"mask: expected a float additive mask, got {mask.dtype}")
    blocked = mask <= _ADDITIVE_BLOCKED
    if not ((mask == 0) | blocked).all():
        raise ValueError(
            "mask: an additive mask must hold only 0 (attend) and -inf or <= -1e4 (blocked); "
            "this one holds other values (a bias), which a boolean mask cannot express"
        )
    return ~blocked


def causal_mask(t: int, s: int | None = None) -> np.ndarray:
    """(T, S) bool: query t may attend key s iff s <= t + (S - T)."""
    s = t if s is None else s
    return np.tril(np.ones((t, s), dtype=bool), k=s - t)


def as_bool(mask: np.ndarray, name: str) -> np.ndarray:
    mask = np.asarray(mask)
    if mask.dtype == np.bool_:
        return mask
    if np.issubdtype(mask.dtype, np.floating):
        raise TypeError(
            f"{name}: expected a bool or 0/1 integer mask (True = may attend), got {mask.dtype}; "
            "convert additive masks with tformer.reference.masks.from_additive_mask"
        )
    return mask != 0


def build_attention_mask(
    attention_mask: np.ndarray | None,
    attn_mask: np.ndarray | None,
    batch: int,
    t: int,
    s: int,
    causal: bool = False,
) -> np.ndarray | None:
    """Combine padding, general and causal masks into one bool mask (B|1, 1, T|1, S), or None."""
    mask = None
    if attention_mask is not None:
        attention_mask = as_bool(attention_mask, "attention_mask")
        if attention_mask.shape != (batch, s):
            raise ValueError(
                f"attention_mask: expected shape (B, S) = ({batch}, {s}), "
                f"got {tuple(attention_mask.shape)}"
            )
        mask = attention_mask[:, None, None, :]  # (B, 1, 1, S)
    if attn_mask is not None:
        attn_mask = as_bool(attn_mask, "attn_mask")
        if attn_mask.ndim == 2:
            attn_mask = attn_mask[None]  # (1, T, S)
        ok = attn_mask.ndim == 3 and all(
            a in (1, b) for a, b in zip(attn_mask.shape, (batch, t, s), strict=True)
        )
        if not ok:
            raise ValueError(
                f"attn_mask: expected a shape broadcastable to (B, T, S) = ({batch}, {t}, {s}), "
                f"got {tuple(attn_mask.shape)}"
            )
        general = attn_mask[:, None]  # (B|1, 1, T|1, S|1)
        mask = general if mask is None else mask & general
    if causal:
        future = causal_mask(t, s)[None, None]  # (1, 1, T, S)
        mask = future if mask is None else mask & future
    return mask
