"""An embedding run: texts in, L2-normalised vectors out. A finished run directory is also a
sentence-transformers directory (SentenceTransformer(RUN) and `tformer embed RUN` load it)."""

from __future__ import annotations

from collections.abc import Iterable
from pathlib import Path

import numpy as np

from tformer.export import onnx as tonnx
from tformer.export.model_card import Card
from tformer.runs.base import Run, texts_of


class EmbeddingRun(Run):
    verb = "embed"

    def embed(self, texts: str | Iterable[str], batch_size: int = 64) -> np.ndarray:
        """(N, D) L2-normalised float32 vectors (one str is one text)."""
        return self.objective.embed(self.model, texts_of(texts), batch_size=batch_size).numpy()

    def export_hf(self, out: Path, card: Card) -> Path:
        raise ValueError(f"--hf: {self.path} is an embedding run, already a sentence-transformers "
                         f"directory (SentenceTransformer('{self.path}') loads it); for ONNX use --onnx")

    def export_onnx(self, out: Path, card: Card, opset: int) -> Path:
        if (self.path / "modules.json").is_file():
            # The run's sentence-transformers folder: what `tformer embed RUN` and
            # SentenceTransformer(RUN) load (the best validated weights).
            graph = tonnx.graph_for(self.path)
        else:
            graph = tonnx.OnnxGraph(self.model.encoder, self.model.pooling, self.model.normalize)
        tonnx.report(out, tonnx.export_onnx(graph, out, opset=opset))
        return out
