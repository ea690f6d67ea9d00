"""NumPy mirror of tformer.nn.heads: encoders with a head for one job.

Same class names, attribute names and state-dict keys as the PyTorch modules.

Shape legend: B batch, S length, D model dim.
"""

from __future__ import annotations

import numpy as np

from tformer.config import TransformerConfig
from tformer.reference.model import Encoder, EncoderClassifier
from tformer.reference.module import Module
from tformer.reference.pooling import pool


class SentenceModel(Module):
    """An encoder and ``config.pooling``, L2 normalised where ``normalize``: one vector per text."""

    def __init__(self, config: TransformerConfig, normalize: bool = True, dtype=np.float32) -> None:
        super().__init__()
        self.config, self.normalize = config, normalize
        self.encoder = Encoder(config, dtype=dtype)

    @property
    def pooling(self) -> tuple[str, ...]:
        return self.config.pooling_modes

    def forward(self, input_ids: np.ndarray, attention_mask: np.ndarray | None = None,
                token_type_ids: np.ndarray | None = None, normalize: bool | None = None) -> np.ndarray:
        """Shape: input_ids (B, S); attention_mask (B, S) -> (B, D * len(pooling))"""
        types = token_type_ids if self.config.type_vocab_size else None
        out = self.encoder(input_ids, attention_mask, token_type_ids=types)
        emb = pool(out.last_hidden_state, out.mask, self.pooling)  # (B, D')
        if self.normalize if normalize is None else normalize:
            emb = emb / np.maximum(np.linalg.norm(emb, axis=-1, keepdims=True), 1e-12)
        return emb


class MultiLabelClassifier(EncoderClassifier):
    """EncoderClassifier's forward (logits (B, C), one sigmoid per label) and ``thresholds``
    (C,), the probability at or above which each label is chosen."""

    def __init__(self, config: TransformerConfig, dtype=np.float32) -> None:
        super().__init__(config, dtype)
        self.thresholds = np.full((config.n_classes,), 0.5, dtype=np.float32)

    def chosen(self, logits: np.ndarray) -> np.ndarray:
        """(B, C) logits -> (B, C) bool, sigmoid(logits) >= thresholds."""
        return 1.0 / (1.0 + np.exp(-logits.astype(np.float64))) >= self.thresholds
