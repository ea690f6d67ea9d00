"""Scores: a number per text, or per pair of texts (a cross-encoder of semantic similarity, as
sentence-transformers trains on STS), learned by regression.

    {"text": "...", "score": 0.73}  (+ "text_pair")      tformer predict RUN "a text<TAB>its pair"

The model is tformer.kinds.cross_encoder's: the pair read as one input, BERT's pooler, one
output. Scores in [0, 1] are learned by the binary cross-entropy of that output's sigmoid, and
other scores by its squared error (--score-loss; the comment on it below says why);
scored by Spearman's and Pearson's correlation and the MSE, against the train mean (a
constant: it orders nothing) and, for pairs, the cosine of the two texts' token sets.
Predictions are {"score": x}; exports are a sentence-transformers CrossEncoder directory (its
activation Sigmoid or Identity, so that CrossEncoder.predict gives these scores) and ONNX;
served with TEI's /predict.
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F
from torch import Tensor, nn

from tformer.errors import FieldError
from tformer.kinds.base import Kind
from tformer.kinds.cross_encoder import CrossEncoderRun, CrossEncoding, activate, logits_of
from tformer.kinds.run import check_batch_size, texts_of
from tformer.text.arguments import pairs_list
from tformer.training.losses import at_least_fp32
from tformer.training.objective import Objective
from tformer.training.ranking import overlap_cosine, ranks, score_metrics
from tformer.training.records import Fields, Record
from tformer.training.verdict import spearman_interval

NAME = "regression"
TEXTS = Fields(NAME, ("text",), ("text_pair",), ("text", "text_pair"))
# How the output learns its score (--score-loss, TrainConfig.score_loss): "bce", for scores in
# [0, 1], the binary cross-entropy of its sigmoid (CrossEncoder's BinaryCrossEntropyLoss, its
# default for one label); "mse", the squared error of the output itself (sentence-transformers'
# MSELoss), for any scores; "auto", bce where every training score lies in [0, 1], else mse.
# Measured on pair scores in [0, 1] (benchmarks/crossencoder_losses.py: 20,000 Debtags-Jaccard
# pairs, 3 minutes, the two losses side by side, 1 thread each; test Spearman on 2,000): from
# scratch bce 0.606 against mse 0.548; fine-tuning all-MiniLM-L6-v2 0.632 against 0.629.


class ScoreFields(Fields):
    """text (+ text_pair) as text, score as a finite number (a JSON number, or text such as a
    CSV's "0.73"); the training records' scores are tallied (count, sum, range) into data.json."""

    def check(self, where: str, record: dict[str, Any]) -> Record:
        out: dict[str, Any] = TEXTS.check(where, record)
        out["score"] = score_of(record, where)
        return out

    def tally(self, counts: dict[str, Any], record: Record) -> None:
        s = float(record["score"])
        counts["n"] = counts.get("n", 0) + 1
        counts["sum"] = counts.get("sum", 0.0) + s
        counts["min"] = min(counts.get("min", s), s)
        counts["max"] = max(counts.get("max", s), s)


def score_of(record: dict[str, Any], where: str) -> float:
    """A record's score as a finite float, refused in one line naming ``where`` and what it holds."""
    if "score" not in record:
        has = ", ".join(sorted(record)) or "none"
        raise ValueError(f"{where}: missing field 'score' (the record has {has})")
    value = record["score"]
    if isinstance(value, str):
        try:
            number = float(value.strip())
        except ValueError:
            number = None
    else:
        number = float(value) if isinstance(value, (int, float)) and not isinstance(value, bool) else None
    if number is None or not math.isfinite(number):
        raise ValueError(f"{where}: score: expected a finite number (such as 0.73 or \"4.5\"), got {value!r}")
    return number


FIELDS = ScoreFields(NAME, ("text", "score"), ("text_pair",), ("text", "text_pair"))
# Classification's sizes and batches (tformer.kinds.classification), read as pairs: 128 tokens.
# Its rate from scratch is half classification's: at 5e-4, pair scores (Debtags Jaccard, 20,000
# pairs) from scratch at 10 minutes fell to the train mean after 640 updates (validation Spearman
# 0.473, then ~0; tested 0.385); 2,500 updates of a d_model 384 model, 1 thread, validation
# Spearman at 500 / 1,000 / 2,000 updates: 5e-4 0.452 / 0.380 / 0.527, 2.5e-4 0.564 / 0.631 / 0.634;
# test Spearman after 2,500: 0.491 against 0.624.
PRESET = {"d_model": 128, "n_heads": 4, "d_ff": 512, "n_layers": 2, "activation": "gelu", "vocab_size": 4000,
          "lr": 2.5e-4, "warmup": 200, "schedule": "linear", "steps": 10000, "max_tokens": None,
          "batch_size": 32, "eval_every": 250, "patience": 8, "max_length": 128}
MEAN = "the train mean"
OVERLAP = "the cosine of the two texts' token sets"


class Regression(CrossEncoding):
    kind, fields, preset = NAME, FIELDS, PRESET
    reads = ("score_loss",)
    main_metric = "spearman"
    inputs = ("text", "text_pair")

    def what(self) -> str:
        read = "text pairs" if self.source.data.pairs else "texts"
        loss = "binary cross-entropy of its sigmoid" if self.activation == "sigmoid" else "squared error"
        return f"scores of {read} (a cross-encoder: BERT's pooler and one output, {loss})"

    @property
    def activation(self) -> str:
        """sigmoid where the loss is bce (--score-loss: given, or auto where every training score
        lies in [0, 1]), else identity (mse). A run saved before --score-loss reads as mse."""
        t = self.source.data.tally
        unit = 0 <= t.get("min", -1) and t.get("max", 2) <= 1
        chosen = self.config.score_loss
        if chosen == "bce" and not unit:
            raise FieldError("score_loss", f"bce learns scores in [0, 1]; the training scores run "
                                           f"from {t.get('min')} to {t.get('max')}: expected mse or auto")
        return "sigmoid" if chosen == "bce" or (chosen == "auto" and unit) else "identity"

    @property
    def train_mean(self) -> float:
        t = self.source.data.tally
        return t["sum"] / t["n"] if t.get("n") else 0.0

    def build_model(self, model_config=None) -> nn.Module:
        """The cross-encoder, its output starting at the train mean (the baseline's prediction:
        the first updates then learn what differs from it)."""
        model = super().build_model(model_config)
        mean = self.train_mean  # (a saved run's weights replace it when read back)
        if self.activation == "sigmoid":
            mean = math.log(max(mean, 1e-6) / max(1 - mean, 1e-6))
        with torch.no_grad():
            model.head.bias.fill_(mean)
        return model

    def candidates(self, record: dict[str, Any]) -> tuple[str, list[str | None], list[float] | None]:
        return record["text"], [record.get("text_pair")], [record["score"]] if "score" in record else None

    def loss(self, model: nn.Module, batch, label_smoothing: float = 0.0) -> tuple[Tensor, float]:
        """The squared error (or the sigmoid's cross-entropy) of the output against the score, and
        for logging the share of the batch's pairs of examples that it orders as their scores do."""
        logits = at_least_fp32(logits_of(model, batch))  # (B,)
        if self.activation == "sigmoid":
            loss = F.binary_cross_entropy_with_logits(logits, batch.targets)
        else:
            loss = F.mse_loss(logits, batch.targets)
        return loss, concordance(logits.detach(), batch.targets)

    def score(self, examples: list, preds: list[list[float]]) -> tuple[dict[str, float], list[str]]:
        predicted = [activate(p, self.activation)[0] for p in preds]
        return score_metrics(predicted, [r["score"] for r in examples]), [f"{s:.4f}" for s in predicted]

    def sample_rows(self, examples: list, shown: list) -> list[tuple[str, str, str]]:
        return []  # a score is never "ok" or "WRONG" as a label is: the correlations say how close

    def baseline(self, examples: list) -> dict[str, Any]:
        """The better of the train mean and (for pairs) the token-overlap cosine, by Spearman;
        and the train mean's MSE (``mean_mse``), what a model's MSE is to beat."""
        truth = [r["score"] for r in examples]
        out = Objective.baseline(self, examples)
        return {**out, "mean_mse": score_metrics([self.train_mean] * len(truth), truth)["mse"]}

    def _baseline(self, examples: list) -> tuple[float, str]:
        truth = [r["score"] for r in examples]
        best = (score_metrics([self.train_mean] * len(truth), truth)[self.main_metric], MEAN)
        overlap = self._overlap(examples)
        if overlap is not None:
            best = max(best, (score_metrics(overlap, truth)[self.main_metric], OVERLAP))
        return best

    def _overlap(self, examples: list) -> list[float] | None:
        """Each pair's token-overlap cosine, the pairs' baseline (None unless every example is a pair)."""
        if not examples or not all(r.get("text_pair") for r in examples):
            return None
        specials = {self.source.bos_id, self.source.eos_id, self.source.pad_id}
        tokens = self.source.encode_texts([r["text"] for r in examples] + [r["text_pair"] for r in examples])
        sets = [set(e.ids) - specials for e in tokens]
        n = len(examples)
        return [overlap_cosine(sets[i], sets[n + i]) for i in range(n)]

    def paired_interval(self, examples: list, preds: list) -> tuple[float, float] | None:
        """Spearman's correlation is no mean of per-example scores: the gain's interval over the
        better baseline (the train mean correlates 0) is a paired bootstrap of the examples."""
        if self.main_metric != "spearman":
            return None
        predicted = [activate(p, self.activation)[0] for p in preds]
        overlap = self._overlap(examples)
        baselines = [] if overlap is None else [ranks(np.asarray(overlap, np.float64))]
        return spearman_interval(ranks(np.asarray(predicted, np.float64)),
                                 ranks(np.asarray([r["score"] for r in examples], np.float64)), baselines)


def concordance(predicted: Tensor, truth: Tensor) -> float:
    """The share of pairs of examples with different scores that ``predicted`` orders as
    ``truth`` does (a tie counts half): 0.5 is chance, 1 every pair in order.

    Shape:
        predicted, truth: (B,)
    """
    dt = truth[:, None] - truth[None, :]  # (B, B)
    dp = predicted[:, None] - predicted[None, :]
    differ = dt != 0
    if not bool(differ.any()):
        return 0.5
    agree = torch.where(dp == 0, 0.5, (torch.sign(dp) == torch.sign(dt)).float())
    return float(agree[differ].mean())


class RegressionRun(CrossEncoderRun):
    kind = NAME
    verb = "predict"
    protocols = ("tei.predict", "tei.tokenize")

    @property
    def pairs(self) -> bool:
        """Whether the run was trained on text pairs (its data had a text_pair field)."""
        return bool(self.objective.source.data.pairs)

    def predict(self, texts: str | Iterable[str], pairs: Iterable[str | None] | None = None,
                batch_size: int = 64) -> list[dict[str, float]]:
        """{"score": x} per text (one str is one text; pairs: each text's text_pair, for a run
        trained on pairs; with one text, one str)."""
        texts = texts_of(texts)
        pairs = None if pairs is None else pairs_list(pairs, len(texts))
        scores = self.pair_scores(texts, pairs, batch_size=check_batch_size(batch_size))
        return [{"score": s} for s in scores]

    def printed(self, text: str, answer: dict[str, Any]) -> tuple[str, dict[str, Any]]:
        """`tformer predict`'s line for one text (its score) and its JSONL record ({"text",
        "score"}); a score that is not finite (a broken checkpoint) is refused."""
        score = answer["score"]
        if not math.isfinite(score):
            raise ValueError(f"RUN_DIR {self.path}: expected a finite score, got {score} for {text[:60]!r} "
                             "(the weights are not finite: was its training diverging?)")
        return f"{score:.6g}", {"text": text, "score": round(score, 6)}

    def _records(self, texts: list[str], pairs: list[str | None] | None) -> list[dict[str, str]]:
        return self.objective.source.inputs(texts, self.objective.inputs, pairs)

    def tei_model_type(self) -> dict[str, Any]:
        return {"classifier": {"id2label": {"0": self.labels[0]}}}


KIND = Kind(Regression, RegressionRun)
