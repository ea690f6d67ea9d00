"""Hard negatives for embedding training, mined from an index of the positives.

    mine(st, MODEL_DIR, "pairs.jsonl", "mined.jsonl", Mining(negatives=1, relative_margin=0.05))

For each {"anchor", "positive"} record the anchor is searched in an index of every positive of
the file (built with the same model, exact or approximate as tformer.embeddings.ann chooses),
and the best-ranked texts that are not one of that anchor's positives (nor the anchor itself)
become its ``negative``s, as sentence-transformers' ``mine_hard_negatives`` does: ranks
``range_min`` .. ``range_max`` of what is left are candidates, and a candidate scoring too close to
the positive is skipped as a likely false negative: above ``positive - absolute_margin``, or above
``positive x (1 - relative_margin)`` (NV-Retriever's positive-aware mining, Moreira et al. 2024;
the default keeps candidates below 95% of the positive's score). The output has one record per
negative ({"anchor", "positive", "negative"}, which `tformer train --data` reads as embedding
data); a pair with no candidate left is kept without one, so no pair is lost.

Memory: 8 bytes of hash per index row plus its offset in texts.jsonl (texts are read back by
offset), and a hash per distinct anchor; the pairs are streamed, a chunk at a time.
"""

from __future__ import annotations

import hashlib
import json
import random
import shutil
import sys
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from tformer.embeddings.index import TEXTS_FILE, VECTORS_FILE, Index
from tformer.embeddings.stream import chunks, unit
from tformer.text.lines import TextLines

CHUNK = 1024  # pairs embedded and searched at a time


@dataclass(frozen=True)
class Mining:
    """How negatives are chosen (the defaults of sentence-transformers' mine_hard_negatives,
    but one negative a pair and a 5% relative margin)."""

    negatives: int = 1
    range_min: int = 0
    range_max: int = 50
    absolute_margin: float | None = None
    relative_margin: float | None = 0.05
    sampling: str = "top"  # "top": the best-ranked; "random": drawn from the candidates (seeded)
    seed: int = 0

    def __post_init__(self) -> None:
        if self.negatives < 1:
            raise ValueError(f"--negatives: expected >= 1, got {self.negatives}")
        if not 0 <= self.range_min < self.range_max:
            raise ValueError(f"--range-min, --range-max: expected 0 <= min < max, got {self.range_min}, "
                             f"{self.range_max}")
        if self.relative_margin is not None and not 0 <= self.relative_margin < 1:
            raise ValueError(f"--relative-margin: expected a number in [0, 1), got {self.relative_margin}")
        if self.absolute_margin is not None and not np.isfinite(self.absolute_margin):
            raise ValueError(f"--absolute-margin: expected a finite number, got {self.absolute_margin}")
        if self.sampling not in ("top", "random"):
            raise ValueError(f"--sampling: expected top or random, got {self.sampling!r}")

    def ceiling(self, positive: float) -> float:
        """The highest score a negative may have, for a positive scoring ``positive``."""
        top = np.inf
        if self.absolute_margin is not None:
            top = min(top, positive - self.absolute_margin)
        if self.relative_margin is not None:
            top = min(top, positive * (1 - self.relative_margin))
        return top


def text_hash(text: str) -> int:
    return int.from_bytes(hashlib.blake2b(text.encode(), digest_size=8).digest(), "little")


def read_pairs(path: str | Path) -> Iterator[tuple[int, str, str]]:
    """(line number, anchor, positive) of a JSONL file of {"anchor", "positive", ...} records."""
    lines = TextLines(path, "--data")
    for number, line in lines:
        try:
            record = json.loads(line)
        except json.JSONDecodeError as e:
            raise ValueError(f"{lines.at(number)}: expected a JSON object, got invalid JSON "
                             f"({e.msg})") from None
        if not isinstance(record, dict):
            raise ValueError(f"{lines.at(number)}: expected a JSON object, got {type(record).__name__}")
        for field in ("anchor", "positive"):
            value = record.get(field)
            if not isinstance(value, str) or not value.strip():
                raise ValueError(f"{lines.at(number)}: {field}: expected a non-blank string, got {value!r}")
        yield number, record["anchor"], record["positive"]


class _JsonCorpus(TextLines):
    """A corpus file of one JSON string per line (a positive may hold a line break)."""

    def __iter__(self) -> Iterator[tuple[int, str]]:
        for number, raw in enumerate(self._raw(), start=1):
            yield number, json.loads(raw)


def mine(st, model_dir: str | Path, data: str | Path, out: str | Path, how: Mining,
         index: str | Path | None = None, ann: str = "auto", batch_size: int = 32,
         report: Callable[[str], None] | None = None) -> dict[str, Any]:
    """Write ``out`` (atomically, one writer at a time) with mined negatives; a summary back.
    ``index``: where the positives' index is kept (an index already there, built by the same
    model over texts holding every positive, is searched as it is); else a temporary one."""
    from tformer.embeddings.index_build import build_index
    from tformer.storage.files import check_file_name, replaced_on_success, replaced_path
    from tformer.storage.locks import output_lock

    report = report or (lambda line: print(f"tformer mine: {line}", file=sys.stderr))
    check_file_name(out, "--out", "a .jsonl file name")
    out = replaced_path(out, "--out")
    out.parent.mkdir(parents=True, exist_ok=True)
    with output_lock(out, "--out"):
        _refuse_foreign(out)
        anchors: dict[int, set[int]] = {}  # anchor hash -> its positives' hashes
        positives: dict[int, str | None] = {}  # positive hash -> text (while the corpus is written)
        pairs = 0
        for _, anchor, positive in read_pairs(data):
            pairs += 1
            anchors.setdefault(text_hash(anchor), set()).add(h := text_hash(positive))
            positives.setdefault(h, positive)
        if pairs == 0:
            raise ValueError(f"--data {data}: expected at least one {{\"anchor\", \"positive\"}} "
                             "record, got none")
        temp = out.parent / f".{out.name}.mine"
        try:
            if index is not None and Index.is_index(index):
                found = Index(index)
                found.check_model(model_dir)
                report(f"searching the index {index} ({found.meta['n']:,} texts)")
            else:
                where = Path(index) if index is not None else temp / "index"
                shutil.rmtree(temp, ignore_errors=True)
                temp.mkdir()
                corpus = temp / "positives.jsonl"
                with corpus.open("w") as f:
                    for text in positives.values():
                        f.write(json.dumps(text) + "\n")
                report(f"indexing {len(positives):,} distinct positives of {pairs:,} pairs")
                build_index(st, model_dir, _JsonCorpus(corpus, "--data positives"), where,
                            batch_size=batch_size, ann=ann, report=report)
                found = Index(where)
            wanted = set(positives)
            positives.clear()
            summary = _write(st, found, data, out, how, anchors, wanted, batch_size, replaced_on_success)
        finally:
            shutil.rmtree(temp, ignore_errors=True)
    summary["pairs"] = pairs
    return summary


def _refuse_foreign(out: Path) -> None:
    """An existing --out is replaced only if it is a file of mined records (its first line)."""
    from tformer.storage.files import refuse_foreign

    def ours(path: Path) -> bool:
        try:
            with path.open("rb") as f:
                first = json.loads(f.readline(1 << 20) or b"{}")
        except (OSError, ValueError):
            return False
        return path.stat().st_size == 0 or (isinstance(first, dict) and {"anchor", "positive"} <= set(first))

    refuse_foreign(out, "--out", ours,
                   "a file of {\"anchor\", \"positive\"} records (an earlier `tformer mine`)")


def _write(st, index: Index, data, out: Path, how: Mining, anchors: dict[int, set[int]],
           wanted: set[int], batch_size: int, replaced_on_success) -> dict[str, Any]:
    from tformer.embeddings.ann import Rows

    if not index.has_texts:
        raise ValueError(f"--index {index.path}: holds no texts (built from vectors); expected an "
                         "index of texts")
    row_hash, offsets = _texts_table(index)
    by_hash: dict[int, int] = {}  # a positive's text -> its first row
    for r, h in enumerate(row_hash.tolist()):
        if h in wanted:
            by_hash.setdefault(h, r)
    n, dim = index.meta["n"], index.meta["dim"]
    rows = Rows(index.files[VECTORS_FILE], n, dim)
    texts_file = index.files[TEXTS_FILE]
    rng = random.Random(how.seed)
    k = min(n, how.range_max + max(len(p) for p in anchors.values()) + 1)
    counts = {"records": 0, "negatives": 0, "without": 0}
    scores_seen: list[tuple[float, float]] = []
    with replaced_on_success(out) as tmp, tmp.open("w") as f:
        for chunk in chunks(read_pairs(data), CHUNK):
            a_vec = unit(st.encode([a for _, a, _ in chunk], batch_size=batch_size))
            pos_rows = []
            for number, _, positive in chunk:
                row = by_hash.get(text_hash(positive))
                if row is None:
                    raise ValueError(f"--data {data}:{number}: positive not in --index {index.path} "
                                     "(expected an index of every positive)")
                pos_rows.append(row)
            pos_score = np.einsum("bd,bd->b", a_vec, rows.take(np.array(pos_rows)))
            scores, found = index.search(a_vec, k)
            for i, (_, anchor, positive) in enumerate(chunk):
                skip = anchors[a := text_hash(anchor)] | {a}
                ceiling = how.ceiling(float(pos_score[i]))
                ranked = [(float(s), int(r)) for s, r in zip(scores[i], found[i], strict=True)
                          if r >= 0 and int(row_hash[r]) not in skip]
                candidates = [(s, r) for s, r in ranked[how.range_min:how.range_max] if s <= ceiling]
                chosen = (candidates[:how.negatives] if how.sampling == "top"
                          else rng.sample(candidates, min(how.negatives, len(candidates))))
                if not chosen:
                    counts["without"] += 1
                    f.write(json.dumps({"anchor": anchor, "positive": positive}, ensure_ascii=False) + "\n")
                    counts["records"] += 1
                for s, r in chosen:
                    record = {"anchor": anchor, "positive": positive,
                              "negative": _text_at(texts_file, offsets[r])}
                    f.write(json.dumps(record, ensure_ascii=False) + "\n")
                    counts["records"] += 1
                    counts["negatives"] += 1
                    scores_seen.append((float(pos_score[i]), s))
    if scores_seen:
        both = np.array(scores_seen)
        counts["mean_positive"], counts["mean_negative"] = (round(float(x), 4) for x in both.mean(axis=0))
    return counts


def _texts_table(index: Index) -> tuple[np.ndarray, np.ndarray]:
    """(hash of each row's text, its byte offset in texts.jsonl), one pass."""
    f = index.files[TEXTS_FILE]
    f.seek(0)
    hashes = np.empty(index.meta["n"], dtype=np.uint64)
    offsets = np.empty(index.meta["n"], dtype=np.int64)
    at, row = 0, 0
    for raw in f:
        if row >= len(hashes):
            break
        hashes[row], offsets[row] = text_hash(json.loads(raw)["text"]), at
        at += len(raw)
        row += 1
    if row != len(hashes):
        raise ValueError(f"INDEX {index.path / TEXTS_FILE}: expected {len(hashes)} lines, got {row}")
    return hashes, offsets


def _text_at(f, offset: int) -> str:
    f.seek(int(offset))
    return json.loads(f.readline())["text"]
