"""NumPy mirror of tformer.nn.outputs: what the models return, HuggingFace's field names.

Shape legend: B batch, S source length, T target length, D model dim, H heads, V vocab, C classes.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from tformer.reference.layers import LayerCache
from tformer.reference.masks import Mask


@dataclass
class EncoderOutput:
    last_hidden_state: np.ndarray  # (B, S, D)
    hidden_states: tuple[np.ndarray, ...] | None = None
    attentions: tuple[np.ndarray, ...] | None = None
    pooler_output: np.ndarray | None = None
    mask: Mask | None = None  # the mask the layers used: pooling reads its padding from here


@dataclass
class DecoderOutput:
    last_hidden_state: np.ndarray  # (B, T, D)
    past_key_values: tuple[LayerCache, ...] | None = None
    hidden_states: tuple[np.ndarray, ...] | None = None
    attentions: tuple[np.ndarray, ...] | None = None
    cross_attentions: tuple[np.ndarray, ...] | None = None


@dataclass
class Seq2SeqOutput:
    logits: np.ndarray  # (B, T, V)
    past_key_values: tuple[LayerCache, ...] | None = None
    encoder_last_hidden_state: np.ndarray | None = None
    decoder_attentions: tuple[np.ndarray, ...] | None = None
    cross_attentions: tuple[np.ndarray, ...] | None = None
    decoder_last_hidden_state: np.ndarray | None = None  # (B, T, D): decode(..., project=False)


@dataclass
class ClassifierOutput:
    logits: np.ndarray  # (B, C)
    hidden_states: tuple[np.ndarray, ...] | None = None
    attentions: tuple[np.ndarray, ...] | None = None
