"""Long documents: a text longer than the max length read in windows (--long windows) against
cut (--long cut), at equal budgets, from scratch and fine-tuning; and how the windows train and
pool.

    python benchmarks/long_documents.py man_sections.jsonl --minutes 1 3 [--pretrained DIR]
        [--variants cut windows sample pooled] [--rounds 1]

DATA: a text+label file with long texts (man_sections.jsonl of benchmarks/data/build_datasets.py:
man pages' DESCRIPTIONs, median ~200 all-MiniLM-L6-v2 tokens, 43% past 256). Each run is
`tformer train --data DATA --max-minutes M --long ...` with the defaults otherwise (the plan's
max length, batch and model), in a process of its own; the variants of a round run one after
the other in turn, so that other work on the machine falls on all of them alike. Variants:

    cut       --long cut: each text's first max_length tokens
    windows   --long windows: tformer's training (each window an example with its text's label)
    sample    an experiment: one window of each long text per pass, drawn at random
    pooled    an experiment: a text's windows in one batch, the loss on their pooled logits

Each finished run's whole test split is then scored with every pooling of a text's windows'
logits (mean: tformer's; max; first: the first window only, what an HF export gives), and,
for the cut run, as trained. Prints one table: accuracy and macro-F1 per variant and pooling,
the run's updates and the load average (1 minute) before and after it. (Not yet run: its
results are to go in benchmarks/README.md, "Long documents".)
"""

from __future__ import annotations

import argparse
import itertools
import json
import os
import platform
import random
import subprocess
import sys
import tempfile
from pathlib import Path

VARIANTS = ("cut", "windows", "sample", "pooled")
POOLINGS = ("mean", "max", "first")


def patch(variant: str) -> None:
    """The experiments' training treatments, in place of tformer's (each window an example)."""
    from tformer.training import windows
    from tformer.training.examples import LabeledExample

    if variant == "sample":
        def training(encode):
            calls = itertools.count()  # a resumed stream encodes the same pools in the same order

            def one(records):
                rng = random.Random(f"sample/{next(calls)}")
                return [rng.choice(windows.per_window(ex)) for ex in encode(records)]
            return one
        windows.training = training
    elif variant == "pooled":
        windows.training = lambda encode: encode  # whole texts: the batch's rows pooled in the loss
        LabeledExample.cost = property(lambda self: self.text.tokens)  # a batch's tokens: all windows'


def one_run(data: str, minutes: float, variant: str, pretrained: str | None, out: Path) -> dict:
    patch(variant)
    import tformer

    options = {"max_minutes": minutes, "long": "cut" if variant == "cut" else "windows", "out": str(out),
               "quiet": True}
    if pretrained:
        options["from_pretrained"] = pretrained
    log: list[str] = []
    run = tformer.train(data=data, log=log.append, **options)
    record = run.record or {}
    row = {"variant": variant, "minutes": minutes, "pretrained": bool(pretrained),
           "steps": record.get("step"), "wall": record.get("wall_seconds"),
           "max_length": run.tokenizer.max_length, "in_run": record.get("accuracy"),
           "plan": [line for line in log if line.startswith(("long texts", "max length"))]}
    examples = run.examples("test")
    source = run.objective.source
    if variant == "cut":  # as it trained: each text's first max_length tokens
        metrics = run.evaluate(examples=examples)
        row["as trained"] = (metrics["accuracy"], metrics["macro_f1"])
    source.tokenizer = source.tokenizer.windowed()  # (the cut run's too: windows read at test only)
    for pooling in POOLINGS:
        run.objective.pools = pooling
        metrics = run.evaluate(examples=examples)
        row[pooling] = (metrics["accuracy"], metrics["macro_f1"])
    return row


def load() -> float:
    return os.getloadavg()[0]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("data")
    parser.add_argument("--minutes", type=float, nargs="+", default=[1.0, 3.0])
    parser.add_argument("--variants", nargs="+", choices=VARIANTS, default=["cut", "windows"])
    parser.add_argument("--pretrained", default=None, help="a BERT-format directory to fine-tune")
    parser.add_argument("--rounds", type=int, default=1)
    parser.add_argument("--one", nargs=3, metavar=("MINUTES", "VARIANT", "OUT"), help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.one:
        minutes, variant, out = args.one
        print(json.dumps(one_run(args.data, float(minutes), variant, args.pretrained, Path(out))))
        return
    cpu = next((line.split(":", 1)[1].strip() for line in subprocess.run(
        ["lscpu"], capture_output=True, text=True).stdout.splitlines() if line.startswith("Model name")),
        platform.processor())
    print(f"# {cpu}, {os.cpu_count()} cores; {args.data}; "
          f"{'fine-tuning ' + args.pretrained if args.pretrained else 'from scratch'}", flush=True)
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        for r, minutes in itertools.product(range(args.rounds), args.minutes):
            for variant in args.variants:
                out = Path(tmp) / f"{variant}-{minutes}-{r}"
                before = load()
                cmd = [sys.executable, __file__, args.data, "--one", str(minutes), variant, str(out)]
                if args.pretrained:
                    cmd += ["--pretrained", args.pretrained]
                done = subprocess.run(cmd, capture_output=True, text=True)
                if done.returncode:
                    sys.exit(f"{variant} {minutes} min: exit {done.returncode}\n{done.stderr[-3000:]}")
                row = json.loads(done.stdout.strip().splitlines()[-1])
                row["load"] = (before, load())
                rows.append(row)
                print(json.dumps(row), flush=True)
    print("\n| budget | variant | max length | updates | " + " | ".join(
        f"{p}: accuracy / macro-F1" for p in (*POOLINGS, "as trained")) + " | load |")
    print("|---" * (5 + len(POOLINGS)) + "|")
    for row in rows:
        cells = [f"{row[p][0]:.3f} / {row[p][1]:.3f}" if p in row else "" for p in (*POOLINGS, "as trained")]
        print(f"| {row['minutes']:g} min | {row['variant']} | {row['max_length']} | {row['steps']} | "
              + " | ".join(cells) + f" | {row['load'][0]:.1f}-{row['load'][1]:.1f} |")


if __name__ == "__main__":
    main()
