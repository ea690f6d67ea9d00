"""Classification: an encoder, pooled, and a linear head over the labels (a synthetic task's
classes, or the labels of your file's records, with an optional second text: text_pair).

    {"text": "...", "label": "..."}  (+ "text_pair")     tformer predict RUN "a text"

Trained with cross-entropy (weighted towards rare labels with --class-weights weighted:
``class_weights``; unweighted by default, where weighting measured no better); scored by
accuracy and macro-F1 against the majority class. Its one forward gives the logits: `tformer
predict`, ``Run.predict``, evaluation and the server's /predict (TEI's protocol; its raw_scores
are the logits themselves) all run it.

A label is a class name, never silently something else: a fractional number (0.73, or the
text "0.73") is refused naming the `score` field that trains regression; whole numbers stay
class names and the run's first line says they look numeric; labels that look like several
joined ("a;b") are warned about, naming --label-separator (multi-label, tformer.kinds).
"""

from __future__ import annotations

import functools
import math
import sys
from collections.abc import Iterable
from pathlib import Path
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F
from torch import Tensor, nn

from tformer.config import TransformerConfig
from tformer.export import hf_classifier, hf_xlm
from tformer.export import onnx as tonnx
from tformer.export.export_dir import publish_export
from tformer.export.model_card import Card, render
from tformer.formats import hf_bert
from tformer.formats import hf_xlm as hf_xlm_format
from tformer.kinds.base import Kind
from tformer.kinds.hf_refusals import hf_refusals
from tformer.kinds.labels import LabelFields, class_weights, label_notes
from tformer.kinds.run import Run, check_batch_size, texts_of
from tformer.kinds.serving import InputRefused, Item, too_long
from tformer.nn.model import EncoderClassifier, from_pretrained
from tformer.storage.files import json_bytes
from tformer.text.arguments import pairs_list
from tformer.text.batches import EncoderBatch, encoder_batch
from tformer.training import evaluation, probe
from tformer.training.examples import LabeledExample
from tformer.training.losses import at_least_fp32
from tformer.training.objective import Objective, Tally
from tformer.training.report import plot_confusion
from tformer.training.sources import FileSource

FIELDS = LabelFields("classification", ("text", "label"), ("text_pair",), ("text", "text_pair"),
                     label="label", min_labels=2)
# Sized for a 2-core CPU and minutes (tformer.training.presets says how); batches of 32 texts
# (package classification, 5 minutes: 0.801 accuracy, against 0.786 for 4,096-token batches).
PRESET = {"d_model": 128, "n_heads": 4, "d_ff": 512, "n_layers": 2, "activation": "gelu", "vocab_size": 4000,
          "lr": 5e-4, "warmup": 200, "schedule": "linear", "pooling": "mean", "steps": 10000,
          "max_tokens": None, "batch_size": 32, "eval_every": 250, "patience": 8, "max_length": 64}
MAJORITY = "the majority class"  # the trivial baseline

class Classification(Objective):
    kind, fields, preset = FIELDS.objective, FIELDS, PRESET
    reads = ("pooling", "long", "class_weights", "head_init")
    pools = "mean"  # a long text's windows: the mean of their logits (tformer.training.windows)
    model_kind = "classifier"
    main_metric = "accuracy"
    inputs = ("text", "text_pair")
    job = "classification"  # what the run's first line calls it
    model_class = EncoderClassifier

    def what(self) -> str:
        notes = "".join(f"; {note}" for note in self.notes())
        return self._what() + notes

    def _what(self) -> str:
        pooling = self.config.model.pooling
        if self.source.tokenizer is None or self.config.from_pretrained:
            return f"{self.job} into {len(self.labels)} labels"
        # Said when the run starts, not when its export is refused (benchmarks/README.md: mean
        # pooling measured more accurate than the pooler on two real data sets).
        if pooling == "cls":
            try:
                hf_bert.config_to_hf(self.model_config())
                exports = "exports to transformers (BertForSequenceClassification) and ONNX"
            except ValueError as e:  # pre-norm: one line, naming the field
                exports = f"exports to ONNX; `export --hf` (BertForSequenceClassification): {e}"
        else:
            try:
                hf_xlm_format.check_expressible(self.model_config())
                arch = hf_xlm_format.ARCHITECTURE
                exports = f"exports to ONNX and to transformers ({arch}: one text per call)"
            except hf_xlm_format.Inexpressible as e:
                exports = (f"exports to ONNX; `export --hf` ({hf_xlm_format.ARCHITECTURE}) needs "
                           f"{e.field} {e.need}")
        return f"{self.job} into {len(self.labels)} labels, {pooling} pooling ({exports})"

    def notes(self) -> list[str]:
        """What the run's first line says of its labels: numbers read as classes, labels that look
        joined, a weighted loss (tformer.kinds.labels)."""
        notes = label_notes(self.labels) if isinstance(self.source, FileSource) else []
        return notes + [note for note in (self.weighting[1],) if note]

    @property
    def label_counts(self) -> list[int]:
        """Records of the training file holding each label, in the labels' order ([] for a
        synthetic task; runs older than the counts in data.json: zeros)."""
        if not isinstance(self.source, FileSource):
            return []
        return [self.source.data.label_counts.get(name, 0) for name in self.labels]

    @functools.cached_property
    def weighting(self) -> tuple[Tensor | None, str]:
        """The loss's weight per class (C,) or None, and what the run's first line says of it
        (tformer.kinds.labels.class_weights: --class-weights, the training labels' skew)."""
        return class_weights(self.config.class_weights, self.label_counts)

    @property
    def labels(self) -> list[str]:
        return self.source.labels

    def model_config(self) -> TransformerConfig:
        # From scratch, mean pooling by default (more accurate than BERT's pooler on two real
        # data sets, 1.0 and 4.3 points: benchmarks/classifier_pooling.py, benchmarks/README.md);
        # --pooling cls adds the pooler, so the model is a transformers BertForSequenceClassification;
        # mean pooling exports as an XLMForSequenceClassification (tformer.export.hf_xlm).
        pooling = self.config.model.pooling
        return self.source.encoder_config(n_classes=len(self.labels), pooling=pooling,
                                          pooler=pooling == "cls")

    def build_model(self, model_config: TransformerConfig | None = None) -> nn.Module:
        if model_config is None and self.pretrained is not None:
            encoder = from_pretrained(self.pretrained)
            config = self.finetune_config(encoder.config).replace(n_classes=len(self.labels))
            model = self.model_class(config)
            model.encoder.load_state_dict(encoder.state_dict())
            # The new head starts small (BERT: normal, std 0.02), as transformers initialises it.
            nn.init.normal_(model.head.weight, std=0.02)
            nn.init.zeros_(model.head.bias)
            return model.train()
        return self.model_class(model_config or self.model_config())

    probes_head = True  # (measured: tformer.training.probe)

    def fit_head(self, model: nn.Module, features: Tensor, targets: Tensor) -> str | None:
        return probe.fit_softmax(model.head, features, targets)

    def encode(self, examples: list) -> list[LabeledExample]:
        s = self.source
        texts = s.encode_texts([s.field(ex, "text") for ex in examples],
                               [s.field(ex, "text_pair") for ex in examples])
        return [LabeledExample(text, label) for text, label in zip(texts, s.label_ids(examples), strict=True)]

    def collate(self, encoded: list[LabeledExample]) -> EncoderBatch:
        return encoder_batch([e.text for e in encoded], self.source.pad_id, [e.label for e in encoded])

    def forward(self, model: nn.Module, batch: EncoderBatch) -> Tensor:
        """The one inference forward: (B, C) logits (a long text's windows' pooled)."""
        logits = model(batch.input_ids, batch.attention_mask, batch.token_type_ids).logits  # (W, C)
        return batch.pooled(logits, self.pools)  # (B, C)

    def loss(self, model: nn.Module, batch: EncoderBatch, label_smoothing: float = 0.0):
        """Cross-entropy over the classes, and accuracy for logging."""
        logits = self.forward(model, batch)  # (B, C)
        wide = at_least_fp32(logits)
        weight = None if self.weighting[0] is None else self.weighting[0].to(wide.device, wide.dtype)
        loss = F.cross_entropy(wide, batch.labels, weight=weight, label_smoothing=label_smoothing)
        return loss, (logits.argmax(-1) == batch.labels).float().mean().item()

    def predict_batch(self, model: nn.Module, batch: EncoderBatch) -> list[list[float]]:
        """The logits per example."""
        return self.forward(model, batch).float().tolist()

    loss_from_predictions = True  # (its predictions are the logits its loss reads)

    def loss_of_predictions(self, examples: list, preds: list[list[float]]) -> float:
        """``loss``'s cross-entropy (weighted alike, unsmoothed) of the logits predicted."""
        weight = self.weighting[0]
        return F.cross_entropy(torch.tensor(preds, dtype=torch.float32),
                               torch.tensor(self.source.label_ids(examples)),
                               weight=None if weight is None else weight.float().cpu()).item()

    def score(self, examples: list, preds: list[list[float]]) -> tuple[dict[str, float], list[str]]:
        predicted = [argmax(p) for p in preds]
        matrix = self.confusion(predicted, examples)
        return evaluation.confusion_metrics(matrix), [self.labels[c] for c in predicted]

    def confusion(self, predicted: list[int], examples: list) -> np.ndarray:
        """matrix[true][predicted] counts (the matrices of windows of examples add up)."""
        return np.array(evaluation.confusion(predicted, self.source.label_ids(examples), len(self.labels)))

    def _baseline(self, examples: list) -> tuple[float, str]:
        counts = np.bincount(self.source.label_ids(examples), minlength=len(self.labels))
        return majority(counts), MAJORITY

    def tally(self) -> ConfusionTally:
        return ConfusionTally(self)

    def classify(self, model: nn.Module, texts: list[str], pairs: list[str | None] | None = None,
                 batch_size: int = 64) -> list[dict]:
        """{"label", "probabilities": {label: p}} per text (pairs[i]: text i's text_pair)."""
        examples = self.source.inputs(texts, self.inputs, pairs)
        logits = self.predict(model, examples, batch_size=batch_size)
        return [{"label": self.labels[argmax(p)], "probabilities": dict(zip(self.labels, p, strict=True))}
                for p in probabilities(logits)]

    def save_outputs(self, model: nn.Module, run_dir: Path, shown: list[str]) -> None:
        """The test confusion matrix (of the examples the test scored: `shown`, one each)."""
        ids = {name: i for i, name in enumerate(self.labels)}
        examples = self.examples("test")[: len(shown)]
        plot_confusion(self.confusion([ids[s] for s in shown], examples), self.labels,
                       run_dir / "confusion.png")


class ConfusionTally(Tally):
    """The confusion matrix of the predictions, summed window by window: the metrics, and the
    majority class's accuracy from its rows (the true labels' counts), of them all."""

    def __init__(self, objective: Classification) -> None:
        self.objective = objective
        self.matrix: Any = 0  # (labels, labels) np.ndarray after the first window

    def add(self, examples: list, preds: list) -> None:
        self.matrix = self.matrix + self.objective.confusion([argmax(p) for p in preds], examples)

    def metrics(self) -> dict[str, float]:
        return evaluation.confusion_metrics(self.matrix)

    def baseline(self) -> dict[str, Any]:
        return {"baseline": majority(self.matrix.sum(axis=1)), "baseline_by": MAJORITY}


def majority(label_counts: np.ndarray) -> float:
    """The accuracy of always predicting the most frequent label (label_counts[c]: examples of c)."""
    return int(label_counts.max(initial=0)) / max(int(label_counts.sum()), 1)


def argmax(values: list[float]) -> int:
    return max(range(len(values)), key=values.__getitem__)


def probabilities(logits: list[list[float]]) -> list[list[float]]:
    """Softmax of each row of logits, in float32 as the model computes them."""
    if not logits:
        return []
    return torch.tensor(logits, dtype=torch.float32).softmax(-1).tolist()


class ClassificationRun(Run):
    kind = FIELDS.objective
    verb = "predict"
    pipeline_tag = "text-classification"
    protocols = ("tei.predict", "tei.tokenize")
    scores_function = "softmax"  # what turns the logits into the probabilities predict gives

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

    @classmethod
    def pretrained_advice(cls, run: Path, kind=None) -> str:
        return (f"write its encoder as one with `tformer export {run} --hf DIR` (pip install "
                "'tformer[hf]'), then give --from-pretrained DIR")

    def predict(self, texts: str | Iterable[str], pairs: Iterable[str | None] | None = None,
                batch_size: int = 64) -> list[dict[str, Any]]:
        """{"label", "probabilities": {label: p}} per text (one str is one text; pairs: each
        text's text_pair, for a run trained on pairs; with one text, one str)."""
        texts = texts_of(texts)
        pairs = None if pairs is None else pairs_list(pairs, len(texts))
        return self.objective.classify(self.model, texts, pairs, batch_size=check_batch_size(batch_size))

    def printed(self, text: str, answer: dict[str, Any]) -> tuple[str, dict[str, Any]]:
        """`tformer predict`'s line for one text (``answer_text``) and its JSONL record
        (``answer_record``); probabilities that are not finite (a broken checkpoint) are refused."""
        probs = answer["probabilities"]
        if not all(math.isfinite(p) for p in probs.values()):
            raise ValueError(f"RUN_DIR {self.path}: expected finite probabilities, got "
                             f"{list(probs.values())} for {text[:60]!r} (the weights are not finite: was its "
                             "training diverging?)")
        return self.answer_text(answer), self.answer_record(text, answer)

    def answers(self, texts: list[str], batch_size: int = 64, **_: Any) -> list[str]:
        """What `tformer generate` prints per input: the label."""
        return [self.answer_text(p) for p in self.predict(texts, batch_size=batch_size)]

    def answer_text(self, answer: dict[str, Any]) -> str:
        """What `tformer predict` prints for one of predict's answers: the label."""
        return answer["label"]

    def answer_record(self, text: str, answer: dict[str, Any]) -> dict[str, Any]:
        """`tformer predict --format jsonl`'s line for one answer: the text, the label and each
        label's probability (rounded to 6 places)."""
        return {"text": text, "label": answer["label"], "probabilities": _rounded(answer["probabilities"])}

    # Serving: TEI's /predict -------------------------------------------------------------------
    def admit(self, records: list[dict[str, str]], truncate: bool, limit: int | None = None) -> list[Item]:
        paired = [i for i, r in enumerate(records) if "text_pair" in r]
        if paired and not self.pairs:
            raise InputRefused(f"input[{paired[0]}].text_pair: this run was trained on single texts "
                               "(no text_pair in its data); send the text alone")
        # Counted as the run encodes them (a pair: "<s> a </s> b </s>", cut longest first; a long
        # text: all its windows' tokens, where the run reads windows), and handed on as far as
        # that needs them: the same tokens (Tokenizer.read).
        texts, pairs, encoded = self.tokenizer.read([r["text"] for r in records],
                                                    [r.get("text_pair") or None for r in records])
        records = [dict(r, text=t, **({"text_pair": p} if p is not None else {}))
                   for r, t, p in zip(records, texts, pairs, strict=True)]
        # The run cuts at its own limit (as `tformer predict` does); below that, a lower
        # --max-input-tokens can only refuse: a different cut would differ from the CLI.
        run_limit, full = self.max_input_tokens, [e.full for e in encoded]
        limit = limit or run_limit
        too_long(full, limit, truncate and limit == run_limit,
                 cut=[e.truncated for e in encoded] if limit == run_limit else None)
        return [Item(e.tokens, e.full, r, e.truncated) for e, r in zip(encoded, records, strict=True)]

    @torch.inference_mode()
    def run_batch(self, records: list[dict[str, str]], raw: bool = False) -> list[list[float]]:
        """Class probabilities, as `tformer predict` computes them; with ``raw`` (the batch's
        key: TEI's raw_scores), the logits they come from."""
        out: list[tuple[int, list[float]]] = []
        # Records with and without a pair cannot share a batch (the source encodes one form).
        for paired in (False, True):
            index = [i for i, r in enumerate(records) if bool(r.get("text_pair")) == paired]
            if index:
                logits = self.objective.predict(self.model, [records[i] for i in index])
                out += list(zip(index, logits if raw else probabilities(logits), strict=True))
        return [p for _, p in sorted(out, key=lambda x: x[0])]

    def warm_up(self) -> None:
        self.run_batch([item.payload for item in self.admit([{"text": "warm up"}], True)])

    def describe(self) -> dict[str, Any]:
        return {"labels": self.labels}

    def tei_model_type(self) -> dict[str, Any]:
        return {"classifier": {"id2label": {str(i): name for i, name in enumerate(self.labels)}}}

    # Exports -----------------------------------------------------------------------------------
    def export_hf(self, out: Path, card: Card) -> Path:
        """With BERT's pooler (--pooling cls): BertForSequenceClassification; without (the
        default from scratch, mean pooling): XLMForSequenceClassification (tformer.export.hf_xlm)."""
        if self.tokenizer is None:
            raise ValueError(f"--hf: {self.path} is a synthetic-task run ({self.config.task}) with no text "
                             "tokenizer for transformers; export it with --onnx")
        tok = self.tokenizer
        if self.model.config.pooler:
            with hf_refusals(self.path):
                written, diff = hf_classifier.export_classifier(out, self.model, tok.backend,
                                                                tuple(self.labels), tok.max_length, card)
            print(f"wrote {written}/ (BertForSequenceClassification, max abs diff {diff:.1e} on the logits "
                  "against tformer; AutoModelForSequenceClassification.from_pretrained loads it)",
                  file=sys.stderr)
            return written
        with hf_refusals(self.path):
            written, diff = hf_xlm.export_classifier(out, self.model, tok, tuple(self.labels), card,
                                                     pairs=self.objective.source.data.pairs)
        mean = self.model.config.pooling == "mean"
        one = ("; exact one text per call (pipeline's default): a padded batch would average over its "
               "padding, so it fails (the padding token's id is past the vocabulary)" if mean else "")
        print(f"wrote {written}/ ({hf_xlm_format.ARCHITECTURE}, max abs diff {diff:.1e} on the logits "
              f"against tformer; AutoModelForSequenceClassification.from_pretrained loads it{one})",
              file=sys.stderr)
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
                                    tonnx.CLASSIFIER_USAGE, library_name="onnx",
                                    pipeline_tag=self.pipeline_tag, tags=("onnx",))
        written = publish_export(out, files, "--onnx")
        tonnx.report(f"{written}/", diff)
        return written


def _rounded(probabilities: dict[str, float]) -> dict[str, float]:
    return {name: round(p, 6) for name, p in probabilities.items()}


KIND = Kind(Classification, ClassificationRun)
