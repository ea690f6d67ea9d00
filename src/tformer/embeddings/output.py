"""`tformer embed --out`: embeddings streamed to a file that appears whole, and resumes.

    with open_output(Path("x.npy"), identity) as out:   # identity: n, dim, model, texts...
        for texts, emb in chunks[out.done // CHUNK:]: out.write(texts, emb)

Rows go to ``x.npy.partial`` as they are computed (plain writes at their offset, so memory
stays flat), and after each chunk ``x.npy.partial.json`` records how many are done. The
finished file is renamed over ``x.npy`` in one step: a crash or a full disk leaves any
previous ``x.npy`` untouched, and the next run with the same inputs and model continues
from the last recorded chunk (the identity holds everything that changes the numbers, so
rows of two precisions or models are never mixed). ``.jsonl`` works the same way, one line
per text. One process writes `x.npy` at a time (tformer.storage.locks): a second is refused before
it touches anything.
"""

from __future__ import annotations

import contextlib
import json
import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np

from tformer.storage.files import durable_step, file_mode, fsync_dir, refuse_foreign, write_json_atomic
from tformer.storage.locks import leftovers, output_lock


class _Output:
    def __init__(self, out: Path, identity: dict[str, Any]) -> None:
        self.out, self.identity = out, identity
        self.discarded = False
        self.partial = out.with_name(out.name + ".partial")
        self.progress = out.with_name(out.name + ".partial.json")
        self.done, self.bytes = 0, 0
        saved = _read_progress(self.progress)
        if saved is not None and saved.get("identity") == identity and self.partial.is_file():
            self.done, self.bytes = int(saved["done"]), int(saved["bytes"])
        else:
            # an interrupted file for other inputs (one with no progress recorded holds nothing)
            self.discarded = self.partial.is_file() and saved is not None
            self._start()
        self.f = self.partial.open("r+b")
        if out.suffix == ".jsonl":
            self.f.truncate(self.bytes)  # drop a line cut short by the crash
        self.f.seek(self.bytes)

    def _start(self) -> None:
        self.progress.unlink(missing_ok=True)
        n, dim = self.identity["n"], self.identity["dim"]
        durable_step(f"write {self.partial}")  # its header: a full disk here names the file too
        with self.partial.open("wb") as f:
            os.fchmod(f.fileno(), file_mode())
            if self.out.suffix == ".npy":
                header = {"descr": np.lib.format.dtype_to_descr(np.dtype(np.float32)),
                          "fortran_order": False, "shape": (n, dim)}
                np.lib.format.write_array_header_1_0(f, header)
                self.bytes = f.tell()
                f.truncate(self.bytes + n * dim * 4)  # sparse until written

    def write(self, texts: list[str], emb: np.ndarray) -> None:
        durable_step(f"write {self.partial}")
        if self.out.suffix == ".npy":
            data = np.ascontiguousarray(emb, dtype=np.float32).tobytes()  # (n, D) rows
        else:
            data = "".join(json.dumps({"text": t, "embedding": v}, allow_nan=False) + "\n"
                           for t, v in zip(texts, emb.tolist(), strict=True)).encode()
        self.f.write(data)
        self.f.flush()
        os.fsync(self.f.fileno())
        self.done, self.bytes = self.done + len(texts), self.bytes + len(data)
        write_json_atomic(self.progress, {"identity": self.identity, "done": self.done,
                                          "bytes": self.bytes})

    def finish(self) -> None:
        if self.done != self.identity["n"]:
            raise ValueError(f"--out {self.out}: wrote {self.done} of {self.identity['n']} rows")
        self.f.close()
        durable_step(f"rename {self.out}")
        os.replace(self.partial, self.out)
        fsync_dir(self.out.parent)
        self.progress.unlink(missing_ok=True)


def _read_progress(path: Path) -> dict[str, Any] | None:
    try:
        data = json.loads(path.read_text())
    except (OSError, ValueError):
        return None
    return data if isinstance(data, dict) else None


def _remove_stale_temps(out: Path) -> None:
    """The temp files of progress records that a killed writer of `out` left (we hold the lock)."""
    for entry in leftovers(out.parent, out.name + ".partial.json"):
        if entry.is_file():
            entry.unlink(missing_ok=True)


def is_embeddings(path: Path, dim: int) -> bool:
    """Whether ``path`` holds what ``tformer embed --out`` writes at width ``dim`` (so a new
    output may replace it): a float32 (N, dim) .npy, or .jsonl lines {"text", "embedding"} of
    dim numbers (the first line read); an empty file holds nothing to lose."""
    try:
        with path.open("rb") as f:
            if path.stat().st_size == 0:
                return True
            if path.suffix == ".npy":
                read = {(1, 0): np.lib.format.read_array_header_1_0,
                        (2, 0): np.lib.format.read_array_header_2_0}.get(np.lib.format.read_magic(f))
                if read is None:
                    return False
                shape, fortran, dtype = read(f)
                return dtype == np.float32 and len(shape) == 2 and shape[1] == dim and not fortran
            first = json.loads(f.readline(64 << 20))
    except (OSError, ValueError, SyntaxError):
        return False
    return (isinstance(first, dict) and set(first) == {"text", "embedding"}
            and isinstance(first["embedding"], list) and len(first["embedding"]) == dim)


@contextlib.contextmanager
def open_output(out: Path, identity: dict[str, Any]) -> Iterator[_Output]:
    """A resumable, atomically published embeddings file (.npy or .jsonl), written by one
    process at a time: a second writer of the same `out` gets a one-line error; an existing
    `out` that is not an earlier output at this width (``is_embeddings``) is refused, never
    replaced."""
    out.parent.mkdir(parents=True, exist_ok=True)
    with output_lock(out, "--out"):
        dim = identity["dim"]
        kind = (f"a float32 (N, {dim}) array" if out.suffix == ".npy"
                else f'{{"text", "embedding"}} lines of {dim} numbers')
        refuse_foreign(out, "--out", lambda p: is_embeddings(p, dim),
                       f"an earlier `tformer embed` output ({kind})")
        _remove_stale_temps(out)
        writer = _Output(out, identity)
        try:
            yield writer
        except BaseException:
            writer.f.close()  # keep the partial file and its progress: the next run resumes
            raise
        writer.finish()
