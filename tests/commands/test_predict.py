"""`tformer predict`: one output row per input line, always; options checked; no NaN in JSON."""

from __future__ import annotations

import errno
import io
import json
import re
import shutil

import pytest
import torch
from cli_helpers import NOT_LINE_BREAKS, assert_one_line_error, run_cli, stdin_bytes
from safetensors.torch import load_file, save_file

from tformer.commands.cli import main
from tformer.storage.checkpoint import check_run_dir


def test_file_lines_split_at_newline_only_one_row_per_line(classification_run, capsys, tmp_path):
    texts = [f"the cat{c}dog" for c in NOT_LINE_BREAKS] + ["river road"]
    f = tmp_path / "t.txt"
    f.write_text("\n".join(texts[:3]) + "\r\n" + "\n".join(texts[3:]) + "\n", encoding="utf-8")
    rc, out, err = run_cli(capsys, "predict", classification_run, "--file", f, "--format", "jsonl")
    assert rc == 0, err
    rows = [json.loads(line) for line in out.splitlines()]
    assert [r["text"] for r in rows] == texts  # one row per line, texts as written


def test_a_tab_separates_a_pair_only_for_a_run_trained_on_pairs(classification_run, capsys, tmp_path):
    from text_fixtures import classification_rows, write

    f = tmp_path / "t.txt"
    f.write_text("the cat\tsat on the mat\nriver road\n", encoding="utf-8")
    rc, out, err = run_cli(capsys, "predict", classification_run, "--file", f, "--format", "jsonl")
    assert rc == 0, err  # a single-text run: the tab is part of the text
    assert [json.loads(line)["text"] for line in out.splitlines()] == ["the cat\tsat on the mat", "river road"]
    pair_run = tmp_path / "pairs"
    data = write(tmp_path / "pairs.jsonl", classification_rows(80, pair=True))
    assert run_cli(capsys, "train", "--data", data, "--out", pair_run, "--steps", "1", "--d-model", "16",
                   "--n-heads", "2", "--d-ff", "32", "--n-layers", "1", "--vocab-size", "260",
                   "--threads", "1", "--quiet")[0] == 0
    from tformer.kinds import load_run

    run = load_run(pair_run)
    assert run.pairs and not load_run(classification_run).pairs
    rc, out, err = run_cli(capsys, "predict", pair_run, "--file", f, "--format", "jsonl")
    assert rc == 0, err
    want = run.predict(["the cat", "river road"], ["sat on the mat", None])
    assert [json.loads(line)["label"] for line in out.splitlines()] == [w["label"] for w in want]


def test_blank_line_is_an_error_naming_file_and_line(classification_run, capsys, tmp_path):
    f = tmp_path / "t.txt"
    f.write_text("the cat\n \nriver\n")
    rc, out, err = run_cli(capsys, "predict", classification_run, "--file", f)
    assert_one_line_error(rc, err, "predict", r"--file .*t\.txt:2: expected a text, got a blank line")
    assert out == ""


def test_stdin_lines_are_read_the_same_way(classification_run, capsys, monkeypatch):
    stdin_bytes(monkeypatch, b"the cat\x0cdog\r\nriver road\n")
    rc, out, err = run_cli(capsys, "predict", classification_run, "--file", "-", "--format", "jsonl")
    assert rc == 0, err
    assert [json.loads(line)["text"] for line in out.splitlines()] == ["the cat\x0cdog", "river road"]


@pytest.mark.parametrize("option, value", [("--batch-size", -1), ("--batch-size", 0),
                                           ("--threads", 0)])
def test_out_of_range_options_are_one_line_errors(classification_run, capsys, option, value):
    rc, out, err = run_cli(capsys, "predict", classification_run, "the cat", option, value)
    assert_one_line_error(rc, err, "predict", rf"{option}: expected >= 1, got {value}")
    assert out == ""


@pytest.mark.parametrize("value", [100_000, 10**20])
def test_more_threads_than_the_machine_can_use_is_one_line(classification_run, capsys, value):
    """Tens of thousands of threads crashed OpenMP's pool (a segfault): refused up front."""
    from tformer.nn.kernels.machine import max_threads

    rc, _, err = run_cli(capsys, "predict", classification_run, "the cat", "--threads", value)
    assert_one_line_error(rc, err, "predict", rf"--threads: expected 1\.\.{max_threads()} .*, got {value}")
    assert run_cli(capsys, "train", "--task", "reverse", "--steps", 1, "--threads", value)[0] == 2
    from tformer.serve.config import ServeConfig

    with pytest.raises(ValueError, match="--threads: expected 1"):
        ServeConfig(model="x", threads=value)


def test_aggregation_strategy_is_refused_for_a_run_that_finds_no_entities(classification_run, capsys):
    """Only a tagger groups entities: a classifier names the flag in one line and prints nothing."""
    from tformer.kinds import load_run

    rc, out, err = run_cli(capsys, "predict", classification_run, "the cat", "--aggregation-strategy", "simple")
    assert_one_line_error(rc, err, "predict", r"^tformer predict: error: --aggregation-strategy: .* is data "
                                              r".*, which finds no entities to group; expected no strategy, "
                                              r"got 'simple'$")
    assert out == ""
    run = load_run(classification_run)
    assert run.read_aggregation(None) is run
    with pytest.raises(ValueError, match=r"^aggregation_strategy: .* which finds no entities to group"):
        run.read_aggregation("first")


def test_threads_sets_torch_threads(classification_run, capsys):
    rc, out, _ = run_cli(capsys, "predict", classification_run, "the cat", "--threads", 1)
    assert rc == 0 and len(out.splitlines()) == 1 and torch.get_num_threads() == 1


def test_non_finite_probabilities_are_refused_not_printed_as_nan(classification_run, capsys,
                                                                 tmp_path):
    broken = tmp_path / "run"
    shutil.copytree(classification_run, broken)
    (broken / "best.safetensors").unlink(missing_ok=True)  # so the checkpoint's weights are loaded
    weights = check_run_dir(broken) / "model.safetensors"
    state = load_file(str(weights))
    # Finite weights (loading refuses NaN ones) whose products overflow: inf - inf = NaN.
    state = {k: torch.full_like(v, 3e38) if v.is_floating_point() else v
             for k, v in state.items()}
    save_file(state, str(weights))
    for fmt in ("jsonl", "text"):
        rc, out, err = run_cli(capsys, "predict", broken, "the cat", "--format", fmt)
        assert_one_line_error(rc, err, "predict", r"expected finite probabilities, got \[nan")
        assert "NaN" not in out and out == ""


def test_inputs_are_read_a_window_at_a_time_not_held_whole(tmp_path):
    """predict and generate read --file a window of batches at a time: memory does not grow
    with its lines (a 1M-line file held 111 MB more than a 10k one)."""
    import argparse
    import tracemalloc

    from tformer.commands._inputs import input_windows
    from tformer.text.batches import SORT_WINDOW

    f = tmp_path / "many.txt"
    f.write_text("".join(f"line number {i} of many\n" for i in range(100_000)))
    args = argparse.Namespace(inputs=["first"], file=str(f))
    tracemalloc.start()
    try:
        seen, starts = 0, []
        for start, texts, after in input_windows(args, "inputs", "TEXT", 32):
            starts.append(start)
            assert texts[0] == ("first" if start == 0 else f"line number {start - 1} of many")
            seen += len(texts)
            assert after == 100_001 - seen  # the inputs still to come (compiled kernels repay over them)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert seen == 100_001 and starts[:2] == [0, 32 * SORT_WINDOW]
    assert peak < 2_000_000, peak  # the whole list alone would be ~7 MB


@pytest.mark.parametrize("command", ["embed", "search"])
def test_a_classification_run_named_as_a_sentence_model_says_which_command_takes_it(
        classification_run, capsys, command):
    """`tformer embed RUN` on a classifier's run said "RUN/config.json: no such file"."""
    extra = ["--corpus", str(classification_run / "data.json")] if command == "search" else []
    rc, _, err = run_cli(capsys, command, classification_run, "a text", *extra)
    assert_one_line_error(rc, err, command, rf"MODEL_DIR: {classification_run} is data .*classification "
                                            rf"into .*, not a sentence embedding model: use `tformer "
                                            rf"predict {classification_run}`")


def test_a_synthetic_task_classifier_predicts_one_label_per_input(task_runs, capsys):
    # ClassificationRun.pairs read the data file's fields, which a task run has none of: a traceback.
    rc, out, err = run_cli(capsys, "predict", task_runs("listops"), "[MAX 1 2 ]", "[MIN 3 4 ]",
                           "--format", "jsonl", "--threads", "1")
    assert rc == 0, err
    rows = [json.loads(line) for line in out.splitlines()]
    assert [r["text"] for r in rows] == ["[MAX 1 2 ]", "[MIN 3 4 ]"]
    assert all(r["label"] in r["probabilities"] for r in rows)


def test_an_input_a_task_classifier_cannot_read_names_its_file_line(task_runs, capsys, tmp_path):
    lines = tmp_path / "in.txt"
    lines.write_text("[MAX 1 2 ]\n[MAX 1 q ]\n")
    rc, _, err = run_cli(capsys, "predict", task_runs("listops"), "--file", lines, "--threads", "1")
    assert_one_line_error(rc, err, "predict", rf"--file {lines}:2: 'q' in '\[MAX 1 q \]' is not in")


class _InterruptedOut(io.StringIO):
    """Standard output on which the k-th write is interrupted (Ctrl-C: KeyboardInterrupt)."""

    def __init__(self, k: int) -> None:
        super().__init__()
        self.k = k

    def write(self, s: str) -> int:
        self.k -= 1
        if self.k == 0:
            raise KeyboardInterrupt
        return super().write(s)


@pytest.mark.parametrize("command", ["predict", "generate"])
def test_ctrl_c_leaves_whole_lines_and_exit_status_130(request, capsys, monkeypatch, command):
    # print() wrote a row and its newline apart: interrupted between, the output ended in half a row.
    run = request.getfixturevalue("seq2seq_run" if command == "generate" else "classification_run")
    for k in range(1, 6):  # 5 rows
        out = _InterruptedOut(k)
        monkeypatch.setattr("sys.stdout", out)
        rc = main([command, str(run), "a", "b", "c", "d", "e", "--threads", "1",
                   *(["--format", "jsonl"] if command == "predict" else [])])
        assert rc == 130
        assert out.getvalue().endswith("\n") or not out.getvalue(), (k, out.getvalue())
        assert f"tformer {command}: interrupted" in capsys.readouterr().err


def test_inputs_longer_than_the_run_reads_are_cut_with_one_warning_naming_them(classification_run, capsys,
                                                                                  tmp_path):
    # A run on your data cut such an input to its maximum length without a word: a label for a
    # text's first few hundred tokens, given as the label for all of it.
    from tformer.kinds import load_run

    limit = load_run(classification_run).tokenizer.max_length
    lines = tmp_path / "in.txt"
    lines.write_text("the cat\n" + "the big dog " * limit + "\nriver road\n" + "a cat " * limit + "\n")
    rc, out, err = run_cli(capsys, "predict", classification_run, "the dog " * limit, "--file", lines,
                           "--batch-size", "1", "--threads", "1")  # windows of 16: one warning for all
    assert rc == 0 and len(out.splitlines()) == 5, err
    assert re.fullmatch(rf"tformer predict: warning: 3 of 5 inputs are longer than the run's maximum length "
                        rf"\({limit} tokens; the longest has \d+\), so they were truncated: TEXT 1, "
                        rf"--file {re.escape(str(lines))}:2, --file {re.escape(str(lines))}:4\n", err), err
    rc, out, err = run_cli(capsys, "predict", classification_run, "the cat", "--threads", "1")
    assert rc == 0 and err == ""


def test_an_input_read_only_to_its_reach_is_named_as_cut(classification_run, capsys, monkeypatch):
    """Under a WordPiece tokenizer a word of 40,000 characters is one [UNK] with no end in sight:
    read only to its reach, its 3 tokens were under the run's maximum length, and predict gave a
    label for its first word alone without a word. (A run's byte-level BPE counts every space,
    so its cut is always in sight: BERT's tokenizer stands in, its ids within the run's vocabulary.)"""
    from hf_bert_fixtures import bert_dir

    import tformer.kinds
    from tformer.text.tokenizer import load_tokenizer

    bert, load = load_tokenizer(bert_dir()), tformer.kinds.load_run

    def with_bert(*args, **kwargs):
        run = load(*args, **kwargs)
        run.objective.source.tokenizer = bert
        return run

    monkeypatch.setattr(tformer.kinds, "load_run", with_bert)
    rc, out, err = run_cli(capsys, "predict", classification_run, "a dog", "a" * 40_000 + " hello world",
                           "--threads", "1")
    assert rc == 0 and len(out.splitlines()) == 2, err
    assert err == ("tformer predict: warning: 1 of 2 inputs were read only to their first 16,384 characters "
                   "(of 40,012 in the longest: tokenizing stops there when no cut to 64 tokens is in sight), "
                   "so they were truncated: TEXT 2\n"), err


class _FullDiskOut(io.StringIO):
    """Standard output redirected to a file on a full disk."""

    def write(self, s: str) -> int:
        raise OSError(errno.ENOSPC, "No space left on device")


@pytest.mark.parametrize("command", ["predict", "generate"])
def test_a_full_disk_under_standard_output_is_named(request, capsys, monkeypatch, command):
    # It said only "No space left on device", naming nothing.
    run = request.getfixturevalue("seq2seq_run" if command == "generate" else "classification_run")
    monkeypatch.setattr("sys.stdout", _FullDiskOut())
    rc = main([command, str(run), "a", "b", "--threads", "1"])
    err = capsys.readouterr().err
    assert rc == 1 and err == f"tformer {command}: error: standard output: No space left on device\n", err
