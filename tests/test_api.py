"""The Python API: tformer.train on records or files returns a Run that predicts, generates,
embeds and evaluates like the command line; tformer.load_run gives the same object back."""

import numpy as np
import pytest
from text_fixtures import classification_rows, embedding_rows, seq2seq_rows, write

import tformer

TINY = dict(d_model=32, n_heads=2, d_ff=64, n_layers=1, vocab_size=300, max_tokens=512, threads=1,
            eval_every=4, steps=8, progress=False, log=lambda *a: None)



def test_a_list_of_dicts_trains_predicts_and_reloads(tmp_path):
    rows = classification_rows(120)
    run = tformer.train(data=rows, out=str(tmp_path / "run"), **TINY)
    assert (tmp_path / "run" / "data" / "data.jsonl").is_file()  # the run's own copy
    assert run.record["split"] == "test" and 0 <= run.record["accuracy"] <= 1
    out = run.predict(["a big cat", "the river"])
    assert [set(o) for o in out] == [{"label", "probabilities"}] * 2
    assert all(abs(sum(o["probabilities"].values()) - 1) < 1e-5 for o in out)
    again = tformer.load_run(tmp_path / "run")
    assert again.predict(["a big cat", "the river"]) == out
    metrics = again.evaluate(data=rows[:20])
    assert set(metrics) >= {"accuracy", "macro_f1", "loss"}
    assert isinstance(run, tformer.ClassificationRun) and not hasattr(run, "generate")
    assert not hasattr(run, "embed")
    assert run.predict("a big cat") == out[:1]  # one str is one text
    onnx = again.export(onnx=tmp_path / "model.onnx")  # and out, as `tformer export` writes it
    assert onnx.is_file() and onnx.stat().st_size > 0


def test_seq2seq_and_embedding_runs_from_files(tmp_path):
    s2s = tformer.train(data=str(write(tmp_path / "s.jsonl", seq2seq_rows())), out=str(tmp_path / "a"), **TINY)
    outputs = s2s.generate(["the cat sat", "hello world"])
    assert isinstance(s2s, tformer.Seq2SeqRun) and not hasattr(s2s, "predict")
    assert s2s.generate("the cat sat") == outputs[:1]
    assert len(outputs) == 2 and all(isinstance(o, str) for o in outputs)
    short = s2s.generate(["the cat sat", "hello world"], max_len=1)  # --max-len reaches decoding
    assert all(len(s2s.objective.tokenizer.pieces([o])[0]) <= 2 for o in short if o)
    emb = tformer.train(data=embedding_rows(), out=str(tmp_path / "b"), **TINY)
    vectors = emb.embed(["a cat", "a dog", "a cat"])
    assert isinstance(emb, tformer.EmbeddingRun) and not hasattr(emb, "predict")
    assert vectors.shape == (3, 32) and np.allclose(np.linalg.norm(vectors, axis=1), 1, atol=1e-5)
    assert np.allclose(vectors[0], vectors[2], atol=1e-6)


def test_bad_records_name_the_record(tmp_path):
    with pytest.raises(ValueError, match=r"data\[1\]: expected a dict of fields, got str"):
        tformer.train(data=[{"text": "a", "label": "x"}, "oops"], out=str(tmp_path / "r"), **TINY)


def test_train_on_a_named_device_and_load_on_another(tmp_path):
    """tformer.train(task="reverse", device="cpu", ...): the run trains there and says so; a
    torch.device works too; load_run(device=) places a run whatever device trained it."""
    import torch

    options = dict(TINY, steps=4, eval_every=2, valid_size=16, test_size=16, batch_size=8)
    del options["vocab_size"], options["max_tokens"]  # a synthetic task's own
    run = tformer.train(task="reverse", device="cpu", out=str(tmp_path / "r"), **options)
    assert isinstance(run, tformer.Seq2SeqRun) and run.record["device"] == "cpu"
    assert next(run.model.parameters()).device.type == "cpu"
    again = tformer.train(task="reverse", device=torch.device("cpu"), out=str(tmp_path / "r2"), **options)
    assert again.config.device == "cpu"
    assert tformer.load_run(tmp_path / "r", device=torch.device("cpu")).generate("3 1 4") == run.generate("3 1 4")
    with pytest.raises(ValueError, match=r"^device: expected auto, cpu, cuda, cuda:N or mps, got 'gpu'$"):
        tformer.load_run(tmp_path / "r", device="gpu")
