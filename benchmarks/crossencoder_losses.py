"""Which loss the cross-encoder kinds train with, measured: two tformer runs side by side (1
thread each, under `flock /tmp/tformer-bench.lock`), the same defaults but for the loss.

    python benchmarks/crossencoder_losses.py --data-dir data/ --minutes 3 --out results/ce-losses/

  scores   --score-loss mse (the output's squared error) against bce (for scores in [0, 1]: the
           binary cross-entropy of its sigmoid, sentence-transformers' BinaryCrossEntropyLoss)
  rerank   reranking.LOSS "listwise" (a softmax over each query's candidates) against "pointwise"
           (each candidate's binary cross-entropy against its label)

each fine-tuning all-MiniLM-L6-v2 and from scratch, on the sets of benchmarks/data/crossencoder_data.py
(their test files scored whole after the runs, `tformer eval RUN --data TEST`).
"""

from __future__ import annotations

import argparse
import fcntl
import json
import subprocess
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from crossencoder import FILES, LOCK, METRIC, minilm  # noqa: E402

VARIANTS = {"scores": ("regression", ("mse", "bce")), "rerank": ("reranking", ("listwise", "pointwise"))}


def command(kind: str, loss: str, data: Path, out: Path, minutes: float, scratch: bool) -> list[str]:
    module, _ = VARIANTS[kind]
    files = [data / f"{FILES[kind]}_{s}.jsonl" for s in ("train", "valid", "test")]
    argv = ["train", "--data", str(files[0]), "--valid", str(files[1]), "--test", str(files[2]),
            "--max-minutes", f"{minutes:g}", "--threads", "1", "--out", str(out), "--quiet"]
    if not scratch:
        argv += ["--from-pretrained", str(minilm())]
    if kind == "scores":  # an option; the reranking loss is a module constant
        return [sys.executable, "-m", "tformer", *argv, "--score-loss", loss]
    code = (f"import sys, tformer.kinds.{module} as m; m.LOSS = {loss!r}; "
            f"from tformer.commands.cli import main; sys.exit(main({argv!r}))")
    return [sys.executable, "-c", code]


def test_metric(kind: str, data: Path, out: Path) -> dict:
    subprocess.run([sys.executable, "-m", "tformer", "eval", str(out), "--data",
                    str(data / f"{FILES[kind]}_test.jsonl"), "--threads", "1", "--samples", "0"],
                   check=True, stdout=subprocess.DEVNULL)
    lines = [json.loads(x) for x in (out / "metrics.jsonl").read_text().splitlines()]
    own = next(r for r in reversed(lines) if r["split"] == "test")
    whole = next(r for r in reversed(lines) if r["split"] == "eval")
    return {"steps": own["step"], "wall_seconds": own["wall_seconds"], "test": whole,
            "baseline": own.get("baseline")}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--data-dir", type=Path, default=Path("data"))
    parser.add_argument("--out", type=Path, default=Path("results/crossencoder-losses"))
    parser.add_argument("--minutes", type=float, default=3.0)
    parser.add_argument("--kinds", nargs="+", choices=tuple(VARIANTS), default=list(VARIANTS))
    parser.add_argument("--modes", nargs="+", choices=("finetune", "scratch"),
                        default=["scratch", "finetune"])
    args = parser.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    from tformer.nn.kernels.machine import cpu_info

    print(cpu_info(), flush=True)
    rows = []
    for kind in args.kinds:
        for mode in args.modes:
            name = f"{kind}_{mode}_{args.minutes:g}"
            result = args.out / f"{name}.json"
            if not result.is_file():
                _, losses = VARIANTS[kind]
                with open(LOCK, "w") as lock:
                    fcntl.flock(lock, fcntl.LOCK_EX)
                    runs = {loss: subprocess.Popen(command(kind, loss, args.data_dir,
                                                           args.out / f"{name}_{loss}", args.minutes,
                                                           mode == "scratch"),
                                                   stdout=open(args.out / f"{name}_{loss}.log", "w"),
                                                   stderr=subprocess.STDOUT) for loss in losses}
                    if any(p.wait() for p in runs.values()):
                        raise SystemExit(f"{name}: a run failed (see {args.out})")
                    record = {loss: test_metric(kind, args.data_dir, args.out / f"{name}_{loss}")
                              for loss in losses}
                result.write_text(json.dumps(record, indent=1))
            record = json.loads(result.read_text())
            key = METRIC[kind]
            rows.append(f"| {kind} {mode} {args.minutes:g} min | " + " | ".join(
                f"{loss}: {r['test'][key]:.4f} ({r['steps']} steps)" for loss, r in record.items()) + " |")
    print("\n".join(rows))


if __name__ == "__main__":
    main()
