"""What a label column may hold, for the kinds that read one (classification, multi-label).

    FIELDS = LabelFields("classification", ("text", "label"), ...)   # one class name a record
    label_notes(labels)          # what a run's first line says of them
    frequency_weights(counts)    # a loss's weight per label, from the labels' counts

A label is a class name, never silently something else. A fractional number (0.73, or the text
"0.73", in JSONL or CSV) is refused naming the `score` field, which trains regression. Whole
numbers stay class names ("1", "2", ... as ``label_name`` reads 1, 1.0 and "1" alike), and the
run's first line says they look numeric. Labels that look like several joined in one cell
("news;sport" beside "sport") are warned about, naming --label-separator, which reads them as
several labels a record (multi-label): they are not refused, since a class name may hold a comma
("Arts, Music"), and a refusal would need a switch to get past it; the warning costs nothing and
says the one flag that reads them otherwise. A list is multi-label's (``Fields.claims``).
"""

from __future__ import annotations

import math
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import torch
from torch import Tensor

from tformer.training.records import Fields

# A number written out (JSON's grammar, and what a CSV cell holding one looks like).
NUMBER = re.compile(r"[+-]?(\d+(\.\d*)?|\.\d+)([eE][+-]?\d+)?")
JOINERS = (";", "|", ",")  # what joins several labels in one cell, as files written by hand do


def fractional(value: Any) -> bool:
    """Whether a label is a number with a fraction: 0.73, or the text "0.73" (never a class)."""
    if isinstance(value, float):
        return math.isfinite(value) and not value.is_integer()
    if isinstance(value, str) and NUMBER.fullmatch(value.strip()):
        number = float(value)
        return math.isfinite(number) and not number.is_integer()
    return False


@dataclass(frozen=True)
class LabelFields(Fields):
    """A record's one class label: a name or a whole number; a list (several labels: multi-label)
    and a fraction (a score: regression) are other kinds, never read as a class here."""

    def claims(self, record: Mapping[str, Any], options: Mapping[str, Any]) -> bool:
        return (super().claims(record, options) and not isinstance(record.get(self.label), list)
                and options.get("label_separator") is None)

    def check(self, where: str, record: dict[str, Any]) -> dict[str, str]:
        value = record.get(self.label)
        if isinstance(value, list):
            raise ValueError(f"{where}: {self.label}: expected a class name (one, as the file's first record "
                             f"has), got a list {str(value)[:60]}; for several labels per record give every "
                             "record a list (multi-label)")
        if fractional(value):
            raise ValueError(f"{where}: {self.label}: expected a class name, got the fractional number "
                             f"{value!r}; numbers to predict are a `score` field, which trains regression "
                             f"(rename the column: --columns {self.label}=score)")
        return super().check(where, record)


def joined_labels(labels: Sequence[str]) -> tuple[str, list[str]] | None:
    """(the joiner, the labels holding it) where labels look like several joined in one cell: a
    part of a label joined by one of JOINERS recurs, in another such label or as a label of its
    own ("news;sport" beside "sport", or beside "sport;tech"); else None ("Arts, Music" alone is
    a class name)."""
    for joiner in JOINERS:
        names = [name for name in labels if joiner in name and all(p.strip() for p in name.split(joiner))]
        parts = [p.strip() for name in names for p in set(name.split(joiner))]
        alone = {name.strip() for name in labels if joiner not in name}
        if names and (len(set(parts)) < len(parts) or alone & set(parts)):
            return joiner, names
    return None


def label_notes(labels: Sequence[str]) -> list[str]:
    """The run's first line's notes on its label names: numbers read as classes; labels that look
    joined (``joined_labels``)."""
    notes = []
    if labels and all(NUMBER.fullmatch(name.strip()) for name in labels):
        notes.append(f"labels look numeric: {len(labels)} values, read as classes; a `score` field "
                     "trains regression")
    joined = joined_labels(labels)
    if joined is not None:
        joiner, names = joined
        notes.append(f"warning: labels look joined: {len(names)} of {len(labels)} labels hold {joiner!r} "
                     f"(e.g. {names[0]!r}), each read as one class; --label-separator {joiner!r} reads them "
                     "as several labels a record (multi-label)")
    return notes


# --class-weights (benchmarks/class_weights.py, benchmarks/README.md "Class weights"): `weighted`
# weights the loss towards rare labels; `auto` does where that measured better on macro-F1:
# - one label a record: the cross-entropy weighted by frequency_weights(counts, WEIGHT_POWER)
#   changed test macro-F1 by -0.001 on average over 6 skewed real sets x 3 seeds (-0.015 to
#   +0.029 a set; the full inverse was worse everywhere) and lowered accuracy on most: `auto`
#   leaves it unweighted and says so where the labels are skewed SKEW:1 or more;
# - several labels a record: each label's positives weighted by ((n - n_l) / n_l) **
#   POSITIVE_POWER, at most MAX_POSITIVE_WEIGHT, raised macro-F1 by 0.008, 0.045 and 0.067 (20,
#   50 and 100 tags, 3 seeds; micro-F1 too): `auto` weights where the rarest label is in at most
#   1 / LABEL_SKEW of the records.
SKEW, WEIGHT_POWER = 5.0, 0.5
AUTO_WEIGHTS_ONE_LABEL = False  # what `auto` does for one label a record (measured: no gain)
LABEL_SKEW, POSITIVE_POWER, MAX_POSITIVE_WEIGHT = 10.0, 0.5, 30.0


def class_weights(choice: str, counts: Sequence[int]) -> tuple[Tensor | None, str]:
    """(the cross-entropy's weight per label (C,) or None, what the run's first line says of it)
    for --class-weights ``choice`` and the labels' records ``counts`` (none, or a zero: no
    weights)."""
    skew = max(counts) / min(counts) if counts and min(counts) > 0 else 1.0
    if choice == "none" or (choice == "auto" and skew < SKEW) or skew <= 1.0:
        return None, ""
    if choice == "auto" and not AUTO_WEIGHTS_ONE_LABEL:
        return None, (f"labels skewed {skew:.0f}:1, loss unweighted (weighting it towards rare labels "
                      "measured no better on macro-F1; --class-weights weighted weights it)")
    return frequency_weights(counts, WEIGHT_POWER), (f"loss weighted towards rare labels (labels skewed "
                                                      f"{skew:.0f}:1; --class-weights none turns it off)")


def positive_weights(choice: str, counts: Sequence[int], records: int | None) -> tuple[Tensor | None, str]:
    """(binary cross-entropy's pos_weight (C,) or None, what the run's first line says of it) for
    --class-weights ``choice``, the labels' records ``counts`` and the ``records`` in all."""
    skew = records / min(counts) if records and counts and min(counts) > 0 else 1.0
    if choice == "none" or (choice == "auto" and skew < LABEL_SKEW) or skew <= 1.0:
        return None, ""
    n = torch.tensor([float(c) for c in counts])  # (C,)
    weights = ((records - n).clamp(min=1.0) / n).pow(POSITIVE_POWER).clamp(1.0, MAX_POSITIVE_WEIGHT)
    return weights, (f"each label's positives weighted up to {weights.max().item():.0f}x (the rarest label "
                     f"is in 1 of {skew:.0f} records; --class-weights none turns it off)")


def frequency_weights(counts: Sequence[int], power: float) -> Tensor:
    """A loss's weight per label (C,) from its records ``counts``: (n / (C n_c)) ** power
    (power 1: scikit-learn's "balanced"; 0.5: its square root), scaled so that the records' mean
    weight is 1 (the learning rate means what it meant unweighted)."""
    n = torch.tensor([float(c) for c in counts])  # (C,)
    weights = (n.sum() / (len(n) * n)) ** power
    return weights * n.sum() / (weights * n).sum()
