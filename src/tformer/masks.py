"""Every attention mask is built here. One convention: boolean, True = may attend.

Inputs users bring:
- ``attention_mask`` (B, S): True/1 = real token, False/0 = padding (HuggingFace's polarity).
- ``attn_mask`` broadcastable to (B, T, S): True = query t may attend key s.
Converters take the other conventions at the boundary: PyTorch's ``key_padding_mask``
(True = pad) and additive float masks (0 = attend, -inf = blocked).

Layers receive one combined mask broadcastable to (B, H, T, S), or None.
"""

from __future__ import annotations

import torch
from torch import Tensor

# Additive masks mark blocked entries with -inf or a very negative finite value
# (HuggingFace uses finfo.min); anything at or below this counts as blocked.
_ADDITIVE_BLOCKED = -1e4


def from_key_padding_mask(key_padding_mask: Tensor) -> Tensor:
    """PyTorch's ``key_padding_mask`` (True = pad) -> ``attention_mask`` (True = real)."""
    if key_padding_mask.dtype != torch.bool:
        raise TypeError(
            f"key_padding_mask: expected a bool tensor (True = pad), got {key_padding_mask.dtype}"
        )
    return ~key_padding_mask


def from_hf_attention_mask(attention_mask: Tensor) -> Tensor:
    """HuggingFace ``attention_mask`` (1 = real, 0 = pad) -> bool (True = real)."""
    if attention_mask.is_floating_point():
        if not bool(((attention_mask == 0) | (attention_mask == 1)).all()):
            raise ValueError("attention_mask: expected only 0 and 1 values")
    return attention_mask != 0


def from_additive_mask(mask: Tensor) -> Tensor:
    """Additive float mask (0 = attend, -inf or very negative = blocked) -> bool (True = attend).

    A mask holding other values is a bias, not a mask, and cannot be converted.
    """
    if not mask.is_floating_point():
        raise TypeError(f"mask: expected a float additive mask, got {mask.dtype}")
    blocked = mask <= _ADDITIVE_BLOCKED
    if not bool(((mask == 0) | blocked).all()):
        raise ValueError(
            "mask: an additive mask must hold only 0 (attend) and -inf or <= -1e4 (blocked); "
            "this one holds other values (a bias), which a boolean mask cannot express"
        )
    return ~blocked


def causal_mask(t: int, s: int | None = None, device: torch.device | None = None) -> Tensor:
    """(T, S) bool: query t may attend key s iff s <= t + (S - T).

    With a key/value cache the T new queries are the *last* T of S positions, so the
    diagonal shifts right by S - T (Vaswani et al. 2017, §3.2.3: no attending to the future).
    """
    s = t if s is None else s
    return torch.ones(t, s, dtype=torch.bool, device=device).tril(diagonal=s - t)


def as_bool(mask: Tensor, name: str) -> Tensor:
    """Accept bool or 0/1 integer masks in our polarity; reject floats (likely additive)."""
    if mask.dtype == torch.bool:
        return mask
    if mask.is_floating_point():
        raise TypeError(
            f"{name}: expected a bool or 0/1 integer mask (True = may attend), got {mask.dtype}; "
            "convert additive masks with tformer.masks.from_additive_mask"
        )
    return mask != 0


def build_attention_mask(
    attention_mask: Tensor | None,
    attn_mask: Tensor | None,
    batch: int,
    t: int,
    s: int,
    causal: bool = False,
) -> Tensor | None:
    """Combine padding, general and causal masks into one bool mask (B|1, 1, T|1, S), or None.

    Args:
        attention_mask: (B, S) keys that are real tokens.
        attn_mask: broadcastable to (B, T, S); True = query t may attend key s.
        causal: also forbid attending to later positions (decoder self-attention).
    """
    mask: Tensor | None = None
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
        if attn_mask.dim() == 2:
            attn_mask = attn_mask[None]  # (1, T, S)
        ok = attn_mask.dim() == 3 and all(
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
        device = mask.device if mask is not None else None
        future = causal_mask(t, s, device=device)[None, None]  # (1, 1, T, S)
        mask = future if mask is None else mask & future
    return mask
