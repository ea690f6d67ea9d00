"""Atomic writes: a crash or a full disk leaves the old file (or directory) or the new one,
never half of one, never a mix of two.

    write_atomic(path, data)          one file: temp file + fsync + rename
    write_new_dir(path, files)        a directory that does not exist yet, published by one rename
    write_dir_atomic(path, files)     a directory, replacing any previous one by one atomic swap

Files get the permissions any other program's output gets (0666 minus the umask), not
mkstemp's 0600, so a run directory or an exported model can be shared.

Every durable step (a file written, a rename) first calls ``durable_step``; the crash tests
hook it to kill the process, or to fail as a full disk would, at the k-th step.
Torch-free, so the config (and the NumPy reference) can use it.
"""

from __future__ import annotations

import contextlib
import ctypes
import errno
import json
import os
import shutil
import signal
import tempfile
import time
from collections.abc import Callable, Iterator, Mapping
from pathlib import Path
from typing import Any

# Fault injection for the crash tests (None in normal use): called with a description
# before every durable step. TFORMER_KILL_AT_WRITE=k makes the process SIGKILL itself at
# the k-th step, so a real `tformer train` can be killed at an exact point of a save.
fault_hook: Callable[[str], None] | None = None


def kill_at(k: int) -> Callable[[str], None]:
    """A fault hook that SIGKILLs this process at its k-th durable step (1-based)."""
    count = 0

    def hook(what: str) -> None:
        nonlocal count
        count += 1
        if count == k:
            os.kill(os.getpid(), signal.SIGKILL)

    return hook


if os.environ.get("TFORMER_KILL_AT_WRITE"):
    fault_hook = kill_at(int(os.environ["TFORMER_KILL_AT_WRITE"]))


@contextlib.contextmanager
def uncounted() -> Iterator[None]:
    """Writes that are not among the durable steps the crash tests count (a cache: losing it
    costs a measurement, never a user's file), so a kill at step k stays at the same step."""
    global fault_hook
    saved, fault_hook = fault_hook, None
    try:
        yield
    finally:
        fault_hook = saved


# A disk (or the user's quota) that is full: what a save that failed on it should say how to get over.
FULL_DISK = (errno.ENOSPC, errno.EDQUOT)

# The write the process began last ("write PATH", "rename PATH"): a full disk's OSError from a
# plain file write names no file; the command line names this one instead.
last_step: str | None = None


def durable_step(what: str) -> None:
    global last_step
    last_step = what
    if fault_hook is not None:
        fault_hook(what)


def _umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask


def file_mode() -> int:
    """0666 minus the process umask: what open() would give a new file."""
    return 0o666 & ~_umask()


def dir_mode() -> int:
    """0777 minus the process umask: what mkdir would give a new directory."""
    return 0o777 & ~_umask()


def fsync_dir(path: str | Path) -> None:
    """Make a rename or a new entry in `path` durable."""
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def write_atomic(path: str | Path, data: bytes) -> None:
    """Write to a temp file in the same directory, fsync, then rename over `path`."""
    durable_step(f"write {path}")
    with replaced_on_success(path) as tmp:
        tmp.write_bytes(data)


def refuse_foreign(path: Path, option: str, ours: Callable[[Path], bool], what: str) -> None:
    """A file the user names as an output is replaced only when tformer wrote it (``ours``, e.g.
    its marker inside); anything else there is refused in one line, never overwritten."""
    if path.exists() and not (path.is_file() and ours(path)):
        raise FileExistsError(f"{option} {path}: exists and is not {what}; pick another name, or move "
                              "it away first")


def json_bytes(obj: Any) -> bytes:
    return (json.dumps(obj, indent=2) + "\n").encode()


def check_file_name(out: str | os.PathLike, option: str, expected: str) -> None:
    """An output that is one file, named as the user wrote it: a name ending in a separator
    ("out/") names a folder, which pathlib forgets (Path("out/") == Path("out")), so
    `export MODEL_DIR --onnx out/` wrote a file `out` and said "wrote out/"."""
    name = os.fspath(out)
    if not name:  # Path("") is ".", the current folder
        raise ValueError(f"{option}: expected {expected}, got ''")
    if name.endswith(tuple(filter(None, (os.sep, os.altsep)))):
        raise IsADirectoryError(f"{option}: expected {expected}, got the folder name {name!r}")


def replaced_path(out: str | Path, option: str | None = None) -> Path:
    """The path an output written to ``out`` replaces: the file or folder a link there names, so
    the link stays a link; else ``out``. Replacing the link itself left its target holding the old
    output (and a build beside it named after the link). A link to nothing is refused (FileNotFoundError
    naming ``option``, the link and where it points): following it created a file or folder the user
    never named, wherever the link pointed."""
    out = Path(out)
    if not out.is_symlink():
        return out
    target = Path(os.path.realpath(out))
    if not target.exists():
        where = f"{option} {out}" if option else str(out)
        raise FileNotFoundError(f"{where}: a symbolic link to {os.readlink(out)}, which does not exist; "
                                "name the output itself, or create what the link points to first")
    return target


def read_json_object(path: str | Path) -> dict[str, Any]:
    """The JSON object a file holds; one line naming the file where it is not JSON (or not
    UTF-8) or holds something other than an object (a file edited or damaged by hand)."""
    try:
        data = json.loads(Path(path).read_text())
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
        raise ValueError(f"{path}: not valid JSON ({e})") from None
    if not isinstance(data, dict):
        raise ValueError(f"{path}: expected a JSON object, got {type(data).__name__}")
    return data


def write_json_atomic(path: str | Path, obj: Any) -> None:
    write_atomic(path, json_bytes(obj))


def _fill_temp_dir(path: Path, files: Mapping[str, bytes]) -> Path:
    """A hidden temp directory beside `path` holding `files`, each fsynced."""
    tmp = Path(_named(path, tempfile.mkdtemp, dir=path.parent, prefix=f".{path.name}.", suffix=".tmp"))
    try:
        os.chmod(tmp, dir_mode())  # mkdtemp's is 0700
        folders = {tmp}
        for name, data in files.items():  # a name may hold folders: "1_Pooling/config.json"
            durable_step(f"write {path / name}")
            folder = (tmp / name).parent
            if folder not in folders:
                folder.mkdir(parents=True, exist_ok=True)
                folders.update(p for p in [folder, *folder.parents] if tmp in p.parents)
            with open(tmp / name, "wb") as f:  # open() follows the umask
                f.write(data)
                f.flush()
                os.fsync(f.fileno())
        for folder in sorted(folders, key=lambda p: -len(p.parts)):  # the deepest first
            fsync_dir(folder)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return tmp


def write_new_dir(path: str | Path, files: Mapping[str, bytes]) -> None:
    """Create directory `path` (which must not exist) holding `files`, published by one
    rename: before it, `path` does not exist; after it, it is complete."""
    path = Path(path)
    if path.exists():
        raise FileExistsError(f"{path}: expected a new directory, it exists")
    publish_dir(_fill_temp_dir(path, files), path)


def write_dir_atomic(path: str | Path, files: Mapping[str, bytes]) -> None:
    """Make directory `path` hold exactly `files`: built beside it, then swapped in by one
    atomic exchange (Linux renameat2), so a crash leaves the old directory or the new one."""
    path = Path(path)
    if path.exists() and not path.is_dir():
        raise NotADirectoryError(f"{path}: expected a directory, got a file")
    publish_dir(_fill_temp_dir(path, files), path)


def publish_dir(tmp: Path, path: Path) -> None:
    """Put the complete (fsynced) directory `tmp` at `path` in one atomic step: a rename, or
    an exchange with the directory already there, which is then removed."""
    if not path.exists():
        try:
            durable_step(f"rename {path}")
            os.rename(tmp, path)
        except BaseException:
            shutil.rmtree(tmp, ignore_errors=True)
            raise
        fsync_dir(path.parent)
        return
    try:
        durable_step(f"rename {path}")
        if not _exchange(tmp, path):
            # No atomic exchange here: move the old one aside, then the new one in.
            old = Path(tempfile.mkdtemp(dir=path.parent, prefix=f".{path.name}.", suffix=".old"))
            os.rename(path, old / path.name)
            os.rename(tmp, path)
            tmp = old
    finally:
        shutil.rmtree(tmp, ignore_errors=True)  # the new one on failure, else the old one
    fsync_dir(path.parent)


def remove_temp_files(directory: str | Path) -> None:
    """Remove what interrupted atomic writes left in `directory` (hidden ``*.tmp``/``*.old``)."""
    for entry in Path(directory).glob(".*"):
        if entry.name.endswith((".tmp", ".old")):
            if entry.is_dir() and not entry.is_symlink():
                shutil.rmtree(entry, ignore_errors=True)
            else:
                entry.unlink(missing_ok=True)


_RENAME_EXCHANGE = 2


def _exchange(a: Path, b: Path) -> bool:
    """Atomically swap two paths with renameat2(RENAME_EXCHANGE); False where unsupported."""
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        renameat2 = libc.renameat2
    except (OSError, AttributeError):
        return False
    at_fdcwd = -100
    rc = renameat2(at_fdcwd, os.fsencode(a), at_fdcwd, os.fsencode(b), _RENAME_EXCHANGE)
    if rc == 0:
        return True
    err = ctypes.get_errno()
    if err in (errno.ENOSYS, errno.EINVAL, errno.ENOTSUP):
        return False
    raise OSError(err, os.strerror(err), str(b))


@contextlib.contextmanager
def replaced_on_success(path: str | Path):
    """Yield a temp path beside `path`; when the block succeeds it is renamed over `path`
    (for writers that need a file name, such as numpy's memmap), else removed."""
    path = Path(path)
    fd, tmp = _named(path, tempfile.mkstemp, dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    os.close(fd)
    try:
        os.chmod(tmp, file_mode())
        yield Path(tmp)
        with open(tmp, "rb+") as f:
            os.fsync(f.fileno())
        durable_step(f"rename {path}")
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    fsync_dir(path.parent)


def _named(path: Path, make: Callable[..., Any], **kw: Any) -> Any:
    """make(**kw) (a temp file or folder beside `path`); a refusal (a read-only or missing
    folder) names `path`, the file the user asked for, not a hidden temp name they never gave."""
    try:
        return make(**kw)
    except OSError as e:
        raise type(e)(e.errno, e.strerror, str(path)) from None


def new_run_dir(name: str) -> Path:
    """runs/NAME-YYYYmmdd-HHMMSS, or with -1, -2, ... appended when that is taken."""
    base = Path("runs") / f"{name}-{time.strftime('%Y%m%d-%H%M%S')}"
    path, i = base, 1
    while path.exists():
        path, i = Path(f"{base}-{i}"), i + 1
    return path
