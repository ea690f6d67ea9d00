"""What every synthetic task shares: examples, splits, batching and metrics.

Splits are generated, not downloaded. The test and validation sets are fixed lists
drawn from ``seed``; the training split is an unbounded stream whose batch for step k
depends only on (seed, k), so a resumed run sees exactly the batches it would have
seen without stopping. An input that is in the test or validation set is never drawn
for training, so the three splits are disjoint by their inputs.

Torch-free until a batch is made: ``collate_arrays`` gives NumPy batches (for the NumPy
reference), ``collate`` the same values as torch tensors (tformer.text.batches).
"""

from __future__ import annotations

import random
from dataclasses import dataclass

import numpy as np

from tformer.text.batches import EncoderBatch, Seq2SeqBatch, encoder_arrays, pad, seq2seq_arrays
from tformer.text.specials import BOS, EOS
from tformer.training.tasks.tokenizer import Tokenizer

__all__ = ["SPLITS", "ClassificationTask", "Example", "SequenceTask", "Task", "pad", "sequence_metrics"]

SPLITS = ("train", "validation", "test")


@dataclass(frozen=True)
class Example:
    """One example: `source` text, and a `target` text (seq2seq) or a `label` (classification)."""

    source: str
    target: str = ""
    label: int = -1


class Task:
    """Base class. Subclasses set the class attributes and implement `sample`.

    Args:
        seed: chooses every split.
        valid_size, test_size: number of distinct inputs in the held-out splits.
    """

    name: str = ""
    kind: str = ""  # "seq2seq" or "classification": SequenceTask or ClassificationTask
    main_metric: str = ""
    description: str = ""
    n_classes: int | None = None
    tokenizer: Tokenizer
    max_source_tokens: int = 0  # upper bound on len(tokenizer.encode(source))
    max_target_tokens: int = 0

    def __init__(self, seed: int = 0, valid_size: int = 500, test_size: int = 1000) -> None:
        for arg, value in (("valid_size", valid_size), ("test_size", test_size)):
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ValueError(f"{arg}: expected a positive int, got {value!r}")
        self.seed = seed
        self.valid_size = valid_size
        self.test_size = test_size
        self._held_out: dict[str, list[Example]] = {}
        self._held_out_inputs: set[str] | None = None

    # Subclasses -----------------------------------------------------------------
    def sample(self, rng: random.Random) -> Example:
        """Draw one example (any split); must use only `rng` for randomness."""
        raise NotImplementedError

    # Splits -----------------------------------------------------------------------
    def _rng(self, *parts: object) -> random.Random:
        # String seeds are hashed with SHA-512 by `random`, so they are stable across
        # processes (unlike hash()) and never collide between splits or steps.
        return random.Random("/".join(str(p) for p in (self.name, self.seed, *parts)))

    def split(self, name: str) -> list[Example]:
        """The fixed "validation" or "test" list. Training data comes from `train_batch`."""
        if name not in ("validation", "test"):
            raise ValueError(
                f"split: expected 'validation' or 'test' (train is a stream: use train_batch), "
                f"got {name!r}"
            )
        if name not in self._held_out:
            # Test first, then validation without the test inputs.
            taken = set() if name == "test" else self._sources("test")
            size = self.test_size if name == "test" else self.valid_size
            rng, out = self._rng(name), []
            for _ in range(200 * size):  # bounded: a task too small to fill the split fails loudly
                ex = self.sample(rng)
                if ex.source not in taken:
                    taken.add(ex.source)
                    out.append(ex)
                    if len(out) == size:
                        break
            else:
                raise ValueError(f"{name}_size: task {self.name} cannot produce {size} distinct inputs")
            self._held_out[name] = out
        return self._held_out[name]

    def _sources(self, *names: str) -> set[str]:
        return {ex.source for n in names for ex in self.split(n)}

    def train_batch(self, step: int, batch_size: int) -> list[Example]:
        """The training examples for `step`: a function of (seed, step) only."""
        if self._held_out_inputs is None:
            self._held_out_inputs = self._sources("test", "validation")
        held_out = self._held_out_inputs
        rng, out = self._rng("train", step), []
        while len(out) < batch_size:
            ex = self.sample(rng)
            if ex.source not in held_out:
                out.append(ex)
        return out

    # Batching ---------------------------------------------------------------------
    def collate(self, examples: list[Example]) -> Seq2SeqBatch | EncoderBatch:
        """A padded batch of torch tensors (collate_arrays: SequenceTask's or ClassificationTask's)."""
        return self.collate_arrays(examples).to_torch()

    @property
    def max_len(self) -> int:
        """Longest id sequence a model sees, specials included (for positional tables)."""
        return max(self.max_source_tokens, self.max_target_tokens) + 2

    # Metrics ----------------------------------------------------------------------
    def _check_count(self, predictions: list, examples: list[Example]) -> None:
        if len(predictions) != len(examples):
            raise ValueError(
                f"predictions: expected {len(examples)} (one per example), got {len(predictions)}"
            )


class SequenceTask(Task):
    """A task whose target is a sequence (copy, reverse, sort, add): an encoder-decoder learns it."""

    kind = "seq2seq"
    main_metric = "exact_match"

    def collate_arrays(self, examples: list[Example]) -> Seq2SeqBatch:
        enc = self.tokenizer.encode
        return seq2seq_arrays([enc(ex.source) + [EOS] for ex in examples],
                              [enc(ex.target) for ex in examples], BOS, EOS)

    def score(self, predictions: list, examples: list[Example]) -> dict[str, float]:
        """Predictions are generated id lists -> exact_match and token accuracy."""
        self._check_count(predictions, examples)
        return sequence_metrics([list(p) for p in predictions],
                                [self.tokenizer.encode(ex.target) for ex in examples])


class ClassificationTask(Task):
    """A task whose target is one of n_classes labels (listops, brackets): an encoder classifies."""

    kind = "classification"
    main_metric = "accuracy"

    def collate_arrays(self, examples: list[Example]) -> EncoderBatch:
        enc = self.tokenizer.encode
        return encoder_arrays([[BOS] + enc(ex.source) for ex in examples],
                              labels=[ex.label for ex in examples])

    def score(self, predictions: list, examples: list[Example]) -> dict[str, float]:
        """Predictions are class ids -> accuracy."""
        self._check_count(predictions, examples)
        right = sum(int(p) == ex.label for p, ex in zip(predictions, examples, strict=True))
        return {"accuracy": right / max(len(examples), 1)}

    def majority_baseline(self) -> dict[str, float]:
        """Accuracy on the test split of always predicting the most frequent label of a large
        training sample."""
        counts: dict[int, int] = {}
        for ex in self.train_batch(-1, 10_000):  # step -1: never used by training
            counts[ex.label] = counts.get(ex.label, 0) + 1
        majority = max(counts, key=lambda k: counts[k])
        test = self.split("test")
        return {"label": majority, "accuracy": sum(ex.label == majority for ex in test) / len(test)}


def sequence_metrics(predictions: list[list[int]], targets: list[list[int]]) -> dict[str, float]:
    """Exact match and token accuracy of generated ids against target ids.

    Both are compared with the EOS included (a prediction that never stops is wrong),
    position by position; generated ids after the first EOS are ignored.
    """
    return sequence_scores(sequence_counts(predictions, targets))


def sequence_counts(predictions: list[list[int]], targets: list[list[int]]) -> np.ndarray:
    """What sequence_metrics scores: [exact matches, right tokens, target tokens, targets],
    counts that add over windows of predictions."""
    exact = right = total = 0
    for pred, tgt in zip(predictions, targets, strict=True):
        if EOS in pred:
            pred = pred[: pred.index(EOS) + 1]
        tgt = tgt + [EOS]
        exact += pred == tgt
        right += sum(p == t for p, t in zip(pred, tgt, strict=False))
        total += len(tgt)
    return np.array([exact, right, total, len(targets)], dtype=np.int64)


def sequence_scores(counts: np.ndarray) -> dict[str, float]:
    exact, right, total, n = counts.tolist()
    return {"exact_match": exact / max(n, 1), "accuracy": right / max(total, 1)}
