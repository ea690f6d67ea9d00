"""Embedding at scale: lines streamed in chunks, a running top-k, and a persistent index.

    for numbers, texts, emb in embed_chunks(st, TextLines(path, "--corpus")): ...  # flat memory
    best = TopK(queries, k); best.add(block, first_index); best.result()
    build_index(st, MODEL_DIR, corpus, INDEX); Index(INDEX).search(st.encode(queries), k)

Memory grows with the chunk size and k, never with the number of lines: texts are read
lazily, embedded ``CHUNK`` at a time, and queries x corpus is computed ``QUERIES`` x ``BLOCK``
at a time with a running top-k (not the (Q + N) x (Q + N) matrix; per query, k scores are
kept). Under torchrun the chunks are shared out among the ranks and written by rank 0
(tformer.embeddings.shards).

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
import warnings
from collections.abc import Callable, Iterable, Iterator
from pathlib import Path
from typing import Any

import numpy as np

from tformer.storage.checkpoint_names import CHECKPOINTS
from tformer.storage.files import (
    dir_mode,
    durable_step,
    file_mode,
    fsync_dir,
    json_bytes,
    publish_dir,
    write_json_atomic,
)
from tformer.storage.locks import leftovers, output_lock
from tformer.text.lines import TextLines
from tformer.text.tokenizer import TextTooLong

CHUNK = 1024  # texts embedded (and held) at a time
BLOCK = 8192  # corpus vectors compared with the queries at a time
QUERIES = 256  # queries compared with a block at a time (the scores held: QUERIES x BLOCK)
INDEX_FILE, VECTORS_FILE, TEXTS_FILE = "index.json", "vectors.npy", "texts.jsonl"
BUILD_PROGRESS = "progress.json"  # in the build folder: what it embeds, and how far it got
INDEX_FORMAT = 1


def chunks(items: Iterable[Any], size: int) -> Iterator[list[Any]]:
    chunk: list[Any] = []
    for item in items:
        chunk.append(item)
        if len(chunk) == size:
            yield chunk
            chunk = []
    if chunk:
        yield chunk


def embed_chunks(st, numbered: Iterable[tuple[int, str]], size: int | None = None, rank: int = 0,
                 world: int = 1, where: Callable[[int], str] = "input {}".format,
                 **encode_kw) -> Iterator[tuple[list[int], list[str], np.ndarray]]:
    """(line numbers, texts, (n, D) float32 embeddings) a chunk at a time, in input order.
    A non-finite embedding (broken weights) is refused: it would rank or print as NaN.
    With several ranks (torchrun) each embeds its share, and rank 0 yields every chunk
    (tformer.embeddings.shards); the others yield nothing but must iterate to the end.
    Texts longer than the model's maximum: one warning at the end naming their inputs (not
    one a chunk), or, with truncation=False, an error naming the input. ``where(number)``
    names input `number` in these messages (a command's: "--corpus c.txt:3")."""
    long: list[tuple[int | None, int]] = []  # (input number, token count) of the truncated texts

    def encode(texts: list[str], numbers: list[int] | None = None) -> np.ndarray:
        def noted(indices: list[int], lengths: list[int]) -> None:
            long.extend((numbers[i] if numbers else None, n) for i, n in zip(indices, lengths, strict=True))

        try:
            return st.encode(texts, on_long=noted, **encode_kw)
        except TextTooLong as e:
            raise ValueError(f"{where(numbers[e.index]) if numbers else f'texts[{e.index}]'}: "
                             f"{e.expected()}") from None

    pieces = chunks(numbered, size or CHUNK)
    if world > 1:
        from tformer.embeddings.shards import sharded_chunks

        embedded = sharded_chunks(encode, pieces, rank, world, st.dim)
    else:
        embedded = (([n for n, _ in c], [t for _, t in c], encode([t for _, t in c], [n for n, _ in c]))
                    for c in pieces)
    total = 0
    for numbers, texts, emb in embedded:
        bad = ~np.isfinite(emb).all(axis=1)
        if bad.any():
            raise ValueError(f"{where(numbers[int(bad.argmax())])}: expected a finite embedding, "
                             "got NaN or infinity (the model's weights are not finite)")
        total += len(texts)
        yield numbers, texts, emb
    if long:
        named = [where(n) for n, _ in long if n is not None]
        inputs = f": {', '.join(named[:5])}{', ...' if len(named) > 5 else ''}" if named else ""
        longest = max(n for _, n in long)
        warnings.warn(f"{len(long)} of {total} texts are longer than the model's maximum length "
                      f"({st.tokenizer.max_length} tokens; the longest has {longest}), so they were "
                      f"truncated{inputs} (--no-truncate raises instead)", UserWarning, stacklevel=2)


def progress_bar(total: int, show: bool | None):
    """A progress bar over texts on stderr; None shows it for large inputs."""
    import sys

    from tqdm.auto import tqdm

    return tqdm(total=total, unit="text", file=sys.stderr,
                disable=not (show if show is not None else total >= 8 * 32))


def unit(x: np.ndarray) -> np.ndarray:
    """Rows scaled to length 1 (cosine similarity is then a dot product)."""
    return x / np.maximum(np.linalg.norm(x, axis=1, keepdims=True), 1e-12)


class TopK:
    """The k best corpus rows for each query, kept while blocks of the corpus stream past.

    Ties go to the earlier row, as a stable sort of the whole row would give.
    """

    def __init__(self, queries: np.ndarray, k: int) -> None:
        self.q = unit(queries.astype(np.float32))  # (Q, D)
        self.k = k
        self.scores = np.empty((len(queries), 0), dtype=np.float32)  # (Q, <=k)
        self.rows = np.empty((len(queries), 0), dtype=np.int64)

    def add(self, block: np.ndarray, first: int, normalized: bool = False) -> None:
        """block: (b, D) corpus vectors, rows first .. first + b - 1."""
        block = (block if normalized else unit(block)).astype(np.float32)
        width = min(self.k, self.scores.shape[1] + len(block))
        scores = np.empty((len(self.q), width), dtype=np.float32)
        rows = np.empty((len(self.q), width), dtype=np.int64)
        for q in (slice(s, s + QUERIES) for s in range(0, len(self.q), QUERIES)):
            sims = self.q[q] @ block.T  # (q, b)
            both = np.concatenate([self.scores[q], sims], axis=1)  # (q, <=k + b)
            ids = np.concatenate([self.rows[q], np.broadcast_to(np.arange(first, first + len(block)),
                                                                sims.shape)], axis=1)
            keep = np.lexsort((ids, -both), axis=1)[:, :width]  # score desc, row asc
            scores[q], rows[q] = np.take_along_axis(both, keep, axis=1), np.take_along_axis(ids, keep, axis=1)
        self.scores, self.rows = scores, rows

    def result(self) -> tuple[np.ndarray, np.ndarray]:
        """(scores, rows), each (Q, k), best first."""
        return self.scores, self.rows


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
    out = Path(out)
    if out.is_symlink():  # the folder the link names is rebuilt; the link stays a link (it was
        out = Path(os.path.realpath(out))  # swapped out, and left as .OUT.build: the next build failed)
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
        self.path = Path(path)
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
        best = TopK(queries, k)
        for first, block in self.blocks():
            best.add(block, first, normalized=True)
        return best.result()
