"""A model directory, read once: where its encoder's files are and what its config says.

    md = read_model_dir(DIR)        # a BERT-format, sentence-transformers or tformer directory
    md.model_dir                    # the folder holding config.json and the weights
    md.layout.pooling, md.layout.normalize   # sentence-transformers' pipeline (mean, no norm else)
    md.config_json                  # config.json as read: BERT's (model_type) or tformer's (d_model)
    md.position_limit               # the longest input its position table takes, if it says

The weights (tformer.formats.pretrained), the tokenizer (tformer.text.tokenizer) and the sentence
encoder (tformer.embeddings.sentence) take a ModelDir: each reads its own files from what this
found, and no layer works the layout out again.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from tformer.formats import hf_bert
from tformer.formats.st_layout import SentenceLayout, read_layout


@dataclass(frozen=True)
class ModelDir:
    root: Path  # the directory named by the user
    layout: SentenceLayout  # modules.json's pipeline (a plain BERT directory: mean pooling)
    config_json: dict[str, Any]  # model_dir/config.json

    @property
    def model_dir(self) -> Path:
        return self.layout.model_dir

    @property
    def config_path(self) -> Path:
        return self.model_dir / "config.json"

    @property
    def is_bert(self) -> bool:
        """A transformers config (model_type): BERT's, or the XLM tformer exports (is_xlm)."""
        return "model_type" in self.config_json

    @property
    def is_xlm(self) -> bool:
        return self.config_json.get("model_type") == "xlm"

    @property
    def position_limit(self) -> int | None:
        """The position table's length (BERT's max_position_embeddings; a tformer config's
        max_len where positions are learned), if the config says."""
        c = self.config_json
        if "max_position_embeddings" in c:
            return int(c["max_position_embeddings"])
        if c.get("positional") == "learned" and "max_len" in c:
            return int(c["max_len"])
        return None

    def find(self, name: str) -> Path | None:
        """A file of the model's (a tokenizer's): in the encoder's folder, else at the root."""
        for folder in (self.model_dir, self.root):
            if (folder / name).is_file():
                return folder / name
        return None


def weights_metadata(path: Path) -> dict[str, str]:
    """A safetensors file's metadata (its header only; {} when it has none)."""
    from safetensors import safe_open

    with safe_open(str(path), framework="numpy") as f:
        return f.metadata() or {}


def read_model_dir(directory: str | Path | ModelDir) -> ModelDir:
    """The layout and config.json of a model directory (a ModelDir is handed back as it is)."""
    if isinstance(directory, ModelDir):
        return directory
    layout = read_layout(directory)
    raw = hf_bert.read_config(layout.model_dir)
    if "model_type" not in raw and "d_model" not in raw:
        raise ValueError(
            f"{layout.model_dir / 'config.json'}: expected a BERT config (model_type: bert; or xlm) or a "
            "tformer config (d_model, n_heads, ...), got neither"
        )
    return ModelDir(Path(directory), layout, raw)


def tformer_model_class(keys, metadata: dict[str, str] | None = None) -> str:
    """Which of tformer's models a tformer weights file is for: the class its metadata names
    (every checkpoint and best.safetensors says it, tformer.storage.checkpoint.weights_metadata);
    for files written before they said, guessed from the tensor names: "Seq2SeqTransformer"
    (decoder.*), "EncoderClassifier" (encoder.*, head.*), "SentenceModel" (an embedding run: an
    Encoder under encoder.*), else save_pretrained's "Encoder"."""
    if metadata and metadata.get("model"):
        return metadata["model"]
    keys = list(keys)
    if any(k.startswith("decoder.") for k in keys):
        return "Seq2SeqTransformer"
    if any(k.startswith("head.") for k in keys):
        return "EncoderClassifier"
    if keys and all(k.startswith("encoder.") for k in keys):
        return "SentenceModel"
    return "Encoder"
