"""`tformer eval RUN_DIR`: metrics of a trained run on its test (or validation) split."""

from __future__ import annotations

import argparse
import json

HELP = "evaluate a trained run on its test or validation split"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("run_dir", metavar="RUN_DIR", help="a directory written by `tformer train`")
    parser.add_argument("--split", choices=("test", "validation"), default="test")
    parser.add_argument("--beam-size", type=int, default=1, help="seq2seq: 1 = greedy (default)")
    parser.add_argument("--limit", type=int, default=None, help="only the first N examples")
    parser.add_argument("--samples", type=int, default=6, help="sample rows to print (default 6)")
    parser.add_argument("--threads", type=int, default=None, help="torch CPU threads")


def run(args: argparse.Namespace) -> int:
    import torch

    from tformer.train import evaluate, load_run, main_metric, sample_table

    if args.limit is not None and args.limit < 1:
        raise ValueError(f"--limit: expected a positive int, got {args.limit}")
    if args.threads:
        torch.set_num_threads(args.threads)
    model, task, config = load_run(args.run_dir)
    metrics, preds = evaluate(model, task, args.split, beam_size=args.beam_size, limit=args.limit)
    examples = task.split(args.split)[: args.limit]
    if args.samples:
        print(sample_table(task, examples, preds, n=args.samples))
    record = {"split": args.split, "task": task.name, "examples": len(examples), **metrics}
    if task.kind == "classification":
        record["majority_baseline"] = task.majority_baseline()["accuracy"]
    print(f"{args.split} {main_metric(task)}: {metrics[main_metric(task)]:.4f}")
    print(json.dumps(record))
    return 0
