"""What the command tests share: run `tformer` in-process, check a one-line error, feed stdin."""

from __future__ import annotations

import io
import re

from tformer.commands.cli import main


def run_cli(capsys, *argv):
    """(exit status, stdout, stderr) of `tformer ARGV...` run in this process."""
    rc = main([str(a) for a in argv])
    out, err = capsys.readouterr()
    return rc, out, err


def cli_lines(capsys, argv: list[str]) -> list[str]:
    """The lines `tformer ARGV...` prints (run in this process), which must succeed."""
    capsys.readouterr()
    assert main(argv) == 0
    return capsys.readouterr().out.splitlines()


def assert_one_line_error(rc, err, command, pattern):
    assert rc == 2, err
    assert err.count("\n") == 1 and "Traceback" not in err, err
    assert err.startswith(f"tformer {command}: error: "), err
    assert re.search(pattern, err), err


def stdin_bytes(monkeypatch, data: bytes) -> None:
    """Make standard input read `data` (as a pipe would give it)."""
    monkeypatch.setattr("sys.stdin", io.TextIOWrapper(io.BytesIO(data), encoding="utf-8"))


# Characters str.splitlines() (or, for a lone carriage return, text-mode files) break at that
# are not line ends here: a lone CR, form feed, vertical tab, the file/group/record separators,
# NEL, and the Unicode line and paragraph separators. Lines end at \n (or \r\n) only.
NOT_LINE_BREAKS = ["\r", "\x0c", "\x0b", "\x1c", "\x1d", "\x1e", "\x85", "\u2028", "\u2029"]


def killed_at(k: int, argv, timeout: float = 120.0) -> bool:
    """Run `tformer ARGV` in a forked child that SIGKILLs itself at its k-th durable write
    step (tformer.storage.files.kill_at): a real kill of a real process, without a new interpreter
    and torch import per step. True if the child died of that SIGKILL."""
    import signal

    from tformer.storage import files

    return forked_main(argv, files.kill_at(k), timeout=timeout) == -signal.SIGKILL


def forked_main(argv, hook, stderr=None, timeout: float = 120.0) -> int:
    """Run `tformer ARGV` in a forked child whose durable write steps call `hook` (which may
    signal the process: tformer.storage.files.fault_hook), its stderr to the file `stderr` (else
    nowhere). Its exit status, or -N where signal N ended it."""
    import os
    import signal
    import sys
    import time

    from tformer.storage import files

    pid = os.fork()
    if pid == 0:  # the child: it never returns into pytest
        rc = 1
        try:
            import torch

            torch.set_num_threads(1)  # no thread pool inherited half-made from the parent
            devnull = os.open(os.devnull, os.O_WRONLY)
            os.dup2(devnull, 1)
            os.dup2(os.open(stderr, os.O_WRONLY | os.O_CREAT | os.O_TRUNC) if stderr else devnull, 2)
            sys.stdout, sys.stderr = open(1, "w", closefd=False), open(2, "w", closefd=False)  # not pytest's
            files.fault_hook = hook
            rc = main([str(a) for a in argv])
        finally:
            sys.stderr.flush()
            os._exit(rc)
    deadline = time.monotonic() + timeout
    while True:
        done, status = os.waitpid(pid, os.WNOHANG)
        if done:
            return -os.WTERMSIG(status) if os.WIFSIGNALED(status) else os.WEXITSTATUS(status)
        if time.monotonic() > deadline:
            os.kill(pid, signal.SIGKILL)
            os.waitpid(pid, 0)
            raise AssertionError(f"tformer {argv[0]} did not end in {timeout} s")
        time.sleep(0.02)
