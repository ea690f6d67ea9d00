"""Sizes of a model from its config: parameters, forward FLOPs per token, activation memory.

FLOPs count a multiply-add as 2 and include only matrix products (what dominates; norms,
softmax and activations are a few per element). Activation memory is an estimate of what a
training step keeps for the backward pass with the fused attention kernel.
"""

from __future__ import annotations

import torch

from tformer.config import TransformerConfig

MODELS = ("encoder", "seq2seq", "classifier")


def build(config: TransformerConfig, model: str = "encoder") -> torch.nn.Module:
    from tformer.model import Encoder, EncoderClassifier, Seq2SeqTransformer

    classes = {"encoder": Encoder, "seq2seq": Seq2SeqTransformer, "classifier": EncoderClassifier}
    if model not in classes:
        raise ValueError(f"model: expected one of {', '.join(MODELS)}; got {model!r}")
    return classes[model](config)


def parameter_count(config: TransformerConfig, model: str = "encoder") -> int:
    """Exact count, from real modules built on the meta device (no memory used): the model
    with one layer per stack, plus the remaining layers counted from one layer each, so
    the time does not grow with n_layers either (10**9 layers answer at once)."""
    from tformer.layers import DecoderLayer, EncoderLayer

    def count(module: torch.nn.Module) -> int:
        return sum(p.numel() for p in module.parameters())

    try:
        with torch.device("meta"):
            one = config.replace(n_layers=1, n_decoder_layers=1)
            total = count(build(one, model)) + (config.n_layers - 1) * count(EncoderLayer(one))
            if model == "seq2seq":
                total += (config.decoder_layers - 1) * count(DecoderLayer(one))
    except RuntimeError as e:  # "Storage size calculation overflowed"
        if "overflow" not in str(e):
            raise
        raise ValueError(
            f"config: a weight of this config (d_model {config.d_model}, d_ff {config.d_ff}, "
            f"vocab_size {config.vocab_size}) would exceed 2**63 bytes; expected sizes a "
            "machine can hold"
        ) from None
    return total


def available_memory() -> int:
    """Bytes this process may still allocate: the smaller of MemAvailable and RLIMIT_AS."""
    import resource

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
    """Forward FLOPs per (source) token; seq2seq adds the decoder per target token."""
    flops = config.n_layers * encoder_layer_flops(config, seq_len)
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
