"""`tformer generate RUN_DIR [INPUT...] [--file FILE]`: run a trained seq2seq model on your inputs.

It prints the generated output, one line per input, in order, always (inputs are read as
tformer.text.lines says). Runs on your data use the tokenizer saved in RUN_DIR. A run of a
kind that does not generate is refused in one line naming its own command (a classification
run: `tformer predict`, which prints the label with its probability), as `embed` refuses it.
"""

from __future__ import annotations

import argparse
import itertools

from tformer.commands._inputs import (
    Truncations,
    add_device,
    add_early_stopping,
    add_threads,
    bad_input,
    check_early_stopping,
    check_options,
    device_of,
    input_windows,
    print_lines,
)
from tformer.errors import BadInput

HELP = "run a trained seq2seq model on inputs (arguments or --file, one per line)"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("run_dir", metavar="RUN_DIR",
                        help="a seq2seq run directory written by `tformer train` (another kind's run is "
                             "refused, naming its command: a classification run's is tformer predict)")
    parser.add_argument("inputs", nargs="*", metavar="INPUT",
                        help='inputs in the task\'s format, e.g. "3 1 4 1 5" for reverse')
    parser.add_argument("--file", metavar="FILE", default=None,
                        help="read inputs from FILE, one per line ('-': standard input)")
    parser.add_argument("--beam-size", type=int, default=1, help="1 = greedy (default)")
    parser.add_argument("--length-penalty", type=float, default=1.0,
                        help="beam search: rank by score / length ** this (default 1.0)")
    parser.add_argument("--max-len", type=int, default=None,
                        help="most tokens to generate (default: 2 x the input's tokens + 10, at most "
                             "the run's max length, or a task's longest target + 1)")
    add_early_stopping(parser)
    parser.add_argument("--batch-size", type=int, default=32, help="inputs per batch (default 32)")
    add_threads(parser)
    add_device(parser)


def run(args: argparse.Namespace) -> int:
    from tformer.kinds import load_run
    from tformer.nn.kernels.compiling import more_to_come

    check_options(args)
    check_early_stopping(args)
    inputs = input_windows(args, "inputs", "INPUT", args.batch_size)
    first = next(inputs)  # the inputs checked before the run loads
    run = load_run(args.run_dir, needs="generate", device=device_of(args))  # (another kind: its verb)
    options = {"beam_size": args.beam_size, "length_penalty": args.length_penalty, "max_len": args.max_len,
               "early_stopping": args.early_stopping}
    cut, total = Truncations(args, "inputs", "INPUT", run.tokenizer.max_length if run.tokenizer else 0), 0
    for start, texts, after in itertools.chain([first], inputs):
        cut.note(start, run.truncated(texts))
        total += len(texts)
        try:
            with more_to_come(after):  # a compiled decoding step is repaid over the whole file
                outs = run.answers(texts, batch_size=args.batch_size, **options)
        except BadInput as e:
            raise bad_input(args, "inputs", "INPUT", start, e) from None
        print_lines(outs)
    cut.warn(total)
    return 0
