"""One vector per text from the encoder's token vectors: the one pooling function.

The classifier (``config.pooling``) and sentence embeddings (a directory's
``1_Pooling/config.json``) both pool here. Reimers & Gurevych 2019 (Sentence-BERT) found mean
pooling the best default for embeddings; BERT's classifier reads the first ([CLS]) position.

Shape legend: B batch, S length, D model dim.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
from torch import Tensor

from tformer.config import POOLING_MODES
from tformer.nn.masks import Mask


def pool(h: Tensor, mask: Mask | None, modes: Sequence[str]) -> Tensor:
    """Pool token vectors into one vector per text; modes are concatenated in order.

    ``mask`` is the encoder's own (``EncoderOutput.mask``): its padding says which tokens are
    real. The encoder leaves zeros at padded positions, so sums need no masking.
    ``cls``: the first position; ``max``: the maximum over real tokens; ``mean``: the mean
    over real tokens; ``mean_sqrt_len``: their sum over sqrt(count).

    Shape:
        h: (B, S, D), zeros at padding; returns (B, len(modes) * D)
    """
    padding = None if mask is None else mask.padding  # (B, S) True = real token, or None
    if padding is None:
        count = torch.full((h.size(0), 1), h.size(1), dtype=h.dtype, device=h.device)
    else:
        count = mask.lengths[:, None].to(h.dtype).clamp(min=1e-9)  # (B, 1) real tokens per text
    out = []
    for mode in modes:
        if mode == "cls":
            out.append(h[:, 0])  # (B, D)
        elif mode == "max":
            # Padding must never win the max: fill it with a very negative number.
            hm = h if padding is None else h.masked_fill(~padding[..., None], -1e9)
            out.append(hm.max(dim=1).values)  # (B, D)
        elif mode == "mean":
            out.append(h.sum(dim=1) / count)  # (B, D)
        elif mode == "mean_sqrt_len":
            out.append(h.sum(dim=1) / count.sqrt())  # (B, D)
        else:
            raise ValueError(f"pooling: expected one of {', '.join(POOLING_MODES)}, got {mode!r}")
    return torch.cat(out, dim=-1)
