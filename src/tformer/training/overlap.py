"""How much of a file a run has seen: records whose input text is one it trained on (or
validated on: the validation split chose its checkpoint).

    seen = Seen.of(data)                   # one pass over the run's training file
    counts = seen.count(records, key)      # {"records": 200, "trained_on": 171, "in_validation": 9}

`tformer eval RUN --data FILE` says so: a score on records the model trained on says what it
memorised, not how it does on new text. Each record is matched by its input text (the
key the run's split hashes: tformer.training.records), so a file cut from the training file,
shuffled or mixed with new records is measured as well as the training file itself. The
training records are found as the run found them (its seed, split fraction and held-out
files), from the training file where it is unchanged (its digest), or from FILE itself when
FILE is that file. The keys are kept as 8-byte hashes: 8 MB for a million training records.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any

import numpy as np

from tformer.training.splits import file_digest


def _hashes(keys: Iterable[str]) -> np.ndarray:
    """(N,) int64 hashes of keys, sorted (Python's str hash: stable within this process)."""
    return np.unique(np.fromiter((hash(k) for k in keys), dtype=np.int64))


@dataclass(frozen=True)
class Seen:
    """The hashed input texts of a run's training and validation records; ``why_not``: why
    none could be read (the training file gone or changed, and FILE is not it)."""

    train: np.ndarray | None
    validation: np.ndarray | None
    why_not: str | None = None

    @classmethod
    def of(cls, data, file: str | os.PathLike | None = None) -> Seen:
        """What `data` (the run's TextData) trained and validated on; ``file``: the file to be
        measured, taken as the training file where its digest is that file's."""
        saved = data.identity.get("data") or {}
        try:
            data.check_identity(names=("data",))
        except ValueError as e:
            if file is None or saved.get("blake2b") != _digest(file):
                return cls(None, None, str(e).rsplit(";", 1)[0])
            # FILE is the training file, moved or named another way: read the run's records from it
            data = type(data)(data.config.replace(data=os.fspath(file)), data.fields, data.tokenizer,
                              data.labels, data.fraction, data.identity, data.pairs)
        try:
            train = _hashes(data.train_inputs())
        except (OSError, ValueError) as e:  # an older run's file (no digest kept) gone or changed
            return cls(None, None, str(e))
        try:
            validation = _hashes(data.fields.input_key(r) for r in data.held_out("validation"))
        except (OSError, ValueError):  # its --valid file gone or changed: training alone
            validation = None
        return cls(train, validation)

    def count(self, records: Iterable, key: Callable[[Any], str]) -> dict[str, int]:
        """{"records": how many, "trained_on": those whose input text (``key(record)``) the run
        trained on, "in_validation": those only in its validation split}, of records read once."""
        found = np.fromiter((hash(key(r)) for r in records), dtype=np.int64)
        trained = np.isin(found, self.train) if self.train is not None else np.zeros(len(found), bool)
        validated = (np.isin(found, self.validation) & ~trained if self.validation is not None
                     else np.zeros(len(found), bool))
        return {"records": len(found), "trained_on": int(trained.sum()),
                "in_validation": int(validated.sum())}


def _digest(file: str | os.PathLike) -> str | None:
    try:
        return file_digest(file)
    except OSError:
        return None
