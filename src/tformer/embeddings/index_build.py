"""Building an index (tformer.embeddings.index): from a corpus and a model, or from vectors.

    build_index(st, MODEL_DIR, corpus, INDEX, ann="auto")      # embed, then index
    build_index_from_vectors("V.npy", INDEX, texts="lines.txt", ann="auto")

Memory grows with the chunk size, never with the number of lines: a build embeds (or copies) and
writes a chunk at a time. Under torchrun the chunks are shared out among the ranks and written by
rank 0 (tformer.embeddings.shards); the ranks part once the vectors are written, and rank 0 alone
builds the approximate index from them (tformer.embeddings.ann), so the index is the one a single
process builds from the same vectors. A build that is killed, interrupted or runs out of disk
resumes from its last recorded chunk when run again with the same model, corpus and options
(``BUILD_PROGRESS`` records them), as ``tformer embed --out`` does; with others it starts over.
Everything is written in ``.INDEX.build`` and published by one rename (or exchange).
"""

from __future__ import annotations

import json
import os
import shutil
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

from tformer.embeddings.ann import build_ann, choose_kind
from tformer.embeddings.index import (
    BUILD_PROGRESS,
    INDEX_FILE,
    INDEX_FORMAT,
    TEXTS_FILE,
    VECTORS_FILE,
    check_replaceable,
    model_identity,
)
from tformer.embeddings.stream import embed_chunks, progress_bar, unit
from tformer.embeddings.vectors import VectorsFile
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


def _say(line: str) -> None:
    print(f"tformer index: {line}", file=sys.stderr)


def build_index(st, model_dir: str | Path, corpus: str | Path, out: str | Path,
                batch_size: int = 32, truncation: bool = True, max_length: int | None = None,
                show_progress: bool | None = None, rank: int = 0, world: int = 1,
                dtype: str | None = None, ann: str = "auto", threads: int | None = None,
                report: Callable[[str], None] = _say) -> dict[str, Any] | None:
    """Embed the corpus once into an index directory at `out` (written as one unit, under
    a lock: a second build of the same `out` is refused while this one runs; an interrupted
    one resumes). With several ranks (torchrun) each embeds its share of the corpus and rank 0
    writes the index; the other ranks return None. ``dtype``: the precision ``st`` runs in
    (index.json records it). ``ann``: tformer.embeddings.ann.KINDS."""
    from tformer.training.distributed import broadcast_int, finish

    lines = corpus if isinstance(corpus, TextLines) else TextLines(corpus, "--corpus")
    if rank != 0:
        done = broadcast_int(0, world)  # rank 0's lines already embedded
        for _ in embed_chunks(st, ((k, t) for k, t in lines if k > done), rank=rank, world=world,
                              where=lines.at, batch_size=batch_size, truncation=truncation,
                              show_progress=False):
            pass  # rank 0 gathers and writes
        finish(world)
        return None
    out = replaced_path(out, "--out")  # a link's target is rebuilt: the link stays a link
    check_replaceable(out)
    n = lines.count()
    if n == 0:
        raise ValueError(f"--corpus {lines.name}: expected at least one line, got none")
    kind, why = choose_kind(ann, n)  # refused before anything is embedded
    out.parent.mkdir(parents=True, exist_ok=True)
    with output_lock(out, "--out"):
        _remove_stale_builds(out)  # what a killed build of `out` left
        meta = {"format": INDEX_FORMAT, "model_dir": str(Path(model_dir).resolve()),
                "model_id": model_identity(model_dir),
                "corpus": lines.name if lines.name == "-" else str(Path(lines.name).resolve()),
                "n": n, "dim": st.dim, "max_length": max_length, "truncation": truncation,
                "pooling": list(st.pooling), "dtype": dtype}
        work = _embed(st, meta, lines, out, batch_size, truncation, show_progress, world)
        finish(world)  # the vectors are written: the other ranks are done
        return _publish(work, out, meta, kind, why, threads, report)


def build_index_from_vectors(vectors: str | Path, out: str | Path, texts: str | Path | None = None,
                             ann: str = "auto", threads: int | None = None,
                             report: Callable[[str], None] = _say) -> dict[str, Any]:
    """An index of the rows of a .npy file (N, D) of float vectors (scaled to unit length: the
    index searches by cosine), with a text per row from ``texts`` (one per line) if given."""
    source = VectorsFile(vectors, "--vectors")
    lines = TextLines(texts, "--texts") if texts is not None else None
    out = replaced_path(out, "--out")
    check_replaceable(out)
    n, dim = source.shape
    if lines is not None and (count := lines.count()) != n:
        raise ValueError(f"--texts {lines.name}: expected {n:,} lines (one per row of --vectors "
                         f"{source.path}), got {count:,}")
    kind, why = choose_kind(ann, n)
    out.parent.mkdir(parents=True, exist_ok=True)
    with output_lock(out, "--out"):
        _remove_stale_builds(out)
        work = out.parent / f".{out.name}.build"
        shutil.rmtree(work, ignore_errors=True)
        work.mkdir()
        os.chmod(work, dir_mode())
        try:
            durable_step(f"write {work / VECTORS_FILE}")
            with (work / VECTORS_FILE).open("wb") as f:
                np.lib.format.write_array_header_1_0(
                    f, {"descr": "<f4", "fortran_order": False, "shape": (n, dim)})
                for _, block in source.blocks():  # checked finite, row by row
                    f.write(unit(block).astype(np.float32).tobytes())
            if lines is not None:
                durable_step(f"write {work / TEXTS_FILE}")
                with (work / TEXTS_FILE).open("wb") as f:
                    for k, t in lines:
                        f.write((json.dumps({"line": k, "text": t}) + "\n").encode())
            meta = {"format": INDEX_FORMAT, "vectors": str(source.path.resolve()), "n": n, "dim": dim,
                    "texts": lines is not None,
                    "corpus": None if lines is None else lines.name if lines.name == "-"
                    else str(Path(lines.name).resolve())}
            return _publish(work, out, meta, kind, why, threads, report)
        except BaseException:
            shutil.rmtree(work, ignore_errors=True)
            raise


def _publish(work: Path, out: Path, meta: dict[str, Any], kind: str, why: str, threads: int | None,
             report: Callable[[str], None]) -> dict[str, Any]:
    """The approximate index (if ``kind`` asks for one), index.json, then the folder, fsynced,
    published as one unit at ``out``."""
    if kind != "exact":
        report(f"building an approximate index ({why})")
        durable_step(f"write {work / 'ann.faiss'}")
        with (work / VECTORS_FILE).open("rb") as vectors:
            meta["ann"] = build_ann(work, vectors, meta["n"], meta["dim"], threads=threads, report=report)
    meta["why"] = why
    durable_step(f"write {work / INDEX_FILE}")
    (work / INDEX_FILE).write_bytes(json_bytes(meta))
    (work / BUILD_PROGRESS).unlink(missing_ok=True)
    for path in work.iterdir():
        os.chmod(path, file_mode())
        with path.open("rb") as f:
            os.fsync(f.fileno())
    fsync_dir(work)
    publish_dir(work, out)
    return meta


def _remove_stale_builds(out: Path) -> None:
    for entry in leftovers(out.parent, out.name):
        if entry.is_dir() and not entry.is_symlink():
            shutil.rmtree(entry, ignore_errors=True)


def _embed(st, meta: dict[str, Any], lines: TextLines, out: Path, batch_size: int, truncation: bool,
           show_progress: bool | None, world: int = 1) -> Path:
    """The build folder holding every line's vector and text (resumed where a killed build of
    the same identity recorded its progress)."""
    from tformer.training.distributed import broadcast_int

    work = out.parent / f".{out.name}.build"
    n = meta["n"]
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
            truncation=truncation, show_progress=False, total=n - done,
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
    return work


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
