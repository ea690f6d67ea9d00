"""What the command tests share: run `tformer` in-process, check a one-line error, feed stdin."""

from __future__ import annotations

import io
import re

from tformer.cli import main


def run_cli(capsys, *argv):
    """(exit status, stdout, stderr) of `tformer ARGV...` run in this process."""
    rc = main([str(a) for a in argv])
    out, err = capsys.readouterr()
    return rc, out, err


def assert_one_line_error(rc, err, command, pattern):
    assert rc == 2, err
    assert err.count("\n") == 1 and "Traceback" not in err, err
    assert err.startswith(f"tformer {command}: error: "), err
    assert re.search(pattern, err), err


def stdin_bytes(monkeypatch, data: bytes) -> None:
    """Make standard input read `data` (as a pipe would give it)."""
    monkeypatch.setattr("sys.stdin", io.TextIOWrapper(io.BytesIO(data), encoding="utf-8"))


# Characters str.splitlines() breaks at that are not line ends in a file: form feed, vertical
# tab, the file/group/record separators, NEL, and the Unicode line and paragraph separators.
NOT_LINE_BREAKS = ["\x0c", "\x0b", "\x1c", "\x1d", "\x1e", "\x85", "\u2028", "\u2029"]
