"""What every objective shares: the source it learns from, batches, prediction and evaluation.

    objective = make_objective(config, run_dir)          # tformer.kinds
    model = objective.build_model()
    for batch in objective.train_batches(start): loss, acc = objective.loss(model, batch)
    metrics, shown = objective.evaluate(model, "validation")

One subclass per kind, in the kind's own module (tformer.kinds: classification, seq2seq,
embedding...), each taking a typed source (tformer.training.sources: a synthetic task or your
files). The training loop never asks which it has; a trained run (tformer.kinds.run) has the
verbs of its kind.
"""

from __future__ import annotations

import contextlib
import functools
import itertools
import time
from abc import ABC, abstractmethod
from collections.abc import Callable, Iterable, Iterator, Mapping
from pathlib import Path
from typing import Any

import torch
from torch import Tensor, nn

from tformer.config import TransformerConfig
from tformer.formats.model_dir import ModelDir
from tformer.formats.pretrained import pretrained_config
from tformer.nn.devices import model_device
from tformer.nn.kernels.autotune import seconds_measuring
from tformer.nn.kernels.compiling import expecting, items_to_come, more_to_come
from tformer.text.batches import SORT_WINDOW, done_prefix, prediction_windows
from tformer.text.windows import rows as batch_rows
from tformer.training import windows
from tformer.training.records import Fields
from tformer.training.sources import Data, FileSource, TaskSource
from tformer.training.stream import remembered
from tformer.training.tally import KeptTally, Tally

# Validation decodes (seq2seq) and the teacher-forced loss of every evaluation use at most
# this many examples of the validation split; the test split is always scored whole.
EVAL_SAMPLE = 500
PREDICT_BATCH = 64  # examples per forward when predicting
# Examples a streamed evaluation (evaluate_stream) holds at a time: whole windows of predict's,
# so that it forms the same batches as evaluate, and at least the EVAL_SAMPLE of the loss.
STREAM_WINDOW = 4 * PREDICT_BATCH * SORT_WINDOW
# Under a deadline the first batch, which runs to its end whatever the time, holds this many: an untrained
# decoder's 64 outputs run to the length limit (13 s past a 60 s run's deadline, busy 2-core machine).
FIRST_BATCH_UNDER_DEADLINE = 8

Source = TaskSource | FileSource
Progress = Callable[[int, int], None]  # (examples done, examples in all)


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


class DeadlinePassed(Exception):
    """predict_batch's outputs were cut by the deadline before they ended: not predictions."""


class Objective(ABC):
    """A kind of model and what it learns from its source. Subclasses set the class attributes
    and define the abstract methods: model_config, build_model, encode, collate, loss,
    predict_batch, score and _baseline."""

    kind = ""  # the kind's name (tformer.kinds): reports, run directories
    model_kind = ""  # the architecture tformer.config.sizes sizes: "seq2seq", "classifier" or "encoder"
    predict_cost = 0.5  # predicting one example, in a training step's share of one (a forward's ~1/3)
    steps_factor = 1.0  # the updates a model sized from scratch must get, in sizing.MIN_STEPS
    # The latest evaluate's loss pass: (seconds, examples), which the budget times apart from the
    # predictions (tformer.training.budget.Budget.validated); a kind without one leaves (0.0, 0).
    loss_pass: tuple[float, int] = (0.0, 0)
    growth = 1.0  # the latest validation's ``output_growth`` (the budget times the test at it)
    # A kind whose predictions hold what its loss reads (a classifier's logits) says so, and
    # evaluate takes the loss from them (``loss_of_predictions``) with no forward of its own: a
    # fine-tune's validation spent half its time on a loss pass that repeated its predictions'.
    loss_from_predictions = False
    # A data run's kind declares what its files hold and its defaults, under a config file and
    # the command line (flat option names, as on the command line: --d-model is "d_model").
    fields: Fields | None = None  # a synthetic task's only kind: None
    preset: Mapping[str, Any] = {}
    finetune_preset: Mapping[str, Any] = {}  # a fine-tune's: over tformer.training.presets.FINETUNE_PRESET
    reads: tuple[str, ...] = ()  # options only this kind reads (the other kinds refuse them)
    refuses: Mapping[str, str] = {}  # options this kind refuses set (to a true value): name -> why
    inputs = ("text",)  # the fields a user's input texts fill (a tab separates the second)
    # How the outputs of a long text's windows pool ("mean", "max", "first"): a kind that sets it
    # reads a text longer than max_length in windows where the run settled on them (--long), and
    # its forward pools their rows (EncoderBatch.pooled); None: the kind cuts long texts.
    pools: str | None = None
    # A kind that fits a fine-tune's new head to the pretrained features before the first update
    # (tformer.training.probe) says so, and defines fit_head.
    probes_head = False

    def __init__(self, source: Source, pretrained: ModelDir | None = None) -> None:
        """pretrained: a new fine-tune's --from-pretrained directory, read once where the command
        starts (tformer.kinds.make_objective); None for a run from scratch, and for a run read
        back from its directory, which needs nothing of its base model's."""
        if self.pools is not None and getattr(source, "long", None) == "windows":
            source = source.windowed()  # (tformer.training.windows)
        self.source, self.config, self.pretrained = source, source.config, pretrained

    def with_config(self, config) -> Objective:
        """This objective under other training options: what a plan probes and settles on."""
        return type(self)(self.source.with_config(config), self.pretrained)

    @functools.cached_property
    def base_config(self) -> TransformerConfig | None:
        """The pretrained model's config (its config.json, read once), or None (no base read)."""
        return None if self.pretrained is None else pretrained_config(self.pretrained)

    @property
    def description(self) -> str:
        return f"{self.source.description}: {self.what()}"

    def what(self) -> str:
        return self.kind

    @property
    @abstractmethod
    def main_metric(self) -> str:
        """The validation metric reported first (higher is better)."""

    @property
    def best_by(self) -> str:
        """What picks the best weights: the main metric, unless a subclass says otherwise."""
        return self.main_metric

    @property
    def starts_complete(self) -> bool:
        """Whether the model is whole for this objective before its first update: a pretrained
        model that the objective adds no parameter to. The loop then validates it at step 0, so
        a fine-tune that only hurts still tests the model it started from. False unless a
        subclass says (a new head, or a model from scratch, starts random)."""
        return False

    def fit_head(self, model: nn.Module, features: Tensor, targets: Tensor) -> str | None:
        """Set a new fine-tune's head from the pretrained encoder's `features` (N, width) of
        training examples and their `targets` (N, ...) (``head_inputs``); what was fitted, in a
        few words, or None where they hold nothing to fit (a kind with ``probes_head``:
        tformer.training.probe's fits)."""
        raise NotImplementedError(f"{self.kind}: fits no head (probes_head is False)")

    def head_inputs(self, model: nn.Module, batch: Any) -> tuple[Tensor, Tensor]:
        """(what the head reads (N, width), what it learns (N, ...)) in a training batch, for
        ``fit_head``: a row's pooled features (EncoderClassifier.pooled) and its labels."""
        out = model.encoder(batch.input_ids, batch.attention_mask, token_type_ids=batch.token_type_ids)
        return model.pooled(out), batch.labels

    def model_width(self) -> int:
        """d_model of the model this objective trains: a pretrained encoder's own, else the
        run's (what the fine-tuning learning rate scales with)."""
        return (self.base_config or self.model_config()).d_model

    def finetune_config(self, pretrained: TransformerConfig) -> TransformerConfig:
        """The pretrained encoder's config as this fine-tune trains it: with --dropout (the
        config's pretrained_dropout off), that probability for every dropout of the model, the
        hidden states', the attention weights' and a head's (HF's hidden_dropout_prob and
        attention_probs_dropout_prob together); else the pretrained model's own."""
        if self.config.pretrained_dropout:
            return pretrained
        p = self.config.model.dropout
        return pretrained.replace(dropout=p, attention_dropout=p)

    @property
    def tokenizer(self):
        """The run's text tokenizer (None for a synthetic task's symbol table)."""
        return self.source.tokenizer

    @property
    def train_records(self) -> int | None:
        return self.source.train_records

    # What subclasses define ---------------------------------------------------------------
    @abstractmethod
    def model_config(self) -> TransformerConfig:
        """The model's TransformerConfig: the run's sizes, the source's vocabulary and lengths."""

    def saved_config(self, model_config: TransformerConfig, run_dir: Path) -> TransformerConfig:
        """The config of a run's saved model (its checkpoint's config.json), as the run directory
        says it (a kind may read more of it there; never of any other folder)."""
        return model_config

    @abstractmethod
    def build_model(self, model_config: TransformerConfig | None = None) -> nn.Module:
        """The model, newly initialised (a pretrained encoder's weights for a fine-tune)."""

    @abstractmethod
    def encode(self, examples: list) -> list:
        """Typed examples (tformer.training.examples): token ids and each one's cost."""

    @abstractmethod
    def collate(self, encoded: list) -> Any:
        """A padded batch of tensors (tformer.text.batches) from typed examples."""

    @abstractmethod
    def loss(self, model: nn.Module, batch: Any, label_smoothing: float = 0.0) -> tuple[Tensor, float]:
        """The training loss of a batch, and its accuracy for logging."""

    @abstractmethod
    def predict_batch(self, model: nn.Module, batch: Any, **options: Any) -> list:
        """One prediction per example of the batch (options: a decoder's beam size...)."""

    @abstractmethod
    def score(self, examples: list, preds: list) -> tuple[dict[str, float], list]:
        """(metrics, what each prediction shows in the sample table)."""

    # Shared --------------------------------------------------------------------------------
    @property
    def windowed(self) -> bool:
        """Whether a long text is read in windows (tformer.training.windows)."""
        return bool(getattr(self.tokenizer, "windows", False))

    def train_batches(self, start: int, rank: int = 0, world: int = 1) -> Iterator:
        """The training stream from the `start`-th batch (this rank's: i % world == rank); a
        long text read in windows trains as its windows (tformer.training.windows)."""
        # A file's records are tokenized once, not once an epoch (a task's are new every batch)
        encode = remembered(self.encode) if isinstance(self.source, FileSource) else self.encode
        encode = windows.training(encode) if self.windowed else encode
        return self.source.train_batches(encode, self.collate, start, rank, world)

    def examples(self, split: str) -> list:
        return self.source.examples(split)

    def read_examples(self, data: Data, limit: int | None = None) -> Iterator:
        """Examples of a file or of records with the training file's fields (the first `limit`),
        a file's read as they are taken."""
        return self.source.read_examples(data, limit)

    def predict(self, model: nn.Module, examples: list, batch_size: int = PREDICT_BATCH,
                deadline: float | None = None, progress: Progress | None = None, **options: Any) -> list:
        """One prediction per example, in order (labels and targets are not needed), on the
        model's device. Each window of SORT_WINDOW batches is sorted by length, so a batch pads
        little and its rows finish decoding together. With a `deadline` (a time.perf_counter()
        reading) no batch starts that would end past it, by the last batch's time, and the
        predictions are a prefix of examples': windows of DEADLINE_WINDOW batches, one the
        deadline cuts keeping its examples before the first unfinished. The first batch always
        runs to its end (under a deadline a small one, FIRST_BATCH_UNDER_DEADLINE examples in
        order, a window of its own); a later one the deadline cuts (``DeadlinePassed``) is left
        out: every scored prediction is one the model finished. Without a deadline, from the
        second batch on, the eager seconds left (by the last batch's, ``more_to_come``'s too) are what a
        compiled kernel must repay (kernels.compiling.expecting). `progress(done, total)` after each batch."""
        out: list = []
        batch_seconds = each = 0.0  # the last batch's seconds, and per example in it
        device = model_device(model)
        with evaluating(model):
            for start, end in prediction_windows(len(examples), batch_size, deadline is not None,
                                                 FIRST_BATCH_UNDER_DEADLINE):
                encoded = self.encode(examples[start:end])
                reads = [windows.windows_of(e) for e in encoded]  # a long text's windows: rows each
                order = sorted(range(len(encoded)), key=lambda i: (reads[i], encoded[i].cost))
                preds, i = [None] * len(encoded), 0  # i: examples of this window done
                while i < len(order):
                    first = not out and not i
                    if not first and deadline is not None and time.perf_counter() + batch_seconds > deadline:
                        return out + done_prefix(preds)
                    t = time.perf_counter()
                    rows = batch_rows(order[i:], reads, min(batch_size, end - start))
                    batch = self.collate([encoded[r] for r in rows]).to(device)
                    bounded = self._bounded(options, None if first else deadline)
                    left = len(examples) - len(out) - i + items_to_come()  # examples, with later windows'
                    try:  # compiled kernels where the eager work left repays them (no budget to spend)
                        with expecting(each * left if deadline is None else 0):
                            predicted = self.predict_batch(model, batch, **bounded)
                    except DeadlinePassed:
                        return out + done_prefix(preds)
                    for r, pred in zip(rows, predicted, strict=True):
                        preds[r] = pred
                    batch_seconds = time.perf_counter() - t
                    each = batch_seconds / len(rows)
                    if progress is not None:
                        progress(len(out) + i + len(rows), len(examples))
                    i += len(rows)
                out += preds
        return out

    def _bounded(self, options: dict[str, Any], deadline: float | None) -> dict[str, Any]:
        """predict_batch's options under a deadline (a decoder's stop there: DeadlinePassed)."""
        return options

    def evaluate(self, model: nn.Module, split: str, examples: list | None = None,
                 deadline: float | None = None, progress: Progress | None = None,
                 paired: bool = False, **options: Any) -> tuple[dict[str, Any], list]:
        """Metrics on a held-out split (or on `examples`), with the teacher-forced, unsmoothed
        loss of its first EVAL_SAMPLE; and what each prediction shows. With a `deadline`, the
        examples predicted by then are scored (``predict``): metrics["examples"] says how many.
        The loss comes first, so the deadline counts its time (after the predictions, it took a
        busy machine's test 5.7 s past its deadline); a kind whose loss reads its predictions
        (``loss_from_predictions``) takes it from those scored. With `paired` (the final test), metrics
        also hold the verdict's "paired_interval" where the objective draws one."""
        examples = validation_sample(split, self.examples(split)) if examples is None else examples
        t, measuring = time.perf_counter(), seconds_measuring()
        loss = None if self.loss_from_predictions else self._sample_loss(model, examples)
        # (timed without new kernel choices' measuring: a rate for the budget's later estimates)
        self.loss_pass = (0.0, 0) if loss is None else (
            time.perf_counter() - t - (seconds_measuring() - measuring), min(len(examples), EVAL_SAMPLE))
        preds = self.predict(model, examples, deadline=deadline, progress=progress, **options)
        scored = examples[: len(preds)]
        if loss is None:
            loss = self.loss_of_predictions(scored[:EVAL_SAMPLE], preds[:EVAL_SAMPLE])
        # (a validation's only: what the budget times the final test at)
        self.growth = self.output_growth(scored, preds) if split == "validation" and scored else 1.0
        self.before_scoring(model, split, scored, preds)
        metrics, shown = self.score(scored, preds)
        metrics.update(loss=loss, examples=len(scored))
        interval = self.paired_interval(scored, preds) if paired and scored else None
        if interval is not None:
            metrics["paired_interval"] = list(interval)
        return metrics, shown

    def output_growth(self, examples: list, preds: list) -> float:
        """How many times these predictions' cost a trained model's will take: 1, unless a kind's
        cost moves as its model learns (``Seq2Seq``: the tokens a decoder writes)."""
        return 1.0

    def loss_of_predictions(self, examples: list, preds: list) -> float:
        """The unsmoothed loss of `examples` from their predictions (``loss_from_predictions``)."""
        raise NotImplementedError(f"{type(self).__name__} takes its loss from a pass of its own")

    def before_scoring(self, model: nn.Module, split: str, scored: list, preds: list) -> None:
        """What evaluate does with a split's predictions before scoring them: nothing, unless the
        scores depend on a choice made on them (a multi-label model's thresholds)."""
        return None

    def paired_interval(self, examples: list, preds: list) -> tuple[float, float] | None:
        """The 95% interval of the main metric's gain over the baseline on `examples`, drawn by a
        paired bootstrap (tformer.training.verdict), for a main metric that is no mean of
        per-example scores; None (the default) where the verdict's bound holds."""
        return None

    def _sample_loss(self, model: nn.Module, examples: list) -> float:
        """The teacher-forced, unsmoothed loss of the first EVAL_SAMPLE examples (of as many as
        make EVAL_SAMPLE rows, where long texts are read in windows: one batch, bounded)."""
        encoded = self.encode(examples[:EVAL_SAMPLE])
        kept = batch_rows(list(range(len(encoded))), [windows.windows_of(e) for e in encoded], EVAL_SAMPLE)
        with evaluating(model):
            batch = self.collate([encoded[i] for i in kept]).to(model_device(model))
            return self.loss(model, batch)[0].item()

    def tally(self) -> Tally:
        """What evaluate_stream scores with: by default, every window kept (KeptTally)."""
        return KeptTally(self)

    def evaluate_stream(self, model: nn.Module, examples: Iterable, samples: int = 0, total: int = 0,
                        **options: Any) -> tuple[dict[str, float], dict[str, Any], list[tuple[str, ...]]]:
        """evaluate's metrics of `examples` (a list, or records read as they come: ``total`` of
        them where known), with the baseline's (``baseline``) and the sample rows of the first
        `samples`; read, predicted and scored STREAM_WINDOW at a time (memory does not grow with
        them where the metrics are sums: ``tally``), each window telling compiled kernels the rest."""
        tally, rows, loss, n = self.tally(), [], None, 0
        total = total or (len(examples) if isinstance(examples, list) else 0)
        examples = iter(examples)
        while window := list(itertools.islice(examples, STREAM_WINDOW)):
            if loss is None and not self.loss_from_predictions:  # of the first EVAL_SAMPLE, as evaluate's
                loss = self._sample_loss(model, window)
            with more_to_come(total - n - len(window)):  # repaid over the whole stream, not a window
                preds = self.predict(model, window, **options)
            if loss is None:
                loss = self.loss_of_predictions(window[:EVAL_SAMPLE], preds[:EVAL_SAMPLE])
            tally.add(window, preds)
            if len(rows) < samples:
                first = window[: samples - len(rows)]
                rows += self.sample_rows(first, self.score(first, preds[: len(first)])[1])
            n += len(window)
        if loss is None:
            raise ValueError("examples: expected at least one example, got none")
        return {**tally.metrics(), "loss": loss, "examples": n}, tally.baseline(), rows

    def baseline(self, examples: list) -> dict[str, Any]:
        """The trivial baseline's score on `examples` under the main metric, as ``baseline``,
        and what it does, as ``baseline_by`` (tformer.training.report.baseline_verdict compares)."""
        value, by = self._baseline(examples)
        return {"baseline": value, "baseline_by": by}

    @abstractmethod
    def _baseline(self, examples: list) -> tuple[float, str]:
        """(the main metric of a trivial prediction of `examples`, what that prediction is)."""

    def sample_rows(self, examples: list, shown: list) -> list[tuple[str, str, str]]:
        """(input, prediction, target) rows for the sample table."""
        return [self.source.row(ex, s) for ex, s in zip(examples, shown, strict=True)]

    def save_outputs(self, model: nn.Module, run_dir: Path, shown: list) -> None:  # noqa: B027
        """Files beyond the checkpoint a finished run writes: none, unless a subclass says."""
