"""`tformer attention MODEL_DIR TEXT --html OUT.html`: BERT directories and trained runs."""

from __future__ import annotations

import re

import numpy as np
import pytest
import torch
from browser_helpers import browser_report
from hf_bert_fixtures import bert_dir

from tformer.commands.cli import main
from tformer.kinds import load_run
from tformer.nn.generate import generate
from tformer.nn.model import from_pretrained
from tformer.text.tokenizer import load_tokenizer
from tformer.training.tasks.tokenizer import BOS, EOS
from tformer.training.viz.html import read_page_data

TINY = [
    "--d-model",
    "16",
    "--n-heads",
    "2",
    "--d-ff",
    "32",
    "--n-layers",
    "2",
    "--batch-size",
    "8",
    "--valid-size",
    "8",
    "--test-size",
    "8",
    "--eval-every",
    "2",
    "--threads",
    "1",
    "--quiet",
]


@pytest.fixture(scope="module")
def reverse_run(tmp_path_factory):
    out = tmp_path_factory.mktemp("runs") / "reverse"
    assert main(["train", "--task", "reverse", "--steps", "3", "--out", str(out), *TINY]) == 0
    return out


def _run(capsys, *argv):
    rc = main([str(a) for a in argv])
    out, err = capsys.readouterr()
    return rc, out, err


def _stack(attentions) -> np.ndarray:
    return torch.stack([a[0] for a in attentions]).double().numpy()  # (L, H, Tq, Tk)


def test_bert_page_holds_the_models_attentions(capsys, tmp_path):
    text = "the cat sat on the mat"
    rc, _, err = _run(capsys, "attention", bert_dir(), text, "--html", tmp_path / "a.html", "--head", 3)
    assert rc == 0 and "1 kind of attention, 2 layers x 4 heads, 8 tokens" in err
    data = read_page_data(tmp_path / "a.html")
    assert data["model"] == str(bert_dir()) and data["text"] == text
    assert data["initial"] == {"layer": 0, "head": 3}
    (group,) = data["groups"]
    tok = load_tokenizer(bert_dir())
    batch = tok([text])
    with torch.no_grad():
        out = from_pretrained(bert_dir())(**batch, output_attentions=True)
    tokens = tok.convert_ids_to_tokens(batch["input_ids"][0].tolist())
    assert group["queries"] == group["keys"] == tokens
    np.testing.assert_allclose(np.array(group["weights"]), _stack(out.attentions), rtol=0, atol=1e-6)


def test_png_and_html_together(capsys, tmp_path):
    rc, _, err = _run(
        capsys, "attention", bert_dir(), "a cat", "--html", tmp_path / "a.html", "--out", tmp_path / "a.png"
    )
    assert rc == 0 and (tmp_path / "a.html").is_file() and (tmp_path / "a.png").is_file()
    assert "wrote" in err and "maps" in err


def test_a_users_file_at_out_or_html_is_refused_and_ours_is_replaced(capsys, tmp_path):
    page, png = tmp_path / "a.html", tmp_path / "a.png"
    for option, path in (("--html", page), ("--out", png)):
        path.write_text("precious")
        rc, _, err = _run(capsys, "attention", bert_dir(), "a cat", option, path)
        assert rc == 2 and err.count("\n") == 1 and f"{option} {path}: exists and is not" in err, err
        assert path.read_text() == "precious"
        path.unlink()
    for _ in range(2):  # written, then its own file replaced
        assert _run(capsys, "attention", bert_dir(), "a cat", "--html", page, "--out", png)[0] == 0


def test_seq2seq_run_page_has_encoder_decoder_and_cross_attention(capsys, tmp_path, reverse_run):
    rc, _, err = _run(capsys, "attention", reverse_run, "3 1 4 1 5", "--html", tmp_path / "r.html")
    assert rc == 0 and "3 kinds of attention, 2 layers x 2 heads, 6 tokens" in err
    enc, dec_self, cross = read_page_data(tmp_path / "r.html")["groups"]
    assert (enc["name"], dec_self["name"], cross["name"]) == (
        "encoder self-attention",
        "decoder self-attention",
        "decoder cross-attention",
    )
    assert enc["queries"] == enc["keys"] == ["3", "1", "4", "1", "5", "<eos>"]
    assert cross["keys"] == enc["keys"] and cross["queries"] == dec_self["queries"] == dec_self["keys"]
    assert dec_self["queries"][0] == "<bos>"
    assert enc["note"] == "" and "row t predicts token t + 1" in cross["note"]  # shown on the page

    # The same numbers, computed here directly from the run.
    loaded = load_run(reverse_run)
    model, source, _ = loaded.model, loaded.objective, loaded.config
    task = source.source.task
    src = torch.tensor([task.tokenizer.encode("3 1 4 1 5") + [EOS]])  # (1, S)
    with torch.no_grad():
        memory = model.encode(src, output_attentions=True)
        generated = generate(model, src, max_len=task.max_target_tokens + 1).tolist()[0]
        tgt = torch.tensor([[BOS] + [i for i in generated if i != EOS]])  # (1, T)
        dec = model.decode(tgt, memory.last_hidden_state, output_attentions=True)
    assert dec_self["queries"] == [task.tokenizer.vocab[i] for i in tgt[0].tolist()]
    for group, expected in (
        (enc, memory.attentions),
        (dec_self, dec.decoder_attentions),
        (cross, dec.cross_attentions),
    ):
        np.testing.assert_allclose(np.array(group["weights"]), _stack(expected), rtol=0, atol=1e-6)
    causal = np.triu(np.ones((len(tgt[0]),) * 2, dtype=bool), k=1)
    assert (np.array(dec_self["weights"])[..., causal] == 0).all()  # nothing attends to the future


def test_classification_run_page_has_the_encoders_attention(capsys, tmp_path):
    run = tmp_path / "brackets"
    assert main(["train", "--task", "brackets", "--steps", "2", "--out", str(run), *TINY]) == 0
    rc, _, err = _run(capsys, "attention", run, "( [ ] )", "--html", tmp_path / "b.html")
    assert rc == 0 and "1 kind of attention, 2 layers x 2 heads, 5 tokens" in err
    (group,) = read_page_data(tmp_path / "b.html")["groups"]
    assert group["queries"] == group["keys"] == ["<bos>", "(", "[", "]", ")"]
    loaded = load_run(run)
    model, source, _ = loaded.model, loaded.objective, loaded.config
    task = source.source.task
    with torch.no_grad():
        out = model(torch.tensor([[BOS] + task.tokenizer.encode("( [ ] )")]), output_attentions=True)
    np.testing.assert_allclose(np.array(group["weights"]), _stack(out.attentions), rtol=0, atol=1e-6)


def test_bad_arguments(capsys, tmp_path, reverse_run):
    def error(*argv):
        rc, _, err = _run(capsys, "attention", *argv)
        assert rc == 2 and err.count("\n") == 1 and err.startswith("tformer attention: error: "), err
        return err

    assert re.search(
        r"--html: expected a \.html file name, got '.*a\.png'",
        error(bert_dir(), "a", "--html", tmp_path / "a.png"),
    )
    assert "--out/--html: expected a PNG file (--out), an HTML file (--html) or both" in error(
        bert_dir(), "a"
    )
    assert "--layer: expected 0..1, got 2" in error(
        reverse_run, "3 1", "--html", tmp_path / "a.html", "--layer", 2
    )
    assert "TEXT: 'x' in '3 x' is not in the vocabulary" in error(
        reverse_run, "3 x", "--html", tmp_path / "a.html"
    )
    assert not (tmp_path / "a.html").exists()


@pytest.mark.slow
def test_run_page_renders_in_chromium(capsys, tmp_path, reverse_run):
    rc, _, _ = _run(capsys, "attention", reverse_run, "3 1 4 1 5", "--html", tmp_path / "r.html")
    assert rc == 0
    data = read_page_data(tmp_path / "r.html")
    report = browser_report(tmp_path / "r.html", tmp_path, screenshot=tmp_path / "r.png")
    assert [g["name"] for g in report["groups"]] == [g["name"] for g in data["groups"]]
    for got, group in zip(report["groups"], data["groups"], strict=True):
        w = np.array(group["weights"])  # (L, H, Tq, Tk)
        assert (got["query_tokens"], got["key_tokens"]) == w.shape[2:]
        assert (got["layers"], got["heads"], got["overview_maps"]) == (*w.shape[:2], w.shape[0] * w.shape[1])
        assert got["hover_query_lines"] == w.shape[3] and got["hover_query_err"] < 1e-6
