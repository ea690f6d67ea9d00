"""A run directory: who may write in it, and keeping its log consistent with its checkpoint.

    with open_run_dir(Path("runs/r"), resume=False):   # checks, creates, locks
        ...                                             # train, save checkpoints

A run directory is locked while a process trains in it: an OS file lock (flock) on
``RUN/.tformer-run.lock``, which the kernel releases when the process ends however it
ends, so a killed run never leaves a stale lock. The lock file also marks the folder as a
tformer run: ``--out`` refuses any other non-empty directory and touches nothing in it.
"""

from __future__ import annotations

import fcntl
import json
import math
import os
import shutil
from pathlib import Path
from typing import Any

from tformer.errors import FieldError, FieldNotADirectory
from tformer.storage.checkpoint_names import CHECKPOINTS, latest_checkpoint  # (torch-free: the NumPy engine)
from tformer.storage.files import remove_temp_files, write_atomic
from tformer.storage.locks import flock_or_explain

LOCK_FILE = ".tformer-run.lock"
# What a run writes at its top level (a run written before checkpoints were directories
# had the checkpoint files here too).
RUN_FILES = ("metrics.jsonl", "curves.png", "config.json", "model.safetensors",
             "optimizer.safetensors", "trainer_state.json", "train_config.json",
             # data runs (tformer.training): the tokenizer, labels, best weights, reports
             "tokenizer.json", "data.json", "best.safetensors", "confusion.png", "modules.json")


class RunLock:
    """An exclusive flock on a run directory, held until release() or the process ends.

    option, advice: how a refusal names the directory and what it advises (a training run's
    --out; `tformer eval --data`, which appends to its metrics.jsonl, names RUN_DIR)."""

    def __init__(self, run_dir: Path, option: str = "out",
                 advice: str = "wait for it to finish or choose another --out") -> None:
        path = run_dir / LOCK_FILE
        try:  # (never through a link planted there: its truncation below would empty the file it names)
            self.fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW, 0o666)
        except OSError as e:
            if path.is_symlink():
                raise link_in_run(path, option) from None
            raise ValueError(f"{option}: cannot write in {run_dir} ({e.strerror})") from None
        _flock_or_explain(self.fd, run_dir, option, advice)
        os.ftruncate(self.fd, 0)
        os.pwrite(self.fd, f"{os.getpid()}\n".encode(), 0)

    def __enter__(self) -> RunLock:
        return self

    def __exit__(self, *exc: object) -> None:
        self.release()

    def release(self) -> None:
        if self.fd >= 0:
            os.close(self.fd)  # closing the descriptor releases the flock
            self.fd = -1


def link_in_run(path: Path, option: str) -> ValueError:
    """The refusal of a symbolic link where tformer writes in a run directory."""
    try:
        target = f" to {os.readlink(path)}"
    except OSError:
        target = ""
    detail = (f"{path} is a symbolic link{target}; tformer writes a run directory's files itself, never "
              "through a link (it would write the file the link names): remove the link")
    return FieldError(option, detail) if option else ValueError(detail)


def check_no_links(run_dir: Path, option: str) -> None:
    """Refuse a run directory holding a symbolic link at its top or in its checkpoints/ (where
    tformer writes: appending to metrics.jsonl through a link planted there wrote to whatever
    file it named)."""
    for folder in (run_dir, run_dir / CHECKPOINTS):
        try:
            entries = sorted(os.scandir(folder), key=lambda e: e.name)
        except OSError:  # (not there yet)
            continue
        for entry in entries:
            if entry.is_symlink():
                raise link_in_run(Path(entry.path), option)


def _flock_or_explain(fd: int, run_dir: Path, option: str = "out",
                      advice: str = "wait for it to finish or choose another --out") -> None:
    """Take the lock on `fd`, or close it and say who holds it."""
    flock_or_explain(fd, option, f"{run_dir} is in use by another tformer process (pid {{pid}}); {advice}")


def check_unlocked(run_dir: str | Path) -> None:
    """Refuse early (before reading its checkpoint, which the holder may be replacing) a run
    directory another process trains in."""
    path = Path(run_dir) / LOCK_FILE
    try:
        fd = os.open(path, os.O_RDONLY)
    except OSError:
        return  # no lock file: nobody trains there
    _flock_or_explain(fd, Path(run_dir))
    os.close(fd)


def holder(run_dir: str | Path) -> str | None:
    """The pid of the process training in `run_dir` now (as its lock file says), or None."""
    try:
        fd = os.open(Path(run_dir) / LOCK_FILE, os.O_RDONLY)
    except OSError:
        return None  # no lock file: nobody trains there
    try:
        fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)  # (released by the close below)
    except BlockingIOError:
        return os.pread(fd, 32, 0).decode(errors="replace").strip() or "unknown"
    finally:
        os.close(fd)
    return None


def is_run_dir(path: Path) -> bool:
    """True for a directory tformer train wrote (or began to write): its lock file, a published
    checkpoint, or an older run's checkpoint files at its top level. Not for any folder that has
    a `checkpoints/` or a `trainer_state.json` (a project's, a Hugging Face Trainer's): a fresh
    run clears what a run of its own left, and those are the user's files. The one answer to "is
    this a run directory?" (the commands, the kinds' loading, --out, info)."""
    if path.parent.name == CHECKPOINTS and latest_checkpoint(path.parent.parent) is not None:
        return False  # one published checkpoint of a run: the run is its parent's parent
    return ((path / LOCK_FILE).exists() or latest_checkpoint(path) is not None
            or all((path / name).is_file() for name in ("trainer_state.json", "train_config.json")))


def check_out(run_dir: Path) -> None:
    """Refuse an --out that is a file, or a non-empty directory that is not a tformer run, or
    a path that is not UTF-8 (safetensors opens no other: the run would train, then fail to load
    its own best weights for the test)."""
    try:
        str(run_dir).encode("utf-8")
    except UnicodeEncodeError:
        raise FieldError("out", f"expected a path in UTF-8 (safetensors opens no other), got "
                         f"{os.fsencode(run_dir)!r}") from None
    if run_dir.exists() and not run_dir.is_dir():
        raise FieldNotADirectory("out", f"{run_dir} is a file; expected a new, empty or run directory")
    if run_dir.is_dir() and not is_run_dir(run_dir):
        names = sorted(p.name for p in run_dir.iterdir())
        if names:
            shown = ", ".join(names[:3]) + (", ..." if len(names) > 3 else "")
            raise FieldError(
                "out", f"{run_dir} is not empty and not a tformer run directory (holds {shown}); "
                "expected a new or empty directory, so nothing of yours is overwritten"
            )


def open_run_dir(run_dir: Path, resume: bool) -> RunLock:
    """Check, create and lock the run directory; for a fresh run, clear what an earlier
    run that never completed a checkpoint left there. The caller holds the lock."""
    if resume:
        if not is_run_dir(run_dir):
            raise FieldError("resume", f"{run_dir} is not a tformer run directory")
    else:
        check_out(run_dir)
    try:
        run_dir.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        raise FieldError("out", f"cannot create {run_dir} ({e.strerror})") from None
    lock = RunLock(run_dir)
    try:
        check_no_links(run_dir, "resume" if resume else "out")
        if resume:
            if (run_dir / CHECKPOINTS).is_dir():
                remove_temp_files(run_dir / CHECKPOINTS)
        elif latest_checkpoint(run_dir) is not None or (run_dir / "model.safetensors").exists():
            raise FieldError(
                "out", f"{run_dir} already holds a checkpoint; resume it with --resume {run_dir} "
                "or choose another --out"
            )
        else:  # a run whose first save never completed: start it again from nothing
            kept = _results(run_dir)
            if kept:
                raise FieldError(
                    "out", f"{run_dir} holds results of an earlier run ({', '.join(kept)}) but no "
                    "checkpoint to resume; move them away or choose another --out")
            shutil.rmtree(run_dir / CHECKPOINTS, ignore_errors=True)
            for name in RUN_FILES:
                (run_dir / name).unlink(missing_ok=True)
        remove_temp_files(run_dir)
    except BaseException:
        lock.release()
        raise
    return lock


def _results(run_dir: Path) -> list[str]:
    """What a finished run keeps beyond its checkpoints: its test result and what is written
    with it. A run killed before its first checkpoint has none of them (it starts again from
    nothing); a finished one whose checkpoints were removed still has them."""
    names = [n for n in ("curves.png", "confusion.png", "modules.json") if (run_dir / n).exists()]
    if any(r.get("split") in ("test", "eval") for r in _records(run_dir / "metrics.jsonl")):
        names += ["metrics.jsonl"] + [n for n in ("best.safetensors",) if (run_dir / n).exists()]
    return names


def discard_unstarted(run_dir: Path) -> None:
    """Remove a run directory this process created if it holds nothing but what a run writes
    before its first step (the lock, the tokenizer, data.json): a bad data file leaves no
    half-made run behind. Anything else in it, and it stays; so does one another process
    trains in (two runs started together into one new --out: the one refused made it too)."""
    try:
        lock = RunLock(run_dir)
    except ValueError:  # in use, or not there
        return
    with lock:
        if {p.name for p in run_dir.iterdir()} <= {LOCK_FILE, "tokenizer.json", "data.json"}:
            shutil.rmtree(run_dir, ignore_errors=True)


def append_jsonl(path: Path, record: dict[str, Any]) -> None:
    """One JSON line; a number that is not finite is written as null (JSON has no NaN). After a
    line a crash cut short it starts a line of its own (glued to it, it was unreadable: lost).
    Never through a symbolic link (refused, naming it): it would append to the file it names."""
    clean = {k: None if isinstance(v, float) and not math.isfinite(v) else v for k, v in record.items()}
    line = (json.dumps(clean, allow_nan=False) + "\n").encode()
    try:
        fd = os.open(path, os.O_RDWR | os.O_APPEND | os.O_CREAT | os.O_NOFOLLOW, 0o666)
    except OSError:
        if path.is_symlink():
            raise link_in_run(path, "") from None
        raise
    with os.fdopen(fd, "ab+") as f:  # (it appends wherever it reads)
        size = f.seek(0, 2)
        if size:
            f.seek(size - 1)
            if f.read(1) != b"\n":
                line = b"\n" + line
        f.write(line)


def read_metrics(path: Path) -> list[dict[str, Any]]:
    """The training records of a metrics.jsonl (each with its step); a line cut short by a crash
    is skipped."""
    return [r for r in _records(path) if isinstance(r.get("step"), int)]


def _records(path: Path) -> list[dict[str, Any]]:
    """Every record of a metrics.jsonl, `tformer eval`'s (no step) too."""
    if not path.is_file():
        return []
    records = []
    for line in path.read_text().splitlines():
        try:
            record = json.loads(line)
        except json.JSONDecodeError:
            continue
        if isinstance(record, dict):
            records.append(record)
    return records


def resume_metrics(path: Path, state: dict[str, Any], limits: dict[str, Any]) -> dict[str, Any] | None:
    """Make metrics.jsonl agree with the checkpoint being resumed (at ``state["step"]``).

    A run that had finished there (its last checkpoint says what stopped it, and `limits`, the
    resumed run's steps, max_minutes, epochs and patience, raise none of them: ``finished``)
    returns its test record, and nothing is written: metrics.jsonl stays byte for byte. Any other
    drops the lines written after the checkpoint, and its test line (a new one comes at the end);
    the user's `tformer eval` lines stay where they are."""
    step = int(state["step"])
    records = read_metrics(path)
    tests = [r for r in records if r.get("split") == "test" and r["step"] == step]
    if tests and finished(state, limits):
        return tests[-1]
    kept = [r for r in _records(path) if r.get("split") == "eval" or (
        isinstance(r.get("step"), int) and r["step"] <= step and r.get("split") != "test")]
    write_atomic(path, "".join(json.dumps(r) + "\n" for r in kept).encode())
    return None


def finished(state: dict[str, Any], limits: dict[str, Any]) -> bool:
    """Whether a checkpoint's run had ended, whatever ended it, under `limits` (the options of
    the run resuming it): only a larger value of the limit that stopped it trains more."""
    stopped = state.get("stopped_by")
    if stopped is None:  # saved while it trained: interrupted
        return False
    if stopped == "steps":
        return int(limits["steps"]) <= int(state["step"])
    before, now = state.get("limits", {}).get(stopped), limits.get(stopped)
    return before is None or now is None or now <= before  # (early_stop: never raised)


def limits_of(config) -> dict[str, Any]:
    """What may stop a run (a TrainConfig's; its checkpoint keeps them: a resume that raises
    none has nothing to do)."""
    return {"steps": config.steps, "max_minutes": config.max_minutes, "epochs": config.epochs,
            "patience": config.patience}


def to_train_more(state: dict[str, Any]) -> str:
    """How to train a finished run further: a larger value of the limit that stopped it."""
    flag = {"steps": "--steps", "max_minutes": "--max-minutes", "epochs": "--epochs",
            "patience": "--patience"}.get(state["stopped_by"])
    return f"to train more, resume with a larger {flag}" if flag else "it stopped early, at its target"
