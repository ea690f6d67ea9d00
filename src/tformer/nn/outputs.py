"""What the models return: one dataclass per model, HuggingFace's field names.

Shape legend: B batch, S source length, T target length, D model dim, H heads, V vocab, C classes.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch.export
import torch.utils._pytree as pytree
from torch import Tensor

from tformer.nn.layers import LayerCache
from tformer.nn.masks import Mask


@dataclass
class EncoderOutput:
    last_hidden_state: Tensor  # (B, S, D)
    hidden_states: tuple[Tensor, ...] | None = None  # n_layers + 1, embeddings first
    attentions: tuple[Tensor, ...] | None = None  # n_layers x (B, H, S, S)
    pooler_output: Tensor | None = None  # (B, D), BERT-style pooler only
    mask: Mask | None = None  # the mask the layers used: pooling reads its padding from here


@dataclass
class DecoderOutput:
    last_hidden_state: Tensor  # (B, T, D)
    past_key_values: tuple[LayerCache, ...] | None = None
    hidden_states: tuple[Tensor, ...] | None = None
    attentions: tuple[Tensor, ...] | None = None  # (B, H, T, T_past + T)
    cross_attentions: tuple[Tensor, ...] | None = None  # (B, H, T, S)


@dataclass
class Seq2SeqOutput:
    logits: Tensor  # (B, T, V)
    past_key_values: tuple[LayerCache, ...] | None = None
    encoder_last_hidden_state: Tensor | None = None  # (B, S, D)
    decoder_attentions: tuple[Tensor, ...] | None = None
    cross_attentions: tuple[Tensor, ...] | None = None
    decoder_last_hidden_state: Tensor | None = None  # (B, T, D): decode(..., project=False)


@dataclass
class ClassifierOutput:
    logits: Tensor  # (B, C)
    hidden_states: tuple[Tensor, ...] | None = None
    attentions: tuple[Tensor, ...] | None = None


# torch.export and torch.compile return outputs as pytrees: these say how to flatten ours.
# The mask is an input's view, not a result: exported programs drop it (it comes back None).
# (torch.export's name for pytree.register_dataclass: the same call, there since torch 2.2;
# pytree's own name is from 2025, newer than the oldest torch the package takes.)
for _output in (DecoderOutput, Seq2SeqOutput, ClassifierOutput):
    torch.export.register_dataclass(_output)
pytree.register_pytree_node(
    EncoderOutput,
    lambda o: ([o.last_hidden_state, o.hidden_states, o.attentions, o.pooler_output], None),
    lambda children, _: EncoderOutput(*children),
    serialized_type_name="tformer.nn.model.EncoderOutput",
)
