"""tformer with its defaults against Hugging Face's usual recipe, learning from the same real text.

    python benchmarks/data/build_datasets.py --out data/          # once: real text, offline
    python benchmarks/train_own_data.py --data-dir data/ --minutes 10 --threads 2 --out results/
    python benchmarks/train_own_data.py --plot results/ --to docs/learning_curves.png

Three comparisons on real text this machine has (see build_datasets.py), each side in its own
process with the same threads, one after the other (never at the same time):

  seq2seq         en_de.jsonl, English -> German UI messages, from scratch.
  classification  debian_sections.jsonl, package summary -> archive section, from scratch.
  finetune        debian_sections.jsonl from a BERT-format checkpoint, the same directory on
                  both sides: --model-dir, else one tformer pre-trains first as a sentence
                  encoder on en_fr_pairs.jsonl (other text, another objective), saved in the
                  sentence-transformers layout that both load.

tformer runs as a user would run it: `tformer train --data FILE --max-minutes M/2` (plus
`--from-pretrained DIR` for finetune, `--threads` for the machine), nothing else: its defaults
choose the model, vocabulary, batch, schedule and precision. It gets HALF of HF's budget, and its
clock counts everything: tokenizer training, validation, the final test and saving.

Hugging Face runs its usual recipe, written out below as a plain loop (what `Trainer` does, made
visible): a `tokenizers` tokenizer trained on the training split (SentencePiece-style BPE for
translation, WordPiece for classification) or the checkpoint's own; MarianMTModel (d_model 256,
3+3 layers, 4 heads, FFN 1024: the size of the opus-mt-tiny models) or BertForSequenceClassification
(BERT-mini: 256 wide, 4 layers); AdamW (torch's fused), linear warmup over 10% of the steps and
linear decay, batches of 32, gradient clipping at 1.0, label smoothing 0.1 for translation;
learning rate 5e-4 (translation), 1e-4 (classification from scratch), 5e-5 (fine-tuning, Trainer's
default). HF has no time budget, so it is given the best case: its step count is planned from its
own measured step time so that its decay ends at the budget, and its clock stops while it
validates (5 validations on 500 examples) and tests.

Both sides are scored on the same test split (tformer's seeded split of the file, read back from
its run directory) with the same metric code (sacrebleu BLEU/chrF, accuracy/macro-F1).
The target: tformer's test metric at M/2 minutes >= HF's at M minutes.
"""

from __future__ import annotations

import argparse
import json
import math
import random
import subprocess
import sys
import tempfile
import time
from pathlib import Path

TASKS = ("seq2seq", "classification", "finetune")
DATA = {"seq2seq": "en_de.jsonl", "classification": "debian_sections.jsonl",
        "finetune": "debian_sections.jsonl"}
METRIC = {"seq2seq": ("bleu", "chrf"), "classification": ("accuracy", "macro_f1"),
          "finetune": ("accuracy", "macro_f1")}
VALIDATIONS, VALID_SAMPLE, BATCH = 5, 500, 32


# tformer: the command a user runs ---------------------------------------------------------------
def run_tformer(data: Path, out: Path, minutes: float, threads: int, pretrained: Path | None = None,
                extra: tuple[str, ...] = ()) -> dict:
    command = [sys.executable, "-m", "tformer", "train", "--data", str(data), "--max-minutes",
               f"{minutes:g}", "--threads", str(threads), "--out", str(out), *extra]
    if pretrained is not None:
        command += ["--from-pretrained", str(pretrained)]
    print("$ " + " ".join(command[2:]), flush=True)
    started = time.perf_counter()
    subprocess.run(command, check=True)
    seconds = time.perf_counter() - started
    lines = [json.loads(x) for x in (out / "metrics.jsonl").read_text().splitlines()]
    test = next(r for r in reversed(lines) if r["split"] == "test")
    return {"seconds": seconds, "test": test, "curve": [r for r in lines if r["split"] == "validation"],
            "chose": _chosen(out)}


def _chosen(run_dir: Path) -> dict:
    saved = run_dir / "checkpoints" / (run_dir / "checkpoints" / "latest").read_text().strip()
    model = json.loads((saved / "config.json").read_text())
    config = json.loads((saved / "train_config.json").read_text())
    keys = ("d_model", "n_layers", "n_decoder_layers", "n_heads", "d_ff", "vocab_size")
    return {**{k: model[k] for k in keys if k in model},
            **{k: config[k] for k in ("max_tokens", "lr", "warmup", "precision") if k in config}}


# Hugging Face: its usual recipe -----------------------------------------------------------------
def split_records(run_dir: Path, data: Path, seed: int = 0) -> dict[str, list[dict]]:
    """tformer's train/validation/test split of `data`, from the run's data.json."""
    from tformer.kinds import kind_named
    from tformer.training.records import read_records
    from tformer.training.splits import split_of

    info = json.loads((run_dir / "data.json").read_text())
    fields = kind_named(info["objective"]).fields
    splits: dict[str, list[dict]] = {"train": [], "validation": [], "test": []}
    for _, record in read_records(data):
        splits[split_of(fields.input_key(record), seed, float(info["split_fraction"]))].append(record)
    return splits


class Clock:
    """Training time only: stopped while validating and testing (HF's best case)."""

    def __init__(self) -> None:
        self.spent, self.since = 0.0, None

    def start(self) -> None:
        self.since = time.perf_counter()

    def stop(self) -> None:
        self.spent += time.perf_counter() - self.since
        self.since = None

    def now(self) -> float:
        return self.spent + (time.perf_counter() - self.since if self.since is not None else 0.0)


def hf_train(model, batches, loss_of, validate, seconds: float, lr: float, weight_decay: float,
             betas=(0.9, 0.999)) -> dict:
    """Linear warmup (10%) and decay planned to end at `seconds` of training time (re-planned at
    every step from the measured step time, as tformer's budget does)."""
    import torch

    optimizer = torch.optim.AdamW(model.parameters(), lr=lr, betas=betas, weight_decay=weight_decay,
                                  fused=True)
    clock, curve, step, total = Clock(), [], 0, None
    next_valid = seconds / VALIDATIONS
    model.train()
    clock.start()
    while clock.now() < seconds:
        planned = total or 1000  # until the probe has measured the step time
        warmup = max(1, int(0.1 * planned))
        scale = (step + 1) / warmup if step < warmup else max(0.0, (planned - step) / (planned - warmup))
        for group in optimizer.param_groups:
            group["lr"] = lr * scale
        optimizer.zero_grad(set_to_none=True)
        loss = loss_of(model, next(batches))
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        optimizer.step()
        step += 1
        if step == 2:
            t2 = clock.now()
        elif step >= 12:  # the plan, re-estimated from the mean step time since step 2
            per_step = (clock.now() - t2) / (step - 2)
            total = step + int(max(seconds - clock.now(), 0.0) / per_step)
        if clock.now() >= next_valid or clock.now() >= seconds:
            clock.stop()
            model.eval()
            value = validate(model)
            curve.append({"train_seconds": round(clock.now(), 2), "step": step, "value": value})
            print(f"  hf step {step}/{total}: validation {value:.4f} at {clock.now():.0f} s", flush=True)
            model.train()
            next_valid += seconds / VALIDATIONS
            clock.start()
    clock.stop()
    return {"steps": step, "planned_steps": total, "train_seconds": clock.now(), "curve": curve}


def shuffled_batches(items: list, seed: int = 0):
    rng = random.Random(seed)
    while True:
        order = items[:]
        rng.shuffle(order)
        for i in range(0, len(order) - BATCH + 1, BATCH):
            yield order[i : i + BATCH]


def hf_seq2seq(splits, seconds: float) -> dict:
    import torch
    import torch.nn.functional as F
    from tokenizers import SentencePieceBPETokenizer
    from transformers import MarianConfig, MarianMTModel
    from transformers.models.marian.modeling_marian import shift_tokens_right

    from tformer.training.evaluation import text_metrics

    train = splits["train"]
    tok = SentencePieceBPETokenizer()
    tok.train_from_iterator([r["source"] for r in train] + [r["target"] for r in train], vocab_size=8000,
                            special_tokens=["<pad>", "</s>", "<unk>"])
    pad, eos = tok.token_to_id("<pad>"), tok.token_to_id("</s>")
    max_len = 128
    torch.manual_seed(0)
    model = MarianMTModel(MarianConfig(
        vocab_size=tok.get_vocab_size(), d_model=256, encoder_layers=3, decoder_layers=3,
        encoder_attention_heads=4, decoder_attention_heads=4, encoder_ffn_dim=1024,
        decoder_ffn_dim=1024, max_position_embeddings=max_len + 2, pad_token_id=pad,
        eos_token_id=eos, decoder_start_token_id=pad, forced_eos_token_id=eos, scale_embedding=True,
        activation_function="relu", attn_implementation="sdpa"))

    def ids(texts: list[str]) -> list[list[int]]:
        return [e.ids[: max_len - 1] + [eos] for e in tok.encode_batch(texts)]

    def padded(rows: list[list[int]], value: int) -> torch.Tensor:
        width = max(map(len, rows))
        return torch.tensor([r + [value] * (width - len(r)) for r in rows])

    def loss_of(m, batch):
        src = padded(ids([r["source"] for r in batch]), pad)
        labels = padded(ids([r["target"] for r in batch]), -100)
        decoder_in = shift_tokens_right(labels, pad, pad)  # what labels= would do, without its loss
        # (no decoder padding mask: its start token is <pad>; the causal mask keeps padding at
        # the end from reaching real positions, and -100 leaves it out of the loss)
        logits = m(input_ids=src, attention_mask=(src != pad).long(), decoder_input_ids=decoder_in).logits
        return F.cross_entropy(logits.flatten(0, 1), labels.flatten(), ignore_index=-100,
                               label_smoothing=0.1)

    @torch.no_grad()
    def scores(m, records):
        hyps = []
        for i in range(0, len(records), 64):
            src = padded(ids([r["source"] for r in records[i : i + 64]]), pad)
            out = m.generate(input_ids=src, attention_mask=(src != pad).long(), num_beams=1,
                             do_sample=False, max_new_tokens=max_len)
            hyps += tok.decode_batch(out.tolist(), skip_special_tokens=True)
        return text_metrics(hyps, [r["target"] for r in records])

    valid = splits["validation"][:VALID_SAMPLE]
    result = hf_train(model, shuffled_batches(train), loss_of, lambda m: scores(m, valid)["bleu"],
                      seconds, lr=5e-4, weight_decay=0.0, betas=(0.9, 0.98))
    model.eval()
    return {**result, "test": scores(model, splits["test"]), "parameters": model.num_parameters(),
            "model": "MarianMTModel d_model 256, 3+3 layers, vocab 8000"}


def hf_classification(splits, seconds: float, checkpoint: Path | None) -> dict:
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

    from tformer.training.evaluation import classification_metrics

    train = splits["train"]
    labels = sorted({r["label"] for r in train})
    label_id = {name: i for i, name in enumerate(labels)}
    torch.manual_seed(0)
    if checkpoint is None:
        wp = BertWordPieceTokenizer(lowercase=True)
        wp.train_from_iterator([r["text"] for r in train], vocab_size=8000)
        tokenizer = PreTrainedTokenizerFast(tokenizer_object=wp._tokenizer, pad_token="[PAD]",
                                            cls_token="[CLS]", sep_token="[SEP]", unk_token="[UNK]")
        model = BertForSequenceClassification(BertConfig(
            vocab_size=wp.get_vocab_size(), hidden_size=256, num_hidden_layers=4, num_attention_heads=4,
            intermediate_size=1024, num_labels=len(labels), attn_implementation="sdpa"))
        lr, name = 1e-4, "BertForSequenceClassification, BERT-mini (256 wide, 4 layers), vocab 8000"
    else:
        tokenizer = AutoTokenizer.from_pretrained(str(checkpoint))
        model = AutoModelForSequenceClassification.from_pretrained(
            str(checkpoint), num_labels=len(labels), attn_implementation="sdpa")
        lr, name = 5e-5, f"AutoModelForSequenceClassification.from_pretrained({checkpoint.name})"

    def encoded(batch):
        return tokenizer([r["text"] for r in batch], padding=True, truncation=True, max_length=128,
                         return_tensors="pt")

    def loss_of(m, batch):
        target = torch.tensor([label_id[r["label"]] for r in batch])
        return F.cross_entropy(m(**encoded(batch)).logits, target)

    @torch.no_grad()
    def scores(m, records):
        predicted = []
        for i in range(0, len(records), 128):
            predicted += m(**encoded(records[i : i + 128])).logits.argmax(-1).tolist()
        actual = [label_id.get(r["label"], -1) for r in records]
        return classification_metrics(predicted, actual, len(labels))

    valid = splits["validation"][:VALID_SAMPLE]
    result = hf_train(model, shuffled_batches(train), loss_of, lambda m: scores(m, valid)["accuracy"],
                      seconds, lr=lr, weight_decay=0.01)
    model.eval()
    return {**result, "test": scores(model, splits["test"]), "parameters": model.num_parameters(),
            "model": name}


def hf_embedding(splits, seconds: float) -> dict:
    """sentence-transformers' recipe for pairs from scratch: a BERT-mini (256 wide, 4 layers, a
    WordPiece vocabulary of 8,000 trained on the training texts) with mean pooling, trained by its
    MultipleNegativesRankingLoss (cosine, scale 20: in-batch negatives) at 1e-4, batches of 32;
    scored by tformer's own retrieval_metrics (each anchor among all the split's positives)."""
    import tempfile

    import torch
    import torch.nn.functional as F
    from sentence_transformers import SentenceTransformer, losses
    from sentence_transformers.models import Pooling, Transformer
    from tokenizers import BertWordPieceTokenizer
    from transformers import BertConfig, BertModel, PreTrainedTokenizerFast

    from tformer.training.evaluation import retrieval_metrics

    train = splits["train"]
    wp = BertWordPieceTokenizer(lowercase=True)
    wp.train_from_iterator([r["anchor"] for r in train] + [r["positive"] for r in train], vocab_size=8000)
    tokenizer = PreTrainedTokenizerFast(tokenizer_object=wp._tokenizer, pad_token="[PAD]",
                                        cls_token="[CLS]", sep_token="[SEP]", unk_token="[UNK]",
                                        model_max_length=128)
    torch.manual_seed(0)
    bert = BertModel(BertConfig(vocab_size=wp.get_vocab_size(), hidden_size=256, num_hidden_layers=4,
                                num_attention_heads=4, intermediate_size=1024, attn_implementation="sdpa"),
                     add_pooling_layer=False)
    with tempfile.TemporaryDirectory() as tmp:
        bert.save_pretrained(tmp)
        tokenizer.save_pretrained(tmp)
        encoder = Transformer(tmp, max_seq_length=128)
    model = SentenceTransformer(modules=[encoder, Pooling(256, "mean")], device="cpu")
    ranking = losses.MultipleNegativesRankingLoss(model)

    def features(texts: list[str]) -> dict:
        return getattr(model, "preprocess", model.tokenize)(texts)  # (tokenize before 6.x)

    def loss_of(m, batch):
        return ranking([features([r["anchor"] for r in batch]), features([r["positive"] for r in batch])],
                       None)

    @torch.no_grad()
    def scores(m, records):
        def vectors(texts):
            return F.normalize(torch.as_tensor(m.encode(texts, batch_size=128, convert_to_numpy=True)), dim=1)
        return retrieval_metrics(vectors([r["anchor"] for r in records]),
                                 vectors([r.get("positive", r["anchor"]) for r in records]))

    valid = splits["validation"][:VALID_SAMPLE]
    result = hf_train(model, shuffled_batches(train), loss_of, lambda m: scores(m, valid)["mrr_at_10"],
                      seconds, lr=1e-4, weight_decay=0.01)
    model.eval()
    return {**result, "test": scores(model, splits["test"]), "parameters": bert.num_parameters(),
            "model": "SentenceTransformer(BERT-mini 256 x 4, vocab 8000, mean), MultipleNegativesRankingLoss"}


def hf_side(args) -> None:
    """This script's child process: HF's run, written to --result as JSON."""
    import torch

    torch.set_num_threads(args.threads)
    splits = split_records(args.run_dir, args.data)
    seconds = args.minutes * 60
    if args.task == "seq2seq":
        result = hf_seq2seq(splits, seconds)
    else:
        result = hf_classification(splits, seconds, args.model_dir if args.task == "finetune" else None)
    Path(args.result).write_text(json.dumps(result, indent=1))


def run_hf(task: str, data: Path, run_dir: Path, minutes: float, threads: int, result: Path,
           model_dir: Path | None) -> dict:
    command = [sys.executable, __file__, "--hf-side", task, "--data", str(data), "--run-dir",
               str(run_dir), "--minutes", f"{minutes:g}", "--threads", str(threads), "--result", str(result)]
    if model_dir is not None:
        command += ["--model-dir", str(model_dir)]
    print(f"HF {task}, {minutes:g} min of training ...", flush=True)
    started = time.perf_counter()
    subprocess.run(command, check=True)
    result.write_text(json.dumps({**json.loads(result.read_text()),
                                  "seconds": time.perf_counter() - started}, indent=1))
    return json.loads(result.read_text())


# The comparison ---------------------------------------------------------------------------------
def compare(args) -> None:
    from tformer.nn.kernels.machine import cpu_info

    out = args.out or Path(tempfile.mkdtemp(prefix="tformer-vs-hf-"))
    out.mkdir(parents=True, exist_ok=True)
    print(cpu_info(), flush=True)
    checkpoint = args.model_dir
    if "finetune" in args.only and checkpoint is None:
        checkpoint = out / "pretrained" / "0_Transformer"  # the run's BertModel + tokenizer
        if not (checkpoint / "config.json").is_file():
            print(f"pre-training the checkpoint: a sentence encoder on en_fr_pairs, "
                  f"{args.pretrain_minutes:g} min", flush=True)
            run_tformer(args.data_dir / "en_fr_pairs.jsonl", checkpoint.parent, args.pretrain_minutes,
                        args.threads)
    for task in args.only:
        data = args.data_dir / DATA[task]
        t = run_tformer(data, out / f"tformer_{task}", args.minutes / 2, args.threads,
                        checkpoint if task == "finetune" else None)
        hf_result = out / f"hf_{task}.json"
        if args.reuse_hf and hf_result.is_file():  # HF's run does not depend on tformer's
            h = json.loads(hf_result.read_text())
            print(f"HF {task}: reusing {hf_result}", flush=True)
        else:
            h = run_hf(task, data, out / f"tformer_{task}", args.minutes, args.threads, hf_result,
                       checkpoint if task == "finetune" else None)
        row = {"task": task, "data": DATA[task], "minutes": args.minutes, "tformer": t, "hf": h}
        (out / f"{task}.json").write_text(json.dumps(row, indent=1))
        report([row])
    print(f"results in {out}")


def report(rows: list[dict]) -> None:
    print("\n| task | metric | tformer (M/2, defaults) | HF (M, its recipe) | tformer / HF | met |")
    print("|---|---|---|---|---|---|")
    for r in rows:
        key, second = METRIC[r["task"]]
        t, h = r["tformer"]["test"], r["hf"]["test"]
        ratio = t[key] / h[key] if h[key] else math.inf
        print(f"| {r['task']} ({r['data']}) | {key} / {second} | {t[key]:.4f} / {t[second]:.4f} "
              f"in {r['tformer']['seconds'] / 60:.1f} min | {h[key]:.4f} / {h[second]:.4f} in "
              f"{r['hf']['train_seconds'] / 60:.1f} min training | {ratio:.3f} | "
              f"{'yes' if t[key] >= h[key] else 'no'} |")
    for r in rows:
        print(f"{r['task']}: tformer chose {r['tformer']['chose']}; HF: {r['hf']['model']}, "
              f"{r['hf']['steps']} steps")


def plot(results: Path, to: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    rows = [json.loads((results / f"{task}.json").read_text()) for task in TASKS
            if (results / f"{task}.json").is_file()]
    fig, axes = plt.subplots(1, len(rows), figsize=(5 * len(rows), 3.8), squeeze=False)
    for ax, r in zip(axes[0], rows, strict=True):
        key = METRIC[r["task"]][0]
        t_curve = [(c["wall_seconds"] / 60, c[key]) for c in r["tformer"]["curve"]]
        h_curve = [(c["train_seconds"] / 60, c["value"]) for c in r["hf"]["curve"]]
        ax.plot(*zip(*t_curve, strict=True), "o-", label="tformer, defaults (wall time, all included)")
        ax.plot(*zip(*h_curve, strict=True), "s-", label="HF recipe (training time only)")
        ax.axhline(r["hf"]["test"][key], color="gray", ls=":", label=f"HF final test {key}")
        ax.scatter([r["tformer"]["seconds"] / 60], [r["tformer"]["test"][key]], marker="*", s=150,
                   color="C0", zorder=5, label="tformer final test")
        ax.set_title(f"{r['task']} ({r['data']})")
        ax.set_xlabel("minutes")
        ax.set_ylabel(f"validation {key}")
        ax.grid(alpha=0.3)
    axes[0][0].legend(fontsize=7, loc="lower right")
    fig.tight_layout()
    to.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(to, dpi=110)
    print(f"wrote {to}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--data-dir", type=Path, default=Path("data"))
    parser.add_argument("--minutes", type=float, default=10.0, help="HF's budget; tformer gets half")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--only", nargs="+", choices=TASKS, default=list(TASKS))
    parser.add_argument("--model-dir", type=Path, default=None,
                        help="finetune: a BERT-format checkpoint (default: pre-train one on en_fr_pairs)")
    parser.add_argument("--pretrain-minutes", type=float, default=5.0)
    parser.add_argument("--out", type=Path, default=None, help="keep the runs here (default: temp)")
    parser.add_argument("--reuse-hf", action="store_true",
                        help="keep HF's results already in --out (same data, minutes and threads)")
    parser.add_argument("--plot", type=Path, default=None, help="plot the results in this directory")
    parser.add_argument("--to", type=Path, default=Path("docs/learning_curves.png"))
    # The HF child process:
    parser.add_argument("--hf-side", choices=TASKS, default=None, help=argparse.SUPPRESS)
    parser.add_argument("--data", type=Path, help=argparse.SUPPRESS)
    parser.add_argument("--run-dir", type=Path, help=argparse.SUPPRESS)
    parser.add_argument("--result", type=Path, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.hf_side:
        args.task = args.hf_side
        hf_side(args)
    elif args.plot:
        plot(args.plot, args.to)
    else:
        compare(args)


if __name__ == "__main__":
    main()
