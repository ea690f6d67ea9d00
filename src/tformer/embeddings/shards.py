"""A corpus embedded by several processes (torchrun, on one machine or many), written by one.

    torchrun --nproc_per_node 8 -m tformer embed MODEL_DIR --file corpus.txt --out x.npy
    torchrun --nnodes 4 --nproc_per_node 8 ... -m tformer index build MODEL_DIR --corpus c.txt --out INDEX

The corpus is cut into chunks of ``CHUNK`` lines, as one process cuts it; in each round every
rank embeds one chunk (chunk i by rank i % world), and rank 0 gathers the round's embeddings
and writes them in input order. A chunk is embedded as one process embeds it, so the vectors
do not depend on the number of ranks; memory on rank 0 grows with world x CHUNK, never with the
corpus. Every rank reads the corpus (each node needs the file at the same path) but embeds only
its own chunks; only rank 0 writes. The process group: tformer.training.distributed.
"""

from __future__ import annotations

import itertools
from collections.abc import Iterable, Iterator

import numpy as np

from tformer.training.distributed import all_gather_rows


def sharded_chunks(encode, chunks: Iterable[list[tuple[int, str]]], rank: int, world: int, dim: int
                   ) -> Iterator[tuple[list[int], list[str], np.ndarray]]:
    """(line numbers, texts, (n, D) embeddings) of every chunk, in input order, on rank 0; other
    ranks embed their share and yield nothing. `encode(texts)` -> (n, dim) float32 embeddings;
    every rank must iterate this to its end (each round is a collective)."""
    chunks = iter(chunks)
    while round_ := list(itertools.islice(chunks, world)):  # one chunk per rank; the last may be short
        mine = round_[rank] if rank < len(round_) else []
        emb = encode([t for _, t in mine]) if mine else np.empty((0, dim), dtype=np.float32)
        gathered = all_gather_rows(emb, world)
        if rank != 0:
            continue
        for chunk, rows in zip(round_, gathered, strict=False):  # ranks past the round's end: none
            yield [n for n, _ in chunk], [t for _, t in chunk], rows
