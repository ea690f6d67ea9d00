"""tformer.embeddings.index (and embed --out): an index is one unit, resumed after a kill."""

import numpy as np
import pytest


@pytest.mark.parametrize("suffix", [".npy", ".jsonl"])
def test_embed_output_resumes_and_publishes_atomically(tmp_path, suffix):
    from tformer.embeddings.output import open_output
    from tformer.storage import files

    out = tmp_path / f"e{suffix}"
    if suffix == ".npy":  # an earlier output (dim 2): replaceable, where a user's file is not
        np.save(out, np.zeros((1, 2), dtype=np.float32))
    else:
        out.write_text('{"text": "old", "embedding": [0.0, 0.0]}\n')
    old = out.read_bytes()
    identity = {"n": 6, "dim": 2, "model": "m"}
    rows = np.arange(12, dtype=np.float32).reshape(6, 2)
    texts = [f"t{i}" for i in range(6)]
    calls = []

    def full_disk(what):
        calls.append(what)
        if len(calls) == 5:  # the second chunk (after the header; each: rows, then its progress record)
            raise OSError(28, "No space left on device")

    files.fault_hook = full_disk
    try:
        with pytest.raises(OSError), open_output(out, identity) as w:
            for i in range(0, 6, 2):
                w.write(texts[i : i + 2], rows[i : i + 2])
    finally:
        files.fault_hook = None
    assert out.read_bytes() == old  # untouched until the new one is complete
    with open_output(out, identity) as w:
        assert w.done == 2  # the first chunk was recorded, then the disk was full
        for i in range(w.done, 6, 2):
            w.write(texts[i : i + 2], rows[i : i + 2])
    if suffix == ".npy":
        np.testing.assert_array_equal(np.load(out), rows)
    else:
        import json

        got = [json.loads(line) for line in out.read_text().splitlines()]
        assert [g["text"] for g in got] == texts
        np.testing.assert_array_equal([g["embedding"] for g in got], rows)
    assert sorted(p.name for p in tmp_path.iterdir()) == [out.name]


def test_index_build_refuses_a_path_that_is_not_an_index(tmp_path):
    from tformer.embeddings.index_build import build_index

    (tmp_path / "mine").mkdir()
    (tmp_path / "mine" / "notes.txt").write_text("mine")
    (tmp_path / "c.txt").write_text("a\nb\n")
    with pytest.raises(ValueError, match=r"exists and holds notes\.txt; a rebuild replaces"):
        build_index(None, tmp_path, tmp_path / "c.txt", tmp_path / "mine")
    assert (tmp_path / "mine" / "notes.txt").read_text() == "mine"
    # A file that only happens to be named index.json is no index: the folder stays whole.
    (tmp_path / "site").mkdir()
    (tmp_path / "site" / "index.json").write_text('{"pages": []}')
    with pytest.raises(ValueError, match=r"site: exists and is not a tformer index"):
        build_index(None, tmp_path, tmp_path / "c.txt", tmp_path / "site")
    assert (tmp_path / "site" / "index.json").read_text() == '{"pages": []}'



def test_a_partial_output_with_nothing_recorded_is_not_said_to_be_for_other_inputs(tmp_path):
    """A first chunk that failed (a full disk) left a .partial and no progress record: the rerun
    said "starting over: its interrupted part was for other inputs or options", which it was not.
    Only a recorded part for another identity is discarded with that message."""
    from tformer.embeddings.output import open_output

    out = tmp_path / "e.npy"
    identity = {"n": 2, "dim": 2, "model": "m"}
    out.with_name("e.npy.partial").write_bytes(b"\0" * 10)  # no e.npy.partial.json beside it
    with pytest.raises(KeyboardInterrupt), open_output(out, identity) as w:
        assert w.done == 0 and not w.discarded
        w.write(["a"], np.zeros((1, 2), dtype=np.float32))  # one row recorded, then stopped
        raise KeyboardInterrupt
    with pytest.raises(KeyboardInterrupt), open_output(out, {**identity, "model": "other"}) as w:
        assert w.done == 0 and w.discarded  # recorded, for another model: discarded, and said
        raise KeyboardInterrupt


def test_a_search_refuses_bad_queries_or_k_naming_them(tmp_path):
    from hf_bert_fixtures import st_dir

    from tformer.embeddings.index import Index
    from tformer.embeddings.index_build import build_index
    from tformer.embeddings.sentence import SentenceEncoder

    model = st_dir("mean", True)
    st = SentenceEncoder.from_pretrained(model)
    (tmp_path / "c.txt").write_text("a dog\nthe river\na cat\n")
    build_index(st, model, tmp_path / "c.txt", tmp_path / "index", show_progress=False)
    index = Index(tmp_path / "index")
    q = st.encode(["a cat"])  # (1, D)
    d = q.shape[1]
    # Each was numpy's error from inside the search (a broadcast, an axis, a reshape), or an
    # AttributeError; k=0 was "operands could not be broadcast together".
    for queries, k, error, message in (
        (q, 0, ValueError, r"^k: expected a positive int, got 0$"),
        (q, -1, ValueError, r"^k: expected a positive int, got -1$"),
        (q, "2", ValueError, r"^k: expected a positive int, got '2'$"),
        (q[0], 2, ValueError, rf"^queries: expected shape \(Q, {d}\) \(the index's vectors\), got \({d},\)$"),
        (q[:, :5], 2, ValueError, rf"^queries: expected shape \(Q, {d}\) \(the index's vectors\), got \(1, 5\)$"),
        (np.full_like(q, np.nan), 2, ValueError, r"^queries: expected finite vectors, got NaN or inf$"),
        (q.tolist(), 2, TypeError, r"^queries: expected a numpy array of vectors \(Q, D\), got list$"),
    ):
        with pytest.raises(error, match=message):
            index.search(queries, k)
    scores, rows = index.search(q, 10)  # k past the corpus: every row
    assert rows.shape == (1, 3) and rows[0, 0] == 2
    with pytest.raises(TypeError, match=r"^path: expected an index directory \(str or os\.PathLike\), got int$"):
        Index(5)
