"""A persistent index of a corpus's embeddings (streamed by tformer.embeddings.stream).

    build_index(st, MODEL_DIR, corpus, INDEX); Index(INDEX).search(st.encode(queries), k)

Memory grows with the chunk size and k, never with the number of lines: a build embeds and
writes a chunk at a time, and a search streams the vectors past a running top-k. Under torchrun
the chunks are shared out among the ranks and written by rank 0 (tformer.embeddings.shards).

An index directory holds ``vectors.npy`` (N, D float32, L2-normalised), ``texts.jsonl``
({"line", "text"} per corpus line) and ``index.json`` (the model directory, a hash of its
files, how it embedded). It is written as one unit (built beside, in ``.NAME.build``, then
renamed) by one process at a time (tformer.storage.locks), and a search refuses it if the
model it is searched with is not the one that built it, or if a file of it does not hold what
index.json says. A build that is killed, interrupted or runs out of disk resumes from its last
recorded chunk when run again with the same model, corpus and options (``BUILD_PROGRESS``
records them), as ``tformer embed --out`` does; with others it starts over.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np

from tformer.embeddings.stream import BLOCK, TopK, check_queries, embed_chunks, progress_bar, unit
from tformer.errors import as_path
from tformer.storage.checkpoint_names import CHECKPOINTS
from tformer.storage.files import (
    dir_mode,
    durable_step,
    file_mode,
    fsync_dir,
    json_bytes,
    publish_dir,
    replaced_path,
    write_json_atomic,
)
from tformer.storage.locks import leftovers, output_lock
from tformer.text.lines import TextLines

INDEX_FILE, VECTORS_FILE, TEXTS_FILE = "index.json", "vectors.npy", "texts.jsonl"
BUILD_PROGRESS = "progress.json"  # in the build folder: what it embeds, and how far it got
INDEX_FORMAT = 1


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


def build_index(st, model_dir: str | Path, corpus: str | Path, out: str | Path,
                batch_size: int = 32, truncation: bool = True, max_length: int | None = None,
                show_progress: bool | None = None, rank: int = 0, world: int = 1,
                dtype: str | None = None) -> dict[str, Any] | None:
    """Embed the corpus once into an index directory at `out` (written as one unit, under
    a lock: a second build of the same `out` is refused while this one runs; an interrupted
    one resumes). With several ranks (torchrun) each embeds its share of the corpus and rank 0
    writes the index; the other ranks return None. ``dtype``: the precision ``st`` runs in
    (index.json records it)."""
    if rank != 0:
        from tformer.training.distributed import broadcast_int

        lines = corpus if isinstance(corpus, TextLines) else TextLines(corpus, "--corpus")
        done = broadcast_int(0, world)  # rank 0's lines already embedded
        for _ in embed_chunks(st, ((k, t) for k, t in lines if k > done), rank=rank, world=world,
                              where=lines.at, batch_size=batch_size, truncation=truncation,
                              show_progress=False):
            pass  # rank 0 gathers and writes
        return None
    out = replaced_path(out)  # a link's target is rebuilt: the link stays a link
    check_replaceable(out)
    lines = corpus if isinstance(corpus, TextLines) else TextLines(corpus, "--corpus")
    n = lines.count()
    if n == 0:
        raise ValueError(f"--corpus {lines.name}: expected at least one line, got none")
    out.parent.mkdir(parents=True, exist_ok=True)
    with output_lock(out, "--out"):
        _remove_stale_builds(out)  # what a killed build of `out` left
        return _build(st, model_dir, lines, n, out, batch_size, truncation, max_length,
                      show_progress, world, dtype)


def _remove_stale_builds(out: Path) -> None:
    for entry in leftovers(out.parent, out.name):
        if entry.is_dir() and not entry.is_symlink():
            shutil.rmtree(entry, ignore_errors=True)


def _build(st, model_dir, lines: TextLines, n: int, out: Path, batch_size: int,
           truncation: bool, max_length: int | None, show_progress: bool | None,
           world: int = 1, dtype: str | None = None) -> dict[str, Any]:
    from tformer.training.distributed import broadcast_int

    work = out.parent / f".{out.name}.build"
    meta = {"format": INDEX_FORMAT, "model_dir": str(Path(model_dir).resolve()),
            "model_id": model_identity(model_dir),
            "corpus": lines.name if lines.name == "-" else str(Path(lines.name).resolve()),
            "n": n, "dim": st.dim, "max_length": max_length, "truncation": truncation,
            "pooling": list(st.pooling), "dtype": dtype}
    # What the rows depend on: a build resumes only for the same (the corpus by its bytes).
    identity = {**meta, "model_dir": None, "corpus": lines.digest()}
    for entry in leftovers(work, BUILD_PROGRESS):  # a progress record a kill cut short
        entry.unlink(missing_ok=True)
    done, sizes = _resumable(work, identity)
    if done is None:
        done, sizes = 0, _start(work, n, st.dim)
    elif done:
        print(f"tformer index: resuming {out} after {done} of {n} lines", file=sys.stderr)
    done = broadcast_int(done, world)
    bar = progress_bar(n, show_progress)
    bar.update(done)
    # Plain writes after what was recorded (a memory map would keep every written page
    # resident, so memory would grow with the corpus); a chunk cut short is written again.
    with (work / VECTORS_FILE).open("r+b") as vectors, (work / TEXTS_FILE).open("r+b") as texts_out:
        for f, size in zip((vectors, texts_out), sizes, strict=True):
            f.truncate(size)
            f.seek(size)
        for numbers, texts, emb in embed_chunks(
            st, ((k, t) for k, t in lines if k > done), world=world, where=lines.at, batch_size=batch_size,
            truncation=truncation, show_progress=False,
        ):
            durable_step(f"write {work / VECTORS_FILE}")
            vectors.write(unit(emb).astype(np.float32).tobytes())  # (b, D) rows
            texts_out.write("".join(json.dumps({"line": k, "text": t}) + "\n"
                                    for k, t in zip(numbers, texts, strict=True)).encode())
            for f in (vectors, texts_out):
                f.flush()
                os.fsync(f.fileno())
            done += len(texts)
            write_json_atomic(work / BUILD_PROGRESS, {"identity": identity, "done": done,
                                                      "sizes": [vectors.tell(), texts_out.tell()]})
            bar.update(len(texts))
    bar.close()
    if done != n:
        shutil.rmtree(work, ignore_errors=True)
        raise ValueError(f"--corpus {lines.name}: changed while it was read ({done} lines, "
                         f"expected {n})")
    durable_step(f"write {work / INDEX_FILE}")
    (work / INDEX_FILE).write_bytes(json_bytes(meta))
    (work / BUILD_PROGRESS).unlink()
    for path in work.iterdir():
        os.chmod(path, file_mode())
        with path.open("rb") as f:
            os.fsync(f.fileno())
    fsync_dir(work)
    publish_dir(work, out)
    return meta


def _resumable(work: Path, identity: dict[str, Any]) -> tuple[int | None, list[int]]:
    """(lines done, [vectors bytes, texts bytes]) an interrupted build of the same identity
    recorded in ``work``; (None, []) when there is none to resume."""
    try:
        saved = json.loads((work / BUILD_PROGRESS).read_text())
        sizes = [int(x) for x in saved["sizes"]]
        ok = (saved["identity"] == identity and len(sizes) == 2
              and (work / VECTORS_FILE).stat().st_size >= sizes[0]
              and (work / TEXTS_FILE).stat().st_size >= sizes[1])
    except (OSError, ValueError, KeyError, TypeError):
        return None, []
    return (int(saved["done"]), sizes) if ok else (None, [])


def _start(work: Path, n: int, dim: int) -> list[int]:
    """A new build folder: vectors.npy's header for (n, dim) rows, an empty texts.jsonl."""
    shutil.rmtree(work, ignore_errors=True)
    work.mkdir()
    os.chmod(work, dir_mode())
    durable_step(f"write {work / VECTORS_FILE}")  # its header: a full disk here names the file too
    with (work / VECTORS_FILE).open("wb") as f:
        header = {"descr": np.lib.format.dtype_to_descr(np.dtype(np.float32)),
                  "fortran_order": False, "shape": (n, dim)}
        np.lib.format.write_array_header_1_0(f, header)
        head = f.tell()
    (work / TEXTS_FILE).write_bytes(b"")
    return [head, 0]


def check_replaceable(out: Path) -> None:
    """`out` is new, or an index an earlier build wrote, holding its files only: a rebuild swaps
    the folder whole, so anything else in it would be deleted (a folder holding a file that
    happened to be named index.json, and the user's README beside it, was)."""
    if not out.exists() or (out.is_dir() and not any(out.iterdir())):
        return  # new, or an empty folder (`mkdir INDEX` first): nothing to lose, as for an export
    ours = {INDEX_FILE, VECTORS_FILE, TEXTS_FILE}
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
    return isinstance(meta, dict) and meta.get("format") == INDEX_FORMAT


# index.json's fields a search reads, and their types (a hand-edited one is one line, not a KeyError)
_META_TYPES = {"model_dir": (str, "a string"), "model_id": (str, "a string"), "n": (int, "an integer"),
               "dim": (int, "an integer")}


class Index:
    """A built index: its metadata, and a streamed top-k search over its vectors."""

    def __init__(self, path: str | Path) -> None:
        self.path = as_path(path, "path", "an index directory")
        try:
            # Its files opened together, through the folder, and read from these handles: a
            # rebuild that swaps the folder during a search leaves it reading the index it opened
            # (it read the old vectors, then the new texts: every result named another line).
            folder = os.open(self.path, os.O_RDONLY | os.O_DIRECTORY)
            try:
                self.files = {name: open(name, "rb", opener=lambda n, flags: os.open(n, flags, dir_fd=folder))
                              for name in (INDEX_FILE, VECTORS_FILE, TEXTS_FILE)}
            finally:
                os.close(folder)
            self.meta = json.loads(self.files[INDEX_FILE].read())
        except (OSError, json.JSONDecodeError, UnicodeDecodeError) as e:
            raise ValueError(f"INDEX {self.path}: not a readable tformer index ({e})") from None
        if not isinstance(self.meta, dict) or self.meta.get("format") != INDEX_FORMAT:
            raise ValueError(f"INDEX {self.path / INDEX_FILE}: expected format {INDEX_FORMAT}")
        for key, (kind, named) in _META_TYPES.items():
            value = self.meta.get(key)
            if not isinstance(value, kind) or isinstance(value, bool):
                raise ValueError(f"INDEX {self.path / INDEX_FILE}: {key}: expected {named}, got "
                                 f"{value!r} (edited or damaged: rebuild the index)")

    @staticmethod
    def is_index(path: str | Path) -> bool:
        return (Path(path) / INDEX_FILE).is_file()

    def check_model(self, model_dir: str | Path) -> None:
        """Refuse a model other than the one that built the index."""
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

    def search(self, queries: np.ndarray, k: int) -> tuple[np.ndarray, np.ndarray]:
        """(scores, rows), each (Q, min(k, n)): the k rows nearest each query, best first."""
        check_queries(queries, self.meta["dim"])
        best = TopK(queries, k)
        for first, block in self.blocks():
            best.add(block, first, normalized=True)
        return best.result()
