"""NumPy mirror of tformer.nn.model: Encoder, Decoder, Seq2SeqTransformer, EncoderClassifier.

Same class names, attribute names and state-dict keys as the PyTorch modules.
Build with ``dtype=np.float32`` or ``np.float64``, then ``load_state_dict``.

Training: each model's ``forward_train(..., rng)`` returns its output and a cache, and
``backward(dout, cache, grads)`` fills ``grads`` (from ``model.zero_grads()``) with the
gradient of every parameter, keyed as ``state_dict``:

    grads = model.zero_grads()
    logits, cache = model.forward_train(src, tgt_in, src_mask, tgt_mask, rng)
    loss, loss_cache = cross_entropy(logits, labels, ignore_index=PAD)
    model.backward(cross_entropy_backward(loss_cache), cache, grads)
"""

from __future__ import annotations

import numpy as np

from tformer.config import TransformerConfig
from tformer.reference.inputs import check_embeddings, check_token_ids, one_input
from tformer.reference.layers import DecoderLayer, EncoderLayer, LayerCache
from tformer.reference.masks import make_mask
from tformer.reference.module import Dropout, Embedding, LayerNorm, Linear, Module
from tformer.reference.outputs import ClassifierOutput, DecoderOutput, EncoderOutput, Seq2SeqOutput
from tformer.reference.pooling import pool, pool_backward
from tformer.reference.positional import LearnedPositionalEmbedding, SinusoidalPositionalEncoding


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

    def _sum_embeddings(self, x, token_type_ids=None):
        """Token (or given) embeddings + positions + token types, before the embedding norm.

        Returns (h (B, S, D), x, token_type_ids) as arrays, for embed and embed_train alike.
        """
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
        return h, x, token_type_ids

    def embed(self, x: np.ndarray, token_type_ids: np.ndarray | None = None) -> np.ndarray:
        """Token ids (B, S) or embeddings (B, S, D) -> layer input (B, S, D)."""
        h, _, _ = self._sum_embeddings(x, token_type_ids)
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
        x = one_input(x, input_ids)
        h = self.embed(x, token_type_ids)  # (B, S, D)
        b, s, _ = h.shape
        mask = make_mask(attention_mask, attn_mask, b, s, s)
        # Padded positions hold zeros in every output (their values are nobody's business).
        unpad = mask.zero_padding if mask else (lambda t: t)
        hidden = [unpad(h)] if output_hidden_states else None
        if mask is not None:
            h = mask.zero_padded_keys(h)  # what padding held (a NaN too) reaches no real token
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

    def embed_train(self, x, token_type_ids=None, rng=None):
        """embed, with dropout, and the cache for ``embed_backward``."""
        h, x, token_type_ids = self._sum_embeddings(x, token_type_ids)
        norm_cache = None
        if self.emb_norm is not None:
            h, norm_cache = self.emb_norm.forward_train(h)
        h, drop_cache = self.dropout.forward_train(h, rng)
        return h, (x, token_type_ids, norm_cache, drop_cache)

    def embed_backward(self, dh, cache, grads: dict, prefix: str = "") -> np.ndarray | None:
        """Shape: dh (B, S, D) -> d(input embeddings) (B, S, D), or None for token ids.

        The embeddings are summed, so each table receives dh itself (times the sqrt(D)
        scale for the token table, §3.4).
        """
        x, token_type_ids, norm_cache, drop_cache = cache
        dh = self.dropout.backward(dh, drop_cache)
        if self.emb_norm is not None:
            dh = self.emb_norm.backward(dh, norm_cache, grads, prefix + "emb_norm.")
        if self.type_emb is not None:
            self.type_emb.backward(dh, token_type_ids, grads, prefix + "type_emb.")
        if isinstance(self.pos_emb, LearnedPositionalEmbedding):
            self.pos_emb.backward(dh, 0, grads, prefix + "pos_emb.")
        if self.tok_emb is None:
            return dh
        scale = self.config.embedding_scale  # 1.0 when scale_embeddings is off
        self.tok_emb.backward(dh * self.dtype.type(scale), x, grads, prefix + "tok_emb.")
        return None

    def forward_train(self, x=None, attention_mask=None, *, attn_mask=None, token_type_ids=None,
                      input_ids=None, rng=None) -> tuple[EncoderOutput, tuple]:
        """forward, with dropout from `rng`, and the cache for ``backward``.

        Shape: x (B, S) ids or (B, S, D) -> last_hidden_state (B, S, D) (+ pooler_output)
        """
        x = one_input(x, input_ids)
        h, embed_cache = self.embed_train(x, token_type_ids, rng)  # (B, S, D)
        b, s, _ = h.shape
        mask = make_mask(attention_mask, attn_mask, b, s, s)
        if mask is not None:
            h = mask.zero_padded_keys(h)  # as in forward; padding gets no gradient either way
        layer_caches = []
        for layer in self.layers:
            h, _, layer_cache = layer.forward_train(h, mask, rng)
            layer_caches.append(layer_cache)
        norm_cache = None
        if self.final_norm is not None:
            h, norm_cache = self.final_norm.forward_train(h)
        if mask is not None:
            h = mask.zero_padding(h)  # (B, S, D), zeros at padding as in forward
        pooled = np.tanh(self.pooler(h[:, 0])) if self.pooler is not None else None  # (B, D)
        cache = (embed_cache, layer_caches, norm_cache, h, pooled, mask)
        return EncoderOutput(h, pooler_output=pooled, mask=mask), cache

    def backward(self, dh, cache, grads: dict, prefix: str = "", dpooled=None):
        """Shape: dh (B, S, D) [, dpooled (B, D)] -> d(input embeddings) or None (token ids)."""
        embed_cache, layer_caches, norm_cache, h, pooled, mask = cache
        if dpooled is not None:
            dpre = dpooled * (1.0 - pooled * pooled)  # tanh' = 1 - tanh^2
            dh = dh.copy()
            dh[:, 0] += self.pooler.backward(dpre, h[:, 0], grads, prefix + "pooler.")
        if mask is not None:
            dh = mask.zero_padding(dh)  # the zeros at padding are constants: no gradient there
        if self.final_norm is not None:
            dh = self.final_norm.backward(dh, norm_cache, grads, prefix + "final_norm.")
        for i in reversed(range(len(self.layers))):
            dh = self.layers[i].backward(dh, layer_caches[i], grads, f"{prefix}layers.{i}.")
        return self.embed_backward(dh, embed_cache, grads, prefix)


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

    def _sum_embeddings(self, x, offset: int = 0) -> tuple[np.ndarray, np.ndarray]:
        """Scaled token embeddings + positions from ``offset`` (no dropout), and x as an array."""
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
        return h, x

    def embed(self, x: np.ndarray, offset: int = 0) -> np.ndarray:
        return self.dropout(self._sum_embeddings(x, offset)[0])

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
        grow_cache: bool = True,
    ) -> DecoderOutput:
        """``grow_cache=False``: the presents hold the new positions' keys/values only.

        Shape: x (B, T) ids or (B, T, D); memory (Bm, S, D), Bm dividing B
        (each memory row serves B / Bm consecutive rows) -> last_hidden_state (B, T, D)."""
        if past_key_values is not None and len(past_key_values) != len(self.layers):
            raise ValueError(
                f"past_key_values: expected {len(self.layers)} layers, got {len(past_key_values)}"
            )
        past = past_key_values[0][0].shape[2] if past_key_values else 0
        h = self.embed(x, offset=past)  # (B, T, D)
        b, t, _ = h.shape
        if memory is not None:
            memory = np.asarray(memory)
            check_embeddings(memory, self.config.d_model, "memory")
            memory = memory.astype(self.dtype, copy=False)
            bm, s = memory.shape[:2]
        elif past_key_values:
            bm, _, s, _ = past_key_values[0][2].shape
        else:
            raise ValueError("memory: expected the encoder output (B, S, D), got None")
        self_mask = make_mask(attention_mask, None, b, t, past + t, causal=True)
        # Bm memory rows may serve B = g * Bm target rows (beam search; MultiHeadAttention).
        memory_mask = make_mask(memory_attention_mask, None, bm, t, s, name="memory_attention_mask")
        # What padding held (a NaN too) reaches no real token (Mask.zero_padded_keys); with a
        # cache the memory was read at step 0.
        if self_mask is not None:
            h = self_mask.zero_padded_keys(h)
        if memory is not None and memory_mask is not None and not past_key_values:
            memory = memory_mask.zero_padded_keys(memory)

        hidden = [h] if output_hidden_states else None
        self_attns = [] if output_attentions else None
        cross_attns = [] if output_attentions else None
        presents = [] if use_cache else None
        for i, layer in enumerate(self.layers):
            layer_past = past_key_values[i] if past_key_values else None
            out = layer(h, memory, self_mask, memory_mask, layer_past, use_cache, output_attentions,
                        grow_cache)
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

    def forward_train(self, x, memory, attention_mask=None, memory_attention_mask=None, rng=None):
        """forward (no KV cache), with dropout from `rng`, and the cache for ``backward``.

        Shape: x (B, T) ids or (B, T, D); memory (B, S, D) -> (B, T, D), cache
        """
        c = self.config
        h, x = self._sum_embeddings(x)
        h, drop_cache = self.dropout.forward_train(h, rng)
        memory = np.asarray(memory)
        check_embeddings(memory, c.d_model, "memory")
        memory = memory.astype(self.dtype, copy=False)  # as in forward
        b, t, _ = h.shape
        self_mask = make_mask(attention_mask, None, b, t, t, causal=True)
        memory_mask = make_mask(memory_attention_mask, None, b, t, memory.shape[1],
                                name="memory_attention_mask")
        if self_mask is not None:  # as in forward
            h = self_mask.zero_padded_keys(h)
        if memory_mask is not None:
            memory = memory_mask.zero_padded_keys(memory)
        layer_caches = []
        for layer in self.layers:
            h, layer_cache = layer.forward_train(h, memory, self_mask, memory_mask, rng)
            layer_caches.append(layer_cache)
        norm_cache = None
        if self.final_norm is not None:
            h, norm_cache = self.final_norm.forward_train(h)
        return h, (x, drop_cache, layer_caches, norm_cache, self_mask, memory_mask)

    def backward(self, dh, cache, grads: dict, prefix: str = ""):
        """Shape: dh (B, T, D) -> dx (B, T, D) or None (token ids), dmemory (B, S, D).

        Every layer reads the same memory, so its gradient is the sum over the layers.
        """
        x, drop_cache, layer_caches, norm_cache, self_mask, memory_mask = cache
        if self.final_norm is not None:
            dh = self.final_norm.backward(dh, norm_cache, grads, prefix + "final_norm.")
        dmemory = 0.0
        for i in reversed(range(len(self.layers))):
            dh, dmem = self.layers[i].backward(dh, layer_caches[i], grads, f"{prefix}layers.{i}.")
            dmemory = dmemory + dmem
        if self_mask is not None:  # the zeros written at padding are constants
            dh = self_mask.zero_padded_keys(dh)
        if memory_mask is not None:
            dmemory = memory_mask.zero_padded_keys(dmemory)
        dh = self.dropout.backward(dh, drop_cache)
        if isinstance(self.pos_emb, LearnedPositionalEmbedding):
            self.pos_emb.backward(dh, 0, grads, prefix + "pos_emb.")
        if self.tok_emb is None:
            return dh, dmemory
        scale = self.dtype.type(self.config.embedding_scale)
        self.tok_emb.backward(dh * scale, x, grads, prefix + "tok_emb.")
        return None, dmemory


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
        b, s = src_ids.shape
        make_mask(src_attention_mask, None, b, s, s, name="src_attention_mask")  # its errors, named
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
        grow_cache: bool = True,
        project: bool = True,
    ) -> Seq2SeqOutput:
        """(B, T) target ids -> logits (B, T, V); ``project=False``: logits None, the decoder's
        last hidden state (B, T, D) in decoder_last_hidden_state (as tformer.nn's)."""
        tgt_ids = np.asarray(tgt_ids)
        check_token_ids(tgt_ids, self.config.target_vocab_size, "tgt_ids")
        b, t = tgt_ids.shape
        past = past_key_values[0][0].shape[2] if past_key_values else 0
        make_mask(tgt_attention_mask, None, b, t, past + t, name="tgt_attention_mask")  # its errors, named
        y = self.target_embedding(tgt_ids) * self.dtype.type(self.config.embedding_scale)
        out = self.decoder(
            y, memory, tgt_attention_mask, memory_attention_mask, past_key_values, use_cache,
            output_attentions, grow_cache=grow_cache,
        )
        h = out.last_hidden_state
        logits = None if not project else self.lm_head(h) if self.lm_head is not None else (
            h @ self.target_embedding.weight.T)
        return Seq2SeqOutput(logits, out.past_key_values, None, out.attentions, out.cross_attentions,
                             None if project else h)

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


    def forward_train(self, src_ids, tgt_ids, src_attention_mask=None, tgt_attention_mask=None,
                      rng=None):
        """forward, with dropout from `rng`, and the cache for ``backward``.

        Shape: src_ids (B, S), tgt_ids (B, T) -> logits (B, T, V), cache
        """
        scale = self.dtype.type(self.config.embedding_scale)
        src_ids, tgt_ids = np.asarray(src_ids), np.asarray(tgt_ids)
        check_token_ids(src_ids, self.config.vocab_size, "src_ids")
        check_token_ids(tgt_ids, self.config.target_vocab_size, "tgt_ids")
        x = self.src_emb(src_ids) * scale  # (B, S, D)
        enc, enc_cache = self.encoder.forward_train(x, src_attention_mask, rng=rng)
        memory = enc.last_hidden_state  # (B, S, D)
        y = self.target_embedding(tgt_ids) * scale  # (B, T, D)
        h, dec_cache = self.decoder.forward_train(y, memory, tgt_attention_mask,
                                                  src_attention_mask, rng)
        if self.lm_head is not None:
            logits = self.lm_head(h)
        else:  # tied (§3.4); one (B*T, D) @ (D, V) product
            b, t, d = h.shape
            logits = (h.reshape(b * t, d) @ self.target_embedding.weight.T).reshape(b, t, -1)
        return logits, (src_ids, tgt_ids, enc_cache, dec_cache, h)

    def backward(self, dlogits, cache, grads: dict, prefix: str = "") -> None:
        """Shape: dlogits (B, T, V). The target table gets two gradients when the output
        is tied to it (§3.4): one from the logits, one from the decoder's input."""
        src_ids, tgt_ids, enc_cache, dec_cache, h = cache
        scale = self.dtype.type(self.config.embedding_scale)
        tgt_key = prefix + ("tgt_emb." if self.tgt_emb is not None else "src_emb.") + "weight"
        if self.lm_head is not None:
            dh = self.lm_head.backward(dlogits, h, grads, prefix + "lm_head.")
        else:  # logits = h E^T: dh = dlogits E, dE = dlogits^T h
            v, d = self.target_embedding.weight.shape
            dlogits2 = dlogits.reshape(-1, v)  # (N = B*T, V)
            dh = (dlogits2 @ self.target_embedding.weight).reshape(h.shape)  # (N, D) -> (B, T, D)
            grads[tgt_key] += dlogits2.T @ h.reshape(-1, d)  # (V, N) @ (N, D)
        dy, dmemory = self.decoder.backward(dh, dec_cache, grads, prefix + "decoder.")
        self.target_embedding.backward(dy * scale, tgt_ids, grads, tgt_key[: -len("weight")])
        dx = self.encoder.backward(dmemory, enc_cache, grads, prefix + "encoder.")
        self.src_emb.backward(dx * scale, src_ids, grads, prefix + "src_emb.")


class EncoderClassifier(Module):
    """Encoder + pooled output + dropout + linear head over the classes.

    Pooled: the BERT pooler's output (tanh(W h[CLS]), Devlin et al. 2019 §3) when the config
    has one, so a fine-tuned model is a transformers BertForSequenceClassification; else
    ``config.pooling`` ("cls": the first position, "mean": over real tokens; several modes
    joined by "+" are concatenated). Dropout before the head, as BERT's classifier has it.
    """

    def __init__(self, config: TransformerConfig, dtype=np.float32):
        if config.n_classes is None:
            raise ValueError("n_classes: EncoderClassifier needs the number of classes, got None")
        self.config = config
        self.dtype = np.dtype(dtype)
        self.encoder = Encoder(config, dtype)
        self.dropout = Dropout(config.dropout)
        width = config.d_model if config.pooler else config.d_model * len(config.pooling_modes)
        self.head = Linear(width, config.n_classes)
        self.astype(self.dtype)

    def forward(
        self,
        x: np.ndarray,
        attention_mask: np.ndarray | None = None,
        token_type_ids: np.ndarray | None = None,
        output_attentions: bool = False,
        output_hidden_states: bool = False,
    ) -> ClassifierOutput:
        """
        Shape:
            x: (B, S) ids or (B, S, D); attention_mask: (B, S)
            returns ClassifierOutput with logits (B, C)
        """
        out = self.encoder(
            x, attention_mask, output_attentions=output_attentions,
            output_hidden_states=output_hidden_states, token_type_ids=token_type_ids,
        )
        return ClassifierOutput(self.head(self.dropout(self.pooled(out))), out.hidden_states, out.attentions)

    def pooled(self, out: EncoderOutput) -> np.ndarray:
        """What the head reads, before its dropout: (B, width) (a fine-tune fits a new head to it first)."""
        if out.pooler_output is not None:
            return out.pooler_output  # (B, D)
        return pool(out.last_hidden_state, out.mask, self.config.pooling_modes)  # (B, D)

    def forward_train(self, x, attention_mask=None, token_type_ids=None, rng=None):
        """forward, with dropout from `rng`, and the cache for ``backward``.

        Shape: x (B, S) ids or (B, S, D); attention_mask (B, S) -> logits (B, C), cache
        """
        out, enc_cache = self.encoder.forward_train(x, attention_mask,
                                                    token_type_ids=token_type_ids, rng=rng)
        dropped, drop_cache = self.dropout.forward_train(self.pooled(out), rng)
        return self.head(dropped), (enc_cache, out, dropped, drop_cache)

    def backward(self, dlogits, cache, grads: dict, prefix: str = ""):
        """Shape: dlogits (B, C) -> d(input embeddings) or None (token ids).

        The pooler's gradient enters the encoder's backward at its own output (``dpooled``);
        a pooling's is spread over the token vectors (reference.pooling.pool_backward).
        """
        enc_cache, out, dropped, drop_cache = cache
        ddropped = self.head.backward(dlogits, dropped, grads, prefix + "head.")  # (B, D)
        dpooled = self.dropout.backward(ddropped, drop_cache)  # (B, D)
        h = out.last_hidden_state  # (B, S, D)
        if out.pooler_output is not None:
            return self.encoder.backward(np.zeros_like(h), enc_cache, grads, prefix + "encoder.",
                                         dpooled=dpooled)
        dh = pool_backward(dpooled, h, out.mask, self.config.pooling_modes)  # (B, S, D)
        return self.encoder.backward(dh, enc_cache, grads, prefix + "encoder.")
