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


def _lexsorted_top_k(queries: np.ndarray, corpus: np.ndarray, k: int, block: int):
    """TopK as it was: a lexsort (score desc, row asc) of each block's whole (Q, k + b) matrix."""
    q = unit(queries.astype(np.float32))
    scores, rows = np.empty((len(q), 0), np.float32), np.empty((len(q), 0), np.int64)
    for first in range(0, len(corpus), block):
        b = unit(corpus[first : first + block]).astype(np.float32)
        sims = q @ b.T
        both = np.concatenate([scores, sims], axis=1)
        ids = np.concatenate([rows, np.broadcast_to(np.arange(first, first + len(b)), sims.shape)], axis=1)
        keep = np.lexsort((ids, -both), axis=1)[:, : min(k, both.shape[1])]
        scores, rows = np.take_along_axis(both, keep, axis=1), np.take_along_axis(ids, keep, axis=1)
    return scores, rows


@pytest.mark.parametrize("seed", range(8))
def test_top_k_is_bit_for_bit_the_lexsorted_top_k_with_many_exact_ties(monkeypatch, seed):
    """The partition-based top-k keeps the same rows in the same order, and the same scores to
    the bit, as the lexsort it replaced: corpus rows drawn from a few vectors tie exactly."""
    monkeypatch.setattr(tformer.embeddings.stream, "QUERIES", 7)
    rng = np.random.default_rng(seed)
    pool = rng.integers(-1, 2, (5, 6)).astype(np.float32) + np.eye(5, 6, dtype=np.float32)  # no zero row
    corpus = pool[rng.integers(0, len(pool), 300)]  # (300, 6): every score tied many times
    corpus[rng.integers(0, 300, 40)] = rng.standard_normal((40, 6))  # and some that tie with none
    queries = np.concatenate([rng.standard_normal((10, 6)), pool[:3]]).astype(np.float32)
    for k, block in ((1, 300), (5, 17), (12, 64), (40, 33), (300, 50), (500, 128)):
        best = TopK(queries, k)
        for first in range(0, len(corpus), block):
            best.add(corpus[first : first + block], first)
        expected = _lexsorted_top_k(queries, corpus, k, block)
        for ours, theirs in zip(best.result(), expected, strict=True):
            assert ours.dtype == theirs.dtype and ours.tobytes() == theirs.tobytes(), (k, block)


def test_best_columns_is_a_lexsort_cut_to_width():
    rng = np.random.default_rng(0)
    scores = rng.integers(0, 4, (50, 40)).astype(np.float32)  # ties everywhere
    for width in (1, 3, 17, 39, 40):
        expected = np.lexsort((np.broadcast_to(np.arange(40), scores.shape), -scores), axis=1)[:, :width]
        assert np.array_equal(tformer.embeddings.stream.best_columns(scores, width), expected), width


def test_embed_chunks_warn_of_every_cut_text_keeping_a_few_places():
    """The warning after a stream of long texts counts them all and names the first five, as
    LongTexts keeps them (a (number, tokens) pair per cut text was kept to the end before)."""
    import warnings
    from types import SimpleNamespace

    from tformer.embeddings.stream import embed_chunks
    from tformer.text.prefix import AtLeast

    class Cutting:  # every text cut; its count as the tokenizer would give it
        dim, tokenizer = 2, SimpleNamespace(max_length=16)

        def encode(self, texts, on_long, **_):
            on_long(list(range(len(texts))), [AtLeast(40) if t == "x 7" else 20 for t in texts])
            return np.ones((len(texts), 2), dtype=np.float32)

    numbered = [(n, f"x {n}") for n in range(1, 41)]
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        assert sum(len(t) for _, t, _ in embed_chunks(Cutting(), numbered, size=8)) == 40
    (warning,) = caught
    assert str(warning.message) == (
        "40 of 40 texts are longer than the model's maximum length (16 tokens; the longest has 40 or more), "
        "so they were truncated: input 1, input 2, input 3, input 4, input 5, ... (--no-truncate raises "
        "instead)")


def test_embed_chunks_tell_each_chunk_how_many_texts_come_after_it(monkeypatch):
    """`tformer embed` and `index build` encode a chunk at a time: with the total known, each
    chunk's encode counts the texts after it (kernels.compiling.more_to_come), what a compiled
    kernel must repay; without it, nothing more."""
    from types import SimpleNamespace

    from tformer.embeddings.stream import embed_chunks
    from tformer.nn.kernels.compiling import items_to_come

    class Counting:
        dim, tokenizer, told = 2, SimpleNamespace(max_length=16), []

        def encode(self, texts, on_long, **_):
            self.told.append(items_to_come())
            return np.ones((len(texts), 2), dtype=np.float32)

    numbered = [(n, f"x {n}") for n in range(1, 21)]
    st = Counting()
    assert sum(len(t) for _, t, _ in embed_chunks(st, numbered, size=8, total=20)) == 20
    assert st.told == [12, 4, 0] and items_to_come() == 0
    st.told.clear()
    list(embed_chunks(st, numbered, size=8))
    assert st.told == [0, 0, 0]
