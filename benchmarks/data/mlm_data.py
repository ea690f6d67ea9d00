"""Data for masked-LM pre-training, and for measuring what it buys, from what this machine has.

Nothing is downloaded: Debian's package summaries (`apt-cache dumpavail`, as build_datasets.py
reads them: the one-line description of each of ~60k packages, labelled with its archive section).

    python benchmarks/data/mlm_data.py --out data/mlm/

writes, each package in one file only:

sections_train.jsonl  {"text", "label"}  a small labelled set: TRAIN_PER_LABEL summaries of each of the
                      LABELS most frequent sections (libs, libdevel, python, doc, perl, devel, ...)
sections_valid.jsonl  {"text", "label"}  VALID_PER_LABEL more of each (the fine-tunes' validation)
sections_test.jsonl   {"text", "label"}  TEST_PER_LABEL more of each (what accuracy is scored on)
packages.txt          every other package summary, one per line: unlabeled text of the same domain,
                      what pre-training reads (the labelled sets' packages are not in it)
packages_valid.txt    HELD summaries held out of packages.txt: a pre-training run's validation...
packages_test.txt     ... and its test (`tformer train --valid/--test`)
packages_eval.txt     EVAL more: the held-out text whose masked-token perplexity scores a
                      pre-trained model (benchmarks/mlm.py), whichever tool trained it
"""

from __future__ import annotations

import argparse
import json
import random
import sys
from collections import Counter
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from build_datasets import debian_packages  # noqa: E402  (beside this file)

LABELS = 8
TRAIN_PER_LABEL, VALID_PER_LABEL, TEST_PER_LABEL = 50, 25, 100
HELD, EVAL = 500, 2000


def build(out: Path, seed: int = 0) -> dict[str, int]:
    """Write the files into ``out``; returns each file's record count."""
    rng = random.Random(seed)
    packages = [p for p in debian_packages() if p["summary"].strip()]
    seen, unique = set(), []
    for p in packages:  # one record per summary: no text in two files
        if p["summary"] not in seen:
            seen.add(p["summary"])
            unique.append(p)
    rng.shuffle(unique)
    sections = [s for s, _ in Counter(p["section"] for p in unique).most_common(LABELS)]
    labelled: dict[str, list[dict[str, str]]] = {"train": [], "valid": [], "test": []}
    taken: Counter = Counter()
    rest = []
    for p in unique:
        n, section = taken[p["section"]], p["section"]
        if section in sections and n < TRAIN_PER_LABEL + VALID_PER_LABEL + TEST_PER_LABEL:
            split = ("train" if n < TRAIN_PER_LABEL else
                     "valid" if n < TRAIN_PER_LABEL + VALID_PER_LABEL else "test")
            labelled[split].append({"text": p["summary"], "label": section})
            taken[section] += 1
        else:
            rest.append(p["summary"])
    out.mkdir(parents=True, exist_ok=True)
    counts = {}
    for split, rows in labelled.items():
        rng.shuffle(rows)
        counts[f"sections_{split}.jsonl"] = _jsonl(out / f"sections_{split}.jsonl", rows)
    held = {"packages_valid.txt": rest[:HELD], "packages_test.txt": rest[HELD : 2 * HELD],
            "packages_eval.txt": rest[2 * HELD : 2 * HELD + EVAL], "packages.txt": rest[2 * HELD + EVAL :]}
    for name, texts in held.items():
        (out / name).write_text("".join(t.replace("\n", " ") + "\n" for t in texts), encoding="utf-8")
        counts[name] = len(texts)
    return counts


def _jsonl(path: Path, rows: list[dict[str, str]]) -> int:
    path.write_text("".join(json.dumps(r, ensure_ascii=False) + "\n" for r in rows), encoding="utf-8")
    return len(rows)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", default="data/mlm", help="output folder (default: data/mlm/)")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    for name, n in build(Path(args.out), args.seed).items():
        print(f"{Path(args.out) / name}: {n:,} records")


if __name__ == "__main__":
    main()
