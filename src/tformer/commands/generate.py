"""`tformer generate RUN_DIR [INPUT...] [--file FILE]`: run a trained model on your inputs.

Seq2seq runs print the generated output, classification runs the predicted class, one
line per input, in order, always (inputs are read as tformer.text.lines says). Runs on your
data use the tokenizer saved in RUN_DIR.
"""

from __future__ import annotations

import argparse

from tformer.commands._inputs import add_threads, check_options, input_texts

HELP = "run a trained model on inputs (arguments or --file, one per line)"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("run_dir", metavar="RUN_DIR", help="a directory written by `tformer train`")
    parser.add_argument("inputs", nargs="*", metavar="INPUT",
                        help='inputs in the task\'s format, e.g. "3 1 4 1 5" for reverse')
    parser.add_argument("--file", metavar="FILE", default=None,
                        help="read inputs from FILE, one per line ('-': standard input)")
    parser.add_argument("--beam-size", type=int, default=1, help="1 = greedy (default)")
    parser.add_argument("--length-penalty", type=float, default=1.0,
                        help="beam search: rank by score / length ** this (default 1.0)")
    parser.add_argument("--max-len", type=int, default=None,
                        help="most tokens to generate (default: the task's longest target + 1)")
    parser.add_argument("--batch-size", type=int, default=32, help="inputs per batch (default 32)")
    add_threads(parser)


def run(args: argparse.Namespace) -> int:
    from tformer.training import load_run

    check_options(args)
    texts = input_texts(args, "inputs", "INPUT")
    model, source, config = load_run(args.run_dir)
    if config.data is not None:
        return _run_data(args, model, source, texts)
    return _run_task(args, model, source.task, texts)


def _run_data(args, model, source, texts: list[str]) -> int:
    from tformer.training.data_objectives import Classification, Seq2Seq

    if isinstance(source, Seq2Seq):
        if args.max_len is not None and not 1 <= args.max_len <= model.config.max_len:
            raise ValueError(f"--max-len: expected 1..{model.config.max_len}, got {args.max_len}")
        for i in range(0, len(texts), args.batch_size):
            for out in source.generate(model, texts[i : i + args.batch_size], args.beam_size,
                                       args.length_penalty, max_len=args.max_len):
                print(out, flush=True)
        return 0
    if isinstance(source, Classification):
        for i in range(0, len(texts), args.batch_size):
            records = [{"text": t, "label": source.data.labels[0]}
                       for t in texts[i : i + args.batch_size]]
            for probs in source.predict(model, records):
                print(source.data.labels[max(range(len(probs)), key=probs.__getitem__)])
        return 0
    raise ValueError(f"RUN_DIR: {args.run_dir} is an embedding run; use `tformer embed {args.run_dir}`")


def _run_task(args, model, task, texts: list[str]) -> int:
    import torch

    from tformer.nn.generate import generate
    from tformer.tasks.base import pad
    from tformer.tasks.tokenizer import BOS, EOS, PAD

    limit = model.config.max_len
    rows = []
    for text in texts:
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
                   length_penalty=args.length_penalty, bos_id=BOS, eos_id=EOS, pad_id=PAD)
    for seq in out.tolist():
        print(task.tokenizer.decode(seq))
    return 0
