"""The pretrained-model commands: embed, similarity, search, attention, plot-positions."""

from __future__ import annotations

import json
import re

import matplotlib.image
import numpy as np
import torch
from helpers import assert_close
from hf_bert_fixtures import SENTENCES, bert_dir, copy_dir, st_dir
from safetensors.torch import load_file, save_file

from tformer.commands.cli import main
from tformer.embeddings.sentence import SentenceEncoder
from tformer.training.viz.plots import DPI, PANEL_INCHES

LONG = " ".join(["cat"] * 100)  # 102 tokens: past the 64 positions (and the ST's 16)


def _run(capsys, *argv):
    rc = main([str(a) for a in argv])
    out, err = capsys.readouterr()
    return rc, out, err


def _one_line_error(rc, err, command, pattern):
    assert rc == 2
    assert err.count("\n") == 1 and "Traceback" not in err, err
    assert err.startswith(f"tformer {command}: error: ")
    assert re.search(pattern, err), err


# embed ----------------------------------------------------------------------------------------
def test_embed_prints_json_lines(capsys):
    rc, out, _ = _run(capsys, "embed", st_dir(), *SENTENCES[:2])
    assert rc == 0
    rows = [json.loads(line) for line in out.splitlines()]
    assert [r["text"] for r in rows] == SENTENCES[:2]
    expected = SentenceEncoder.from_pretrained(st_dir()).encode(SENTENCES[:2])
    assert_close(np.array([r["embedding"] for r in rows]), expected)


def test_embed_file_to_npy_and_jsonl(capsys, tmp_path):
    lines = tmp_path / "lines.txt"
    lines.write_text("\n".join(SENTENCES[2:]) + "\n")
    rc, _, err = _run(
        capsys,
        "embed",
        st_dir(),
        *SENTENCES[:2],
        "--file",
        lines,
        "--out",
        tmp_path / "e.npy",
        "--batch-size",
        2,
    )
    assert rc == 0 and "wrote 5 embeddings of dimension 32" in err
    emb = np.load(tmp_path / "e.npy")
    assert_close(emb, SentenceEncoder.from_pretrained(st_dir()).encode(SENTENCES))
    rc, _, _ = _run(
        capsys, "embed", st_dir(), "--file", lines, "--out", tmp_path / "e.jsonl", "--no-normalize"
    )
    rows = [json.loads(line) for line in (tmp_path / "e.jsonl").read_text().splitlines()]
    assert [r["text"] for r in rows] == SENTENCES[2:]
    assert not np.isclose(np.linalg.norm(rows[0]["embedding"]), 1.0)


def test_embed_bad_arguments(capsys, tmp_path):
    rc, _, err = _run(capsys, "embed", st_dir())
    _one_line_error(rc, err, "embed", r"TEXT: expected at least 1 text\(s\)")
    rc, _, err = _run(capsys, "embed", st_dir(), "a", "--out", tmp_path / "x.csv")
    _one_line_error(rc, err, "embed", r"--out: expected a \.npy or \.jsonl file name")
    rc, _, err = _run(capsys, "embed", st_dir(), "--file", tmp_path / "none.txt")
    _one_line_error(rc, err, "embed", r"--file .*none\.txt: no such file")
    # A blank argument was embedded while a blank --file line was refused (and generate, predict,
    # search and similarity refused a blank argument): refused, naming it, as they do.
    rc, out, err = _run(capsys, "embed", st_dir(), "a dog", " ")
    _one_line_error(rc, err, "embed", r"TEXT 2: expected a text, got ' ' \(every argument is one input\)$")
    assert out == ""


def test_long_text_truncates_with_a_warning_or_fails_with_no_truncate(capsys):
    rc, out, err = _run(capsys, "embed", st_dir(), LONG, "a dog")
    assert rc == 0 and len(out.splitlines()) == 2
    assert err.startswith(
        "tformer embed: warning: 1 of 2 texts are longer than the model's "
        "maximum length (16 tokens; the longest has 102)"
    )
    rc, _, err = _run(capsys, "embed", st_dir(), "a dog", LONG, "--no-truncate")
    _one_line_error(rc, err, "embed", r"TEXT 2: expected at most 16 tokens .* got 102")


def test_a_files_long_lines_are_counted_once_and_named_by_line(capsys, tmp_path, monkeypatch):
    """A file is embedded a chunk at a time: 3 long lines of 9 in chunks of 2 gave a warning a
    chunk ("1 of 2 texts", the same words twice, shown once), and --no-truncate named a text's
    place in its chunk. One warning for the file, naming the lines; the error names the line."""
    import tformer.embeddings.index
    import tformer.embeddings.stream

    monkeypatch.setattr(tformer.embeddings.stream, "CHUNK", 2)
    lines = ["a dog"] * 9
    for i in (0, 4, 6):
        lines[i] = LONG
    f = tmp_path / "t.txt"
    f.write_text("\n".join(lines) + "\n")
    rc, _, err = _run(capsys, "embed", st_dir(), "--file", f, "--out", tmp_path / "e.npy")
    assert rc == 0 and err.count("warning") == 1
    assert ("warning: 3 of 9 texts are longer than the model's maximum length (16 tokens; the longest "
            f"has 102), so they were truncated: --file {f}:1, --file {f}:5, --file {f}:7") in err
    rc, _, err = _run(capsys, "embed", st_dir(), "--file", f, "--no-truncate")
    _one_line_error(rc, err, "embed", rf"--file {f}:1: expected at most 16 tokens .* got 102")
    # An argument first: the file's line 1 is input 2, named by its line ("input 2" said neither).
    rc, _, err = _run(capsys, "embed", st_dir(), "a cat", "--file", f, "--no-truncate")
    _one_line_error(rc, err, "embed", rf"--file {f}:1: expected at most 16 tokens .* got 102")


UNREAD = "a" * 40_000 + " hello world"  # one [UNK] to the reach (16,384 characters), the rest never read
READ_ONLY = "read only to its first 16,384 characters of 40,012 (tokenizing stops there when no cut to 16"


def test_a_text_read_only_to_its_reach_is_named_as_cut_by_every_embedding_command(capsys, tmp_path):
    """Its prefix held 3 tokens, under the 16 of the directory: the commands embedded [CLS]
    [UNK] [SEP] and dropped "hello world" with no word, and --no-truncate took it. Now each
    warns that it was read only so far (its token count is not known), or refuses it in one line."""
    rc, out, err = _run(capsys, "embed", st_dir(), UNREAD, "a dog")
    assert rc == 0 and len(out.splitlines()) == 2
    assert err == ("tformer embed: warning: 1 of 2 texts were read only to their first 16,384 characters "
                   "(of 40,012 in the longest: tokenizing stops there when no cut to 16 tokens is in sight), "
                   "so they were truncated: TEXT 1 (--no-truncate raises instead)\n"), err
    rc, _, err = _run(capsys, "embed", st_dir(), "a dog", UNREAD, "--no-truncate")
    _one_line_error(rc, err, "embed", rf"error: TEXT 2: {re.escape(READ_ONLY)} tokens is in sight\), so the "
                                      r"rest would be lost; shorten it or allow truncation$")
    rc, _, err = _run(capsys, "similarity", st_dir(), UNREAD, "a dog")
    assert rc == 0 and "warning: 1 of 2 texts were read only to their first 16,384 characters" in err, err
    assert "so they were truncated: [0] (TEXT 1) (" in err, err
    rc, _, err = _run(capsys, "similarity", st_dir(), "a dog", UNREAD, "--no-truncate")
    _one_line_error(rc, err, "similarity", rf"error: TEXT 2: {re.escape(READ_ONLY)}")
    corpus = tmp_path / "c.txt"
    corpus.write_text(f"a dog\n{UNREAD}\n")
    for argv in (["index", "build", st_dir(), "--out", tmp_path / "idx"], ["search", st_dir(), "q"]):
        rc, _, err = _run(capsys, *argv, "--corpus", corpus, "--no-truncate")
        _one_line_error(rc, err, argv[0], rf"--corpus {corpus}:2: {re.escape(READ_ONLY)}")
        rc, _, err = _run(capsys, *argv, "--corpus", corpus)
        assert rc == 0 and "were read only to their first 16,384 characters" in err, err
        assert f"so they were truncated: --corpus {corpus}:2 (" in err, err
    clean = tmp_path / "clean.txt"
    clean.write_text("a dog\nthe cat\n")
    rc, _, err = _run(capsys, "search", st_dir(), UNREAD, "--corpus", clean)
    assert rc == 0 and "1 of 1 queries were read only to their first 16,384 characters" in err, err
    assert err.rstrip().endswith("so they were truncated: QUERY 1 (--no-truncate refuses instead)"), err
    rc, _, err = _run(capsys, "search", st_dir(), UNREAD, "--corpus", clean, "--no-truncate")
    _one_line_error(rc, err, "search", rf"error: QUERY 1: {re.escape(READ_ONLY)}")


def test_index_and_search_name_a_long_corpus_line_by_file_and_line(capsys, tmp_path):
    corpus = tmp_path / "c.txt"
    corpus.write_text(f"a dog\n{LONG}\n")
    for argv in (["index", "build", st_dir(), "--out", tmp_path / "idx"], ["search", st_dir(), "q"]):
        rc, _, err = _run(capsys, *argv, "--corpus", corpus, "--no-truncate")
        _one_line_error(rc, err, argv[0], rf"--corpus {corpus}:2: expected at most 16 tokens .* got 102")
        rc, _, err = _run(capsys, *argv, "--corpus", corpus)
        assert rc == 0 and f"so they were truncated: --corpus {corpus}:2 (" in err, err


# similarity and search --------------------------------------------------------------------------
def test_similarity_prints_the_cosine_matrix(capsys):
    rc, out, _ = _run(capsys, "similarity", st_dir(), *SENTENCES[:3])
    assert rc == 0
    lines = out.splitlines()
    assert lines[:3] == [f"[{i}] {t}" for i, t in enumerate(SENTENCES[:3])]
    matrix = np.array([[float(v) for v in line.split()[1:]] for line in lines[4:]])
    emb = SentenceEncoder.from_pretrained(st_dir()).encode(SENTENCES[:3])
    np.testing.assert_allclose(matrix, emb @ emb.T, atol=1e-3)  # printed with 3 decimals
    np.testing.assert_allclose(np.diag(matrix), 1.0)
    rc, _, err = _run(capsys, "similarity", st_dir(), "only one")
    _one_line_error(rc, err, "similarity", r"TEXT: expected at least 2 text\(s\)")


def test_search_finds_the_line_itself_first(capsys, tmp_path):
    corpus = tmp_path / "corpus.txt"
    corpus.write_text("\n".join(SENTENCES) + "\n")
    rc, out, _ = _run(capsys, "search", bert_dir(), "--corpus", corpus, SENTENCES[3], "-k", 2)
    assert rc == 0
    lines = out.splitlines()
    assert lines[0] == f"query: {SENTENCES[3]}"
    assert lines[1] == f"  1. 1.0000  line 4: {SENTENCES[3]}"
    assert len(lines) == 3
    rc, _, err = _run(capsys, "search", bert_dir(), "--corpus", corpus, "q", "-k", 0)
    _one_line_error(rc, err, "search", r"--top-k: expected >= 1, got 0")


def test_search_prints_each_result_on_one_line(capsys, tmp_path):
    """A form feed or U+2028 inside a corpus line was printed raw: a line-based reader
    (str.splitlines) saw more result lines than results. They print escaped."""
    corpus = tmp_path / "corpus.txt"
    corpus.write_text("a\x0cb\nline\u2028two\nthird\n", encoding="utf-8")
    rc, out, _ = _run(capsys, "search", bert_dir(), "--corpus", corpus, "a\u2029query", "-k", 3)
    assert rc == 0 and len(out.splitlines()) == 4
    assert out.splitlines()[0] == "query: a\\u2029query"
    assert {"line 1: a\\x0cb", "line 2: line\\u2028two"} <= {line.split("  ", 2)[-1] for line in out.splitlines()}


def test_index_build_then_search_gives_what_search_on_the_corpus_gives(capsys, tmp_path,
                                                                       monkeypatch):
    import tformer.embeddings.index
    import tformer.embeddings.stream

    corpus = tmp_path / "corpus.txt"
    corpus.write_text("\n".join(SENTENCES) + "\n")
    rc, whole, _ = _run(capsys, "search", bert_dir(), "--corpus", corpus, SENTENCES[3], "a cat",
                        "-k", 3)
    monkeypatch.setattr(tformer.embeddings.stream, "CHUNK", 2)  # the corpus in 3 chunks, blocks of 2
    monkeypatch.setattr(tformer.embeddings.index, "BLOCK", 2)
    rc, direct, _ = _run(capsys, "search", bert_dir(), "--corpus", corpus, SENTENCES[3], "a cat",
                         "-k", 3)
    assert rc == 0 and direct == whole
    rc, _, err = _run(capsys, "index", "build", bert_dir(), "--corpus", corpus,
                      "--out", tmp_path / "idx")
    assert rc == 0 and "wrote" in err and "5 vectors" in err
    rc, indexed, _ = _run(capsys, "search", tmp_path / "idx", SENTENCES[3], "a cat", "-k", 3)
    assert rc == 0 and indexed == direct
    # Another model (same shapes, other weights) is refused.
    other = copy_dir(bert_dir(), tmp_path / "other")
    state = load_file(str(other / "model.safetensors"))
    state[next(iter(state))] += 1
    save_file(state, str(other / "model.safetensors"))
    rc, _, err = _run(capsys, "search", tmp_path / "idx", "q", "--model", other)
    _one_line_error(rc, err, "search", r"built with the model .* rebuild it")
    # A changed model directory is refused too.
    rc, _, err = _run(capsys, "index", "build", other, "--corpus", corpus, "--out", tmp_path / "i2")
    (other / "vocab.txt").write_text((other / "vocab.txt").read_text() + "extra\n")
    rc, _, err = _run(capsys, "search", tmp_path / "i2", "q")
    _one_line_error(rc, err, "search", r"built with the model")


def test_embed_out_errors_are_one_line(capsys, tmp_path):
    (tmp_path / "d.npy").mkdir()
    rc, _, err = _run(capsys, "embed", st_dir(), "a", "--out", tmp_path / "d.npy")
    _one_line_error(rc, err, "embed", r"--out .*d\.npy: is a directory")


def test_embed_streams_and_resumes_an_interrupted_file(capsys, tmp_path, monkeypatch):
    import tformer.embeddings.index
    import tformer.embeddings.stream
    from tformer.storage import files

    monkeypatch.setattr(tformer.embeddings.stream, "CHUNK", 2)
    lines = tmp_path / "lines.txt"
    lines.write_text("\n".join(SENTENCES) + "\n")
    out = tmp_path / "e.npy"
    old = np.zeros((3, 32), dtype=np.float32)  # an earlier output of this model (width 32)
    np.save(out, old)
    calls = []

    def full_disk(what):
        calls.append(what)
        if len(calls) == 5:  # the second chunk (after the header)
            raise OSError(28, "No space left on device", what.split(" ", 1)[1])

    monkeypatch.setattr(files, "fault_hook", full_disk)
    rc, _, err = _run(capsys, "embed", st_dir(), "--file", lines, "--out", out)
    assert rc == 1 and err.count("\n") == 1 and "No space left on device" in err
    np.testing.assert_array_equal(np.load(out), old)  # the old file, whole
    monkeypatch.setattr(files, "fault_hook", None)
    rc, _, err = _run(capsys, "embed", st_dir(), "--file", lines, "--out", out)
    assert rc == 0 and "resuming" in err and "after 2 of 5" in err
    assert_close(np.load(out), SentenceEncoder.from_pretrained(st_dir()).encode(SENTENCES))
    assert sorted(p.name for p in tmp_path.iterdir()) == ["e.npy", "lines.txt"]


def test_similarity_refuses_more_texts_than_it_can_print(capsys, tmp_path):
    lines = tmp_path / "many.txt"
    lines.write_text("\n".join(f"text {i}" for i in range(101)) + "\n")
    rc, _, err = _run(capsys, "similarity", st_dir(), "--file", lines)
    _one_line_error(rc, err, "similarity", r"expected at most 100 texts .* got 101")


# attention ---------------------------------------------------------------------------------------
def test_attention_png_has_one_panel_per_layer_and_head(capsys, tmp_path):
    out = tmp_path / "attn.png"
    rc, _, err = _run(capsys, "attention", bert_dir(), "the cat sat on the mat", "--out", out)
    assert rc == 0 and "2 x 4 maps, 8 tokens" in err
    assert out.is_file() and out.stat().st_size > 10_000
    height, width = matplotlib.image.imread(out).shape[:2]
    side = PANEL_INCHES * DPI  # 8 tokens: panels keep their base size
    assert (height, width) == (round(2 * side), round(4 * side + 1.2 * DPI))  # 2 layers x 4 heads + colour bar

    rc, _, err = _run(capsys, "attention", bert_dir(), "the cat", "--out", out, "--layer", 1, "--head", 3)
    assert rc == 0 and "1 x 1 maps" in err
    assert matplotlib.image.imread(out).shape[:2] == (round(side), round(side + 1.2 * DPI))


def test_attention_bad_arguments(capsys, tmp_path):
    out = tmp_path / "attn.png"
    rc, _, err = _run(capsys, "attention", bert_dir(), "a", "--out", out, "--layer", 2)
    _one_line_error(rc, err, "attention", r"--layer: expected 0\.\.1, got 2")
    rc, _, err = _run(capsys, "attention", bert_dir(), "a", "--out", tmp_path / "a.svg")
    _one_line_error(rc, err, "attention", r"--out: expected a \.png file name")
    rc, _, err = _run(capsys, "attention", bert_dir(), LONG, "--out", out, "--no-truncate")
    _one_line_error(rc, err, "attention", r"texts\[0\]: expected at most 64 tokens .* got 102")


def test_plot_positions(capsys, tmp_path):
    rc, _, err = _run(
        capsys, "plot-positions", "--out", tmp_path / "pe.png", "--d-model", 64, "--max-len", 50
    )
    assert rc == 0 and "50 positions x 64 dimensions" in err
    assert (tmp_path / "pe.png").stat().st_size > 1000
    rc, _, err = _run(capsys, "plot-positions", "--out", tmp_path / "pe.png", "--d-model", 0)
    _one_line_error(rc, err, "plot-positions", r"--d-model: expected a positive int, got 0")
    rc, _, err = _run(capsys, "plot-positions", "--out", tmp_path / "pe.png", "--d-model", 100_000,
                      "--max-len", 100_000_000)
    _one_line_error(rc, err, "plot-positions", r"--max-len x --d-model: expected at most 16,777,216")
    assert _run(capsys, "plot-positions", "--out", tmp_path / "pe.png")[0] == 0  # its own: replaced
    theirs = tmp_path / "photo.png"
    theirs.write_bytes(b"\x89PNG\r\n\x1a\n not drawn by tformer")
    rc, _, err = _run(capsys, "plot-positions", "--out", theirs)
    _one_line_error(rc, err, "plot-positions", r"--out .*photo\.png: exists and is not a figure tformer drew")
    assert theirs.read_bytes() == b"\x89PNG\r\n\x1a\n not drawn by tformer"


# bad model directories: one line naming the file (and tensor) ------------------------------------
def test_bad_model_directories(capsys, tmp_path):
    rc, _, err = _run(capsys, "embed", tmp_path / "missing", "a")
    _one_line_error(rc, err, "embed", r"missing: no such model directory")
    (tmp_path / "empty").mkdir()
    rc, _, err = _run(capsys, "embed", tmp_path / "empty", "a")
    _one_line_error(rc, err, "embed", r"empty/config\.json: no such file")

    d = copy_dir(bert_dir(), tmp_path / "arch")
    cfg = json.loads((d / "config.json").read_text())
    (d / "config.json").write_text(json.dumps({**cfg, "architectures": ["BertForNextSentence"]}))
    rc, _, err = _run(capsys, "similarity", d, "a", "b")
    _one_line_error(rc, err, "similarity", r"architectures: expected one of .* 'BertForNext")

    d = copy_dir(bert_dir(), tmp_path / "shape")
    state = load_file(str(d / "model.safetensors"))
    state["encoder.layer.0.intermediate.dense.weight"] = torch.zeros(63, 32)
    save_file(state, str(d / "model.safetensors"), metadata={"format": "pt"})
    rc, _, err = _run(capsys, "attention", d, "a", "--out", tmp_path / "a.png")
    _one_line_error(
        rc,
        err,
        "attention",
        r"shape/model\.safetensors: tensor 'encoder\.layer\.0\."
        r"intermediate\.dense\.weight': expected shape \(64, 32\)",
    )


def test_pickle_needs_allow_pickle(capsys, tmp_path):
    d = copy_dir(bert_dir(), tmp_path / "m")
    torch.save(load_file(str(d / "model.safetensors")), d / "pytorch_model.bin")
    (d / "model.safetensors").unlink()
    rc, _, err = _run(capsys, "embed", d, "a dog")
    _one_line_error(rc, err, "embed", r"pytorch_model\.bin: refusing to load a pickle checkpoint")
    rc, out, _ = _run(capsys, "embed", d, "a dog", "--allow-pickle")
    assert rc == 0 and json.loads(out)["text"] == "a dog"


def test_attention_refuses_a_text_too_long_to_read(capsys, tmp_path):
    out = tmp_path / "a.png"
    text = " ".join(["cat"] * 50)  # 52 tokens: within the model's 64, past a grid's 48
    rc, _, err = _run(capsys, "attention", bert_dir(), text, "--out", out)
    _one_line_error(rc, err, "attention", r"TEXT: expected at most 48 tokens .* got 52; .*--layer and --head")
    assert not out.exists()
    rc, _, _ = _run(capsys, "attention", bert_dir(), text, "--out", out, "--layer", 0, "--head", 0)
    assert rc == 0 and out.is_file()
