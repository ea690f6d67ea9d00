"""From-scratch classifier: mean pooling vs the BERT pooler (tanh(W h[CLS])), same data,
seed, steps and sizes. The pooler makes the model a transformers BertForSequenceClassification
(so `tformer export RUN --hf` can express it); this measures what that costs in accuracy.

    python benchmarks/classifier_pooling.py DATA.jsonl --steps 1500 [--seeds 0 1]

DATA: a text+label file, e.g. debian_sections.jsonl from benchmarks/data/build_datasets.py.
Prints one table: test accuracy per pooling and seed, and the minutes each took.

Measured (2 shared cores, debian_sections.jsonl, 12 labels, the classification preset, seed 0,
250 steps): mean pooling validation 0.7904 / test 0.7743; BERT pooler validation 0.7696 / test
0.7559. The pooler cost 1.8 points of test accuracy at 250 steps (one seed; longer runs not
measured). Minutes are not comparable: other jobs shared the cores.
"""

from __future__ import annotations

import argparse
import json
import tempfile
import time
from pathlib import Path

from tformer import cli
from tformer.training.sources import FileSource

ORIGINAL = FileSource.encoder_config


def with_pooler(self, **heads):
    """The run's encoder config, plus the BERT pooler for classifiers (mean pooling kept)."""
    if heads.get("n_classes"):
        heads["pooler"] = True
    return ORIGINAL(self, **heads)


def train(data: str, out: Path, steps: int, seed: int, pooler: bool) -> tuple[float, float]:
    FileSource.encoder_config = with_pooler if pooler else ORIGINAL
    start = time.perf_counter()
    rc = cli.main(["train", "--data", data, "--steps", str(steps), "--seed", str(seed),
                   "--out", str(out), "--quiet", "--threads", "2"])
    minutes = (time.perf_counter() - start) / 60
    assert rc == 0, f"train exited {rc}"
    config = json.loads(next(out.rglob("config.json")).read_text())
    assert bool(config.get("pooler")) == pooler, config
    last = json.loads((out / "metrics.jsonl").read_text().splitlines()[-1])  # the test record
    return last["accuracy"], minutes


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("data")
    parser.add_argument("--steps", type=int, default=1500)
    parser.add_argument("--seeds", type=int, nargs="+", default=[0])
    parser.add_argument("--keep", default=None, help="copy each run's metrics.jsonl into this folder")
    args = parser.parse_args()
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        for seed in args.seeds:
            for pooler in (True, False):
                run = Path(tmp) / f"{'pooler' if pooler else 'mean'}-{seed}"
                acc, minutes = train(args.data, run, args.steps, seed, pooler)
                if args.keep:
                    Path(args.keep).mkdir(parents=True, exist_ok=True)
                    (Path(args.keep) / f"{run.name}.jsonl").write_bytes((run / "metrics.jsonl").read_bytes())
                rows.append(("pooler" if pooler else "mean", seed, acc, minutes))
                print(rows[-1], flush=True)
    print(f"{'pooling':8} {'seed':>4} {'test acc':>9} {'minutes':>8}")
    for name, seed, acc, minutes in rows:
        print(f"{name:8} {seed:>4} {acc:>9.4f} {minutes:>8.1f}")


if __name__ == "__main__":
    main()
