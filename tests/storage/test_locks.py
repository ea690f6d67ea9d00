"""tformer.storage.locks: one writer per output path; a second is refused; nothing is left behind."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from tformer.storage.locks import lock_path, output_lock


def test_a_second_writer_is_refused_naming_the_holder(tmp_path):
    out = tmp_path / "e.npy"
    with output_lock(out, "--out"):
        with pytest.raises(ValueError, match=rf"--out .*e\.npy: is being written by another "
                                             rf"tformer process \(pid {os.getpid()}\)"):
            with output_lock(out, "--out"):
                pass
        with output_lock(tmp_path / "other.npy", "--out"):  # another path: its own lock
            pass
    assert not lock_path(out).exists()  # released and removed
    with output_lock(out, "--out"):  # free again
        pass


def test_a_lock_file_replaced_while_locking_is_locked_again(tmp_path, monkeypatch):
    """A holder removes the lock file as it releases; a process that had opened the old file
    just before must not count it as the lock (two writers would then hold "the" lock)."""
    import fcntl

    import tformer.storage.locks

    out = tmp_path / "e.npy"
    calls, real_flock = [], fcntl.flock

    def flock_then_replaced(fd, op):
        real_flock(fd, op)
        calls.append(os.fstat(fd).st_ino)
        if len(calls) == 1:  # the holder releases: removes the file; a third process makes it anew
            lock_path(out).unlink()
            lock_path(out).touch()

    monkeypatch.setattr(tformer.storage.locks.fcntl, "flock", flock_then_replaced)
    with output_lock(out, "--out"):
        assert len(calls) == 2 and calls[1] == os.stat(lock_path(out)).st_ino


def test_leftovers_are_this_name_s_temp_files_only(tmp_path):
    from tformer.storage.locks import leftovers

    names = [".idx.abcd1234.tmp", ".idx.ab_d1234.old", ".idx.v2.abcd1234.tmp", ".idx.lock",
             "idx", ".idx.abcd1234.tmp.keep", ".e.npy.partial.json.abcd1234.tmp"]
    for name in names:
        (tmp_path / name).mkdir()
    assert sorted(p.name for p in leftovers(tmp_path, "idx")) == [".idx.ab_d1234.old",
                                                                 ".idx.abcd1234.tmp"]
    assert [p.name for p in leftovers(tmp_path, "e.npy.partial.json")] == [names[-1]]


def test_a_folder_it_cannot_write_in_is_named_not_the_lock_file(tmp_path):
    out = tmp_path / "missing" / "e.npy"  # the folder is not there (as /proc refuses new files)
    with pytest.raises(OSError) as caught, output_lock(out, "--out"):
        pass
    assert type(caught.value) is OSError and caught.value.errno is None  # the CLI's exit 1
    assert str(caught.value) == f"--out {out}: cannot write in {out.parent} (No such file or directory)"


@pytest.mark.parametrize("out", [".", "..", "/", "idx/.."])
def test_an_out_that_names_no_entry_is_refused_naming_the_option(out):
    """An output is built beside its name and swapped in by it: a path with no name ("." and the
    like) raised pathlib's "PosixPath('.') has an empty name", naming no option."""
    with pytest.raises(ValueError, match=r"^--out: expected the name of a file or folder to write, got '"):
        with output_lock(Path(out), "--out"):
            pass
