"""The synthetic tasks (tformer.tasks) as objectives: batches are a function of (seed, step),
the held-out splits are generated. One class per kind of task."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

from torch import Tensor, nn

from tformer.config import TransformerConfig
from tformer.nn.generate import generate
from tformer.nn.model import EncoderClassifier, Seq2SeqTransformer
from tformer.tasks import Example, Task
from tformer.text.batches import EncoderBatch, Seq2SeqBatch
from tformer.training.objective import (
    EVAL_SAMPLE,
    cannot,
    classification_loss,
    evaluating,
    seq2seq_loss,
    validation_sample,
)


class TaskObjective:
    """What every synthetic task's objective shares; subclasses say what is predicted."""

    kind = "classification"
    main_metric = "accuracy"
    model_kind = "classifier"

    def __init__(self, task: Task, config) -> None:
        self.task, self.config = task, config
        self.description = f"task {task.name}: {task.description}"

    def model_config(self) -> TransformerConfig:
        return self.config.task_model(self.task)

    def build_model(self, model_config: TransformerConfig | None = None) -> nn.Module:
        raise NotImplementedError

    def train_batches(self, start: int, rank: int = 0, world: int = 1) -> Iterator:
        step = start
        while True:
            if step % world == rank:
                yield self.task.collate(self.task.train_batch(step, self.config.batch_size))
            step += 1

    def loss(self, model: nn.Module, batch, label_smoothing: float = 0.0):
        raise NotImplementedError

    def examples(self, split: str) -> list[Example]:
        return self.task.split(split)

    def predict(self, model: nn.Module, examples: list[Example], beam_size: int = 1,
                batch_size: int = 250, length_penalty: float = 1.0) -> list:
        """One prediction per example (see the subclasses)."""
        out: list = []
        with evaluating(model):
            for i in range(0, len(examples), batch_size):
                out += self._predict_batch(model, self.task.collate(examples[i : i + batch_size]),
                                           beam_size, length_penalty)
        return out

    def _predict_batch(self, model, batch, beam_size: int, length_penalty: float) -> list:
        raise NotImplementedError

    def evaluate(self, model: nn.Module, split: str, beam_size: int = 1,
                 examples: list | None = None) -> tuple[dict[str, float], list]:
        """Metrics on a held-out split (generation for seq2seq), plus the predictions."""
        examples = validation_sample(split, self.task.split(split)) if examples is None else examples
        preds = self.predict(model, examples, beam_size=beam_size)
        metrics = self.task.score(preds, examples)
        with evaluating(model):  # teacher-forced, unsmoothed
            metrics["loss"] = self.loss(model, self.task.collate(examples[:EVAL_SAMPLE]))[0].item()
        return metrics, preds

    def baseline(self) -> dict[str, float]:
        return {}

    def sample_rows(self, examples: list[Example], preds: list) -> list[tuple[str, str, str]]:
        raise NotImplementedError

    def save_outputs(self, model: nn.Module, run_dir: Path, preds: list) -> None:
        """Nothing beyond the checkpoint for a synthetic task."""

    # What a trained run does (tformer.training.run): each subclass does one.
    def read_examples(self, data) -> list[Example]:
        raise ValueError(f"data: {self.description} evaluates on its own generated splits, not on files")

    def classify(self, model: nn.Module, texts: list[str], pairs: list[str] | None) -> list[dict]:
        raise cannot(self.description, "predict", "a classification task (listops, brackets)")

    def generate(self, model: nn.Module, inputs: list[str], beam_size: int = 1,
                 length_penalty: float = 1.0, max_len: int | None = None) -> list[str]:
        raise cannot(self.description, "generate", "a sequence-to-sequence task")

    def embed(self, model: nn.Module, texts: list[str]) -> Tensor:
        raise cannot(self.description, "embed", "an embedding run (anchor+positive)")

    def _examples(self, texts: list[str]) -> list[Example]:
        for text in texts:
            self.task.tokenizer.encode(text, strict=True)  # unknown symbols: a one-line error
        return [Example(text) for text in texts]


class TaskSeq2Seq(TaskObjective):
    """copy, reverse, sort, add: generate the target; exact match of whole sequences."""

    kind = "seq2seq"
    main_metric = "exact_match"
    model_kind = "seq2seq"

    def build_model(self, model_config: TransformerConfig | None = None) -> nn.Module:
        return Seq2SeqTransformer(model_config or self.model_config())

    def loss(self, model: nn.Module, batch: Seq2SeqBatch, label_smoothing: float = 0.0):
        return seq2seq_loss(model, batch, label_smoothing)

    def _predict_batch(self, model, batch: Seq2SeqBatch, beam_size: int, length_penalty: float) -> list:
        """Generated id lists."""
        gen = generate(model, batch.src, batch.src_mask, beam_size=beam_size,
                       max_len=self.task.max_target_tokens + 1, length_penalty=length_penalty)
        return gen.tolist()

    def generate(self, model: nn.Module, inputs: list[str], beam_size: int = 1,
                 length_penalty: float = 1.0, max_len: int | None = None) -> list[str]:
        ids = self.predict(model, self._examples(inputs), beam_size, length_penalty=length_penalty)
        return [self.task.tokenizer.decode(p) for p in ids]

    def sample_rows(self, examples: list[Example], preds: list) -> list[tuple[str, str, str]]:
        decode = self.task.tokenizer.decode
        return [(ex.source, decode(p), ex.target) for ex, p in zip(examples, preds, strict=True)]


class TaskClassification(TaskObjective):
    """listops, brackets: one label per input; accuracy against the majority class."""

    def build_model(self, model_config: TransformerConfig | None = None) -> nn.Module:
        return EncoderClassifier(model_config or self.model_config())

    def loss(self, model: nn.Module, batch: EncoderBatch, label_smoothing: float = 0.0):
        return classification_loss(model, batch, label_smoothing)

    def _predict_batch(self, model, batch: EncoderBatch, beam_size: int, length_penalty: float) -> list:
        """Class ids."""
        return model(batch.input_ids, attention_mask=batch.attention_mask).logits.argmax(-1).tolist()

    def baseline(self) -> dict[str, float]:
        return {"majority_baseline": self.task.majority_baseline()["accuracy"]}

    def classify(self, model: nn.Module, texts: list[str], pairs: list[str] | None) -> list[dict]:
        if pairs is not None:
            raise ValueError(f"pairs: {self.description} takes single inputs, got pairs")
        return [{"label": str(c)} for c in self.predict(model, self._examples(texts))]

    def sample_rows(self, examples: list[Example], preds: list) -> list[tuple[str, str, str]]:
        return [(ex.source, str(p), str(ex.label)) for ex, p in zip(examples, preds, strict=True)]


TASK_OBJECTIVES: dict[str, type[TaskObjective]] = {"seq2seq": TaskSeq2Seq,
                                                   "classification": TaskClassification}


def task_objective(task: Task, config) -> TaskObjective:
    return TASK_OBJECTIVES[task.kind](task, config)
