"""Multi-label classification: an encoder, pooled, and one independent yes/no per label (a
sigmoid each), for records that hold any number of labels.

    {"text": "...", "labels": ["news", "sport"]}  (+ "text_pair")    tformer predict RUN "a text"
    {"text": "...", "label": ["news", "sport"]}        a list in "label" means the same
    text,labels / "...","news;sport"                  CSV/TSV: --label-separator ';' (a `label`
                                                      column too: the separator says it is several)

Trained with binary cross-entropy over the labels (BCE with logits, as transformers'
multi_label_classification; each label's positives weighted up where labels are rare:
tformer.kinds.labels.positive_weights; a new model's label biases start at their training
priors: ``prior_logits``). A label is chosen where its probability reaches its threshold, chosen on
the validation split for the weights validated (``choose_thresholds``: each label's F1-best cut
where the validation holds MIN_POSITIVES of it, else the one cut best for micro-F1 over all), and
kept with the weights (``MultiLabelClassifier.thresholds``). Scored by micro-, macro- and
samples-F1 against predicting the k most frequent labels (the best k). ``Run.predict`` gives
{"labels": chosen, "probabilities": {label: p}}; `tformer predict` prints the chosen labels.
Exports: transformers (problem_type multi_label_classification: pipeline's sigmoid is tformer's
probabilities) and ONNX (logits and probabilities; config.json holds the thresholds); serves
TEI's /predict with every label's probability (raw_scores: the logits).
"""

from __future__ import annotations

import dataclasses
import functools
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F
from torch import Tensor, nn

from tformer.export import multi_label as export
from tformer.export.model_card import Card
from tformer.kinds.base import Kind
from tformer.kinds.classification import PRESET as CLASSIFICATION_PRESET
from tformer.kinds.classification import Classification, ClassificationRun
from tformer.kinds.hf_refusals import hf_refusals
from tformer.kinds.labels import positive_weights
from tformer.kinds.run import check_batch_size, texts_of
from tformer.nn.heads import MultiLabelClassifier
from tformer.text.arguments import pairs_list
from tformer.text.batches import EncoderBatch, encoder_batch
from tformer.training import probe
from tformer.training.examples import TextExample
from tformer.training.label_sets import Counts, choose_thresholds, micro_f1_interval
from tformer.training.losses import at_least_fp32
from tformer.training.objective import Tally
from tformer.training.records import Fields, check_encodable, label_name


@dataclass(frozen=True)
class LabelsFields(Fields):
    """A record's labels: a JSON list (in "labels", or in "label"), or a CSV/TSV cell of them
    joined by ``separator`` (--label-separator). Labels are class names by ``label_name``'s rule,
    kept once each in the record's order; an empty list (or cell) is a record with no label."""

    separator: str | None = None

    def claims(self, record: Mapping[str, Any], options: Mapping[str, Any]) -> bool:
        """A text and its labels: a "labels" field, a "label" holding a list, or a "label" column
        named joined by --label-separator."""
        if "text" not in record:
            return False
        label = record.get("label")
        return "labels" in record or isinstance(label, list) or (
            "label" in record and options.get("label_separator") is not None)

    def configured(self, config) -> LabelsFields:
        return dataclasses.replace(self, separator=config.label_separator)

    def check(self, where: str, record: dict[str, Any]) -> dict[str, Any]:
        out = TEXTS.check(where, record)  # text (+ text_pair)
        name = "labels" if "labels" in record else "label"
        value = record.get(name)
        if value is None:
            has = ", ".join(sorted(record))
            got = "null" if name in record else f"no labels field (the record has {has})"
            raise ValueError(f"{where}: {name}: expected a list of labels, got {got}")
        if isinstance(value, str):
            if self.separator is None:
                raise ValueError(f"{where}: {name}: expected a list of labels, got the text {value[:60]!r}; "
                                 "for labels joined in one cell name the separator, e.g. "
                                 "--label-separator ';'")
            parts = [p.strip() for p in value.split(self.separator)]
            items = [p for p in parts if p]
        elif isinstance(value, list):
            items = [label_name(v, f"{where}: {name}[{i}]") for i, v in enumerate(value)]
        else:
            raise ValueError(f"{where}: {name}: expected a list of labels, got {type(value).__name__} "
                             f"{value!r}")
        labels: dict[str, None] = {}
        for i, item in enumerate(items):
            if not isinstance(item, str):
                raise ValueError(f"{where}: {name}[{i}]: expected a label name, got {type(item).__name__}")
            if not item.strip():
                raise ValueError(f"{where}: {name}[{i}]: expected a label name, got an empty string")
            check_encodable(where, f"{name}[{i}]", item)
            labels[item] = None  # once each, in order
        out["labels"] = list(labels)
        return out

    def labels_of(self, record: dict[str, Any]) -> tuple[str, ...]:
        return tuple(record.get("labels", ()))


TEXTS = Fields("multilabel", ("text",), ("text_pair",))  # a record's texts, checked as classification's
FIELDS = LabelsFields("multilabel", ("text", "labels"), ("text_pair",), ("text", "text_pair"), label="labels",
                      min_labels=2)
# Classification's preset, without label smoothing (a smoothed target pulls each of many rare
# labels' negatives up, and BCE has no softmax to share it).
PRESET = {**CLASSIFICATION_PRESET, "label_smoothing": 0.0}
TOP_K = "the k most frequent labels"  # the trivial baseline
PRIOR_BIAS = True  # a new model's label biases start at their training frequencies (prior_logits)


@dataclass
class LabelSetExample(TextExample):
    labels: tuple[int, ...]  # the label ids it holds (none when predicting)


class MultiLabel(Classification):
    kind, fields, preset = FIELDS.objective, FIELDS, PRESET
    reads = ("pooling", "long", "class_weights", "label_separator", "head_init")
    main_metric = "micro_f1"
    job = "multi-label classification"
    loss_from_predictions = False  # (its loss pass is its own: Classification's reads one label)
    model_class = MultiLabelClassifier

    def __init__(self, source, pretrained=None) -> None:
        super().__init__(source, pretrained)
        self.thresholds = np.full(len(self.labels), 0.5, dtype=np.float32)  # (C,) the model's, read to score

    # Training -------------------------------------------------------------------------------
    def build_model(self, model_config=None) -> nn.Module:
        """Classification's model with thresholds; a new one (not one whose weights are read
        next) starts each label's bias at the logit of its training frequency (``prior_logits``)."""
        model = super().build_model(model_config)
        prior = self.prior_logits() if model_config is None and PRIOR_BIAS else None
        if prior is not None:
            with torch.no_grad():
                model.head.bias.copy_(prior)
        return model

    def fit_head(self, model: nn.Module, features: Tensor, targets: Tensor) -> str | None:
        """A logistic regression per label, its positives weighted as the loss weighs them."""
        return probe.fit_sigmoid(model.head, features, targets, self.weighting[0])

    def prior_logits(self) -> Tensor | None:
        """(C,) each label's starting logit: log(w p / (1 - p)) for a label in a share p of the
        training records and positive weight w (the constant that minimises its weighted BCE),
        so that the first updates learn from the text, not each label's rate (Lin et al. 2017,
        §3.3: a rare class's prior at initialisation); None without counts."""
        records = self.source.data.identity.get("data", {}).get("records")
        if not records or not any(self.label_counts):
            return None
        p = (torch.tensor([float(c) for c in self.label_counts]) / records).clamp(1e-4, 1 - 1e-4)  # (C,)
        weight = self.weighting[0] if self.weighting[0] is not None else torch.ones_like(p)
        return torch.log(weight * p / (1 - p))

    def encode(self, examples: list) -> list[LabelSetExample]:
        s = self.source
        texts = s.encode_texts([s.field(ex, "text") for ex in examples],
                               [s.field(ex, "text_pair") for ex in examples])
        ids = s.data.label_ids
        return [LabelSetExample(text, tuple(ids[name] for name in ex.get("labels", ())))
                for text, ex in zip(texts, examples, strict=True)]

    def collate(self, encoded: list[LabelSetExample]) -> EncoderBatch:
        """A batch whose labels are (B, C) multi-hot floats."""
        batch = encoder_batch([e.text for e in encoded], self.source.pad_id)
        targets = torch.zeros(len(encoded), len(self.labels))  # (B, C)
        for row, e in enumerate(encoded):
            targets[row, list(e.labels)] = 1.0
        return dataclasses.replace(batch, labels=targets)

    def loss(self, model: nn.Module, batch: EncoderBatch, label_smoothing: float = 0.0):
        """Binary cross-entropy of each label (the mean over the batch's B x C decisions, as
        transformers' BCEWithLogitsLoss), and the share of examples whose chosen labels are
        exactly right, for logging."""
        logits = at_least_fp32(self.forward(model, batch))  # (B, C)
        targets = (batch.labels * (1 - label_smoothing) + label_smoothing / 2).to(logits.dtype)  # (B, C)
        weight = None if self.weighting[0] is None else self.weighting[0].to(logits.device, logits.dtype)
        loss = F.binary_cross_entropy_with_logits(logits, targets, pos_weight=weight)
        with torch.no_grad():
            exact = (model.chosen(logits) == (batch.labels > 0.5)).all(-1).float().mean().item()
        return loss, exact

    @functools.cached_property
    def weighting(self) -> tuple[Tensor | None, str]:
        """BCE's pos_weight per label (C,) or None, and what the run's first line says of it
        (tformer.kinds.labels.positive_weights: --class-weights, how rare the rarest label is)."""
        records = self.source.data.identity.get("data", {}).get("records")
        return positive_weights(self.config.class_weights, self.label_counts, records)

    def notes(self) -> list[str]:
        return [note for note in (self.weighting[1],) if note]

    # Scoring -------------------------------------------------------------------------------
    def before_scoring(self, model: nn.Module, split: str, scored: list, preds: list) -> None:
        """A validation of a model being trained (in training mode: the loop's, never a finished
        run's) first chooses the thresholds on its predictions (``choose_thresholds``) and sets
        them in the model, so that the weights it keeps as the best keep the thresholds chosen
        for them; every evaluation then scores at the model's thresholds."""
        if split == "validation" and model.training and scored:
            chosen = choose_thresholds(sigmoid(np.array(preds)), self.truth(scored))
            model.thresholds.copy_(torch.from_numpy(chosen))
        self.thresholds = thresholds_of(model)

    def evaluate_stream(self, model: nn.Module, examples: Iterable, samples: int = 0, **options: Any):
        self.thresholds = thresholds_of(model)
        return super().evaluate_stream(model, examples, samples, **options)

    def truth(self, examples: list) -> np.ndarray:
        """(N, C) bool: the labels each example holds."""
        out = np.zeros((len(examples), len(self.labels)), dtype=bool)
        ids = self.source.data.label_ids
        for row, ex in enumerate(examples):
            out[row, [ids[name] for name in ex.get("labels", ())]] = True
        return out

    def chosen(self, preds: list[list[float]]) -> np.ndarray:
        """(N, C) bool: each example's labels at the thresholds (sigmoid(logit) >= threshold)."""
        probs = sigmoid(np.array(preds, dtype=np.float32).reshape(-1, len(self.labels)))
        return probs >= self.thresholds

    def score(self, examples: list, preds: list[list[float]]) -> tuple[dict[str, float], list[str]]:
        chosen = self.chosen(preds)
        shown = [", ".join(self.labels[c] for c in np.flatnonzero(row)) for row in chosen]
        return Counts.of(chosen, self.truth(examples)).metrics(), shown

    def _baseline(self, examples: list) -> tuple[float, str]:
        value, k = Counts.of(np.zeros((len(examples), len(self.labels)), dtype=bool),
                             self.truth(examples)).top_k()
        return value, f"{TOP_K} (k={k})"

    def paired_interval(self, examples: list, preds: list) -> tuple[float, float]:
        return micro_f1_interval(self.chosen(preds), self.truth(examples))

    def tally(self) -> LabelTally:
        return LabelTally(self)

    def sample_rows(self, examples: list, shown: list) -> list[tuple[str, str, str]]:
        truth = self.truth(examples)  # the labels in the run's order, as the predictions show them
        return [(ex["text"], s, ", ".join(self.labels[c] for c in np.flatnonzero(row)))
                for ex, s, row in zip(examples, shown, truth, strict=True)]

    def save_outputs(self, model: nn.Module, run_dir: Path, shown: list[str]) -> None:
        """No confusion matrix: a record's labels are not one class."""

    # Predicting -------------------------------------------------------------------------------
    def label_sets(self, model: nn.Module, texts: list[str], pairs: list[str | None] | None = None,
                   batch_size: int = 64) -> list[dict[str, Any]]:
        """{"labels": chosen, "probabilities": {label: p}} per text (pairs[i]: text i's text_pair)."""
        examples = self.source.inputs(texts, self.inputs, pairs)
        logits = self.predict(model, examples, batch_size=batch_size)
        self.thresholds = thresholds_of(model)
        probs = sigmoid(np.array(logits, dtype=np.float32).reshape(-1, len(self.labels)))
        return [{"labels": [self.labels[c] for c in np.flatnonzero(row >= self.thresholds)],
                 "probabilities": dict(zip(self.labels, map(float, row), strict=True))} for row in probs]


def thresholds_of(model: nn.Module) -> np.ndarray:
    """The model's thresholds (C,) float32, as its ``chosen`` compares them."""
    return model.thresholds.detach().float().cpu().numpy()


def sigmoid(logits: np.ndarray) -> np.ndarray:
    """The probabilities of logits, in float32 as the model's sigmoid (torch) computes them."""
    return torch.sigmoid(torch.as_tensor(logits, dtype=torch.float32)).numpy()


class LabelTally(Tally):
    """The counts of the predictions, summed window by window (``Counts``), and each example's
    labels chosen and held, a bit a label (the verdict's bootstrap draws from the examples)."""

    def __init__(self, objective: MultiLabel) -> None:
        self.objective = objective
        self.total: Counts | None = None
        # For the verdict's paired bootstrap: each window's predictions and truth, a bit a label.
        self.chosen: list[np.ndarray] = []
        self.truth: list[np.ndarray] = []

    def add(self, examples: list, preds: list) -> None:
        chosen, truth = self.objective.chosen(preds), self.objective.truth(examples)
        counts = Counts.of(chosen, truth)
        self.total = counts if self.total is None else self.total + counts
        self.chosen.append(np.packbits(chosen, axis=1))
        self.truth.append(np.packbits(truth, axis=1))

    def metrics(self) -> dict[str, float]:
        return self.total.metrics()

    def baseline(self) -> dict[str, Any]:
        value, k = self.total.top_k()
        n_labels = len(self.objective.labels)
        chosen, truth = (np.unpackbits(np.concatenate(x), axis=1, count=n_labels).astype(bool)
                         for x in (self.chosen, self.truth))
        return {"baseline": value, "baseline_by": f"{TOP_K} (k={k})",
                "paired_interval": list(micro_f1_interval(chosen, truth))}


class MultiLabelRun(ClassificationRun):
    kind = FIELDS.objective
    scores_function = "sigmoid"

    def predict(self, texts: str | Iterable[str], pairs: Iterable[str | None] | None = None,
                batch_size: int = 64) -> list[dict[str, Any]]:
        """{"labels": the chosen labels, "probabilities": {label: p}} per text: every label's
        probability (independent sigmoids), and those at or above their thresholds chosen (one
        str is one text; pairs: each text's text_pair, for a run trained on pairs)."""
        texts = texts_of(texts)
        pairs = None if pairs is None else pairs_list(pairs, len(texts))
        return self.objective.label_sets(self.model, texts, pairs, batch_size=check_batch_size(batch_size))

    @property
    def thresholds(self) -> dict[str, float]:
        """Each label's threshold: its probability from which it is chosen."""
        return dict(zip(self.labels, map(float, self.model.thresholds.tolist()), strict=True))

    def answer_text(self, answer: dict[str, Any]) -> str:
        """The chosen labels, joined by the run's --label-separator (else ", "); none: an empty line."""
        return (self.config.label_separator or ", ").join(answer["labels"])

    def answer_record(self, text: str, answer: dict[str, Any]) -> dict[str, Any]:
        return {"text": text, "labels": answer["labels"],
                "probabilities": {name: round(p, 6) for name, p in answer["probabilities"].items()}}

    @torch.inference_mode()
    def run_batch(self, records: list[dict[str, str]], raw: bool = False) -> list[list[float]]:
        """Every label's probability (its sigmoid), as `tformer predict` computes it; with ``raw``
        (TEI's raw_scores), the logits."""
        logits = super().run_batch(records, raw=True)
        return logits if raw else sigmoid(np.array(logits, dtype=np.float32)).tolist()

    def describe(self) -> dict[str, Any]:
        return {"labels": self.labels, "thresholds": self.thresholds}

    def card(self, command: str) -> Card:
        return dataclasses.replace(super().card(command), kind="multi-label classification")

    # Exports -----------------------------------------------------------------------------------
    def export_hf(self, out: Path, card: Card) -> Path:
        """An AutoModelForSequenceClassification directory with problem_type
        multi_label_classification (tformer.export.multi_label)."""
        with hf_refusals(self.path):
            return export.export_hf(out, self.model, self.tokenizer, self.labels, card,
                                    self.objective.source.data.pairs)

    def export_onnx(self, out: Path, card: Card, opset: int) -> Path:
        """Folder ``out``: model.onnx (logits, probabilities), config.json (id2label, thresholds),
        the tokenizer, a card."""
        return export.export_onnx(out, self.model, self.tokenizer, self.labels, card, opset,
                                  self.pipeline_tag)


KIND = Kind(MultiLabel, MultiLabelRun)
