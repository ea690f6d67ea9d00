"""Encoders with a head for one job, built on tformer.nn.model's Encoder (transformers' BertFor...).

    SentenceModel   encoder + pooling (+ L2 normalisation): one vector per text
                    (sentence-transformers' Transformer -> Pooling -> Normalize)
    MultiLabelClassifier  EncoderClassifier's logits, one independent yes/no per label
                    (a sigmoid each), and the probability above which each label is chosen

Shape legend: B batch, S length, D model dim. Masks: True = real token (tformer.nn.masks).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from tformer.config import TransformerConfig, check_config
from tformer.nn.model import Encoder, EncoderClassifier
from tformer.nn.pooling import pool


class SentenceModel(nn.Module):
    """An encoder and ``config.pooling`` (sentence-transformers' modes, several concatenated), L2
    normalised where ``normalize``: one vector per text. An embedding run trains it (its ranking
    loss compares cosines) and every embedding of a text runs its forward: `tformer embed`, the
    run's ``embed``, the server and evaluation. ``encoder``: an Encoder of ``config`` to wrap
    (a loaded one), instead of a new one."""

    def __init__(self, config: TransformerConfig, normalize: bool = True,
                 encoder: Encoder | None = None) -> None:
        super().__init__()
        self.config, self.normalize = check_config(config), normalize
        self.encoder = Encoder(config) if encoder is None else encoder

    @property
    def pooling(self) -> tuple[str, ...]:
        return self.config.pooling_modes

    @property
    def dim(self) -> int:
        """The length of a vector: the width times the pooling's modes."""
        return self.config.d_model * len(self.pooling)

    def forward(self, input_ids: Tensor, attention_mask: Tensor | None = None,
                token_type_ids: Tensor | None = None, normalize: bool | None = None) -> Tensor:
        """normalize: None follows the model's own.

        Shape:
            input_ids (B, S); attention_mask (B, S) -> (B, D * len(pooling))
        """
        types = token_type_ids if self.config.type_vocab_size else None
        out = self.encoder(input_ids, attention_mask, token_type_ids=types)
        emb = pool(out.last_hidden_state, out.mask, self.pooling)  # (B, D')
        if self.normalize if normalize is None else normalize:
            emb = F.normalize(emb, p=2.0, dim=-1)
        return emb


class MultiLabelClassifier(EncoderClassifier):
    """EncoderClassifier's forward (logits (B, C), one per label: sigmoid(logit) is the label's
    probability, each label independent of the others), with ``thresholds`` (C,): the
    probability at or above which each label is chosen. The thresholds are not learned by the
    loss: a run's validation chooses them (tformer.kinds), and they are kept with the weights
    (a state-dict buffer), so that the best validated weights keep the thresholds chosen for
    them."""

    def __init__(self, config: TransformerConfig) -> None:
        super().__init__(config)
        self.register_buffer("thresholds", torch.full((config.n_classes,), 0.5))

    def chosen(self, logits: Tensor) -> Tensor:
        """Which labels are chosen: (B, C) logits -> (B, C) bool, sigmoid(logits) >= thresholds."""
        return torch.sigmoid(logits.float()) >= self.thresholds
