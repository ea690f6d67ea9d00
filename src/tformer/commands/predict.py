"""`tformer predict RUN_DIR --file texts.txt`: a text classifier's label (and probabilities),
a tagger's entities.

One input per line (for a classifier trained on pairs a tab separates text and text_pair; for
one trained on single texts a tab is part of the text); prints one output line per input,
always (see tformer.text.lines), as the run says (``Run.shown``): a classifier's label, or with
--format jsonl {"text", "label", "probabilities"}; a tagger's text with its entities marked,
[words](TYPE), or with --format jsonl {"text", "entities": [{"entity_group", "score", "word",
"start", "end"}]}. Numbers that are not finite (a broken checkpoint) are refused, never
printed as NaN.
"""

from __future__ import annotations

import argparse
import itertools

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

HELP = ("classify texts with a classification run (label per line, or JSONL with probabilities), or find "
        "their entities with a token-classification run")


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("run_dir", metavar="RUN_DIR",
                        help="a classification or token-classification run on your data")
    parser.add_argument("inputs", nargs="*", metavar="TEXT", help="texts to classify or tag")
    parser.add_argument("--file", metavar="FILE", default=None,
                        help="read texts from FILE, one per line ('-': standard input)")
    parser.add_argument("--format", choices=("text", "jsonl"), default="text",
                        help="text: the label (a tagger: the text, its entities marked [words](TYPE)); "
                             "jsonl: label and probabilities (a tagger: the entities with their "
                             "offsets and scores) (default: text)")
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
        texts, pairs = run.predict_inputs(chunk)  # a classifier trained on pairs: text, tab, text_pair
        cut.note(start, run.truncated(texts, pairs))
        total += len(chunk)
        try:
            answers = run.predict(texts, **({} if pairs is None else {"pairs": pairs}),
                                  batch_size=args.batch_size)
        except BadInput as e:
            raise bad_input(args, "inputs", "TEXT", start, e) from None
        rows = []
        for n, (t, answer) in enumerate(zip(chunk, answers, strict=True), start):
            row = run.shown(t, answer, args.format, f"input {n + 1}")
            rows.append(row if isinstance(row, str) else json_line(row, f"input {n + 1}"))
        print_lines(rows)
    cut.warn(total)
    return 0
