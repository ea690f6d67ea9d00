"""`tformer export RUN --hf/--onnx` on every kind of run: the same probabilities, token ids and
embeddings in transformers, sentence-transformers and onnxruntime as in tformer, tokenizers
that truncate as the run did, model cards, and directories published whole."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch
from hf_bert_fixtures import bert_dir
from text_fixtures import classification_rows, embedding_rows, seq2seq_rows, write

from tformer.cli import main
from tformer.export import onnx as tonnx
from tformer.storage import files

PROB_TOLERANCE = 1e-5  # max abs difference of probabilities, float32 (predict prints 6 decimals)
TINY = ["--d-model", "16", "--n-heads", "2", "--d-ff", "32", "--n-layers", "1", "--vocab-size", "300",
        "--steps", "4", "--eval-every", "2", "--max-tokens", "512", "--max-length", "12", "--threads", "1",
        "--quiet"]
LONG = " ".join(["the big red house by the river"] * 8)  # far past max_length 12


def _run(capsys, *argv):
    rc = main([str(a) for a in argv])
    out, err = capsys.readouterr()
    return rc, out, err


def _train(tmp, name, rows, *extra):
    data = write(tmp / f"{name}.jsonl", rows)
    out = tmp / name
    assert main(["train", "--data", str(data), "--out", str(out), *TINY, *extra]) == 0
    return out


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("runs")
    return {
        "scratch": _train(tmp, "scratch", classification_rows(60), "--pooling", "cls"),
        "scratch-mean": _train(tmp, "scratch-mean", classification_rows(60)),
        "finetuned": _train(tmp, "finetuned", classification_rows(60), "--from-pretrained", str(bert_dir()),
                            "--max-length", "16"),
        "seq2seq": _train(tmp, "seq2seq", seq2seq_rows(60)),
        "embedding": _train(tmp, "embedding", embedding_rows(60)),
    }


def _predict(capsys, run, texts, tmp_path) -> np.ndarray:
    path = tmp_path / "texts.txt"
    path.write_text("".join(t + "\n" for t in texts))
    rc, out, _ = _run(capsys, "predict", run, "--file", path, "--format", "jsonl")
    assert rc == 0
    rows = [json.loads(line) for line in out.splitlines()]
    return np.array([list(r["probabilities"].values()) for r in rows])


def _hf_probabilities(directory, texts) -> np.ndarray:
    from transformers import AutoModelForSequenceClassification, AutoTokenizer

    model = AutoModelForSequenceClassification.from_pretrained(str(directory)).eval()
    tokenizer = AutoTokenizer.from_pretrained(str(directory))
    batch = tokenizer(texts, padding=True, truncation=True, return_tensors="pt")
    with torch.no_grad():
        return model(**batch).logits.softmax(-1).numpy()


TEXTS = ["the cat sat on the mat", "a big red house by the river", "dog", LONG]


@pytest.mark.parametrize("kind", ["finetuned", "scratch"])
def test_classifier_runs_load_in_transformers_with_the_runs_probabilities(capsys, tmp_path, runs, kind):
    run = runs[kind]
    config = json.loads(next((run / "checkpoints").glob("step-*/config.json")).read_text())
    out = tmp_path / "hf"
    rc, _, err = _run(capsys, "export", run, "--hf", out)
    assert config["pooler"] and config["pooling"] == "cls"
    assert rc == 0, err
    expected = _predict(capsys, run, TEXTS, tmp_path)
    got = _hf_probabilities(out, TEXTS)
    diff = np.abs(got - expected).max()
    assert diff <= PROB_TOLERANCE, f"max |probability difference| {diff:.2e}"
    tokenizer_config = json.loads((out / "tokenizer_config.json").read_text())
    max_length = 16 if kind == "finetuned" else 12
    assert tokenizer_config["model_max_length"] == max_length
    assert json.loads((out / "tokenizer.json").read_text())["truncation"]["max_length"] == max_length
    card = (out / "README.md").read_text()
    assert "accuracy" in card and f"tformer export {run} --hf {out}" in card and "animal, place" in card


def test_a_mean_pooled_classifier_says_so_in_its_config_and_is_refused_by_hf_in_one_line(
        capsys, tmp_path, runs):
    run = runs["scratch-mean"]
    config = json.loads(next((run / "checkpoints").glob("step-*/config.json")).read_text())
    assert config["pooling"] == "mean" and not config["pooler"]  # config.json says what it does
    rc, _, err = _run(capsys, "export", run, "--hf", tmp_path / "hf")
    assert rc == 2 and err.count("\n") == 1 and "train with --pooling cls" in err
    assert not (tmp_path / "hf").exists()


def test_the_exported_tokenizer_truncates_as_the_run_did_even_without_truncation_flag(runs, tmp_path, capsys):
    from tokenizers import Tokenizer

    out = tmp_path / "hf"
    assert _run(capsys, "export", runs["finetuned"], "--hf", out)[0] == 0
    assert len(Tokenizer.from_file(str(out / "tokenizer.json")).encode(LONG).ids) == 16


def test_seq2seq_run_exports_to_transformers_and_generates_the_same_text(capsys, tmp_path, runs):
    from transformers import AutoModelForSeq2SeqLM, AutoTokenizer

    run, out = runs["seq2seq"], tmp_path / "hf"
    rc, _, err = _run(capsys, "export", run, "--hf", out)
    assert rc == 0 and "PegasusForConditionalGeneration" in err  # the data runs' default is pre-norm
    sources = ["the cat sat", "hello world, fine. yes!", LONG]
    path = tmp_path / "sources.txt"
    path.write_text("".join(s + "\n" for s in sources))
    rc, expected, _ = _run(capsys, "generate", run, "--file", path, "--max-len", 12)
    assert rc == 0
    model = AutoModelForSeq2SeqLM.from_pretrained(str(out)).eval()
    tokenizer = AutoTokenizer.from_pretrained(str(out))
    batch = tokenizer(sources, padding=True, truncation=True, return_tensors="pt")
    with torch.no_grad():
        ids = model.generate(**batch)
    got = tokenizer.batch_decode(ids, skip_special_tokens=True)
    assert got == expected.splitlines()
    assert "# seq2seq" in (out / "README.md").read_text() or "seq2seq model" in (out / "README.md").read_text()


def test_embedding_run_onnx_gives_the_sentence_transformers_embeddings(capsys, tmp_path, runs):
    import onnxruntime as ort
    from sentence_transformers import SentenceTransformer

    run, out = runs["embedding"], tmp_path / "emb.onnx"
    rc, _, err = _run(capsys, "export", run, "--onnx", out)
    assert rc == 0 and "max abs diff" in err
    st = SentenceTransformer(str(run), device="cpu")
    texts = ["the cat sat", "café naïve Straße 東京"]
    expected = st.encode(texts, convert_to_numpy=True)
    batch = st.tokenizer(texts, padding=True, truncation=True, return_tensors="np")
    session = ort.InferenceSession(str(out), providers=["CPUExecutionProvider"])
    feed = {i.name: batch[i.name].astype(np.int64) for i in session.get_inputs()}
    (got,) = session.run(None, feed)
    assert np.abs(got - expected).max() <= tonnx.TOLERANCE


def test_classifier_run_onnx_gives_the_runs_probabilities(capsys, tmp_path, runs):
    import onnxruntime as ort
    from transformers import AutoTokenizer

    run, out = runs["finetuned"], tmp_path / "clf.onnx"
    assert _run(capsys, "export", run, "--onnx", out)[0] == 0
    hf = tmp_path / "hf"
    assert _run(capsys, "export", run, "--hf", hf)[0] == 0
    batch = AutoTokenizer.from_pretrained(str(hf))(TEXTS, padding=True, truncation=True, return_tensors="np")
    session = ort.InferenceSession(str(out), providers=["CPUExecutionProvider"])
    (logits,) = session.run(None, {i.name: batch[i.name].astype(np.int64) for i in session.get_inputs()})
    got = torch.tensor(logits).softmax(-1).numpy()
    assert np.abs(got - _predict(capsys, run, TEXTS, tmp_path)).max() <= PROB_TOLERANCE


def test_seq2seq_run_onnx_is_a_folder_with_encoder_decoder_tokenizer_and_card(capsys, tmp_path, runs):
    out = tmp_path / "onnx"
    rc, _, err = _run(capsys, "export", runs["seq2seq"], "--onnx", out)
    assert rc == 0 and "max abs diff" in err
    assert sorted(p.name for p in out.iterdir()) == ["README.md", "decoder.onnx", "encoder.onnx",
                                                     "tokenizer.json", "tokenizer_config.json"]


def test_synthetic_task_runs_refuse_hf_in_one_line(capsys, tmp_path):
    run = tmp_path / "rev"
    assert main(["train", "--task", "reverse", "--steps", "2", "--out", str(run), "--d-model", "16",
                 "--n-heads", "2", "--d-ff", "32", "--n-layers", "1", "--batch-size", "8", "--valid-size",
                 "8", "--test-size", "8", "--threads", "1", "--quiet"]) == 0
    rc, _, err = _run(capsys, "export", run, "--hf", tmp_path / "hf")
    assert rc == 2 and err.count("\n") == 1 and "synthetic-task run" in err


# D2: one publisher, foreign files never overwritten, never a mixed directory ------------------
def test_a_folder_of_user_files_is_refused_and_left_unchanged(capsys, tmp_path, runs):
    user = tmp_path / "mine"
    user.mkdir()
    (user / "config.json").write_text('{"mine": 1}')
    (user / "README.md").write_text("my notes")
    for option in ("--hf", "--onnx"):
        run = runs["finetuned"] if option == "--hf" else runs["seq2seq"]
        rc, _, err = _run(capsys, "export", run, option, user)
        assert rc == 2 and err.count("\n") == 1, err
        assert f"{option}: expected a new or empty folder" in err and "config.json" in err
    assert sorted(p.name for p in user.iterdir()) == ["README.md", "config.json"]
    assert (user / "config.json").read_text() == '{"mine": 1}'
    assert (user / "README.md").read_text() == "my notes"


def _snapshot(directory: Path) -> dict[str, bytes]:
    return {p.name: p.read_bytes() for p in sorted(directory.iterdir())}


@pytest.mark.parametrize("kind", ["finetuned", "seq2seq"])
def test_a_failure_at_every_durable_step_leaves_the_old_export_or_the_new_one(capsys, tmp_path, runs,
                                                                               monkeypatch, kind):
    out = tmp_path / "hf"
    assert _run(capsys, "export", runs[kind], "--hf", out)[0] == 0
    old = _snapshot(out)
    (out / "README.md").write_bytes(old["README.md"] + b"\nold export\n")  # tell old from new apart
    old = _snapshot(out)
    steps = []
    monkeypatch.setattr(files, "fault_hook", steps.append)
    assert _run(capsys, "export", runs[kind], "--hf", out)[0] == 0
    new = _snapshot(out)
    assert len(steps) >= 5 and new != old
    for k in range(1, len(steps) + 1):
        (out / "README.md").write_bytes(old["README.md"])  # back to the old export
        for name in set(new) - set(old):
            (out / name).unlink()
        for name, data in old.items():
            (out / name).write_bytes(data)

        def fail(what, k=k, count=[0]):  # noqa: B006 - a counter per k
            count[0] += 1
            if count[0] == k:
                raise OSError(28, "No space left on device (injected)")

        monkeypatch.setattr(files, "fault_hook", fail)
        rc, _, err = _run(capsys, "export", runs[kind], "--hf", out)
        assert rc != 0 and err.count("\n") == 1, err
        assert _snapshot(out) == old, f"step {k}: a mixed directory"
        assert [p.name for p in tmp_path.iterdir() if p.name.startswith(".")] == []  # no temp left


def test_the_seq2seq_onnx_folder_goes_through_the_same_publisher(capsys, tmp_path, runs, monkeypatch):
    fake = {"encoder.onnx": b"enc", "decoder.onnx": b"dec"}
    monkeypatch.setattr(tonnx, "seq2seq_onnx_files", lambda model, scratch, opset=18: (dict(fake), 0.0))
    out = tmp_path / "onnx"
    assert _run(capsys, "export", runs["seq2seq"], "--onnx", out)[0] == 0
    old = _snapshot(out)
    fake.update({"encoder.onnx": b"enc2", "decoder.onnx": b"dec2"})
    monkeypatch.setattr(files, "fault_hook", lambda what: (_ for _ in ()).throw(OSError(5, "injected"))
                        if "decoder.onnx" in what else None)
    assert _run(capsys, "export", runs["seq2seq"], "--onnx", out)[0] != 0
    assert _snapshot(out) == old


def test_a_kill_mid_export_leaves_the_old_export(capsys, tmp_path, runs):
    """A real SIGKILL at the 3rd durable step of a second export over the first."""
    out = tmp_path / "hf"
    assert _run(capsys, "export", runs["finetuned"], "--hf", out)[0] == 0
    old = _snapshot(out)
    env = dict(os.environ, TFORMER_KILL_AT_WRITE="3")
    proc = subprocess.run([sys.executable, "-m", "tformer", "export", str(runs["finetuned"]), "--hf",
                           str(out)], env=env, capture_output=True, text=True)
    assert proc.returncode == -9, proc.stderr
    assert _snapshot(out) == old


def test_exporters_do_not_import_training():
    """The circle hf_classifier -> training.loop -> objectives -> hf_classifier is cut."""
    code = ("import sys, tformer.export.hf_classifier, tformer.export.hf_seq2seq, tformer.export.onnx; "
            "print([m for m in sys.modules if m.startswith('tformer.training')])")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "[]"


def test_a_checkpoint_or_an_hf_export_given_as_model_dir_is_refused_naming_what_to_export(capsys, tmp_path,
                                                                                           runs):
    run = runs["finetuned"]
    checkpoint = next((run / "checkpoints").glob("step-*"))
    rc, _, err = _run(capsys, "export", checkpoint, "--onnx", tmp_path / "a.onnx")
    assert rc == 2 and err.count("\n") == 1 and f"is one checkpoint of the run {run}" in err
    hf = tmp_path / "hf"
    assert _run(capsys, "export", run, "--hf", hf)[0] == 0
    rc, _, err = _run(capsys, "export", hf, "--onnx", tmp_path / "a.onnx")
    assert rc == 2 and err.count("\n") == 1 and "BertForSequenceClassification directory" in err
    assert "tformer export RUN --onnx" in err and not (tmp_path / "a.onnx").exists()
