"""Embedding at scale, streamed: texts embedded a chunk at a time, and a running top-k.

    for numbers, texts, emb in embed_chunks(st, TextLines(path, "--corpus")): ...  # flat memory
    best = TopK(queries, k); best.add(block, first_index); best.result()

Memory grows with the chunk size and k, never with the number of lines: texts are read
lazily, embedded ``CHUNK`` at a time, and queries x corpus is computed ``QUERIES`` x ``BLOCK``
at a time (not the (Q + N) x (Q + N) matrix; per query, k scores are kept). Under torchrun the
chunks are shared out among the ranks and yielded by rank 0 (tformer.embeddings.shards).
tformer.embeddings.index keeps them as an index.
"""

from __future__ import annotations

import warnings
from collections.abc import Callable, Iterable, Iterator
from typing import Any

import numpy as np

from tformer.text.prefix import LongTexts
from tformer.text.tokenizer import TextTooLong

CHUNK = 1024  # texts embedded (and held) at a time
BLOCK = 8192  # corpus vectors compared with the queries at a time
QUERIES = 256  # queries compared with a block at a time (the scores held: QUERIES x BLOCK)


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
                 world: int = 1, where: Callable[[int], str] = "input {}".format, total: int | None = None,
                 **encode_kw) -> Iterator[tuple[list[int], list[str], np.ndarray]]:
    """(line numbers, texts, (n, D) float32 embeddings) a chunk at a time, in input order.
    A non-finite embedding (broken weights) is refused: it would rank or print as NaN.
    With several ranks (torchrun) each embeds its share, and rank 0 yields every chunk
    (tformer.embeddings.shards); the others yield nothing but must iterate to the end.
    Texts longer than the model's maximum: one warning at the end naming their inputs (not
    one a chunk), or, with truncation=False, an error naming the input. ``where(number)``
    names input `number` in these messages (a command's: "--corpus c.txt:3"). ``total``: the
    texts to embed in all, where known: the chunks after one count in what a compiled kernel
    must repay (kernels.compiling.more_to_come; a chunk alone never repaid a compilation)."""
    # the truncated texts: their input numbers (none under torchrun's shards)
    from tformer.nn.kernels.compiling import more_to_come  # (the model, so torch, is loaded)

    long = LongTexts(st.tokenizer.max_length or 0)
    seen = [0]  # texts this rank has encoded so far

    def encode(texts: list[str], numbers: list[int] | None = None) -> np.ndarray:
        def noted(indices: list[int], lengths: list[int]) -> None:
            for i, n in zip(indices, lengths, strict=True):
                long.note(numbers[i] if numbers else None, n)

        seen[0] += len(texts)
        try:
            with more_to_come(0 if total is None else total // world - seen[0]):
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
    count = 0
    for numbers, texts, emb in embedded:
        bad = ~np.isfinite(emb).all(axis=1)
        if bad.any():
            raise ValueError(f"{where(numbers[int(bad.argmax())])}: expected a finite embedding, "
                             "got NaN or infinity (the model's weights are not finite)")
        count += len(texts)
        yield numbers, texts, emb
    if long.count:
        inputs = f": {long.places(where)}" if long.named else ""
        warnings.warn(f"{long.count} of {count} texts {long.reason()}{inputs} (--no-truncate raises instead)",
                      UserWarning, stacklevel=2)


def progress_bar(total: int | None, show: bool | None):
    """A progress bar over texts on stderr (total None: a count of texts); None shows it for
    large inputs (of a known total)."""
    import sys

    from tqdm.auto import tqdm

    return tqdm(total=total, unit="text", file=sys.stderr,
                disable=not (show if show is not None else total is not None and total >= 8 * 32))


def unit(x: np.ndarray) -> np.ndarray:
    """Rows scaled to length 1 (cosine similarity is then a dot product)."""
    return x / np.maximum(np.linalg.norm(x, axis=1, keepdims=True), 1e-12)


def check_queries(queries: np.ndarray, dim: int | None = None) -> None:
    """(Q, D) finite query vectors (D = ``dim`` where given), else one line naming them: a list,
    one vector (D,) or a NaN were numpy's errors from inside the search."""
    if not isinstance(queries, np.ndarray) or queries.dtype.kind not in "fiu":
        got = queries.dtype if isinstance(queries, np.ndarray) else type(queries).__name__
        raise TypeError(f"queries: expected a numpy array of vectors (Q, D), got {got}")
    if queries.ndim != 2 or (dim is not None and queries.shape[1] != dim):
        shape = "(Q, D)" if dim is None else f"(Q, {dim}) (the index's vectors)"
        raise ValueError(f"queries: expected shape {shape}, got {queries.shape}")
    if not np.isfinite(queries).all():
        raise ValueError("queries: expected finite vectors, got NaN or inf")


class TopK:
    """The k best corpus rows for each query, kept while blocks of the corpus stream past.

    Ties go to the earlier row, as a stable sort of the whole row would give.
    """

    def __init__(self, queries: np.ndarray, k: int) -> None:
        check_queries(queries)
        if isinstance(k, bool) or not isinstance(k, int | np.integer) or k < 1:
            raise ValueError(f"k: expected a positive int, got {k!r}")
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
            keep = best_columns(both, width)  # score desc, row asc
            scores[q], rows[q] = np.take_along_axis(both, keep, axis=1), np.take_along_axis(ids, keep, axis=1)
        self.scores, self.rows = scores, rows

    def result(self) -> tuple[np.ndarray, np.ndarray]:
        """(scores, rows), each (Q, k), best first."""
        return self.scores, self.rows


def best_columns(scores: np.ndarray, width: int) -> np.ndarray:
    """Per row, the columns of its ``width`` highest scores, best first, ties to the earlier
    column: ``np.lexsort((columns, -scores))[:, :width]``, without sorting the whole row.

    TopK's columns hold its kept rows (best first, ties in row order), then the block's rows
    in order, all of them earlier than the block's: so the earlier column is the earlier row.
    The width-th score is found by a partition; the columns above it and the first ones equal
    to it (in column order) are the top; only those are sorted (a stable sort: ties stay in
    column order). A lexsort of each (QUERIES, k + BLOCK) block was most of a search's time.

    Shape: scores (Q, N), width <= N -> (Q, width) column indices
    """
    q, n = scores.shape
    if width == n:
        return np.argsort(-scores, axis=1, kind="stable")
    kth = -np.partition(-scores, width - 1, axis=1)[:, width - 1 : width]  # (Q, 1): the width-th best
    above = scores > kth  # (Q, N)
    at = scores == kth
    room = width - above.sum(axis=1, keepdims=True)  # (Q, 1): ties at kth that make the top
    chosen = above | (at & (np.cumsum(at, axis=1) <= room))  # exactly width a row
    columns = np.nonzero(chosen)[1].reshape(q, width)  # in column order
    order = np.argsort(-np.take_along_axis(scores, columns, axis=1), axis=1, kind="stable")
    return np.take_along_axis(columns, order, axis=1)
