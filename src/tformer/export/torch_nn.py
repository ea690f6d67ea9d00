"""Convert between torch.nn.Transformer{Encoder,Decoder,}(Layer) and tformer, both ways.

The mapping is a table of (their key, our key, rows) per layer: `rows` slices their tensor
along dim 0 (PyTorch stacks q, k, v in `in_proj_weight`), so converting back concatenates
our pieces in table order.
"""

from __future__ import annotations

from collections.abc import Mapping

import torch
from torch import Tensor, nn

from tformer.config import TransformerConfig
from tformer.nn.model import Decoder, Encoder

Row = tuple[str, str, str]  # (their key, our key, rows: "all" | "q" | "kv")

ENCODER_LAYER: list[Row] = [
    ("self_attn.in_proj_weight", "self_attn.qkv_proj.weight", "all"),  # [q; k; v]
    ("self_attn.in_proj_bias", "self_attn.qkv_proj.bias", "all"),
    ("self_attn.out_proj.weight", "self_attn.out_proj.weight", "all"),
    ("self_attn.out_proj.bias", "self_attn.out_proj.bias", "all"),
    ("linear1.weight", "ffn.up.weight", "all"),
    ("linear1.bias", "ffn.up.bias", "all"),
    ("linear2.weight", "ffn.down.weight", "all"),
    ("linear2.bias", "ffn.down.bias", "all"),
    ("norm1.weight", "attn_norm.weight", "all"),
    ("norm1.bias", "attn_norm.bias", "all"),
    ("norm2.weight", "ffn_norm.weight", "all"),
    ("norm2.bias", "ffn_norm.bias", "all"),
]

DECODER_LAYER: list[Row] = [
    ("self_attn.in_proj_weight", "self_attn.qkv_proj.weight", "all"),
    ("self_attn.in_proj_bias", "self_attn.qkv_proj.bias", "all"),
    ("self_attn.out_proj.weight", "self_attn.out_proj.weight", "all"),
    ("self_attn.out_proj.bias", "self_attn.out_proj.bias", "all"),
    # Cross-attention: their one in_proj holds q (from the decoder) then k, v (from memory).
    ("multihead_attn.in_proj_weight", "cross_attn.q_proj.weight", "q"),
    ("multihead_attn.in_proj_weight", "cross_attn.kv_proj.weight", "kv"),
    ("multihead_attn.in_proj_bias", "cross_attn.q_proj.bias", "q"),
    ("multihead_attn.in_proj_bias", "cross_attn.kv_proj.bias", "kv"),
    ("multihead_attn.out_proj.weight", "cross_attn.out_proj.weight", "all"),
    ("multihead_attn.out_proj.bias", "cross_attn.out_proj.bias", "all"),
    ("linear1.weight", "ffn.up.weight", "all"),
    ("linear1.bias", "ffn.up.bias", "all"),
    ("linear2.weight", "ffn.down.weight", "all"),
    ("linear2.bias", "ffn.down.bias", "all"),
    ("norm1.weight", "self_attn_norm.weight", "all"),
    ("norm1.bias", "self_attn_norm.bias", "all"),
    ("norm2.weight", "cross_attn_norm.weight", "all"),
    ("norm2.bias", "cross_attn_norm.bias", "all"),
    ("norm3.weight", "ffn_norm.weight", "all"),
    ("norm3.bias", "ffn_norm.bias", "all"),
]

FINAL_NORM: list[Row] = [("norm.weight", "final_norm.weight", "all"),
                         ("norm.bias", "final_norm.bias", "all")]


def _rows(tensor: Tensor, rows: str) -> Tensor:
    d = tensor.size(0) // 3  # in_proj stacks three D-row blocks
    return {"all": tensor, "q": tensor[:d], "kv": tensor[d:]}[rows]


def stack_table(layer: list[Row], n_layers: int, final_norm: bool, bias: bool = True) -> list[Row]:
    """Expand a per-layer table to a whole stack: layers.{i}.… plus the final norm (without
    the bias rows for a model built with bias=False)."""
    table = [
        (f"layers.{i}.{theirs}", f"layers.{i}.{ours}", rows)
        for i in range(n_layers)
        for theirs, ours, rows in layer
    ]
    table += FINAL_NORM if final_norm else []
    return [row for row in table if bias or not row[0].endswith("bias")]


def to_ours(state: Mapping[str, Tensor], table: list[Row]) -> dict[str, Tensor]:
    """Their state dict -> ours. Every key of theirs must be used (biases included)."""
    missing = sorted({t for t, _, _ in table} - set(state))
    unused = sorted(set(state) - {t for t, _, _ in table})
    if missing or unused:
        raise ValueError(
            f"state_dict: missing torch.nn keys {missing or 'none'}; "
            f"keys with no tformer counterpart {unused or 'none'}"
        )
    return {ours: _rows(state[theirs], rows).clone() for theirs, ours, rows in table}


def to_theirs(state: Mapping[str, Tensor], table: list[Row]) -> dict[str, Tensor]:
    """Our state dict -> theirs, concatenating the pieces of split tensors in table order."""
    pieces: dict[str, list[Tensor]] = {}
    for theirs, ours, _ in table:
        if ours not in state:
            raise ValueError(f"state_dict: missing tformer key {ours!r}")
        pieces.setdefault(theirs, []).append(state[ours])
    return {k: torch.cat(v, dim=0).clone() for k, v in pieces.items()}


# Modules ---------------------------------------------------------------------------------
def _activation(layer: nn.Module) -> str:
    act = layer.activation
    if act is torch.nn.functional.relu or isinstance(act, nn.ReLU):
        return "relu"
    if act is torch.nn.functional.gelu or isinstance(act, nn.GELU):
        return "gelu"
    raise ValueError(f"activation: only relu and gelu layers convert, got {act!r}")


def config_from_torch_layer(layer: nn.Module, n_layers: int, final_norm: bool) -> TransformerConfig:
    """A vocabulary-free, position-free config that matches a torch.nn layer."""
    attn = layer.self_attn
    return TransformerConfig(
        d_model=attn.embed_dim,
        n_heads=attn.num_heads,
        d_ff=layer.linear1.out_features,
        n_layers=n_layers,
        dropout=layer.dropout.p,
        attention_dropout=attn.dropout,
        activation=_activation(layer),
        norm_first=layer.norm_first,
        final_norm=final_norm,
        layer_norm_eps=layer.norm1.eps,
        bias=layer.linear1.bias is not None,
        positional="none",
    )


def _layers(module: nn.Module, layer_type: type) -> tuple[list[nn.Module], nn.Module | None]:
    if isinstance(module, layer_type):
        return [module], None
    return list(module.layers), module.norm


def from_torch_encoder(module: nn.TransformerEncoder | nn.TransformerEncoderLayer) -> Encoder:
    """A tformer Encoder with the same weights (takes embeddings: no vocab, no positions)."""
    layers, norm = _layers(module, nn.TransformerEncoderLayer)
    if not layers[0].self_attn.batch_first:
        raise ValueError("module: tformer is batch-first; build the torch layer with batch_first=True")
    config = config_from_torch_layer(layers[0], len(layers), norm is not None)
    state = module.state_dict()
    if isinstance(module, nn.TransformerEncoderLayer):
        state = {f"layers.0.{k}": v for k, v in state.items()}
    encoder = Encoder(config)
    table = stack_table(ENCODER_LAYER, len(layers), norm is not None, config.bias)
    encoder.load_state_dict(to_ours(state, table))
    return encoder


def to_torch_encoder(encoder: Encoder, layers_only: bool = False,
                     nested_tensor: bool = False) -> nn.TransformerEncoder:
    """A batch-first torch.nn.TransformerEncoder with the same weights.

    ``layers_only``: convert the layer stack of an encoder that has embeddings too (the caller
    embeds, as the bench does: ``encoder.embed(ids)``). ``nested_tensor``: let torch.nn's fast
    path drop padded positions (their outputs are then zeros, not computed values).
    """
    c = encoder.config
    if not layers_only and (c.vocab_size or c.positional != "none" or c.embedding_norm):
        raise ValueError(
            "encoder: torch.nn.TransformerEncoder has no embeddings; convert an encoder built "
            "with vocab_size=None, positional='none', embedding_norm=False"
        )
    if c.activation == "gelu_tanh":
        raise ValueError("activation: torch.nn layers have no gelu_tanh; use relu or gelu")
    layer = nn.TransformerEncoderLayer(
        c.d_model, c.n_heads, c.d_ff, c.dropout, c.activation, c.layer_norm_eps,
        batch_first=True, norm_first=c.norm_first, bias=c.bias,
    )
    # torch.nn's layer reuses `dropout` on the attention weights; ours may differ.
    layer.self_attn.dropout = c.attention_dropout
    norm = nn.LayerNorm(c.d_model, eps=c.layer_norm_eps, bias=c.bias) if c.final_norm else None
    torch_encoder = nn.TransformerEncoder(layer, c.n_layers, norm=norm,
                                          enable_nested_tensor=nested_tensor)
    table = stack_table(ENCODER_LAYER, c.n_layers, c.final_norm, c.bias)
    torch_encoder.load_state_dict(to_theirs(encoder.state_dict(), table))
    return torch_encoder


def from_torch_transformer(module: nn.Transformer) -> tuple[Encoder, Decoder]:
    """A tformer Encoder and Decoder with the weights of a batch-first torch.nn.Transformer."""
    if not module.batch_first:
        raise ValueError("module: tformer is batch-first; build nn.Transformer with batch_first=True")
    encoder = from_torch_encoder(module.encoder)
    dec_layers, dec_norm = _layers(module.decoder, nn.TransformerDecoderLayer)
    config = encoder.config.replace(
        n_decoder_layers=len(dec_layers), final_norm=dec_norm is not None
    )
    decoder = Decoder(config)
    table = stack_table(DECODER_LAYER, len(dec_layers), dec_norm is not None, config.bias)
    decoder.load_state_dict(to_ours(module.decoder.state_dict(), table))
    return encoder, decoder
