"""tformer.storage.rundir: metrics.jsonl made to agree with the checkpoint a run resumes."""

from __future__ import annotations

import json

import pytest

from tformer.storage.rundir import read_metrics, resume_metrics


def _write(path, records):
    path.write_text("".join(json.dumps(r) + "\n" for r in records))


def test_a_resumed_run_drops_what_followed_its_checkpoint_and_keeps_the_users_eval_lines(tmp_path):
    """`train --resume` rewrote metrics.jsonl from the training records only, and the lines
    `tformer eval --data` had appended (they have no step) were gone."""
    path = tmp_path / "metrics.jsonl"
    train = [{"split": "train", "step": s, "loss": 1.0 / s} for s in (10, 20, 30)]
    test = {"split": "test", "step": 30, "accuracy": 0.9}
    evaluated = {"split": "eval", "data": "mine.jsonl", "accuracy": 0.8}
    _write(path, [*train, test, evaluated])
    assert resume_metrics(path, {"step": 20}, {}) is None  # interrupted at 20: trains on
    kept = [json.loads(line) for line in path.read_text().splitlines()]
    assert kept == [*train[:2], evaluated]
    assert read_metrics(path) == train[:2]  # the training records, each with its step


def test_a_finished_run_resumed_with_the_same_limits_changes_nothing(tmp_path):
    path = tmp_path / "metrics.jsonl"
    records = [{"split": "train", "step": 5, "loss": 0.5}, {"split": "test", "step": 5, "accuracy": 1.0},
               {"split": "eval", "accuracy": 0.7}]
    _write(path, records)
    before = path.read_bytes()
    state = {"step": 5, "stopped_by": "steps"}
    assert resume_metrics(path, state, {"steps": 5}) == records[1]
    assert path.read_bytes() == before


def test_discard_unstarted_leaves_a_run_another_process_trains_in(tmp_path):
    from tformer.storage.rundir import RunLock, discard_unstarted

    run = tmp_path / "run"
    run.mkdir()
    (run / "tokenizer.json").write_text("{}")
    with RunLock(run):  # (its own descriptor: conflicts as another process's lock would)
        discard_unstarted(run)
        assert (run / "tokenizer.json").is_file()
    discard_unstarted(run)  # nobody's: removed
    assert not run.exists()


@pytest.mark.parametrize("files", [
    {"checkpoints/epoch1.pt": "w", "config.json": "{}"},  # a project's own checkpoints/ folder
    {"config.json": "{}", "trainer_state.json": "{}", "pytorch_model.bin": "b"},  # a HF Trainer's
])
def test_out_with_a_checkpoints_folder_or_trainer_state_of_another_tool_is_refused_untouched(tmp_path, files):
    from tformer.storage.rundir import open_run_dir

    for name, text in files.items():
        (tmp_path / name).parent.mkdir(exist_ok=True)
        (tmp_path / name).write_text(text)
    with pytest.raises(ValueError, match="is not empty and not a tformer run directory"):
        open_run_dir(tmp_path, resume=False)
    assert {str(p.relative_to(tmp_path)) for p in tmp_path.rglob("*") if p.is_file()} == set(files)


def test_an_out_that_is_not_utf8_is_refused_before_training(tmp_path):
    """safetensors opens only UTF-8 paths: a run trained to the end, then failed to load its own
    best weights for the test ("not a readable safetensors file")."""
    import os

    from tformer.storage.rundir import check_out

    out = tmp_path / os.fsdecode(b"run\xe9")
    with pytest.raises(ValueError, match=r"^out: expected a path in UTF-8 \(safetensors opens no other\), "
                                         r"got b'.*run\\xe9'$"):
        check_out(out)
    assert not out.exists()


def _victim(tmp_path):
    victim = tmp_path / "victim.txt"
    victim.write_text("a user's file\n")
    return victim


def test_an_append_never_goes_through_a_link_planted_in_a_run(tmp_path):
    """`tformer eval RUN --data F` appended its record through a planted RUN/metrics.jsonl link
    to whatever file it named."""
    from tformer.storage.rundir import append_jsonl

    victim, run = _victim(tmp_path), tmp_path / "run"
    run.mkdir()
    (run / "metrics.jsonl").symlink_to(victim)
    with pytest.raises(ValueError, match=r"run/metrics.jsonl is a symbolic link to .*victim.txt; .*remove "
                                         r"the link$"):
        append_jsonl(run / "metrics.jsonl", {"split": "eval"})
    assert victim.read_text() == "a user's file\n"
    (run / "metrics.jsonl").unlink()
    append_jsonl(run / "metrics.jsonl", {"split": "eval"})  # a file: appended as before
    assert read_metrics(run / "metrics.jsonl") == [] and "eval" in (run / "metrics.jsonl").read_text()


@pytest.mark.parametrize("name", [".tformer-run.lock", "metrics.jsonl", "curves.png", "checkpoints"])
def test_a_run_holding_a_link_is_refused_before_anything_is_written(tmp_path, name):
    """Every write into a run directory refuses a link there: the run lock opened a planted
    .tformer-run.lock link and truncated the file it named to write its pid in it."""
    from tformer.storage.rundir import RunLock, open_run_dir

    victim, run = _victim(tmp_path), tmp_path / "run"
    run.mkdir()
    RunLock(run).release()  # a run directory (its lock file)
    if name == ".tformer-run.lock":
        (run / name).unlink()
    (run / name).symlink_to(victim)
    for resume in (False, True):
        with pytest.raises(ValueError, match=rf"^(out|resume): {run / name} is a symbolic link to "):
            open_run_dir(run, resume=resume)
    assert victim.read_text() == "a user's file\n" and (run / name).is_symlink()


def test_an_output_lock_never_truncates_through_a_link(tmp_path):
    from tformer.storage.locks import lock_path, output_lock

    victim, out = _victim(tmp_path), tmp_path / "x.npy"
    lock_path(out).symlink_to(victim)
    with pytest.raises(FileExistsError, match=r"^--out .*x.npy: its lock file .*\.x\.npy\.lock is a symbolic link"):
        with output_lock(out, "--out"):
            pass
    assert victim.read_text() == "a user's file\n"
