"""How an evaluation streamed a window at a time (tformer.training.objective.Objective.evaluate_stream)
adds up: an objective's Tally."""

from __future__ import annotations

from abc import ABC, abstractmethod
from typing import Any


class Tally(ABC):
    """The metrics and trivial baseline of examples scored a window at a time
    (Objective.evaluate_stream): the same numbers as score() and baseline() of them all. An
    objective whose metrics are sums of counts keeps only the counts, so that memory does not
    grow with the examples."""

    @abstractmethod
    def add(self, examples: list, preds: list) -> None:
        """A window of examples and their predictions."""

    @abstractmethod
    def metrics(self) -> dict[str, float]:
        """score()'s metrics of every example added."""

    @abstractmethod
    def baseline(self) -> dict[str, Any]:
        """baseline() of every example added."""


class KeptTally(Tally):
    """Every window kept and scored together at the end: for metrics that need them all (an
    embedding's: each anchor ranks among every positive)."""

    def __init__(self, objective) -> None:  # (a tformer.training.objective.Objective)
        self.objective = objective
        self.examples: list = []
        self.preds: list = []

    def add(self, examples: list, preds: list) -> None:
        self.examples += examples
        self.preds += preds

    def metrics(self) -> dict[str, float]:
        return self.objective.score(self.examples, self.preds)[0]

    def baseline(self) -> dict[str, Any]:
        interval = self.objective.paired_interval(self.examples, self.preds) if self.examples else None
        paired = {} if interval is None else {"paired_interval": list(interval)}
        return {**self.objective.baseline(self.examples), **paired}
