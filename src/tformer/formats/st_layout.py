"""The sentence-transformers directory layout: where the encoder lives and how it pools.

A sentence-transformers directory lists its pipeline in ``modules.json``::

    [{"idx": 0, "name": "0", "path": "", "type": "sentence_transformers.models.Transformer"},
     {"idx": 1, "name": "1", "path": "1_Pooling", "type": "sentence_transformers.models.Pooling"},
     {"idx": 2, "name": "2", "path": "2_Normalize", "type": "sentence_transformers.models.Normalize"}]

The Transformer module's folder holds a BERT checkpoint plus ``sentence_bert_config.json``
(``max_seq_length``, ``do_lower_case``); ``1_Pooling/config.json`` says which poolings to
concatenate (``pooling_mode_cls_token``, ``..._max_tokens``, ``..._mean_tokens``,
``..._mean_sqrt_len_tokens``); a Normalize module L2-normalises the result.
A plain BERT directory (no modules.json) is read as mean pooling without normalisation,
as sentence-transformers itself does.

Torch-free: the NumPy reference and the tokenizer read the layout through here too.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from tformer.config import POOLING_MODES
from tformer.errors import as_path

_POOLING_KEYS = {
    "cls": "pooling_mode_cls_token",
    "max": "pooling_mode_max_tokens",
    "mean": "pooling_mode_mean_tokens",
    "mean_sqrt_len": "pooling_mode_mean_sqrt_len_tokens",
}
_UNSUPPORTED_POOLING_KEYS = ("pooling_mode_weightedmean_tokens", "pooling_mode_lasttoken")
_TRANSFORMER = "sentence_transformers.models.Transformer"
_POOLING = "sentence_transformers.models.Pooling"
_NORMALIZE = "sentence_transformers.models.Normalize"


@dataclass(frozen=True)
class SentenceLayout:
    model_dir: Path  # the folder holding config.json and the weights
    pooling: tuple[str, ...] = ("mean",)  # concatenated in this order
    normalize: bool = False
    max_seq_length: int | None = None  # sentence_bert_config.json, if any
    do_lower_case: bool = False  # sentence_bert_config.json: lowercase text first


def read_layout(directory: str | Path) -> SentenceLayout:
    """Read ``modules.json`` (if present) and the files it points to."""
    directory = as_path(directory, "directory", "a model directory")
    if not directory.exists():
        raise FileNotFoundError(f"{directory}: no such model directory")
    if not directory.is_dir():
        raise NotADirectoryError(f"{directory}: expected a model directory, got a file")
    modules_path = directory / "modules.json"
    if not modules_path.is_file():
        return SentenceLayout(directory, **_sentence_bert_config(directory))
    modules = _read_json(modules_path)
    if not isinstance(modules, list) or not all(isinstance(m, dict) for m in modules):
        raise ValueError(f"{modules_path}: expected a JSON list of module objects")
    model_dir, pooling, normalize = None, ("mean",), False
    for module in sorted(modules, key=lambda m: m.get("idx", 0)):
        module_type, path = module.get("type", ""), directory / module.get("path", "")
        if module_type == _TRANSFORMER:
            model_dir = path
        elif module_type == _POOLING:
            pooling = read_pooling(path / "config.json")
        elif module_type == _NORMALIZE:
            normalize = True
        else:
            raise ValueError(
                f"{modules_path}: module type {module_type!r} is not supported; expected "
                f"{_TRANSFORMER}, {_POOLING} or {_NORMALIZE}"
            )
    if model_dir is None:
        raise ValueError(f"{modules_path}: expected a {_TRANSFORMER} module, found none")
    return SentenceLayout(model_dir, pooling, normalize, **_sentence_bert_config(model_dir))


def read_pooling(path: Path) -> tuple[str, ...]:
    """``1_Pooling/config.json`` -> the pooling modes it switches on, in concatenation order."""
    config = _read_json(path)
    if not isinstance(config, dict):
        raise ValueError(f"{path}: expected a JSON object")
    for key in _UNSUPPORTED_POOLING_KEYS:
        if config.get(key):
            raise ValueError(
                f"{path}: {key} is not supported; expected one of " + ", ".join(_POOLING_KEYS.values())
            )
    if isinstance(config.get("pooling_mode"), str):  # the short form: "mean", "cls", ...
        mode = {"mean_sqrt_len_tokens": "mean_sqrt_len"}.get(config["pooling_mode"], config["pooling_mode"])
        if mode not in POOLING_MODES:
            raise ValueError(
                f"{path}: pooling_mode: expected one of {', '.join(POOLING_MODES)}, "
                f"got {config['pooling_mode']!r}"
            )
        return (mode,)
    modes = tuple(m for m in POOLING_MODES if config.get(_POOLING_KEYS[m]))
    if not modes:
        raise ValueError(f"{path}: expected one of {', '.join(_POOLING_KEYS.values())} to be true, got none")
    return modes


def _sentence_bert_config(model_dir: Path) -> dict[str, Any]:
    path = model_dir / "sentence_bert_config.json"
    if not path.is_file():
        return {}
    config = _read_json(path)
    if not isinstance(config, dict):
        raise ValueError(f"{path}: expected a JSON object")
    out: dict[str, Any] = {"do_lower_case": bool(config.get("do_lower_case", False))}
    max_seq = config.get("max_seq_length")
    if max_seq is not None:
        if isinstance(max_seq, bool) or not isinstance(max_seq, int) or max_seq <= 0:
            raise ValueError(f"{path}: max_seq_length: expected a positive int, got {max_seq!r}")
        out["max_seq_length"] = max_seq
    return out


def _read_json(path: Path) -> Any:
    if not path.is_file():
        raise FileNotFoundError(f"{path}: no such file")
    try:
        return json.loads(path.read_text())
    except json.JSONDecodeError as e:
        raise ValueError(f"{path}: not valid JSON ({e})") from None
