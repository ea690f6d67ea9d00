"""One writer per output path: `embed --out x.npy` and `index build --out INDEX` hold a lock.

    with output_lock(Path("x.npy"), "--out"):   # refuses if another process writes x.npy
        ...                                    # write, resume, publish

Like the run lock (tformer.storage.rundir): an OS file lock (flock) on a hidden ``.x.npy.lock``
beside the output, which the kernel releases when the process ends however it ends, so a
killed writer never leaves a stale lock. A second writer gets a one-line error naming the
holder's pid and touches nothing. The lock file is removed on release; a process that
opened it just before is told by the inode check below to open the path again.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import os
import re
import shutil
from collections.abc import Iterator
from pathlib import Path

from tformer.errors import FieldError


def lock_path(out: Path) -> Path:
    return out.with_name(f".{out.name}.lock")


def flock_or_explain(fd: int, option: str, busy: str) -> None:
    """Take an exclusive lock on `fd` without waiting; else close it and raise a FieldError
    naming `option`, saying `busy` with {pid} replaced by the holder's pid (written in the lock
    file)."""
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError as e:
        holder = os.pread(fd, 32, 0).decode(errors="replace").strip() or "unknown"
        os.close(fd)
        if e.errno in (errno.EWOULDBLOCK, errno.EAGAIN, errno.EACCES):
            raise FieldError(option, busy.format(pid=holder)) from None
        raise


@contextlib.contextmanager
def output_lock(out: Path, option: str) -> Iterator[None]:
    """Hold the lock on `out` for the block, or raise ValueError naming who holds it. An `out`
    that names no entry of a folder ("", ".", "..", "/") is refused: an output is built beside
    its name and swapped in by it (the lock's own name raised "PosixPath('.') has an empty name")."""
    if Path(out).name in ("", ".."):
        raise ValueError(f"{option}: expected the name of a file or folder to write, got {str(out)!r}")
    path = lock_path(out)
    while True:
        try:  # (never through a link planted at the lock's name: the truncation below would empty its file)
            fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW, 0o666)
        except OSError as e:  # the folder is missing, read-only or not a filesystem for files
            if path.is_symlink():
                raise FileExistsError(f"{option} {out}: its lock file {path} is a symbolic link; remove "
                                      "it (tformer never writes through one)") from None
            raise OSError(f"{option} {out}: cannot write in {out.parent} ({e.strerror})") from None
        flock_or_explain(fd, f"{option} {out}", "is being written by another tformer process (pid {pid}); "
                                                f"wait for it to finish or choose another {option}")
        try:
            same = os.fstat(fd).st_ino == os.stat(path).st_ino
        except FileNotFoundError:
            same = False
        if same:
            break
        os.close(fd)  # the holder removed this file as it released it: lock the new one
    try:
        os.ftruncate(fd, 0)
        os.pwrite(fd, f"{os.getpid()}\n".encode(), 0)
        yield
    finally:
        path.unlink(missing_ok=True)  # before the unlock: a waiter then sees another inode
        os.close(fd)


def leftovers(directory: Path, name: str) -> list[Path]:
    """The temp files and directories that tformer.storage.files' atomic writers made for `name` in
    `directory` (``.NAME.XXXXXXXX.tmp`` / ``.old``, mkstemp's 8 random characters) and a
    killed writer left behind. Only the holder of the lock on `name` may remove them; the
    exact pattern leaves another name's (``NAME.v2``) alone."""
    pattern = re.compile(rf"\.{re.escape(name)}\.[a-z0-9_]{{8}}\.(tmp|old)")
    return [p for p in directory.glob(f".{glob_escape(name)}.*") if pattern.fullmatch(p.name)]


def remove_leftovers(out: Path) -> None:
    """Remove the ``leftovers`` of earlier writers of `out` that were killed (a hidden temp
    file or folder as large as the output, on each kill): call it holding the lock on `out`."""
    for entry in leftovers(out.parent, out.name):
        if entry.is_dir() and not entry.is_symlink():
            shutil.rmtree(entry, ignore_errors=True)
        else:
            entry.unlink(missing_ok=True)


def glob_escape(name: str) -> str:
    return re.sub(r"([*?[])", r"[\1]", name)
