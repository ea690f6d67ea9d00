"""From-scratch classifier: mean pooling vs the BERT pooler (tanh(W h[CLS])), same data,
seeds, steps and sizes (the classification preset otherwise). The pooler makes the model a
transformers BertForSequenceClassification; this measures what that costs in accuracy.

    python benchmarks/classifier_pooling.py DATA.jsonl [DATA2.jsonl ...] --steps 1500 --seeds 0 1 2

DATA: text+label files, e.g. debian_sections.jsonl and man_sections.jsonl from
benchmarks/data/build_datasets.py. Prints one table: test accuracy and macro-F1 per data set,
pooling and seed, then the mean per data set and pooling with the paired difference (cls -
mean) and its spread over seeds. Accuracy only: the runs use --threads 1 and may share the
machine (no timings are reported). Results: benchmarks/README.md.
"""

from __future__ import annotations

import argparse
import json
import statistics
import tempfile
from pathlib import Path

import torch

from tformer.commands import cli
from tformer.kinds.classification import Classification

POOLINGS = ("cls", "mean", "cls-uniform")


def uniform_start(build):
    """An experiment: the last layer's queries start at zero, so that its attention starts
    uniform over the real tokens ([CLS] starts from the mean of the values)."""
    def build_model(self, model_config=None):
        model = build(self, model_config)
        qkv = model.encoder.layers[-1].self_attn.qkv_proj
        d = qkv.weight.shape[1]
        with torch.no_grad():
            qkv.weight[:d].zero_()
            qkv.bias[:d].zero_()
        return model
    return build_model


def train(data: str, out: Path, steps: int, seed: int, pooling: str) -> dict[str, float]:
    original = Classification.build_model
    if pooling == "cls-uniform":
        Classification.build_model = uniform_start(original)
    try:
        rc = cli.main(["train", "--data", data, "--steps", str(steps), "--seed", str(seed), "--pooling",
                       pooling.split("-")[0], "--patience", "none", "--out", str(out), "--quiet",
                       "--threads", "1"])
    finally:
        Classification.build_model = original
    assert rc == 0, f"train exited {rc}"
    config = json.loads(next(out.rglob("config.json")).read_text())
    assert config["pooling"] == pooling.split("-")[0], config
    assert bool(config["pooler"]) == (pooling != "mean"), config
    return json.loads((out / "metrics.jsonl").read_text().splitlines()[-1])  # the test record


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("data", nargs="+")
    parser.add_argument("--steps", type=int, default=1500)
    parser.add_argument("--seeds", type=int, nargs="+", default=[0])
    parser.add_argument("--poolings", nargs="+", default=list(POOLINGS), choices=POOLINGS)
    parser.add_argument("--jsonl", default=None, help="append each run's test record to this file")
    args = parser.parse_args()
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        for data in args.data:
            for seed in args.seeds:
                for pooling in args.poolings:
                    run = Path(tmp) / f"{Path(data).stem}-{pooling}-{seed}"
                    test = train(data, run, args.steps, seed, pooling)
                    row = {"data": Path(data).stem, "pooling": pooling, "seed": seed, "steps": args.steps,
                           "accuracy": test["accuracy"], "macro_f1": test.get("macro_f1")}
                    rows.append(row)
                    print(json.dumps(row), flush=True)
                    if args.jsonl:
                        with open(args.jsonl, "a") as f:
                            f.write(json.dumps(row) + "\n")
    print(table(rows))


def table(rows: list[dict]) -> str:
    """Per data set and pooling: mean accuracy and macro-F1 over seeds; cls - mean, paired by seed."""
    lines = [f"{'data':18} {'pooling':8} {'seeds':>5} {'test acc':>9} {'macro-F1':>9} {'- mean (acc)':>22}"]
    for data in dict.fromkeys(r["data"] for r in rows):
        by = {p: {r["seed"]: r for r in rows if r["data"] == data and r["pooling"] == p} for p in POOLINGS}
        for pooling in POOLINGS:
            runs = list(by[pooling].values())
            if not runs:
                continue
            acc = statistics.mean(r["accuracy"] for r in runs)
            f1 = statistics.mean(r["macro_f1"] or 0.0 for r in runs)
            paired = sorted(set(by[pooling]) & set(by["mean"]))
            diffs = [by[pooling][s]["accuracy"] - by["mean"][s]["accuracy"] for s in paired]
            delta = ""
            if pooling != "mean" and diffs:
                spread = statistics.stdev(diffs) if len(diffs) > 1 else 0.0
                delta = f"{statistics.mean(diffs):+.4f} (sd {spread:.4f})"
            lines.append(f"{data:18} {pooling:8} {len(runs):>5} {acc:>9.4f} {f1:>9.4f} {delta:>22}")
    return "\n".join(lines)


if __name__ == "__main__":
    main()
