"""Load a BERT-format (or tformer-format) directory into the NumPy reference, without torch.

    from tformer.reference import from_pretrained
    ref = from_pretrained(DIR)          # tformer.reference.Encoder, float32
    out = ref(input_ids, attention_mask=mask, token_type_ids=types)
    run = from_pretrained(RUN_DIR)      # a trained run: its Seq2SeqTransformer, EncoderClassifier,
                                        # MaskedLM or Encoder

The mirror of ``tformer.formats.pretrained.from_pretrained``: the same key table and checks
(``tformer.formats.hf_bert``), with safetensors' NumPy API and ``np.concatenate``.
Pickle checkpoints (``pytorch_model.bin``) need torch to read, so they are refused here.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

from tformer.config import TransformerConfig
from tformer.formats import hf_bert
from tformer.formats.model_dir import read_model_dir, tformer_model_class, weights_metadata
from tformer.reference.heads import MaskedLM, MultiLabelClassifier
from tformer.reference.model import Encoder, EncoderClassifier, Seq2SeqTransformer
from tformer.storage.checkpoint_names import latest_checkpoint

Model = Encoder | EncoderClassifier | MaskedLM | Seq2SeqTransformer


def from_pretrained(directory: str | Path, dtype=np.float32) -> Model:
    """A NumPy model with the weights of a BERT-format or tformer directory, or of a run
    directory written by `tformer train` (its best validated weights, as tformer.load_run
    reads them, else its newest checkpoint's). The class is the one the weights are for:
    Encoder (a BERT-format directory, save_pretrained's, an embedding run's encoder: pool it
    as the run's config says, tformer.reference.pooling), EncoderClassifier (a classification
    run), MaskedLM (a masked-LM run), MultiLabelClassifier (a multi-label run) or Seq2SeqTransformer
    (a seq2seq run)."""
    saved = latest_checkpoint(directory)
    if saved is not None:  # a run directory: its newest checkpoint's config
        best = Path(directory) / "best.safetensors"
        weights = best if best.is_file() else saved / "model.safetensors"
        return _tformer_model(saved / "config.json", [weights], dtype)
    md = read_model_dir(directory)
    files = hf_bert.weight_files(md.model_dir)  # safetensors only: allow_pickle stays False
    if not md.is_bert:
        return _tformer_model(md.config_path, files, dtype)
    state = _read_weights(files)
    source = str(files[0] if len(files) == 1 else md.model_dir / hf_bert.WEIGHTS_INDEX_FILE)
    cleaned = hf_bert.clean_state_dict(state, source)
    has_pooler = "pooler.dense.weight" in cleaned
    config = hf_bert.config_from_hf(md.config_json, has_pooler, str(md.config_path))
    return _loaded(Encoder(config, dtype=dtype), hf_bert.from_hf(cleaned, config, np.concatenate, source),
                   source)


def _tformer_model(config_path: Path, files: list[Path], dtype) -> Model:
    """The tformer model that the weights in `files` are for, configured by `config_path`."""
    state = _read_weights(files)
    try:
        config = TransformerConfig.load(config_path)
    except (ValueError, TypeError) as e:
        raise ValueError(f"{config_path}: {e}") from None
    kind = tformer_model_class(state, weights_metadata(files[0]))
    if kind == "SentenceModel":  # an embedding run: its encoder, the pooling has no weights
        state = {k.removeprefix("encoder."): v for k, v in state.items()}
    cls = {"Seq2SeqTransformer": Seq2SeqTransformer, "EncoderClassifier": EncoderClassifier,
           "MaskedLM": MaskedLM, "MultiLabelClassifier": MultiLabelClassifier}.get(kind, Encoder)
    return _loaded(cls(config, dtype=dtype), state, str(files[0]))


def _loaded(model, state: dict[str, np.ndarray], source: str):
    try:
        model.load_state_dict(state)
    except ValueError as e:
        raise ValueError(f"{source}: {e}") from None
    return model


def _read_weights(files: list[Path]) -> dict[str, np.ndarray]:
    from safetensors.numpy import load_file

    state: dict[str, np.ndarray] = {}
    for path in files:
        if not path.is_file():
            raise FileNotFoundError(f"{path}: no such file (listed in the safetensors index)")
        try:
            state.update(load_file(str(path)))
        except Exception as e:  # safetensors raises its own error types
            raise ValueError(f"{path}: not a readable safetensors file ({e})") from None
    return state
