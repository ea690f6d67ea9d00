"""`tformer predict RUN_DIR --file texts.txt`: a text classifier's labels (and probabilities).

One input per line (for a run trained on pairs a tab separates text and text_pair; for one
trained on single texts a tab is part of the text); prints per input what the run says
(``Run.answer_text``: a classifier's label; a multi-label run's chosen labels), or with
--format jsonl the whole answer (``Run.answer_record``: {"text", "label" or "labels",
"probabilities"}): one output line per input, always (see tformer.text.lines). Probabilities
that are not finite (a broken checkpoint) are refused, never printed as NaN.
"""

from __future__ import annotations

import argparse
import itertools
import math

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

HELP = ("classify texts with a classification or multi-label run (its label(s) per line, or JSONL with "
        "probabilities)")


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("run_dir", metavar="RUN_DIR", help="a classification or multi-label run on your data")
    parser.add_argument("inputs", nargs="*", metavar="TEXT", help="texts to classify")
    parser.add_argument("--file", metavar="FILE", default=None,
                        help="read texts from FILE, one per line ('-': standard input)")
    parser.add_argument("--format", choices=("text", "jsonl"), default="text",
                        help="text: the label (a multi-label run: the chosen labels, joined by its "
                             "--label-separator, else ', '); jsonl: the whole answer with every label's "
                             "probability (default: text)")
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
            probs = answer["probabilities"]
            if not all(math.isfinite(p) for p in probs.values()):
                raise ValueError(f"RUN_DIR {args.run_dir}: expected finite probabilities, got "
                                 f"{list(probs.values())} for input {n + 1} (the weights are not "
                                 "finite: was its training diverging?)")
            if args.format == "text":
                rows.append(run.answer_text(answer))
            else:
                rows.append(json_line(run.answer_record(t, answer), f"input {n + 1}"))
        print_lines(rows)
    cut.warn(total)
    return 0
