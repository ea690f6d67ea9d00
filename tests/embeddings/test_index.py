"""tformer.embeddings.index: a running top-k equals ranking the whole matrix; an index is one unit."""

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import tformer.embeddings.index
from tformer.embeddings.index import TopK, chunks, unit


@settings(max_examples=40, deadline=None)
@given(n=st.integers(1, 60), q=st.integers(1, 4), k=st.integers(1, 10), block=st.integers(1, 17),
       seed=st.integers(0, 1000), ties=st.booleans())
def test_running_top_k_equals_a_stable_sort_of_the_full_matrix(n, q, k, block, seed, ties):
    rng = np.random.default_rng(seed)
    corpus = rng.standard_normal((n, 8)).astype(np.float32)
    if ties:
        corpus[n // 2 :] = corpus[: n - n // 2]  # duplicated rows: equal scores
    queries = rng.standard_normal((q, 8)).astype(np.float32)
    best = TopK(queries, k)
    for first in range(0, n, block):
        best.add(corpus[first : first + block], first)
    scores, rows = best.result()
    full = unit(queries) @ unit(corpus).T  # (Q, N)
    for i in range(q):
        expected = np.argsort(-full[i], kind="stable")[: min(k, n)]
        np.testing.assert_allclose(scores[i], full[i, expected], atol=1e-6)
        np.testing.assert_allclose(full[i, rows[i]], full[i, expected], atol=1e-6)


@pytest.mark.parametrize("seed", range(6))
def test_running_top_k_over_slabs_of_queries_equals_a_stable_sort(monkeypatch, seed):
    monkeypatch.setattr(tformer.embeddings.index, "QUERIES", 3)  # 10 queries: slabs of 3, 3, 3, 1
    rng = np.random.default_rng(seed)
    corpus = rng.standard_normal((50, 8)).astype(np.float32)
    corpus[25:] = corpus[:25]  # ties
    queries = rng.standard_normal((10, 8)).astype(np.float32)
    best = TopK(queries, 7)
    for first in range(0, 50, 16):
        best.add(corpus[first : first + 16], first)
    scores, rows = best.result()
    full = unit(queries) @ unit(corpus).T  # (Q, N)
    expected = np.take_along_axis(full, np.argsort(-full, axis=1, kind="stable")[:, :7], axis=1)
    np.testing.assert_allclose(scores, expected, atol=1e-6)  # a tie may differ in its last bit:
    np.testing.assert_allclose(np.take_along_axis(full, rows, axis=1), expected, atol=1e-6)  # rows by score


def test_top_k_memory_does_not_grow_with_the_queries_times_the_block(monkeypatch):
    """Each query held a row of the block's scores (and its row ids): 130 MB per 1,000 queries
    at 8,192 rows a block; 20,000 queries from --file took 2.6 GB. A slab of queries at a time."""
    import tracemalloc

    monkeypatch.setattr(tformer.embeddings.index, "QUERIES", 16)
    queries = np.ones((1024, 8), np.float32)
    block = np.ones((4096, 8), np.float32)
    best = TopK(queries, 5)
    tracemalloc.start()
    best.add(block, 0)
    peak = tracemalloc.get_traced_memory()[1]
    tracemalloc.stop()
    assert peak < 8 << 20, f"peak {peak / 2**20:.1f} MiB (1024 x 4096 scores and ids: ~96 MiB)"


def test_chunks_keep_order_and_sizes():
    assert [len(c) for c in chunks(range(10), 4)] == [4, 4, 2]
    assert [x for c in chunks(iter(range(10)), 3) for x in c] == list(range(10))


def test_top_k_memory_does_not_depend_on_the_corpus():
    best = TopK(np.ones((2, 4), np.float32), 3)
    for first in range(0, 10_000, 1000):
        best.add(np.ones((1000, 4), np.float32), first)
        assert best.scores.shape == (2, 3)
    assert best.rows[0].tolist() == [0, 1, 2]  # ties: the earliest rows


@pytest.mark.parametrize("suffix", [".npy", ".jsonl"])
def test_embed_output_resumes_and_publishes_atomically(tmp_path, suffix):
    from tformer.embeddings.output import open_output
    from tformer.storage import files

    out = tmp_path / f"e{suffix}"
    if suffix == ".npy":  # an earlier output (dim 2): replaceable, where a user's file is not
        np.save(out, np.zeros((1, 2), dtype=np.float32))
    else:
        out.write_text('{"text": "old", "embedding": [0.0, 0.0]}\n')
    old = out.read_bytes()
    identity = {"n": 6, "dim": 2, "model": "m"}
    rows = np.arange(12, dtype=np.float32).reshape(6, 2)
    texts = [f"t{i}" for i in range(6)]
    calls = []

    def full_disk(what):
        calls.append(what)
        if len(calls) == 4:  # the second chunk (each: rows, then its progress record)
            raise OSError(28, "No space left on device")

    files.fault_hook = full_disk
    try:
        with pytest.raises(OSError), open_output(out, identity) as w:
            for i in range(0, 6, 2):
                w.write(texts[i : i + 2], rows[i : i + 2])
    finally:
        files.fault_hook = None
    assert out.read_bytes() == old  # untouched until the new one is complete
    with open_output(out, identity) as w:
        assert w.done == 2  # the first chunk was recorded, then the disk was full
        for i in range(w.done, 6, 2):
            w.write(texts[i : i + 2], rows[i : i + 2])
    if suffix == ".npy":
        np.testing.assert_array_equal(np.load(out), rows)
    else:
        import json

        got = [json.loads(line) for line in out.read_text().splitlines()]
        assert [g["text"] for g in got] == texts
        np.testing.assert_array_equal([g["embedding"] for g in got], rows)
    assert sorted(p.name for p in tmp_path.iterdir()) == [out.name]


def test_index_build_refuses_a_path_that_is_not_an_index(tmp_path):
    from tformer.embeddings.index import build_index

    (tmp_path / "mine").mkdir()
    (tmp_path / "mine" / "notes.txt").write_text("mine")
    (tmp_path / "c.txt").write_text("a\nb\n")
    with pytest.raises(ValueError, match=r"exists and holds notes\.txt; a rebuild replaces"):
        build_index(None, tmp_path, tmp_path / "c.txt", tmp_path / "mine")
    assert (tmp_path / "mine" / "notes.txt").read_text() == "mine"
    # A file that only happens to be named index.json is no index: the folder stays whole.
    (tmp_path / "site").mkdir()
    (tmp_path / "site" / "index.json").write_text('{"pages": []}')
    with pytest.raises(ValueError, match=r"site: exists and is not a tformer index"):
        build_index(None, tmp_path, tmp_path / "c.txt", tmp_path / "site")
    assert (tmp_path / "site" / "index.json").read_text() == '{"pages": []}'



def test_a_partial_output_with_nothing_recorded_is_not_said_to_be_for_other_inputs(tmp_path):
    """A first chunk that failed (a full disk) left a .partial and no progress record: the rerun
    said "starting over: its interrupted part was for other inputs or options", which it was not.
    Only a recorded part for another identity is discarded with that message."""
    from tformer.embeddings.output import open_output

    out = tmp_path / "e.npy"
    identity = {"n": 2, "dim": 2, "model": "m"}
    out.with_name("e.npy.partial").write_bytes(b"\0" * 10)  # no e.npy.partial.json beside it
    with pytest.raises(KeyboardInterrupt), open_output(out, identity) as w:
        assert w.done == 0 and not w.discarded
        w.write(["a"], np.zeros((1, 2), dtype=np.float32))  # one row recorded, then stopped
        raise KeyboardInterrupt
    with pytest.raises(KeyboardInterrupt), open_output(out, {**identity, "model": "other"}) as w:
        assert w.done == 0 and w.discarded  # recorded, for another model: discarded, and said
        raise KeyboardInterrupt
