"""Checkpoints are one unit: killed (SIGKILL) or out of disk at any write of a save, a run
keeps its previous checkpoint and resumes to weights bit-identical to an uninterrupted run."""

import errno
import json
import os
import random
import signal
import subprocess
import sys
import time

import pytest
import torch
from safetensors.torch import load_file, save_file

from tformer.commands.cli import main
from tformer.kinds import train
from tformer.storage import files
from tformer.storage.checkpoint import check_run_dir, latest_checkpoint
from tformer.storage.rundir import LOCK_FILE, read_metrics
from tformer.training.config import TrainConfig
from tformer.training.resuming import resume_config

TINY = dict(task="reverse", d_model=16, n_heads=2, d_ff=32, n_layers=1, batch_size=8,
            valid_size=8, test_size=8, eval_every=2, log_every=1, threads=1, warmup=4,
            dropout=0.3)  # dropout: the restored RNG matters
QUIET = dict(progress=False, log=lambda *a: None)
SRC = os.path.join(os.path.dirname(__file__), "..", "..", "src")

pytestmark = pytest.mark.usefixtures("one_thread")


@pytest.fixture(autouse=True, scope="module")
def _fast_curves():
    """Drawing curves.png takes most of a tiny run; write a stand-in, atomically as the real one."""
    import tformer.training.loop as train_module

    real = train_module.plot_curves
    train_module.plot_curves = lambda metrics, png, key: files.write_atomic(png, b"png")
    yield
    train_module.plot_curves = real


def _config(**options) -> TrainConfig:
    return TrainConfig.from_flat(options)


def _weights(run_dir):
    return load_file(str(check_run_dir(run_dir) / "model.safetensors"))


def _same_weights(a, b):
    wa, wb = _weights(a), _weights(b)
    return wa.keys() == wb.keys() and all(torch.equal(wa[k], wb[k]) for k in wa)


def _finish(out, steps):
    """What a user does after a crash: resume if there is a checkpoint, else start again."""
    config = _config(steps=steps, out=str(out), **TINY)
    if latest_checkpoint(out) is not None:
        return train(resume_config(out, {}), resume=True, **QUIET)
    return train(config, **QUIET)


def _shape(run_dir):
    return [(r["split"], r["step"]) for r in read_metrics(run_dir / "metrics.jsonl")]


@pytest.fixture(scope="module")
def reference(tmp_path_factory):
    """An uninterrupted 4-step run, and how many durable steps (writes, renames) it made."""
    out = tmp_path_factory.mktemp("ref") / "run"
    count = []
    files.fault_hook = count.append
    try:
        train(_config(steps=4, out=str(out), **TINY), **QUIET)
    finally:
        files.fault_hook = None
    return out, len(count)


def _killed_at(k, out, steps=4):
    """Run training in a forked child that SIGKILLs itself at its k-th durable step."""
    pid = os.fork()
    if pid == 0:  # child
        try:
            files.fault_hook = files.kill_at(k)
            train(_config(steps=steps, out=str(out), **TINY), **QUIET)
        finally:
            os._exit(0)
    _, status = os.waitpid(pid, 0)
    return os.WIFSIGNALED(status) and os.WTERMSIG(status) == signal.SIGKILL


def test_killed_at_every_write_resumes_bit_identical(reference, tmp_path):
    ref, n_writes = reference
    assert n_writes >= 16  # 3 saves (steps 2, 4 and the final one) of 8 steps, and more
    for k in range(1, n_writes + 1):
        out = tmp_path / f"k{k}"
        assert _killed_at(k, out), f"write {k} did not kill the run"
        record = _finish(out, steps=4)
        assert _same_weights(ref, out), f"killed at write {k}: weights differ"
        assert _shape(out) == _shape(ref), f"killed at write {k}: metrics.jsonl differs"
        assert record["step"] == 4
        assert not [p for p in out.rglob("*") if p.name.endswith(".tmp")], k


def test_killed_at_random_moments_resumes_bit_identical(reference, tmp_path):
    ref, _ = reference
    for i in range(5):
        out = tmp_path / f"r{i}"
        pid = os.fork()
        if pid == 0:  # child: train until killed
            try:
                train(_config(steps=4, out=str(out), **TINY), **QUIET)
            finally:
                os._exit(0)
        time.sleep(random.uniform(0.05, 0.6))
        os.kill(pid, signal.SIGKILL)
        os.waitpid(pid, 0)
        _finish(out, steps=4)
        assert _same_weights(ref, out) and _shape(out) == _shape(ref), i


def test_a_process_killed_by_the_env_hook_resumes_from_the_command_line(reference, tmp_path):
    ref, n_writes = reference
    out = tmp_path / "run"
    argv = [sys.executable, "-m", "tformer.commands.cli", "train", "--quiet", "--steps", "4", "--out", str(out)]
    argv += [f"--{k.replace('_', '-')}={v}" for k, v in TINY.items()]
    k = random.randint(9, n_writes - 2)  # after the first save is published
    env = {**os.environ, "PYTHONPATH": SRC, "TFORMER_KILL_AT_WRITE": str(k)}
    proc = subprocess.run(argv, env=env, capture_output=True)
    assert proc.returncode == -signal.SIGKILL, proc.stderr
    assert main(["train", "--resume", str(out), "--quiet"]) == 0
    assert _same_weights(ref, out) and _shape(out) == _shape(ref)


def test_full_disk_during_a_save_keeps_the_previous_checkpoint(tmp_path, capsys):
    out = tmp_path / "run"
    count = []

    def full_disk(what):
        count.append(what)
        if len(count) == 12:  # inside the second save
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC), what.split(" ", 1)[1])

    files.fault_hook = full_disk
    try:
        argv = ["train", "--quiet", "--steps", "4", "--out", str(out)]
        assert main(argv + [f"--{k.replace('_', '-')}={v}" for k, v in TINY.items()]) == 1
    finally:
        files.fault_hook = None
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "No space left on device" in err and "Traceback" not in err
    assert check_run_dir(out).name == "step-000002"
    assert not [p for p in out.rglob("*") if p.name.endswith(".tmp")]
    assert main(["train", "--resume", str(out), "--quiet"]) == 0  # and it resumes


def test_second_run_on_the_same_out_refuses_naming_the_holder(tmp_path, capsys):
    out = tmp_path / "run"
    argv = [sys.executable, "-m", "tformer.commands.cli", "train", "--quiet", "--steps", "100000",
            "--out", str(out), *[f"--{k.replace('_', '-')}={v}" for k, v in TINY.items()]]
    proc = subprocess.Popen(argv, env={**os.environ, "PYTHONPATH": SRC},
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        while latest_checkpoint(out) is None:  # it holds the lock and has saved
            assert proc.poll() is None
            time.sleep(0.01)
        for argv, flag in ((["train", "--out", str(out), "--steps", "4"], "--out"),
                           (["train", "--resume", str(out)], "--resume")):  # the option the user typed
            assert main(argv) == 2
            err = capsys.readouterr().err
            assert err.count("\n") == 1 and f"in use by another tformer process (pid {proc.pid})" in err
            assert err.startswith(f"tformer train: error: {flag}: {out} is in use"), err
    finally:
        proc.kill()
        proc.wait()
    # The kernel released the lock with the process: the run resumes.
    assert main(["train", "--resume", str(out), "--steps", "6", "--quiet"]) == 0


def test_under_torchrun_only_rank_0_probes_the_run_lock_on_resume(tmp_path, monkeypatch):
    """Rank 0 takes the run's lock; another rank probing it (as each did) was refused as "in use
    by another process" when it met its own rank 0's lock: one torchrun resume in a few failed."""
    from tformer.storage.rundir import RunLock
    from tformer.training import resume_config

    out = tmp_path / "run"
    assert main(["train", "--quiet", "--steps", "2", "--out", str(out),
                 *[f"--{k.replace('_', '-')}={v}" for k, v in TINY.items()]]) == 0
    lock = RunLock(out)  # rank 0 of the same launch, already training
    try:
        monkeypatch.setenv("RANK", "1")
        assert resume_config(out, {}, {"steps": 4}).steps == 4
        monkeypatch.setenv("RANK", "0")
        with pytest.raises(ValueError, match="in use by another tformer process"):
            resume_config(out, {}, {"steps": 4})
    finally:
        lock.release()


def test_out_with_user_files_is_refused_untouched(tmp_path, capsys):
    out = tmp_path / "mine"
    out.mkdir()
    for name in ("config.json", "metrics.jsonl", "curves.png", "notes.txt"):
        (out / name).write_text(f"my {name}")
    before = {p.name: (p.read_text(), p.stat().st_mtime_ns) for p in out.iterdir()}
    assert main(["train", "--out", str(out), "--steps", "2"]) == 2
    err = capsys.readouterr().err
    assert "not empty and not a tformer run directory" in err and err.count("\n") == 1
    assert {p.name: (p.read_text(), p.stat().st_mtime_ns) for p in out.iterdir()} == before


def test_out_that_is_a_file_is_one_line(tmp_path, capsys):
    out = tmp_path / "out"
    out.write_text("a file")
    assert main(["train", "--out", str(out), "--steps", "2", "--quiet"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "is a file" in err and out.read_text() == "a file"


def test_read_only_out_is_one_line(tmp_path, capsys, monkeypatch):
    import tformer.storage.rundir

    real = os.open

    def read_only(path, *a, **k):  # as a read-only folder answers (also for root)
        if str(path).endswith(LOCK_FILE):
            raise PermissionError(errno.EROFS, os.strerror(errno.EROFS), str(path))
        return real(path, *a, **k)

    monkeypatch.setattr(tformer.storage.rundir.os, "open", read_only)
    (tmp_path / "out").mkdir()
    assert main(["train", "--out", str(tmp_path / "out"), "--steps", "2", "--quiet"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "cannot write in" in err and "Read-only" in err


def test_read_only_parent_is_one_line(tmp_path, capsys, monkeypatch):
    from pathlib import Path

    def refuse(self, *a, **k):
        raise PermissionError(errno.EROFS, os.strerror(errno.EROFS), str(self))

    monkeypatch.setattr(Path, "mkdir", refuse)
    assert main(["train", "--out", str(tmp_path / "new"), "--steps", "2", "--quiet"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "cannot create" in err and "Read-only" in err


def test_invalid_model_config_leaves_no_out_folder(tmp_path, capsys):
    out = tmp_path / "never"
    assert main(["train", "--out", str(out), "--d-model", "30", "--n-heads", "4"]) == 2
    assert "--d-model: expected a multiple of n_heads" in capsys.readouterr().err
    assert not out.exists()


def test_first_save_interrupted_restarts_with_plain_train(tmp_path):
    out = tmp_path / "run"
    assert _killed_at(3, out)  # inside the first save: nothing published
    with pytest.raises(ValueError, match="has no complete checkpoint"):
        resume_config(out, {})
    train(_config(steps=2, out=str(out), **TINY), **QUIET)
    assert check_run_dir(out).name.startswith("step-000002")


def test_keep_prunes_old_checkpoints(tmp_path):
    train(_config(steps=6, out=str(tmp_path), keep=2, **TINY), **QUIET)
    names = sorted(p.name for p in (tmp_path / "checkpoints").iterdir())
    assert names == ["latest", "step-000006", "step-000006.1"]


def test_resuming_a_finished_run_adds_no_second_test_line(tmp_path):
    first = train(_config(steps=2, out=str(tmp_path), **TINY), **QUIET)
    again = train(resume_config(tmp_path, {}), resume=True, **QUIET)
    assert again == first
    assert [s for s, _ in _shape(tmp_path)].count("test") == 1
    train(resume_config(tmp_path, {"steps": 4}), resume=True, **QUIET)  # continued: one test line
    assert [r for r in _shape(tmp_path) if r[0] == "test"] == [("test", 4)]


def test_resume_drops_metrics_written_after_the_checkpoint(tmp_path):
    train(_config(steps=2, out=str(tmp_path), **TINY), **QUIET)
    with (tmp_path / "metrics.jsonl").open("a") as f:
        f.write(json.dumps({"split": "train", "step": 3, "loss": 1.0}) + "\n" + '{"split": "tr')
    train(resume_config(tmp_path, {"steps": 4}), resume=True, **QUIET)
    assert [s for s in _shape(tmp_path) if s[0] == "train"] == [("train", i) for i in (1, 2, 3, 4)]


def test_files_follow_the_umask(tmp_path):
    old = os.umask(0o022)
    try:
        train(_config(steps=2, out=str(tmp_path / "run"), **TINY), **QUIET)
    finally:
        os.umask(old)
    ckpt = check_run_dir(tmp_path / "run")
    for path in [*ckpt.iterdir(), tmp_path / "run" / "curves.png"]:
        assert path.stat().st_mode & 0o777 == 0o644, path
    assert ckpt.stat().st_mode & 0o777 == 0o755


def test_non_finite_hyperparameters_are_refused(capsys):
    for option in ("--lr", "--weight-decay", "--max-minutes", "--clip-grad"):
        assert main(["train", option, "inf", "--steps", "2"]) == 2
        assert "expected a finite number, got inf" in capsys.readouterr().err
    assert main(["train", "--lr", "nan"]) == 2


def test_non_finite_loss_stops_keeping_the_last_good_checkpoint(tmp_path, monkeypatch, capsys):
    import tformer.training.loop as train_module

    real, calls = train_module.train_step, []

    def nan_at_step_3(*args, **kwargs):
        loss, *rest = real(*args, **kwargs)
        calls.append(1)
        return (float("nan") if len(calls) == 3 else loss), *rest

    monkeypatch.setattr(train_module, "train_step", nan_at_step_3)
    out = tmp_path / "run"
    argv = ["train", "--out", str(out), "--steps", "6", "--quiet"]
    assert main(argv + [f"--{k.replace('_', '-')}={v}" for k, v in TINY.items()]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "loss: expected a finite number, got nan at step" in err
    assert check_run_dir(out).name == "step-000002"  # the last good one, kept
    assert all(torch.isfinite(v).all() for v in _weights(out).values())


def test_checkpoint_with_nan_weights_is_refused(tmp_path, capsys):
    train(_config(steps=2, out=str(tmp_path), **TINY), **QUIET)
    for path in (check_run_dir(tmp_path) / "model.safetensors", tmp_path / "best.safetensors"):
        weights = load_file(str(path))  # (eval loads the best validated weights)
        key = next(iter(weights))
        weights[key][0] = float("nan")
        save_file(weights, str(path), metadata={"step": "2"})
    assert main(["eval", str(tmp_path)]) == 2
    err = capsys.readouterr().err
    assert "NaN or infinite" in err and key in err and err.count("\n") == 1


@pytest.mark.parametrize("corrupt, message", [
    ("optimizer.safetensors", "optimizer.safetensors: not a readable safetensors file"),
    ("trainer_state.json", "trainer_state.json is not valid JSON"),
    ("no-step", "trainer_state.json: expected an object with an integer 'step'"),
])
def test_corrupt_checkpoint_files_are_one_line_on_resume(tmp_path, capsys, corrupt, message):
    train(_config(steps=2, out=str(tmp_path), **TINY), **QUIET)
    ckpt = check_run_dir(tmp_path)
    if corrupt == "no-step":
        (ckpt / "trainer_state.json").write_text('{"wall_seconds": 1.0}')
    else:
        (ckpt / corrupt).write_bytes(b"\x00garbage")
    assert main(["train", "--resume", str(tmp_path), "--steps", "4", "--quiet"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and message in err and "Traceback" not in err


def test_lock_file_marks_the_run(tmp_path):
    train(_config(steps=2, out=str(tmp_path / "run"), **TINY), **QUIET)
    assert (tmp_path / "run" / LOCK_FILE).is_file()


def test_model_too_large_is_refused_before_allocating(tmp_path, capsys):
    out = tmp_path / "never"
    assert main(["train", "--out", str(out), "--d-model", "100000000", "--n-heads", "4"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "model: " in err and "GiB" in err and "available" in err
    assert not out.exists()


def test_a_run_stopped_before_its_first_checkpoint_says_so_on_resume(tmp_path):
    """Ctrl-C before the first save left the run's own files (data.json, metrics.jsonl) and no
    checkpoints folder: --resume said "not a checkpoint ... expected a directory written by
    `tformer train`", which it was."""
    out = tmp_path / "run"
    out.mkdir()
    (out / "data.json").write_text("{}")
    with pytest.raises(ValueError, match=r"is a run stopped before its first checkpoint: nothing to load or "
                                         r"resume; start it again with `tformer train --out "):
        check_run_dir(out)


def test_a_run_training_towards_its_first_checkpoint_is_not_called_stopped(tmp_path):
    """eval/predict on a run that trains now, before its first save, said it "is a run stopped
    before its first checkpoint ... start it again with `tformer train --out`", which the lock
    then refuses: it says that it trains, and its pid."""
    from tformer.storage.rundir import RunLock

    out = tmp_path / "run"
    out.mkdir()
    (out / "data.json").write_text("{}")
    with RunLock(out):  # (held by this process: another's check names it as a trainer's)
        child = subprocess.run([sys.executable, "-c", "import sys; from tformer.storage.checkpoint import "
                                "check_run_dir; check_run_dir(sys.argv[1])", str(out)],
                               capture_output=True, text=True)
        with pytest.raises(ValueError, match="is a run stopped before its first checkpoint"):
            check_run_dir(out)  # its own lock: not another trainer
    assert f"RUN_DIR: {out} is training now (pid {os.getpid()}) and has no checkpoint yet" in child.stderr
    with pytest.raises(ValueError, match="is a run stopped before its first checkpoint"):
        check_run_dir(out)  # released: stopped


def test_a_step_saved_again_after_its_first_was_pruned_takes_the_next_name_and_keeps_one(
        tmp_path, tiny_config):
    """(A resume at the step a run ended on saves that step once more.) The name of a pruned
    checkpoint was taken again, ordered before the one kept: --keep 1 kept two."""
    from tformer.nn.model import Encoder
    from tformer.storage.checkpoint import save_checkpoint

    model = Encoder(tiny_config)
    optimizer = torch.optim.AdamW(model.parameters())
    for _ in range(3):
        save_checkpoint(tmp_path, model, optimizer, _config(**TINY), {"step": 2}, keep=1)
    names = sorted(p.name for p in (tmp_path / "checkpoints").iterdir())
    assert names == ["latest", "step-000002.2"]
    assert latest_checkpoint(tmp_path).name == "step-000002.2"


def test_a_damaged_latest_pointer_is_read_as_a_missing_one(tmp_path):
    (tmp_path / "checkpoints" / "step-000002").mkdir(parents=True)
    (tmp_path / "checkpoints" / "latest").write_bytes(b"\xff\xfe\x00bad")  # was a UnicodeDecodeError
    assert latest_checkpoint(tmp_path).name == "step-000002"


def test_read_latest_reads_again_only_while_a_newer_checkpoint_appears_and_a_bounded_number_of_times(tmp_path):
    import shutil

    from tformer.storage.checkpoint_names import READ_TRIES, read_latest

    root = tmp_path / "checkpoints"
    (root / "step-000001").mkdir(parents=True)
    calls = []

    def damaged(saved):  # the newest checkpoint itself is unreadable: no race, one read, its error
        calls.append(saved.name)
        raise ValueError(f"{saved}: not valid JSON")

    with pytest.raises(ValueError, match="step-000001: not valid JSON"):
        read_latest(tmp_path, damaged)
    assert calls == ["step-000001"]

    def pruned_every_time(saved):  # a newer one is published during every read: it gives up
        calls.append(saved.name)
        step = int(saved.name.split("-")[1])
        (root / f"step-{step + 1:06d}").mkdir()
        shutil.rmtree(saved)
        raise FileNotFoundError(f"{saved}/config.json")

    calls.clear()
    with pytest.raises(FileNotFoundError, match=f"step-{READ_TRIES:06d}/config.json"):
        read_latest(tmp_path, pruned_every_time)
    assert calls == [f"step-{k:06d}" for k in range(1, READ_TRIES + 1)]
