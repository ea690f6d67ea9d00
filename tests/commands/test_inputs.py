"""tformer.commands._inputs: an empty --file is named in the error, for every command that reads
one (it said only "TEXT: expected at least 1 text(s) as arguments or in --file, got 0")."""

import pytest
from cli_helpers import assert_one_line_error, stdin_bytes

from tformer.commands.cli import main


@pytest.mark.parametrize("command", ["predict", "generate"])
def test_an_empty_file_is_named(classification_run, capsys, tmp_path, command):
    empty = tmp_path / "empty.txt"
    empty.write_bytes(b"")
    rc = main([command, str(classification_run), "--file", str(empty)])
    assert_one_line_error(rc, capsys.readouterr().err, command,
                          rf"--file {empty}: expected at least one line of text, got an empty file$")


def test_empty_standard_input_is_named(classification_run, capsys, monkeypatch):
    stdin_bytes(monkeypatch, b"")
    rc = main(["predict", str(classification_run), "--file", "-"])
    assert_one_line_error(rc, capsys.readouterr().err, "predict",
                          r"--file standard input: expected at least one line of text, got an empty file$")


def test_an_empty_file_beside_arguments_is_no_error(classification_run, capsys, tmp_path):
    empty = tmp_path / "empty.txt"
    empty.write_bytes(b"")
    assert main(["predict", str(classification_run), "a cat", "--file", str(empty)]) == 0
    assert len(capsys.readouterr().out.splitlines()) == 1


def test_truncations_keep_a_few_places_however_many_inputs_are_cut(capsys):
    """predict and generate noted every cut input (its index and token count) until the warning at
    the end: memory grew with the file's long lines. They keep the first few places, the count
    and the longest; the warning says the same."""
    import argparse

    from tformer.commands._inputs import Truncations

    args = argparse.Namespace(command="predict", inputs=["a long one"], file="f.txt")
    cut = Truncations(args, "inputs", "TEXT", 64)
    for start in range(0, 3000, 1000):  # three windows of 1000 inputs, every one cut
        cut.note(start, [(i, 70 + (start + i) % 5) for i in range(1000)])

    def held(obj) -> int:
        """The items of the lists an object keeps, and its parts keep (not the arguments)."""
        parts = [v for v in vars(obj).values() if v is not args]
        return sum(len(v) if isinstance(v, list) else held(v) for v in parts if isinstance(v, list)
                   or hasattr(v, "__dict__"))

    assert held(cut) <= 5
    cut.warn(3000)
    assert capsys.readouterr().err == (
        "tformer predict: warning: 3000 of 3000 inputs are longer than the run's maximum length (64 tokens; "
        "the longest has 74), so they were truncated: TEXT 1, --file f.txt:1, --file f.txt:2, --file f.txt:3, "
        "--file f.txt:4, ...\n")


@pytest.mark.parametrize("command", ["predict", "generate"])
def test_an_argument_that_is_not_utf8_is_named_as_a_bad_line_is(classification_run, capsys, command):
    """An argument's non-UTF-8 byte reaches Python as a lone surrogate (PEP 383): the tokenizer
    raised a TypeError with a traceback."""
    import os

    text = os.fsdecode(b"caf\xe9")  # what sys.argv holds for the bytes c a f 0xe9
    rc = main([command, str(classification_run), "fine", text])
    assert_one_line_error(rc, capsys.readouterr().err, command,
                          r"(TEXT|INPUT) 2: expected UTF-8 text, got byte 0xe9 at column 4$")
