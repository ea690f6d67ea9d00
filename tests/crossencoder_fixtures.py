"""Tiny data for the cross-encoder kinds (regression scores, reranking) and the tiny runs the
tests train on them in seconds."""

from __future__ import annotations

import random

from text_fixtures import WORDS

TINY = dict(d_model=16, n_heads=2, d_ff=32, n_layers=1, vocab_size=300, max_tokens=256, threads=1,
            eval_every=2, steps=2, progress=False, log=lambda *a: None)


def score_rows(n: int = 120, seed: int = 0, pair: bool = True) -> list[dict]:
    """Pairs of word lists scored by how many words they share (Jaccard); single texts scored by
    their share of the word "cat"."""
    rng = random.Random(seed)
    rows = []
    for _ in range(n):
        a = rng.sample(WORDS, 4)
        if not pair:
            rows.append({"text": " ".join(a), "score": round(sum(w == "cat" for w in a) / 4, 3)})
            continue
        b = rng.sample(a, rng.randint(0, 4)) + rng.sample(WORDS, 2)
        rows.append({"text": " ".join(a), "text_pair": " ".join(b),
                     "score": round(len(set(a) & set(b)) / len(set(a) | set(b)), 3)})
    return rows


def rerank_rows(n: int = 60, seed: int = 0, negatives: int = 3) -> list[dict]:
    """A query of two words; its positive holds them, its negatives do not (always)."""
    rng = random.Random(seed)
    rows = []
    for _ in range(n):
        query = rng.sample(WORDS, 2)
        positive = " ".join(query + rng.sample(WORDS, 3))
        rows.append({"query": " ".join(query), "positive": positive,
                     "negatives": [" ".join(rng.sample(WORDS, 5)) for _ in range(negatives)]})
    return rows


def flat_rows(n: int = 40, seed: int = 0) -> list[dict]:
    """query/passage/label rows: per query one passage graded 2, one 1, two 0."""
    rng = random.Random(seed)
    rows = []
    for _ in range(n):
        query = rng.sample(WORDS, 2)
        q = " ".join(query)
        rows += [{"query": q, "passage": " ".join(query + rng.sample(WORDS, 3)), "label": 2},
                 {"query": q, "passage": " ".join(query[:1] + rng.sample(WORDS, 3)), "label": 1},
                 *({"query": q, "passage": " ".join(rng.sample(WORDS, 5)), "label": 0} for _ in range(2))]
    return rows
