"""A persistent index of a corpus's embeddings (or of vectors a user brings), searched exact or
approximate.

    build_index(st, MODEL_DIR, corpus, INDEX)          # tformer.embeddings.index_build
    build_index_from_vectors("V.npy", INDEX, texts="lines.txt")
    Index(INDEX).search(queries, k)                     # (scores, rows)

An index directory holds ``vectors.npy`` (N, D float32, L2-normalised), ``index.json`` (how it
was built: the model directory and a hash of its files, or the vectors file it was given; the
approximate index's parameters), ``texts.jsonl`` ({"line", "text"} per row; absent for vectors
given without --texts) and, when approximate, ``ann.faiss`` (tformer.embeddings.ann). It is
written as one unit (built beside, in ``.NAME.build``, then renamed) by one process at a time
(tformer.storage.locks), and a search refuses it if the model it is searched with is not the one
that built it, or if a file of it does not hold what index.json says. An exact search streams
the vectors past a running top-k (memory grows with the block size and k, never with N); an
approximate one reads the lists and the candidates' vectors through memory maps.
"""

from __future__ import annotations

import hashlib
import json
import os
from collections.abc import Iterator
from pathlib import Path

import numpy as np

from tformer.embeddings.ann import ANN_FILE, AnnSearch, Rows
from tformer.embeddings.stream import BLOCK, TopK, check_queries
from tformer.errors import as_path
from tformer.storage.checkpoint_names import CHECKPOINTS

INDEX_FILE, VECTORS_FILE, TEXTS_FILE = "index.json", "vectors.npy", "texts.jsonl"
BUILD_PROGRESS = "progress.json"  # in the build folder: what it embeds, and how far it got
INDEX_FORMAT = 2  # 2: texts optional, model optional (--vectors), an approximate index
READ_FORMATS = (1, 2)


# A run's records beside its model, not read to embed (`eval --data` appends to metrics.jsonl)
RUN_RECORDS = {"metrics.jsonl", "curves.png", "confusion.png", "data.json", "best.safetensors", CHECKPOINTS}


def model_identity(model_dir: str | Path) -> str:
    """A hash of the model directory's files (config, weights, tokenizer, pooling), not of a
    run's records (RUN_RECORDS) nor of hidden files (a run's lock holds its user's pid)."""
    root = Path(model_dir)
    digest = hashlib.sha256()
    for path in sorted(p for p in root.rglob("*") if p.is_file() and _embeds(p.relative_to(root).parts)):
        digest.update(str(path.relative_to(root)).encode() + b"\0")
        with path.open("rb") as f:
            while block := f.read(1 << 20):
                digest.update(block)
    return digest.hexdigest()[:16]


def _embeds(parts: tuple[str, ...]) -> bool:
    return parts[0] not in RUN_RECORDS and not any(part.startswith(".") for part in parts)


def check_replaceable(out: Path) -> None:
    """`out` is new, or an index an earlier build wrote, holding its files only: a rebuild swaps
    the folder whole, so anything else in it would be deleted (a folder holding a file that
    happened to be named index.json, and the user's README beside it, was)."""
    if not out.exists() or (out.is_dir() and not any(out.iterdir())):
        return  # new, or an empty folder (`mkdir INDEX` first): nothing to lose, as for an export
    ours = {INDEX_FILE, VECTORS_FILE, TEXTS_FILE, ANN_FILE}
    others = sorted(p.name for p in out.iterdir() if p.name not in ours) if out.is_dir() else []
    if not out.is_dir() or others or not _is_index_json(out / INDEX_FILE):
        what = f"holds {', '.join(others[:3])}{' ...' if len(others) > 3 else ''}" if others else \
            "is not a tformer index"
        raise ValueError(f"--out {out}: exists and {what}; a rebuild replaces an index folder whole: "
                         "expected a new path or an index `tformer index build` wrote")


def _is_index_json(path: Path) -> bool:
    try:
        meta = json.loads(path.read_text())
    except (OSError, UnicodeDecodeError, ValueError):
        return False
    return isinstance(meta, dict) and meta.get("format") in READ_FORMATS


# index.json's fields a search reads, and their types (a hand-edited one is one line, not a KeyError)
_META_TYPES = {"n": (int, "an integer"), "dim": (int, "an integer")}
_MODEL_TYPES = {"model_dir": (str, "a string"), "model_id": (str, "a string")}  # unless built from vectors


class Index:
    """A built index: its metadata, and a top-k search over its vectors (exact: streamed; or
    approximate where it was built so)."""

    def __init__(self, path: str | Path) -> None:
        self.path = as_path(path, "path", "an index directory")
        self._ann = None
        try:
            # Its files opened together, through the folder, and read from these handles: a
            # rebuild that swaps the folder during a search leaves it reading the index it opened
            # (it read the old vectors, then the new texts: every result named another line).
            folder = os.open(self.path, os.O_RDONLY | os.O_DIRECTORY)
            try:
                def opened(name):
                    return open(name, "rb", opener=lambda n, flags: os.open(n, flags, dir_fd=folder))

                self.files = {name: opened(name) for name in (INDEX_FILE, VECTORS_FILE)}
                self.meta = json.loads(self.files[INDEX_FILE].read())
                if isinstance(self.meta, dict):
                    for name, wanted in ((TEXTS_FILE, self.meta.get("texts", True)),
                                         (ANN_FILE, bool(self.meta.get("ann")))):
                        if wanted:
                            self.files[name] = opened(name)
            finally:
                os.close(folder)
        except (OSError, json.JSONDecodeError, UnicodeDecodeError) as e:
            raise ValueError(f"INDEX {self.path}: not a readable tformer index ({e})") from None
        if not isinstance(self.meta, dict) or self.meta.get("format") not in READ_FORMATS:
            raise ValueError(f"INDEX {self.path / INDEX_FILE}: expected format {INDEX_FORMAT}")
        types = {**_META_TYPES, **(_MODEL_TYPES if self.has_model else {})}
        for key, (kind, named) in types.items():
            value = self.meta.get(key)
            if not isinstance(value, kind) or isinstance(value, bool):
                raise ValueError(f"INDEX {self.path / INDEX_FILE}: {key}: expected {named}, got "
                                 f"{value!r} (edited or damaged: rebuild the index)")

    @staticmethod
    def is_index(path: str | Path) -> bool:
        return (Path(path) / INDEX_FILE).is_file()

    @property
    def has_model(self) -> bool:
        """Built by a model from a corpus (else from vectors: `index build --vectors`)."""
        return self.meta.get("vectors") is None

    @property
    def has_texts(self) -> bool:
        return TEXTS_FILE in self.files

    @property
    def kind(self) -> str:
        return (self.meta.get("ann") or {}).get("kind", "exact")

    def check_model(self, model_dir: str | Path) -> None:
        """Refuse a model other than the one that built the index (an index of vectors names
        none: the caller vouches for the model it embeds queries with)."""
        if not self.has_model:
            return
        if not Path(model_dir).is_dir():  # moved or mistyped: its identity would hash nothing
            raise ValueError(f"INDEX {self.path}: the model {model_dir}: no such directory; pass --model "
                             f"with the one the index was built with ({self.meta['model_dir']})")
        got = model_identity(model_dir)
        if got != self.meta["model_id"]:
            raise ValueError(
                f"INDEX {self.path}: built with the model {self.meta['model_dir']} "
                f"(id {self.meta['model_id']}), but {model_dir} has id {got}; "
                f"rebuild it with `tformer index build {model_dir} --corpus ... --out {self.path}`"
            )

    def blocks(self, size: int | None = None) -> Iterator[tuple[int, np.ndarray]]:
        """(first row, (b, D) vectors), read with plain reads (not a memory map), so memory
        stays flat however large the index is."""
        path, f = self.path / VECTORS_FILE, self.files[VECTORS_FILE]
        f.seek(0)
        try:
            version = np.lib.format.read_magic(f)
            read_header = (np.lib.format.read_array_header_1_0 if version == (1, 0)
                           else np.lib.format.read_array_header_2_0)
            shape, fortran, dtype = read_header(f)
        except ValueError as e:
            raise ValueError(f"INDEX {path}: expected a .npy array, got {e}") from None
        if fortran:  # read row by row below: a column-major file would be read as garbage
            raise ValueError(f"INDEX {path}: expected a row-major (C order) array, got Fortran order "
                             "(damaged: rebuild the index)")
        if shape != (self.meta["n"], self.meta["dim"]) or dtype != np.float32:
            raise ValueError(f"INDEX {path}: expected float32 {self.meta['n']} x "
                             f"{self.meta['dim']}, got {dtype} {shape}")
        n, d = shape
        expected, got = f.tell() + n * d * 4, os.fstat(f.fileno()).st_size
        if got != expected:
            raise ValueError(f"INDEX {path}: expected {expected} bytes ({n} x {d} float32), "
                             f"got {got} (truncated or damaged: rebuild the index)")
        size = size or BLOCK
        for first in range(0, n, size):
            b = min(size, n - first)
            yield first, np.fromfile(f, dtype=np.float32, count=b * d).reshape(b, d)

    def texts(self, rows: set[int]) -> dict[int, tuple[int, str]]:
        """{row: (line number, text)} for the wanted rows, one streamed pass."""
        path, f = self.path / TEXTS_FILE, self.files[TEXTS_FILE]
        f.seek(0)
        found: dict[int, tuple[int, str]] = {}
        count = 0
        for row, raw in enumerate(f):
            count += 1
            if row in rows:
                line = raw.decode("utf-8", errors="replace")  # a cut character: the count
                try:
                    record = json.loads(line)
                    found[row] = (int(record["line"]), str(record["text"]))
                except (ValueError, KeyError, TypeError):
                    raise ValueError(f"INDEX {path}:{row + 1}: expected a JSON object with "
                                     f"\"line\" and \"text\", got {line[:60]!r} (damaged: "
                                     "rebuild the index)") from None
        if count != self.meta["n"]:
            raise ValueError(f"INDEX {path}: expected {self.meta['n']} lines (index.json), got "
                             f"{count} (truncated or damaged: rebuild the index)")
        return found

    def search(self, queries: np.ndarray, k: int, exact: bool = False) -> tuple[np.ndarray, np.ndarray]:
        """(scores, rows), each (Q, min(k, n)): the k rows nearest each query, best first. An
        approximate index answers by its parameters (index.json: recall@10 >= 0.95 on a held-out
        sample) unless ``exact``; a query whose probed lists held too few rows gets rows -1."""
        check_queries(queries, self.meta["dim"])
        TopK(queries[:0], k)  # k checked as an exact search checks it
        if self.kind != "exact" and not exact:
            return self._approximate().search(queries, k)
        best = TopK(queries, k)
        for first, block in self.blocks():
            best.add(block, first, normalized=True)
        return best.result()

    def _approximate(self):
        if self._ann is None:
            next(self.blocks(1), None)  # vectors.npy's header and size checked
            n, d = self.meta["n"], self.meta["dim"]
            fd = self.files[ANN_FILE].fileno()
            path = f"/proc/self/fd/{fd}" if os.path.isdir("/proc/self/fd") else str(self.path / ANN_FILE)
            self._ann = AnnSearch(path, self.meta["ann"], Rows(self.files[VECTORS_FILE], n, d))
        return self._ann
