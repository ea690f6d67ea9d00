"""tformer.commands._inputs: an empty --file is named in the error, for every command that reads
one (it said only "TEXT: expected at least 1 text(s) as arguments or in --file, got 0")."""

import pytest
from cli_helpers import assert_one_line_error, stdin_bytes

from tformer.cli import main


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
