"""`tformer attention MODEL_DIR TEXT --html OUT.html`: the interactive page (tformer.viz_html).

MODEL_DIR is a BERT-format directory (one group: the encoder's self-attention) or a run
directory of `tformer train` (it holds train_config.json). A seq2seq run encodes the text,
generates the output greedily, then runs the decoder teacher-forced on it: three groups,
encoder self-attention, decoder self-attention and decoder cross-attention (decoder rows
are the decoder's inputs, <bos> then the output: row t predicts token t + 1). A
classification run has one group, its encoder's self-attention.
"""

from __future__ import annotations

import argparse
from pathlib import Path

from tformer.viz_html import AttentionMaps


def is_run_dir(model_dir: str | Path) -> bool:
    """A `tformer train` run: published checkpoints, or (older runs) train_config.json on top."""
    from tformer.checkpoint import latest_checkpoint

    model_dir = Path(model_dir)
    return latest_checkpoint(model_dir) is not None or (model_dir / "train_config.json").is_file()


def encoder_attentions(args: argparse.Namespace):
    """The model, the text's tokens and its attention weights (n_layers x (1, H, S, S)), for a
    BERT-format MODEL_DIR: what the PNG (--out) and the page (--html) both draw."""
    import torch

    from tformer.commands._pretrained import one_line_warnings
    from tformer.model import from_pretrained
    from tformer.tokenizer import load_tokenizer

    with one_line_warnings("attention"):
        model = from_pretrained(args.model_dir, allow_pickle=args.allow_pickle)
        tok = load_tokenizer(args.model_dir, max_length=args.max_length)
        batch = tok([args.text], truncation=not args.no_truncate)
    with torch.inference_mode():
        out = model(
            batch["input_ids"],
            attention_mask=batch["attention_mask"],
            token_type_ids=batch["token_type_ids"],
            output_attentions=True,
        )
    return model, tok.convert_ids_to_tokens(batch["input_ids"][0].tolist()), out.attentions


def bert_maps(args: argparse.Namespace) -> list[AttentionMaps]:
    _, tokens, attentions = encoder_attentions(args)
    return [AttentionMaps("encoder self-attention", tokens, tokens, _stack(attentions))]


def run_maps(run_dir: str | Path, text: str) -> list[AttentionMaps]:
    """The attention of a trained run on one input in the task's format (e.g. "3 1 4")."""
    import torch

    from tformer.generate import generate
    from tformer.tasks.tokenizer import BOS, EOS
    from tformer.training import load_run

    model, source, _ = load_run(run_dir)
    task = getattr(source, "task", None)
    if task is None:
        raise ValueError(f"RUN_DIR: {run_dir} was trained on your data; --html takes synthetic-task "
                         "runs and model directories (export the run first: tformer export RUN --hf)")
    vocab = task.tokenizer.vocab
    ids = task.tokenizer.encode(text, strict=True)
    if not ids:
        raise ValueError(f"TEXT: expected at least one symbol, got {text!r}")
    ids = ids + [EOS] if task.kind == "seq2seq" else [BOS] + ids
    limit = model.config.max_len
    if len(ids) > limit:
        raise ValueError(
            f"TEXT: {text!r} is {len(ids)} tokens with specials; this model takes at most {limit}"
        )
    src = torch.tensor([ids])  # (1, S)
    names = [vocab[i] for i in ids]
    with torch.inference_mode():
        if task.kind == "classification":
            out = model(src, output_attentions=True)
            return [AttentionMaps("encoder self-attention", names, names, _stack(out.attentions))]
        enc = model.encode(src, output_attentions=True)
        generated = generate(model, src, max_len=min(limit, task.max_target_tokens + 1)).tolist()[0]
        tgt_in = [BOS] + [i for i in generated if i != EOS]  # (T,): <bos> + the output
        dec = model.decode(torch.tensor([tgt_in]), enc.last_hidden_state, output_attentions=True)
    tgt_names = [vocab[i] for i in tgt_in]
    rows = "Rows are the decoder's inputs: <bos>, then the greedy output; row t predicts token t + 1."
    return [
        AttentionMaps("encoder self-attention", names, names, _stack(enc.attentions)),
        AttentionMaps(
            "decoder self-attention", tgt_names, tgt_names, _stack(dec.decoder_attentions), rows + " Causal."
        ),
        AttentionMaps(
            "decoder cross-attention",
            tgt_names,
            names,
            _stack(dec.cross_attentions),
            rows + " Keys: the source.",
        ),
    ]


def write_html(args: argparse.Namespace) -> str:
    """Write the page for ``args`` (the attention command's); returns a one-line summary."""
    from tformer.viz_html import write_attention_page

    if not args.html.lower().endswith((".html", ".htm")):
        raise ValueError(f"--html: expected a .html file name, got {args.html!r}")
    maps = run_maps(args.model_dir, args.text) if is_run_dir(args.model_dir) else bert_maps(args)
    n_layers, n_heads = maps[0].weights.shape[:2]
    for option, value, n in (("--layer", args.layer, n_layers), ("--head", args.head, n_heads)):
        if value is not None and not 0 <= value < n:
            raise ValueError(f"{option}: expected 0..{n - 1}, got {value}")
    path = write_attention_page(args.html, maps, args.model_dir, args.text, args.layer or 0, args.head or 0)
    return (
        f"wrote {path} ({len(maps)} kind{'s' if len(maps) > 1 else ''} of attention, "
        f"{n_layers} layers x {n_heads} heads, {len(maps[0].queries)} tokens)"
    )


def _stack(attentions):
    """n_layers x (1, H, Tq, Tk) -> (L, H, Tq, Tk)."""
    import torch

    return torch.stack([a[0] for a in attentions])
