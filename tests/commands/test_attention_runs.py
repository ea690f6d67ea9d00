"""`tformer attention RUN TEXT --html/--out` on runs trained on your data (classification,
seq2seq, embedding), the page's size bounded before it is built, and its permissions."""

from __future__ import annotations

import os

import numpy as np
import pytest
import torch
from text_fixtures import classification_rows, embedding_rows, seq2seq_rows, write

from tformer.commands.cli import main
from tformer.training.viz import html as viz_html
from tformer.training.viz.html import read_page_data

TINY = ["--d-model", "16", "--n-heads", "2", "--d-ff", "32", "--n-layers", "2", "--vocab-size", "300",
        "--steps", "2", "--eval-every", "2", "--max-tokens", "512", "--max-length", "12", "--threads", "1",
        "--quiet"]


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("runs")
    out = {}
    for name, rows in (("classification", classification_rows(60)), ("seq2seq", seq2seq_rows(60)),
                       ("embedding", embedding_rows(60))):
        data = write(tmp / f"{name}.jsonl", rows)
        out[name] = tmp / name
        assert main(["train", "--data", str(data), "--out", str(out[name]), *TINY]) == 0
    return out


def _run(capsys, *argv):
    rc = main([str(a) for a in argv])
    _, err = capsys.readouterr()
    return rc, err


@pytest.mark.parametrize("kind, groups", [
    ("classification", ["encoder self-attention"]),
    ("embedding", ["encoder self-attention"]),
    ("seq2seq", ["encoder self-attention", "decoder self-attention", "decoder cross-attention"]),
])
def test_every_data_run_kind_draws_its_attention(capsys, tmp_path, runs, kind, groups):
    page, png = tmp_path / "a.html", tmp_path / "a.png"
    rc, err = _run(capsys, "attention", runs[kind], "the cat sat on a mat", "--html", page, "--out", png)
    assert rc == 0, err
    data = read_page_data(page)
    assert [g["name"] for g in data["groups"]] == groups
    encoder = data["groups"][0]
    w = np.array(encoder["weights"])  # (L, H, S, S)
    assert w.shape[:2] == (2, 2) and np.allclose(w.sum(-1), 1.0, atol=1e-5)
    if kind == "seq2seq":
        assert encoder["queries"][-1] == "</s>"  # the source as training encodes it
    else:
        assert encoder["queries"][0] == "<s>" and encoder["queries"][-1] == "</s>"
    assert png.stat().st_size > 0


def test_the_tokens_are_cut_at_the_runs_max_length(capsys, tmp_path, runs):
    page = tmp_path / "a.html"
    assert _run(capsys, "attention", runs["classification"], " ".join(["cat"] * 40), "--html", page)[0] == 0
    assert len(read_page_data(page)["groups"][0]["queries"]) == 12


def test_a_page_too_big_is_refused_in_one_line_before_it_is_built(capsys, tmp_path, runs, monkeypatch):
    monkeypatch.setattr(viz_html, "MAX_PAGE_BYTES", 1000)
    monkeypatch.setattr(viz_html, "attention_page", lambda *a, **k: pytest.fail("the page was built"))
    for kind in ("classification", "seq2seq"):
        rc, err = _run(capsys, "attention", runs[kind], "the cat sat on a mat", "--html", tmp_path / "a.html")
        assert rc == 2 and err.count("\n") == 1, err
        assert "TEXT: expected an attention page of at most 0 MB, got an estimated" in err
    assert not (tmp_path / "a.html").exists()


def test_the_size_estimate_bounds_the_real_page(tmp_path):
    rng = np.random.default_rng(0)
    w = rng.random((2, 3, 9, 9))
    w /= w.sum(-1, keepdims=True)
    maps = [viz_html.AttentionMaps("encoder self-attention", list("abcdefghi"), list("abcdefghi"), w)]
    path = viz_html.write_attention_page(tmp_path / "a.html", maps, "m", "t")
    one = [viz_html.AttentionMaps("encoder self-attention", ["a"], ["a"], np.ones((1, 1, 1, 1)))]
    empty = len(viz_html.attention_page(one, "m", "t").encode())  # the page without its weights
    assert 0.5 * viz_html.page_bytes(w.size) <= path.stat().st_size - empty <= viz_html.page_bytes(w.size)


def test_the_page_follows_the_umask(capsys, tmp_path, runs):
    old = os.umask(0o077)
    try:
        assert _run(capsys, "attention", runs["embedding"], "the cat", "--html", tmp_path / "a.html")[0] == 0
    finally:
        os.umask(old)
    assert (tmp_path / "a.html").stat().st_mode & 0o777 == 0o600  # private text stays private


def test_the_page_matches_the_runs_encoder(capsys, tmp_path, runs):
    """The weights on the page are the encoder's, for the tokens the run would see."""
    from tformer.kinds import load_run

    page = tmp_path / "a.html"
    assert _run(capsys, "attention", runs["classification"], "a big red house", "--html", page)[0] == 0
    loaded = load_run(runs["classification"])
    model, source, _ = loaded.model, loaded.objective, loaded.config
    ((ids, types, _),) = [(e.ids, e.type_ids, e.full) for e in source.tokenizer.encode(["a big red house"])]
    with torch.no_grad():
        out = model.encoder(torch.tensor([ids]), token_type_ids=torch.tensor([types]), output_attentions=True)
    expected = torch.stack([a[0] for a in out.attentions]).double().numpy()
    got = np.array(read_page_data(page)["groups"][0]["weights"])
    np.testing.assert_allclose(got, expected, rtol=0, atol=1e-6)


def test_help_says_a_run_directory_is_taken(capsys):
    """docs/cli.md shows `tformer attention MODEL_DIR|RUN_DIR`; its --help named only a
    BERT-format or sentence-transformers directory."""
    with pytest.raises(SystemExit):
        main(["attention", "--help"])
    assert "or a run directory of `tformer train` (any kind)" in " ".join(capsys.readouterr().out.split())
    with pytest.raises(SystemExit):
        main(["embed", "--help"])  # embed takes a sentence model only (an embedding run is one)
    assert "run directory" not in capsys.readouterr().out
