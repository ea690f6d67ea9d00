"""`tformer generate`: one output line per input line, always; options checked first."""

from __future__ import annotations

import pytest
from cli_helpers import NOT_LINE_BREAKS, assert_one_line_error, run_cli, stdin_bytes


def test_file_lines_split_at_newline_only_one_output_per_line(seq2seq_run, capsys, tmp_path):
    texts = [f"the cat{c}dog" for c in NOT_LINE_BREAKS] + ["river road"]
    f = tmp_path / "in.txt"
    f.write_text("\r\n".join(texts) + "\r\n", encoding="utf-8")
    rc, out, err = run_cli(capsys, "generate", seq2seq_run, "--file", f, "--batch-size", 4, "--max-len", 3)
    assert rc == 0, err
    assert len(out.split("\n")) == len(texts) + 1 and out.endswith("\n")  # one output per line


def test_stdin_and_arguments_one_output_each(seq2seq_run, capsys, monkeypatch):
    stdin_bytes(monkeypatch, "river\u2028road\nthe cat".encode())  # no final newline
    rc, out, err = run_cli(capsys, "generate", seq2seq_run, "a dog", "--file", "-", "--max-len", 3)
    assert rc == 0, err
    assert len(out.split("\n")) == 4 and out.endswith("\n")


def test_a_classification_run_is_refused_pointing_to_predict(classification_run, task_runs, capsys):
    """generate printed a classifier's label (and a listops run's); embed refuses such a run,
    pointing to predict, which prints the label with its probability: generate does too."""
    for run in (classification_run, task_runs("listops")):
        text = "the cat" if run == classification_run else "[MAX 2 9 ]"
        rc, out, err = run_cli(capsys, "generate", run, text)
        assert_one_line_error(rc, err, "generate", rf"RUN_DIR: {run} is .*classification.*: use `tformer "
                                                   rf"predict {run}`")
        assert out == ""
        assert run_cli(capsys, "predict", run, text)[0] == 0


def test_blank_line_is_an_error_naming_file_and_line(seq2seq_run, capsys, tmp_path):
    f = tmp_path / "in.txt"
    f.write_text("the cat\n\n")
    rc, out, err = run_cli(capsys, "generate", seq2seq_run, "--file", f)
    assert_one_line_error(rc, err, "generate", r"in\.txt:2: expected a text, got a blank line")


@pytest.mark.parametrize("option, value, expected", [
    ("--batch-size", -1, ">= 1"), ("--batch-size", 0, ">= 1"), ("--beam-size", 0, ">= 1"),
    ("--max-len", 0, ">= 1"), ("--threads", -2, ">= 1"),
    ("--length-penalty", "nan", "a finite number"),
])
def test_out_of_range_options_are_one_line_errors(seq2seq_run, capsys, option, value, expected):
    rc, out, err = run_cli(capsys, "generate", seq2seq_run, "the cat", option, value)
    assert_one_line_error(rc, err, "generate", rf"{option}: expected {expected}, got {value}")
    assert out == ""


@pytest.mark.parametrize("others, given, threads", [(0.0, None, 2), (2.0, None, 1), (2.0, 2, 2)])
def test_threads_default_to_the_cores_other_processes_leave_free(monkeypatch, others, given, threads):
    """With two busy processes on 2 cores, one thread decoded 1.2-2x faster than two; --threads wins."""
    import argparse

    import torch

    from tformer.commands import _inputs

    monkeypatch.setattr(_inputs, "others_running", lambda *a: others)
    monkeypatch.setattr(torch, "get_num_threads", lambda: 2)
    chosen = []
    monkeypatch.setattr(torch, "set_num_threads", chosen.append)
    _inputs.check_options(argparse.Namespace(threads=given))
    assert chosen == [threads]


def test_an_input_the_model_cannot_read_is_named_by_its_argument_or_file_line(task_runs, capsys, tmp_path):
    # The error said "input: 'x' in '...'" and printed the whole line: in a long file, no way to find it.
    run = task_runs("reverse")
    lines = tmp_path / "in.txt"
    lines.write_text("1 2\n3 4\n" + "7 " * 5000 + "\n")
    rc, _, err = run_cli(capsys, "generate", run, "1 2", "--file", lines, "--threads", "1")
    assert_one_line_error(rc, err, "generate", rf"--file {lines}:3: expected at most \d+ tokens with "
                                               r"specials \(this model's length\), got 5001 in '7 7 7")
    assert len(err) < 300, err
    rc, _, err = run_cli(capsys, "generate", run, "1 2", "3 x", "--threads", "1")
    assert_one_line_error(rc, err, "generate", r"^tformer generate: error: INPUT 2: 'x' in '3 x' is not in "
                                               r"the vocabulary")
    lines.write_text("1 2\n" * 600 + "1 y 2\n")  # past the first window of inputs (512)
    rc, out, err = run_cli(capsys, "generate", run, "--file", lines, "--threads", "1", "--batch-size", "8")
    assert_one_line_error(rc, err, "generate", rf"--file {lines}:601: 'y' in '1 y 2' is not in")
    assert len(out.splitlines()) % 128 == 0  # whole windows before it, each line whole


def test_stdin_input_errors_name_standard_input_and_line(task_runs, capsys, monkeypatch):
    stdin_bytes(monkeypatch, b"1 2\n1 z\n")
    rc, _, err = run_cli(capsys, "generate", task_runs("reverse"), "--file", "-", "--threads", "1")
    assert_one_line_error(rc, err, "generate", r"--file standard input:2: 'z' in '1 z' is not in")


@pytest.mark.parametrize("command,metavar", [("generate", "INPUT"), ("predict", "TEXT")])
def test_a_blank_argument_is_named_as_the_argument(classification_run, capsys, command, metavar):
    # It said "texts[0]: expected a non-empty text" (the library's list, not the command line).
    rc, _, err = run_cli(capsys, command, classification_run, "a cat", " ", "--threads", "1")
    assert_one_line_error(rc, err, command, rf"error: {metavar} 2: expected a text, got ' '")


def test_early_stopping_reaches_the_beam_search_and_is_refused_with_greedy(seq2seq_run, capsys, monkeypatch):
    """`--early-stopping` (the peers' rule, beam_search's early_stopping) was the Python API's only:
    the command now passes it to every batch's search, and refuses it where no beam searches."""
    from tformer.kinds import seq2seq

    seen = []
    search = seq2seq.generate

    def spy(*args, **kwargs):
        seen.append((kwargs["beam_size"], kwargs["early_stopping"]))
        return search(*args, **kwargs)

    monkeypatch.setattr(seq2seq, "generate", spy)
    outputs = {}
    for flags in ([], ["--early-stopping"]):
        seen.clear()
        rc, out, err = run_cli(capsys, "generate", seq2seq_run, "the cat", "a dog", "--beam-size", 3,
                               "--max-len", 4, *flags)
        assert rc == 0, err
        assert seen and set(seen) == {(3, bool(flags))}
        outputs[bool(flags)] = out
    assert len(outputs[True].split("\n")) == 3  # one line per input, as without the option
    rc, out, err = run_cli(capsys, "generate", seq2seq_run, "the cat", "--early-stopping")
    assert_one_line_error(rc, err, "generate", r"--early-stopping: a beam search rule; expected --beam-size 2 "
                                               r"or more with it, got --beam-size 1 \(greedy\)")
    assert out == ""
