"""Build multi-label and skewed single-label data sets for `tformer train --data` from what this
machine already has (nothing is downloaded).

    python benchmarks/data/multilabel_data.py --out data/

writes these files:

debtags.jsonl          {"text", "labels"}  Debian package summaries (the one-line description,
                       e.g. "Real-time strategy game of ancient warfare") with the package's
                       debtags (the `Tag:` field apt's package lists carry: game::strategy,
                       interface::x11, role::program, ...), the TAGS most frequent tags kept;
                       packages with none of them left out. Real labels by Debian's taggers, as
                       skewed as real tags are (role::program on about half, the rarest on ~1%).
debtags_20.jsonl       the same, the 20 most frequent tags (fewer, less rare labels).
debtags_100.jsonl      the same, the 100 most frequent tags (more, rarer labels).
debtags.csv            debtags.jsonl as CSV: text,labels with the tags joined by ';' (for
                       --label-separator ';').
sections_skew{R}.jsonl {"text", "label"}  debian_sections' packages (build_datasets.py: summary ->
                       archive section, 12 sections) subsampled so that the i-th most frequent
                       section keeps CAP * R ** (-i / 11) packages: R = 1 is balanced, R = 10 and
                       100 skewed (the rarest has 1/R of the most frequent's).
man_skew{R}.jsonl      man pages' DESCRIPTION -> section (build_datasets.py's man_sections, 6
                       sections), subsampled the same way (R = 1, 10, 50).

The train/validation/test split is left to `tformer train` (a seeded split by input text).
"""

from __future__ import annotations

import argparse
import csv
import json
import random
import subprocess
import sys
from collections import Counter
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from build_datasets import LABELS, debian_packages, man_sections  # noqa: E402

TAGS = 50
SECTION_CAP, MAN_CAP = 2000, 1500  # the most frequent label's records in a skewed set


def tagged_packages() -> list[dict]:
    """(summary, tags) of every package apt knows with a Tag: field."""
    text = subprocess.run(["apt-cache", "dumpavail"], capture_output=True, text=True, check=True).stdout
    out, seen = [], set()
    for stanza in text.split("\n\n"):
        fields: dict[str, str] = {}
        key = None
        for line in stanza.splitlines():
            if line.startswith((" ", "\t")) and key:
                fields[key] += " " + line.strip()
            elif ":" in line:
                key, _, value = line.partition(":")
                fields[key] = value.strip()
        name, description, tags = fields.get("Package"), fields.get("Description"), fields.get("Tag")
        if not (name and description and tags) or name in seen:
            continue
        seen.add(name)
        summary = description.split("\n")[0].strip()
        labels = [t.strip() for t in tags.split(",") if t.strip()]
        if summary and labels:
            out.append({"text": summary, "labels": labels})
    return out


def top_tags(packages: list[dict], k: int) -> list[dict]:
    counts = Counter(t for p in packages for t in p["labels"])
    keep = {t for t, _ in counts.most_common(k)}
    rows = [{"text": p["text"], "labels": [t for t in p["labels"] if t in keep]} for p in packages]
    return [r for r in rows if r["labels"]]


def skewed(rows: list[dict], ratio: float, cap: int, rng: random.Random) -> list[dict]:
    """The i-th most frequent label keeps cap * ratio ** (-i / (C - 1)) of its rows."""
    by_label: dict[str, list[dict]] = {}
    for r in rows:
        by_label.setdefault(r["label"], []).append(r)
    order = sorted(by_label, key=lambda label: -len(by_label[label]))
    out = []
    for i, label in enumerate(order):
        keep = max(int(round(cap * ratio ** (-i / (len(order) - 1)))), 10)
        out += by_label[label][:keep]
    rng.shuffle(out)
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", default="data", help="output folder (default: data/)")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    rng = random.Random(args.seed)

    packages = tagged_packages()
    rng.shuffle(packages)
    for k, name in ((TAGS, "debtags"), (20, "debtags_20"), (100, "debtags_100")):
        rows = top_tags(packages, k)
        _write(out / f"{name}.jsonl", rows)
        counts = Counter(t for r in rows for t in r["labels"])
        print(f"  {len(counts)} tags, {sum(counts.values()) / len(rows):.2f} a record; most frequent "
              f"{counts.most_common(1)[0]}, rarest {counts.most_common()[-1]}")
        if name == "debtags":
            with (out / "debtags.csv").open("w", newline="", encoding="utf-8") as f:
                w = csv.writer(f)
                w.writerow(["text", "labels"])
                w.writerows([r["text"], ";".join(r["labels"])] for r in rows)

    sections = [{"text": p["summary"], "label": p["section"]} for p in debian_packages()]
    common = {s for s, _ in Counter(r["label"] for r in sections).most_common(LABELS)}
    sections = [r for r in sections if r["label"] in common]
    rng.shuffle(sections)
    for ratio in (1, 10, 100):
        _write(out / f"sections_skew{ratio}.jsonl", skewed(sections, ratio, SECTION_CAP, rng))
    man = man_sections(rng)
    for ratio in (1, 10, 50):
        _write(out / f"man_skew{ratio}.jsonl", skewed(man, ratio, MAN_CAP, rng))


def _write(path: Path, rows: list[dict]) -> None:
    with path.open("w", encoding="utf-8") as f:
        for r in rows:
            f.write(json.dumps(r, ensure_ascii=False) + "\n")
    labels = Counter(label for r in rows for label in (r["labels"] if "labels" in r else [r["label"]]))
    print(f"{path}: {len(rows)} records, {len(labels)} labels (most {labels.most_common(1)[0][1]}, "
          f"least {labels.most_common()[-1][1]})")


if __name__ == "__main__":
    main()
