"""The contenders, all built from one tformer Encoder's weights (converted, never re-initialised).

Each contender is a function (ids, mask) -> last hidden state (B, S, D), so that the suite can
check every output against tformer's before timing anything. ``mask`` is (B, S) bool, True = real
token, or None.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
import torch
from torch import Tensor, nn

from tformer import reference
from tformer.commands.benchmarking.floor import FloorEncoder
from tformer.config import TransformerConfig, bert_layout
from tformer.export.torch_nn import to_torch_encoder
from tformer.formats.hf_bert import config_to_hf, to_hf
from tformer.nn.kernels import linear_kernels
from tformer.nn.model import Encoder

Run = Callable[[Tensor, Tensor | None], object]

# (d_model, n_heads, d_ff): the widths, and the --quick stand-ins for CI.
WIDTHS = {"small": (256, 4, 1024), "base": (768, 12, 3072)}
QUICK_WIDTHS = {"small": (32, 2, 64), "base": (48, 4, 96)}
VOCAB = 8192


def bert_config(width: str, quick: bool = False, norm_first: bool = False, n_layers: int = 4,
                dropout: float = 0.0) -> TransformerConfig:
    """A BERT-style encoder (learned positions, token types, embedding norm, GELU, post-norm)
    that HuggingFace's BertModel, torch.nn and tformer can all express; pre-norm for nn and us."""
    d, h, f = (QUICK_WIDTHS if quick else WIDTHS)[width]
    return bert_layout(d_model=d, n_heads=h, d_ff=f, n_layers=2 if quick else n_layers,
                       dropout=dropout, norm_first=norm_first, final_norm=norm_first, max_len=512,
                       vocab_size=VOCAB)


def inputs(config: TransformerConfig, batch: int, seq: int, padded: bool,
           seed: int = 0) -> tuple[Tensor, Tensor | None]:
    """Token ids (B, S) and, when padded, a mask where half the sequences hold S/4 real tokens."""
    g = torch.Generator().manual_seed(seed)
    ids = torch.randint(1, config.vocab_size, (batch, seq), generator=g)
    if not padded:
        return ids, None
    mask = torch.ones(batch, seq, dtype=torch.bool)
    mask[batch // 2 :, max(1, seq // 4) :] = False
    return ids.masked_fill(~mask, 0), mask


# torch -----------------------------------------------------------------------------------------
# The bench's only references to tformer.nn.kernels' internals are these two helpers.
def onednn_linear(dtype: torch.dtype = torch.float32) -> bool:
    """Whether oneDNN's fused linear runs this dtype here (bf16 needs CPU bf16 instructions)."""
    return linear_kernels._ONEDNN and (dtype != torch.bfloat16 or linear_kernels._ONEDNN_BF16)


def onednn_matmul(x: Tensor, w: Tensor) -> Tensor:
    """x @ w.T through oneDNN's linear, as tformer's kernels call it."""
    return linear_kernels._onednn_linear(x, w, None)


def tformer(encoder: Encoder, skip_padding: bool | None = None) -> Run:
    def run(ids, mask):
        return encoder(ids, mask, skip_padding=skip_padding).last_hidden_state

    return run


def tformer_padded(encoder: Encoder, skip_padding: bool | None = None):
    """(ids, mask, token types) -> last hidden state: the DEFAULT forward (no flag) when
    ``skip_padding`` is None, else the explicit override."""
    flag = {} if skip_padding is None else {"skip_padding": skip_padding}

    def run(ids, mask, types):
        return encoder(ids, mask, token_type_ids=types, **flag).last_hidden_state

    return run


def torch_nn_stack(encoder: Encoder) -> nn.TransformerEncoder:
    """torch.nn.TransformerEncoder with the encoder's layer weights (convert.torch_nn), its fast
    path fully on: nested tensors skip padding, which it does for post-norm layers only."""
    c = encoder.config
    stack = to_torch_encoder(encoder, layers_only=True, nested_tensor=not c.norm_first)
    return stack.to(next(encoder.parameters()).dtype).train(encoder.training)


def torch_nn(encoder: Encoder, stack: nn.TransformerEncoder) -> Run:
    """nn has no embeddings: it gets tformer's (the same work for every contender)."""

    def run(ids, mask):
        h = encoder.embed(ids)  # (B, S, D)
        return stack(h, src_key_padding_mask=None if mask is None else ~mask)

    return run


def hf_bert_model(encoder: Encoder) -> nn.Module | None:
    """HuggingFace BertModel (attn_implementation="sdpa") with the same weights; None if absent."""
    try:  # transformers is optional (tformer[hf])
        from transformers import BertConfig, BertModel
    except ImportError:
        return None

    config = BertConfig(**config_to_hf(encoder.config))
    model = BertModel._from_config(config, attn_implementation="sdpa", add_pooling_layer=False)
    state = to_hf(encoder.state_dict(), encoder.config)
    missing, unexpected = model.load_state_dict(state, strict=False)
    if unexpected or [k for k in missing if not k.endswith(("position_ids", "token_type_ids"))]:
        raise ValueError(f"BertModel: missing {missing}, unexpected {unexpected}")
    return model.to(next(encoder.parameters()).dtype).train(encoder.training)


def hf_bert(model: nn.Module) -> Run:
    def run(ids, mask):
        return model(input_ids=ids, attention_mask=mask).last_hidden_state

    return run


# NumPy -------------------------------------------------------------------------------------------
def numpy_state(encoder: Encoder) -> dict[str, np.ndarray]:
    return {k: v.detach().float().numpy() for k, v in encoder.state_dict().items()}


def numpy_reference(encoder: Encoder) -> Run:
    ref = reference.Encoder(encoder.config, np.float32)
    ref.load_state_dict(numpy_state(encoder))

    def run(ids, mask):
        return ref(ids.numpy(), None if mask is None else mask.numpy()).last_hidden_state

    return run


def numpy_floor(encoder: Encoder) -> Run:
    floor = FloorEncoder(encoder.config, numpy_state(encoder))

    def run(ids, mask):
        return floor(ids.numpy(), None if mask is None else mask.numpy())

    return run


# Checking outputs --------------------------------------------------------------------------------
def max_abs_diff(output, expected: Tensor, mask: Tensor | None) -> float:
    """Max |output - expected| over real tokens (padded positions hold different garbage)."""
    out = torch.as_tensor(np.asarray(output.detach() if isinstance(output, Tensor) else output))
    diff = (out.double() - expected.detach().double()).abs()  # (B, S, D)
    if mask is not None:
        diff = diff[mask]
    return float(diff.max()) if diff.numel() else 0.0


def min_cosine(output: Tensor, expected: Tensor, mask: Tensor | None) -> float:
    """Smallest per-token cosine similarity over real tokens."""
    a, b = output.detach().double(), expected.detach().double()
    if mask is not None:
        a, b = a[mask], b[mask]
    return float(torch.nn.functional.cosine_similarity(a, b, dim=-1).min())
