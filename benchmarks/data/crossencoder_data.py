"""Build the cross-encoder benchmark sets (pair scores, reranking) from what this machine has.

Nothing is downloaded: the texts come from files a Debian system ships.

    python benchmarks/data/crossencoder_data.py --out data/

writes, each as train / valid / test files whose texts never cross splits:

debtags_pairs_{train,valid,test}.jsonl   {"text", "text_pair", "score"}: the one-line summaries
        of two Debian packages, scored by how alike their Debtags are (the Jaccard similarity of
        their tag sets, e.g. {implemented-in::perl, devel::lang:perl, role::shared-lib}: tags
        that people give each package by hand, from `apt-cache dumpavail`). Graded truth in
        [0, 1] that the summaries suggest but never spell out. Packages are split first (a
        package's summary is in one split only), one package per source package, summaries
        deduplicated; each package is paired with a random one, one sharing its rarest tag and
        one sharing most of its tags, so that scores spread over [0, 1].
man_rerank_{train,valid,test}.jsonl     {"query", "positive", "negatives"}: a man page's NAME line
        ("ls - list directory contents" -> "list directory contents") as the query, the first
        words of its DESCRIPTION as the positive, and the 19 passages of other pages that BM25
        ranks highest for the query as negatives (hard negatives, as rerankers are trained and
        tested: what a first-stage retriever would hand them). Pages whose query is the same
        text (ls, dir and vdir) are never each other's negatives. Pages are split first.

package_sizes_{train,valid,test}.jsonl  {"text", "score"}: a Debian package's one-line summary and
        log10 of its installed size in KiB (`Installed-Size`, from `apt-cache dumpavail`): single-text
        regression, a number the summary suggests ("data files", "transitional package",
        "documentation", "library") but never states. One package per source package, summaries
        deduplicated, split by source package.

The valid/test files of each set are what both sides of benchmarks/crossencoder.py validate and
test on.
"""

from __future__ import annotations

import argparse
import glob
import gzip
import json
import math
import random
import re
import subprocess
import sys
from collections import Counter, defaultdict
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from build_datasets import man_description  # noqa: E402  (the DESCRIPTION parser the other sets use)

SPLITS = {"test": 0.1, "valid": 0.05}  # the rest trains
PAIRS = {"train": 20000, "valid": 1000, "test": 2000}
NEGATIVES = 19  # 20 candidates per query
PASSAGE_WORDS = 48  # a DESCRIPTION's first words as the passage (~70 tokens with the query)
# Queries held out: scoring 20 candidates of a query costs a 2-core CPU ~1-3 s with MiniLM, and
# each side's validation and test are scored in its own budget.
QUERIES = {"valid": 20, "test": 50}


# Pair scores ------------------------------------------------------------------------------------------
def tagged_packages() -> list[dict]:
    """Package, source, summary and Debtags of every package apt knows that has tags."""
    text = subprocess.run(["apt-cache", "dumpavail"], capture_output=True, text=True, check=True).stdout
    out, sources, summaries = [], set(), set()
    for stanza in text.split("\n\n"):
        fields: dict[str, str] = {}
        key = None
        for line in stanza.splitlines():
            if line.startswith((" ", "\t")) and key:
                fields[key] += " " + line.strip()
            elif ":" in line:
                key, _, value = line.partition(":")
                fields[key] = value.strip()
        tags = {t.strip() for t in fields.get("Tag", "").split(",") if t.strip()}
        summary = fields.get("Description", "").strip()
        source = fields.get("Source", fields.get("Package", "")).split(" ")[0]
        if len(tags) < 2 or len(summary.split()) < 3 or source in sources or summary.lower() in summaries:
            continue
        sources.add(source)
        summaries.add(summary.lower())
        out.append({"name": fields["Package"], "summary": summary, "tags": frozenset(tags)})
    return out


def jaccard(a: frozenset, b: frozenset) -> float:
    return len(a & b) / len(a | b)


def pair_split(packages: list[dict], n: int, rng: random.Random) -> list[dict]:
    """n pairs of packages of one split: for each anchor a random partner, one sharing its rarest
    tag and one sharing the most tags (of 50 that share any), in turn."""
    by_tag = defaultdict(list)
    for i, p in enumerate(packages):
        for t in sorted(p["tags"]):
            by_tag[t].append(i)
    rows, seen = [], set()
    while len(rows) < n:
        i = rng.randrange(len(packages))
        a = packages[i]
        kind = len(rows) % 3
        if kind == 0:
            j = rng.randrange(len(packages))
        elif kind == 1:
            rare = min(sorted(a["tags"]), key=lambda t: len(by_tag[t]))  # sorted: not the hash's order
            j = rng.choice(by_tag[rare])
        else:
            near = {j for t in sorted(a["tags"]) for j in rng.sample(by_tag[t], min(10, len(by_tag[t])))}
            near = rng.sample(sorted(near), min(50, len(near)))
            j = max(near, key=lambda k: (jaccard(a["tags"], packages[k]["tags"]), rng.random()))
        if i == j or (i, j) in seen or (j, i) in seen:
            continue
        seen.add((i, j))
        b = packages[j]
        rows.append({"text": a["summary"], "text_pair": b["summary"],
                     "score": round(jaccard(a["tags"], b["tags"]), 4)})
    return rows


# Single-text regression ------------------------------------------------------------------------------
def sized_packages() -> list[dict]:
    """Source, summary and log10(installed KiB) of every package apt knows, one per source package."""
    text = subprocess.run(["apt-cache", "dumpavail"], capture_output=True, text=True, check=True).stdout
    out, sources, summaries = [], set(), set()
    for stanza in text.split("\n\n"):
        fields = dict(line.split(":", 1) for line in stanza.splitlines() if ":" in line and line[0] != " ")
        fields = {k: v.strip() for k, v in fields.items()}
        summary = fields.get("Description", "")
        source = fields.get("Source", fields.get("Package", "")).split(" ")[0]
        size = fields.get("Installed-Size", "")
        if not size.isdigit() or int(size) < 1 or len(summary.split()) < 3 or source in sources \
                or summary.lower() in summaries:
            continue
        sources.add(source)
        summaries.add(summary.lower())
        out.append({"name": source, "text": summary, "score": round(math.log10(int(size)), 3)})
    return out


# Reranking -------------------------------------------------------------------------------------------
def man_pages() -> list[dict]:
    """(name, query, passage) of English man pages with a NAME line and a DESCRIPTION."""
    out, seen = [], set()
    for path in sorted(glob.glob("/usr/share/man/man[1-8]/*.gz")):
        if re.search(r"/(gcloud|gsutil|bq)[_.-]", path):
            continue  # the Google Cloud SDK's thousands of generated pages
        query = whatis(path)
        description = man_description(path)
        if not query or not description or len(query.split()) < 3:
            continue
        passage = " ".join(description.split()[:PASSAGE_WORDS])
        if passage in seen:
            continue
        seen.add(passage)
        out.append({"name": Path(path).name.split(".")[0], "query": query, "passage": passage})
    return out


def whatis(path: str) -> str | None:
    """The text after "name \\- " on a man page's NAME line, markup dropped."""
    try:
        raw = gzip.open(path, "rt", errors="replace").read(20000)
    except OSError:
        return None
    match = re.search(r"^\.S[Hh]\s+\"?NAME\"?\s*\n(.*?)(?=^\.S[Hh])", raw, re.M | re.S)
    if not match:
        return None
    text = " ".join(line for line in match.group(1).splitlines() if not line.startswith((".\\\"", "'\\\"")))
    text = re.sub(r"^\.(Nm|Nd|B|I)\s+", "", text, flags=re.M)
    text = re.sub(r"\\f.|\\\(..|\\&|\\\*\(..", "", text).replace("\\-", "-")
    parts = re.split(r"\s+(?:-|\\-|--|\.Nd)\s+", text, maxsplit=1)
    if len(parts) != 2:
        return None
    query = re.sub(r"\s+", " ", parts[1].replace(".Nd", "")).strip().rstrip(".")
    return query if 2 <= len(query.split()) <= 30 else None


def rerank_split(pages: list[dict], rng: random.Random) -> list[dict]:
    """Each page's query, its passage and 19 BM25-hard negatives from the split's other pages."""
    from rank_bm25 import BM25Okapi

    tokens = [re.findall(r"\w+", p["passage"].lower()) for p in pages]
    bm25 = BM25Okapi(tokens)
    rows = []
    for i, page in enumerate(pages):
        scores = bm25.get_scores(re.findall(r"\w+", page["query"].lower()))
        order = sorted(range(len(pages)), key=lambda j: -scores[j])
        negatives = [pages[j]["passage"] for j in order
                     if j != i and pages[j]["query"] != page["query"]][:NEGATIVES]
        rows.append({"query": page["query"], "positive": page["passage"], "negatives": negatives})
    rng.shuffle(rows)
    return rows


# -------------------------------------------------------------------------------------------------------
def split_of(name: str, seed: int) -> str:
    u = random.Random(f"{seed}/{name}").random()
    for split, share in SPLITS.items():
        if u < share:
            return split
        u -= share
    return "train"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", default="data", help="output folder (default: data/)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--only", nargs="+", choices=("pairs", "rerank", "sizes"),
                        default=["pairs", "rerank", "sizes"], help="the sets to build (default: all)")
    args = parser.parse_args()
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    rng = random.Random(args.seed)

    packages = tagged_packages() if "pairs" in args.only else []
    for split in ("train", "valid", "test") if packages else ():
        mine = [p for p in packages if split_of(p["name"], args.seed) == split]
        rows = pair_split(mine, PAIRS[split], rng)
        _write(out / f"debtags_pairs_{split}.jsonl", rows)
        spread = Counter(min(int(r["score"] * 5), 4) for r in rows)
        print(f"  {len(mine)} packages; scores by fifths of [0, 1]: {[spread[k] for k in range(5)]}")

    pages = man_pages() if "rerank" in args.only else []
    for split in ("train", "valid", "test") if pages else ():
        mine = [p for p in pages if split_of(p["name"], args.seed) == split]
        rows = rerank_split(mine, rng)  # negatives from the whole split's pages
        _write(out / f"man_rerank_{split}.jsonl", rows[: QUERIES.get(split, len(rows))])

    if "sizes" in args.only:
        sized = sized_packages()
        for split in ("train", "valid", "test"):
            mine = [p for p in sized if split_of(p["name"], args.seed) == split]
            random.Random(f"{args.seed}/sizes/{split}").shuffle(mine)
            _write(out / f"package_sizes_{split}.jsonl",
                   [{"text": p["text"], "score": p["score"]} for p in mine[: PAIRS[split]]])


def _write(path: Path, rows: list[dict]) -> None:
    with path.open("w", encoding="utf-8") as f:
        for r in rows:
            f.write(json.dumps(r, ensure_ascii=False) + "\n")
    print(f"{path}: {len(rows)} records")


if __name__ == "__main__":
    main()
