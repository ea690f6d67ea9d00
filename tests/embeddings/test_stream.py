"""tformer.embeddings.stream: a running top-k equals ranking the whole matrix, in flat memory."""

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import tformer.embeddings.stream
from tformer.embeddings.stream import TopK, chunks, unit


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
    monkeypatch.setattr(tformer.embeddings.stream, "QUERIES", 3)  # 10 queries: slabs of 3, 3, 3, 1
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

    monkeypatch.setattr(tformer.embeddings.stream, "QUERIES", 16)
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
