"""NumPy mirror of tformer.model: Encoder, Decoder, Seq2SeqTransformer, EncoderClassifier.

Same class names, attribute names and state-dict keys as the PyTorch modules, forward only.
Build with ``dtype=np.float32`` or ``np.float64``, then ``load_state_dict``.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from tformer.config import TransformerConfig
from tformer.reference.layers import DecoderLayer, EncoderLayer, LayerCache
from tformer.reference.masks import Mask, make_mask
from tformer.reference.module import Dropout, Embedding, LayerNorm, Linear, Module
from tformer.reference.positional import LearnedPositionalEmbedding, SinusoidalPositionalEncoding


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


@dataclass
class ClassifierOutput:
    logits: np.ndarray  # (B, C)
    hidden_states: tuple[np.ndarray, ...] | None = None
    attentions: tuple[np.ndarray, ...] | None = None


def check_token_ids(x: np.ndarray, vocab_size: int, name: str = "x") -> None:
    if not np.issubdtype(x.dtype, np.integer):
        raise TypeError(f"{name}: expected integer token ids of shape (B, S), got dtype {x.dtype}")
    if x.ndim != 2:
        raise ValueError(f"{name}: expected token ids of shape (B, S), got shape {x.shape}")
    if x.size:
        lo, hi = int(x.min()), int(x.max())
        if lo < 0 or hi >= vocab_size:
            raise ValueError(f"{name}: expected token ids in [0, {vocab_size}), got values in [{lo}, {hi}]")


def check_embeddings(x: np.ndarray, d_model: int, name: str = "x") -> None:
    if not np.issubdtype(x.dtype, np.floating):
        raise TypeError(
            f"{name}: expected float embeddings of shape (B, S, D={d_model}), got dtype {x.dtype}"
        )
    if x.ndim != 3 or x.shape[-1] != d_model:
        raise ValueError(f"{name}: expected shape (B, S, D) with D = {d_model}, got {x.shape}")


def _one_input(x, input_ids):
    if x is not None and input_ids is not None:
        raise ValueError("input_ids: got both x and input_ids; pass the token ids once")
    if x is None and input_ids is None:
        raise ValueError("x: expected token ids (B, S) or embeddings (B, S, D), got None")
    return x if x is not None else input_ids


def _positional(config: TransformerConfig) -> Module | None:
    if config.positional == "sinusoidal":
        return SinusoidalPositionalEncoding(config.d_model, config.max_len)
    if config.positional == "learned":
        return LearnedPositionalEmbedding(config.max_len, config.d_model)
    return None


class Encoder(Module):
    """Embeddings (+ positions, + token types) -> N encoder layers -> final norm."""

    def __init__(self, config: TransformerConfig, dtype=np.float32):
        c = self.config = config
        self.dtype = np.dtype(dtype)
        self.tok_emb = Embedding(c.vocab_size, c.d_model) if c.vocab_size else None
        self.pos_emb = _positional(c)
        self.type_emb = Embedding(c.type_vocab_size, c.d_model) if c.type_vocab_size else None
        self.emb_norm = (
            LayerNorm(c.d_model, eps=c.layer_norm_eps, bias=c.bias) if c.embedding_norm else None
        )
        self.dropout = Dropout(c.dropout)
        self.layers = [EncoderLayer(c) for _ in range(c.n_layers)]
        self.final_norm = (
            LayerNorm(c.d_model, eps=c.layer_norm_eps, bias=c.bias) if c.final_norm else None
        )
        self.pooler = Linear(c.d_model, c.d_model, bias=c.bias) if c.pooler else None
        self.astype(self.dtype)

    def embed(self, x: np.ndarray, token_type_ids: np.ndarray | None = None) -> np.ndarray:
        """Token ids (B, S) or embeddings (B, S, D) -> layer input (B, S, D)."""
        c = self.config
        x = np.asarray(x)
        if self.tok_emb is not None:
            check_token_ids(x, c.vocab_size)
            h = self.tok_emb(x)  # (B, S, D)
            if c.scale_embeddings:
                h = h * self.dtype.type(c.embedding_scale)  # §3.4
        else:
            check_embeddings(x, c.d_model)
            h = x.astype(self.dtype, copy=False)
        if self.pos_emb is not None:
            h = h + self.pos_emb(h.shape[1], dtype=self.dtype)  # (S, D) broadcast
        if self.type_emb is not None:
            if token_type_ids is None:
                token_type_ids = np.zeros_like(x)
            token_type_ids = np.asarray(token_type_ids)
            check_token_ids(token_type_ids, c.type_vocab_size, "token_type_ids")
            if token_type_ids.shape != x.shape:
                raise ValueError(
                    f"token_type_ids: expected shape (B, S) = {x.shape}, got {token_type_ids.shape}"
                )
            h = h + self.type_emb(token_type_ids)
        elif token_type_ids is not None:
            raise ValueError("token_type_ids: this model has no token types (type_vocab_size=0)")
        if self.emb_norm is not None:
            h = self.emb_norm(h)
        return self.dropout(h)

    def forward(
        self,
        x: np.ndarray | None = None,
        attention_mask: np.ndarray | None = None,
        *,  # the rest by name: a positional token_type_ids must not pass for a mask
        attn_mask: np.ndarray | None = None,
        output_attentions: bool = False,
        output_hidden_states: bool = False,
        token_type_ids: np.ndarray | None = None,
        input_ids: np.ndarray | None = None,
    ) -> EncoderOutput:
        """Shape: x (B, S) ids or (B, S, D); attention_mask (B, S) -> last_hidden_state (B, S, D)."""
        x = _one_input(x, input_ids)
        h = self.embed(x, token_type_ids)  # (B, S, D)
        b, s, _ = h.shape
        mask = make_mask(attention_mask, attn_mask, b, s, s)
        # Padded positions hold zeros in every output (their values are nobody's business).
        unpad = mask.zero_padding if mask else (lambda t: t)
        hidden = [unpad(h)] if output_hidden_states else None
        attentions = [] if output_attentions else None
        for layer in self.layers:
            h, weights = layer(h, mask, need_weights=output_attentions)
            if hidden is not None:
                hidden.append(unpad(h))
            if attentions is not None:
                attentions.append(weights)
        if self.final_norm is not None:
            h = self.final_norm(h)
        h = unpad(h)  # (B, S, D)
        pooled = np.tanh(self.pooler(h[:, 0])) if self.pooler is not None else None
        return EncoderOutput(
            h,
            tuple(hidden) if hidden is not None else None,
            tuple(attentions) if attentions is not None else None,
            pooled,
            mask,
        )


class Decoder(Module):
    """Embeddings + positions -> N decoder layers -> final norm (§3.1)."""

    def __init__(self, config: TransformerConfig, dtype=np.float32):
        c = self.config = config
        self.dtype = np.dtype(dtype)
        vocab = c.target_vocab_size
        self.tok_emb = Embedding(vocab, c.d_model) if vocab else None
        self.pos_emb = _positional(c)
        self.dropout = Dropout(c.dropout)
        self.layers = [DecoderLayer(c) for _ in range(c.decoder_layers)]
        self.final_norm = (
            LayerNorm(c.d_model, eps=c.layer_norm_eps, bias=c.bias) if c.final_norm else None
        )
        self.astype(self.dtype)

    def embed(self, x: np.ndarray, offset: int = 0) -> np.ndarray:
        c = self.config
        x = np.asarray(x)
        if self.tok_emb is not None:
            check_token_ids(x, c.target_vocab_size)
            h = self.tok_emb(x) * self.dtype.type(c.embedding_scale)  # (B, T, D)
        else:
            check_embeddings(x, c.d_model)
            h = x.astype(self.dtype, copy=False)
        if self.pos_emb is not None:
            h = h + self.pos_emb(h.shape[1], offset, dtype=self.dtype)
        return self.dropout(h)

    def forward(
        self,
        x: np.ndarray,
        memory: np.ndarray | None,
        attention_mask: np.ndarray | None = None,
        memory_attention_mask: np.ndarray | None = None,
        past_key_values: tuple[LayerCache, ...] | None = None,
        use_cache: bool = False,
        output_attentions: bool = False,
        output_hidden_states: bool = False,
    ) -> DecoderOutput:
        """Shape: x (B, T) ids or (B, T, D); memory (B, S, D) -> last_hidden_state (B, T, D)."""
        past = past_key_values[0][0].shape[2] if past_key_values else 0
        h = self.embed(x, offset=past)  # (B, T, D)
        b, t, _ = h.shape
        if memory is not None:
            memory = np.asarray(memory)
            check_embeddings(memory, self.config.d_model, "memory")
            memory = memory.astype(self.dtype, copy=False)
            s = memory.shape[1]
        elif past_key_values:
            s = past_key_values[0][2].shape[2]
        else:
            raise ValueError("memory: expected the encoder output (B, S, D), got None")
        self_mask = make_mask(attention_mask, None, b, t, past + t, causal=True)
        memory_mask = make_mask(memory_attention_mask, None, b, t, s)

        hidden = [h] if output_hidden_states else None
        self_attns = [] if output_attentions else None
        cross_attns = [] if output_attentions else None
        presents = [] if use_cache else None
        for i, layer in enumerate(self.layers):
            layer_past = past_key_values[i] if past_key_values else None
            out = layer(h, memory, self_mask, memory_mask, layer_past, use_cache, output_attentions)
            h = out.hidden
            if hidden is not None:
                hidden.append(h)
            if output_attentions:
                self_attns.append(out.self_weights)
                cross_attns.append(out.cross_weights)
            if presents is not None:
                presents.append(out.present)
        if self.final_norm is not None:
            h = self.final_norm(h)
        return DecoderOutput(
            h,
            tuple(presents) if presents is not None else None,
            tuple(hidden) if hidden is not None else None,
            tuple(self_attns) if self_attns is not None else None,
            tuple(cross_attns) if cross_attns is not None else None,
        )


class Seq2SeqTransformer(Module):
    """The encoder-decoder; token embeddings live here, as in the PyTorch module."""

    def __init__(self, config: TransformerConfig, dtype=np.float32):
        if config.vocab_size is None:
            raise ValueError("vocab_size: Seq2SeqTransformer needs a vocabulary, got None")
        self.config = c = config
        self.dtype = np.dtype(dtype)
        stack = c.replace(vocab_size=None, tgt_vocab_size=None, type_vocab_size=0, pooler=False)
        self.src_emb = Embedding(c.vocab_size, c.d_model)
        self.tgt_emb = Embedding(c.tgt_vocab_size, c.d_model) if c.tgt_vocab_size else None
        self.encoder = Encoder(stack, dtype)
        self.decoder = Decoder(stack, dtype)
        self.lm_head = None if c.tie_output else Linear(c.d_model, c.target_vocab_size, bias=False)
        self.astype(self.dtype)

    @property
    def target_embedding(self) -> Embedding:
        return self.tgt_emb if self.tgt_emb is not None else self.src_emb

    def encode(self, src_ids, src_attention_mask=None, **kwargs) -> EncoderOutput:
        src_ids = np.asarray(src_ids)
        check_token_ids(src_ids, self.config.vocab_size, "src_ids")
        x = self.src_emb(src_ids) * self.dtype.type(self.config.embedding_scale)  # (B, S, D)
        return self.encoder(x, attention_mask=src_attention_mask, **kwargs)

    def decode(
        self,
        tgt_ids,
        memory,
        memory_attention_mask=None,
        tgt_attention_mask=None,
        past_key_values=None,
        use_cache: bool = False,
        output_attentions: bool = False,
    ) -> Seq2SeqOutput:
        tgt_ids = np.asarray(tgt_ids)
        check_token_ids(tgt_ids, self.config.target_vocab_size, "tgt_ids")
        y = self.target_embedding(tgt_ids) * self.dtype.type(self.config.embedding_scale)
        out = self.decoder(
            y, memory, tgt_attention_mask, memory_attention_mask, past_key_values, use_cache,
            output_attentions,
        )
        h = out.last_hidden_state
        logits = self.lm_head(h) if self.lm_head is not None else h @ self.target_embedding.weight.T
        return Seq2SeqOutput(
            logits, out.past_key_values, None, out.attentions, out.cross_attentions
        )

    def forward(
        self, src_ids, tgt_ids, src_attention_mask=None, tgt_attention_mask=None,
        output_attentions: bool = False,
    ) -> Seq2SeqOutput:
        """Shape: src_ids (B, S), tgt_ids (B, T) -> logits (B, T, V)."""
        memory = self.encode(src_ids, src_attention_mask).last_hidden_state  # (B, S, D)
        out = self.decode(
            tgt_ids, memory, src_attention_mask, tgt_attention_mask,
            output_attentions=output_attentions,
        )
        out.encoder_last_hidden_state = memory
        return out


class EncoderClassifier(Module):
    """Encoder + pooling ("cls" or "mean" over real tokens) + linear head."""

    def __init__(self, config: TransformerConfig, dtype=np.float32):
        if config.n_classes is None:
            raise ValueError("n_classes: EncoderClassifier needs the number of classes, got None")
        self.config = config
        self.dtype = np.dtype(dtype)
        self.encoder = Encoder(config, dtype)
        self.head = Linear(config.d_model, config.n_classes)
        self.astype(self.dtype)

    def forward(self, x, attention_mask=None, token_type_ids=None, output_attentions=False,
                output_hidden_states=False) -> ClassifierOutput:
        """Shape: x (B, S) ids or (B, S, D); attention_mask (B, S) -> logits (B, C)."""
        out = self.encoder(
            x, attention_mask, output_attentions=output_attentions,
            output_hidden_states=output_hidden_states, token_type_ids=token_type_ids,
        )
        h = out.last_hidden_state  # (B, S, D), zeros at padding
        if self.config.pooling == "cls":
            pooled = h[:, 0]  # (B, D)
        elif out.mask is None or out.mask.padding is None:
            pooled = h.mean(axis=1)
        else:  # mean over real tokens: padded positions are zeros, so a plain sum is theirs
            pooled = h.sum(axis=1) / np.maximum(out.mask.lengths, 1)[:, None].astype(h.dtype)
        return ClassifierOutput(self.head(pooled), out.hidden_states, out.attentions)
