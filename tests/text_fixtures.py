"""Tiny text data sets for the training tests, one per objective and file format.

Real-looking text with the things a tokenizer must keep: case, accents, punctuation,
`%s` placeholders and a non-Latin script.
"""

from __future__ import annotations

import csv
import json
import random
from pathlib import Path

WORDS = ("the cat dog sat on a mat big red house river café naïve Straße 東京 %s hello "
         "world, fine. yes! no?").split()
ANIMALS, PLACES = ["cat", "dog", "bird", "fish"], ["house", "river", "city", "road"]


def seq2seq_rows(n: int = 120, seed: int = 0) -> list[dict[str, str]]:
    """Reverse the words: learnable in a few hundred steps, checkable by eye."""
    rng = random.Random(seed)
    rows = []
    for _ in range(n):
        s = " ".join(rng.choice(WORDS) for _ in range(rng.randint(2, 6)))
        rows.append({"source": s, "target": " ".join(reversed(s.split()))})
    return rows


def classification_rows(n: int = 120, seed: int = 0, pair: bool = False) -> list[dict[str, str]]:
    rng = random.Random(seed)
    rows = []
    for _ in range(n):
        label = rng.choice(["animal", "place"])
        pool = ANIMALS if label == "animal" else PLACES
        row = {"text": " ".join(rng.choice(pool + ["the", "a", "big"]) for _ in range(5)), "label": label}
        if pair:
            row["text_pair"] = rng.choice(WORDS)
        rows.append(row)
    return rows


def embedding_rows(n: int = 120, seed: int = 0) -> list[dict[str, str]]:
    rng = random.Random(seed)
    rows = []
    for _ in range(n):
        s = " ".join(rng.choice(WORDS) for _ in range(4))
        rows.append({"anchor": s, "positive": s.upper()})
    return rows


def near_pair_rows(n: int = 120, seed: int = 0, words: tuple[str, ...] = WORDS) -> list[dict[str, str]]:
    """anchor -> positive pairs that a pretrained encoder already ranks well: the positive is the
    anchor with one of its six words replaced (`words`: a pretrained model's, to avoid [UNK]s)."""
    rng = random.Random(seed)
    rows = []
    for _ in range(n):
        anchor = [rng.choice(words) for _ in range(6)]
        positive = anchor.copy()
        positive[rng.randrange(6)] = rng.choice(words)
        rows.append({"anchor": " ".join(anchor), "positive": " ".join(positive)})
    return rows


def write(path: Path, rows: list[dict[str, str]]) -> Path:
    """Write rows as JSONL, CSV or TSV, as the suffix says."""
    path = Path(path)
    if path.suffix == ".jsonl":
        path.write_text("".join(json.dumps(r, ensure_ascii=False) + "\n" for r in rows), encoding="utf-8")
        return path
    with path.open("w", newline="", encoding="utf-8") as f:
        w = csv.DictWriter(f, fieldnames=list(rows[0]), delimiter="," if path.suffix == ".csv" else "\t")
        w.writeheader()
        w.writerows(rows)
    return path
