"""SIGTERM (`kill`, `timeout`, a job scheduler) stops every long-running command as Ctrl-C does, in
one line, exit status 143: a real `tformer` process, signalled from outside. (`tformer serve` drains
on SIGTERM instead: tests/serve/test_shutdown.py.)"""

from __future__ import annotations

import os
import re
import select
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from hf_bert_fixtures import bert_dir

SRC = str(Path(__file__).resolve().parents[2] / "src")
TIMEOUT_S = 120  # a start with torch's import on a busy machine is seconds; this bounds a hang


def _tformer(argv: list, code: str | None = None) -> subprocess.Popen:
    """`tformer ARGV` as its script runs it (or `code` run first, in the same interpreter), reading
    standard input from a pipe that the test holds open: a command reading it waits there."""
    script = f"import sys; sys.argv = ['tformer', *{[str(a) for a in argv]!r}]\n{code or ''}\n" \
             "from tformer.commands.cli import main; main()"
    return subprocess.Popen([sys.executable, "-c", script], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, env={**os.environ, "PYTHONPATH": SRC})


def _waits_on_its_input(pid: int) -> bool:
    """Whether the process's main thread waits to read a pipe (/proc/PID/wchan): in the command's
    own work, past the interpreter's start and the imports. Where the kernel hides that, whether it
    has a handler of its own for SIGTERM (its mask of caught signals) instead."""
    proc = Path(f"/proc/{pid}")
    waits = (proc / "wchan").read_text()  # "anon_pipe_read", "pipe_read", ...; "0" where hidden
    if waits not in ("", "0"):
        return "pipe" in waits
    caught = re.search(r"^SigCgt:\s*([0-9a-f]+)$", (proc / "status").read_text(), re.M)
    return bool(int(caught.group(1), 16) >> (signal.SIGTERM - 1) & 1)


def _has_written(proc: subprocess.Popen, text: str, seen: bytearray) -> bool:
    """Whether the process's stderr has said `text` yet (read unbuffered, waiting at most a moment)."""
    if select.select([proc.stderr], [], [], 0.5)[0]:
        seen += os.read(proc.stderr.fileno(), 4096)
    return text in seen.decode(errors="replace")


def _terminated(proc: subprocess.Popen, ready) -> tuple[int, str, str]:
    """Send SIGTERM once `ready(proc)` (polled), then (exit status, stdout, stderr)."""
    deadline = time.monotonic() + TIMEOUT_S
    try:
        while not ready(proc):
            assert proc.poll() is None, f"ended before the signal: {proc.communicate()}"
            assert time.monotonic() < deadline, "never got ready for the signal"
            time.sleep(0.02)
        proc.send_signal(signal.SIGTERM)
        out, err = proc.communicate(timeout=TIMEOUT_S)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate()
    return proc.returncode, out, err


@pytest.mark.parametrize("command", ["embed", "index build", "generate", "predict"])
def test_a_command_reading_its_input_stops_on_sigterm_in_one_line_with_143(tmp_path, task_runs, command):
    """Each of them waits on standard input here when it is signalled; it was the signal's default:
    killed, nothing said, no clean-up."""
    inputs = {"embed": [bert_dir(), "--file", "-", "--out", tmp_path / "x.npy"],
              "index build": [bert_dir(), "--corpus", "-", "--out", tmp_path / "index"],
              "generate": [task_runs("reverse"), "--file", "-"],
              "predict": [task_runs("listops"), "--file", "-"]}[command]
    proc = _tformer([*command.split(), *inputs, "--threads", 1])
    rc, _, err = _terminated(proc, lambda p: _waits_on_its_input(p.pid))
    assert (rc, err) == (143, f"tformer {command.split()[0]}: terminated\n")


BLOCKED_BENCH = """
import time
from tformer.commands.benchmarking import workloads
from tformer.commands.benchmarking.harness import Report, Row
suite = {"first": lambda: Report(rows=[Row("first", "tformer", 1.0)]),
         "second": lambda: time.sleep(600), "third": lambda: 1 / 0}
workloads.suite = lambda settings: suite
"""


def test_bench_stopped_by_sigterm_prints_what_it_measured_and_exits_143(tmp_path):
    """`timeout` stopping a bench: the finished workloads' table and JSON, as after Ctrl-C, then
    the line that says it was terminated, exit status 143 (it said "interrupted", 130: Ctrl-C's)."""
    import json

    out = tmp_path / "bench.json"
    proc = _tformer(["bench", "--quick", "--json", out], BLOCKED_BENCH)
    progress = bytearray()  # "[    0s] first", "[    0s] second" on stderr (then it sleeps)
    rc, stdout, err = _terminated(proc, lambda p: _has_written(p, "] second\n", progress))
    assert rc == 143 and err == "tformer bench: terminated\n", (rc, progress, err)
    assert "| first | tformer |" in stdout and "interrupted during second" in stdout
    assert json.loads(out.read_text())["interrupted"] == "second"
