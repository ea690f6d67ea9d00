"""NumPy mirror of tformer.nn.heads: encoders with a head for one job.

Same class names, attribute names and state-dict keys as the PyTorch modules.

Shape legend: B batch, S length, D model dim, C classes.
"""

from __future__ import annotations

import numpy as np

from tformer.config import TransformerConfig
from tformer.reference.model import Encoder
from tformer.reference.module import Dropout, Linear, Module
from tformer.reference.outputs import ClassifierOutput
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


class TokenClassifier(Module):
    """An encoder, dropout and one linear layer applied to every token's vector: logits per
    token (transformers' BertForTokenClassification)."""

    def __init__(self, config: TransformerConfig, dtype=np.float32) -> None:
        if config.n_classes is None:
            raise ValueError("n_classes: TokenClassifier needs the number of labels, got None")
        self.config = config
        self.dtype = np.dtype(dtype)
        self.encoder = Encoder(config, dtype=dtype)
        self.dropout = Dropout(config.dropout)
        self.head = Linear(config.d_model, config.n_classes)
        self.astype(self.dtype)

    def forward(self, input_ids: np.ndarray, attention_mask: np.ndarray | None = None,
                token_type_ids: np.ndarray | None = None, output_attentions: bool = False,
                output_hidden_states: bool = False) -> ClassifierOutput:
        """Shape: input_ids (B, S); attention_mask (B, S) -> logits (B, S, C)"""
        types = token_type_ids if self.config.type_vocab_size else None
        out = self.encoder(input_ids, attention_mask, token_type_ids=types,
                           output_attentions=output_attentions, output_hidden_states=output_hidden_states)
        logits = self.head(self.dropout(out.last_hidden_state))  # (B, S, C)
        return ClassifierOutput(logits, out.hidden_states, out.attentions)

    def forward_train(self, input_ids, attention_mask=None, token_type_ids=None, rng=None):
        """forward, with dropout from `rng`, and the cache for ``backward``.

        Shape: input_ids (B, S); attention_mask (B, S) -> logits (B, S, C), cache
        """
        types = token_type_ids if self.config.type_vocab_size else None
        out, enc_cache = self.encoder.forward_train(input_ids, attention_mask, token_type_ids=types, rng=rng)
        dropped, drop_cache = self.dropout.forward_train(out.last_hidden_state, rng)  # (B, S, D)
        return self.head(dropped), (enc_cache, dropped, drop_cache)

    def backward(self, dlogits, cache, grads: dict, prefix: str = ""):
        """Shape: dlogits (B, S, C) -> None (the inputs are token ids)."""
        enc_cache, dropped, drop_cache = cache
        ddropped = self.head.backward(dlogits, dropped, grads, prefix + "head.")  # (B, S, D)
        dh = self.dropout.backward(ddropped, drop_cache)  # (B, S, D)
        return self.encoder.backward(dh, enc_cache, grads, prefix + "encoder.")
