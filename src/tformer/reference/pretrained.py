"""Load a BERT-format (or tformer-format) directory into the NumPy reference, without torch.

    from tformer.reference import from_pretrained
    ref = from_pretrained(DIR)          # tformer.reference.Encoder, float32
    out = ref(input_ids, attention_mask=mask, token_type_ids=types)

The mirror of ``tformer.formats.pretrained.from_pretrained``: the same key table and checks
(``tformer.formats.hf_bert``), with safetensors' NumPy API and ``np.concatenate``.
Pickle checkpoints (``pytorch_model.bin``) need torch to read, so they are refused here.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

from tformer.config import TransformerConfig
from tformer.formats import hf_bert
from tformer.formats.model_dir import read_model_dir
from tformer.reference.model import Encoder


def from_pretrained(directory: str | Path, dtype=np.float32) -> Encoder:
    """A NumPy Encoder with the weights of a BERT-format or tformer directory."""
    md = read_model_dir(directory)
    files = hf_bert.weight_files(md.model_dir)  # safetensors only: allow_pickle stays False
    state = _read_weights(files)
    source = str(files[0] if len(files) == 1 else md.model_dir / hf_bert.WEIGHTS_INDEX_FILE)
    if md.is_bert:
        cleaned = hf_bert.clean_state_dict(state, source)
        has_pooler = "pooler.dense.weight" in cleaned
        config = hf_bert.config_from_hf(md.config_json, has_pooler, str(md.config_path))
        state = hf_bert.from_hf(cleaned, config, np.concatenate, source)
    else:
        config = TransformerConfig.load(md.config_path)
    model = Encoder(config, dtype=dtype)
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
