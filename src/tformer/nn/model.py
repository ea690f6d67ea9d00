"""Encoder, Decoder, the full encoder-decoder, and a sequence classifier (Vaswani et al. 2017).

Shape legend: B batch, S source length, T target length, D model dim, H heads, V vocab,
C classes. Masks are boolean, True = may attend / real token (see tformer.nn.masks).
"""

from __future__ import annotations

from pathlib import Path

import torch
from torch import Tensor, nn

from tformer.config import TransformerConfig, check_config
from tformer.errors import BadType, as_path
from tformer.formats.model_dir import ModelDir
from tformer.formats.pretrained import load_state, read_pretrained, save_pretrained
from tformer.nn import kernels
from tformer.nn.dropout import Dropout
from tformer.nn.embedding import positional_encoding, token_embedding
from tformer.nn.inputs import check_embeddings, check_token_ids, one_input
from tformer.nn.layers import DecoderLayer, EncoderLayer, LayerCache
from tformer.nn.masks import make_mask
from tformer.nn.outputs import ClassifierOutput, DecoderOutput, EncoderOutput, Seq2SeqOutput
from tformer.nn.pooling import pool
from tformer.nn.precision import to_precision


class Encoder(nn.Module):
    """Embeddings (+ positions, + token types) -> dropout -> N encoder layers -> final norm."""

    def __init__(self, config: TransformerConfig):
        super().__init__()
        c = self.config = check_config(config)
        self.tok_emb = token_embedding(c.vocab_size, c) if c.vocab_size else None
        self.pos_emb = positional_encoding(c)
        self.type_emb = nn.Embedding(c.type_vocab_size, c.d_model) if c.type_vocab_size else None
        if self.type_emb is not None:
            # BERT initialises every table N(0, 0.02) (Devlin et al. 2019); nn.Embedding's N(0, 1)
            # would make the token type outweigh the tokens 50 to 1 in the sum.
            nn.init.normal_(self.type_emb.weight, std=0.02)
        self.emb_norm = (
            nn.LayerNorm(c.d_model, eps=c.layer_norm_eps, bias=c.bias) if c.embedding_norm else None
        )
        self.dropout = Dropout(c.dropout)
        self.layers = nn.ModuleList(EncoderLayer(c) for _ in range(c.n_layers))
        self.final_norm = (
            nn.LayerNorm(c.d_model, eps=c.layer_norm_eps, bias=c.bias) if c.final_norm else None
        )
        self.pooler = nn.Linear(c.d_model, c.d_model, bias=c.bias) if c.pooler else None

    def embed(self, x: Tensor, token_type_ids: Tensor | None = None) -> Tensor:
        """Token ids (B, S) or embeddings (B, S, D) -> layer input (B, S, D)."""
        c = self.config
        if self.tok_emb is not None:
            check_token_ids(x, c.vocab_size)
            h = self.tok_emb(x)  # (B, S, D)
            if c.scale_embeddings:
                h = h * c.embedding_scale  # §3.4
        else:
            check_embeddings(x, c.d_model)
            h = x
        if self.pos_emb is not None:
            h = h + self.pos_emb(h.size(1), dtype=h.dtype, device=h.device)  # (S, D) broadcast
        if self.type_emb is not None:
            if token_type_ids is None:
                token_type_ids = torch.zeros_like(x)
            check_token_ids(token_type_ids, c.type_vocab_size, "token_type_ids")
            if token_type_ids.shape != x.shape:
                raise ValueError(
                    f"token_type_ids: expected shape (B, S) = {tuple(x.shape)}, "
                    f"got {tuple(token_type_ids.shape)}"
                )
            h = h + self.type_emb(token_type_ids)
        elif token_type_ids is not None:
            raise ValueError("token_type_ids: this model has no token types (type_vocab_size=0)")
        if self.emb_norm is not None:
            h = self.emb_norm(h)
        return self.dropout(h)

    def forward(
        self,
        x: Tensor | None = None,
        attention_mask: Tensor | None = None,
        *,  # the rest by name: a positional token_type_ids must not pass for a mask
        attn_mask: Tensor | None = None,
        output_attentions: bool = False,
        output_hidden_states: bool = False,
        token_type_ids: Tensor | None = None,
        input_ids: Tensor | None = None,
        skip_padding: bool | None = None,
    ) -> EncoderOutput:
        """Encode a batch.

        Outputs at padded positions (``attention_mask`` 0) are zeros, in every hidden state.
        With real padding the layers run on the real tokens only (faster, the same values);
        ``skip_padding=False`` forces the padded computation, which ``tformer.nn.kernels`` also
        chooses when packing cannot apply (attention weights requested, a general
        ``attn_mask``, tracing for compile/export).

        Shape:
            x: (B, S) token ids when config.vocab_size is set, else (B, S, D) embeddings
               (``input_ids=`` is accepted too, so ``model(**tokenizer(texts))`` works)
            attention_mask: (B, S), True/1 = real token
            attn_mask: broadcastable to (B, S, S) or (B, 1, S, S), True = may attend
            token_type_ids: (B, S), only with config.type_vocab_size
            returns EncoderOutput with last_hidden_state (B, S, D)
        """
        x = one_input(x, input_ids)
        h = self.embed(x, token_type_ids)  # (B, S, D)
        b, s, _ = h.shape
        mask = make_mask(attention_mask, attn_mask, b, s, s, device=h.device)
        packed = kernels.why_not_packed(mask, attn_mask is not None, output_attentions,
                                        skip_padding) is None
        # Packed: the layers see the real tokens only, (N, D), and the Packing for a mask;
        # unpacking puts zeros at padding.
        unpad = mask.packing.unpack if packed else (mask.zero_padding if mask else lambda t: t)
        hidden = [mask.zero_padding(h) if mask else h] if output_hidden_states else None
        attentions = [] if output_attentions else None
        layer_mask = mask.packing if packed else mask
        if packed:
            h = mask.packing.pack(h)  # (N, D)
        elif mask is not None:
            h = mask.zero_padded_keys(h)  # what padding held (a NaN too) reaches no real token
        for layer in self.layers:
            h, weights = layer(h, layer_mask, need_weights=output_attentions)
            if hidden is not None:
                hidden.append(unpad(h))
            if attentions is not None:
                attentions.append(weights)
        if self.final_norm is not None:
            h = self.final_norm(h)
        h = unpad(h)  # (B, S, D)
        pooled = torch.tanh(self.pooler(h[:, 0])) if self.pooler is not None else None
        return EncoderOutput(h, tuple(hidden) if hidden is not None else None,
                             tuple(attentions) if attentions is not None else None, pooled, mask)

    # Real checkpoints (BERT format and tformer's own): files are read in tformer.formats.pretrained.
    @classmethod
    def from_pretrained(
        cls, path: str | Path | ModelDir, allow_pickle: bool = False, dtype: torch.dtype | str | None = None
    ) -> Encoder:
        """An Encoder (in eval mode) with the weights of a BERT-format or tformer directory.

        BertForMaskedLM and BertForSequenceClassification checkpoints load their encoder
        ("bert.*"); the heads ("cls.*", "classifier.*") are left out. A pooler is built only
        when the checkpoint holds one. ``dtype``: a precision, "fp32", "bf16" or "int8" (see
        ``to_precision``), or a torch dtype for every parameter; None keeps float32
        (half-precision checkpoints are widened).
        """
        if not isinstance(path, ModelDir):
            path = as_path(path, "path", "a model directory")
        if dtype is not None and not isinstance(dtype, str | torch.dtype):
            raise BadType("dtype", f"expected a precision (fp32, bf16, int8), a torch.dtype or None, "
                          f"got {dtype!r}")
        config, state, source = read_pretrained(path, cls, allow_pickle=allow_pickle)
        model = cls(config)
        load_state(model, state, source)
        if isinstance(dtype, str):
            return to_precision(model, dtype).eval()
        return model.to(dtype or torch.float32).eval()

    def save_pretrained(self, path: str | Path, **kwargs) -> None:
        save_pretrained(self, path, **kwargs)


def from_pretrained(path: str | Path | ModelDir, allow_pickle: bool = False,
                    dtype: torch.dtype | str | None = None) -> Encoder:
    """``Encoder.from_pretrained`` as a function: ``tformer.from_pretrained(DIR)``."""
    return Encoder.from_pretrained(path, allow_pickle=allow_pickle, dtype=dtype)


class Decoder(nn.Module):
    """Embeddings + positions -> dropout -> N decoder layers -> final norm (§3.1)."""

    def __init__(self, config: TransformerConfig):
        super().__init__()
        c = self.config = check_config(config)
        vocab = c.target_vocab_size
        self.tok_emb = token_embedding(vocab, c) if vocab else None
        self.pos_emb = positional_encoding(c)
        self.dropout = Dropout(c.dropout)
        self.layers = nn.ModuleList(DecoderLayer(c) for _ in range(c.decoder_layers))
        self.final_norm = (
            nn.LayerNorm(c.d_model, eps=c.layer_norm_eps, bias=c.bias) if c.final_norm else None
        )

    def embed(self, x: Tensor, offset: int = 0) -> Tensor:
        c = self.config
        if self.tok_emb is not None:
            check_token_ids(x, c.target_vocab_size)
            h = self.tok_emb(x) * c.embedding_scale  # (B, T, D)
        else:
            check_embeddings(x, c.d_model)
            h = x
        if self.pos_emb is not None:
            h = h + self.pos_emb(h.size(1), offset, dtype=h.dtype, device=h.device)
        return self.dropout(h)

    def forward(
        self,
        x: Tensor,
        memory: Tensor | None,
        attention_mask: Tensor | None = None,
        memory_attention_mask: Tensor | None = None,
        past_key_values: tuple[LayerCache, ...] | None = None,
        use_cache: bool = False,
        output_attentions: bool = False,
        output_hidden_states: bool = False,
        grow_cache: bool = True,
    ) -> DecoderOutput:
        """Decode T new positions, attending causally to themselves (and to a cached past).
        ``grow_cache=False`` leaves the caches as they are: the presents then hold the new
        positions' keys/values (MultiHeadAttention), which the caller appends.

        Shape:
            x: (B, T) token ids when the config has a vocabulary, else (B, T, D)
            memory: (Bm, S, D) encoder output (may be None when past_key_values hold it); Bm
                may divide B: each memory row then serves B / Bm consecutive rows (beam search)
            attention_mask: (B, T_past + T) real target tokens
            memory_attention_mask: (Bm, S) real source tokens
            past_key_values: per layer (self k, self v, cross k, cross v), each (B, H, *, Dh)
        """
        if past_key_values is not None and len(past_key_values) != len(self.layers):
            raise ValueError(f"past_key_values: expected {len(self.layers)} layers, "
                             f"got {len(past_key_values)}")
        past = past_key_values[0][0].size(2) if past_key_values else 0
        h = self.embed(x, offset=past)  # (B, T, D)
        b, t, _ = h.shape
        if memory is not None:
            check_embeddings(memory, self.config.d_model, "memory")
            bm, s = memory.shape[:2]
        elif past_key_values:
            bm, _, s, _ = past_key_values[0][2].shape
        else:
            raise ValueError("memory: expected the encoder output (B, S, D), got None")
        # One new query (a cached decoding step) may attend every key: no causal mask to build.
        self_mask = make_mask(attention_mask, None, b, t, past + t, causal=t > 1, device=h.device)
        # Bm memory rows may serve B = g * Bm target rows (beam search; MultiHeadAttention).
        memory_mask = make_mask(memory_attention_mask, None, bm, t, s, device=h.device,
                                name="memory_attention_mask")
        # What padding held (a NaN too) reaches no real token (Mask.zero_padded_keys).
        h = h if self_mask is None else self_mask.zero_padded_keys(h)
        if memory is not None and memory_mask is not None and not past_key_values:  # (step 0)
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
        return DecoderOutput(h, *(None if x is None else tuple(x)
                                  for x in (presents, hidden, self_attns, cross_attns)))


class Seq2SeqTransformer(nn.Module):
    """The encoder-decoder of "Attention Is All You Need".

    Token embeddings live here, not in the stacks, so that a shared source/target
    vocabulary and the tied output projection (§3.4) are one tensor each in the checkpoint.
    """

    def __init__(self, config: TransformerConfig):
        super().__init__()
        config = check_config(config)
        if config.vocab_size is None:
            raise ValueError("vocab_size: Seq2SeqTransformer needs a vocabulary, got None")
        self.config = c = config
        stack = c.replace(vocab_size=None, tgt_vocab_size=None, type_vocab_size=0, pooler=False)
        self.src_emb = token_embedding(c.vocab_size, c)
        self.tgt_emb = token_embedding(c.tgt_vocab_size, c) if c.tgt_vocab_size else None
        self.encoder = Encoder(stack)
        self.decoder = Decoder(stack)
        self.lm_head = None if c.tie_output else nn.Linear(c.d_model, c.target_vocab_size, bias=False)

    @property
    def target_embedding(self) -> nn.Embedding:
        return self.tgt_emb if self.tgt_emb is not None else self.src_emb

    def encode(
        self, src_ids: Tensor, src_attention_mask: Tensor | None = None, **kwargs
    ) -> EncoderOutput:
        """(B, S) source ids -> EncoderOutput with last_hidden_state (B, S, D)."""
        check_token_ids(src_ids, self.config.vocab_size, "src_ids")
        b, s = src_ids.shape
        make_mask(src_attention_mask, None, b, s, s, name="src_attention_mask")  # its errors, named
        x = self.src_emb(src_ids) * self.config.embedding_scale  # (B, S, D)
        return self.encoder(x, attention_mask=src_attention_mask, **kwargs)

    def decode(
        self,
        tgt_ids: Tensor,
        memory: Tensor | None,
        memory_attention_mask: Tensor | None = None,
        tgt_attention_mask: Tensor | None = None,
        past_key_values: tuple[LayerCache, ...] | None = None,
        use_cache: bool = False,
        output_attentions: bool = False,
        grow_cache: bool = True,
        project: bool = True,
    ) -> Seq2SeqOutput:
        """(B, T) target ids (the new ones when a cache is given) -> logits (B, T, V).
        ``grow_cache`` as in Decoder.forward. ``project=False`` leaves out the output projection:
        logits None, the decoder's last hidden state (B, T, D) in decoder_last_hidden_state."""
        check_token_ids(tgt_ids, self.config.target_vocab_size, "tgt_ids")
        b, t = tgt_ids.shape
        past = past_key_values[0][0].size(2) if past_key_values else 0
        make_mask(tgt_attention_mask, None, b, t, past + t, name="tgt_attention_mask")  # its errors, named
        y = self.target_embedding(tgt_ids) * self.config.embedding_scale  # (B, T, D)
        out = self.decoder(y, memory, tgt_attention_mask, memory_attention_mask, past_key_values,
                           use_cache, output_attentions, grow_cache=grow_cache)
        h = out.last_hidden_state
        logits = kernels.linear_weights(h, self.output_weight) if project else None  # (B, T, V)
        return Seq2SeqOutput(logits, out.past_key_values, None, out.attentions, out.cross_attentions,
                             None if project else h)

    @property
    def output_weight(self) -> Tensor:
        """The output projection's weight (V, D): the target embedding's when tied (§3.4)."""
        return self.lm_head.weight if self.lm_head is not None else self.target_embedding.weight

    def forward(
        self,
        src_ids: Tensor,
        tgt_ids: Tensor,
        src_attention_mask: Tensor | None = None,
        tgt_attention_mask: Tensor | None = None,
        output_attentions: bool = False,
    ) -> Seq2SeqOutput:
        """Teacher-forced forward pass.

        Shape:
            src_ids: (B, S); tgt_ids: (B, T) (the decoder input, starting with BOS)
            src_attention_mask: (B, S); tgt_attention_mask: (B, T); True/1 = real token
            returns Seq2SeqOutput with logits (B, T, V)
        """
        memory = self.encode(src_ids, src_attention_mask).last_hidden_state  # (B, S, D)
        out = self.decode(tgt_ids, memory, src_attention_mask, tgt_attention_mask,
                          output_attentions=output_attentions)
        out.encoder_last_hidden_state = memory
        return out


class EncoderClassifier(nn.Module):
    """Encoder + pooled output + dropout + linear head over the classes.

    Pooled: the BERT pooler's output (tanh(W h[CLS]), Devlin et al. 2019 §3) when the config
    has one, so a fine-tuned model is a transformers BertForSequenceClassification; else
    ``config.pooling`` ("cls": the first position, "mean": over real tokens; several modes
    joined by "+" are concatenated). Dropout before the head, as BERT's classifier has it.
    """

    def __init__(self, config: TransformerConfig):
        super().__init__()
        config = check_config(config)
        if config.n_classes is None:
            raise ValueError("n_classes: EncoderClassifier needs the number of classes, got None")
        self.config = config
        self.encoder = Encoder(config)
        self.dropout = Dropout(config.dropout)
        width = config.d_model if config.pooler else config.d_model * len(config.pooling_modes)
        self.head = nn.Linear(width, config.n_classes)

    def forward(
        self,
        x: Tensor,
        attention_mask: Tensor | None = None,
        token_type_ids: Tensor | None = None,
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

    def pooled(self, out: EncoderOutput) -> Tensor:
        """What the head reads, before its dropout: (B, width) (a fine-tune fits a new head to it first)."""
        if out.pooler_output is not None:
            return out.pooler_output  # (B, D)
        return pool(out.last_hidden_state, out.mask, self.config.pooling_modes)  # (B, D)
