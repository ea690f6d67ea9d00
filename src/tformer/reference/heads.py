"""NumPy mirror of tformer.nn.heads: encoders with a head for one job.

Same class names, attribute names and state-dict keys as the PyTorch modules.

Shape legend: B batch, S length, N positions predicted, D model dim, V vocabulary,
C classes.
"""

from __future__ import annotations

import numpy as np

from tformer.config import TransformerConfig
from tformer.reference.feedforward import ACTIVATION_GRADS, ACTIVATIONS
from tformer.reference.model import Encoder, EncoderClassifier
from tformer.reference.module import Dropout, LayerNorm, Linear, Module
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


class MaskedLMHead(Module):
    """BERT's masked-LM head: dense -> activation -> LayerNorm, then the (tied) word embeddings
    and a bias onto the vocabulary."""

    def __init__(self, d_model: int, vocab_size: int, activation: str = "gelu",
                 layer_norm_eps: float = 1e-12) -> None:
        self.activation = activation
        self.dense = Linear(d_model, d_model)
        self.norm = LayerNorm(d_model, eps=layer_norm_eps)
        self.bias = np.zeros(vocab_size, np.float32)

    def forward(self, h: np.ndarray, embedding: np.ndarray) -> np.ndarray:
        """Shape: h (..., D); embedding (V, D) -> logits (..., V)"""
        h = self.norm(ACTIVATIONS[self.activation](self.dense(h)))  # (..., D)
        return h @ embedding.T + self.bias  # (..., V)

    def forward_train(self, h: np.ndarray, embedding: np.ndarray) -> tuple[np.ndarray, tuple]:
        pre = self.dense(h)  # (N, D)
        z, norm_cache = self.norm.forward_train(ACTIVATIONS[self.activation](pre))  # (N, D)
        return z @ embedding.T + self.bias, (h, pre, norm_cache, z)

    def backward(self, dlogits: np.ndarray, cache: tuple, embedding: np.ndarray, grads: dict,
                 prefix: str, embedding_key: str) -> np.ndarray:
        """Shape: dlogits (N, V) -> dh (N, D). The tied embedding's gradient is added under
        ``embedding_key``, beside what its lookup adds (Module's grads add up)."""
        h, pre, norm_cache, z = cache
        grads[prefix + "bias"] += dlogits.sum(axis=0)
        grads[embedding_key] += dlogits.T @ z  # (V, N) @ (N, D)
        dz = self.norm.backward(dlogits @ embedding, norm_cache, grads, prefix + "norm.")  # (N, D)
        return self.dense.backward(dz * ACTIVATION_GRADS[self.activation](pre), h, grads, prefix + "dense.")


class MaskedLM(Module):
    """An encoder and BERT's masked-LM head, tied to the encoder's token embeddings."""

    def __init__(self, config: TransformerConfig, dtype=np.float32) -> None:
        super().__init__()
        self.config = config
        self.encoder = Encoder(config, dtype=dtype)
        self.head = MaskedLMHead(config.d_model, config.vocab_size, config.activation, config.layer_norm_eps)
        self.astype(np.dtype(dtype))

    def forward(self, input_ids: np.ndarray, attention_mask: np.ndarray | None = None,
                token_type_ids: np.ndarray | None = None, positions: np.ndarray | None = None) -> np.ndarray:
        """Shape: input_ids (B, S); positions (B, S) bool -> logits (B, S, V), or (N, V)"""
        types = token_type_ids if self.config.type_vocab_size else None
        h = self.encoder(input_ids, attention_mask, token_type_ids=types).last_hidden_state  # (B, S, D)
        if positions is not None:
            h = h[positions]  # (N, D)
        return self.head(h, self.encoder.tok_emb.weight)

    def forward_train(self, input_ids, attention_mask=None, token_type_ids=None, positions=None, rng=None):
        """forward, with dropout from `rng`, and the cache for ``backward``.

        Shape: input_ids (B, S); positions (B, S) bool -> logits (N, V), cache
        """
        types = token_type_ids if self.config.type_vocab_size else None
        out, enc_cache = self.encoder.forward_train(input_ids, attention_mask, token_type_ids=types, rng=rng)
        h = out.last_hidden_state  # (B, S, D)
        if positions is None:
            positions = np.ones(h.shape[:2], dtype=bool)
        logits, head_cache = self.head.forward_train(h[positions], self.encoder.tok_emb.weight)
        return logits, (enc_cache, head_cache, positions, h.shape)

    def backward(self, dlogits, cache, grads: dict, prefix: str = "") -> None:
        """Shape: dlogits (N, V); fills ``grads`` (the word embeddings' from both of their uses)."""
        enc_cache, head_cache, positions, shape = cache
        dsel = self.head.backward(dlogits, head_cache, self.encoder.tok_emb.weight, grads, prefix + "head.",
                                  prefix + "encoder.tok_emb.weight")  # (N, D)
        dh = np.zeros(shape, dtype=dsel.dtype)  # (B, S, D): only the positions predicted get one
        dh[positions] = dsel
        self.encoder.backward(dh, enc_cache, grads, prefix + "encoder.")


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


class MultiLabelClassifier(EncoderClassifier):
    """EncoderClassifier's forward (logits (B, C), one sigmoid per label) and ``thresholds``
    (C,), the probability at or above which each label is chosen."""

    def __init__(self, config: TransformerConfig, dtype=np.float32) -> None:
        super().__init__(config, dtype)
        self.thresholds = np.full((config.n_classes,), 0.5, dtype=np.float32)

    def chosen(self, logits: np.ndarray) -> np.ndarray:
        """(B, C) logits -> (B, C) bool, sigmoid(logits) >= thresholds."""
        return 1.0 / (1.0 + np.exp(-logits.astype(np.float64))) >= self.thresholds
