"""An embedding run: texts in, L2-normalised vectors out. A finished run directory is also a
sentence-transformers directory (SentenceTransformer(RUN) and `tformer embed RUN` load it)."""

from __future__ import annotations

from collections.abc import Iterable
from pathlib import Path

import numpy as np

from tformer.export import hf_classifier
from tformer.export import onnx as tonnx
from tformer.export.export_dir import publish_export
from tformer.export.model_card import Card, render
from tformer.runs.base import Run, check_batch_size, texts_of


class EmbeddingRun(Run):
    verb = "embed"

    def embed(self, texts: str | Iterable[str], batch_size: int = 64) -> np.ndarray:
        """(N, D) L2-normalised float32 vectors (one str is one text); no texts: (0, D), as
        SentenceEncoder.encode([]) gives (it raised here)."""
        batch_size = check_batch_size(batch_size)
        if not isinstance(texts, (str, bytes, bytearray)) and isinstance(texts, Iterable):
            texts = list(texts)
            if not texts:
                return np.empty((0, self.dim), dtype=np.float32)
        return self.objective.embed(self.model, texts_of(texts), batch_size=batch_size).numpy()

    @property
    def dim(self) -> int:
        """The length of a vector: the model's width times its pooling modes."""
        return self.model.config.d_model * len(self.model.pooling)

    def export_hf(self, out: Path, card: Card) -> Path:
        raise ValueError(f"--hf: {self.path} is an embedding run, already a sentence-transformers "
                         f"directory (SentenceTransformer('{self.path}') loads it); for ONNX use --onnx")

    def export_onnx(self, out: Path, card: Card, opset: int) -> Path:
        """Folder ``out``: model.onnx (token and sentence embeddings), config.json, the
        tokenizer and the sentence-transformers layout (its ONNX backend loads it), a card."""
        out = tonnx.check_folder(out)  # refused before the tracing
        m, tok = self.model, self.tokenizer
        model, diff = tonnx.onnx_bytes(tonnx.SentenceGraph(m.encoder, m.pooling, m.normalize), opset)
        files = {"model.onnx": model,
                 **tonnx.sentence_files(m.config, m.pooling, m.normalize, tok.max_length),
                 **hf_classifier.tokenizer_files(tok.backend, tok.max_length,
                                                 extra_config=hf_classifier.BERT_INPUTS)}
        files["README.md"] = render(card, "an ONNX sentence-embedding folder (model.onnx: "
                                          "sentence_embedding), also a sentence-transformers directory "
                                          "for its ONNX backend",
                                    ONNX_USAGE.replace("PAD_TOKEN", tok.backend.id_to_token(tok.pad_id)),
                                    library_name="sentence-transformers",
                                    pipeline_tag="sentence-similarity", tags=("onnx",))
        written = publish_export(out, files, "--onnx")
        tonnx.report(f"{written}/", diff)
        return written


# PAD_TOKEN: the run's padding token (<pad>, or a fine-tuned BERT's [PAD]), filled in per run.
ONNX_USAGE = """
import numpy as np
import onnxruntime as ort
from tokenizers import Tokenizer

tokenizer = Tokenizer.from_file("DIR/tokenizer.json")  # cuts texts at the run's max_length
tokenizer.enable_padding(pad_id=tokenizer.token_to_id("PAD_TOKEN"), pad_token="PAD_TOKEN")
session = ort.InferenceSession("DIR/model.onnx")
batch = tokenizer.encode_batch(["some text", "another text"])
feed = {"input_ids": [e.ids for e in batch], "attention_mask": [e.attention_mask for e in batch],
        "token_type_ids": [e.type_ids for e in batch]}
inputs = {i.name: np.array(feed[i.name], dtype=np.int64) for i in session.get_inputs()}
tokens, sentences = session.run(None, inputs)  # sentences: (2, dim), L2-normalised
# or, with sentence-transformers[onnx]: SentenceTransformer("DIR", backend="onnx").encode([...])
"""
