"""What a run learns, as the loop sees it: the Objective protocol and what objectives share.

    objective = make_objective(config, run_dir)   # tformer.training.loop
    model = objective.build_model()
    for batch in objective.train_batches(start): loss, acc = objective.loss(model, batch)
    metrics, preds = objective.evaluate(model, "validation")

One class per objective implements it: the synthetic tasks (training.task_objectives) and
your own data's seq2seq, classification and embedding (training.data_objectives). The loop
never asks which one it has.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterable, Iterator, Mapping
from pathlib import Path
from typing import Any, Protocol

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from tformer.config import TransformerConfig
from tformer.text.batches import EncoderBatch, PairBatch, Seq2SeqBatch
from tformer.text.specials import PAD

# Validation decodes (seq2seq) and the teacher-forced loss of every evaluation use at most
# this many examples of the validation split; the test split is always scored whole.
EVAL_SAMPLE = 500
MNR_SCALE = 20.0  # similarity scale of the ranking loss (sentence-transformers' default)


Data = str | Path | Iterable[Mapping[str, Any]]  # a file, or records (dicts of fields)


class Objective(Protocol):
    """Everything the training loop needs from what is learned, and what a trained run does
    (tformer.training.run: classify, generate or embed; each objective does one, and the
    others raise a one-line ValueError)."""

    kind: str  # what is learned, for reports and exports: "seq2seq", "classification" or "embedding"
    main_metric: str  # the validation metric reported first (higher is better)
    # What picks the best weights, where not main_metric: ``best_by = "loss"`` (lower is better;
    # optional, see training.loop._selection).
    description: str  # one line for the log
    model_kind: str  # what tformer.stats sizes: "seq2seq", "classifier" or "encoder"

    def model_config(self) -> TransformerConfig: ...

    def build_model(self, model_config: TransformerConfig | None = None) -> nn.Module: ...

    def train_batches(self, start: int, rank: int = 0, world: int = 1) -> Iterator[Any]: ...

    def loss(self, model: nn.Module, batch: Any, label_smoothing: float = 0.0) -> tuple[Tensor, float]: ...

    def examples(self, split: str) -> list: ...

    def evaluate(self, model: nn.Module, split: str, beam_size: int = 1,
                 examples: list | None = None) -> tuple[dict[str, float], list]: ...

    def baseline(self) -> dict[str, float]: ...

    def sample_rows(self, examples: list, preds: list) -> list[tuple[str, str, str]]: ...

    def save_outputs(self, model: nn.Module, run_dir: Path, preds: list) -> None: ...

    def read_examples(self, data: Data) -> list: ...

    def classify(self, model: nn.Module, texts: list[str], pairs: list[str] | None) -> list[dict]: ...

    def generate(self, model: nn.Module, inputs: list[str], beam_size: int, length_penalty: float,
                 max_len: int | None = None) -> list[str]: ...

    def embed(self, model: nn.Module, texts: list[str]) -> Tensor: ...


def cannot(description: str, verb: str, needs: str) -> ValueError:
    return ValueError(f"RUN: {verb} needs {needs}; this run is {description}")


@contextlib.contextmanager
def evaluating(model: nn.Module) -> Iterator[nn.Module]:
    """Eval mode and no gradients for the block; the model's mode is restored after."""
    was_training = model.training
    model.eval()
    try:
        with torch.no_grad():
            yield model
    finally:
        model.train(was_training)


def validation_sample(split: str, examples: list) -> list:
    """What an evaluation scores: the validation split's first EVAL_SAMPLE, the test split whole."""
    return examples[:EVAL_SAMPLE] if split == "validation" else examples


# Losses -----------------------------------------------------------------------------------------
def _at_least_fp32(x: Tensor) -> Tensor:
    """The loss in fp32 under bf16 autocast; float64 (gradient checks) stays float64."""
    return x if x.dtype in (torch.float32, torch.float64) else x.float()


def seq2seq_loss(model: nn.Module, batch: Seq2SeqBatch, label_smoothing: float = 0.0,
                 pad_id: int = PAD) -> tuple[Tensor, float]:
    """Teacher-forced cross-entropy over the target tokens, and token accuracy for logging."""
    logits = model(batch.src, batch.tgt_in, src_attention_mask=batch.src_mask,
                   tgt_attention_mask=batch.tgt_mask).logits  # (B, T, V)
    labels = batch.labels  # (B, T)
    loss = F.cross_entropy(_at_least_fp32(logits.flatten(0, 1)), labels.flatten(), ignore_index=pad_id,
                           label_smoothing=label_smoothing)
    real = labels != pad_id
    # max's indices: argmax itself runs 2.4x slower on bf16 logits (autocast) on CPU
    right = ((logits.max(-1).indices == labels) & real).sum()
    return loss, right.item() / max(int(real.sum()), 1)


def classification_loss(model: nn.Module, batch: EncoderBatch,
                        label_smoothing: float = 0.0) -> tuple[Tensor, float]:
    """Cross-entropy over the classes, and accuracy for logging."""
    logits = model(batch.input_ids, batch.attention_mask, batch.token_type_ids).logits  # (B, C)
    loss = F.cross_entropy(_at_least_fp32(logits), batch.labels, label_smoothing=label_smoothing)
    return loss, (logits.argmax(-1) == batch.labels).float().mean().item()


def forward_loss(model: nn.Module, batch: Seq2SeqBatch | EncoderBatch, label_smoothing: float = 0.0,
                 pad_id: int = PAD) -> tuple[Tensor, float]:
    """The teacher-forced loss of either batch type, and (loss, accuracy) for logging."""
    if isinstance(batch, Seq2SeqBatch):
        return seq2seq_loss(model, batch, label_smoothing, pad_id)
    return classification_loss(model, batch, label_smoothing)


def ranking_loss(model: nn.Module, batch: PairBatch) -> tuple[Tensor, float]:
    """Multiple-negatives ranking loss (Henderson et al. 2017): anchor i must score its own
    positive above every other positive (and every hard negative) of the batch.
    Returns the loss and the in-batch top-1 accuracy."""
    a = model(batch.anchor)  # (B, D)
    candidates = model(batch.positive)  # (B, D)
    if batch.negative is not None:
        candidates = torch.cat([candidates, model(batch.negative)])  # (B + N, D)
    scores = MNR_SCALE * a @ candidates.T  # (B, B + N)
    target = torch.arange(a.size(0))
    loss = F.cross_entropy(scores.float(), target)
    return loss, (scores.argmax(-1) == target).float().mean().item()
