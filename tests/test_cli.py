"""The CLI's error contract: user mistakes are one line and exit 2; bugs keep their traceback."""

from __future__ import annotations

import pytest

from tformer import cli


def _command_raising(monkeypatch, error):
    parser, commands = cli.build_parser()

    def boom(args):
        raise error

    monkeypatch.setattr(cli, "build_parser", lambda: (parser, commands))
    commands["info"].set_defaults(_run=boom)


@pytest.mark.parametrize("error", [ValueError("x: expected 1, got 2"), FileNotFoundError("nope: no such file")])
def test_user_errors_are_one_line(monkeypatch, capsys, error):
    _command_raising(monkeypatch, error)
    assert cli.main(["info", "whatever.json"]) == 2
    err = capsys.readouterr().err
    assert err == f"tformer info: error: {error}\n"


@pytest.mark.parametrize("error", [TypeError("unsupported operand"), KeyError("step"), AttributeError("x")])
def test_programming_errors_keep_their_traceback(monkeypatch, error):
    _command_raising(monkeypatch, error)
    with pytest.raises(type(error)):
        cli.main(["info", "whatever.json"])
