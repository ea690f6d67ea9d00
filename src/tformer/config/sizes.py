"""Sizes of a model from its config: parameters, forward FLOPs per token, activation memory.

Arithmetic on a TransformerConfig: this module builds no model and imports none.

FLOPs count a multiply-add as 2 and include only matrix products (what dominates; norms,
softmax and activations are a few per element). Activation memory is an estimate of what a
training step keeps for the backward pass with the fused attention kernel.
"""

from __future__ import annotations

import resource

from tformer.config import TransformerConfig

MODELS = ("encoder", "seq2seq", "classifier", "masked_lm")
PREDICTED = 0.15  # the share of a masked LM's tokens that reach its vocabulary (BERT's masking)

# torch indexes a tensor's bytes with a signed 64-bit integer.
_MAX_TENSOR_BYTES = 2**63 - 1


def _linear(n_in: int, n_out: int, bias: bool) -> int:
    return n_in * n_out + (n_out if bias else 0)


def _norm(d: int, bias: bool) -> int:
    return d + (d if bias else 0)


def _positions(c: TransformerConfig) -> int:
    return c.max_len * c.d_model if c.positional == "learned" else 0  # sinusoidal: a buffer


def encoder_layer_parameters(c: TransformerConfig) -> int:
    """Self-attention (fused qkv + output), feed-forward, two norms (tformer.nn.layers.EncoderLayer)."""
    d, b = c.d_model, c.bias
    attention = _linear(d, 3 * d, b) + _linear(d, d, b)
    ffn = _linear(d, c.d_ff, b) + _linear(c.d_ff, d, b)
    return attention + ffn + 2 * _norm(d, b)


def decoder_layer_parameters(c: TransformerConfig) -> int:
    """An encoder layer plus cross-attention (q, fused kv, output) and its norm."""
    d, b = c.d_model, c.bias
    cross = _linear(d, d, b) + _linear(d, 2 * d, b) + _linear(d, d, b)
    return encoder_layer_parameters(c) + cross + _norm(d, b)


def _encoder_parameters(c: TransformerConfig) -> int:
    """tformer.nn.model.Encoder: embeddings, layers, final norm, pooler."""
    d, b = c.d_model, c.bias
    total = (c.vocab_size or 0) * d + _positions(c) + c.type_vocab_size * d
    total += _norm(d, b) if c.embedding_norm else 0
    total += c.n_layers * encoder_layer_parameters(c)
    total += _norm(d, b) if c.final_norm else 0
    return total + (_linear(d, d, b) if c.pooler else 0)


def _seq2seq_parameters(c: TransformerConfig) -> int:
    """tformer.nn.model.Seq2SeqTransformer: the embeddings live outside the two stacks (§3.4)."""
    d, b = c.d_model, c.bias
    stack = c.replace(vocab_size=None, tgt_vocab_size=None, type_vocab_size=0, pooler=False)
    total = c.vocab_size * d + (c.tgt_vocab_size or 0) * d + _encoder_parameters(stack)
    total += _positions(c) + c.decoder_layers * decoder_layer_parameters(c)
    total += _norm(d, b) if c.final_norm else 0
    return total + (0 if c.tie_output else d * c.target_vocab_size)


def layers_text(c: TransformerConfig, model: str = "encoder") -> str:
    """The layer count as a model's description says it: "6", or "6+6" for an encoder-decoder."""
    return f"{c.n_layers}+{c.decoder_layers}" if model == "seq2seq" else f"{c.n_layers}"


def parameter_count(config: TransformerConfig, model: str = "encoder") -> int:
    """Exact count, by arithmetic on the config (nothing is built, so 10**9 layers answer at once);
    tests/test_stats.py holds it equal to the built modules' count."""
    c = config
    if model not in MODELS:
        raise ValueError(f"model: expected one of {', '.join(MODELS)}; got {model!r}")
    if model == "seq2seq" and c.vocab_size is None:
        raise ValueError("vocab_size: Seq2SeqTransformer needs a vocabulary, got None")
    if model == "classifier" and c.n_classes is None:
        raise ValueError("n_classes: EncoderClassifier needs the number of classes, got None")
    largest = max(c.d_model * max(3 * c.d_model, c.d_ff), (c.vocab_size or 0) * c.d_model,
                  (c.target_vocab_size or 0) * c.d_model, c.max_len * c.d_model)
    if largest * 4 > _MAX_TENSOR_BYTES:
        raise ValueError(
            f"config: a weight of this config (d_model {c.d_model}, d_ff {c.d_ff}, "
            f"vocab_size {c.vocab_size}) would exceed 2**63 bytes; expected sizes a "
            "machine can hold"
        )
    if model == "seq2seq":
        return _seq2seq_parameters(c)
    head = _linear(c.d_model, c.n_classes, True) if model == "classifier" else 0
    if model == "masked_lm":  # BERT's transform (dense + LayerNorm) and the vocabulary's bias (tied decoder)
        head = _linear(c.d_model, c.d_model, True) + _norm(c.d_model, True) + (c.vocab_size or 0)
    return _encoder_parameters(c) + head


def available_memory() -> int:
    """Bytes this process may still allocate: the smaller of MemAvailable and RLIMIT_AS."""
    limit = resource.getrlimit(resource.RLIMIT_AS)[0]
    available = limit if limit != resource.RLIM_INFINITY else 1 << 62
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    available = min(available, int(line.split()[1]) * 1024)
    except OSError:
        pass
    return available


def check_fits(config: TransformerConfig, model: str = "encoder", training: bool = False,
               batch: int = 0, seq_len: int | None = None, what: str = "config") -> int:
    """Refuse, before allocating anything, a model whose parameters (and for training their
    gradients, AdamW moments and a batch's activations) would not fit in memory.
    Returns the estimated bytes."""
    params = parameter_count(config, model)
    copies = 4 if training else 1  # weights; + gradients and AdamW's two moments
    need = params * 4 * copies
    if batch:
        need += activation_bytes(config, seq_len or config.max_len, batch)
    have = available_memory()
    if need > have:
        parts = "weights, gradients, AdamW moments and activations" if training else "weights"
        raise ValueError(
            f"{what}: {params:,} parameters need {need / 2**30:,.1f} GiB ({parts}, float32); "
            f"expected at most the {have / 2**30:,.1f} GiB available"
        )
    return need


def encoder_layer_flops(config: TransformerConfig, seq_len: int) -> int:
    """Forward FLOPs per token of one encoder layer attending over seq_len keys."""
    d, f = config.d_model, config.d_ff
    projections = 2 * (3 * d * d + d * d)  # fused qkv + output projection
    attention = 2 * 2 * seq_len * d  # q k^T and weights @ v, all heads together
    ffn = 2 * 2 * d * f
    return projections + attention + ffn


def flops_per_token(config: TransformerConfig, seq_len: int, model: str = "encoder",
                    tgt_len: int | None = None) -> int:
    """Forward FLOPs per (source) token; seq2seq adds the decoder per target token, a masked LM
    its head on the share of tokens predicted."""
    flops = config.n_layers * encoder_layer_flops(config, seq_len)
    if model == "masked_lm":
        d = config.d_model
        flops += round(PREDICTED * 2 * d * (d + (config.vocab_size or 0)))
    if model == "seq2seq":
        t = tgt_len if tgt_len is not None else seq_len
        d = config.d_model
        per_target = config.decoder_layers * (
            encoder_layer_flops(config, t)  # causal self-attention counted in full
            + 2 * (2 * d * d)  # cross q and output projections
            + 2 * 2 * seq_len * d  # cross attention over the source
        ) + 2 * d * config.target_vocab_size  # output projection
        per_source_kv = config.decoder_layers * 2 * 2 * d * d  # cross k, v of the memory
        flops = flops + per_source_kv + round(per_target * t / seq_len)
    return flops


def activation_bytes(config: TransformerConfig, seq_len: int, batch: int = 1,
                     bytes_per_element: int = 4, attention_weights: bool = False) -> int:
    """Estimated bytes a training step keeps per encoder stack for the backward pass."""
    d, f, h = config.d_model, config.d_ff, config.n_heads
    # Per token and layer: two norm inputs, qkv input and q, k, v, attention output,
    # FFN input, activation input and output: 8 D + 2 F values; plus 1-byte dropout masks.
    values = 8 * d + 2 * f
    if attention_weights:
        values += 2 * h * seq_len  # softmax output and its dropout mask, materialised
    masks = 2 * d if config.dropout > 0 else 0
    per_token = values * bytes_per_element + masks
    return config.n_layers * per_token * seq_len * batch
