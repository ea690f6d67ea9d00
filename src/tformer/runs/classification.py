"""A classification run: texts (and text pairs) in, a label and its probabilities out."""

from __future__ import annotations

import sys
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from tformer.export import hf_classifier, hf_xlm
from tformer.export import onnx as tonnx
from tformer.export.export_dir import publish_export
from tformer.export.model_card import Card, render
from tformer.formats.hf_xlm import ARCHITECTURE, Inexpressible
from tformer.runs.base import Run, check_batch_size, texts_of
from tformer.storage.files import json_bytes
from tformer.text.arguments import pairs_list
from tformer.training.config import MODEL_OPTIONS
from tformer.training.sources import FileSource


class ClassificationRun(Run):
    verb = "predict"

    @property
    def labels(self) -> list[str]:
        return self.objective.labels

    @property
    def pairs(self) -> bool:
        """Whether the run was trained on text pairs (its data had a text_pair field; a synthetic
        task has no data file, and single inputs)."""
        source = self.objective.source
        return isinstance(source, FileSource) and bool(source.data.pairs)

    def _labels(self) -> tuple[str, ...]:
        return tuple(self.labels) if self.tokenizer is not None else ()

    def predict(self, texts: str | Iterable[str], pairs: Iterable[str | None] | None = None,
                batch_size: int = 64) -> list[dict[str, Any]]:
        """{"label", "probabilities": {label: p}} per text (one str is one text; pairs: each
        text's text_pair, for a run trained on pairs; with one text, one str)."""
        texts = texts_of(texts)
        pairs = None if pairs is None else pairs_list(pairs, len(texts))
        return self.objective.classify(self.model, texts, pairs, batch_size=check_batch_size(batch_size))

    def answers(self, texts: list[str], batch_size: int = 64, **_: Any) -> list[str]:
        """What `tformer generate` prints per input: the label."""
        return [p["label"] for p in self.predict(texts, batch_size=batch_size)]

    def export_hf(self, out: Path, card: Card) -> Path:
        """With BERT's pooler (--pooling cls): BertForSequenceClassification; without (the
        default from scratch, mean pooling): XLMForSequenceClassification (tformer.export.hf_xlm)."""
        if self.tokenizer is None:
            raise ValueError(f"--hf: {self.path} is a synthetic-task run ({self.config.task}) with no text "
                             "tokenizer for transformers; export it with --onnx")
        tok = self.tokenizer
        if self.model.config.pooler:
            try:
                written, diff = hf_classifier.export_classifier(out, self.model, tok.backend,
                                                                tuple(self.labels), tok.max_length, card)
            except ValueError as e:  # "config.norm_first: a BERT export needs ...": name the option
                field, _, rest = str(e).partition(": ")
                if not field.startswith("config."):
                    raise
                raise ValueError(f"--hf: {self.path}: {_option(field[len('config.'):])}: "
                                 f"BertForSequenceClassification: {rest}; export it with --onnx") from None
            print(f"wrote {written}/ (BertForSequenceClassification, max abs diff {diff:.1e} on the logits "
                  "against tformer; AutoModelForSequenceClassification.from_pretrained loads it)",
                  file=sys.stderr)
            return written
        try:
            written, diff = hf_xlm.export_classifier(out, self.model, tok, tuple(self.labels), card,
                                                     pairs=self.objective.source.data.pairs)
        except Inexpressible as e:
            # BertForSequenceClassification takes any feed-forward width and padding id, not the rest.
            cls = (", or train with --pooling cls (BertForSequenceClassification)"
                   if e.field in ("d_ff", "pad_id") else "")
            raise ValueError(f"--hf: {self.path}: {_option(e.field)}: {ARCHITECTURE} (what a classifier "
                             f"without BERT's pooler exports as) needs {e.need}, got {e.got!r}; "
                             f"export it with --onnx{cls}") from None
        mean = self.model.config.pooling == "mean"
        one = ("; exact one text per call (pipeline's default): a padded batch would average over its "
               "padding, so it fails (the padding token's id is past the vocabulary)" if mean else "")
        print(f"wrote {written}/ ({ARCHITECTURE}, max abs diff {diff:.1e} on the logits against "
              f"tformer; AutoModelForSequenceClassification.from_pretrained loads it{one})", file=sys.stderr)
        return written

    def export_onnx(self, out: Path, card: Card, opset: int) -> Path:
        """Folder ``out``: model.onnx (logits), config.json (id2label), the tokenizer, a card."""
        out = tonnx.check_folder(out)  # refused before the tracing
        model, diff = tonnx.onnx_bytes(tonnx.ClassifierGraph(self.model), opset)
        files = {"model.onnx": model,
                 "config.json": json_bytes(tonnx.classifier_config(self.model.config, self.labels))}
        tok = self.tokenizer
        if tok is not None:
            files.update(hf_classifier.tokenizer_files(tok.backend, tok.max_length,
                                                       extra_config=hf_classifier.BERT_INPUTS))
        files["README.md"] = render(card, "an ONNX classifier (model.onnx: logits; config.json: id2label)",
                                    ONNX_USAGE, library_name="onnx", pipeline_tag="text-classification",
                                    tags=("onnx",))
        written = publish_export(out, files, "--onnx")
        tonnx.report(f"{written}/", diff)
        return written


def _option(field: str) -> str:
    """What the user set that a config field comes from: its option (--d-ff), else the field."""
    if field == "pad_id":
        return "the tokenizer's padding id"
    return f"--{field.replace('_', '-')}" if field in MODEL_OPTIONS else f"config.{field}"


ONNX_USAGE = """
import json
import numpy as np
import onnxruntime as ort
from tokenizers import Tokenizer

tokenizer = Tokenizer.from_file("DIR/tokenizer.json")  # cuts texts at the run's max_length
session = ort.InferenceSession("DIR/model.onnx")
labels = json.load(open("DIR/config.json"))["id2label"]
enc = tokenizer.encode("some text")
feed = {"input_ids": [enc.ids], "attention_mask": [enc.attention_mask], "token_type_ids": [enc.type_ids]}
(logits,) = session.run(None, {i.name: np.array(feed[i.name], dtype=np.int64) for i in session.get_inputs()})
probs = np.exp(logits - logits.max(-1, keepdims=True))
probs /= probs.sum(-1, keepdims=True)
print(labels[str(int(probs[0].argmax()))], probs[0])
"""
