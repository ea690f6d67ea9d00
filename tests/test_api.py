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
    (alone,) = run.predict("a big cat")  # one str is one text; alone, not in a batch of two,
    assert alone["label"] == out[0]["label"]  # it may run other kernels: scores equal to 1e-6
    assert alone["probabilities"] == pytest.approx(out[0]["probabilities"], abs=1e-6)
    onnx = again.export(onnx=tmp_path / "onnx")  # and out, as `tformer export` writes it
    assert (onnx / "model.onnx").stat().st_size > 0 and (onnx / "tokenizer.json").is_file()


def test_quiet_is_taken_as_the_command_line_takes_it(tmp_path, capsys):
    tformer.train(task="reverse", out=str(tmp_path / "run"), quiet=True, steps=2, d_model=16, n_heads=2,
                  d_ff=16, n_layers=1, valid_size=8, test_size=8, threads=1)
    assert "steps" not in capsys.readouterr().err  # no progress bar


def test_seq2seq_and_embedding_runs_from_files(tmp_path):
    s2s = tformer.train(data=str(write(tmp_path / "s.jsonl", seq2seq_rows())), out=str(tmp_path / "a"), **TINY)
    outputs = s2s.generate(["the cat sat", "hello world"])
    assert isinstance(s2s, tformer.Seq2SeqRun) and not hasattr(s2s, "predict")
    assert s2s.generate("the cat sat") == outputs[:1]
    assert len(outputs) == 2 and all(isinstance(o, str) for o in outputs)
    short = s2s.generate(["the cat sat", "hello world"], max_len=1)  # --max-len reaches decoding
    assert all(len(s2s.objective.tokenizer.pieces([o])[0]) <= 2 for o in short if o)
    # Beam search's peers' rule (early_stopping) from the Run, as `tformer generate --early-stopping`
    beams = s2s.generate(["the cat sat", "hello world"], beam_size=3, early_stopping=True)
    assert len(beams) == 2 and all(isinstance(o, str) for o in beams)
    assert set(s2s.evaluate(data=seq2seq_rows()[:8], beam_size=2, early_stopping=True)) >= {"examples"}
    with pytest.raises(ValueError, match=r"early_stopping: .*expected beam_size >= 2 with it, got beam_size 1"):
        s2s.generate("the cat sat", early_stopping=True)
    with pytest.raises(TypeError, match=r"early_stopping: expected True or False, got 'yes'"):
        s2s.generate("the cat sat", beam_size=2, early_stopping="yes")
    emb = tformer.train(data=embedding_rows(), out=str(tmp_path / "b"), **TINY)
    vectors = emb.embed(["a cat", "a dog", "a cat"])
    assert isinstance(emb, tformer.EmbeddingRun) and not hasattr(emb, "predict")
    assert vectors.shape == (3, 32) and np.allclose(np.linalg.norm(vectors, axis=1), 1, atol=1e-5)
    assert np.allclose(vectors[0], vectors[2], atol=1e-6)
    # No texts: (0, D) float32 from every entry point (the run's embed raised; the library's did not)
    from tformer.embeddings.sentence import SentenceEncoder

    st = SentenceEncoder.from_pretrained(tmp_path / "b")
    for none in (emb.embed([]), emb.embed(iter(())), st.encode([])):
        assert none.shape == (0, 32) and none.dtype == np.float32
    assert emb.dim == st.dim == 32


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


@pytest.mark.parametrize("data, message", [
    (5, r"data: expected a file path \(str or Path\) or records \(an iterable of dicts\), got int"),
    ({}, r"got dict \(one record\? pass a list of them\)"),
    ({"text": "a", "label": "x"}, r"got dict \(one record\? pass a list of them\)"),
    ([], r"data: expected at least one record, got none"),
    (b'{"text": "a", "label": "x"}', r"got bytes"),
    ([{"text": "a", "label": object()}], r"data\[0\]: expected JSON values"),
    ([{"text": "a cat", "label": 1}, {"text": "a dog", "label": 2.5}], r"label: expected a class name"),
    ("missing.jsonl", r"missing\.jsonl: no such file"),
])
def test_a_failed_train_raises_and_leaves_no_directory(tmp_path, monkeypatch, data, message):
    monkeypatch.chdir(tmp_path)  # the default run directory: runs/NAME-TIME, here
    with pytest.raises((ValueError, FileNotFoundError), match=message):
        tformer.train(data=data, **TINY)
    with pytest.raises(ValueError, match=r"d_modle"):  # an unknown option: nothing written either
        tformer.train(data=classification_rows(20), d_modle=8, **TINY)
    assert list(tmp_path.iterdir()) == []


def test_a_failed_train_into_out_leaves_nothing_there(tmp_path):
    out = tmp_path / "a" / "run"
    with pytest.raises(ValueError, match=r"data: expected at least one record"):
        tformer.train(data=[], out=str(out), **TINY)
    rows = classification_rows(40) + [{"text": "a cat", "label": [1]}]
    with pytest.raises(ValueError, match=r"label: expected a class name"):
        tformer.train(data=rows, out=str(out), **TINY)
    assert list(tmp_path.iterdir()) == []


def test_a_str_is_one_input_and_empty_inputs_are_refused_as_the_cli_refuses_them(tmp_path, capsys):
    from tformer.commands.cli import main

    run = tformer.train(data=classification_rows(60), out=str(tmp_path / "run"), **TINY)
    assert len(run.predict("one text")) == 1
    assert run.predict("a big cat") == run.predict(["a big cat"])
    for bad, message in (([""], r"texts\[0\]: expected a non-empty text, got ''"),
                         ("  ", r"texts: expected a non-empty text, got '  '"),
                         ([], r"texts: expected at least one text, got none")):
        with pytest.raises(ValueError, match=message):
            run.predict(bad)
    with pytest.raises(TypeError, match=r"texts: expected a str or an iterable of str, got bytes"):
        run.predict(b"a cat")
    assert main(["predict", str(tmp_path / "run"), ""]) == 2  # the command line refuses it too,
    assert "TEXT 1: expected a text, got ''" in capsys.readouterr().err  # naming the argument


def test_one_rule_for_labels_whole_numbers_are_their_integer_text(tmp_path):
    """1, 1.0 and "1" are one label (as in a CSV file); true/false are "true"/"false"; 2.5 is
    refused (tformer.training.records.label_name)."""
    rows = [{"text": r["text"], "label": [1, 1.0, "1"][i % 3] if r["label"] == "animal" else True}
            for i, r in enumerate(classification_rows(60))]
    run = tformer.train(data=rows, out=str(tmp_path / "run"), **TINY)
    assert run.labels == ["1", "true"]
    assert set(run.predict("a big cat")[0]["probabilities"]) == {"1", "true"}


def test_a_train_refused_because_another_process_took_its_out_first_leaves_that_run_alone(
        tmp_path, monkeypatch):
    """Two trains started together into one new out: both saw no folder. The one refused as
    "in use" removed it as its own failed run, while the other trained in it."""
    import tformer.kinds.api as api
    from tformer.storage.rundir import RunLock

    out = tmp_path / "run"
    peer = []

    def the_other_process_starts_first(*args, **kwargs):  # between the check and the lock
        out.mkdir()
        peer.append(RunLock(out))  # (a second flock, on its own descriptor, conflicts as a process's)
        (out / "tokenizer.json").write_text("{}")
        return real(*args, **kwargs)

    real = api.train_run
    monkeypatch.setattr(api, "train_run", the_other_process_starts_first)
    with pytest.raises(ValueError, match="is in use by another tformer process"):
        tformer.train(data=write(tmp_path / "d.jsonl", classification_rows(20)), out=str(out), **TINY)
    assert (out / "tokenizer.json").is_file()
    peer[0].release()


@pytest.mark.parametrize("options, error, message", [
    (dict(out=5), TypeError, r"^out: expected a run directory \(str or os\.PathLike\), got int$"),
    (dict(log=5), TypeError, r"^log: expected a callable taking a line \(e\.g\. print\), got int$"),
])
def test_train_refuses_an_argument_of_another_type_before_training(tmp_path, monkeypatch, options, error,
                                                                   message):
    # out=5 was pathlib's bare TypeError; log=5 failed at the first line logged, mid-training.
    monkeypatch.chdir(tmp_path)
    with pytest.raises(error, match=message):
        tformer.train(task="reverse", **{**TINY, "log": print, **options})
    assert not list(tmp_path.iterdir())
