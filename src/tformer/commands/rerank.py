"""`tformer rerank RUN_DIR --query Q --file passages.txt`: passages ordered by a reranker run's
score of each (query, passage) pair, best first.

Passages come from the arguments, then --file (one per line, read as tformer.text.lines says:
a blank line is an error naming FILE:LINE). Prints "score<TAB>passage" per passage, best first
(equal scores in the order given), or with --format jsonl one {"index", "score", "text"} object
(index: the passage's place among the inputs, from 0). Scores are the run's (the output's
sigmoid; --raw-scores: its logit). The file is read a window at a time: memory holds each
passage's score, and the texts of the --top-k best (all of them without --top-k).
"""

from __future__ import annotations

import argparse
import heapq
import itertools
import math

from tformer.commands._inputs import (
    Truncations,
    add_device,
    add_threads,
    check_options,
    device_of,
    input_windows,
    json_line,
    located,
    print_lines,
)

HELP = "order passages by a reranker run's score for a query (best first)"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("run_dir", metavar="RUN_DIR",
                        help="a reranker run of `tformer train` (query, positive, negatives data)")
    parser.add_argument("passages", nargs="*", metavar="PASSAGE", help="passages to rank")
    parser.add_argument("--query", required=True, help="the query the passages are ranked for")
    parser.add_argument("--file", metavar="FILE", default=None,
                        help="read passages from FILE, one per line ('-': standard input)")
    parser.add_argument("--top-k", type=int, default=None, help="print only the K best (default: all)")
    parser.add_argument("--format", choices=("text", "jsonl"), default="text",
                        help="text: score<TAB>passage; jsonl: {index, score, text} (default: text)")
    parser.add_argument("--raw-scores", action="store_true",
                        help="print the output's logits, not their sigmoid (the order is the same)")
    parser.add_argument("--batch-size", type=int, default=64, help="pairs per batch (default 64)")
    add_threads(parser)
    add_device(parser)


def run(args: argparse.Namespace) -> int:
    from tformer.kinds import load_run
    from tformer.nn.kernels.compiling import more_to_come
    from tformer.text.arguments import check_texts

    check_options(args)
    check_texts("--query", [args.query], one=True)
    windows = input_windows(args, "passages", "PASSAGE", args.batch_size)
    first = next(windows)  # the passages checked before the run loads
    run = load_run(args.run_dir, needs="rerank", device=device_of(args))
    cut = Truncations(args, "passages", "PASSAGE", run.tokenizer.max_length)
    best: list[tuple[float, int, str]] = []  # a heap of (score, -index, text): the k best kept
    total = 0
    for start, chunk, after in itertools.chain([first], windows):
        cut.note(start, run.truncated([args.query] * len(chunk), chunk))
        with more_to_come(after):  # compiled kernels are repaid over the whole file
            found_all = run.rerank(args.query, chunk, batch_size=args.batch_size, raw=args.raw_scores)
        for found in found_all:
            i, score = start + found["index"], found["score"]
            if not math.isfinite(score):
                raise ValueError(f"RUN_DIR {args.run_dir}: expected finite scores, got {score} for "
                                 f"{located(args, 'passages', 'PASSAGE', i)} (the weights are not finite: "
                                 "was its training diverging?)")
            item = (score, -i, chunk[found["index"]])
            if args.top_k is None or len(best) < args.top_k:
                heapq.heappush(best, item)
            else:
                heapq.heappushpop(best, item)
        total += len(chunk)
    ranked = sorted(best, reverse=True)  # best first; equal scores: the earlier passage first
    if args.format == "text":
        print_lines(f"{score:.6f}\t{text}" for score, _, text in ranked)
    else:
        print_lines(json_line({"index": -i, "score": round(score, 6), "text": text}, f"passage {-i + 1}")
                    for score, i, text in ranked)
    cut.warn(total)
    return 0
