"""`tformer predict RUN_DIR --file texts.txt`: a classifier's label (and probabilities), or a
regression run's score.

One input per line (for a run trained on pairs a tab separates text and text_pair; for one
trained on single texts a tab is part of the text); prints what the run shows per input (a
label, a score) one per line, or with --format jsonl the run's whole answer with the text
({"text", "label", "probabilities"}; {"text", "score"}): one output line per input, always
(see tformer.text.lines). Numbers that are not finite (a broken checkpoint) are refused, never
printed as NaN.
"""

from __future__ import annotations

import argparse
import itertools
import math
from typing import Any

from tformer.commands._inputs import (
    Truncations,
    add_device,
    add_threads,
    bad_input,
    check_options,
    device_of,
    input_windows,
    json_line,
    print_lines,
)
from tformer.errors import BadInput

HELP = ("classify texts with a classification run (label per line, or JSONL with probabilities), or score "
        "them with a regression run")


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("run_dir", metavar="RUN_DIR", help="a classification or regression run on your data")
    parser.add_argument("inputs", nargs="*", metavar="TEXT",
                        help="texts to classify or score (a tab separates a text and its text_pair)")
    parser.add_argument("--file", metavar="FILE", default=None,
                        help="read texts from FILE, one per line ('-': standard input)")
    parser.add_argument("--format", choices=("text", "jsonl"), default="text",
                        help="text: the label (or score); jsonl: the whole answer, e.g. label and "
                             "probabilities (default: text)")
    parser.add_argument("--batch-size", type=int, default=64, help="texts per batch (default 64)")
    add_threads(parser)
    add_device(parser)


def run(args: argparse.Namespace) -> int:
    from tformer.kinds import load_run

    check_options(args)
    inputs = input_windows(args, "inputs", "TEXT", args.batch_size)
    first = next(inputs)  # the inputs checked before the run loads
    run = load_run(args.run_dir, needs="predict", device=device_of(args))
    cut, total = Truncations(args, "inputs", "TEXT", run.tokenizer.max_length if run.tokenizer else 0), 0
    for start, chunk in itertools.chain([first], inputs):
        split = [t.partition("\t") if run.pairs else (t, "", "") for t in chunk]  # text, tab, text_pair
        pairs = [pair for _, _, pair in split]
        cut.note(start, run.truncated([text for text, _, _ in split], [p or None for p in pairs]))
        total += len(chunk)
        try:
            answers = run.predict([text for text, _, _ in split], pairs if any(pairs) else None,
                                  batch_size=args.batch_size)
        except BadInput as e:
            raise bad_input(args, "inputs", "TEXT", start, e) from None
        rows = []
        for n, (t, answer) in enumerate(zip(chunk, answers, strict=True), start):
            _check_finite(args, answer, n)
            if args.format == "text":
                rows.append(run.shown(answer))  # the run says what it prints: a label, a score...
            else:
                rows.append(json_line({"text": t, **_rounded(answer)}, f"input {n + 1}"))
        print_lines(rows)
    cut.warn(total)
    return 0


def _numbers(value: Any) -> list:
    """The numbers of an answer's field: a number, or a mapping's or list's values."""
    values = value.values() if isinstance(value, dict) else value if isinstance(value, list) else [value]
    return [v for v in values if isinstance(v, float)]


def _check_finite(args: argparse.Namespace, answer: dict[str, Any], n: int) -> None:
    """Numbers that are not finite (a broken checkpoint) refused, never printed as NaN."""
    for key, value in answer.items():
        numbers = _numbers(value)
        if not all(math.isfinite(v) for v in numbers):
            raise ValueError(f"RUN_DIR {args.run_dir}: expected finite {key}, got {numbers} for input "
                             f"{n + 1} (the weights are not finite: was its training diverging?)")


def _rounded(answer: dict[str, Any]) -> dict[str, Any]:
    """The answer with its numbers rounded to 6 decimals, for --format jsonl."""
    def rounded(value: Any) -> Any:
        if isinstance(value, float):
            return round(value, 6)
        if isinstance(value, dict):
            return {k: rounded(v) for k, v in value.items()}
        return [rounded(v) for v in value] if isinstance(value, list) else value

    return {k: rounded(v) for k, v in answer.items()}
