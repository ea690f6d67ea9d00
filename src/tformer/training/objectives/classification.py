"""Classification: an encoder, pooled, and a linear head over the labels (a synthetic task's
classes, or the labels of your file's records, with an optional second text: text_pair).

Scored by accuracy (and macro-F1 on your files) against the majority-class baseline.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from torch import nn

from tformer.config import TransformerConfig
from tformer.formats import hf_bert, hf_xlm
from tformer.nn.model import EncoderClassifier, from_pretrained
from tformer.text.batches import EncoderBatch, encoder_batch
from tformer.training import evaluation
from tformer.training.examples import LabeledExample
from tformer.training.losses import classification_loss
from tformer.training.objectives.base import Objective, Tally
from tformer.training.report import plot_confusion

MAJORITY = "the majority class"  # the trivial baseline


class Classification(Objective):
    kind = "classification"
    model_kind = "classifier"
    main_metric = "accuracy"
    inputs = ("text", "text_pair")

    def what(self) -> str:
        pooling = self.config.model.pooling
        if self.source.tokenizer is None or self.config.from_pretrained:
            return f"classification into {len(self.labels)} labels"
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
                hf_xlm.check_expressible(self.model_config())
                exports = f"exports to ONNX and to transformers ({hf_xlm.ARCHITECTURE}: one text per call)"
            except hf_xlm.Inexpressible as e:
                exports = f"exports to ONNX; `export --hf` ({hf_xlm.ARCHITECTURE}) needs {e.field} {e.need}"
        return f"classification into {len(self.labels)} labels, {pooling} pooling ({exports})"

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
        if model_config is None and self.config.from_pretrained:
            encoder = from_pretrained(self.config.from_pretrained)
            config = self.finetune_config(encoder.config).replace(n_classes=len(self.labels))
            model = EncoderClassifier(config)
            model.encoder.load_state_dict(encoder.state_dict())
            # The new head starts small (BERT: normal, std 0.02), as transformers initialises it.
            nn.init.normal_(model.head.weight, std=0.02)
            nn.init.zeros_(model.head.bias)
            return model.train()
        return EncoderClassifier(model_config or self.model_config())

    def encode(self, examples: list) -> list[LabeledExample]:
        s = self.source
        texts = s.encode_texts([s.field(ex, "text") for ex in examples],
                               [s.field(ex, "text_pair") for ex in examples])
        return [LabeledExample(text, label) for text, label in zip(texts, s.label_ids(examples), strict=True)]

    def collate(self, encoded: list[LabeledExample]) -> EncoderBatch:
        return encoder_batch([e.text for e in encoded], self.source.pad_id, [e.label for e in encoded])

    def loss(self, model: nn.Module, batch: EncoderBatch, label_smoothing: float = 0.0):
        return classification_loss(model, batch, label_smoothing)

    def predict_batch(self, model: nn.Module, batch: EncoderBatch) -> list[list[float]]:
        """Class probabilities per example."""
        return model(batch.input_ids, batch.attention_mask, batch.token_type_ids).logits.softmax(-1).tolist()

    def score(self, examples: list, preds: list[list[float]]) -> tuple[dict[str, float], list[str]]:
        predicted = [argmax(p) for p in preds]
        return self.source.score_classes(predicted, examples), [self.labels[c] for c in predicted]

    def _baseline(self, examples: list) -> tuple[float, str]:
        return self.source.majority(examples), MAJORITY

    def tally(self) -> ConfusionTally:
        return ConfusionTally(self)

    def classify(self, model: nn.Module, texts: list[str], pairs: list[str | None] | None = None,
                 batch_size: int = 64) -> list[dict]:
        """{"label", "probabilities": {label: p}} per text (pairs[i]: text i's text_pair)."""
        examples = self.source.inputs(texts, self.inputs, pairs)
        return [{"label": self.labels[argmax(p)], "probabilities": dict(zip(self.labels, p, strict=True))}
                for p in self.predict(model, examples, batch_size=batch_size)]

    def save_outputs(self, model: nn.Module, run_dir: Path, shown: list[str]) -> None:
        """The test confusion matrix (of the examples the test scored: `shown`, one each)."""
        ids = {name: i for i, name in enumerate(self.labels)}
        examples = self.examples("test")[: len(shown)]
        actual = self.source.label_ids(examples)
        matrix = evaluation.confusion([ids[s] for s in shown], actual, len(self.labels))
        plot_confusion(matrix, self.labels, run_dir / "confusion.png")


class ConfusionTally(Tally):
    """The confusion matrix of the predictions, summed window by window: the metrics, and the
    majority class's accuracy from its rows (the true labels' counts), of them all."""

    def __init__(self, objective: Classification) -> None:
        self.source = objective.source
        self.matrix: Any = 0  # (labels, labels) np.ndarray after the first window

    def add(self, examples: list, preds: list) -> None:
        self.matrix = self.matrix + self.source.class_counts([argmax(p) for p in preds], examples)

    def metrics(self) -> dict[str, float]:
        return self.source.class_scores(self.matrix)

    def baseline(self) -> dict[str, Any]:
        return {"baseline": self.source.majority_of(self.matrix.sum(axis=1)), "baseline_by": MAJORITY}


def argmax(values: list[float]) -> int:
    return max(range(len(values)), key=values.__getitem__)
