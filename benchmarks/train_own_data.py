"""tformer vs Hugging Face transformers, training on the same real text for the same time.

    python benchmarks/data/build_datasets.py --out data/          # once: real text, offline
    python benchmarks/train_own_data.py --data-dir data/ --minutes 10 --threads 2

Two comparisons, each at an equal wall-clock budget on the same threads:
  seq2seq         data/en_de.jsonl (English -> German UI messages). tformer: `train --data`
                  with its defaults. HF: a MarianMTModel built from a MarianConfig of the same
                  size (d_model, layers, heads, FFN, vocabulary), trained with a plain loop.
  classification  data/debian_sections.jsonl (package summary -> Debian section). tformer:
                  `train --data --from-pretrained MODEL_DIR`. HF:
                  AutoModelForSequenceClassification.from_pretrained(MODEL_DIR), plain loop.
                  Without --model-dir, MODEL_DIR is a random-weight BERT of the preset size
                  with a tokenizer trained on the data, the same start for both (this then
                  measures the training engine, not transfer from pre-training).
Fair by construction: both read the very same batches (tformer's seeded split, tokenizer
and token-count batches), with the same learning-rate schedule, optimizer, label smoothing
and gradient clipping; both validate every --eval-every steps (inside their budget) and are
tested once on the same test split.
Reported: test quality at the budget (BLEU/chrF, accuracy/macro-F1), and the time tformer
needed to reach HF's final validation score (target: <= 2/3 of the budget).
"""

from __future__ import annotations

import argparse
import json
import math
import tempfile
import time
from pathlib import Path

import torch
import torch.nn.functional as F

from tformer.training import learning_rate, resolve_config, train
from tformer.training.data_objectives import DataObjective, data_objective
from tformer.training.dataset import TextData
from tformer.training.evaluation import classification_metrics, text_metrics
from tformer.training.records import read_records
from tformer.training.subwords import train_tokenizer


def _curve(run_dir: Path, key: str) -> list[tuple[float, float]]:
    lines = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    return [(r["wall_seconds"], r[key]) for r in lines if r["split"] == "validation"]


def _time_to_reach(curve: list[tuple[float, float]], target: float) -> float | None:
    return next((t for t, v in curve if v >= target), None)


def _hf_loop(model, config, data: DataObjective, minutes: float, loss_fn,
             validate) -> list[tuple[float, float]]:
    """Train `model` on tformer's batches with tformer's schedule until the budget is spent."""
    opt = torch.optim.AdamW(model.parameters(), lr=config.lr, weight_decay=config.weight_decay,
                            betas=(0.9, 0.999) if config.from_pretrained else (0.9, 0.98),
                            eps=1e-6 if config.from_pretrained else 1e-9)
    batches = data.train_batches(0)
    start, step, curve = time.perf_counter(), 0, []
    while step < config.steps and time.perf_counter() - start < minutes * 60:
        for group in opt.param_groups:
            group["lr"] = learning_rate(config, step + 1)
        model.train()
        opt.zero_grad(set_to_none=True)
        loss = loss_fn(model, next(batches))
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), config.clip_grad)
        opt.step()
        step += 1
        if step % config.eval_every == 0:
            curve.append((time.perf_counter() - start, validate(model, "validation")))
            print(f"  hf step {step}: validation {curve[-1][1]:.4f} ({curve[-1][0]:.0f} s)", flush=True)
    return curve


# Seq2seq ------------------------------------------------------------------------------------
def seq2seq(args, out: Path) -> dict:
    from transformers import MarianConfig, MarianMTModel

    config = resolve_config({"data": str(args.data_dir / "en_de.jsonl"), "max_minutes": args.minutes,
                             "threads": args.threads, "out": str(out / "tformer_seq2seq"),
                             "eval_every": args.eval_every, "patience": None})
    print(f"tformer seq2seq, {args.minutes} min ...", flush=True)
    t_record = train(config, progress=False, log=lambda *a: None)
    data = data_objective(TextData.build(config, Path(config.out), write=False), config)  # same batches
    tok, m = data.tokenizer, config.model
    hf_config = MarianConfig(
        vocab_size=tok.vocab_size, d_model=m.d_model, encoder_layers=m.n_layers,
        decoder_layers=m.decoder_layers, encoder_attention_heads=m.n_heads,
        decoder_attention_heads=m.n_heads, encoder_ffn_dim=m.d_ff, decoder_ffn_dim=m.d_ff,
        max_position_embeddings=config.max_length + 2, dropout=m.dropout, activation_function="relu",
        pad_token_id=tok.pad_id, eos_token_id=tok.eos_id, bos_token_id=tok.bos_id,
        decoder_start_token_id=tok.bos_id, forced_eos_token_id=None, scale_embedding=True,
        share_encoder_decoder_embeddings=True)
    torch.manual_seed(config.seed)
    model = MarianMTModel(hf_config)

    def loss_fn(m, b):
        logits = m(input_ids=b.src, attention_mask=b.src_mask, decoder_input_ids=b.tgt_in,
                   decoder_attention_mask=b.tgt_mask).logits  # (B, T, V)
        return F.cross_entropy(logits.flatten(0, 1), b.labels.flatten(), ignore_index=tok.pad_id,
                               label_smoothing=config.label_smoothing)

    @torch.no_grad()
    def validate(m, split, limit=500):
        m.eval()
        records = data.examples(split)[: limit if split == "validation" else None]
        hyps = []
        for i in range(0, len(records), 64):
            b = data.collate(data.encode(records[i : i + 64]))
            gen = m.generate(input_ids=b.src, attention_mask=b.src_mask, num_beams=1, do_sample=False,
                             max_new_tokens=config.max_length)
            hyps += [tok.decode([t for t in row.tolist() if t != tok.pad_id]) for row in gen]
        return text_metrics(hyps, [r["target"] for r in records])["bleu"]

    print(f"HF Marian seq2seq, {args.minutes} min ...", flush=True)
    torch.set_num_threads(args.threads)
    h_curve = _hf_loop(model, config, data, args.minutes, loss_fn, validate)
    h_test = validate(model, "test")
    t_curve = _curve(Path(config.out), "bleu")
    return {"objective": "seq2seq (en->de)", "metric": "BLEU", "tformer_test": t_record["bleu"],
            "tformer_chrf": t_record["chrf"], "hf_test": h_test,
            "hf_final_validation": h_curve[-1][1] if h_curve else math.nan,
            "tformer_seconds_to_hf": _time_to_reach(t_curve, h_curve[-1][1]) if h_curve else None,
            "budget_seconds": args.minutes * 60}


# Classification ---------------------------------------------------------------------------
def random_bert_dir(args, config, directory: Path) -> Path:
    """A random-weight BERT of the preset's size with a tokenizer trained on the data."""
    from transformers import BertConfig, BertModel


    texts = (r["text"] for _, r in read_records(config.data))
    backend = train_tokenizer(texts, "wordpiece", config.vocab_size)
    directory.mkdir(parents=True, exist_ok=True)
    backend.save(str(directory / "tokenizer.json"))
    torch.manual_seed(0)
    m = config.model
    BertModel(BertConfig(vocab_size=backend.get_vocab_size(), hidden_size=m.d_model,
                         num_hidden_layers=m.n_layers, num_attention_heads=m.n_heads,
                         intermediate_size=m.d_ff, max_position_embeddings=config.max_length,
                         pad_token_id=0)).save_pretrained(str(directory))
    return directory


def classification(args, out: Path) -> dict:
    from transformers import AutoModelForSequenceClassification

    data_file = str(args.data_dir / "debian_sections.jsonl")
    base = resolve_config({"data": data_file, "max_length": 64})
    model_dir = args.model_dir or random_bert_dir(args, base, out / "random_bert")
    config = resolve_config({"data": data_file, "from_pretrained": str(model_dir), "max_length": 64,
                             "max_minutes": args.minutes, "threads": args.threads,
                             "out": str(out / "tformer_classification"), "lr": args.lr,
                             "eval_every": args.eval_every, "patience": None, "steps": 100000,
                             "warmup": 300})
    print(f"tformer classification, {args.minutes} min ...", flush=True)
    t_record = train(config, progress=False, log=lambda *a: None)
    data = data_objective(TextData.build(config, Path(config.out), write=False), config)
    torch.manual_seed(config.seed)
    model = AutoModelForSequenceClassification.from_pretrained(str(model_dir),
                                                               num_labels=len(data.data.labels))

    def loss_fn(m, b):
        logits = m(input_ids=b.input_ids, attention_mask=b.attention_mask,
                   token_type_ids=b.token_type_ids).logits
        return F.cross_entropy(logits, b.labels, label_smoothing=config.label_smoothing)

    @torch.no_grad()
    def scores(m, split):
        m.eval()
        records = data.examples(split)
        predicted = []
        for i in range(0, len(records), 128):
            b = data.collate(data.encode(records[i : i + 128]))
            predicted += m(input_ids=b.input_ids, attention_mask=b.attention_mask,
                           token_type_ids=b.token_type_ids).logits.argmax(-1).tolist()
        actual = [data.data.label_ids[r["label"]] for r in records]
        return classification_metrics(predicted, actual, len(data.data.labels))

    print(f"HF AutoModelForSequenceClassification, {args.minutes} min ...", flush=True)
    torch.set_num_threads(args.threads)
    h_curve = _hf_loop(model, config, data, args.minutes, loss_fn, lambda m, s: scores(m, s)["accuracy"])
    h_test = scores(model, "test")
    t_curve = _curve(Path(config.out), "accuracy")
    return {"objective": "classification (Debian sections)", "metric": "accuracy",
            "tformer_test": t_record["accuracy"], "tformer_macro_f1": t_record["macro_f1"],
            "hf_test": h_test["accuracy"], "hf_macro_f1": h_test["macro_f1"],
            "hf_final_validation": h_curve[-1][1] if h_curve else math.nan,
            "tformer_seconds_to_hf": _time_to_reach(t_curve, h_curve[-1][1]) if h_curve else None,
            "budget_seconds": args.minutes * 60}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--data-dir", type=Path, default=Path("data"))
    parser.add_argument("--minutes", type=float, default=10.0, help="budget per model (default 10)")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--only", choices=("seq2seq", "classification"), default=None)
    parser.add_argument("--model-dir", default=None, help="classification: a BERT-format directory")
    parser.add_argument("--lr", type=float, default=1e-4, help="classification fine-tuning peak lr")
    parser.add_argument("--eval-every", type=int, default=200, help="validate every N steps (both)")
    parser.add_argument("--out", type=Path, default=None, help="keep the runs here (default: temp)")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    out = args.out or Path(tempfile.mkdtemp(prefix="tformer-vs-hf-"))
    rows = []
    for name, fn in (("seq2seq", seq2seq), ("classification", classification)):
        if args.only in (None, name):
            rows.append(fn(args, out))
    print(f"\n{'objective':34} {'metric':9} {'tformer':>8} {'HF':>8}  tformer time to HF's validation score")
    for r in rows:
        reach = r["tformer_seconds_to_hf"]
        shown = ("not reached" if reach is None
                 else f"{reach:.0f} s = {reach / r['budget_seconds']:.2f} of budget")
        print(f"{r['objective']:34} {r['metric']:9} {r['tformer_test']:8.4f} {r['hf_test']:8.4f}  {shown}")
    print(json.dumps(rows, indent=1))
    print(f"runs in {out}")


if __name__ == "__main__":
    main()
