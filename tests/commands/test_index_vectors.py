"""`tformer index build --vectors V.npy [--texts]` and `tformer search INDEX --query-vectors Q.npy`:
vectors in, row ids out; bad files named in one line; a kill leaves the old index or the new one."""

from __future__ import annotations

import json

import numpy as np
import pytest
from cli_helpers import assert_one_line_error, killed_at, run_cli
from hf_bert_fixtures import bert_dir


def _vectors(tmp_path, n=60, dim=8, seed=0, name="v.npy", dtype=np.float32):
    x = np.random.default_rng(seed).standard_normal((n, dim)).astype(dtype)
    np.save(tmp_path / name, x)
    return tmp_path / name, x


def _exact(corpus, queries, k):
    c = corpus / np.linalg.norm(corpus.astype(np.float64), axis=1, keepdims=True)
    q = queries / np.linalg.norm(queries.astype(np.float64), axis=1, keepdims=True)
    sims = q @ c.T
    rows = np.argsort(-sims, axis=1, kind="stable")[:, :k]
    return rows, np.take_along_axis(sims, rows, axis=1)


@pytest.mark.parametrize("with_texts", [False, True])
def test_vectors_in_ids_out_as_jsonl(capsys, tmp_path, with_texts):
    path, x = _vectors(tmp_path)
    texts = [f"document {i}" for i in range(len(x))]
    extra = []
    if with_texts:
        (tmp_path / "t.txt").write_text("\n".join(texts) + "\n")
        extra = ["--texts", tmp_path / "t.txt"]
    rc, _, err = run_cli(capsys, "index", "build", "--vectors", path, *extra, "--out", tmp_path / "idx")
    assert rc == 0 and "60 vectors of dimension 8" in err and "search: exact (60 vectors < 200,000" in err, err
    qpath, q = _vectors(tmp_path, n=7, seed=1, name="q.npy", dtype=np.float64)
    rc, out, err = run_cli(capsys, "search", tmp_path / "idx", "--query-vectors", qpath, "--k", 4,
                           "--format", "jsonl")
    assert rc == 0, err
    records = [json.loads(line) for line in out.splitlines()]
    rows, scores = _exact(x, q, 4)
    assert [r["query_index"] for r in records] == list(range(7))
    assert [r["ids"] for r in records] == rows.tolist()
    assert np.abs(np.array([r["scores"] for r in records]) - scores).max() <= 1e-6
    if with_texts:
        assert [r["texts"] for r in records] == [[texts[i] for i in row] for row in rows.tolist()]
    else:
        assert all(set(r) == {"query_index", "ids", "scores"} for r in records)
    rc, text, err = run_cli(capsys, "search", tmp_path / "idx", "--query-vectors", qpath, "-k", 2)
    assert rc == 0 and text.splitlines()[:3] == [
        "query 0:", f"  1. {scores[0, 0]:.4f}  row {rows[0, 0]}" + (f": {texts[rows[0, 0]]}" if with_texts else ""),
        f"  2. {scores[0, 1]:.4f}  row {rows[0, 1]}" + (f": {texts[rows[0, 1]]}" if with_texts else "")], text


def test_an_approximate_index_of_vectors_answers_near_exact(capsys, tmp_path):
    pytest.importorskip("faiss")
    centres = np.random.default_rng(7).standard_normal((50, 16))
    rng = np.random.default_rng(0)
    x = (centres[rng.integers(0, 50, 2000)] + 0.4 * rng.standard_normal((2000, 16))).astype(np.float32)
    np.save(tmp_path / "v.npy", x)
    rc, _, err = run_cli(capsys, "index", "build", "--vectors", tmp_path / "v.npy", "--out", tmp_path / "idx",
                         "--ann", "ivfpq", "--threads", 1)
    assert rc == 0 and "search: approximate (IVF-PQ" in err and "chose nprobe" in err, err
    q = (centres[rng.integers(0, 50, 100)] + 0.4 * rng.standard_normal((100, 16))).astype(np.float32)
    np.save(tmp_path / "q.npy", q)
    got = {}
    for how in ([], ["--exact"]):
        rc, out, err = run_cli(capsys, "search", tmp_path / "idx", "--query-vectors", tmp_path / "q.npy",
                               "-k", 10, "--format", "jsonl", *how)
        assert rc == 0, err
        got[bool(how)] = [json.loads(line)["ids"] for line in out.splitlines()]
    assert got[True] == _exact(x, q, 10)[0].tolist()
    recall = np.mean([len(set(a) & set(b)) / 10 for a, b in zip(got[False], got[True], strict=True)])
    assert recall >= 0.9, recall


def _npy(tmp_path, name, array):
    np.save(tmp_path / name, array, allow_pickle=True)
    return tmp_path / name


@pytest.mark.parametrize("make, pattern", [
    (lambda p: _npy(p, "b.npy", np.arange(12).reshape(3, 4)), r"--vectors .*b\.npy: expected float vectors .*got dtype int64"),
    (lambda p: _npy(p, "b.npy", np.zeros(5, np.float32)), r"--vectors .*b\.npy: expected a 2-D array \(N, D\) .*got shape \(5,\)"),
    (lambda p: _npy(p, "b.npy", np.zeros((0, 4), np.float32)), r"got shape \(0, 4\)"),
    (lambda p: _npy(p, "b.npy", np.array([[1.0, np.nan], [1.0, 2.0]], np.float32)[::-1].copy()),
     r"--vectors .*b\.npy: row 1: expected finite numbers, got NaN or infinity"),
    (lambda p: _npy(p, "b.npy", np.array([[1, "a"]], dtype=object)), r"--vectors .*b\.npy: expected float vectors"),
    (lambda p: (p / "b.npy").write_text("not an array") and p / "b.npy", r"--vectors .*b\.npy: expected a \.npy file"),
    (lambda p: p / "missing.npy", r"--vectors .*missing\.npy: no such file"),
])
def test_bad_vectors_are_one_line_errors_and_write_nothing(capsys, tmp_path, make, pattern):
    rc, _, err = run_cli(capsys, "index", "build", "--vectors", make(tmp_path), "--out", tmp_path / "idx")
    assert_one_line_error(rc, err, "index", pattern)
    assert not (tmp_path / "idx").exists() and not any(p.name.startswith(".idx") for p in tmp_path.iterdir())


def test_texts_must_match_the_vectors_and_options_must_fit(capsys, tmp_path):
    path, _ = _vectors(tmp_path, n=5)
    (tmp_path / "t.txt").write_text("a\nb\nc\n")
    rc, _, err = run_cli(capsys, "index", "build", "--vectors", path, "--texts", tmp_path / "t.txt",
                         "--out", tmp_path / "idx")
    assert_one_line_error(rc, err, "index", r"--texts .*t\.txt: expected 5 lines \(one per row of --vectors .*v\.npy\), got 3")
    rc, _, err = run_cli(capsys, "index", "build", bert_dir(), "--vectors", path, "--out", tmp_path / "idx")
    assert_one_line_error(rc, err, "index", r"MODEL_DIR: not with --vectors")
    rc, _, err = run_cli(capsys, "index", "build", "--out", tmp_path / "idx")
    assert_one_line_error(rc, err, "index", r"MODEL_DIR: expected MODEL_DIR and --corpus \(or --vectors V\.npy\)")
    rc, _, err = run_cli(capsys, "index", "build", "--vectors", path, "--out", tmp_path / "idx", "--ann", "ivfpq")
    assert_one_line_error(rc, err, "index", r"--ann ivfpq: expected at least 1,000 vectors")
    assert not (tmp_path / "idx").exists()


def test_bad_query_vectors_are_one_line_errors(capsys, tmp_path):
    path, _ = _vectors(tmp_path)
    assert run_cli(capsys, "index", "build", "--vectors", path, "--out", tmp_path / "idx")[0] == 0
    for array, pattern in ((np.zeros((2, 5), np.float32), r"--query-vectors .*q\.npy: expected vectors of width 8 \(the index's\), got 5"),
                           (np.full((2, 8), np.inf), r"--query-vectors .*q\.npy: row 0: expected finite numbers")):
        np.save(tmp_path / "q.npy", array)
        rc, _, err = run_cli(capsys, "search", tmp_path / "idx", "--query-vectors", tmp_path / "q.npy")
        assert_one_line_error(rc, err, "search", pattern)
    rc, _, err = run_cli(capsys, "search", tmp_path / "idx", "a text query")
    assert_one_line_error(rc, err, "search", r"built from vectors, it names no model: give --model")
    rc, _, err = run_cli(capsys, "search", tmp_path / "idx", "q", "--query-vectors", path)
    assert_one_line_error(rc, err, "search", r"QUERY: not with --query-vectors")


def test_kill_at_every_write_step_of_an_approximate_build_keeps_the_old_index(capsys, tmp_path, monkeypatch):
    pytest.importorskip("faiss")
    from tformer.storage import files

    path, x = _vectors(tmp_path, n=1200)
    idx = tmp_path / "idx"
    argv = ["index", "build", "--vectors", path, "--out", idx, "--ann", "ivfpq", "--threads", 1]
    steps = []
    monkeypatch.setattr(files, "fault_hook", steps.append)
    assert run_cli(capsys, "index", "build", "--vectors", path, "--out", tmp_path / "count")[0] == 0
    monkeypatch.setattr(files, "fault_hook", None)
    old_vectors, _ = _vectors(tmp_path, n=1100, seed=5, name="old.npy")
    for k in range(1, 5):  # vectors.npy, ann.faiss, index.json, the publishing rename
        assert run_cli(capsys, "index", "build", "--vectors", old_vectors, "--out", idx)[0] == 0
        old = {p.name: p.read_bytes() for p in idx.iterdir()}
        assert killed_at(k, argv), k
        assert {p.name: p.read_bytes() for p in idx.iterdir()} == old, k
        rc, _, err = run_cli(capsys, *argv)  # then built whole
        assert rc == 0 and "approximate" in err, err
        assert sorted(p.name for p in idx.iterdir()) == ["ann.faiss", "index.json", "vectors.npy"]
    assert len(steps) == 3  # an exact build: vectors.npy, index.json, the rename


def test_a_text_query_against_an_index_of_vectors_names_rows(capsys, tmp_path):
    """Vectors a model made, indexed without texts: a text query with --model finds their rows."""
    from hf_bert_fixtures import SENTENCES, st_dir

    rc, _, err = run_cli(capsys, "embed", st_dir(), *SENTENCES, "--out", tmp_path / "e.npy")
    assert rc == 0, err
    assert run_cli(capsys, "index", "build", "--vectors", tmp_path / "e.npy", "--out", tmp_path / "idx")[0] == 0
    rc, out, err = run_cli(capsys, "search", tmp_path / "idx", SENTENCES[2], "--model", st_dir(), "-k", 2)
    assert rc == 0, err
    assert out.splitlines()[1] == "  1. 1.0000  row 2"
    rc, out, err = run_cli(capsys, "search", tmp_path / "idx", SENTENCES[2], "--model", st_dir(), "-k", 1,
                           "--format", "jsonl")
    assert rc == 0 and json.loads(out)["id"] == 2 and json.loads(out)["text"] is None, err
