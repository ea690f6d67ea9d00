"""`tformer eval`: options checked first; its JSON record never holds NaN."""

from __future__ import annotations

import json
import shutil

import pytest
import torch
from cli_helpers import assert_one_line_error, run_cli
from safetensors.torch import load_file, save_file

from tformer.storage.checkpoint import check_run_dir


@pytest.mark.parametrize("option, value, minimum", [
    ("--threads", 0, 1), ("--limit", 0, 1), ("--beam-size", 0, 1), ("--samples", -1, 0),
])
def test_out_of_range_options_are_one_line_errors(classification_run, capsys, option, value,
                                                  minimum):
    rc, out, err = run_cli(capsys, "eval", classification_run, option, value)
    assert_one_line_error(rc, err, "eval", rf"{option}: expected >= {minimum}, got {value}")
    assert out == ""


def test_threads_and_a_valid_json_record(classification_run, capsys):
    rc, out, err = run_cli(capsys, "eval", classification_run, "--threads", 1, "--samples", 0)
    assert rc == 0, err
    assert json.loads(out.splitlines()[-1])["split"] == "test" and torch.get_num_threads() == 1


def test_the_verdict_behind_beats_baseline_is_said(classification_run, capsys):
    """`eval --limit 5` printed beats_baseline: false beside any accuracy, with no word of why
    (5 examples are too few to tell): the verdict line says it, on stderr."""
    rc, out, err = run_cli(capsys, "eval", classification_run, "--limit", 3, "--samples", 0)
    assert rc == 0 and json.loads(out.splitlines()[-1])["beats_baseline"] is None  # unknown, not "no"
    assert err.startswith("tformer eval: warning: the test scored 3 example(s), too few to tell whether "
                          "the model learned")
    # eval's own way to more examples, not training's (--test / --data of train)
    assert err.rstrip().endswith("a larger --limit or --data file") and "--test" not in err


def test_a_non_finite_metric_is_refused_not_printed_as_nan(classification_run, capsys, tmp_path):
    broken = tmp_path / "run"
    shutil.copytree(classification_run, broken)
    for weights in (check_run_dir(broken) / "model.safetensors", broken / "best.safetensors"):
        state = {k: torch.full_like(v, 3e38) if v.is_floating_point() else v  # products overflow
                 for k, v in load_file(str(weights)).items()}
        save_file(state, str(weights))
    rc, out, err = run_cli(capsys, "eval", broken, "--samples", 0)
    assert_one_line_error(rc, err, "eval", r"expected finite numbers, got NaN or infinity")
    assert "NaN" not in out


def test_eval_data_takes_the_canonical_field_names_or_the_runs_columns(capsys, tmp_path):
    """A run trained with --columns evaluates a file written either way; a file with neither
    is refused in one line naming both."""
    from text_fixtures import classification_rows, write

    rows = classification_rows(80)
    theirs = [{"sentence": r["text"], "category": r["label"]} for r in rows]
    data = write(tmp_path / "train.jsonl", theirs)
    run = tmp_path / "run"
    rc, _, err = run_cli(capsys, "train", "--data", data, "--columns", "sentence=text,category=label",
                         "--out", run, "--steps", 2, "--d-model", 16, "--n-heads", 2, "--d-ff", 32,
                         "--n-layers", 1, "--vocab-size", 260, "--max-tokens", 256, "--eval-every", 2,
                         "--threads", 1, "--quiet")
    assert rc == 0, err
    results = []
    for name, records in (("canonical", rows[:20]), ("columns", theirs[:20])):
        path = write(tmp_path / f"{name}.jsonl", records)
        rc, out, err = run_cli(capsys, "eval", run, "--data", path, "--samples", 0)
        assert rc == 0, err
        results.append({k: v for k, v in json.loads(out.splitlines()[-1]).items() if k != "split"})
    assert results[0] == results[1] and results[0]["examples"] == 20
    other = write(tmp_path / "other.jsonl", [{"words": "a cat", "label": "animal"}])
    rc, _, err = run_cli(capsys, "eval", run, "--data", other)
    assert_one_line_error(rc, err, "eval", r"other\.jsonl:1: expected the fields text, label or the run's "
                                           r"--columns 'sentence=text,category=label', got label, words")


@pytest.mark.parametrize("argv, message", [
    (["--split", "validation", "--data", "{data}"],
     r"--split: --data .*train.jsonl is evaluated whole; expected no --split with --data, got validation"),
    (["--beam-size", "4"], r"--beam-size: .* is a classification run, which does not generate \(only seq2seq "
                           r"runs search\); expected no --beam-size, got 4"),
    (["--early-stopping"], r"--early-stopping: a beam search rule; expected --beam-size 2 or more with it, "
                           r"got --beam-size 1 \(greedy\)"),
])
def test_options_that_would_do_nothing_are_refused(classification_run, capsys, argv, message):
    data = classification_run.parent / "train.jsonl"
    rc, out, err = run_cli(capsys, "eval", classification_run, *[a.format(data=data) for a in argv])
    assert_one_line_error(rc, err, "eval", message)
    assert out == ""


def test_the_verdict_names_what_was_scored(classification_run, capsys):
    """`eval --split validation` said "the model learned: test accuracy ..." of the validation split."""
    rc, out, err = run_cli(capsys, "eval", classification_run, "--split", "validation", "--samples", 0)
    assert rc == 0 and json.loads(out.splitlines()[-1])["split"] == "validation"
    assert "validation accuracy" in err and "test accuracy" not in err, err


def test_eval_data_appends_to_metrics_only_holding_the_run_lock(classification_run, capsys, tmp_path,
                                                               monkeypatch):
    """--data appends its result to the run's metrics.jsonl: refused in one line while another
    process holds the run (a training run, a resume, another eval --data), which then writes it
    alone; else it holds the lock while it appends (it appended amid a live run's lines)."""
    import os

    from text_fixtures import classification_rows, write

    import tformer.training.report as report
    from tformer.storage.rundir import RunLock, holder

    run = tmp_path / "run"
    shutil.copytree(classification_run, run)
    data = write(tmp_path / "more.jsonl", classification_rows(20, seed=3))
    before = (run / "metrics.jsonl").read_bytes()
    with RunLock(run):  # as a run training there holds it
        rc, _, err = run_cli(capsys, "eval", run, "--data", data, "--samples", 0)
    assert_one_line_error(rc, err, "eval",
                          rf"RUN_DIR: {run} is in use by another tformer process \(pid {os.getpid()}\); --data "
                          r"appends to its metrics.jsonl, which that process writes: evaluate when it has finished")
    assert (run / "metrics.jsonl").read_bytes() == before
    held = []
    append = report.append_jsonl
    monkeypatch.setattr(report, "append_jsonl", lambda *a: (held.append(holder(run)), append(*a)))
    rc, _, err = run_cli(capsys, "eval", run, "--data", data, "--samples", 0)
    assert rc == 0, err
    assert held == [str(os.getpid())] and holder(run) is None  # held while it appended, then released
    assert json.loads((run / "metrics.jsonl").read_text().splitlines()[-1])["split"] == "eval"


def test_eval_data_with_limit_reads_the_file_no_further_than_its_limit(classification_run, capsys, tmp_path):
    """--limit N scores the first N records and reads no further (it read, checked and held the whole
    file first: a bad line far past the limit failed it)."""
    from text_fixtures import classification_rows, write

    run = tmp_path / "run"
    shutil.copytree(classification_run, run)
    data = write(tmp_path / "more.jsonl", [*classification_rows(20, seed=3), {"text": "x", "label": "neither"}])
    rc, out, err = run_cli(capsys, "eval", run, "--data", data, "--limit", 5, "--samples", 0)
    assert rc == 0, err
    assert json.loads(out.splitlines()[-1])["examples"] == 5
    rc, _, err = run_cli(capsys, "eval", run, "--data", data, "--samples", 0)  # read whole: checked whole
    assert_one_line_error(rc, err, "eval", rf"{data}:21: label 'neither' is not one of the training labels")


def test_eval_data_reads_the_file_a_window_at_a_time_and_scores_it_whole(classification_run, capsys, tmp_path,
                                                                        monkeypatch):
    """--data held the whole file, every prediction and (seq2seq) sacrebleu's caches of them
    all: 840 MB for 10^6 classification records, 1.7 GB for 10^5 seq2seq ones. It checks the
    file whole keeping nothing, then predicts a window of records at a time, never reading
    further ahead; the record covers every line (the baseline's majority too). Each window tells
    a compiled kernel the records after it (kernels.compiling.more_to_come), from the count of
    the check's pass: a kernel is repaid over the whole file, not a window."""
    from text_fixtures import classification_rows, write

    from tformer.nn.kernels.compiling import items_to_come
    from tformer.training import objective as base
    from tformer.training.dataset import TextData

    monkeypatch.setattr(base, "STREAM_WINDOW", 8, raising=False)
    rows = classification_rows(30, seed=3)
    data = write(tmp_path / "more.jsonl", rows)
    passes, ahead, told = [], [], []
    read_file, predict = TextData.read_file, base.Objective.predict

    def counted(self, *args, **kwargs):
        passes.append([0, 0])  # [records read, records predicted] of this pass over the file
        for record in read_file(self, *args, **kwargs):
            passes[-1][0] += 1
            yield record

    def spy(self, model, examples, *args, **kwargs):
        ahead.append(passes[-1][0] - passes[-1][1])
        told.append(items_to_come())
        passes[-1][1] += len(examples)
        return predict(self, model, examples, *args, **kwargs)

    monkeypatch.setattr(TextData, "read_file", counted)
    monkeypatch.setattr(base.Objective, "predict", spy)
    run = tmp_path / "run"
    shutil.copytree(classification_run, run)
    rc, out, err = run_cli(capsys, "eval", run, "--data", data, "--samples", 0)
    assert rc == 0, err
    assert passes == [[30, 0], [30, 30]] and ahead == [8, 8, 8, 6]  # checked, then streamed
    assert told == [22, 14, 6, 0]
    record = json.loads(out.splitlines()[-1])
    labels = [r["label"] for r in rows]
    assert record["examples"] == 30
    assert record["baseline"] == max(labels.count(x) for x in set(labels)) / 30


def _tiny_run(capsys, data, out) -> None:
    rc, _, err = run_cli(capsys, "train", "--data", data, "--out", out, "--steps", 2, "--d-model", 16,
                         "--n-heads", 2, "--d-ff", 32, "--n-layers", 1, "--vocab-size", 260, "--max-tokens",
                         256, "--eval-every", 2, "--threads", 1, "--quiet")
    assert rc == 0, err


def test_eval_finds_the_training_file_from_any_folder_and_refuses_it_changed(capsys, tmp_path, monkeypatch):
    """data.json kept --data as typed, relative to where training ran, and eval did not check
    its digest: from another folder it read that folder's train.jsonl (or found none), and after
    the labels in the file were swapped it scored the swapped test split with no word."""
    from text_fixtures import classification_rows, write

    here, elsewhere = tmp_path / "here", tmp_path / "elsewhere"
    here.mkdir(), elsewhere.mkdir()
    rows = classification_rows(80)
    write(here / "train.jsonl", rows)
    monkeypatch.chdir(here)
    _tiny_run(capsys, "train.jsonl", "run")
    rc, out, err = run_cli(capsys, "eval", "run", "--samples", 0)
    assert rc == 0, err
    expected = json.loads(out.splitlines()[-1])
    flipped = [{**r, "label": "place" if r["label"] == "animal" else "animal"} for r in rows]
    write(elsewhere / "train.jsonl", flipped)  # the same name, other labels, in the folder eval runs from
    monkeypatch.chdir(elsewhere)
    rc, out, err = run_cli(capsys, "eval", here / "run", "--samples", 0)
    assert rc == 0, err
    assert json.loads(out.splitlines()[-1]) == expected  # the file it trained on, found where it was
    write(here / "train.jsonl", flipped)  # the training file itself edited
    for folder in (here, elsewhere):
        monkeypatch.chdir(folder)
        rc, out, err = run_cli(capsys, "eval", here / "run", "--samples", 0)
        assert_one_line_error(rc, err, "eval", rf"data: {here / 'train.jsonl'} changed since the run started "
                                               r"\(then [\d,]+ bytes, blake2b \w+; now [\d,]+ bytes, blake2b "
                                               r"\w+\); .*--data FILE")
        assert out == ""
    (here / "train.jsonl").unlink()
    monkeypatch.chdir(here)
    rc, _, err = run_cli(capsys, "eval", "run", "--samples", 0)
    assert_one_line_error(rc, err, "eval", r"data: train.jsonl: the file the run trained on cannot be read "
                                           r"\(No such file or directory\)")


def test_eval_data_says_how_many_records_the_run_trained_on(classification_run, capsys, tmp_path):
    """`eval RUN --data` on the training file scored 0.94 with no word that the run had trained
    on those records. Each record is matched by the input text the split hashes, so a part of
    the training file counts too; the counts are checked against the split worked out here."""
    import random

    from text_fixtures import classification_rows, write

    from tformer.training.splits import split_of

    run = tmp_path / "run"
    shutil.copytree(classification_run, run)
    data_json = json.loads((run / "data.json").read_text())
    train = classification_run.parent / "train.jsonl"
    rows = [json.loads(line) for line in train.read_text().splitlines()]
    seed = 0
    splits = [split_of(r["text"] + "\t", seed, data_json["split_fraction"]) for r in rows]  # (no text_pair)
    train_texts = {r["text"] for r, s in zip(rows, splits, strict=True) if s == "train"}
    valid_texts = {r["text"] for r, s in zip(rows, splits, strict=True) if s == "validation"} - train_texts
    part = rows[10:40]
    random.Random(1).shuffle(part)
    new = classification_rows(20, seed=7)
    new = [r for r in new if r["text"] not in train_texts | valid_texts]
    for name, records in (("train", rows), ("part", part), ("mixed", part + new), ("new", new)):
        path = train if name == "train" else write(tmp_path / f"{name}.jsonl", records)
        rc, out, err = run_cli(capsys, "eval", run, "--data", path, "--samples", 0)
        assert rc == 0, err
        record = json.loads(out.splitlines()[-1])
        trained = sum(r["text"] in train_texts for r in records)
        validated = sum(r["text"] in valid_texts for r in records)
        assert (record["trained_on"], record["in_validation"]) == (trained, validated), name
        if name == "new":
            assert trained == validated == 0 and "the run trained on" not in err, err
        else:
            assert trained > 0
            assert f"warning: {trained:,} of the {len(records):,} records of {path} " in err, err
    assert 0 < record["examples"] < len(rows)  # (the last: new records only)


def test_eval_data_never_appends_through_a_link_in_the_run(classification_run, capsys, tmp_path):
    """A planted RUN/metrics.jsonl link took eval --data's record into the file it named; refused
    in one line before the scoring, the file untouched."""
    from text_fixtures import classification_rows, write

    run, victim = tmp_path / "run", tmp_path / "victim.txt"
    shutil.copytree(classification_run, run)
    victim.write_text("a user's file\n")
    (run / "metrics.jsonl").unlink()
    (run / "metrics.jsonl").symlink_to(victim)
    data = write(tmp_path / "more.jsonl", classification_rows(20, seed=3))
    rc, out, err = run_cli(capsys, "eval", run, "--data", data, "--samples", 0)
    assert_one_line_error(rc, err, "eval", rf"RUN_DIR: {run}/metrics.jsonl is a symbolic link to {victim}")
    assert out == "" and victim.read_text() == "a user's file\n"
