"""Your own data as a run sees it: the held-out splits, the training stream, the tokenizer.

    data = TextData.build(config, run_dir)        # one pass over the file; trains a tokenizer
    for records in data.epoch_pools(epoch): ...   # the training records, streamed in pools

Building reads the training file once: its objective (field names), labels, record count,
the held-out records and the tokenizer's training sample all come from that one pass.
Training reads the file in an order shuffled over all of it, every epoch anew (a file sorted
by label must not train one label at a time): a second pass notes each training record's
line and byte offset (16 bytes a record), and each pool of records is read back from there.
Only the held-out splits and those places are kept in memory.

The split (tformer.training.records): f = min(5%, 1000 / records) of the input texts go to
test, as many to validation: about 5% each, at most about 1,000. Given --valid/--test files,
training records whose input text is in them are skipped.

A run's identity is fixed when it is created: data.json holds the objective, the label
names, the tokenizer's maximum length, the split fraction and each data file's digest.
Resuming reads it back and refuses a data file that changed, naming what changed.
"""

from __future__ import annotations

import copy
import json
from array import array
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np

from tformer.errors import FieldError
from tformer.formats.model_dir import ModelDir, read_model_dir
from tformer.storage.files import write_atomic, write_json_atomic
from tformer.text.tokenizer import Tokenizer
from tformer.training.data_files import FILES, check_files, describe_file, located
from tformer.training.records import (
    Fields,
    Record,
    indexed_records,
    no_records,
    parse_columns,
    read_records,
    records_at,
)
from tformer.training.splits import (
    SMALL,
    SPLIT_CAP,
    SPLIT_FRACTION,
    TokenizerSample,
    file_digest,
    file_stat,
    small_file_fraction,
    split_fraction,
    split_of,
    split_of_unit,
    unit_hash,
)
from tformer.training.subwords import load_backend, pretrained_backend, run_tokenizer, train_tokenizer

POOL = 4096  # records sorted together for length bucketing
HELD_OUT_TODO = ("the run's test and validation records are drawn from it: put back the file it trained on, "
                 "or evaluate another file (tformer eval RUN --data FILE; run.evaluate(data=FILE))")


class TextData:
    """The held-out splits and the training stream of a data run, with its tokenizer.

    fields: the objective's fields (tformer.training.records); labels: classification's label
    names (read from the training file, sorted): the model's class ids index them.
    """

    def __init__(self, config, fields: Fields, tokenizer: Tokenizer, labels: list[str],
                 fraction: float, identity: dict[str, Any] | None = None, pairs: bool = True,
                 tally: dict[str, Any] | None = None, long: str | None = None) -> None:
        self.config, self.fields, self.tokenizer = config, fields, tokenizer
        self.labels, self.fraction = labels, fraction
        self.pairs = pairs  # classification: whether training records had a text_pair
        self.tally = tally or {}  # what the training records say beyond labels (Fields.tally)
        self.long = long  # "windows" or "cut": how a long text is read (None: not settled, cut)
        self.identity = identity or {}
        self.label_ids = {name: i for i, name in enumerate(labels)}
        self.label_counts: dict[str, int] = {}  # records of --data holding each label (--class-weights)
        self._held_out: dict[str, list[Record]] = {}
        self._held_out_keys: set[str] | None = None
        self._places: np.ndarray | None = None  # (N, 2) training records' (line, offset)
        self._stats: dict[str, tuple[int, int] | None] = {}  # path -> (size, mtime) when digested
        # Labels no training record has, and the held-out splits holding them (a new run's scan
        # finds them: the model cannot learn them).
        self.untrained: dict[str, list[str]] = {}
        # The longest a fine-tune's texts may be read (None: any): a new one's model's positions, a
        # saved one's own length (a run saved with a config longer than its tokenizer keeps it).
        self.limit: int | None = None

    # Building -------------------------------------------------------------------------------
    @classmethod
    def build(cls, config, fields: Fields, run_dir: Path | None = None, write: bool = True,
              pretrained: ModelDir | None = None) -> TextData:
        """A new run's data (one pass over the file, a tokenizer trained or loaded), written to
        run_dir as tokenizer.json and data.json; or, where run_dir holds them (resuming),
        the run's own, after checking that the data files are the ones it started with."""
        if run_dir is not None and (run_dir / "data.json").is_file():
            data = cls.from_run(run_dir, config, fields)
            data.check_identity()
            return data
        data, sample = cls._scan(config, fields)
        if config.from_pretrained:  # its directory, read once where the command started
            backend, limit = pretrained_backend(pretrained or read_model_dir(config.from_pretrained))
            if limit and config.max_length > limit and not config.auto_length:  # the user's, not a preset's
                raise FieldError("max_length", f"expected at most {limit} (the maximum length of "
                                 f"{config.from_pretrained}), got {config.max_length}")
            max_length = min(config.max_length, limit) if limit else config.max_length
        else:
            backend = train_tokenizer(sample, config.tokenizer, config.vocab_size, config.lowercase,
                                      fields.specials)
            max_length = config.max_length
        data.tokenizer = run_tokenizer(backend, max_length)
        data.limit = limit if config.from_pretrained else None
        if write and run_dir is not None:
            write_atomic(run_dir / "tokenizer.json", backend.to_str().encode())
            write_json_atomic(run_dir / "data.json", data.describe())
        return data

    def with_max_length(self, max_length: int) -> TextData:
        """This data with its tokenizer truncating at ``max_length`` (a run choosing its length),
        at most at its ``limit``."""
        other = copy.copy(self)
        other.tokenizer = run_tokenizer(self.tokenizer.backend, min(max_length, self.limit or max_length))
        return other

    @classmethod
    def from_run(cls, run_dir: Path, config, fields: Fields) -> TextData:
        """The tokenizer, labels and identity of a run, without reading its data files (its kind's
        ``fields``: data.json names the kind, tformer.kinds reads it first)."""
        path = run_dir / "data.json"
        try:
            info = json.loads(path.read_text())
            config = located(config, info.get("identity") or {})  # found from any folder
            tokenizer = run_tokenizer(load_backend(run_dir / "tokenizer.json"), info["max_length"])
            data = cls(config, fields, tokenizer, list(info["labels"]), float(info["split_fraction"]),
                       info.get("identity"), bool(info.get("pairs", True)),  # older runs: not recorded
                       info.get("tally"), info.get("long"))
            data.label_counts = {str(k): int(v) for k, v in (info.get("label_counts") or {}).items()}
            data.limit = tokenizer.max_length if config.from_pretrained else None
            return data
        except (json.JSONDecodeError, KeyError, TypeError) as e:
            raise FieldError("RUN_DIR", f"{path} is not a tformer data.json ({e})") from None

    def describe(self) -> dict[str, Any]:
        return {"objective": self.fields.objective, "labels": self.labels,
                "max_length": self.tokenizer.max_length, "split_fraction": self.fraction,
                "vocab_size": self.tokenizer.vocab_size, "identity": self.identity, "pairs": self.pairs,
                "tally": self.tally, "long": self.long, "label_counts": self.label_counts}

    @classmethod
    def _scan(cls, config, fields: Fields) -> tuple[TextData, list[str]]:
        """One pass over the training file: labels, the held-out records (both hashed splits'
        candidates), and the tokenizer's sample (texts of training records)."""
        path, seed = Path(config.data), config.seed
        data = cls(config, fields, None, [], SPLIT_FRACTION)  # type: ignore[arg-type]
        given = {s: list(data.read_file(p, check_labels=False))  # --valid/--test files
                 for s, p in (("validation", config.valid), ("test", config.test)) if p is not None}
        given_keys = {fields.input_key(r) for records in given.values() for r in records}
        hashed = {s for s, p in (("validation", config.valid), ("test", config.test)) if p is None}
        labels: Counter[str] = Counter()  # records holding each label
        trained: set[str] = set()  # labels of records that are surely training records
        tally: dict[str, Any] = {}  # Fields.tally of the training records
        pairs = False
        candidates: list[tuple[float, Record]] = []  # (u, record) that may be held out
        sample = TokenizerSample(seed)
        n = n_given = 0
        for line_no, record in data._checked(path):
            n += 1
            labels.update(fields.labels_of(record))
            pairs = pairs or "text_pair" in record
            key = fields.input_key(record)
            if key in given_keys:
                n_given += 1
                continue
            u = unit_hash(key, seed)
            # The final fraction is at most split_fraction(n so far), or small_file_fraction's for a
            # small file: nothing above it can be held out.
            if hashed and (n <= SMALL or u < 2 * split_fraction(n)):
                candidates.append((u, dict(record, line=str(line_no))))
                if n == SMALL + 1 or (len(candidates) > 4 * SPLIT_CAP and n % 1024 == 0):
                    dropped = [c for c in candidates if c[0] >= 2 * split_fraction(n)]
                    trained.update(label for _, r in dropped for label in fields.labels_of(r))
                    for _, r in dropped:
                        fields.tally(tally, r)
                    candidates = [c for c in candidates if c[0] < 2 * split_fraction(n)]
            else:
                trained.update(fields.labels_of(record))
                fields.tally(tally, record)
            sample.offer(n, key, u, fields.texts_of(record))
        if n == 0:
            raise ValueError(f"{path}: expected at least one record, got {no_records(path, config.format)}")
        if given and n == n_given:  # training skips records whose input a given file holds
            files = ", ".join(f"--{s} {p}" for s, p in (("valid", config.valid), ("test", config.test)) if p)
            raise ValueError(f"{path}: expected training records, got none: the input text of each of its "
                             f"{n} record(s) is held out by {files}")
        if len(labels) < fields.min_labels:
            raise ValueError(f"{path}: {fields.label}: expected at least {fields.min_labels} distinct "
                             f"labels, got {sorted(labels)}")
        data.labels, data.pairs, data.label_counts = sorted(labels), pairs, dict(sorted(labels.items()))
        data.label_ids = {name: i for i, name in enumerate(data.labels)}
        data.fraction = f = split_fraction(n)
        if hashed and n <= SMALL:
            data.fraction = f = small_file_fraction([u for u, _ in candidates], f, hashed)
        for split, records in given.items():
            data._check_labels(config.valid if split == "validation" else config.test, records)
            data._held_out[split] = data._nonempty(split, records)
        for split in hashed:
            records = [r for u, r in candidates if split_of_unit(u, f) == split]
            data._held_out[split] = data._nonempty(split, records)
        trained.update(label for u, r in candidates if split_of_unit(u, f) == "train"
                       for label in fields.labels_of(r))
        for u, r in candidates:
            if split_of_unit(u, f) not in hashed:  # (a split given as a file: its share trains)
                fields.tally(tally, r)
        data.tally = tally
        data.untrained = {label: sorted({s for s, rs in data._held_out.items() for r in rs
                                         if label in fields.labels_of(r)})
                          for label in sorted(set(labels) - trained)}
        data.identity = {name: describe_file(p, data._digest(p))
                         for name, p in (("data", config.data), ("valid", config.valid),
                                         ("test", config.test)) if p is not None}
        data.identity["data"]["records"] = n
        texts = [t for u, ts in sample.records() if not (hashed and split_of_unit(u, f) in hashed)
                 for t in ts]
        return data, texts

    def train_record_estimate(self) -> int | None:
        """About how many training records an epoch has (the held-out share taken out)."""
        n = self.identity.get("data", {}).get("records")
        if n is None:
            return None
        hashed = sum(p is None for p in (self.config.valid, self.config.test))
        return max(int(n * (1 - hashed * self.fraction)), 1)

    def check_identity(self, names: tuple[str, ...] = FILES) -> None:
        """Refuse data files (of ``names``: data, valid, test) that differ from those the run
        started with."""
        check_files(self.config, self.identity, self._stats,
                    "resume with the file it trained on, or start a new run", names=names)

    def check_unchanged(self, thorough: bool = True) -> None:
        """Refuse data files that changed while the run trained (its batches are read from the
        training file as it goes, so they would mix old and new records). Not `thorough`: only
        files whose size or modification time moved are read again (what a validation checks;
        the results are checked whole before they are published)."""
        check_files(self.config, self.identity, self._stats,
                    "its batches would mix old and new records, so no results were published (the last "
                    "checkpoint is kept); start a new run", when="while the run trained", thorough=thorough)

    def _digest(self, path: str | Path) -> str:
        """The file's digest, noting its size and modification time as they were then."""
        self._stats[str(path)], digest = file_stat(path), file_digest(path)
        return digest

    # Splits -----------------------------------------------------------------------------
    def _given_keys(self) -> set[str]:
        c = self.config
        given = [s for s, p in (("validation", c.valid), ("test", c.test)) if p is not None]
        return {self.fields.input_key(r) for s in given for r in self.held_out(s)} if given else set()

    def _nonempty(self, split: str, records: list[Record]) -> list[Record]:
        if not records:
            path = self.config.valid if split == "validation" else self.config.test
            if path is not None:  # a file given for it holds none
                raise ValueError(f"{path}: expected at least one record, got "
                                 f"{no_records(path, self.config.format)}")
            raise ValueError(f"{split}: expected at least one record, got none (the split of "
                             f"{self.config.data} is empty: add --valid/--test files)")
        return records

    def held_out(self, split: str) -> list[Record]:
        """The "validation" or "test" records (each with its "line" for error messages)."""
        if split not in self._held_out:
            path = self.config.valid if split == "validation" else self.config.test
            if path is not None:
                check_files(self.config, self.identity, self._stats, HELD_OUT_TODO,
                            names=("valid" if split == "validation" else "test",), thorough=False)
                records = list(self.read_file(path))
            else:
                train = Path(self.config.data)
                # A run's own split of a file edited since it trained would be other records.
                check_files(self.config, self.identity, self._stats, HELD_OUT_TODO, names=("data",),
                            thorough=False)
                records = [dict(r, line=str(line)) for line, r in self._checked(train)
                           if split_of(self.fields.input_key(r), self.config.seed, self.fraction) == split]
            self._held_out[split] = self._nonempty(split, records)
        return self._held_out[split]

    def read_file(self, path: str | Path, check_labels: bool = True) -> Iterator[Record]:
        """Checked records of a valid/test/eval file (unknown labels are errors)."""
        for line, record in self._checked(Path(path)):
            record = dict(record, line=str(line))
            if check_labels:
                self._check_labels(path, [record])
            yield record

    def check_records(self, rows, where: str) -> list[Record]:
        """Records given as Python dicts, checked like a file's lines (where[i] names them); with
        the objective's field names or the run's --columns, as a file."""
        out = []
        rename = parse_columns(self.config.columns)
        for i, raw in enumerate(rows):
            if not isinstance(raw, dict):
                raise ValueError(f"{where}[{i}]: expected a dict of fields, got {type(raw).__name__}")
            if rename and set(rename) <= set(raw):
                raw = {rename.get(k, k): v for k, v in raw.items()}
            record = dict(self.fields.check(f"{where}[{i}]", raw), line=str(i))
            self._check_labels(where, [record])
            out.append(record)
        return out

    def _check_labels(self, path, records: list[Record]) -> None:
        for record in records:
            for label in self.fields.labels_of(record):
                if label not in self.label_ids:
                    raise ValueError(f"{path}:{record['line']}: {self.fields.label} {label!r} is not one of "
                                     f"the training labels ({', '.join(self.labels)})")

    def _checked(self, path: Path) -> Iterator[tuple[int, Record]]:
        for line_no, record in read_records(path, self._columns_of(path), self.config.format):
            yield line_no, self.fields.check(f"{path}:{line_no}", record)

    def _columns_of(self, path: Path) -> str | None:
        """The renaming a held-out or eval file needs: the run's --columns where the file has
        those columns, none where it already has the objective's own field names."""
        columns = self.config.columns
        if not columns:
            return None
        for line_no, record in read_records(path, None, self.config.format):
            theirs = set(parse_columns(columns))
            if theirs <= set(record):
                return columns
            if set(self.fields.required) <= set(record):
                return None
            raise ValueError(f"{path}:{line_no}: expected the fields {', '.join(self.fields.required)} or "
                             f"the run's --columns {columns!r}, got {', '.join(sorted(record)) or 'none'}")
        return None  # an empty file: its own error follows

    def _indexed_train_records(self) -> Iterator[tuple[int, int, Record]]:
        """(line number, byte offset, record) of each training record (the file's records minus
        the held-out ones), in file order."""
        c = self.config
        if self._held_out_keys is None:
            self._held_out_keys = self._given_keys()
        hashed = {s for s, p in (("validation", c.valid), ("test", c.test)) if p is None}
        for line_no, offset, record in indexed_records(Path(c.data), c.columns, c.format):
            record = self.fields.check(f"{c.data}:{line_no}", record)
            key = self.fields.input_key(record)
            if key in self._held_out_keys:
                continue
            if hashed and split_of(key, c.seed, self.fraction) in hashed:
                continue
            yield line_no, offset, record

    def train_inputs(self) -> Iterator[str]:
        """The input text (the key the split hashes) of each training record, in file order."""
        return (self.fields.input_key(r) for _, _, r in self._indexed_train_records())

    def _train_places(self) -> np.ndarray:
        """(N, 2) int64: each training record's (line number, byte offset), found by one pass
        over the file the first time an epoch is asked for (16 bytes a record)."""
        if self._places is None:
            places = array("q")
            for line_no, offset, _ in self._indexed_train_records():
                places.extend((line_no, offset))
            if not places:
                raise ValueError(f"{self.config.data}: no training records left after the split")
            self._places = np.frombuffer(places, dtype=np.int64).reshape(-1, 2)
        return self._places

    def epoch_pools(self, epoch: int = 0) -> Iterator[list[Record]]:
        """One pass over the training records in pools of POOL (sorted by length together),
        in an order shuffled over the whole file for each (seed, epoch): a file sorted by
        label, length or source still gives every pool a sample of all of it. Only the
        records' places are kept in memory; each pool is read back from the file."""
        c = self.config
        places = self._train_places()
        order = np.random.default_rng([c.seed, epoch]).permutation(len(places))  # (N,)
        for start in range(0, len(order), POOL):
            pick = places[np.sort(order[start : start + POOL])]  # file order: reads go forward
            yield [self.fields.check(f"{c.data}:{line_no}", record)
                   for line_no, record in records_at(c.data, c.columns, pick.tolist(), c.format)]
