"""Load and save pretrained encoders: BERT-format directories and tformer's own format.

    model = Encoder.from_pretrained(DIR)  # a BERT checkpoint, a sentence-transformers folder,
                                     # or a directory written by save_pretrained
    save_pretrained(model, OUT)      # tformer format: config.json + model.safetensors
    export_hf(model, HF_OUT)         # a directory transformers' BertModel.from_pretrained reads

The two formats are told apart by config.json: BERT's has ``model_type: bert``, tformer's
is a TransformerConfig (``d_model``, ``n_heads``...). ``model_type: xlm`` is read in the layout
`tformer export --hf` writes a mean-pooled classifier in (its encoder; ``formats.hf_xlm``).
Weights are read from safetensors only, unless ``allow_pickle=True`` lets a
``pytorch_model.bin`` through, and then with ``torch.load(weights_only=True)``. The key tables
and their checks live in ``tformer.formats.hf_bert`` (and ``hf_xlm``); this module does the
file and torch side.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

import torch
from safetensors import safe_open
from safetensors.torch import load_file
from safetensors.torch import save as st_save
from torch import nn

from tformer.config import TransformerConfig
from tformer.config.sizes import check_fits
from tformer.errors import BadType, as_path, check_flag
from tformer.formats import hf_bert, hf_xlm
from tformer.formats.model_dir import ModelDir, read_model_dir, tformer_model_class, weights_metadata
from tformer.formats.st_layout import read_layout
from tformer.storage.checkpoint_names import latest_checkpoint
from tformer.storage.files import json_bytes, write_dir_atomic


def read_pretrained(
    directory: str | Path | ModelDir, model_cls: type[nn.Module], allow_pickle: bool = False
) -> tuple[TransformerConfig, dict[str, torch.Tensor], Path]:
    """The config, the state dict under our keys, and the weights' path, of a BERT-format or
    tformer directory. ``Encoder.from_pretrained`` builds the model from them; it passes its
    class, whose shapes (built on the meta device) the file's are checked against first.

    A run directory written by `tformer train` gives its encoder, with the weights
    tformer.load_run reads (the best validated ones, else the newest checkpoint's): a
    classifier's head is left out, as a BERT checkpoint's masked-LM head is; a source+target
    run's weights are refused, naming tformer.load_run."""
    check_flag("allow_pickle", allow_pickle)  # before a run directory's weights, which are safetensors
    if not isinstance(directory, ModelDir) and (saved := latest_checkpoint(directory)) is not None:
        best = Path(directory) / "best.safetensors"
        weights = best if best.is_file() else saved / hf_bert.WEIGHTS_FILE
        config = tformer_config(read_model_dir(saved))
        return config, _encoder_state(config, [weights], saved, model_cls), weights
    md = read_model_dir(directory)
    if md.is_bert:
        config, state = _load_hf(md, allow_pickle)
    else:
        config = tformer_config(md)
        files = hf_bert.weight_files(md.model_dir, allow_pickle)
        state = _encoder_state(config, files, md.model_dir, model_cls)
    return config, state, md.model_dir / hf_bert.WEIGHTS_FILE


def pretrained_config(directory: str | Path | ModelDir) -> TransformerConfig:
    """The TransformerConfig of a BERT-format or tformer directory, from its config.json alone
    (no weights read: a BERT pooler's presence is not known here, and is reported as absent)."""
    md = read_model_dir(directory)
    if md.is_xlm:
        return hf_xlm.config_from_hf(md.config_json, str(md.config_path))
    if md.is_bert:
        return hf_bert.config_from_hf(md.config_json, False, str(md.config_path))
    return tformer_config(md)


def tformer_config(md: ModelDir) -> TransformerConfig:
    """A tformer directory's TransformerConfig, errors naming its config.json."""
    try:
        return TransformerConfig.from_dict(md.config_json)
    except (ValueError, TypeError) as e:
        raise ValueError(f"{md.config_path}: {e}") from None


def save_pretrained(model: nn.Module, directory: str | Path, tokenizer_dir: str | Path | None = None) -> None:
    """Write ``config.json`` (the TransformerConfig) and ``model.safetensors`` (our keys).

    ``tokenizer_dir``: also copy its tokenizer files, so the directory is self-contained.
    The directory is written as a whole (see ``_write_model_dir``).
    """
    directory = _check_arguments(model, directory, tokenizer_dir)
    state = {k: v.detach().contiguous().cpu() for k, v in model.state_dict().items()}
    files = {"config.json": json_bytes(model.config.to_dict()),
             hf_bert.WEIGHTS_FILE: st_save(state, metadata={"format": "pt"})}
    _write_model_dir(directory, files, tokenizer_dir)


def _check_arguments(model: nn.Module, directory: str | Path, tokenizer_dir: str | Path | None) -> Path:
    """save_pretrained's and export_hf's arguments, refused in one line naming them (a run, or
    anything but a tformer model, failed deep inside with an AttributeError)."""
    if not isinstance(model, nn.Module) or not isinstance(getattr(model, "config", None), TransformerConfig):
        hint = ("; a run exports with run.export(hf=DIR), its model is run.model"
                if hasattr(model, "export") else "")
        raise BadType("model", f"expected a tformer model (an nn.Module with a TransformerConfig, e.g. "
                      f"an Encoder), got {type(model).__name__}{hint}")
    if tokenizer_dir is not None:
        as_path(tokenizer_dir, "tokenizer_dir", "a model directory")
    return as_path(directory, "directory", "a directory")


def export_hf(model: nn.Module, directory: str | Path, tokenizer_dir: str | Path | None = None) -> None:
    """Write a BERT directory (config.json + model.safetensors with HF keys).

    ``transformers.BertModel.from_pretrained(directory)`` loads it. A model without a pooler
    exports none; transformers then initialises its pooler randomly (and says so).
    ``tokenizer_dir``: also copy its tokenizer files.
    """
    directory = _check_arguments(model, directory, tokenizer_dir)
    hf_config = hf_bert.config_to_hf(model.config)
    state = {k: v.detach().cpu() for k, v in model.state_dict().items()}
    hf_state = {k: v.contiguous().clone() for k, v in hf_bert.to_hf(state, model.config).items()}
    files = {"config.json": json_bytes(hf_config),
             hf_bert.WEIGHTS_FILE: st_save(hf_state, metadata={"format": "pt"})}
    _write_model_dir(directory, files, tokenizer_dir)


TOKENIZER_FILES = ("tokenizer.json", "vocab.txt", "tokenizer_config.json", "special_tokens_map.json")


def _write_model_dir(directory: Path, files: dict[str, bytes], tokenizer_dir: str | Path | None
                     ) -> None:
    """Write a model directory as one unit: built beside it, then swapped in atomically, so a
    crash leaves the old directory or the new one, never a config that does not match its
    weights. A directory holding anything else than a saved model is refused, untouched."""
    if tokenizer_dir is not None:
        files = {**files, **_tokenizer_files(Path(tokenizer_dir))}
    if directory.is_dir():
        ours = set(files) | set(TOKENIZER_FILES) | {hf_bert.WEIGHTS_FILE, "config.json"}
        other = sorted(p.name for p in directory.iterdir() if p.name not in ours)
        if other:
            raise ValueError(
                f"directory: {directory} holds files a saved model does not "
                f"({', '.join(other[:3])}); expected a new directory or a saved model's"
            )
    directory.parent.mkdir(parents=True, exist_ok=True)
    write_dir_atomic(directory, files)


def _tokenizer_files(source: Path) -> dict[str, bytes]:
    if not source.is_dir():
        raise FileNotFoundError(f"tokenizer_dir {source}: no such directory")
    model_dir = read_layout(source).model_dir  # a sentence-transformers folder works too
    found = [model_dir / name for name in TOKENIZER_FILES if (model_dir / name).is_file()]
    if not any(p.name in ("tokenizer.json", "vocab.txt") for p in found):
        raise FileNotFoundError(f"tokenizer_dir {model_dir}: no tokenizer.json or vocab.txt")
    return {p.name: p.read_bytes() for p in found}


# Reading --------------------------------------------------------------------------------
def _load_hf(md: ModelDir, allow_pickle: bool):
    model_dir, raw = md.model_dir, md.config_json
    files = hf_bert.weight_files(model_dir, allow_pickle)
    state = _read_weights(files)
    source = str(files[0] if len(files) == 1 else model_dir / hf_bert.WEIGHTS_INDEX_FILE)
    if md.is_xlm:  # the classifier `tformer export --hf` writes without BERT's pooler: its encoder
        config = hf_xlm.config_from_hf(raw, str(md.config_path))
        cleaned = hf_xlm.clean_state_dict(state)
        _check_sizes(config, cleaned, r"attentions\.(\d+)\.", "n_layers", model_dir, source)
        return config, hf_xlm.from_hf(cleaned, config, _xlm_token_types(md), torch.cat, source)
    cleaned = hf_bert.clean_state_dict(state, source)
    has_pooler = "pooler.dense.weight" in cleaned
    config = hf_bert.config_from_hf(raw, has_pooler, str(model_dir / "config.json"))
    _check_sizes(config, cleaned, r"encoder\.layer\.(\d+)\.", "num_hidden_layers", model_dir, source)
    return config, hf_bert.from_hf(cleaned, config, torch.cat, source)


def _xlm_token_types(md: ModelDir) -> bool:
    """Whether an XLM export takes token types: its tokenizer returns them (tokenizer_config.json's
    model_input_names; tformer writes them for a run trained on text pairs)."""
    path = md.find("tokenizer_config.json")
    try:
        names = json.loads(path.read_text()).get("model_input_names") if path else None
    except (json.JSONDecodeError, UnicodeDecodeError, AttributeError) as e:
        raise ValueError(f"{path}: expected a JSON object ({e})") from None
    return "token_type_ids" in (names or ())


def _encoder_state(config: TransformerConfig, files: list[Path], model_dir: Path,
                   model_cls: type[nn.Module]) -> dict[str, torch.Tensor]:
    """The encoder's tensors in tformer weight files: an Encoder's, or the encoder of a trained
    classifier or sentence model (``formats.model_dir.tformer_model_class``)."""
    if all(p.suffix == ".safetensors" for p in files):  # shapes from the headers, nothing loaded
        shapes = _encoder_keys({k: v for p in files for k, v in _header_shapes(p).items()}, files[0])
        _check_sizes(config, shapes, r"layers\.(\d+)\.", "n_layers", model_dir, str(files[0]))
        _check_shapes(model_cls, config, shapes, str(files[0]))
    return _encoder_keys(_read_weights(files), files[0])


def _encoder_keys(state: dict, source: Path) -> dict:
    """`state` (tensors or shapes) under an Encoder's keys: a trained run's model keeps its
    encoder under "encoder." (a classifier's head is left out); a translation model has none."""
    metadata = weights_metadata(source) if source.suffix == ".safetensors" and source.is_file() else None
    kind = tformer_model_class(state, metadata)
    if kind == "Seq2SeqTransformer":
        raise ValueError(f"{source}: expected an encoder's weights, got a Seq2SeqTransformer's (a "
                         "source+target run): load the run with tformer.load_run(RUN_DIR)")
    if kind == "Encoder":
        return state
    return {k.removeprefix("encoder."): v for k, v in state.items() if k.startswith("encoder.")}


def _header_shapes(path: Path) -> dict[str, tuple[int, ...]]:
    """{tensor name: shape} from a safetensors file's header, without reading any tensor."""
    if not path.is_file():
        raise FileNotFoundError(f"{path}: no such file (listed in the safetensors index)")
    try:
        with safe_open(str(path), framework="pt") as f:
            return {k: tuple(f.get_slice(k).get_shape()) for k in f.keys()}
    except Exception as e:  # safetensors raises its own error types
        raise ValueError(f"{path}: not a readable safetensors file ({e})") from None


def _check_sizes(config: TransformerConfig, tensors, layer_key: str, config_key: str,
                 model_dir: Path, source: str) -> None:
    """Before building anything: the config's layer count must be the file's, and the
    model must fit in memory (a config.json typo must not allocate until the OOM killer)."""
    layers = {int(m.group(1)) for k in tensors if (m := re.match(layer_key, k))}
    in_file = max(layers) + 1 if layers else 0
    if config.n_layers > in_file:  # (fewer: the strict load names the unexpected tensor)
        raise ValueError(f"{model_dir / 'config.json'}: {config_key}: expected at most the "
                         f"{in_file} layers {source} holds weights for, got {config.n_layers}")
    check_fits(config, "encoder", what=str(model_dir / "config.json"))


def _check_shapes(model_cls: type[nn.Module], config: TransformerConfig,
                  shapes: dict[str, tuple[int, ...]], source: str) -> None:
    """The file's tensor shapes against the config's, from a model built on the meta device."""
    with torch.device("meta"):
        expected = {k: tuple(v.shape) for k, v in model_cls(config).state_dict().items()}
    for key, shape in expected.items():
        if key in shapes and shapes[key] != shape:
            raise ValueError(f"{source}: tensor {key!r}: expected shape {shape}, got "
                             f"{shapes[key]} (config.json and the weights disagree)")


def _read_weights(files: list[Path]) -> dict[str, torch.Tensor]:
    state: dict[str, torch.Tensor] = {}
    for path in files:
        if not path.is_file():
            raise FileNotFoundError(f"{path}: no such file (listed in the safetensors index)")
        if path.suffix == ".bin":
            # weights_only: tensors and plain containers only, no arbitrary unpickling.
            try:
                part = torch.load(path, map_location="cpu", weights_only=True)
            except Exception as e:  # UnpicklingError (blocked), EOFError, IndexError...
                first = (str(e).strip().splitlines() or [type(e).__name__])[0]
                raise ValueError(
                    f"{path}: not a loadable weights-only pickle ({type(e).__name__}: {first[:200]})"
                ) from None
            if not isinstance(part, dict):
                raise ValueError(f"{path}: expected a state dict, got {type(part).__name__}")
        else:
            try:
                part = load_file(str(path))
            except Exception as e:  # safetensors raises its own error types
                raise ValueError(f"{path}: not a readable safetensors file ({e})") from None
        state.update(part)
    return state


def load_state(model: nn.Module, state: dict[str, torch.Tensor], source: Path) -> None:
    """Strict load: missing/extra/wrong-shape tensors -> ValueError naming file and tensor."""
    expected = model.state_dict()
    missing = [k for k in expected if k not in state]
    if missing:
        raise ValueError(f"{source}: missing tensor {missing[0]!r} for this config")
    extra = sorted(k for k in state if k not in expected)
    if extra:
        raise ValueError(f"{source}: unexpected tensor {extra[0]!r} for this config")
    for key, ref in expected.items():
        if tuple(state[key].shape) != tuple(ref.shape):
            raise ValueError(
                f"{source}: tensor {key!r}: expected shape {tuple(ref.shape)}, got {tuple(state[key].shape)}"
            )
        if state[key].is_floating_point() and not bool(torch.isfinite(state[key]).all()):
            raise ValueError(f"{source}: tensor {key!r} holds NaN or infinite values; "
                             "expected finite weights")
    model.load_state_dict({k: v.to(torch.float32) for k, v in state.items()}, strict=True)
