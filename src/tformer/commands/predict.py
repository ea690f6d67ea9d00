"""`tformer predict RUN_DIR --file texts.txt`: what a run predicts for each text, as its kind
prints it (the run says: ``Run.printed``): a classifier's label (and probabilities), a
multi-label run's chosen labels, a regression run's score, a tagger's entities, a masked-LM
run's candidates for each mask token of the text (fill-mask's answer).

One input per line (for a run trained on pairs a tab separates text and text_pair; for one
trained on single texts a tab is part of the text: ``Run.predict_inputs``); prints one line per
input, or with --format jsonl one object: one output line per input, always (see
tformer.text.lines). A classifier prints its label ({"text", "label", "probabilities"}), a
multi-label run its chosen labels joined by its --label-separator, else ", " ({"text", "labels",
"probabilities"}), a regression run its score ({"text", "score"}), a tagger its text with the
entities marked, [words](TYPE) ({"text", "entities": [{"entity_group", "score", "word", "start",
"end"}]}), grouped as transformers' pipeline groups them with --aggregation-strategy (default
"first": a word takes its first sub-word's label; "simple": each sub-word its own, the server's
default; ``Run.read_aggregation``: another kind refuses it). Scores that are not finite (a broken
checkpoint) are refused, never printed as NaN.
"""

from __future__ import annotations

import argparse
import itertools

from tformer.commands._inputs import (
    Truncations,
    add_device,
    add_long,
    add_threads,
    as_flag,
    bad_input,
    check_options,
    device_of,
    input_windows,
    json_line,
    print_lines,
)
from tformer.errors import BadInput
from tformer.text.word_pieces import STRATEGIES

HELP = ("predict with a classification or multi-label run (its label(s) per line, or JSONL with "
        "probabilities), score texts with a regression run, find their entities with a token-classification "
        "run, or fill the mask token of texts with a masked-LM run (candidates and scores)")


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("run_dir", metavar="RUN_DIR",
                        help="a classification, multi-label, regression, token-classification or masked-LM "
                             "run on your data")
    parser.add_argument("inputs", nargs="*", metavar="TEXT",
                        help="texts to classify, score or tag (a tab separates a text and its text_pair), "
                             "or to fill (with the run's mask token, <mask> or [MASK])")
    parser.add_argument("--file", metavar="FILE", default=None,
                        help="read texts from FILE, one per line ('-': standard input)")
    parser.add_argument("--format", choices=("text", "jsonl"), default="text",
                        help="text: the label (a multi-label run: the chosen labels, joined by its "
                             "--label-separator, else ', '), or the score (a tagger: the text, its entities "
                             "marked [words](TYPE), grouped by --aggregation-strategy; a masked-LM run: each "
                             "mask's top 5 candidates, 'token score', masks separated by ' | '); jsonl: the "
                             "whole answer, e.g. {text, label, probabilities}, {text, score}, {text, "
                             "entities} or {text, fills} (default: text)")
    parser.add_argument("--batch-size", type=int, default=64, help="texts per batch (default 64)")
    parser.add_argument("--aggregation-strategy", choices=STRATEGIES, default=None,
                        help="a tagger: how sub-words group into entities, as transformers' pipeline "
                             "groups them: first (a word takes its first sub-word's label, as eval scores "
                             "it) or simple (each sub-word its own, the server's default) (default: first)")
    add_long(parser)
    add_threads(parser)
    add_device(parser)


def run(args: argparse.Namespace) -> int:
    from tformer.kinds import load_run
    from tformer.nn.kernels.compiling import more_to_come

    check_options(args)
    inputs = input_windows(args, "inputs", "TEXT", args.batch_size)
    first = next(inputs)  # the inputs checked before the run loads
    run = load_run(args.run_dir, needs="predict", device=device_of(args))
    with as_flag("--long"):
        run.read_long(args.long)  # (only a kind that pools windows reads them)
    with as_flag("--aggregation-strategy"):
        run.read_aggregation(args.aggregation_strategy)  # (only a tagger groups entities)
    cut, total = Truncations(args, "inputs", "TEXT", run.max_input_tokens if run.tokenizer else 0), 0
    for start, chunk, after in itertools.chain([first], inputs):
        texts, pairs = run.predict_inputs(chunk)  # a classifier trained on pairs: text, tab, text_pair
        cut.note(start, run.truncated(texts, pairs))
        total += len(chunk)
        try:
            with more_to_come(after):  # compiled kernels are repaid over the whole file
                answers = run.predict(texts, **({} if pairs is None else {"pairs": pairs}),
                                      batch_size=args.batch_size)
        except BadInput as e:
            raise bad_input(args, "inputs", "TEXT", start, e) from None
        rows = []
        for n, (t, answer) in enumerate(zip(chunk, answers, strict=True), start):
            line, record = run.printed(t, answer)  # (raises on scores that are not finite)
            rows.append(line if args.format == "text" else json_line(record, f"input {n + 1}"))
        print_lines(rows)
    cut.warn(total)
    return 0
