"""A classification run: texts (and text pairs) in, a label and its probabilities out."""

from __future__ import annotations

import sys
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from tformer.export import hf_classifier
from tformer.export import onnx as tonnx
from tformer.export.model_card import Card
from tformer.runs.base import Run, texts_of


class ClassificationRun(Run):
    verb = "predict"

    @property
    def labels(self) -> list[str]:
        return self.objective.labels

    def _labels(self) -> tuple[str, ...]:
        return tuple(self.labels) if self.tokenizer is not None else ()

    def predict(self, texts: str | Iterable[str], pairs: Iterable[str | None] | None = None,
                batch_size: int = 64) -> list[dict[str, Any]]:
        """{"label", "probabilities": {label: p}} per text (one str is one text; pairs: each
        text's text_pair, for a run trained on pairs)."""
        texts = texts_of(texts)
        pairs = None if pairs is None else list(pairs)
        return self.objective.classify(self.model, texts, pairs, batch_size=batch_size)

    def answers(self, texts: list[str], batch_size: int = 64, **_: Any) -> list[str]:
        """What `tformer generate` prints per input: the label."""
        return [p["label"] for p in self.predict(texts, batch_size=batch_size)]

    def export_hf(self, out: Path, card: Card) -> Path:
        if self.tokenizer is None:
            raise ValueError(f"--hf: {self.path} is a synthetic-task run ({self.config.task}) with no text "
                             "tokenizer for transformers; export it with --onnx")
        if not self.model.config.pooler:
            raise ValueError(
                f"--hf: {self.path} pools by mean (the default from scratch), which "
                "BertForSequenceClassification cannot express; export it with --onnx, or train "
                "with --pooling cls for a classifier transformers loads")
        tok = self.tokenizer
        written = hf_classifier.export_classifier(out, self.model, tok.backend, tuple(self.labels),
                                                  tok.max_length, card)
        print(f"wrote {written}/ (AutoModelForSequenceClassification.from_pretrained loads it)", file=sys.stderr)
        return written

    def export_onnx(self, out: Path, card: Card, opset: int) -> Path:
        diff = tonnx.export_onnx(tonnx.ClassifierGraph(self.model), out, opset=opset)
        tonnx.report(out, diff)
        return out
