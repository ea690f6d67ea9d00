"""tformer's classifier without BERT's pooler as transformers' XLMForSequenceClassification:
the key table, the config mapping, the embedding folds and a verify step; and the way back, for
the layout tformer writes (its encoder, to fine-tune further: ``config_from_hf``, ``from_hf``).

XLM (Lample & Conneau 2019) is BERT's encoder under other names: post-norm layers, learned
absolute positions, a LayerNorm over the summed embeddings, a GELU (or ReLU) feed-forward
network, biases everywhere, attention scaled by 1/sqrt(Dh). Its classification head,
XLMSequenceSummary with ``summary_use_proj``, ``summary_proj_to_labels`` and no activation, is
one Linear over the summary, after a dropout: tformer's head. The summary is "mean" for
``pooling="mean"`` and "first" for ``pooling="cls"`` without the pooler. What differs, and how
the table bridges it:

- The feed-forward width is fixed at 4 * emb_dim. A narrower ``d_ff`` is padded with zero
  units (zero weights and bias in, zero weights out: GELU(0) = ReLU(0) = 0, so they add
  nothing, and no gradient reaches them: they stay zero through any fine-tuning); a wider one
  is refused. config.json's ``tformer_d_ff`` says how many units the run trained, and reading
  back cuts the zero units off (a fine-tune from the export runs the width the run trained).
- XLM stores one position table: tformer's learned table, its sinusoids or none (zeros) are
  written into it; the sqrt(D) embedding scale is folded into the word table.
- XLM has no token-type table: given ``token_type_ids``, XLMModel adds rows of its WORD table
  (``embeddings(token_type_ids)``). A run trained on single texts exports with type row 0
  (added to every token) folded into the position table, and a tokenizer that returns no
  token types. A run trained on text pairs needs type 1: its tokenizer returns
  ``token_type_ids``, and word rows 0 and 1 carry the types (``fold_embeddings``). Row 0 is the
  padding token's, whose outputs are masked wherever it stands, so the padding id must be 0.
- **Padding.** XLMSequenceSummary's "mean" is ``hidden_states.mean(dim=1)``: over every
  position, padding included (XLMModel zeroes the padded rows), where tformer averages the
  real tokens. They agree on an unpadded input, one text per call (``pipeline``'s default,
  batch_size=1); a padded batch's summary is scaled by real / padded length.

Rows are (their key, our key, part): part (i, n) takes the i-th of n equal row blocks of a
fused tensor (qkv_proj: q, k, v). Their naming quirks stop at the table.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import torch
from torch import Tensor

from tformer.config import TransformerConfig, bert_layout
from tformer.errors import BadType, FieldError

ARCHITECTURE = "XLMForSequenceClassification"
Row = tuple[str, str, tuple[int, int] | None]

EMBEDDING_ROWS: list[Row] = [
    ("transformer.embeddings.weight", "encoder.tok_emb.weight", None),  # (V, D), folded
    ("transformer.position_embeddings.weight", "encoder.pos_emb.weight", None),  # (max_len, D), folded
    ("transformer.layer_norm_emb.weight", "encoder.emb_norm.weight", None),
    ("transformer.layer_norm_emb.bias", "encoder.emb_norm.bias", None),
]
LAYER_ROWS: list[Row] = [
    *[(f"transformer.attentions.{{i}}.{n}_lin.{p}", f"encoder.layers.{{i}}.self_attn.qkv_proj.{p}", (j, 3))
      for j, n in enumerate(("q", "k", "v")) for p in ("weight", "bias")],  # (3D, D) -> 3 x (D, D)
    ("transformer.attentions.{i}.out_lin.weight", "encoder.layers.{i}.self_attn.out_proj.weight", None),
    ("transformer.attentions.{i}.out_lin.bias", "encoder.layers.{i}.self_attn.out_proj.bias", None),
    ("transformer.layer_norm1.{i}.weight", "encoder.layers.{i}.attn_norm.weight", None),
    ("transformer.layer_norm1.{i}.bias", "encoder.layers.{i}.attn_norm.bias", None),
    ("transformer.ffns.{i}.lin1.weight", "encoder.layers.{i}.ffn.up.weight", None),  # (4D, D)
    ("transformer.ffns.{i}.lin1.bias", "encoder.layers.{i}.ffn.up.bias", None),
    ("transformer.ffns.{i}.lin2.weight", "encoder.layers.{i}.ffn.down.weight", None),  # (D, 4D)
    ("transformer.ffns.{i}.lin2.bias", "encoder.layers.{i}.ffn.down.bias", None),
    ("transformer.layer_norm2.{i}.weight", "encoder.layers.{i}.ffn_norm.weight", None),
    ("transformer.layer_norm2.{i}.bias", "encoder.layers.{i}.ffn_norm.bias", None),
]
HEAD_ROWS: list[Row] = [
    ("sequence_summary.summary.weight", "head.weight", None),  # (C, D)
    ("sequence_summary.summary.bias", "head.bias", None),
]
FOLDED = ("encoder.type_emb.weight",)  # carried by the word or the position table
SUMMARY = {"mean": "mean", "cls": "first"}  # tformer's pooling -> XLMSequenceSummary's summary_type


class Inexpressible(ValueError):
    """A setting XLMForSequenceClassification cannot express: ``field`` (a TransformerConfig
    field, or "pad_id"), what XLM needs, and what the model has."""

    def __init__(self, field: str, need: str, got: Any) -> None:
        super().__init__(f"config.{field}: {ARCHITECTURE} needs {need}, got {got!r}")
        self.field, self.need, self.got = field, need, got


def check_expressible(config: TransformerConfig) -> None:
    """Inexpressible for the first setting of ``config`` XLM cannot express."""
    d = config.d_model
    needs = {
        "n_classes": (config.n_classes is not None, "a classifier (n_classes set)"),
        "vocab_size": (config.vocab_size is not None, "token ids (vocab_size set)"),
        "pooler": (not config.pooler, "False (with BERT's pooler it is a BertForSequenceClassification)"),
        "d_ff": (config.d_ff <= 4 * d, f"<= 4 * d_model = {4 * d} (XLM's feed-forward width is fixed)"),
        "activation": (config.activation in ("gelu", "relu"), "'gelu' or 'relu'"),
        "norm_first": (not config.norm_first, "False (XLM's layers are post-norm)"),
        "final_norm": (not config.final_norm, "False"),
        "embedding_norm": (config.embedding_norm, "True (XLM normalises the summed embeddings)"),
        "bias": (config.bias, "True"),
    }
    for field, (ok, need) in needs.items():
        if not ok:
            raise Inexpressible(field, need, getattr(config, field))


def carries_token_types(config: TransformerConfig, pairs: bool) -> bool:
    """Whether the export takes token_type_ids: a run trained on text pairs, with a type table."""
    return pairs and config.type_vocab_size >= 2


# Weights ---------------------------------------------------------------------------------------
def key_table(config: TransformerConfig) -> list[Row]:
    """Every tensor of XLMForSequenceClassification, and where it comes from in tformer's state."""
    rows = list(EMBEDDING_ROWS)
    for i in range(config.n_layers):
        rows += [(theirs.format(i=i), ours.format(i=i), part) for theirs, ours, part in LAYER_ROWS]
    return rows + HEAD_ROWS


def xlm_shapes(config: TransformerConfig) -> dict[str, tuple[int, ...]]:
    """The shape of every tensor XLMForSequenceClassification stores for ``config``."""
    d, f = config.d_model, 4 * config.d_model
    shapes: dict[str, tuple[int, ...]] = {
        "transformer.embeddings.weight": (config.vocab_size or 0, d),
        "transformer.position_embeddings.weight": (config.max_len, d),
        "transformer.layer_norm_emb.weight": (d,),
        "transformer.layer_norm_emb.bias": (d,),
    }
    for i in range(config.n_layers):
        for name in ("q", "k", "v", "out"):
            shapes[f"transformer.attentions.{i}.{name}_lin.weight"] = (d, d)
            shapes[f"transformer.attentions.{i}.{name}_lin.bias"] = (d,)
        shapes[f"transformer.ffns.{i}.lin1.weight"] = (f, d)
        shapes[f"transformer.ffns.{i}.lin1.bias"] = (f,)
        shapes[f"transformer.ffns.{i}.lin2.weight"] = (d, f)
        shapes[f"transformer.ffns.{i}.lin2.bias"] = (d,)
        for norm in ("layer_norm1", "layer_norm2"):
            shapes[f"transformer.{norm}.{i}.weight"] = (d,)
            shapes[f"transformer.{norm}.{i}.bias"] = (d,)
    shapes["sequence_summary.summary.weight"] = (config.n_classes or 0, d)
    shapes["sequence_summary.summary.bias"] = (config.n_classes or 0,)
    return shapes


def position_table(state: Mapping[str, Tensor], config: TransformerConfig,
                   sinusoids: Tensor | None = None) -> Tensor:
    """(max_len, D) float32: the position vectors tformer adds (learned, sinusoids, or none).
    A sinusoidal model keeps no table in its state: its caller passes the (max_len, D)
    ``sinusoids`` the model adds (tformer.nn.positional.sinusoidal_table), since formats sit
    below the model and import nothing from it."""
    if config.positional == "learned":
        return state["encoder.pos_emb.weight"]
    if config.positional == "sinusoidal":
        if sinusoids is None or tuple(sinusoids.shape) != (config.max_len, config.d_model):
            raise ValueError(f"sinusoids: expected the ({config.max_len}, {config.d_model}) table the "
                             f"model adds, got {None if sinusoids is None else tuple(sinusoids.shape)}")
        return sinusoids.float()
    return torch.zeros(config.max_len, config.d_model)


def fold_embeddings(state: Mapping[str, Tensor], config: TransformerConfig, token_types: bool,
                    sinusoids: Tensor | None = None) -> dict[str, Tensor]:
    """XLM's word (V, D) and position (max_len, D) tables, under our keys, from tformer's token,
    position and token-type tables, so that XLM's embedding sum is tformer's.

    Without ``token_types`` every token is type 0: type row 0 joins the position table. With
    them (XLM adds ``words[t]`` for type t), for k = (type[1] - words[1]) / 2:
    words'[0] = type[0] - k and words'[i] = words[i] + k (i >= 1), so that
    words'[i] + words'[t] = words[i] + type[t] for every token i >= 1 and t in {0, 1}
    (for i = 1 and t = 1: 2 words[1] + 2k = words[1] + type[1]). Row 0, the padding token's,
    is never a real input (its outputs are masked).
    """
    words = state["encoder.tok_emb.weight"] * config.embedding_scale  # (V, D): Vaswani et al. §3.4
    positions = position_table(state, config, sinusoids)  # (max_len, D)
    types = state.get("encoder.type_emb.weight")  # (types, D) or None
    if types is not None and not token_types:
        positions = positions + types[0]
    elif token_types:
        k = (types[1] - words[1]) / 2  # (D,)
        words = torch.cat([(types[0] - k)[None], words[1:] + k])  # (V, D)
    return {"encoder.tok_emb.weight": words, "encoder.pos_emb.weight": positions}


def verify(state: Mapping[str, Tensor], config: TransformerConfig) -> None:
    """The table covers tformer's state exactly (no tensor left behind, none invented), and
    every tensor it writes has the shape XLM builds."""
    computed = set() if config.positional == "learned" else {"encoder.pos_emb.weight"}  # sinusoids, none
    used = {ours for _, ours, _ in key_table(config)} - computed
    have = set(state) - set(FOLDED)
    if used != have:
        raise ValueError(f"state dict: expected the keys {sorted(used - have)[:3]} and no others, "
                         f"got also {sorted(have - used)[:3]}")


def to_hf(state: Mapping[str, Tensor], config: TransformerConfig, token_types: bool,
          sinusoids: Tensor | None = None) -> dict[str, Tensor]:
    """tformer's classifier state dict -> XLMForSequenceClassification's (verified first);
    ``sinusoids``: a sinusoidal model's position table (position_table)."""
    check_expressible(config)
    verify(state, config)
    state = {**state, **fold_embeddings(state, config, token_types, sinusoids)}
    out = {}
    for theirs, ours, part in key_table(config):
        t = state[ours]
        if part is not None:
            i, n = part
            t = t.chunk(n, dim=0)[i]  # rows [q; k; v]
        out[theirs] = pad_ffn(theirs, t.detach().float(), config).contiguous().clone()
    expected = xlm_shapes(config)
    if set(expected) != set(out):
        raise ValueError(f"key table: expected XLM's keys, got extra {sorted(set(out) - set(expected))[:3]} "
                         f"and missing {sorted(set(expected) - set(out))[:3]}")
    for key, shape in expected.items():
        if tuple(out[key].shape) != shape:
            raise ValueError(f"tensor {key!r}: expected shape {shape}, got {tuple(out[key].shape)}")
    return out


def pad_ffn(key: str, t: Tensor, config: TransformerConfig) -> Tensor:
    """``t`` widened to XLM's 4 * D feed-forward units with zero units (lin1's rows and bias,
    lin2's columns); any other tensor as it is."""
    extra = 4 * config.d_model - config.d_ff
    if not extra or ".ffns." not in key:
        return t
    if ".lin1." in key:  # weight (d_ff, D), bias (d_ff,): rows
        return torch.cat([t, t.new_zeros((extra, *t.shape[1:]))])
    if key.endswith("lin2.weight"):  # (D, d_ff): columns
        return torch.cat([t, t.new_zeros(t.shape[0], extra)], dim=1)
    return t  # lin2.bias (D,)


# Config ----------------------------------------------------------------------------------------
def config_to_hf(config: TransformerConfig, labels: Sequence[str], pad_id: int,
                 bos_id: int | None = None, eos_id: int | None = None) -> dict[str, Any]:
    """XLMForSequenceClassification's config.json for ``config`` and its label names."""
    check_expressible(config)
    if config.n_classes != len(labels):
        raise ValueError(f"labels: expected {config.n_classes} names (config.n_classes), got {len(labels)}")
    return {
        "architectures": [ARCHITECTURE],
        "model_type": "xlm",
        "vocab_size": config.vocab_size,
        "emb_dim": config.d_model,  # the feed-forward width is 4 * emb_dim
        "tformer_d_ff": config.d_ff,  # the units the run trained (the rest zero): read back to it
        "n_layers": config.n_layers,
        "n_heads": config.n_heads,
        "dropout": config.dropout,
        "attention_dropout": config.attention_dropout,
        "gelu_activation": config.activation == "gelu",  # the exact (erf) GELU, as tformer's
        "sinusoidal_embeddings": False,  # the position table is written whatever the run used
        "causal": False,
        "asm": False,
        "n_langs": 1,
        "use_lang_emb": False,
        "max_position_embeddings": config.max_len,
        "layer_norm_eps": config.layer_norm_eps,
        "is_encoder": True,
        "summary_type": SUMMARY[config.pooling],
        "summary_use_proj": True,
        "summary_proj_to_labels": True,
        "summary_activation": None,
        "summary_first_dropout": config.dropout,  # tformer's dropout before the head
        "num_labels": len(labels),
        "id2label": {str(i): name for i, name in enumerate(labels)},
        "label2id": {name: i for i, name in enumerate(labels)},
        "problem_type": "single_label_classification",
        "pad_token_id": pad_id,
        "bos_token_id": bos_id,
        "eos_token_id": eos_id,
        "torch_dtype": "float32",
    }


# Reading: the XLM directory tformer writes, back as its BERT-layout encoder ------------------------
# XLM's settings that tformer's encoder (and its export) has one value of: (default, that value, why).
READ_LAYOUT = {
    "causal": (False, False, "an encoder attends both ways"),
    "is_encoder": (True, True, "transformers' XLM runs as an encoder only"),
    "sinusoidal_embeddings": (False, False, "tformer writes a learned position table"),
}
HEADS = ("sequence_summary.", "pred_layer.", "qa_outputs.", "classifier.")  # a fine-tune starts its own
# tformer field -> the XLM config.json key it comes from (for error messages).
CONFIG_KEYS = {"d_model": "emb_dim", "n_heads": "n_heads", "n_layers": "n_layers", "dropout": "dropout",
               "attention_dropout": "attention_dropout", "layer_norm_eps": "layer_norm_eps",
               "max_len": "max_position_embeddings", "vocab_size": "vocab_size"}


def config_from_hf(hf: Mapping[str, Any], source: str = "config.json") -> TransformerConfig:
    """An XLM config.json (as a dict) in the layout tformer's export writes -> the encoder's
    TransformerConfig: BERT's layout, d_ff = tformer_d_ff (the units the run trained; 4 * emb_dim
    without the key), two token types, no pooler. A setting outside that layout raises, naming
    its key."""
    if hf.get("model_type") != "xlm":
        raise ValueError(f"{source}: model_type: expected 'xlm', got {hf.get('model_type')!r}")
    for key, (default, need, why) in READ_LAYOUT.items():
        if hf.get(key, default) != need:
            raise ValueError(f"{source}: {key}: expected {json.dumps(need)} ({why}), "
                             f"got {json.dumps(hf.get(key))}")
    if hf.get("n_langs", 1) != 1 and hf.get("use_lang_emb", True):
        raise ValueError(f"{source}: n_langs: expected 1 (or use_lang_emb false: tformer's encoder has no "
                         f"language embeddings), got {hf.get('n_langs')!r}")
    for key in ("vocab_size", "emb_dim", "n_layers", "n_heads", "max_position_embeddings"):
        if key not in hf:
            raise ValueError(f"{source}: missing key {key!r}")
    try:
        config = bert_layout(
            d_model=hf["emb_dim"], n_heads=hf["n_heads"], d_ff=4 * hf["emb_dim"], n_layers=hf["n_layers"],
            dropout=hf.get("dropout", 0.1), attention_dropout=hf.get("attention_dropout", 0.1),
            activation="gelu" if hf.get("gelu_activation", True) else "relu",
            layer_norm_eps=hf.get("layer_norm_eps", 1e-12), max_len=hf["max_position_embeddings"],
            vocab_size=hf["vocab_size"], type_vocab_size=2, pooler=False,
        )
    except (FieldError, BadType) as e:  # name XLM's key: the user edits config.json
        key = CONFIG_KEYS.get(e.field)
        raise e.named(f"{source}: {key}" if key else f"{source}: {e.field}") from None
    except (ValueError, TypeError) as e:
        raise type(e)(f"{source}: {e}") from None
    d_ff = hf.get("tformer_d_ff", config.d_ff)  # the units the run trained, of XLM's 4 * emb_dim
    if isinstance(d_ff, bool) or not isinstance(d_ff, int) or not 0 < d_ff <= config.d_ff:
        raise ValueError(f"{source}: tformer_d_ff: expected the feed-forward units the run trained, an "
                         f"int in 1..{config.d_ff} (4 * emb_dim), got {d_ff!r}")
    return config.replace(d_ff=d_ff)


def clean_state_dict(state: Mapping[str, Any]) -> dict[str, Any]:
    """XLM's encoder tensors without the "transformer." prefix; the heads and the position_ids
    buffer dropped."""
    out = {}
    for key, value in state.items():
        name = key.removeprefix("transformer.")
        if not key.startswith(HEADS) and name != "position_ids":
            out[name] = value
    return out


def from_hf(state: Mapping[str, Any], config: TransformerConfig, token_types: bool,
            concatenate: Callable[..., Any], source: str = "model.safetensors") -> dict[str, Any]:
    """A cleaned XLM state dict (clean_state_dict; arrays or tensors) -> tformer's Encoder state
    dict, verified first. XLM adds word row t for token type t: with ``token_types`` (the export's
    tokenizer returns them) the type table is word rows 0 and 1, else zeros (the export folded
    type 0 into the position table). Exact: fold_embeddings, read backwards."""
    expected = {k.removeprefix("transformer."): s for k, s in xlm_shapes(config).items()
                if k.startswith("transformer.")}
    missing = sorted(set(expected) - set(state))
    if missing:
        raise ValueError(f"{source}: missing tensor {missing[0]!r} for a {config.n_layers}-layer XLM")
    extra = sorted(set(state) - set(expected))
    if extra:
        raise ValueError(f"{source}: unexpected tensor {extra[0]!r}; expected only the tensors of a "
                         f"{config.n_layers}-layer XLM encoder in tformer's layout")
    for key, shape in expected.items():
        if tuple(state[key].shape) != shape:
            raise ValueError(f"{source}: tensor {key!r}: expected shape {shape}, "
                             f"got {tuple(state[key].shape)}")
    parts: dict[str, list] = {}
    for theirs, ours, _ in (row for row in key_table(config) if row[1].startswith("encoder.")):
        parts.setdefault(ours.removeprefix("encoder."), []).append(state[theirs.removeprefix("transformer.")])
    out = {k: v[0] if len(v) == 1 else concatenate(v, 0) for k, v in parts.items()}  # q, k, v: (3D, ...)
    words = out["tok_emb.weight"]  # (V, D)
    out["type_emb.weight"] = words[:2] if token_types else words[:2] * 0  # (2, D)
    for i in range(config.n_layers):
        _cut_padding(out, i, config.d_ff, source)
    return out


def _cut_padding(state: dict[str, Any], layer: int, d_ff: int, source: str) -> None:
    """Layer ``layer``'s feed-forward cut from XLM's 4 * D units to the ``d_ff`` the run trained;
    the units cut must be the zero padding ``pad_ffn`` wrote (else config.json's tformer_d_ff is
    wrong for these weights)."""
    up, bias = f"layers.{layer}.ffn.up.weight", f"layers.{layer}.ffn.up.bias"
    down = f"layers.{layer}.ffn.down.weight"
    cut = {up: state[up][d_ff:], bias: state[bias][d_ff:], down: state[down][:, d_ff:]}  # (4D - d_ff, ...)
    for key, part in cut.items():
        if bool((part != 0).any()):
            theirs = {up: "lin1.weight", bias: "lin1.bias", down: "lin2.weight"}[key]
            raise ValueError(f"{source}: transformer.ffns.{layer}.{theirs}: expected zero past the first "
                             f"{d_ff} units (config.json's tformer_d_ff), got non-zero values there; "
                             "without tformer_d_ff all units are read")
    state[up], state[bias], state[down] = state[up][:d_ff], state[bias][:d_ff], state[down][:, :d_ff]
