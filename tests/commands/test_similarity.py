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


def test_long_texts_are_named_as_the_matrix_names_them_and_where_they_came_from(capsys, tmp_path):
    # The warning said "2 of 3 texts are longer ...", not which; --no-truncate said "texts[1]".
    long = " ".join(["cat"] * 100)
    f = tmp_path / "t.txt"
    f.write_text(f"a dog\n{long}\n")
    rc, out, err = run_cli(capsys, "similarity", st_dir(), long, "--file", f)
    assert rc == 0 and out.count("\n") == 3 + 1 + 3, err
    assert err.count("\n") == 1 and err.startswith("tformer similarity: warning: 2 of 3 texts are longer"), err
    assert f"so they were truncated: [0] (TEXT 1), [2] (--file {f}:2)" in err
    rc, _, err = run_cli(capsys, "similarity", st_dir(), "a cat", "--file", f, "--no-truncate")
    assert_one_line_error(rc, err, "similarity", rf"error: --file {f}:2: expected at most \d+ tokens")


def test_a_blank_argument_is_refused_naming_it(capsys):
    # It was embedded ([CLS] [SEP] alone) and given a row, where predict and generate refuse it.
    rc, out, err = run_cli(capsys, "similarity", st_dir(), "a cat", "")
    assert_one_line_error(rc, err, "similarity", r"error: TEXT 2: expected a text, got ''")
    assert out == ""
