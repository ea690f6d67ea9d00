"""Approximate search against exact search (issue 54): `tformer index build --vectors` and
`tformer search --query-vectors`, each run as a command in a fresh process, its peak RSS read from
wait4; recall@10 of the approximate results against the exact ones of the same run.

    python benchmarks/search_ann.py generate --n 1000000 --out /tmp/ann/v1m.npy     # clustered, width 384
    python benchmarks/search_ann.py libraries --vectors /tmp/ann/v1m.npy --n 200000 # FAISS vs usearch
    python benchmarks/search_ann.py commands --vectors /tmp/ann/v1m.npy --queries /tmp/ann/q.npy
    python benchmarks/search_ann.py embed --corpus lines.txt --out /tmp/ann/real.npy  # all-MiniLM-L6-v2

Wrap each run in `flock /tmp/tformer-bench.lock ...` (one benchmark at a time on a shared machine).

The random vectors are clustered at two scales, so that a query's nearest neighbours mean something
(as in real embeddings) instead of all lying at nearly one distance (as in i.i.d. Gaussian data):
N/1000 top centres (Gaussian), each row joining one of N/10 sub-clusters (a sub-cluster's centre
is its top centre plus 0.6 x an offset made from two random tables, so offsets are distinct and
need no N/10 x D table), plus 0.35 x Gaussian noise. Expected cosines: ~0.92 within a sub-cluster,
~0.67 within a top cluster, ~0 across. Rows are written a chunk at a time (a 10^7 x 384 file is
15 GB; the generator holds 100,000 rows).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path

import numpy as np

CHUNK = 100_000


def clustered(n: int, dim: int, seed: int, out: Path, centres_seed: int = 0) -> None:
    """n rows (float32, unit length) to the .npy `out`, streamed; `centres_seed` fixes the clusters
    (queries: another `seed`, the same centres)."""
    shape = np.random.default_rng(centres_seed)
    top = shape.standard_normal((max(16, n // 1000), dim), dtype=np.float32)
    t1 = shape.standard_normal((1021, dim), dtype=np.float32)
    t2 = shape.standard_normal((1031, dim), dtype=np.float32)
    n_sub = max(64, n // 10)
    rng = np.random.default_rng(seed)
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = out.with_name(out.name + ".tmp")
    with tmp.open("wb") as f:
        np.lib.format.write_array_header_1_0(f, {"descr": "<f4", "fortran_order": False, "shape": (n, dim)})
        for first in range(0, n, CHUNK):
            b = min(CHUNK, n - first)
            sub = rng.integers(0, n_sub, b)
            centre = top[sub % len(top)] + 0.6 * (t1[sub % 1021] + t2[(sub // 1021) % 1031]) / np.sqrt(2)
            rows = centre + 0.35 * rng.standard_normal((b, dim), dtype=np.float32)
            rows /= np.linalg.norm(rows, axis=1, keepdims=True)
            f.write(rows.astype(np.float32).tobytes())
    os.replace(tmp, out)


def peak(argv: list[str]) -> tuple[float, float, str, str]:
    """(seconds, peak RSS MiB, stdout, stderr) of one command, by wait4 on its own pid."""
    start = time.perf_counter()
    proc = subprocess.Popen([str(a) for a in argv], stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    out_chunks, err_chunks = [], []
    import threading

    def drain(stream, into):
        for block in iter(lambda: stream.read(1 << 16), b""):
            into.append(block)

    threads = [threading.Thread(target=drain, args=(proc.stdout, out_chunks)),
               threading.Thread(target=drain, args=(proc.stderr, err_chunks))]
    for t in threads:
        t.start()
    _, status, usage = os.wait4(proc.pid, 0)
    for t in threads:
        t.join()
    proc.returncode = os.waitstatus_to_exitcode(status)
    seconds = time.perf_counter() - start
    out, err = b"".join(out_chunks).decode(), b"".join(err_chunks).decode()
    if proc.returncode != 0:
        raise SystemExit(f"{' '.join(map(str, argv))} failed ({proc.returncode}): {err[-1500:]}")
    return seconds, usage.ru_maxrss / 1024, out, err


# --- the library comparison: each contender builds, saves, then searches in a fresh process ----

LIBRARY_CODE = r'''
import json, os, sys, time
import numpy as np
kind, vectors, n, queries, truth, work, step = sys.argv[1:8]
n = int(n)
X = np.load(vectors, mmap_mode="r")[:n]
Q = np.load(queries)
if step == "build":
    t = time.perf_counter()
    if kind.startswith("faiss"):
        import faiss
        if kind == "faiss-ivfpq":
            nlist = 1 << max(4, round(np.log2(np.sqrt(n))))
            index = faiss.index_factory(X.shape[1], f"IVF{nlist},PQ{X.shape[1] // 8}np",
                                        faiss.METRIC_INNER_PRODUCT)
            rng = np.random.default_rng(0)
            sample = np.ascontiguousarray(X[np.sort(rng.choice(n, min(n, 64 * nlist), replace=False))])
            index.train(sample)
        else:
            index = faiss.IndexHNSWFlat(X.shape[1], 32, faiss.METRIC_INNER_PRODUCT)
            index.hnsw.efConstruction = 64
        for s in range(0, n, 100_000):
            index.add(np.ascontiguousarray(X[s:s + 100_000]))
        faiss.write_index(index, os.path.join(work, kind))
    else:
        from usearch.index import Index
        index = Index(ndim=X.shape[1], metric="cos", dtype=kind.split("-")[-1], connectivity=16)
        for s in range(0, n, 100_000):
            index.add(np.arange(s, min(n, s + 100_000)), np.ascontiguousarray(X[s:s + 100_000]))
        index.save(os.path.join(work, kind))
    print(json.dumps({"build_s": time.perf_counter() - t,
                      "bytes": os.path.getsize(os.path.join(work, kind))}))
else:
    T = np.load(truth)
    if kind.startswith("faiss"):
        import faiss
        index = faiss.read_index(os.path.join(work, kind), faiss.IO_FLAG_MMAP | faiss.IO_FLAG_READ_ONLY
                                 if kind == "faiss-ivfpq" else 0)
    else:
        from usearch.index import Index
        index = Index.restore(os.path.join(work, kind), view=True)
    results = {}
    for knob in ([4, 8, 16, 32, 64] if kind == "faiss-ivfpq" else [16, 32, 64, 128, 256]):
        t = time.perf_counter()
        if kind == "faiss-ivfpq":
            index.nprobe = knob
            _, cand = index.search(Q, 400)
            rows = []  # rerank the 100 candidates by their exact vectors (read from the .npy)
            for q, c in zip(Q, cand):
                c = c[c >= 0]
                c = np.sort(c)
                rows.append(c[np.argsort(-(X[c] @ q), kind="stable")[:10]])
            got = np.array(rows)
        elif kind == "faiss-hnsw":
            index.hnsw.efSearch = knob
            _, got = index.search(Q, 10)
        else:
            index.expansion_search = knob
            got = index.search(Q, 10).keys
        s = time.perf_counter() - t
        recall = np.mean([len(set(a) & set(b)) / 10 for a, b in zip(got.tolist(), T.tolist())])
        results[knob] = {"recall": float(recall), "qps": len(Q) / s}
    print(json.dumps(results))
'''


TRUTH_CODE = r'''
import sys
import numpy as np
from tformer.embeddings.stream import TopK
vectors, n, queries, truth = sys.argv[1:5]
X, Q = np.load(vectors, mmap_mode="r")[: int(n)], np.load(queries)
best = TopK(Q, 10)
for s in range(0, len(X), 65536):
    best.add(np.asarray(X[s:s + 65536]), s, normalized=True)
np.save(truth, best.result()[1])
'''


def libraries(args: argparse.Namespace) -> None:
    work = Path(args.work)
    work.mkdir(parents=True, exist_ok=True)
    full = np.load(args.vectors, mmap_mode="r")
    X = full[: args.n]
    queries = work / "lib_queries.npy"
    clustered_like(args.queries, X.shape[1], 99, queries, len(full))
    truth = work / "lib_truth.npy"
    if not truth.is_file():  # in a child: this process stays small (a fork's peak RSS starts at ours)
        subprocess.run([sys.executable, "-c", TRUTH_CODE, args.vectors, str(args.n), queries, truth],
                       check=True)
    code = work / "lib.py"
    code.write_text(LIBRARY_CODE)
    if not args.no_header:
        print(f"{_cpu()}; {args.n:,} clustered vectors of width {X.shape[1]}, {args.queries:,} queries, "
              "recall@10 against exact; each step in a fresh process (peak RSS by wait4)")
        print("| library, index | build s | build peak RSS MiB | size MiB | search peak RSS MiB | "
              "knob: recall@10 / QPS |")
        print("|---|---:|---:|---:|---:|---|")
    for kind in args.kinds:
        step = [sys.executable, code, kind, args.vectors, args.n, queries, truth, work]
        _, b_rss, b_out, _ = peak([*step, "build"])
        built = json.loads(b_out)
        _, s_rss, s_out, _ = peak([*step, "search"])
        res = json.loads(s_out)
        knobs = "; ".join(f"{k}: {v['recall']:.3f} / {v['qps']:,.0f}" for k, v in res.items())
        print(f"| {kind} | {built['build_s']:.1f} | {b_rss:,.0f} | {built['bytes'] / 2**20:,.0f} | "
              f"{s_rss:,.0f} | {knobs} |", flush=True)
        os.unlink(work / kind)


def commands(args: argparse.Namespace) -> None:
    """`index build --vectors` (auto, or --ann), then `search --query-vectors` approximate and --exact,
    each a fresh process; recall@10 of the approximate results against the exact ones."""
    tformer = [sys.executable, "-m", "tformer"]
    work = Path(args.work)
    work.mkdir(parents=True, exist_ok=True)
    idx = work / "idx"
    n, dim = np.load(args.vectors, mmap_mode="r").shape
    raw = n * dim * 4
    build = [*tformer, "index", "build", "--vectors", args.vectors, "--out", idx, "--ann", args.ann]
    b_s, b_rss, _, b_err = peak(build)
    print(b_err.strip(), file=sys.stderr)
    meta = json.loads((idx / "index.json").read_text())
    sizes = {p.name: p.stat().st_size for p in idx.iterdir()}
    rows = []
    found = {}
    for exact in (False, True):
        if exact and args.exact_queries is not None:
            q = np.load(args.queries, mmap_mode="r")[: args.exact_queries]
            queries = work / "exact_queries.npy"
            np.save(queries, q)
        else:
            queries = Path(args.queries)
        nq = len(np.load(queries, mmap_mode="r"))
        argv = [*tformer, "search", idx, "--query-vectors", queries, "-k", "10", "--format", "jsonl"]
        s, rss, out, _ = peak(argv + (["--exact"] if exact else []))
        found[exact] = [json.loads(line)["ids"] for line in out.splitlines()]
        rows.append((exact, nq, s, rss))
    m = min(len(found[True]), len(found[False]))
    recall = np.mean([len(set(a) & set(b)) / 10
                      for a, b in zip(found[False][:m], found[True][:m], strict=True)])
    ann = meta.get("ann") or {}
    what = (f"IVF{ann['nlist']},PQ{ann['m']}x{ann['nbits']} nprobe {ann['nprobe']} rerank {ann['rerank']}"
            if ann else "exact")
    print(f"\n{_cpu()}; {n:,} x {dim} float32 ({raw / 2**30:.2f} GiB raw), `--ann {args.ann}`: {what}; "
          f"build {b_s:.0f} s, peak RSS {b_rss:,.0f} MiB; on disk: "
          + ", ".join(f"{k} {v / 2**20:,.0f} MiB" for k, v in sorted(sizes.items())))
    print(f"recall@10 (approximate vs --exact, {m:,} queries): {recall:.4f}; build-time estimate on the "
          f"held-out sample: {ann.get('recall_at_10', 1.0)}")
    print("| search command | queries | wall s | QPS (whole command) | peak RSS MiB | "
          "peak RSS / raw vectors |")
    print("|---|---:|---:|---:|---:|---:|")
    for exact, nq, s, rss in rows:
        print(f"| {'--exact' if exact else 'approximate'} | {nq:,} | {s:.1f} | {nq / s:,.1f} | {rss:,.0f} | "
              f"{rss * 2**20 / raw:.2f} |")
    t_ann = rows[0][2] / rows[0][1]
    t_exact = rows[1][2] / rows[1][1]
    print(f"per-query time ratio exact / approximate (whole commands): {t_exact / t_ann:.1f}x")
    if not args.keep:
        import shutil

        shutil.rmtree(idx)


def real(args: argparse.Namespace) -> None:
    """A real corpus: Debian's package summaries (apt's lists) and the English messages of the
    machine's gettext catalogs, deduplicated and shuffled; the last --queries lines held out as queries."""
    import random

    sys.path.insert(0, str(Path(__file__).parent / "data"))
    from build_datasets import gettext_pairs

    texts = set()
    dump = subprocess.run(["apt-cache", "dumpavail"], capture_output=True, text=True).stdout
    for line in dump.splitlines():
        if line.startswith("Description: "):
            texts.add(line.removeprefix("Description: ").strip())
    texts.update(r["source"].strip() for r in gettext_pairs("de"))
    texts = sorted(t for t in texts if t and "\n" not in t and len(t) >= 8)
    random.Random(0).shuffle(texts)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    (out / "corpus.txt").write_text("\n".join(texts[: -args.queries]) + "\n")
    (out / "queries.txt").write_text("\n".join(texts[-args.queries:]) + "\n")
    print(f"{len(texts) - args.queries:,} corpus lines, {args.queries:,} queries in {out}")


def _cpu() -> str:
    try:
        out = subprocess.run(["lscpu"], capture_output=True, text=True).stdout
        return next(line.split(":", 1)[1].strip() for line in out.splitlines()
                    if line.startswith("Model name"))
    except (OSError, StopIteration):
        return "unknown CPU"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="step", required=True)
    g = sub.add_parser("generate")
    g.add_argument("--n", type=int, required=True)
    g.add_argument("--dim", type=int, default=384)
    g.add_argument("--seed", type=int, default=1)
    g.add_argument("--centres-of", type=int, default=None,
                   help="the corpus size whose clusters to draw from (queries: the corpus's n)")
    g.add_argument("--out", required=True)
    lib = sub.add_parser("libraries")
    lib.add_argument("--vectors", required=True)
    lib.add_argument("--n", type=int, default=200_000)
    lib.add_argument("--queries", type=int, default=2000)
    lib.add_argument("--work", default="/tmp/ann-bench")
    lib.add_argument("--no-header", action="store_true")
    lib.add_argument("--kinds", nargs="+", default=["faiss-ivfpq", "faiss-hnsw", "usearch-i8", "usearch-f16"])
    c = sub.add_parser("commands")
    c.add_argument("--vectors", required=True)
    c.add_argument("--queries", required=True)
    c.add_argument("--exact-queries", type=int, default=None, help="time --exact on the first N queries")
    c.add_argument("--ann", default="auto")
    c.add_argument("--work", default="/tmp/ann-bench")
    c.add_argument("--keep", action="store_true")
    r = sub.add_parser("real")
    r.add_argument("--out", required=True)
    r.add_argument("--queries", type=int, default=2000)
    args = parser.parse_args()
    if args.step == "commands":
        commands(args)
    elif args.step == "real":
        real(args)
    elif args.step == "generate":
        if args.centres_of:  # queries: the corpus's clusters, other rows
            _generate_like(args)
        else:
            clustered(args.n, args.dim, args.seed, Path(args.out))
    elif args.step == "libraries":
        libraries(args)


def _generate_like(args: argparse.Namespace) -> None:
    clustered_like(args.n, args.dim, args.seed, Path(args.out), args.centres_of)


def clustered_like(n: int, dim: int, seed: int, out: Path, corpus_n: int) -> None:
    """n rows from the clusters of a corpus of `corpus_n` rows (clustered's shapes depend on n)."""
    shape = np.random.default_rng(0)
    top = shape.standard_normal((max(16, corpus_n // 1000), dim), dtype=np.float32)
    t1 = shape.standard_normal((1021, dim), dtype=np.float32)
    t2 = shape.standard_normal((1031, dim), dtype=np.float32)
    rng = np.random.default_rng(seed)
    sub = rng.integers(0, max(64, corpus_n // 10), n)
    centre = top[sub % len(top)] + 0.6 * (t1[sub % 1021] + t2[(sub // 1021) % 1031]) / np.sqrt(2)
    rows = centre + 0.35 * rng.standard_normal((n, dim), dtype=np.float32)
    rows /= np.linalg.norm(rows, axis=1, keepdims=True)
    np.save(out, rows.astype(np.float32))


if __name__ == "__main__":
    main()
