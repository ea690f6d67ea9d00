"""`tformer embed`: one row per input line, always; resume only what gives the same numbers;
one writer per --out; a crash or a kill at any write step publishes nothing half-written."""

from __future__ import annotations

import json
import os

import numpy as np
import pytest
from cli_helpers import NOT_LINE_BREAKS, assert_one_line_error, killed_at, run_cli, stdin_bytes
from helpers import assert_close
from hf_bert_fixtures import SENTENCES, st_dir

import tformer.embeddings.index
import tformer.embeddings.stream
from tformer.embeddings.sentence import SentenceEncoder
from tformer.storage import files


def _old_output(out, dim=32):
    """An earlier `tformer embed` output at ``out`` (st_dir's width, 32): what a new one may replace."""
    if out.suffix == ".npy":
        np.save(out, np.zeros((3, dim), dtype=np.float32))
    else:
        out.write_text(json.dumps({"text": "old", "embedding": [0.0] * dim}) + "\n")
    return out.read_bytes()


def _expected(texts, dtype="fp32"):
    return SentenceEncoder.from_pretrained(st_dir(), dtype=dtype).encode(texts)


@pytest.fixture
def small_chunks(monkeypatch):
    monkeypatch.setattr(tformer.embeddings.stream, "CHUNK", 2)  # 5 texts: chunks of 2, 2, 1


def test_every_file_line_is_one_row(capsys, tmp_path):
    texts = [f"a dog{c}the cat" for c in NOT_LINE_BREAKS]
    f = tmp_path / "t.txt"
    f.write_text("\r\n".join(texts) + "\n", encoding="utf-8")
    rc, _, err = run_cli(capsys, "embed", st_dir(), "--file", f, "--out", tmp_path / "e.npy")
    assert rc == 0, err
    assert_close(np.load(tmp_path / "e.npy"), _expected(texts))  # one row per line, in order


def test_blank_line_is_an_error_not_a_missing_row(capsys, tmp_path):
    f = tmp_path / "t.txt"
    f.write_text("the cat\na dog\n\none two three\n   \n")
    rc, _, err = run_cli(capsys, "embed", st_dir(), "--file", f, "--out", tmp_path / "e.npy")
    assert_one_line_error(rc, err, "embed", r"--file .*t\.txt:3: expected a text, got a blank line")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["t.txt"]


def test_file_dash_reads_stdin(capsys, monkeypatch):
    stdin_bytes(monkeypatch, ("\n".join(SENTENCES[1:3]) + "\n").encode())
    rc, out, err = run_cli(capsys, "embed", st_dir(), SENTENCES[0], "--file", "-")
    assert rc == 0, err
    rows = [json.loads(line) for line in out.splitlines()]
    assert [r["text"] for r in rows] == SENTENCES[:3]
    assert_close(np.array([r["embedding"] for r in rows]), _expected(SENTENCES[:3]))


@pytest.mark.parametrize("option, value", [("--batch-size", 0), ("--batch-size", -1),
                                           ("--threads", 0), ("--max-length", 0)])
def test_out_of_range_options_are_one_line_errors(capsys, option, value):
    rc, out, err = run_cli(capsys, "embed", st_dir(), "a dog", option, value)
    assert_one_line_error(rc, err, "embed", rf"{option}: expected >= 1, got {value}")


@pytest.mark.parametrize("command", ["embed", "similarity", "search", "index", "attention"])
@pytest.mark.parametrize("value, says", [(1000, r"expected at most 16 \(the model's maximum length\), got 1000"),
                                         (2, r"expected more than the 2 special tokens")])
def test_a_max_length_the_model_cannot_take_names_the_option(capsys, tmp_path, command, value, says):
    # It named the library's argument: "max_length: expected at most 16 ...".
    corpus = tmp_path / "c.txt"
    corpus.write_text("a dog\n")
    argv = {"embed": ["a dog"], "similarity": ["a dog", "a cat"], "search": ["a dog", "--corpus", corpus],
            "index": ["--corpus", corpus, "--out", tmp_path / "idx"],
            "attention": ["a dog", "--out", tmp_path / "a.png"]}[command]
    head = ["index", "build"] if command == "index" else [command]
    rc, _, err = run_cli(capsys, *head, st_dir(), *argv, "--max-length", value)
    assert_one_line_error(rc, err, command, rf"error: --max-length: {says}")


def test_a_max_length_below_a_runs_specials_names_the_option(capsys, classification_run, tmp_path):
    rc, _, err = run_cli(capsys, "attention", classification_run, "a b", "--max-length", 1,
                         "--out", tmp_path / "a.png")
    assert_one_line_error(rc, err, "attention", r"error: --max-length: expected more than")


def _full_disk_at(k):
    calls = []

    def hook(what):
        calls.append(what)
        if len(calls) == k:
            raise OSError(28, "No space left on device", what.split(" ", 1)[1])

    return hook, calls


def test_resume_with_another_dtype_starts_over_not_mixing_rows(capsys, tmp_path, monkeypatch,
                                                                small_chunks):
    f = tmp_path / "t.txt"
    f.write_text("\n".join(SENTENCES) + "\n")
    out = tmp_path / "e.npy"
    hook, _ = _full_disk_at(5)  # the second chunk (after the header): one chunk of int8 rows is recorded
    monkeypatch.setattr(files, "fault_hook", hook)
    rc, _, _ = run_cli(capsys, "embed", st_dir(), "--file", f, "--out", out, "--dtype", "int8")
    assert rc == 1
    monkeypatch.setattr(files, "fault_hook", None)
    rc, _, err = run_cli(capsys, "embed", st_dir(), "--file", f, "--out", out)
    assert rc == 0 and "resuming" not in err and "starting" in err and "over" in err
    assert_close(np.load(out), _expected(SENTENCES))  # every row fp32
    # The same dtype does resume.
    monkeypatch.setattr(files, "fault_hook", _full_disk_at(5)[0])
    run_cli(capsys, "embed", st_dir(), "--file", f, "--out", out, "--dtype", "int8")
    monkeypatch.setattr(files, "fault_hook", None)
    rc, _, err = run_cli(capsys, "embed", st_dir(), "--file", f, "--out", out, "--dtype", "int8")
    assert rc == 0 and "after 2 of 5" in err
    np.testing.assert_allclose(np.load(out), _expected(SENTENCES, "int8"), atol=1e-6)


def test_an_output_names_the_precision_that_ran_so_auto_resumes_as_fp32(capsys, tmp_path, monkeypatch,
                                                                        small_chunks):
    f = tmp_path / "t.txt"
    f.write_text("\n".join(SENTENCES) + "\n")
    out = tmp_path / "e.npy"
    monkeypatch.setattr(files, "fault_hook", _full_disk_at(5)[0])
    rc, _, _ = run_cli(capsys, "embed", st_dir(), "--file", f, "--out", out)  # auto: fp32 here
    assert rc == 1
    monkeypatch.setattr(files, "fault_hook", None)
    rc, _, err = run_cli(capsys, "embed", st_dir(), "--file", f, "--out", out, "--dtype", "fp32")
    assert rc == 0 and "after 2 of 5" in err, err  # the same numbers: resumed, not started over
    assert_close(np.load(out), _expected(SENTENCES))

def test_a_second_writer_of_the_same_out_is_refused_and_the_first_output_is_intact(
        capsys, tmp_path, monkeypatch, small_chunks):
    f = tmp_path / "t.txt"
    f.write_text("\n".join(SENTENCES) + "\n")
    other = tmp_path / "other.txt"
    other.write_text("one\ntwo\n")
    out = tmp_path / "e.npy"
    second = []

    def start_another_writer(what):  # while the first is between its chunks
        if not second:
            monkeypatch.setattr(files, "fault_hook", None)
            second.append(run_cli(capsys, "embed", st_dir(), "--file", other, "--out", out))

    monkeypatch.setattr(files, "fault_hook", start_another_writer)
    rc, _, err = run_cli(capsys, "embed", st_dir(), "--file", f, "--out", out)
    assert rc == 0, err
    rc2, _, err2 = second[0]
    assert_one_line_error(rc2, err2, "embed", rf"--out .*e\.npy: is being written by another "
                                              rf"tformer process \(pid {os.getpid()}\)")
    assert_close(np.load(out), _expected(SENTENCES))
    assert sorted(p.name for p in tmp_path.iterdir()) == ["e.npy", "other.txt", "t.txt"]


def _count_steps(capsys, argv, monkeypatch) -> int:
    steps = []
    monkeypatch.setattr(files, "fault_hook", steps.append)
    assert run_cli(capsys, *argv)[0] == 0
    monkeypatch.setattr(files, "fault_hook", None)
    return len(steps)


@pytest.mark.parametrize("suffix", [".npy", ".jsonl"])
def test_full_disk_at_every_write_step_keeps_the_old_file_and_resumes(capsys, tmp_path,
                                                                      monkeypatch, small_chunks,
                                                                      suffix):
    f = tmp_path / "t.txt"
    f.write_text("\n".join(SENTENCES) + "\n")
    out = tmp_path / f"e{suffix}"
    # One thread for every run: left to the machine's load (tformer.nn.kernels.machine.free_threads),
    # a resumed run may take another thread count than the first, and sum in another order (the
    # .jsonl rows differed in their last digits on a 2-core AMD EPYC Zen 4 running the suite).
    argv = ["embed", st_dir(), "--file", f, "--out", out, "--threads", 1]
    steps = _count_steps(capsys, argv, monkeypatch)
    assert steps == 1 + 3 * 3 + 1  # the header; per chunk: rows, progress temp, its rename; the publish
    expected = out.read_bytes()
    for k in range(1, steps + 1):
        old = _old_output(out)
        monkeypatch.setattr(files, "fault_hook", _full_disk_at(k)[0])
        rc, _, err = run_cli(capsys, *argv)
        assert rc == 1 and err.count("\n") == 1 and "No space left on device" in err, (k, err)
        assert out.read_bytes() == old  # untouched, whole
        monkeypatch.setattr(files, "fault_hook", None)
        rc, _, err = run_cli(capsys, *argv)
        assert rc == 0, err
        assert out.read_bytes() == expected, k  # resumed to the same bytes
        assert sorted(p.name for p in tmp_path.iterdir()) == sorted([out.name, "t.txt"]), k


@pytest.mark.parametrize("suffix, users", [
    (".npy", lambda p: np.save(p, np.zeros((3, 5), dtype=np.float32))),  # another width
    (".npy", lambda p: np.save(p, np.zeros((3, 32)))),  # float64: not ours
    (".npy", lambda p: p.write_text("precious")),
    (".jsonl", lambda p: p.write_text('{"text": "a", "label": "b"}\n')),  # training data
    (".jsonl", lambda p: p.write_text('{"split": "test", "accuracy": 0.9}\n')),  # metrics.jsonl
])
def test_a_users_file_at_out_is_refused_never_replaced(capsys, tmp_path, suffix, users):
    out = tmp_path / f"mine{suffix}"
    users(out)
    before = out.read_bytes()
    rc, _, err = run_cli(capsys, "embed", st_dir(), "a dog", "--out", out)
    assert_one_line_error(rc, err, "embed", r"--out .*mine\.\w+: exists and is not an earlier `tformer "
                                            r"embed` output")
    assert out.read_bytes() == before and sorted(p.name for p in tmp_path.iterdir()) == [out.name]
    _old_output(out)  # an earlier output of this model's width: replaced
    assert run_cli(capsys, "embed", st_dir(), "a dog", "--out", out)[0] == 0
    assert out.read_bytes() != before


def test_kill_at_every_write_step_keeps_the_old_file_and_resumes(capsys, tmp_path, monkeypatch,
                                                                small_chunks):
    f = tmp_path / "t.txt"
    f.write_text("\n".join(SENTENCES[:4]) + "\n")  # 2 chunks
    out = tmp_path / "e.npy"
    # One thread here as in the killed child: the rows it wrote are then the same bytes.
    argv = ["embed", st_dir(), "--file", f, "--out", out, "--threads", 1]
    steps = _count_steps(capsys, argv, monkeypatch)
    expected = out.read_bytes()
    for k in range(1, steps + 1):
        old = _old_output(out)
        assert killed_at(k, argv), k
        assert out.read_bytes() == old  # never half a new file
        rc, _, err = run_cli(capsys, *argv)
        assert rc == 0, err
        assert ("resuming" in err) == (k > 4), (k, err)  # after the first recorded chunk
        assert out.read_bytes() == expected, k
        assert sorted(p.name for p in tmp_path.iterdir()) == ["e.npy", "t.txt"], k


def test_a_full_disk_names_the_file_being_written(capsys, tmp_path, monkeypatch):
    """A plain write's ENOSPC names no file: the command line names the write it began last."""
    import errno

    def full(what):
        raise OSError(errno.ENOSPC, "No space left on device")  # as f.write raises it: no filename

    monkeypatch.setattr(files, "fault_hook", full)
    out = tmp_path / "e.npy"
    rc, _, err = run_cli(capsys, "embed", st_dir(), "a dog", "--out", out)
    assert rc == 1 and err.count("\n") == 1, err
    assert err.startswith("tformer embed: error: No space left on device (write ") and "e.npy" in err, err


@pytest.mark.parametrize("name", ["e.npy/", "e.jsonl/"])
def test_an_out_named_as_a_folder_is_refused(capsys, tmp_path, name):
    """`--out e.npy/` names a folder: pathlib dropped the slash, and a file e.npy was written."""
    out = f"{tmp_path}{os.sep}{name}"  # as typed: tmp_path / name would drop the slash
    rc, _, err = run_cli(capsys, "embed", st_dir(), "a dog", "--out", out)
    assert_one_line_error(rc, err, "embed", r"--out: expected a \.npy or \.jsonl file name, got the folder "
                                            r"name '.*e\.\w+/'")
    assert list(tmp_path.iterdir()) == []


def test_a_disk_full_before_the_first_row_names_the_file(capsys, tmp_path, monkeypatch):
    """The .npy header is written before any row: on a disk already full it failed there, and the
    line named no file ("tformer embed: error: No space left on device")."""
    import errno

    def full(f, header):
        raise OSError(errno.ENOSPC, "No space left on device")  # as a plain write raises it: no filename

    monkeypatch.setattr(np.lib.format, "write_array_header_1_0", full)
    monkeypatch.setattr(files, "last_step", None)  # as in a fresh process: no write begun yet
    out = tmp_path / "e.npy"
    rc, _, err = run_cli(capsys, "embed", st_dir(), "a dog", "--out", out)
    assert rc == 1 and err.count("\n") == 1, err
    assert err.startswith("tformer embed: error: No space left on device (write ") and "e.npy.partial)" in err, err
    assert not out.exists()


def test_a_symlinked_out_replaces_the_file_it_names_and_stays_a_link(capsys, tmp_path):
    # The link itself was replaced by the new file; the file it named kept the old embeddings.
    target, link = tmp_path / "target.npy", tmp_path / "link.npy"
    assert run_cli(capsys, "embed", st_dir(), "a dog", "--out", target)[0] == 0
    link.symlink_to(target)
    rc, _, err = run_cli(capsys, "embed", st_dir(), *SENTENCES[:3], "--out", link)
    assert rc == 0, err
    assert link.is_symlink() and np.load(target).shape == (3, 32)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["link.npy", "target.npy"]


def test_an_empty_out_is_refused_not_printed(capsys):
    """`--out ""` (an unset shell variable) printed the embeddings to stdout and exited 0."""
    rc, out, err = run_cli(capsys, "embed", st_dir(), "a dog", "--out", "")
    assert_one_line_error(rc, err, "embed", r"--out: expected a path, got ''")
    assert out == ""


def test_an_out_link_to_nothing_is_refused(capsys, tmp_path):
    """Following a link to nothing created the file it named, wherever it pointed."""
    link = tmp_path / "link.npy"
    link.symlink_to(tmp_path / "elsewhere" / "e.npy")
    rc, _, err = run_cli(capsys, "embed", st_dir(), "a dog", "--out", link)
    assert_one_line_error(rc, err, "embed", rf"--out {link}: a symbolic link to .*e.npy, which does not exist")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["link.npy"]
