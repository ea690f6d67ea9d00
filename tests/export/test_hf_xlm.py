"""tformer.export.hf_xlm: a classifier trained with the default options (mean pooling, no
BERT pooler) exports with `tformer export RUN --hf OUT` as an XLMForSequenceClassification that
transformers loads without trust_remote_code, and gives tformer's logits one text at a time
(<= 1e-5); a padded batch fails (the padding token's id is past the vocabulary), the stated limit."""

from __future__ import annotations

import contextlib
import io
import json

import pytest
import torch
import yaml
from text_fixtures import classification_rows, write

from tformer.commands.cli import main
from tformer.kinds.api import load_run

TOLERANCE = 1e-5  # max abs difference of logits and of probabilities, float32
SIZES = ["--d-model", "16", "--n-heads", "2", "--n-layers", "1", "--vocab-size", "300", "--steps", "4",
         "--eval-every", "2", "--max-length", "12", "--threads", "1", "--quiet"]
LONG = " ".join(["the big red house by the river"] * 8)  # past max_length 12: truncated
TEXTS = ["the cat sat on the mat", "a big red house by the river", "dog", "Straße café 東京 %s", LONG]
PAIRS = [("the cat sat", "dog"), ("a big house", "river road city"), ("fish", LONG)]


def _train(tmp, name, rows, *extra):
    out = tmp / name
    argv = ["train", "--data", str(write(tmp / f"{name}.jsonl", rows)), "--out", str(out), *SIZES, *extra]
    assert main(argv) == 0
    return out


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    """Default options but the sizes: mean pooling, BERT's layout, d_ff 4 * d_model (the default
    ratio); the pair run with a narrower d_ff (32), which the export pads with zero units."""
    tmp = tmp_path_factory.mktemp("xlm")
    return {"single": _train(tmp, "single", classification_rows(60), "--d-ff", "64"),
            "pair": _train(tmp, "pair", classification_rows(60, pair=True), "--d-ff", "32")}


@pytest.fixture(scope="module")
def exported(runs, tmp_path_factory):
    """{kind: (OUT, what export printed on stderr)}."""
    tmp, done = tmp_path_factory.mktemp("hf"), {}
    for kind, run in runs.items():
        out = tmp / kind
        err = io.StringIO()
        with contextlib.redirect_stderr(err):
            assert main(["export", str(run), "--hf", str(out)]) == 0
        done[kind] = (out, err.getvalue())
    return done


def _tformer(run, text: str, pair: str | None = None):
    """tformer's token ids and logits (C,) for one input, through the run's own encoding."""
    objective = run.objective
    examples = objective.source.inputs([text], objective.inputs, None if pair is None else [pair])
    batch = objective.collate(objective.encode(examples))
    with torch.no_grad():
        logits = run.model.eval()(batch.input_ids, batch.attention_mask, batch.token_type_ids).logits
    return batch.input_ids[0].tolist(), logits[0]


def _load(out):
    from transformers import AutoModelForSequenceClassification, AutoTokenizer

    return (AutoModelForSequenceClassification.from_pretrained(str(out)).eval(),
            AutoTokenizer.from_pretrained(str(out)))


def test_the_default_classifier_is_an_xlm_directory_and_says_one_text_per_call(runs, exported):
    out, err = exported["single"]
    config = json.loads(next((runs["single"] / "checkpoints").glob("step-*/config.json")).read_text())
    assert config["pooling"] == "mean" and not config["pooler"]  # the default, as trained
    assert err.count("\n") == 1 and "XLMForSequenceClassification" in err and "one text per call" in err
    hf = json.loads((out / "config.json").read_text())
    assert (hf["architectures"], hf["model_type"], hf["summary_type"]) == (
        ["XLMForSequenceClassification"], "xlm", "mean")
    assert hf["id2label"] == {"0": "animal", "1": "place"}
    card = (out / "README.md").read_text()
    header = yaml.safe_load(card.split("---\n")[1])  # the Hub's YAML header
    assert (header["library_name"], header["pipeline_tag"]) == ("transformers", "text-classification")
    assert card.startswith("---\n") and "tformer train --data" in card
    assert "## Padding: one text per call" in card and "padding included" in card


@pytest.mark.parametrize("kind", ["single", "pair"])
def test_transformers_gives_tformers_logits_one_text_at_a_time(runs, exported, kind):
    """AutoModelForSequenceClassification and AutoTokenizer (no trust_remote_code): the same
    token ids and the same logits (<= 1e-5) on each input alone, long ones truncated."""
    run, (out, _) = load_run(runs[kind]), exported[kind]
    model, tokenizer = _load(out)
    assert type(model).__name__ == "XLMForSequenceClassification"
    inputs = PAIRS if kind == "pair" else [(t, None) for t in TEXTS]
    worst = 0.0
    for text, pair in inputs:
        ids, expected = _tformer(run, text, pair)
        batch = tokenizer(text, pair, truncation=True, return_tensors="pt")
        assert batch["input_ids"][0].tolist() == ids
        assert ("token_type_ids" in batch) == (kind == "pair")  # a single-text run folds type 0 in
        with torch.no_grad():
            got = model(**batch).logits[0]
        worst = max(worst, (got - expected).abs().max().item())
    assert worst <= TOLERANCE, f"max |logits difference| {worst:.2e}"


@pytest.mark.parametrize("kind", ["single", "pair"])
def test_pipeline_gives_predicts_labels_and_probabilities(runs, exported, kind):
    from transformers import pipeline

    # The export reads a text to its max length, as the run does with --long cut (a longer text's
    # windows are tformer's reading, not the model's).
    run, (out, _) = load_run(runs[kind]).read_long("cut"), exported[kind]
    classify = pipeline("text-classification", model=str(out), top_k=None, device="cpu")
    if kind == "pair":
        answers = classify([{"text": t, "text_pair": p} for t, p in PAIRS], truncation=True)
        expected = run.predict([t for t, _ in PAIRS], pairs=[p for _, p in PAIRS])
    else:
        answers = classify(TEXTS, truncation=True)  # a list: still one text per forward pass
        expected = run.predict(TEXTS)
    for answer, want in zip(answers, expected, strict=True):
        got = {a["label"]: a["score"] for a in answer}
        assert max(got, key=got.get) == want["label"]
        diff = max(abs(got[label] - p) for label, p in want["probabilities"].items())
        assert diff <= TOLERANCE, f"max |probability difference| {diff:.2e}"


def test_a_padded_batch_fails_loudly_where_it_would_differ(runs, exported):
    """XLM averages over the padding: a padded batch's short rows get other probabilities. With
    no pad token, transformers refused a batch with advice to pad with the EOS token, and a user
    who did got probabilities off by up to 0.19 without a word. The tokenizer pads with a token
    past the model's vocabulary: a real batched pipeline call with padding, and padding=True into
    the model, stop with an IndexError; a batch whose texts need no padding answers exactly."""
    from transformers import pipeline

    from tformer.export.hf_xlm import NO_PADDING

    run, (out, _) = load_run(runs["single"]), exported["single"]
    model, tokenizer = _load(out)
    assert tokenizer.pad_token == NO_PADDING and tokenizer.pad_token_id >= model.config.vocab_size
    classify = pipeline("text-classification", model=str(out), top_k=None, device="cpu")
    with pytest.raises(IndexError, match="index out of range"):
        classify(TEXTS, batch_size=4, truncation=True)  # padded to the longest
    with pytest.raises(IndexError, match="index out of range"):
        with torch.no_grad():
            model(**tokenizer(TEXTS[:3], padding=True, truncation=True, return_tensors="pt"))
    words = ["dog", "cat", "fish", "bird", "house", "river", "road", "city", "mat", "big"]
    by_length = {}
    for word in words:  # two texts of as many tokens: no padding in their batch
        by_length.setdefault(len(tokenizer(word)["input_ids"]), []).append(word)
    same = max(by_length.values(), key=len)[:2]
    assert len(same) == 2
    for answer, want in zip(classify(same, batch_size=2), run.predict(same), strict=True):
        got = {a["label"]: a["score"] for a in answer}
        assert max(abs(got[k] - p) for k, p in want["probabilities"].items()) <= TOLERANCE
    tokenizer.pad_token = "<pad>"  # what the card says not to do: the padded row's logits move
    long, short = "a big red house by the river", "dog"
    batch = tokenizer([long, short], padding=True, truncation=True, return_tensors="pt")
    assert batch["attention_mask"][1].sum() < batch["attention_mask"].shape[1]  # the short row is padded
    with torch.no_grad():
        got = model(**batch).logits
    assert (got[0] - _tformer(run, long)[1]).abs().max() <= TOLERANCE
    assert (got[1] - _tformer(run, short)[1]).abs().max() > 1e-3


def test_a_feed_forward_wider_than_xlms_is_refused_in_one_line_and_nothing_is_written(tmp_path, capsys):
    """XLM's feed-forward width is 4 * emb_dim: d_ff 128 > 4 * 16. (--norm-first is refused alike:
    tests/training/test_sources.py.)"""
    run = _train(tmp_path, "run", classification_rows(60), "--d-ff", "128")
    capsys.readouterr()
    assert main(["export", str(run), "--hf", str(tmp_path / "hf")]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "--d-ff: XLMForSequenceClassification" in err
    assert "needs <= 4 * d_model = 64" in err
    assert "got 128; export it with --onnx, or train with --pooling cls" in err
    assert not (tmp_path / "hf").exists()


def test_an_export_transformers_does_not_reproduce_is_not_written(runs, tmp_path, monkeypatch):
    """The check in transformers runs before publishing: one weight off, nothing written."""
    from tformer.formats import hf_xlm

    to_hf = hf_xlm.to_hf

    def off(state, config, token_types, sinusoids=None):
        out = to_hf(state, config, token_types, sinusoids)
        out["sequence_summary.summary.bias"] = out["sequence_summary.summary.bias"] + 1e-3
        return out

    monkeypatch.setattr(hf_xlm, "to_hf", off)
    with pytest.raises(ValueError, match=r"^--hf: the XLMForSequenceClassification export gives logits "
                                         r".* away from tformer's, expected <= 1e-05; nothing was written$"):
        load_run(runs["single"]).export(hf=tmp_path / "hf")
    assert not (tmp_path / "hf").exists()


@pytest.mark.parametrize("kind", ["single", "pair"])
def test_the_export_reads_back_as_the_runs_encoder(runs, exported, kind):
    """tformer's reader takes the XLM directory it wrote (to fine-tune further): its encoder gives
    the run's encoder outputs on a padded batch, real tokens (<= 1e-5, fp32), at the width the
    run trained (XLM's padding units cut off)."""
    from tformer.nn.model import Encoder

    run, (out, _) = load_run(runs[kind]), exported[kind]
    encoder = Encoder.from_pretrained(out).eval()
    assert (encoder.config.d_ff, encoder.config.pooler, encoder.config.norm_first) == (
        run.model.config.d_ff, False, False)
    objective = run.objective
    texts = [t for t, _ in PAIRS] if kind == "pair" else TEXTS
    pairs = [p for _, p in PAIRS] if kind == "pair" else None
    batch = objective.collate(objective.encode(objective.source.inputs(texts, objective.inputs, pairs)))
    assert batch.attention_mask.sum(1).min() < batch.attention_mask.shape[1]  # padded rows too
    inputs = {"token_type_ids": batch.token_type_ids}
    with torch.no_grad():
        ours = run.model.eval().encoder(batch.input_ids, batch.attention_mask, **inputs).last_hidden_state
        back = encoder(batch.input_ids, batch.attention_mask, **inputs).last_hidden_state  # (B, S, D)
    real = batch.attention_mask.bool()  # (B, S)
    assert (ours[real] - back[real]).abs().max() <= TOLERANCE


def test_a_classifier_fine_tunes_from_its_own_export(runs, exported, tmp_path, capsys):
    out, _ = exported["single"]
    data = write(tmp_path / "more.jsonl", classification_rows(40, seed=1))
    assert main(["train", "--data", str(data), "--from-pretrained", str(out), "--out", str(tmp_path / "ft"),
                 "--steps", "2", "--eval-every", "2", "--threads", "1", "--quiet"]) == 0
    tuned = load_run(tmp_path / "ft")
    assert tuned.model.config.d_model == 16 and tuned.predict(["a big cat"])[0]["label"] in ("animal", "place")


def test_a_narrow_classifier_fine_tunes_at_the_width_it_trained(runs, exported, tmp_path):
    """The pair run trained d_ff 32; its export holds XLM's 4 * 16 = 64 units, 32 of them zero: a
    fine-tune from it runs 32 (the zero units would only cost time: no gradient reaches them)."""
    out, _ = exported["pair"]
    data = write(tmp_path / "more.jsonl", classification_rows(40, pair=True, seed=1))
    assert main(["train", "--data", str(data), "--from-pretrained", str(out), "--out", str(tmp_path / "ft"),
                 "--steps", "2", "--eval-every", "2", "--threads", "1", "--quiet"]) == 0
    assert load_run(runs["pair"]).model.config.d_ff == 32
    assert load_run(tmp_path / "ft").model.config.d_ff == 32


def test_a_foreign_xlm_layout_is_refused_naming_its_key(exported, tmp_path, capsys):
    """An XLM checkpoint not in the layout tformer writes (here: causal) is one line, naming the key."""
    import shutil

    foreign = tmp_path / "foreign"
    shutil.copytree(exported["single"][0], foreign)
    config = json.loads((foreign / "config.json").read_text())
    (foreign / "config.json").write_text(json.dumps({**config, "causal": True}))
    data = write(tmp_path / "d.jsonl", classification_rows(60))
    capsys.readouterr()
    assert main(["train", "--data", str(data), "--from-pretrained", str(foreign), "--out", str(tmp_path / "r"),
                 "--steps", "1", "--quiet"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "Traceback" not in err, err
    assert err.endswith("config.json: causal: expected false (an encoder attends both ways), got true\n"), err
    assert not (tmp_path / "r").exists()
