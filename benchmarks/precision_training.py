"""Does bf16 autocast training learn as well as fp32? The same run twice, only the precision differs.

    python benchmarks/precision_training.py --data-dir data/ --out results/precision [--threads 2]

Each pair: `tformer train` with the same seed, the same model, data, batches and number of steps,
once with `--precision fp32` and once with `--precision bf16` (autocast, fp32 master weights).
Printed per pair: the last validation metric, the test metric and the wall time of each, and what
`--precision auto` (the default) chooses for that run on this machine (a one-step run: bf16 where
the CPU computes it natively and a training step of the run's own model is measured faster). The
bar: the bf16 run reaches the fp32 run's metric within noise (one run each: differences of about
a test set's standard error are noise).

Runs: the built-in tasks `reverse` (seq2seq) and `listops` (classification), and, when
--data-dir has them (benchmarks/data/build_datasets.py), en_de.jsonl (seq2seq from scratch) and
debian_sections.jsonl (classification from scratch).
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
from pathlib import Path

# (name, source arguments, steps, main metric): steps chosen so an fp32 run takes 1-3 minutes on 2 cores
RUNS = [
    ("reverse", ["--task", "reverse"], 1500, "exact_match"),
    ("listops", ["--task", "listops"], 1500, "accuracy"),
    ("en_de", ["--data", "{data}/en_de.jsonl", "--eval-every", "400"], 1200, "bleu"),
    ("debian_sections", ["--data", "{data}/debian_sections.jsonl", "--eval-every", "400"], 1200,
     "accuracy"),
]


def run(args: list[str], out: Path, precision: str, threads: int) -> dict:
    """One `tformer train`; returns its last validation and its test record, and what it chose."""
    cmd = [sys.executable, "-m", "tformer", "train", *args, "--precision", precision, "--seed", "0",
           "--threads", str(threads), "--out", str(out)]
    done = subprocess.run(cmd, capture_output=True, text=True)
    if done.returncode != 0:
        raise RuntimeError(f"{' '.join(cmd)} failed:\n{done.stderr[-2000:]}")
    lines = [json.loads(x) for x in (out / "metrics.jsonl").read_text().splitlines()]
    chosen = next((x for x in (done.stdout + done.stderr).splitlines() if x.startswith("precision: ")), "")
    valid = [x for x in lines if x["split"] == "validation"]
    return {"valid": valid[-1] if valid else {}, "test": lines[-1], "chosen": chosen}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--data-dir", type=Path, default=Path("data"))
    parser.add_argument("--out", type=Path, default=Path("runs/precision"))
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--only", nargs="+", help="run only these (names: " +
                        ", ".join(r[0] for r in RUNS) + ")")
    parser.add_argument("--steps-scale", type=float, default=1.0, help="multiply every run's steps")
    args = parser.parse_args()
    from tformer.commands.benchmarking.harness import cpu_info

    model, flags = cpu_info()
    print(f"CPU: {model}; flags: {', '.join(flags)}; {args.threads} threads\n")
    print("| run | steps | metric | fp32 last valid / test | bf16 last valid / test "
          "| fp32 / bf16 wall s | auto chooses |")
    print("|---|---|---|---|---|---|---|")
    for name, source, steps, metric in RUNS:
        if args.only and name not in args.only:
            continue
        source = [a.format(data=args.data_dir) for a in source]
        if "--data" in source and not Path(source[source.index("--data") + 1]).is_file():
            print(f"| {name} | | | skipped: {source[source.index('--data') + 1]} not found | | | |")
            continue
        steps = max(1, round(steps * args.steps_scale))
        results = {}
        for precision, n in (("fp32", steps), ("bf16", steps), ("auto", 1)):
            out = args.out / f"{name}-{precision}"
            if out.exists():
                raise FileExistsError(f"--out: {out} exists; give a new --out")
            results[precision] = run([*source, "--steps", str(n)], out, precision, args.threads)
        f, a = results["fp32"], results["bf16"]

        def pair(r: dict, metric: str = metric) -> str:
            return f"{r['valid'].get(metric, float('nan')):.4f} / {r['test'][metric]:.4f}"

        print(f"| {name} | {steps} | {metric} | {pair(f)} | {pair(a)} | "
              f"{f['test']['wall_seconds']:.0f} / {a['test']['wall_seconds']:.0f} | "
              f"{results['auto']['chosen'].removeprefix('precision: ')} |", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
