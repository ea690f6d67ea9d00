"""`tformer embed` and `index build` under torchrun: the corpus is shared out among the ranks
and rank 0 writes it, in input order, the same vectors one process writes. Tested with several
CPU processes on one machine (gloo), as tests/training/test_distributed.py does for training;
on GPUs the same code talks NCCL (`make test-gpu` on a machine with two)."""

import json
import os
import shutil
import subprocess
import sys
import threading
from pathlib import Path

import numpy as np
import pytest
from hf_bert_fixtures import st_dir

from tformer.embeddings import shards
from tformer.embeddings.stream import CHUNK

SRC = str(Path(__file__).resolve().parents[2] / "src")
TORCHRUN = Path(sys.executable).parent / "torchrun"
needs_torchrun = pytest.mark.skipif(shutil.which("torchrun", path=str(TORCHRUN.parent)) is None,
                                    reason="torchrun not installed")


def test_rounds_give_every_rank_a_chunk_and_rank_0_every_chunk_in_order(monkeypatch):
    """Three ranks in threads, the gather a barrier between them: chunk i is embedded by rank
    i % 3 only, and rank 0 yields all 7 chunks (the last round short) in input order."""
    world, chunks = 3, [[(10 * c + i, f"t{c}.{i}") for i in range(2)] for c in range(7)]
    deposited: dict[int, np.ndarray] = {}
    barrier = threading.Barrier(world)

    def gather(rows, world):
        deposited[threading.current_thread().rank] = rows
        barrier.wait()
        out = [deposited[r] for r in range(world)]
        barrier.wait()  # every rank has read before the next round writes
        return out

    monkeypatch.setattr(shards, "all_gather_rows", gather)
    embedded_by: dict[str, int] = {}
    results: dict[int, list] = {}

    def rank_main(rank):
        threading.current_thread().rank = rank

        def encode(texts):
            for t in texts:
                embedded_by[t] = rank
            return np.array([[float(t[1:].split(".")[0]), float(t.split(".")[1])] for t in texts], np.float32)

        results[rank] = list(shards.sharded_chunks(encode, iter(chunks), rank, world, dim=2))

    threads = [threading.Thread(target=rank_main, args=(r,)) for r in range(world)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=30)
    assert results[1] == results[2] == []
    assert [numbers for numbers, _, _ in results[0]] == [[n for n, _ in c] for c in chunks]
    for c, (_, texts, emb) in enumerate(results[0]):
        assert texts == [t for _, t in chunks[c]] and emb.tolist() == [[c, 0], [c, 1]]
    assert embedded_by == {t: c % world for c in range(7) for _, t in chunks[c]}


def _run(cmd, cwd):
    env = {**os.environ, "PYTHONPATH": SRC, "OMP_NUM_THREADS": "1"}
    proc = subprocess.run([str(c) for c in cmd], capture_output=True, text=True, env=env, cwd=cwd, timeout=300)
    assert proc.returncode == 0, proc.stderr[-2000:]
    return proc


@pytest.fixture(scope="module")
def corpus(tmp_path_factory):
    """Past two chunks (two ranks: a full round, then rank 0 alone with the rest)."""
    words = ["the cat", "a dog runs", "rivers flow to the sea", "one", "two birds sing at dawn"]
    path = tmp_path_factory.mktemp("corpus") / "corpus.txt"
    path.write_text("".join(f"{words[i % 5]} {i}\n" for i in range(2 * CHUNK + 37)))
    return path


@needs_torchrun
def test_embed_on_two_ranks_writes_what_one_process_writes(tmp_path, corpus):
    common = ["embed", st_dir(), "--file", corpus, "--dtype", "fp32", "--threads", "1", "--device", "cpu"]
    _run([sys.executable, "-m", "tformer", *common, "--out", tmp_path / "one.npy"], tmp_path)
    proc = _run([TORCHRUN, "--standalone", "--nproc_per_node", "2", "-m", "tformer", *common,
                 "--out", tmp_path / "two.npy"], tmp_path)
    assert proc.stderr.count("wrote ") == 1  # rank 0 alone writes and says so
    one, two = np.load(tmp_path / "one.npy"), np.load(tmp_path / "two.npy")
    assert one.shape == two.shape == (2 * CHUNK + 37, 32)
    assert np.abs(one - two).max() <= 1e-6  # each chunk embedded as one process embeds it


@pytest.mark.slow  # ~21 s: two torchrun ranks
@needs_torchrun
def test_index_build_on_two_ranks_is_the_index_one_process_builds(tmp_path, corpus):
    """Exact and approximate: rank 0 builds the approximate index from the vectors the ranks
    wrote together, alone, after they part: the same vectors, quantizer, parameters and results."""
    pytest.importorskip("faiss")
    common = ["index", "build", st_dir(), "--corpus", corpus, "--dtype", "fp32", "--threads", "1",
              "--device", "cpu", "--ann", "ivfpq"]
    _run([sys.executable, "-m", "tformer", *common, "--out", tmp_path / "one"], tmp_path)
    proc = _run([TORCHRUN, "--standalone", "--nproc_per_node", "2", "-m", "tformer", *common,
                 "--out", tmp_path / "two"], tmp_path)
    assert proc.stderr.count("chose nprobe") == 1  # rank 0 alone builds the approximate index
    a, b = (json.loads((tmp_path / d / "index.json").read_text()) for d in ("one", "two"))
    assert a == b and a["ann"]["kind"] == "ivfpq"
    assert (tmp_path / "one" / "texts.jsonl").read_text() == (tmp_path / "two" / "texts.jsonl").read_text()
    va, vb = np.load(tmp_path / "one" / "vectors.npy"), np.load(tmp_path / "two" / "vectors.npy")
    assert np.abs(va - vb).max() <= 1e-6
    np.save(tmp_path / "q.npy", va[::97] + 0.05)
    found = {}
    for d in ("one", "two"):
        for how in ([], ["--exact"]):
            out = _run([sys.executable, "-m", "tformer", "search", tmp_path / d, "--query-vectors",
                        tmp_path / "q.npy", "-k", 10, "--format", "jsonl", *how], tmp_path).stdout
            found[d, bool(how)] = [json.loads(line) for line in out.splitlines()]
    for exact in (False, True):
        one, two = found["one", exact], found["two", exact]
        assert [r["ids"] for r in one] == [r["ids"] for r in two]
        assert np.abs(np.array([r["scores"] for r in one]) - np.array([r["scores"] for r in two])).max() <= 1e-6
    assert sorted(p.name for p in tmp_path.iterdir()) == ["one", "q.npy", "two"]  # no leftovers
