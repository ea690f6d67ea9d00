"""NumPy mirror of tformer.nn.masks. One convention: boolean, True = may attend.

``make_mask`` builds the one ``Mask`` that layers, pooling and the classifier consume. The
reference always runs the padded batch, so its Mask has no packing (tformer.nn.masks has).
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import cached_property

import numpy as np

_ADDITIVE_BLOCKED = -1e4


def from_key_padding_mask(key_padding_mask: np.ndarray) -> np.ndarray:
    """PyTorch's ``key_padding_mask`` (True = pad) -> ``attention_mask`` (True = real)."""
    key_padding_mask = np.asarray(key_padding_mask)
    if key_padding_mask.dtype != np.bool_:
        raise TypeError(
            f"key_padding_mask: expected a bool array (True = pad), got {key_padding_mask.dtype}"
            + ("; a float one is additive: convert it with from_additive_mask"
               if np.issubdtype(key_padding_mask.dtype, np.floating) else "")
        )
    return ~key_padding_mask


def from_hf_attention_mask(attention_mask: np.ndarray) -> np.ndarray:
    """HuggingFace ``attention_mask`` (1 = real, 0 = pad; int, float or bool) -> bool (True = real)."""
    attention_mask = np.asarray(attention_mask)
    if attention_mask.dtype == np.bool_:
        return attention_mask
    _check_zero_one(attention_mask, "attention_mask")
    return attention_mask != 0


def _check_zero_one(mask: np.ndarray, name: str) -> None:
    """Refuse a mask holding anything but 0 and 1 (token ids passed by mistake, a -1 sentinel,
    a soft weight), naming the first such value."""
    bad = (mask != 0) & (mask != 1)
    if bad.any():
        value = mask[bad][0].item()
        raise ValueError(f"{name}: expected only 0 and 1 (or bool; 1 = may attend), got {value}")


def from_additive_mask(mask: np.ndarray) -> np.ndarray:
    """Additive float mask (0 = attend, -inf or very negative = blocked) -> bool."""
    mask = np.asarray(mask)
    if not np.issubdtype(mask.dtype, np.floating):
        raise TypeError(f"mask: expected a float additive mask, got {mask.dtype}")
    blocked = mask <= _ADDITIVE_BLOCKED
    if not ((mask == 0) | blocked).all():
        if ((mask == 0) | (mask == 1)).all():  # HF's polarity, not an additive mask
            raise ValueError("mask: expected an additive mask (0 = attend, -inf = blocked), got "
                             "one of only 0 and 1 (1 = attend): convert it with from_hf_attention_mask")
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
    """Accept bool or 0/1 integer masks in our polarity; reject floats (likely additive) and
    integers other than 0 and 1 (likely token ids)."""
    mask = np.asarray(mask)
    if mask.dtype == np.bool_:
        return mask
    if np.issubdtype(mask.dtype, np.floating):
        raise TypeError(
            f"{name}: expected a bool or 0/1 integer mask (True = may attend), got {mask.dtype}; "
            "convert a 0/1 float mask with tformer.reference.masks.from_hf_attention_mask, an additive "
            "one with from_additive_mask"
        )
    _check_zero_one(mask, name)
    return mask != 0


@dataclass(frozen=True, eq=False)
class Mask:
    """An attention mask, made once by ``make_mask`` and consumed by every layer.

    ``allowed`` (B|1, 1, T|1, S) bool, True = query t may attend key s.
    ``padding`` (B, S) bool, True = real token, when the queries are the keys' own positions.
    ``keys`` (B, S) bool, True = real key, whenever the mask came from an ``attention_mask``.
    """

    allowed: np.ndarray | None
    padding: np.ndarray | None = None
    keys: np.ndarray | None = None

    @cached_property
    def attends_nothing(self) -> np.ndarray | None:
        """(B|1, 1, T|1, 1) True for query rows that may attend no key (they output zeros)."""
        return None if self.allowed is None else ~self.allowed.any(axis=-1, keepdims=True)

    @cached_property
    def lengths(self) -> np.ndarray:
        """(B,) real tokens per sequence."""
        return self.padding.sum(axis=1)

    def zero_padding(self, h: np.ndarray) -> np.ndarray:
        """(B, S, D) with padded positions set to zero (a no-op without padding)."""
        if self.padding is None:
            return h
        return np.where(self.padding[..., None], h, 0.0).astype(h.dtype, copy=False)

    def zero_padded_keys(self, x: np.ndarray) -> np.ndarray:
        """(B, L, D) with the positions of padded keys set to zero, x holding the last L of the
        S key positions (a decoder's new ones after its cache); a no-op without ``keys``.

        A blocked key gets weight 0, but 0 x NaN is NaN: a NaN or inf stored at padding (in
        embeddings passed in) would reach the real tokens through weights @ v. The models call
        this once, on their inputs.
        """
        if self.keys is None:
            return x
        real = self.keys[:, self.keys.shape[1] - x.shape[1] :]  # (B, L)
        return np.where(real[..., None], x, 0.0).astype(x.dtype, copy=False)


def as_mask(mask: Mask | np.ndarray | None) -> Mask | None:
    """Accept a ready ``Mask`` or a bool array broadcastable to (B, H, T, S) (leaf modules)."""
    if mask is None or isinstance(mask, Mask):
        return mask
    return Mask(as_bool(mask, "mask"))


def make_mask(
    attention_mask: np.ndarray | None,
    attn_mask: np.ndarray | None,
    batch: int,
    t: int,
    s: int,
    causal: bool = False,
    name: str = "attention_mask",
) -> Mask | None:
    """Combine padding, general and causal masks into one ``Mask``, or None for no mask."""
    allowed = padding = None
    if attention_mask is not None:
        padding = as_bool(attention_mask, name)
        if padding.shape != (batch, s):
            raise ValueError(
                f"{name}: expected shape (B, S) = ({batch}, {s}), got {tuple(padding.shape)}"
                + ("; pass a (B, 1, T, S) mask as attn_mask" if padding.ndim == 4 else "")
            )
        allowed = padding[:, None, None, :]  # (B, 1, 1, S)
    if attn_mask is not None:
        attn_mask = as_bool(attn_mask, "attn_mask")
        if attn_mask.ndim == 2:
            attn_mask = attn_mask[None]  # (1, T, S)
        elif attn_mask.ndim == 4 and attn_mask.shape[1] == 1:
            attn_mask = attn_mask[:, 0]  # (B|1, 1, T|1, S): HF's extended mask, one for all heads
        ok = attn_mask.ndim == 3 and all(
            a in (1, b) for a, b in zip(attn_mask.shape, (batch, t, s), strict=True)
        )
        if not ok:
            raise ValueError(
                f"attn_mask: expected a shape broadcastable to (B, T, S) = ({batch}, {t}, {s}) "
                f"or (B, 1, T, S), got {tuple(attn_mask.shape)}"
            )
        general = attn_mask[:, None]  # (B|1, 1, T|1, S|1)
        allowed = general if allowed is None else allowed & general
    if causal:
        future = causal_mask(t, s)[None, None]  # (1, 1, T, S)
        allowed = future if allowed is None else allowed & future
    if allowed is None:
        return None
    # Padding describes the queries too only when they are the keys' own positions.
    return Mask(allowed, padding if t == s and not causal else None, padding)
