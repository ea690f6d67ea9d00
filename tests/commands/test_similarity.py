"""`tformer similarity`: texts from arguments, --file or standard input; options checked."""

from __future__ import annotations

import numpy as np
from cli_helpers import assert_one_line_error, run_cli, stdin_bytes
from hf_bert_fixtures import SENTENCES, st_dir


def test_file_dash_reads_stdin_one_text_per_line(capsys, monkeypatch):
    stdin_bytes(monkeypatch, b"a dog\x0cthe cat\none two three\n")
    rc, out, err = run_cli(capsys, "similarity", st_dir(), SENTENCES[0], "--file", "-")
    assert rc == 0, err
    lines = out.split("\n")  # the form feed is inside a text: read as one, shown escaped on one line
    assert lines[:3] == [f"[0] {SENTENCES[0]}", "[1] a dog\\x0cthe cat", "[2] one two three"]
    np.testing.assert_allclose([float(v) for v in lines[4].split()[1:]][0], 1.0)


def test_out_of_range_options_are_one_line_errors(capsys):
    rc, _, err = run_cli(capsys, "similarity", st_dir(), "a", "b", "--batch-size", 0)
    assert_one_line_error(rc, err, "similarity", r"--batch-size: expected >= 1, got 0")
    rc, _, err = run_cli(capsys, "similarity", st_dir(), "a", "b", "--threads", 0)
    assert_one_line_error(rc, err, "similarity", r"--threads: expected >= 1, got 0")
