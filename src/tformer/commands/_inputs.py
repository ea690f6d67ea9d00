"""What the inference commands share: their inputs (arguments, then ``--file`` lines), the
``--threads`` and ``--device`` options, range checks on numeric options, and JSON lines that
refuse NaN.

Numeric options are checked when a command starts, by one table, so each says the same
one-line error (``--batch-size: expected >= 1, got 0``) instead of printing nothing or a
traceback later.
"""

from __future__ import annotations

import argparse
import contextlib
import itertools
import json
import math
import sys
from collections.abc import Iterable, Iterator
from typing import Any

from tformer.errors import BadInput, FieldError
from tformer.nn.kernels.machine import check_threads, free_threads, others_running
from tformer.text.batches import SORT_WINDOW
from tformer.text.lines import STDIN, TextLines
from tformer.text.prefix import LongTexts

# dest -> the smallest value it takes (options a command does not have are skipped).
MINIMUMS = {"batch_size": 1, "threads": 1, "top_k": 1, "beam_size": 1, "max_len": 1,
            "max_length": 1, "limit": 1, "samples": 0}
FINITE = ("length_penalty",)  # float options: argparse accepts "nan" and "inf"


def add_threads(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--threads", type=int, default=None,
                        help="torch CPU threads (default: one per core that other processes leave free)")


def add_device(parser: argparse.ArgumentParser) -> None:
    from tformer.nn.devices import HELP

    parser.add_argument("--device", default="auto", help=f"where the model runs: {HELP}")


def add_long(parser: argparse.ArgumentParser, model_dir: bool = False) -> None:
    parser.add_argument("--long", choices=("windows", "cut"), default=None,
                        help="a text longer than the max length: read in overlapping windows, their "
                        "outputs averaged, or cut (default: as the run settled in training"
                        + ("; a model directory: cut)" if model_dir else ")"))


@contextlib.contextmanager
def as_flag(flag: str):
    """A block whose refusal of a named field (FieldError: a run's ``read_long("windows")``)
    names the command's flag that gave it (``--long``), not the library's argument."""
    try:
        yield
    except FieldError as e:
        raise e.named(flag) from None


def device_of(args: argparse.Namespace):
    """--device as a torch.device, refused in one line where this machine lacks it."""
    from tformer.nn.devices import resolve_device

    return resolve_device(args.device, "--device")


def check_options(args: argparse.Namespace) -> None:
    """Refuse out-of-range numeric options, then set torch's threads: --threads, else one per
    core that other processes leave free (never more than torch has now)."""
    for dest, minimum in MINIMUMS.items():
        value = getattr(args, dest, None)
        if value is not None and value < minimum:
            raise ValueError(f"--{dest.replace('_', '-')}: expected >= {minimum}, got {value}")
    for dest in FINITE:
        value = getattr(args, dest, None)
        if value is not None and not math.isfinite(value):
            raise ValueError(f"--{dest.replace('_', '-')}: expected a finite number, got {value}")
    if not hasattr(args, "threads"):
        return
    check_threads(args.threads)
    import torch

    if args.threads is not None:
        torch.set_num_threads(args.threads)
    else:  # one per core that other processes leave free (a busy machine: fewer, and faster)
        torch.set_num_threads(free_threads(torch.get_num_threads(), others_running(5, 0.01)))


# Options only a run that generates (seq2seq) reads, with the value each means when not given.
DECODING = {"beam_size": 1, "length_penalty": 1.0, "max_len": None}


def add_early_stopping(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--early-stopping", action="store_true",
                        help="beam search: an input also stops once --beam-size of its hypotheses have "
                             "ended, whatever their scores (the rule of CTranslate2 and of Hugging Face's "
                             "early_stopping=True): sooner, and it may print a worse output (default off)")


def check_early_stopping(args: argparse.Namespace) -> None:
    """--early-stopping is beam search's rule: refused with greedy search, where it would do nothing."""
    if getattr(args, "early_stopping", False) and args.beam_size == 1:
        raise ValueError("--early-stopping: a beam search rule; expected --beam-size 2 or more with it, "
                         "got --beam-size 1 (greedy)")


def check_decoding_options(args: argparse.Namespace, run: Any) -> None:
    """Refuse decoding options given for a run that does not generate (a classifier, an
    embedding model): they would be accepted and do nothing."""
    if run.decodes:
        return
    for dest, unset in DECODING.items():
        value = getattr(args, dest, unset)
        if value != unset:
            flag = "--" + dest.replace("_", "-")
            raise ValueError(f"{flag}: {args.run_dir} is a {run.kind} run, which does not generate "
                             f"(only seq2seq runs search); expected no {flag}, got {value}")


def file_lines(args: argparse.Namespace) -> TextLines | None:
    """--file's lines ('-': standard input), or None without --file."""
    return TextLines(args.file, "--file") if args.file is not None else None


def given_texts(args: argparse.Namespace, positional: str, metavar: str) -> list[str]:
    """The texts given as arguments, a blank one refused naming it, as a blank line is
    (tformer.text.lines)."""
    given = list(getattr(args, positional))
    for i, text in enumerate(given):
        if not text.strip():
            raise ValueError(f"{metavar} {i + 1}: expected a text, got {text!r} (every argument is one "
                             "input)")
        _check_utf8(f"{metavar} {i + 1}", text)
    return given


def _check_utf8(name: str, text: str) -> None:
    """Refuse an argument that was not UTF-8: Python hands its bytes over as lone surrogates
    (PEP 383), which no tokenizer takes; named as a --file line's bad byte is."""
    try:
        text.encode("utf-8")
    except UnicodeEncodeError as e:
        bad, column = ord(text[e.start]), len(text[:e.start].encode()) + 1
        got = f"byte {bad - 0xDC00:#04x}" if 0xDC80 <= bad <= 0xDCFF else f"a lone surrogate {chr(bad)!r}"
        raise ValueError(f"{name}: expected UTF-8 text, got {got} at column {column}") from None


def input_texts(args: argparse.Namespace, positional: str, metavar: str, minimum: int = 1,
                maximum: int | None = None, why: str = "") -> list[str]:
    """The texts given as arguments (``args.<positional>``), then --file's lines; past
    ``maximum`` refused (saying ``why``) before the file is held: counted as it is read."""
    texts = given_texts(args, positional, metavar)
    lines = file_lines(args) if getattr(args, "file", None) is not None else None
    if maximum is not None:
        check_count(count_inputs(len(texts), lines), metavar, minimum, maximum, why)
    if lines is not None:
        read = lines.texts()
        if not read and not texts:
            raise empty_file(lines)
        texts += read
    check_count(len(texts), metavar, minimum)
    return texts


def input_windows(args: argparse.Namespace, positional: str, metavar: str, batch_size: int
                  ) -> Iterator[tuple[int, list[str], int]]:
    """(index of its first input, its texts, how many inputs come after them) for each run of
    SORT_WINDOW batches of the texts given as arguments, then of --file's lines. The file is
    checked whole first (one pass that keeps nothing: a blank line fails before any output),
    then read a window at a time, so memory does not grow with its lines. (The inputs after a
    window tell a compiled kernel the work left to repay it: kernels.compiling.more_to_come.)"""
    given = given_texts(args, positional, metavar)
    lines = file_lines(args) if getattr(args, "file", None) is not None else None
    total = count_inputs(len(given), lines)
    check_count(total, metavar)
    texts = itertools.chain(given, (t for _, t in lines) if lines is not None else ())
    start, step = 0, batch_size * SORT_WINDOW
    while chunk := list(itertools.islice(texts, step)):
        yield start, chunk, max(0, total - start - len(chunk))
        start += len(chunk)


def located(args: argparse.Namespace, positional: str, metavar: str, index: int, message: str = ""
            ) -> str:
    """Where input `index` (counted over the arguments, then --file's lines) came from: its
    argument (INPUT 2) or its line (--file FILE:LINE; every line is an input, a blank one being
    an error), then ": message"."""
    given = len(getattr(args, positional))
    if index < given:
        where = f"{metavar} {index + 1}"
    else:
        where = f"--file {'standard input' if args.file == STDIN else args.file}:{index - given + 1}"
    return f"{where}: {message}" if message else where


def bad_input(args: argparse.Namespace, positional: str, metavar: str, start: int, error: BadInput
              ) -> ValueError:
    """`error` about input `error.index` of the window from input `start` (input_windows),
    naming its argument or line."""
    return ValueError(located(args, positional, metavar, start + error.index, error.reason))


def print_lines(lines: Iterable[str]) -> None:
    """Each line to standard output in one write with its newline, then a flush: a Ctrl-C
    lands between lines, never between a line and its newline (print() writes them apart, so
    an interrupted output could end in half a row), and what was printed is out."""
    try:
        for line in lines:
            sys.stdout.write(f"{line}\n")
        sys.stdout.flush()
    except BrokenPipeError:
        raise  # the reader went away: tformer.commands.cli says nothing
    except OSError as e:
        if e.errno is not None and not e.filename:  # a full disk under `> out.txt`: name it
            e.filename = "standard output"
        raise


class Truncations:
    """The inputs a run cut to its maximum length (``max_length`` tokens), noted a window at a
    time and told in one warning at the end, naming their arguments or lines (the first few:
    only those are kept)."""

    def __init__(self, args: argparse.Namespace, positional: str, metavar: str, max_length: int) -> None:
        self.args, self.positional, self.metavar = args, positional, metavar
        self.long = LongTexts(max_length)  # of input indices

    def note(self, start: int, long: list[tuple[int, int]]) -> None:
        for i, n in long:
            self.long.note(start + i, n)

    def warn(self, total: int) -> None:
        if not self.long.count:
            return
        named = self.long.places(lambda i: located(self.args, self.positional, self.metavar, i))
        why = self.long.reason("the run's")
        print(f"tformer {self.args.command}: warning: {self.long.count} of {total} inputs {why}: {named}",
              file=sys.stderr)


def count_inputs(given: int, lines: TextLines | None) -> int:
    """The inputs: `given` arguments, then --file's lines. A file with no lines and no argument
    beside it is named in the error (it said only "TEXT: expected at least 1 text(s)")."""
    if lines is None:
        return given
    n = lines.count()
    if n == 0 and given == 0:
        raise empty_file(lines)
    return given + n


def empty_file(lines: TextLines) -> ValueError:
    return ValueError(f"{lines.where()}: expected at least one line of text, got an empty file")


def check_count(n: int, metavar: str, minimum: int = 1, maximum: int | None = None, why: str = "") -> None:
    if n < minimum:
        raise ValueError(f"{metavar}: expected at least {minimum} text(s) as arguments or in "
                         f"--file, got {n}")
    if maximum is not None and n > maximum:
        raise ValueError(f"{metavar}: expected at most {maximum} texts{why}, got {n}")


# Valid inside a JSON string, but line breaks to str.splitlines() and JavaScript: escaped, so
# a reader splitting our JSON lines any way gets one object per line.
_LINE_SEPARATORS = {"\x85": "\\u0085", "\u2028": "\\u2028", "\u2029": "\\u2029"}


def json_line(record: dict[str, Any], what: str) -> str:
    """One JSON object per line; NaN or infinity is not JSON, so it is refused, naming `what`."""
    try:
        line = json.dumps(record, ensure_ascii=False, allow_nan=False)
    except ValueError:
        raise ValueError(f"{what}: expected finite numbers, got NaN or infinity (the model's "
                         "weights are not finite: was its training diverging?)") from None
    for char, escaped in _LINE_SEPARATORS.items():
        line = line.replace(char, escaped)
    return line


