"""The model configuration: a frozen dataclass that is saved as ``config.json``.

One flat config describes every model tformer builds (encoder, encoder-decoder,
classifier, BERT-style encoder); each field says which part reads it.
"""

from __future__ import annotations

import dataclasses
import math
import typing
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from tformer.errors import BadType, FieldError, as_path
from tformer.storage.files import read_json_object, write_json_atomic

ACTIVATIONS = ("relu", "gelu", "gelu_tanh")
POSITIONALS = ("sinusoidal", "learned", "none")
# Every pooling tformer.nn.pooling knows, in the order sentence-transformers concatenates them.
# config.pooling names one, or several joined by "+" ("mean+max"): the same meaning for a
# classifier's head and for sentence embeddings (BERT's pooler is another layer: config.pooler).
POOLING_MODES = ("cls", "max", "mean", "mean_sqrt_len")


@dataclass(frozen=True)
class TransformerConfig:
    # Sizes (Vaswani et al. 2017, Table 3 "base": 512, 8, 2048, 6).
    d_model: int = 512
    n_heads: int = 8
    d_ff: int = 2048
    n_layers: int = 6
    # Regularisation: `dropout` is the paper's P_drop (embeddings and every sub-layer
    # output, §5.4); `attention_dropout` drops attention weights (BERT uses 0.1).
    dropout: float = 0.1
    attention_dropout: float = 0.0
    # Layer shape.
    activation: str = "relu"
    norm_first: bool = False  # False: post-norm as in the paper; True: pre-norm
    final_norm: bool = False  # LayerNorm after the last layer (wanted with pre-norm)
    layer_norm_eps: float = 1e-5
    bias: bool = True
    # Inputs.
    positional: str = "sinusoidal"
    max_len: int = 512
    vocab_size: int | None = None  # None: the encoder takes embeddings (B, S, D)
    scale_embeddings: bool = True  # token embeddings times sqrt(d_model) (§3.4); BERT: False
    type_vocab_size: int = 0  # BERT segment (token type) embeddings; 0 = none
    embedding_norm: bool = False  # BERT: LayerNorm over the summed embeddings
    pooler: bool = False  # BERT pooler: tanh(Linear(h[:, 0]))
    # Encoder-decoder.
    n_decoder_layers: int | None = None  # None: as many as n_layers
    tgt_vocab_size: int | None = None  # None: source and target share one vocabulary
    tie_output: bool = True  # output projection shares the target embedding (§3.4)
    # Sequence heads: classes, and the pooling of the token vectors into one per text.
    n_classes: int | None = None
    pooling: str = "cls"

    def __post_init__(self) -> None:
        for name in ("d_model", "n_heads", "d_ff", "n_layers", "max_len"):
            check_positive(name, getattr(self, name))
        for name in ("vocab_size", "n_decoder_layers", "tgt_vocab_size", "n_classes"):
            if getattr(self, name) is not None:
                check_positive(name, getattr(self, name))
        if isinstance(self.type_vocab_size, bool) or not isinstance(self.type_vocab_size, int):
            raise BadType("type_vocab_size", f"expected an int, got {self.type_vocab_size!r}")
        if self.type_vocab_size < 0:
            raise FieldError("type_vocab_size", f"expected >= 0, got {self.type_vocab_size}")
        if self.d_model % self.n_heads:
            raise FieldError("d_model", f"expected a multiple of n_heads ({self.n_heads}), "
                                        f"got {self.d_model}")
        for name in ("dropout", "attention_dropout"):
            check_probability(name, getattr(self, name))
        if not (isinstance(self.layer_norm_eps, (int, float))
                and 0 < self.layer_norm_eps < math.inf):
            raise FieldError("layer_norm_eps", f"expected a positive number, got {self.layer_norm_eps!r}")
        _check_choice("activation", self.activation, ACTIVATIONS)
        _check_choice("positional", self.positional, POSITIONALS)
        if not isinstance(self.pooling, str) or not self.pooling or any(
                mode not in POOLING_MODES for mode in self.pooling.split("+")):
            raise FieldError("pooling", f"expected one of {', '.join(POOLING_MODES)} (or several joined by "
                             f"'+'); got {self.pooling!r}")
        if self.type_vocab_size and self.vocab_size is None:
            raise FieldError("type_vocab_size", "token types need token ids, so set vocab_size too")

    # Derived sizes -------------------------------------------------------------
    @property
    def head_dim(self) -> int:
        return self.d_model // self.n_heads

    @property
    def decoder_layers(self) -> int:
        return self.n_layers if self.n_decoder_layers is None else self.n_decoder_layers

    @property
    def target_vocab_size(self) -> int | None:
        return self.vocab_size if self.tgt_vocab_size is None else self.tgt_vocab_size

    @property
    def pooling_modes(self) -> tuple[str, ...]:
        """The pooling's modes, in sentence-transformers' order of concatenation."""
        return tuple(self.pooling.split("+"))

    @property
    def embedding_scale(self) -> float:
        return math.sqrt(self.d_model) if self.scale_embeddings else 1.0

    # JSON round trip -------------------------------------------------------------
    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> TransformerConfig:
        if not isinstance(data, dict):
            raise BadType("data", f"expected a dict of config fields, got {type(data).__name__}")
        check_known_keys(data, cls)
        return cls(**data)

    def replace(self, **changes: Any) -> TransformerConfig:
        return dataclasses.replace(self, **changes)

    def save(self, path: str | Path) -> None:
        """Write JSON atomically: a failed save leaves any previous file whole."""
        write_json_atomic(_config_file(path), self.to_dict())

    @classmethod
    def load(cls, path: str | Path) -> TransformerConfig:
        path = _config_file(path)
        try:
            data = read_json_object(path)
        except FileNotFoundError:
            raise FileNotFoundError(f"{path}: no such config file") from None
        try:
            return cls.from_dict(data)
        except (FieldError, BadType) as e:  # a file edited or damaged: name it, not just the key
            raise FieldError(f"{path}: {e.field}", e.detail) from None
        except (ValueError, TypeError) as e:
            raise ValueError(f"{path}: {e}") from None


def _config_file(path: str | Path) -> Path:
    """The config file ``path`` names (a folder, such as a model directory, is refused naming it)."""
    path = as_path(path, "path", "a config file")
    if path.is_dir():
        raise IsADirectoryError(f"{path}: expected a config file (e.g. {path / 'config.json'}), "
                                "got a directory")
    return path


# BERT's layout (Devlin et al. 2019): learned positions, two token types, a LayerNorm over the
# summed embeddings, no sqrt(D) scale, GELU, post-norm with eps 1e-12. HuggingFace's BertModel,
# torch.nn and tformer can all express it, and it exports to transformers and
# sentence-transformers. The sizes are the caller's.
BERT_LAYOUT: dict[str, Any] = {
    "activation": "gelu", "norm_first": False, "final_norm": False, "layer_norm_eps": 1e-12,
    "bias": True, "positional": "learned", "scale_embeddings": False, "type_vocab_size": 2,
    "embedding_norm": True,
}


def bert_layout(config: TransformerConfig | None = None, **changes: Any) -> TransformerConfig:
    """``config`` (its sizes; TransformerConfig's defaults when None) in BERT's layout, then
    ``changes``. Attention dropout follows ``dropout`` (BERT uses 0.1 for both) unless given."""
    base = config or TransformerConfig()
    layout = {**BERT_LAYOUT, "attention_dropout": changes.get("dropout", base.dropout)}
    return base.replace(**{**layout, **changes})


def check_known_keys(data: dict[str, Any], config_class: type, extra: Iterable[str] = ()) -> None:
    """Refuse keys that are not fields of the (dataclass) config (nor in ``extra``), naming them
    and the known ones."""
    known = {f.name for f in dataclasses.fields(config_class)} | set(extra)
    unknown = sorted(set(data) - known)
    if unknown:
        raise ValueError(
            f"config: unknown key(s) {', '.join(unknown)}; known keys: {', '.join(sorted(known))}"
        )


@dataclass(frozen=True)
class FieldType:
    """A config field's type, from the dataclass's resolved type hints: ``int | None`` is
    FieldType(int, optional=True). For checking values and building command-line options."""

    base: type
    optional: bool = False

    def __str__(self) -> str:
        return self.base.__name__ + (" | None" if self.optional else "")

    def check(self, name: str, value: Any) -> None:
        """BadType unless ``value`` has this type: a bool is not an int, an int is a float."""
        if value is None and self.optional:
            return
        want = (int, float) if self.base is float else self.base
        if isinstance(value, bool) != (self.base is bool) or not isinstance(value, want):
            raise BadType(name, f"expected {self}, got {value!r}")


def field_types(config_class: type) -> dict[str, FieldType]:
    """{field name: FieldType} of a dataclass (TransformerConfig, the training config), read
    from its type hints (typing.get_type_hints), not by parsing annotation strings."""
    hints = typing.get_type_hints(config_class)
    types = {}
    for f in dataclasses.fields(config_class):
        hint = hints[f.name]
        args = typing.get_args(hint) if typing.get_origin(hint) in (typing.Union, _UnionType) else ()
        if args:
            (base,) = [a for a in args if a is not type(None)]  # X | None: one type and None
            types[f.name] = FieldType(typing.get_origin(base) or base, type(None) in args)
        else:
            types[f.name] = FieldType(typing.get_origin(hint) or hint)
    return types


_UnionType = type(int | None)  # types.UnionType: `X | None` written in an annotation


def check_positive(name: str, value: Any) -> None:
    """A size (d_model, n_heads, max_len...): the config's check, also the leaves' (a layer
    built alone got torch's "negative dimension" error, or a ZeroDivisionError)."""
    if isinstance(value, bool) or not isinstance(value, int):
        raise BadType(name, f"expected a positive int, got {value!r}")
    if value <= 0:
        raise FieldError(name, f"expected a positive int, got {value}")


def check_probability(name: str, p: Any) -> None:
    """A dropout probability: in [0, 1), so some activations survive."""
    if not isinstance(p, (int, float)) or isinstance(p, bool) or not 0.0 <= p < 1.0:
        raise FieldError(name, f"expected a probability in [0, 1), got {p!r}")


def check_config(config: Any, name: str = "config") -> TransformerConfig:
    """A model's config: a TransformerConfig (a dict or a number failed deep inside as an
    AttributeError); TransformerConfig.from_dict reads a dict."""
    if not isinstance(config, TransformerConfig):
        hint = " (TransformerConfig.from_dict reads a dict)" if isinstance(config, dict) else ""
        raise BadType(name, f"expected a TransformerConfig, got {type(config).__name__}{hint}")
    return config


def _check_choice(name: str, value: Any, choices: tuple[str, ...]) -> None:
    if value not in choices:
        raise FieldError(name, f"expected one of {', '.join(choices)}; got {value!r}")
