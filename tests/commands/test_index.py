"""`tformer index build` and searching an index: one vector per corpus line, one builder per
--out, nothing half-built ever published, and damaged index files named in one line."""

from __future__ import annotations

import json
import os

import pytest
from cli_helpers import assert_one_line_error, killed_at, run_cli, stdin_bytes
from hf_bert_fixtures import SENTENCES, bert_dir

import tformer.embeddings.index
import tformer.embeddings.stream
from tformer.storage import files

OLD_CORPUS = ["a dog", "the cat sat on the mat"]


@pytest.fixture
def small_chunks(monkeypatch):
    monkeypatch.setattr(tformer.embeddings.stream, "CHUNK", 2)


def _corpus(tmp_path, lines, name="corpus.txt"):
    path = tmp_path / name
    path.write_text("\n".join(lines) + "\n")
    return path


def _build(capsys, corpus, out, *extra):
    return run_cli(capsys, "index", "build", bert_dir(), "--corpus", corpus, "--out", out, *extra)


def _texts(index):
    return [json.loads(line)["text"] for line in (index / "texts.jsonl").read_text().splitlines()]


def test_truncated_texts_file_is_a_one_line_error(capsys, tmp_path):
    idx = tmp_path / "idx"
    assert _build(capsys, _corpus(tmp_path, SENTENCES), idx)[0] == 0
    texts = idx / "texts.jsonl"
    texts.write_text("".join(texts.read_text().splitlines(keepends=True)[:3]))
    rc, _, err = run_cli(capsys, "search", idx, SENTENCES[4], "-k", 5)
    assert_one_line_error(rc, err, "search",
                          r"idx/texts\.jsonl: expected 5 lines \(index\.json\), got 3")


def test_truncated_vectors_file_is_a_one_line_error(capsys, tmp_path):
    idx = tmp_path / "idx"
    assert _build(capsys, _corpus(tmp_path, SENTENCES), idx)[0] == 0
    vectors = idx / "vectors.npy"
    data = vectors.read_bytes()
    vectors.write_bytes(data[:-100])
    rc, _, err = run_cli(capsys, "search", idx, "a dog")
    assert_one_line_error(rc, err, "search", rf"idx/vectors\.npy: expected {len(data)} bytes "
                                             rf"\(5 x 32 float32\), got {len(data) - 100}")


def test_blank_corpus_line_is_an_error_not_a_missing_vector(capsys, tmp_path):
    corpus = _corpus(tmp_path, ["a dog", "", "the cat"])
    rc, _, err = _build(capsys, corpus, tmp_path / "idx")
    assert_one_line_error(rc, err, "index", r"--corpus .*corpus\.txt:2: expected a text, got a blank")
    assert not (tmp_path / "idx").exists()


def test_corpus_lines_split_at_newline_only_and_from_stdin(capsys, tmp_path, monkeypatch):
    lines = ["a dog\x0cthe cat", "one\u2028two", "the mat"]
    stdin_bytes(monkeypatch, ("\n".join(lines) + "\n").encode())
    rc, _, err = _build(capsys, "-", tmp_path / "idx")
    assert rc == 0 and "3 vectors" in err, err
    assert _texts(tmp_path / "idx") == lines


@pytest.mark.parametrize("option, value", [("--batch-size", 0), ("--threads", 0)])
def test_out_of_range_options_are_one_line_errors(capsys, tmp_path, option, value):
    rc, _, err = _build(capsys, _corpus(tmp_path, SENTENCES), tmp_path / "idx", option, value)
    assert_one_line_error(rc, err, "index", rf"{option}: expected >= 1, got {value}")


def test_a_second_build_of_the_same_out_is_refused_and_the_first_is_intact(capsys, tmp_path,
                                                                          monkeypatch):
    idx = tmp_path / "idx"
    second = []

    def start_another_build(what):
        if not second:
            monkeypatch.setattr(files, "fault_hook", None)
            second.append(_build(capsys, _corpus(tmp_path, OLD_CORPUS, "other.txt"), idx))

    monkeypatch.setattr(files, "fault_hook", start_another_build)
    rc, _, err = _build(capsys, _corpus(tmp_path, SENTENCES), idx)
    assert rc == 0, err
    rc2, _, err2 = second[0]
    assert_one_line_error(rc2, err2, "index", rf"--out .*idx: is being written by another "
                                              rf"tformer process \(pid {os.getpid()}\)")
    assert _texts(idx) == SENTENCES
    assert sorted(p.name for p in tmp_path.iterdir()) == ["corpus.txt", "idx", "other.txt"]


def _steps(capsys, corpus, out, monkeypatch) -> int:
    steps = []
    monkeypatch.setattr(files, "fault_hook", steps.append)
    assert _build(capsys, corpus, out)[0] == 0
    monkeypatch.setattr(files, "fault_hook", None)
    return len(steps)


def test_full_disk_at_every_write_step_keeps_the_old_index_and_resumes(capsys, tmp_path, monkeypatch,
                                                                       small_chunks):
    idx = tmp_path / "idx"
    corpus = _corpus(tmp_path, SENTENCES)
    steps = _steps(capsys, corpus, tmp_path / "count", monkeypatch)
    assert steps == 1 + 3 * 3 + 1 + 1  # the header; per chunk: vectors, the progress temp, its rename; index.json; publish
    # One thread for every build: left to the machine's load, a resumed build may take another
    # thread count than the first and sum in another order (tests/commands/test_embed.py).
    assert _build(capsys, corpus, tmp_path / "count", "--threads", 1)[0] == 0
    expected = {p.name: p.read_bytes() for p in (tmp_path / "count").iterdir() if p.name != "index.json"}
    for k in range(1, steps + 1):
        assert _build(capsys, _corpus(tmp_path, OLD_CORPUS, "old.txt"), idx)[0] == 0
        old = {p.name: p.read_bytes() for p in idx.iterdir()}
        calls = []

        def full_disk(what, k=k, calls=calls):
            calls.append(what)
            if len(calls) == k:
                raise OSError(28, "No space left on device", what.split(" ", 1)[1])

        monkeypatch.setattr(files, "fault_hook", full_disk)
        rc, _, err = _build(capsys, corpus, idx, "--threads", 1)
        assert rc == 1 and err.count("\n") == 1 and "No space left" in err, (k, err)
        assert {p.name: p.read_bytes() for p in idx.iterdir()} == old, k  # the old index, whole
        monkeypatch.setattr(files, "fault_hook", None)
        rc, _, err = _build(capsys, corpus, idx, "--threads", 1)  # the same build again: resumed where recorded
        assert rc == 0, err
        # after the first recorded chunk; a failed publish (the last step) embeds again
        assert ("resuming" in err) == (4 < k < steps), (k, err)
        assert {p.name: p.read_bytes() for p in idx.iterdir() if p.name != "index.json"} == expected, k
        assert sorted(p.name for p in tmp_path.iterdir()) == [
            "corpus.txt", "count", "idx", "old.txt"], k  # nothing half-built left beside it


def test_a_disk_full_before_the_first_vector_names_the_file(capsys, tmp_path, monkeypatch):
    """vectors.npy's header is written before any row: on a disk already full it failed there, and
    the line named no file ("tformer index: error: No space left on device")."""
    import errno

    import numpy as np

    def full(f, header):
        raise OSError(errno.ENOSPC, "No space left on device")  # as a plain write raises it: no filename

    monkeypatch.setattr(np.lib.format, "write_array_header_1_0", full)
    monkeypatch.setattr(files, "last_step", None)  # as in a fresh process: no write begun yet
    rc, _, err = _build(capsys, _corpus(tmp_path, SENTENCES), tmp_path / "idx")
    assert rc == 1 and err.count("\n") == 1, err
    assert err.startswith("tformer index: error: No space left on device (write ") and \
        ".idx.build/vectors.npy)" in err, err
    assert not (tmp_path / "idx").exists()


def test_kill_at_every_write_step_keeps_the_old_index_and_the_next_build_resumes(
        capsys, tmp_path, monkeypatch, small_chunks):
    idx = tmp_path / "idx"
    corpus = _corpus(tmp_path, SENTENCES)
    # One thread here as in the killed child: the rows it wrote are then the same bytes.
    steps = _steps(capsys, corpus, tmp_path / "count", monkeypatch)
    assert _build(capsys, corpus, tmp_path / "count", "--threads", 1)[0] == 0
    expected = {p.name: p.read_bytes() for p in (tmp_path / "count").iterdir() if p.name != "index.json"}
    argv = ["index", "build", bert_dir(), "--corpus", corpus, "--out", idx, "--threads", 1]
    for k in range(1, steps + 1):
        assert _build(capsys, _corpus(tmp_path, OLD_CORPUS, "old.txt"), idx)[0] == 0
        old = {p.name: p.read_bytes() for p in idx.iterdir()}
        assert killed_at(k, argv), k
        assert {p.name: p.read_bytes() for p in idx.iterdir()} == old, k
        rc, out, err = run_cli(capsys, "search", idx, "a dog", "-k", 1)
        assert rc == 0 and "line 1: a dog" in out, err
        rc, _, err = run_cli(capsys, *argv)
        assert rc == 0 and ("resuming" in err) == (4 < k < steps), (k, err)
        assert {p.name: p.read_bytes() for p in idx.iterdir() if p.name != "index.json"} == expected, k
        assert sorted(p.name for p in tmp_path.iterdir()) == ["corpus.txt", "count", "idx", "old.txt"], k


def test_a_rebuild_refuses_an_index_folder_holding_the_users_files(capsys, tmp_path):
    """A rebuild swaps the folder whole: a file the user put beside the index (a README) would
    be deleted with it, so the build is refused, naming it, and nothing changes."""
    idx = tmp_path / "idx"
    corpus = _corpus(tmp_path, SENTENCES)
    assert _build(capsys, corpus, idx)[0] == 0
    (idx / "README.txt").write_text("what this index is for")
    rc, _, err = _build(capsys, corpus, idx)
    assert_one_line_error(rc, err, "index", r"--out .*idx: exists and holds README\.txt; a rebuild "
                                            r"replaces an index folder whole")
    assert (idx / "README.txt").read_text() == "what this index is for"
    (idx / "README.txt").unlink()
    assert _build(capsys, corpus, idx)[0] == 0  # an index's own files only: rebuilt


@pytest.mark.parametrize("edit", ["no model_id", "model_dir null", "n a string"])
def test_an_edited_index_json_is_a_one_line_error(capsys, tmp_path, edit):
    idx = tmp_path / "idx"
    assert _build(capsys, _corpus(tmp_path, SENTENCES), idx)[0] == 0
    meta = json.loads((idx / "index.json").read_text())
    key, value = {"no model_id": ("model_id", None), "model_dir null": ("model_dir", None),
                  "n a string": ("n", "5")}[edit]
    if value is None and edit == "no model_id":
        del meta[key]
    else:
        meta[key] = value
    (idx / "index.json").write_text(json.dumps(meta))
    rc, _, err = run_cli(capsys, "search", idx, "a dog")
    assert_one_line_error(rc, err, "search", rf"idx/index\.json: {key}: expected (a string|an integer), got "
                                             rf"{value!r} \(edited or damaged: rebuild the index\)")


def test_a_column_major_vectors_file_is_refused_not_misread(capsys, tmp_path):
    import numpy as np

    idx = tmp_path / "idx"
    assert _build(capsys, _corpus(tmp_path, SENTENCES), idx)[0] == 0
    vectors = np.load(idx / "vectors.npy")
    np.save(idx / "vectors.npy", np.asfortranarray(vectors))
    rc, _, err = run_cli(capsys, "search", idx, "a dog")
    assert_one_line_error(rc, err, "search", r"idx/vectors\.npy: expected a row-major \(C order\) array, "
                                             r"got Fortran order")


def test_a_moved_model_directory_is_named_not_hashed(capsys, tmp_path):
    idx = tmp_path / "idx"
    assert _build(capsys, _corpus(tmp_path, SENTENCES), idx)[0] == 0
    rc, _, err = run_cli(capsys, "search", idx, "a dog", "--model", tmp_path / "gone")
    assert_one_line_error(rc, err, "search", r"the model .*gone: no such directory; pass --model with "
                                             r"the one the index was built with")


def test_search_embeds_the_queries_in_the_precision_the_index_was_built_in(capsys, tmp_path, monkeypatch):
    """`--dtype auto` resolves per machine (bf16 where it is native and faster, else fp32): the
    queries of an index built in fp32 were embedded in bf16 here. They follow index.json now,
    unless --dtype says otherwise."""
    from tformer.commands import search

    seen = []
    load = search.load_sentence_encoder

    def recording(args):
        seen.append(args.dtype)
        return load(args)

    monkeypatch.setattr(search, "load_sentence_encoder", recording)
    idx = tmp_path / "idx"
    assert _build(capsys, _corpus(tmp_path, SENTENCES), idx, "--dtype", "fp32")[0] == 0
    assert run_cli(capsys, "search", idx, "a dog")[0] == 0
    assert run_cli(capsys, "search", idx, "a dog", "--dtype", "bf16")[0] == 0
    assert seen == ["fp32", "bf16"]


def test_an_index_of_a_run_still_searches_after_eval_appends_to_its_metrics(capsys, tmp_path):
    """The model's identity hashed every file of the run, metrics.jsonl and the run's lock
    included: `tformer eval RUN --data` changed it, and every index of the run was refused."""
    from text_fixtures import embedding_rows, write

    data = write(tmp_path / "pairs.jsonl", embedding_rows(40))
    run = tmp_path / "run"
    assert run_cli(capsys, "train", "--data", data, "--out", run, "--steps", 2, "--d-model", 16,
                   "--n-heads", 2, "--d-ff", 32, "--n-layers", 1, "--vocab-size", 260,
                   "--threads", 1, "--quiet")[0] == 0
    rows = embedding_rows(40)
    idx = tmp_path / "idx"
    corpus = _corpus(tmp_path, [r["anchor"] for r in rows[:5]])
    assert run_cli(capsys, "index", "build", run, "--corpus", corpus, "--out", idx)[0] == 0
    assert run_cli(capsys, "eval", run, "--data", data)[0] == 0
    rc, out, err = run_cli(capsys, "search", idx, rows[0]["anchor"], "-k", 1)
    assert rc == 0, err
    assert out.splitlines()[1].endswith(f"line 1: {rows[0]['anchor']}")


def test_a_search_reads_the_index_it_opened_while_a_rebuild_replaces_it(capsys, tmp_path, monkeypatch):
    """A rebuild published during a search: the search read the old vectors, then the new
    texts.jsonl, and printed every result beside another corpus's line, score 1.0 and all."""
    idx = tmp_path / "idx"
    assert _build(capsys, _corpus(tmp_path, SENTENCES), idx)[0] == 0
    blocks = tformer.embeddings.index.Index.blocks

    def rebuilt_meanwhile(self, *args):
        monkeypatch.setattr(tformer.embeddings.index.Index, "blocks", blocks)
        other = _corpus(tmp_path, [s.upper() + " again" for s in SENTENCES], "other.txt")
        assert _build(capsys, other, idx)[0] == 0
        return blocks(self, *args)

    monkeypatch.setattr(tformer.embeddings.index.Index, "blocks", rebuilt_meanwhile)
    rc, out, err = run_cli(capsys, "search", idx, SENTENCES[2], "-k", 1)
    assert rc == 0, err
    assert out.splitlines()[1] == f"  1. 1.0000  line 3: {SENTENCES[2]}"
    assert _texts(idx)[2] == SENTENCES[2].upper() + " again"  # the rebuild was published


def test_a_symlinked_out_rebuilds_the_index_it_names_and_stays_a_link(capsys, tmp_path):
    """The link was swapped out for the new folder and left behind as .link.build, naming the
    old index: the target kept the old index, and every later build failed ('File exists')."""
    target, link = tmp_path / "target", tmp_path / "link"
    assert _build(capsys, _corpus(tmp_path, OLD_CORPUS, "old.txt"), target)[0] == 0
    link.symlink_to(target, target_is_directory=True)
    for _ in range(2):
        rc, _, err = _build(capsys, _corpus(tmp_path, SENTENCES), link)
        assert rc == 0, err
    assert link.is_symlink() and _texts(target) == SENTENCES
    assert sorted(p.name for p in tmp_path.iterdir()) == ["corpus.txt", "link", "old.txt", "target"]


def test_an_empty_folder_at_out_is_built_into(capsys, tmp_path):
    # `mkdir idx` first was refused: "exists and is not a tformer index" (an export takes it).
    idx = tmp_path / "idx"
    idx.mkdir()
    rc, _, err = _build(capsys, _corpus(tmp_path, SENTENCES), idx)
    assert rc == 0, err
    assert _texts(idx) == SENTENCES


def test_an_out_naming_the_current_folder_is_one_line(capsys, tmp_path, monkeypatch):
    """`--out .` in an empty folder reached the lock, which raised pathlib's "PosixPath('.') has an
    empty name" (and `--out ""` is "." too)."""
    corpus = _corpus(tmp_path, SENTENCES)
    here = tmp_path / "here"
    here.mkdir()
    monkeypatch.chdir(here)
    rc, _, err = _build(capsys, corpus, ".")
    assert_one_line_error(rc, err, "index", r"--out: expected the name of a file or folder to write, got '\.'")
    rc, _, err = _build(capsys, corpus, "")
    assert_one_line_error(rc, err, "index", r"--out: expected a path, got ''")
    assert list(here.iterdir()) == []
