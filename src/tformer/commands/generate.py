"""`tformer generate RUN_DIR INPUT...`: run a trained model on your own inputs.

Seq2seq runs print the generated output, classification runs the predicted class,
one line per input.
"""

from __future__ import annotations

import argparse

HELP = "run a trained model on inputs given on the command line"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("run_dir", metavar="RUN_DIR", help="a directory written by `tformer train`")
    parser.add_argument("inputs", nargs="+", metavar="INPUT",
                        help='inputs in the task\'s format, e.g. "3 1 4 1 5" for reverse')
    parser.add_argument("--beam-size", type=int, default=1, help="1 = greedy (default)")
    parser.add_argument("--length-penalty", type=float, default=1.0,
                        help="beam search: rank by score / length ** this (default 1.0)")
    parser.add_argument("--max-len", type=int, default=None,
                        help="most tokens to generate (default: the task's longest target + 1)")


def run(args: argparse.Namespace) -> int:
    import torch

    from tformer.generate import generate
    from tformer.tasks.base import pad
    from tformer.tasks.tokenizer import BOS, EOS
    from tformer.train import load_run

    model, task, _ = load_run(args.run_dir)
    limit = model.config.max_len
    rows = []
    for text in args.inputs:
        ids = task.tokenizer.encode(text, strict=True)
        if not ids:
            raise ValueError(f"input: expected at least one symbol, got {text!r}")
        ids = ids + [EOS] if task.kind == "seq2seq" else [BOS] + ids
        if len(ids) > limit:
            raise ValueError(
                f"input: {text!r} is {len(ids)} tokens with specials; this model takes at most {limit}"
            )
        rows.append(ids)
    ids, mask = pad(rows)  # (B, S)
    if task.kind == "classification":
        with torch.no_grad():
            logits = model(ids, attention_mask=mask).logits  # (B, C)
        for label in logits.argmax(-1).tolist():
            print(label)
        return 0
    max_len = args.max_len or task.max_target_tokens + 1
    if not 1 <= max_len <= limit:
        raise ValueError(f"--max-len: expected 1..{limit} (the model's positions), got {max_len}")
    out = generate(model, ids, mask, beam_size=args.beam_size, max_len=max_len,
                   length_penalty=args.length_penalty)
    for seq in out.tolist():
        print(task.tokenizer.decode(seq))
    return 0
