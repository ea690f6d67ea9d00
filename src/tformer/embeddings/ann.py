"""Approximate search for an index past RAM: FAISS IVF-PQ candidates, rescored exactly.

    kind, why = choose_kind("auto", n)             # "exact" or "ivfpq", and the reason, printed
    meta = build_ann(work, n, dim)                 # work/ann.faiss, parameters measured for recall
    AnnSearch(path, meta, Rows(vectors_file, n, d)).search(q, k)

An ``ivfpq`` index (FAISS, Jegou et al. 2011) holds, per vector, a product-quantized code (D/8
bytes where D is the width) filed under the nearest of ``nlist`` coarse centroids. A search scans
the ``nprobe`` lists nearest the query, takes the ``rerank x max(k, 10)`` best by their codes, and
scores those candidates exactly against the index's own vectors.npy (each candidate's row read by
pread: the process never holds the matrix, see Rows). The lists are memory-mapped (FAISS's
IO_FLAG_MMAP), so an index larger than RAM is searched from disk; memory holds the centroids, the
PQ tables, the lists' pages a batch probes and its candidates' rows. Why FAISS (and not usearch):
benchmarks/README.md, "Approximate search".

Parameters are chosen at build time, for recall@10 >= TARGET_RECALL against exact search on a
held-out sample of the corpus (SAMPLE rows kept out of the quantizer's training; each one's exact
neighbours, itself excluded, are found in the same pass that adds the vectors): for each rerank
factor in turn, the smallest nprobe whose recall reaches the target at the lower end of its 95%
confidence interval over the sample (0.950 on the sample itself left no margin: 0.9507 on 10^4
other queries at 10^6), then the cheapest pair by a count: codes scanned plus CANDIDATE per candidate read
(a count, not a clock: the same build chooses the same parameters on every machine and rank).
"""

from __future__ import annotations

import math
import os
from pathlib import Path
from typing import Any

import numpy as np

from tformer.embeddings.stream import TopK, best_columns, unit

KINDS = ("auto", "exact", "ivfpq")
ANN_FILE = "ann.faiss"
EXTRA = "pip install 'tformer[ann]'"
# auto builds an approximate index from this many vectors (benchmarks/README.md, "Approximate search"):
# below it an exact scan of a query costs under ~30 ms on 2 cores and a build needs no training.
AUTO_MIN_ROWS = 200_000
MIN_ROWS = 1_000  # fewer cannot train a quantizer worth having: exact search instead
TARGET_RECALL = 0.95
SAMPLE = 1_000  # held-out queries that choose the parameters
RERANKS = (4, 8, 16, 32)  # candidates scored exactly: rerank x k
ADD_BLOCK = 65_536  # vectors read and added at a time
# A candidate's cost in codes scanned: its row read from disk (a pread, 2-10 us here, busy or
# quiet) and rescored, against a code's m table lookups (~25 ns at m = 48).
CANDIDATE = 200


def faiss_module(option: str = "--ann"):
    """faiss, or one line naming the extra that installs it."""
    try:
        import faiss
    except ImportError:
        raise ValueError(f"{option}: an approximate index needs FAISS, which is not installed: "
                         f"{EXTRA} (or --ann exact)") from None
    return faiss


def use_threads(threads: int | None) -> None:
    """FAISS's OpenMP threads, where FAISS is installed (else nothing to set)."""
    try:
        import faiss
    except ImportError:
        return
    if threads:
        faiss.omp_set_num_threads(threads)


def choose_kind(requested: str, n: int) -> tuple[str, str]:
    """(kind to build, why) for ``--ann requested`` and n vectors."""
    if requested not in KINDS:
        raise ValueError(f"--ann: expected one of {', '.join(KINDS)}, got {requested!r}")
    if requested == "exact":
        return "exact", "--ann exact"
    if requested == "ivfpq":
        faiss_module()
        if n < MIN_ROWS:
            raise ValueError(f"--ann ivfpq: expected at least {MIN_ROWS:,} vectors to train a quantizer on, "
                             f"got {n:,}; use --ann exact (or auto)")
        return "ivfpq", "--ann ivfpq"
    if n < AUTO_MIN_ROWS:
        return "exact", f"{n:,} vectors < {AUTO_MIN_ROWS:,}: an exact scan is fast at this size"
    try:
        faiss_module()
    except ValueError:
        return "exact", (f"{n:,} vectors >= {AUTO_MIN_ROWS:,}, but FAISS is not installed "
                         f"({EXTRA} for an approximate index)")
    return "ivfpq", f"{n:,} vectors >= {AUTO_MIN_ROWS:,}: approximate (IVF-PQ), exact scans grow with N"


def shape_for(n: int, dim: int) -> dict[str, int]:
    """nlist ~ sqrt(n) (a power of two), PQ codes of about D/8 bytes (m sub-vectors of 8 bits;
    fewer bits where too few vectors train 256 centroids a sub-vector)."""
    nlist = 1 << max(4, min(16, round(math.log2(math.sqrt(n)))))
    m = max(d for d in range(1, max(1, dim // 8) + 1) if dim % d == 0)
    nbits = max(4, min(8, int(math.log2(max(16, n // 39)))))
    return {"nlist": nlist, "m": m, "nbits": nbits}


def skip_header(f) -> int:
    """Seek an open .npy file past its header; the offset of its data."""
    f.seek(0)
    version = np.lib.format.read_magic(f)
    (np.lib.format.read_array_header_1_0 if version == (1, 0) else np.lib.format.read_array_header_2_0)(f)
    return f.tell()


class Rows:
    """Rows of an (n, d) float32 .npy, gathered on demand by pread (one per row, into the page
    cache's copy). Not a memory map: here a read fault mapped ~0.9 MiB of cached file per random
    row (the kernel maps large folios and their neighbours whole; madvise RANDOM / NOHUGEPAGE did
    not stop it), so one batch's 43,520 candidates mapped all of a 440 MiB file and a search's
    peak memory grew with the index (1.25x the raw vectors at 10^6); a pread costs ~2-10 us a row."""

    def __init__(self, f, n: int, d: int) -> None:
        self.fd, self.offset, self.shape = f.fileno(), skip_header(f), (n, d)

    def take(self, rows: np.ndarray) -> np.ndarray:
        """The rows (indices of any shape) as a read-only array of shape indices' shape + (d,)."""
        n, d = self.shape
        size, pread, fd, offset = d * 4, os.pread, self.fd, self.offset
        wanted = np.asarray(rows, dtype=np.int64)
        data = b"".join([pread(fd, size, offset + r * size) for r in wanted.ravel().tolist()])
        if len(data) != wanted.size * size:
            raise ValueError(f"vectors.npy: expected {n} rows, got fewer (truncated: rebuild the index)")
        return np.frombuffer(data, dtype=np.float32).reshape(*wanted.shape, d)


def build_ann(work: Path, vectors, n: int, dim: int, threads: int | None = None,
              report=print) -> dict[str, Any]:
    """Train, fill and tune an IVF-PQ index of the (n, dim) unit vectors in ``vectors`` (an open
    vectors.npy) into ``work / ANN_FILE``; its description for index.json. ``report``: one line
    per stage (the command prints them)."""
    import time

    faiss = faiss_module()
    use_threads(threads)
    shape = shape_for(n, dim)
    rng = np.random.default_rng(0)
    held = np.sort(rng.choice(n, min(SAMPLE, n // 10), replace=False))
    rest = np.setdiff1d(np.arange(n), held, assume_unique=True) if n <= 10 * 2**20 else None
    # 20 a list (k-means' centroids move little past that) and 40 a PQ centroid, at most all the rest
    want = min(n - len(held), max(20 * shape["nlist"], 40 * (1 << shape["nbits"])))
    train_rows = np.sort(rng.choice(rest, want, replace=False) if rest is not None else
                         _sample_outside(rng, n, want, held))
    rows = Rows(vectors, n, dim)
    sample, train = rows.take(held), rows.take(train_rows)
    t = time.perf_counter()
    index = faiss.index_factory(dim, f"IVF{shape['nlist']},PQ{shape['m']}x{shape['nbits']}np",
                                faiss.METRIC_INNER_PRODUCT)
    for cp in (faiss.extract_index_ivf(index).cp, index.pq.cp):
        cp.min_points_per_centroid = 1  # the sample is sized above; no warning on stderr
    faiss.extract_index_ivf(index).cp.niter = 10  # 25 (k-means' default) cost 2.5x the time
    index.train(train)
    del train
    report(f"trained {shape['nlist']} lists and {shape['m']} x {shape['nbits']}-bit codes on "
           f"{want:,} vectors ({time.perf_counter() - t:.1f} s)")
    t = time.perf_counter()
    truth = TopK(sample, 11)  # the sample's exact neighbours (itself among them), in the same pass
    skip_header(vectors)
    for first in range(0, n, ADD_BLOCK):
        block = np.fromfile(vectors, dtype=np.float32, count=min(ADD_BLOCK, n - first) * dim).reshape(-1, dim)
        index.add(block)
        truth.add(block, first, normalized=True)
    report(f"added {n:,} vectors; exact neighbours of {len(held):,} held-out ones "
           f"({time.perf_counter() - t:.1f} s)")
    path = work / ANN_FILE
    faiss.write_index(index, str(path))
    del index
    expected = _without_self(truth.result()[1], held)
    searcher = AnnSearch(str(path), {"nprobe": 1, "rerank": 1}, Rows(vectors, n, dim))
    chosen = _tune(searcher, sample, held, expected, shape, n)
    report(f"chose nprobe {chosen['nprobe']} of {shape['nlist']} lists, rerank {chosen['rerank']} x k: "
           f"recall@10 {chosen['recall_at_10']:.3f} on {len(held):,} held-out vectors against exact search")
    return {"kind": "ivfpq", "library": f"faiss {faiss.__version__}", **shape, **chosen,
            "sample": len(held), "train_rows": int(want), "target_recall": TARGET_RECALL}


def _sample_outside(rng, n: int, want: int, held: np.ndarray) -> np.ndarray:
    """``want`` distinct rows of range(n) not in ``held``, without listing range(n)."""
    got = np.unique(rng.choice(n, int(want * 1.1) + len(held), replace=False))
    return rng.choice(np.setdiff1d(got, held), want, replace=False)


def _without_self(rows: np.ndarray, held: np.ndarray) -> np.ndarray:
    """(S, 10): each held-out query's 10 best rows other than itself."""
    out = np.empty((len(rows), 10), dtype=np.int64)
    for i, (r, own) in enumerate(zip(rows, held, strict=True)):
        others = r[r != own]
        out[i] = np.pad(others[:10], (0, max(0, 10 - len(others))), constant_values=-1)
    return out


def recall_at_10(got: np.ndarray, expected: np.ndarray) -> tuple[float, float]:
    """(mean recall@10, the lower end of its 95% confidence interval) over the queries."""
    each = np.array([len(set(a[a >= 0]) & set(b[b >= 0])) / max(1, (b >= 0).sum())
                     for a, b in zip(got, expected, strict=True)])
    return float(each.mean()), float(each.mean() - 1.96 * each.std() / np.sqrt(len(each)))


def _tune(searcher: AnnSearch, sample: np.ndarray, held: np.ndarray, expected: np.ndarray,
          shape: dict[str, int], n: int) -> dict[str, Any]:
    best = None  # (cost, recall, nprobe, rerank)
    fallback = (-1.0, 0, 0)
    per_list = n / shape["nlist"]
    # The deepest rerank first: it meets the target at the fewest lists, and bounds the rest: a
    # setting that costs more than the best found is not tried (at 10^7 vectors, rerank 4 probing
    # every one of 4,096 lists for 1,000 queries took most of a 30-minute build).
    for rerank in sorted(RERANKS, reverse=True):
        nprobe = 1
        while nprobe <= shape["nlist"]:
            if best is not None and nprobe * per_list + rerank * 10 * CANDIDATE >= best[0]:
                break
            searcher.nprobe, searcher.rerank = nprobe, rerank
            _, got = searcher.search(sample, 11)
            recall, low = recall_at_10(_without_self(got, held), expected)
            if recall > fallback[0]:
                fallback = (recall, nprobe, rerank)
            if low >= TARGET_RECALL:  # the target met with the sample's uncertainty too
                # codes scanned + candidates read and rescored, a candidate weighing CANDIDATE codes
                cost = nprobe * per_list + rerank * 10 * CANDIDATE
                if best is None or cost < best[0]:
                    best = (cost, recall, nprobe, rerank)
                break
            nprobe *= 2
    if best is None:
        recall, nprobe, rerank = fallback
        return {"nprobe": nprobe, "rerank": rerank, "recall_at_10": round(recall, 4),
                "note": f"recall@10 {recall:.3f} < {TARGET_RECALL} at the most thorough settings tried"}
    return {"nprobe": best[2], "rerank": best[3], "recall_at_10": round(best[1], 4)}


class AnnSearch:
    """Searches an ann.faiss (memory-mapped) and rescores its candidates from ``rows``."""

    def __init__(self, path: str, meta: dict[str, Any], rows: Rows) -> None:
        faiss = faiss_module("INDEX")
        self.index = faiss.read_index(path, faiss.IO_FLAG_MMAP | faiss.IO_FLAG_READ_ONLY)
        self.nprobe, self.rerank, self.rows = int(meta["nprobe"]), int(meta["rerank"]), rows

    def search(self, queries: np.ndarray, k: int) -> tuple[np.ndarray, np.ndarray]:
        """(scores, rows), each (Q, min(k, n)), best first, ties to the lower row; a query whose
        probed lists hold fewer candidates gets rows -1 (score -inf) at the end."""
        q = unit(np.ascontiguousarray(queries, dtype=np.float32))
        n, d = self.rows.shape
        k = min(k, n)
        c = min(n, self.rerank * max(k, 10))  # tuned at k = 10: fewer candidates would lose recall
        batch = max(1, min(4096, (1 << 23) // (c * d)))  # (batch, c, D) gathered rows: <= 32 MiB
        scores = np.empty((len(q), k), dtype=np.float32)
        rows = np.empty((len(q), k), dtype=np.int64)
        for s in range(0, len(q), batch):
            qb = q[s:s + batch]
            cand = self._candidates(qb, c)
            cand = np.where(cand < 0, n, cand)
            cand.sort(axis=1)  # ascending rows: ties then go to the lower row
            valid = cand < n
            exact = np.einsum("bd,bcd->bc", qb, self.rows.take(np.where(valid, cand, 0)))  # (b, c)
            exact[~valid] = -np.inf
            keep = best_columns(exact, k)  # score desc, column (= row) asc
            scores[s:s + batch] = np.take_along_axis(exact, keep, axis=1)
            got = np.take_along_axis(cand, keep, axis=1)
            rows[s:s + batch] = np.where(got < n, got, -1)
        return scores, rows

    def _candidates(self, q: np.ndarray, c: int) -> np.ndarray:
        """(b, c) rows by their codes, -1 where none. A query whose nprobe lists hold fewer than c
        rows (one far from the corpus, or near centroids that got few rows) is searched again with
        twice the lists, until it has c or every list is probed: the sample that chose nprobe was
        corpus rows, and a query unlike them found nothing in its one list."""
        self.index.nprobe = self.nprobe
        _, cand = self.index.search(q, c)
        short = np.flatnonzero(cand[:, -1] < 0)  # results are filled best first: -1s at the end
        nprobe, nlist = self.nprobe, self.index.nlist
        while len(short) and nprobe < nlist:
            nprobe = min(nlist, nprobe * 2)
            self.index.nprobe = nprobe
            _, again = self.index.search(np.ascontiguousarray(q[short]), c)
            cand[short] = again
            short = short[again[:, -1] < 0]
        return cand
