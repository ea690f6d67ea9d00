"""HuggingFace BERT checkpoints <-> tformer: the key table, the config mapping and a verify step.

A BERT-format directory holds ``config.json`` (``model_type: bert``) and its weights in
``model.safetensors`` (or shards listed in ``model.safetensors.index.json``; or the
pickle-based ``pytorch_model.bin``, which only ``allow_pickle`` lets through).

The table below is the only place that knows HuggingFace's names; tformer's keys stay
``tok_emb``, ``self_attn.qkv_proj``, ``ffn.up``... Each row is (their key(s), our key):
one HF key maps to one tformer key unchanged, except the three separate query/key/value
projections, which tformer keeps stacked as one (3D, D) matrix, rows [q; k; v].

This module does not import torch (the NumPy reference loads checkpoints through it):
functions that join tensors take a ``concatenate`` function (``np.concatenate`` or
``torch.cat``); splitting uses slicing, which both array types support.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

from tformer.config import TransformerConfig, bert_layout
from tformer.errors import BadType, FieldError, check_flag
from tformer.storage.files import read_json_object

# Rows: (HF key or keys stacked along rows, tformer key). "{i}" is the layer index.
EMBEDDING_ROWS: list[tuple[str | tuple[str, ...], str]] = [
    ("embeddings.word_embeddings.weight", "tok_emb.weight"),  # (V, D)
    ("embeddings.position_embeddings.weight", "pos_emb.weight"),  # (max_len, D)
    ("embeddings.token_type_embeddings.weight", "type_emb.weight"),  # (types, D)
    ("embeddings.LayerNorm.weight", "emb_norm.weight"),  # (D,)
    ("embeddings.LayerNorm.bias", "emb_norm.bias"),
]
LAYER_ROWS: list[tuple[str | tuple[str, ...], str]] = [
    (
        tuple(f"encoder.layer.{{i}}.attention.self.{n}.weight" for n in ("query", "key", "value")),
        "layers.{i}.self_attn.qkv_proj.weight",  # 3 x (D, D) -> (3D, D)
    ),
    (
        tuple(f"encoder.layer.{{i}}.attention.self.{n}.bias" for n in ("query", "key", "value")),
        "layers.{i}.self_attn.qkv_proj.bias",  # 3 x (D,) -> (3D,)
    ),
    ("encoder.layer.{i}.attention.output.dense.weight", "layers.{i}.self_attn.out_proj.weight"),
    ("encoder.layer.{i}.attention.output.dense.bias", "layers.{i}.self_attn.out_proj.bias"),
    ("encoder.layer.{i}.attention.output.LayerNorm.weight", "layers.{i}.attn_norm.weight"),
    ("encoder.layer.{i}.attention.output.LayerNorm.bias", "layers.{i}.attn_norm.bias"),
    ("encoder.layer.{i}.intermediate.dense.weight", "layers.{i}.ffn.up.weight"),  # (F, D)
    ("encoder.layer.{i}.intermediate.dense.bias", "layers.{i}.ffn.up.bias"),  # (F,)
    ("encoder.layer.{i}.output.dense.weight", "layers.{i}.ffn.down.weight"),  # (D, F)
    ("encoder.layer.{i}.output.dense.bias", "layers.{i}.ffn.down.bias"),  # (D,)
    ("encoder.layer.{i}.output.LayerNorm.weight", "layers.{i}.ffn_norm.weight"),
    ("encoder.layer.{i}.output.LayerNorm.bias", "layers.{i}.ffn_norm.bias"),
]
POOLER_ROWS: list[tuple[str | tuple[str, ...], str]] = [
    ("pooler.dense.weight", "pooler.weight"),  # (D, D)
    ("pooler.dense.bias", "pooler.bias"),
]

# Tensors a BERT checkpoint may hold that tformer's encoder does not use: the masked-LM
# and next-sentence heads of BertForMaskedLM / BertForPreTraining ("cls.*"), the head of
# BertForSequenceClassification ("classifier.*": a fine-tune starts its own), and index
# buffers some transformers versions save ("embeddings.position_ids" = arange(max_len)).
IGNORED_PREFIXES = ("cls.", "classifier.")
IGNORED_KEYS = ("embeddings.position_ids", "embeddings.token_type_ids")

# The encoders alone, and a classifier's encoder (what `export --hf` writes for a classifier
# with BERT's pooler: it fine-tunes further, or embeds, without its head).
ENCODER_ARCHITECTURES = ("BertModel", "BertForMaskedLM")
ARCHITECTURES = (*ENCODER_ARCHITECTURES, "BertForSequenceClassification", "BertForTokenClassification")
# HF "gelu" is the exact erf GELU; "gelu_new" and "gelu_pytorch_tanh" the tanh approximation.
HF_ACTIVATIONS = {"gelu": "gelu", "gelu_new": "gelu_tanh", "gelu_pytorch_tanh": "gelu_tanh", "relu": "relu"}
TO_HF_ACTIVATION = {"gelu": "gelu", "gelu_tanh": "gelu_pytorch_tanh", "relu": "relu"}

WEIGHTS_FILE = "model.safetensors"
WEIGHTS_INDEX_FILE = "model.safetensors.index.json"
PICKLE_FILE = "pytorch_model.bin"


# The table, expanded for one config ----------------------------------------------------
def key_table(config: TransformerConfig) -> list[tuple[tuple[str, ...], str]]:
    """Every (HF keys, tformer key) row of a BERT encoder with this config, layers expanded."""
    rows = [(_as_tuple(theirs), ours) for theirs, ours in EMBEDDING_ROWS]
    for i in range(config.n_layers):
        for theirs, ours in LAYER_ROWS:
            rows.append((tuple(k.format(i=i) for k in _as_tuple(theirs)), ours.format(i=i)))
    if config.pooler:
        rows += [(_as_tuple(theirs), ours) for theirs, ours in POOLER_ROWS]
    return rows


def hf_shapes(config: TransformerConfig) -> dict[str, tuple[int, ...]]:
    """The shape of every tensor a HF BertModel with this config stores (without buffers)."""
    d, f = config.d_model, config.d_ff
    shapes: dict[str, tuple[int, ...]] = {
        "embeddings.word_embeddings.weight": (config.vocab_size or 0, d),
        "embeddings.position_embeddings.weight": (config.max_len, d),
        "embeddings.token_type_embeddings.weight": (config.type_vocab_size, d),
        "embeddings.LayerNorm.weight": (d,),
        "embeddings.LayerNorm.bias": (d,),
    }
    for i in range(config.n_layers):
        p = f"encoder.layer.{i}."
        for n in ("query", "key", "value"):
            shapes[f"{p}attention.self.{n}.weight"] = (d, d)
            shapes[f"{p}attention.self.{n}.bias"] = (d,)
        shapes[f"{p}attention.output.dense.weight"] = (d, d)
        shapes[f"{p}intermediate.dense.weight"] = (f, d)
        shapes[f"{p}intermediate.dense.bias"] = (f,)
        shapes[f"{p}output.dense.weight"] = (d, f)
        for name in (
            "attention.output.dense.bias",
            "attention.output.LayerNorm.weight",
            "attention.output.LayerNorm.bias",
            "output.dense.bias",
            "output.LayerNorm.weight",
            "output.LayerNorm.bias",
        ):
            shapes[p + name] = (d,)
    if config.pooler:
        shapes["pooler.dense.weight"] = (d, d)
        shapes["pooler.dense.bias"] = (d,)
    return shapes


def parameter_count(config: TransformerConfig) -> int:
    """Parameters of the BERT encoder described by ``config``, counted from the table's shapes."""
    total = 0
    for shape in hf_shapes(config).values():
        n = 1
        for s in shape:
            n *= s
        total += n
    return total


# Loading: their state dict -> ours ---------------------------------------------------------
def clean_state_dict(state: Mapping[str, Any], source: str = WEIGHTS_FILE) -> dict[str, Any]:
    """Strip the "bert." prefix (BertForMaskedLM, BertForSequenceClassification) and drop what
    the encoder does not use.

    Dropped: ``cls.*`` (the masked-LM / next-sentence heads), ``classifier.*`` (a sequence
    classifier's head) and the index buffers
    ``embeddings.position_ids`` / ``embeddings.token_type_ids``. Old TF-converted
    checkpoints name LayerNorm parameters ``gamma``/``beta``; they are renamed.
    """
    prefixed = [k for k in state if k.startswith("bert.")]
    if prefixed and len(prefixed) != len([k for k in state if not k.startswith(IGNORED_PREFIXES)]):
        bare = sorted(k for k in state if not k.startswith(("bert.", *IGNORED_PREFIXES)))
        raise ValueError(
            f"{source}: expected every encoder tensor under one prefix ('bert.' or none), "
            f"got both, e.g. {prefixed[0]!r} and {bare[0]!r}"
        )
    out: dict[str, Any] = {}
    for key, value in state.items():
        if key.startswith(IGNORED_PREFIXES):
            continue
        name = key[len("bert.") :] if prefixed else key
        if name in IGNORED_KEYS:
            continue
        if name.endswith("LayerNorm.gamma"):
            name = name[: -len("gamma")] + "weight"
        elif name.endswith("LayerNorm.beta"):
            name = name[: -len("beta")] + "bias"
        out[name] = value
    return out


def verify_hf(state: Mapping[str, Any], config: TransformerConfig, source: str) -> None:
    """Missing, extra or wrong-shape tensors -> ValueError naming ``source`` and the tensor.

    ``state`` is a cleaned HF state dict (see ``clean_state_dict``).
    """
    expected = hf_shapes(config)
    missing = [k for k in expected if k not in state]
    if missing:
        more = f" (and {len(missing) - 1} more)" if len(missing) > 1 else ""
        raise ValueError(f"{source}: missing tensor {missing[0]!r}{more} for a {config.n_layers}-layer BERT")
    extra = sorted(k for k in state if k not in expected)
    if extra:
        more = f" (and {len(extra) - 1} more)" if len(extra) > 1 else ""
        raise ValueError(
            f"{source}: unexpected tensor {extra[0]!r}{more}; "
            f"expected only the tensors of a {config.n_layers}-layer BERT encoder"
        )
    for key, shape in expected.items():
        actual = tuple(state[key].shape)
        if actual != shape:
            raise ValueError(f"{source}: tensor {key!r}: expected shape {shape}, got {actual}")


def from_hf(
    state: Mapping[str, Any],
    config: TransformerConfig,
    concatenate: Callable[..., Any],
    source: str = WEIGHTS_FILE,
) -> dict[str, Any]:
    """A HF BERT state dict (arrays or tensors) -> tformer's Encoder state dict.

    ``concatenate(list_of_arrays, axis_or_dim)`` joins q, k, v along rows
    (``np.concatenate`` or ``torch.cat``). Verifies first (see ``verify_hf``).
    """
    state = clean_state_dict(state, source)
    verify_hf(state, config, source)
    out: dict[str, Any] = {}
    for theirs, ours in key_table(config):
        tensors = [state[k] for k in theirs]
        out[ours] = tensors[0] if len(tensors) == 1 else concatenate(tensors, 0)  # (3D, ...)
    return out


# Saving: our state dict -> theirs -----------------------------------------------------------
def to_hf(state: Mapping[str, Any], config: TransformerConfig) -> dict[str, Any]:
    """tformer's Encoder state dict -> a HF BertModel state dict (keys without "bert.")."""
    ours_expected = {ours for _, ours in key_table(config)}
    missing = sorted(ours_expected - set(state))
    if missing:
        raise ValueError(f"state_dict: missing tensor {missing[0]!r} for a BERT export")
    out: dict[str, Any] = {}
    for theirs, ours in key_table(config):
        tensor = state[ours]
        if len(theirs) == 1:
            out[theirs[0]] = tensor
            continue
        n = tensor.shape[0] // len(theirs)  # (3D, ...) -> 3 x (D, ...): rows [q; k; v]
        for j, key in enumerate(theirs):
            out[key] = tensor[j * n : (j + 1) * n]
    return out


# Config: their config.json <-> ours -----------------------------------------------------------
def config_from_hf(hf: Mapping[str, Any], has_pooler: bool, source: str = "config.json") -> TransformerConfig:
    """A BERT ``config.json`` (as a dict) -> TransformerConfig; unsupported settings raise."""
    model_type = hf.get("model_type")
    if model_type != "bert":
        raise ValueError(f"{source}: model_type: expected 'bert', got {model_type!r}")
    archs = hf.get("architectures") or ["BertModel"]
    unsupported = [a for a in archs if a not in ARCHITECTURES]
    if unsupported:
        raise ValueError(
            f"{source}: architectures: expected one of {', '.join(ARCHITECTURES)}, got {unsupported[0]!r}"
        )
    position_type = hf.get("position_embedding_type", "absolute")
    if position_type != "absolute":
        raise ValueError(f"{source}: position_embedding_type: expected 'absolute', got {position_type!r}")
    for flag in ("is_decoder", "add_cross_attention"):
        if hf.get(flag):
            raise ValueError(f"{source}: {flag}: expected false (encoder only), got true")
    act = hf.get("hidden_act", "gelu")
    if act not in HF_ACTIVATIONS:
        raise ValueError(f"{source}: hidden_act: expected one of {', '.join(HF_ACTIVATIONS)}, got {act!r}")
    required = (
        "vocab_size",
        "hidden_size",
        "num_hidden_layers",
        "num_attention_heads",
        "intermediate_size",
        "max_position_embeddings",
    )
    for key in required:
        if key not in hf:
            raise ValueError(f"{source}: missing key {key!r}")
    try:
        return _tformer_config(hf, act, has_pooler)
    except (FieldError, BadType) as e:
        # Name BERT's key, not ours: the user edits config.json, not a TransformerConfig.
        key = CONFIG_KEYS.get(e.field)
        raise e.named(f"{source}: {key}" if key else f"{source}: {e.field}") from None
    except (ValueError, TypeError) as e:
        raise type(e)(f"{source}: {e}") from None


# tformer field -> the BERT config.json key it comes from (for error messages).
CONFIG_KEYS = {
    "d_model": "hidden_size", "n_heads": "num_attention_heads", "d_ff": "intermediate_size",
    "n_layers": "num_hidden_layers", "dropout": "hidden_dropout_prob",
    "attention_dropout": "attention_probs_dropout_prob", "layer_norm_eps": "layer_norm_eps",
    "max_len": "max_position_embeddings", "vocab_size": "vocab_size",
    "type_vocab_size": "type_vocab_size",
}


def _tformer_config(hf: Mapping[str, Any], act: str, has_pooler: bool) -> TransformerConfig:
    # BERT is post-norm (Devlin et al. 2019 reuse Vaswani et al.'s layer): bert_layout says so.
    return bert_layout(
        d_model=hf["hidden_size"],
        n_heads=hf["num_attention_heads"],
        d_ff=hf["intermediate_size"],
        n_layers=hf["num_hidden_layers"],
        dropout=hf.get("hidden_dropout_prob", 0.1),
        attention_dropout=hf.get("attention_probs_dropout_prob", 0.1),
        activation=HF_ACTIVATIONS[act],
        layer_norm_eps=hf.get("layer_norm_eps", 1e-12),
        max_len=hf["max_position_embeddings"],
        vocab_size=hf["vocab_size"],
        type_vocab_size=hf.get("type_vocab_size", 2),
        pooler=has_pooler,
    )


class NotBert(ValueError):
    """A setting a BERT export cannot express: ``field`` (a TransformerConfig field), what BERT
    needs, and what the model has (the error carries them: a caller names the option)."""

    def __init__(self, field: str, need: str, got: Any) -> None:
        super().__init__(f"config.{field}: a BERT export needs {need}, got {got!r}")
        self.field, self.need, self.got = field, need, got


def config_to_hf(config: TransformerConfig) -> dict[str, Any]:
    """TransformerConfig -> a BERT ``config.json`` dict; configs BERT cannot express raise
    NotBert."""
    needs = {
        "vocab_size": (config.vocab_size is not None, "set (token ids)"),
        "positional": (config.positional == "learned", "'learned'"),
        "embedding_norm": (config.embedding_norm, "True"),
        "scale_embeddings": (not config.scale_embeddings, "False"),
        "norm_first": (not config.norm_first, "False (post-norm)"),
        "final_norm": (not config.final_norm, "False"),
        "bias": (config.bias, "True"),
        "type_vocab_size": (config.type_vocab_size >= 1, ">= 1"),
    }
    for name, (ok, want) in needs.items():
        if not ok:
            raise NotBert(name, want, getattr(config, name))
    return {
        "architectures": ["BertModel"],
        "model_type": "bert",
        "vocab_size": config.vocab_size,
        "hidden_size": config.d_model,
        "num_hidden_layers": config.n_layers,
        "num_attention_heads": config.n_heads,
        "intermediate_size": config.d_ff,
        "hidden_act": TO_HF_ACTIVATION[config.activation],
        "hidden_dropout_prob": config.dropout,
        "attention_probs_dropout_prob": config.attention_dropout,
        "max_position_embeddings": config.max_len,
        "type_vocab_size": config.type_vocab_size,
        "layer_norm_eps": config.layer_norm_eps,
        "initializer_range": 0.02,
        "pad_token_id": 0,
        "position_embedding_type": "absolute",
        "torch_dtype": "float32",
    }


# The directory ---------------------------------------------------------------------------------
def read_config(model_dir: Path) -> dict[str, Any]:
    """``model_dir/config.json`` as a dict, with one-line errors naming the file."""
    path = Path(model_dir) / "config.json"
    if not path.is_file():
        raise FileNotFoundError(
            f"{path}: no such file; a model directory needs config.json "
            "(a BERT checkpoint or one saved by tformer)"
        )
    return read_json_object(path)


def weight_files(model_dir: Path, allow_pickle: bool = False) -> list[Path]:
    """The files holding the weights: safetensors (one or sharded), else pytorch_model.bin.

    The pickle file is refused unless ``allow_pickle``: unpickling runs arbitrary code.
    """
    check_flag("allow_pickle", allow_pickle)
    model_dir = Path(model_dir)
    single, index = model_dir / WEIGHTS_FILE, model_dir / WEIGHTS_INDEX_FILE
    if single.is_file():
        return [single]
    if index.is_file():
        try:
            weight_map = json.loads(index.read_text())["weight_map"]
        except (json.JSONDecodeError, KeyError, TypeError):
            raise ValueError(f"{index}: expected JSON with a 'weight_map' object") from None
        return [model_dir / name for name in sorted(set(weight_map.values()))]
    pickle = model_dir / PICKLE_FILE
    if pickle.is_file():
        if not allow_pickle:
            raise ValueError(
                f"{pickle}: refusing to load a pickle checkpoint (it can run arbitrary code); "
                f"convert it to {WEIGHTS_FILE}, or pass allow_pickle=True / --allow-pickle "
                "to load it with torch.load(weights_only=True)"
            )
        return [pickle]
    raise FileNotFoundError(f"{single}: no such file (nor {WEIGHTS_INDEX_FILE} or {PICKLE_FILE})")


def _as_tuple(keys: str | tuple[str, ...]) -> tuple[str, ...]:
    return (keys,) if isinstance(keys, str) else keys
