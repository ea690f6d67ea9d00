"""What --class-weights auto should do, measured: tformer's loss unweighted and weighted on skewed
real data, one label a record (classification) and several (multi-label).

    python benchmarks/data/multilabel_data.py --out data/           # once: real text, offline
    flock /tmp/tformer-bench.lock python benchmarks/class_weights.py --data-dir data/ --out results/cw

Each data set is trained from scratch with tformer's defaults at a fixed number of updates
(--steps: the weighting does not change a step's time, so the same updates are the same time; a
fixed count keeps the other processes of a busy machine out of the result), once per method,
the methods of a set side by side (one thread each), with the same seed and split:

  classification (sections_skew*, man_skew*: summary/man page -> section, skews 1..100)
    none       plain cross-entropy
    sqrt       weights (n / (C n_c)) ** 0.5, normalised to a mean of 1 over the records
    inverse    weights n / (C n_c) (scikit-learn's "balanced"), normalised the same way
  multi-label (debtags*: package summary -> its debtags, 20/50/100 tags)
    none       plain BCE
    sqrt       pos_weight ((n - n_l) / n_l) ** 0.5, at most 30
    inverse    pos_weight (n - n_l) / n_l, at most 100

With --prior, a multi-label set also trains without the labels' prior biases (sqrt-noprior,
none-noprior: tformer.kinds.multilabel.PRIOR_BIAS off).

The test split's macro-F1 decides (the issue's measure for imbalance), with accuracy / micro-F1
beside it so that a gain on rare labels bought with the frequent ones shows. The methods are set
through tformer.kinds.labels' constants in each child process (WEIGHT_POWER, POSITIVE_POWER,
MAX_POSITIVE_WEIGHT, and SKEW / LABEL_SKEW at 1 so that the weights are on whatever the skew).
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time
from pathlib import Path

SINGLE = ("sections_skew1", "sections_skew10", "sections_skew100", "man_skew1", "man_skew10", "man_skew50")
MULTI = ("debtags_20", "debtags", "debtags_100")
METHODS = {  # method -> the constants set in tformer.kinds.labels (None: --class-weights none)
    "none": None,
    "sqrt": {"SKEW": 1.0, "WEIGHT_POWER": 0.5, "LABEL_SKEW": 1.0, "POSITIVE_POWER": 0.5,
             "MAX_POSITIVE_WEIGHT": 30.0},
    "inverse": {"SKEW": 1.0, "WEIGHT_POWER": 1.0, "LABEL_SKEW": 1.0, "POSITIVE_POWER": 1.0,
                "MAX_POSITIVE_WEIGHT": 100.0},
}
# Multi-label only: each label's bias starting at its prior (tformer.kinds.multilabel.PRIOR_BIAS) or not.
PRIOR = {"sqrt-noprior": {**METHODS["sqrt"], "PRIOR_BIAS": False},
         "none-noprior": {"PRIOR_BIAS": False, "LABEL_SKEW": 1e9}}


def child(args) -> None:
    """One training run, the weighting constants set first (in tformer.kinds.labels, and
    PRIOR_BIAS in tformer.kinds.multilabel)."""
    from tformer.commands.cli import main
    from tformer.kinds import labels, multilabel

    for name, value in json.loads(args.constants).items():
        setattr(multilabel if name == "PRIOR_BIAS" else labels, name, value)
    sys.exit(main(args.train))


def run_set(name: str, args) -> list[dict]:
    data = args.data_dir / f"{name}.jsonl"
    procs = {}
    methods = {**METHODS, **(PRIOR if args.prior else {})}
    for method, constants in methods.items():
        out = args.out / f"{name}-{method}"
        if (out / "metrics.jsonl").is_file():
            continue  # done in an earlier invocation
        train = ["train", "--data", str(data), "--out", str(out), "--steps", str(args.steps),
                 "--eval-every", str(args.steps // 4), "--threads", "1", "--quiet", "--seed", str(args.seed)]
        if args.from_pretrained:
            train += ["--from-pretrained", str(args.from_pretrained)]
        if constants is None:
            train += ["--class-weights", "none"]
        command = [sys.executable, __file__, "--child", "--constants", json.dumps(constants or {}), "--",
                   *train]
        log = (args.out / f"{name}-{method}.log").open("w")
        procs[method] = subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT)
    for method, p in procs.items():
        if p.wait() != 0:
            print(f"{name} {method}: failed (see {args.out / f'{name}-{method}.log'})", flush=True)
    rows = []
    for method in methods:
        path = args.out / f"{name}-{method}" / "metrics.jsonl"
        if not path.is_file():
            continue
        test = [json.loads(x) for x in path.read_text().splitlines() if '"split": "test"' in x][-1]
        info = json.loads((args.out / f"{name}-{method}" / "data.json").read_text())
        counts = sorted(info.get("label_counts", {}).values())
        rows.append({"set": name, "method": method, "skew": counts[-1] / counts[0] if counts else None,
                     **{k: test[k] for k in ("accuracy", "macro_f1", "micro_f1", "samples_f1") if k in test}})
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--constants", default="{}", help=argparse.SUPPRESS)
    parser.add_argument("--data-dir", type=Path, default=Path("data"))
    parser.add_argument("--out", type=Path, default=Path("results/class_weights"))
    parser.add_argument("--steps", type=int, default=800)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--from-pretrained", type=Path, default=None)
    parser.add_argument("--prior", action="store_true", help="multi-label: also without the prior bias")
    parser.add_argument("--only", nargs="+", default=list(SINGLE + MULTI))
    parser.add_argument("train", nargs="*", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        child(args)
        return
    from tformer.nn.kernels.machine import cpu_info

    args.out.mkdir(parents=True, exist_ok=True)
    print(cpu_info(), flush=True)
    rows = []
    for name in args.only:
        started = time.perf_counter()
        rows += run_set(name, args)
        print(f"{name}: {time.perf_counter() - started:.0f} s", flush=True)
        (args.out / "results.json").write_text(json.dumps(rows, indent=1))
    print("\n| data | skew | method | accuracy / micro-F1 | macro-F1 |")
    print("|---|---|---|---|---|")
    for r in rows:
        first = r.get("accuracy", r.get("micro_f1"))
        print(f"| {r['set']} | {r['skew']:.0f}:1 | {r['method']} | {first:.4f} | {r['macro_f1']:.4f} |")


if __name__ == "__main__":
    main()
