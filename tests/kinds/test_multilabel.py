"""Multi-label classification (tformer.kinds.multilabel): records and CSV cells of several labels,
the kind chosen from them, training (BCE, thresholds chosen on validation), predict / eval / the
CLI, the transformers export through transformers' own pipeline, the ONNX folder in onnxruntime,
and TEI's /predict through huggingface_hub's InferenceClient. The F1 scores, thresholds and
baseline are checked against scikit-learn and brute force."""

from __future__ import annotations

import csv
import json
import random

import numpy as np
import pytest
import torch
from cli_helpers import cli_lines
from text_fixtures import write

import tformer
from tformer.commands.cli import main
from tformer.kinds import kind_of_data, multilabel
from tformer.training.config import TrainConfig
from tformer.training.label_sets import Counts, best_cut, choose_thresholds

TOLERANCE = 1e-5  # probabilities, tformer vs transformers / onnxruntime / the server (float32)
GROUPS = {"animal": ["cat", "dog", "bird", "fish"], "place": ["house", "river", "city", "road"],
          "color": ["red", "blue", "green", "yellow"]}
TINY = ["--d-model", "32", "--n-heads", "2", "--d-ff", "64", "--n-layers", "1", "--vocab-size", "300",
        "--steps", "120", "--eval-every", "60", "--threads", "1", "--quiet"]
TEXTS = ["the cat on the road", "blue river", "a big dog", "on the", "Straße café 東京 red"]


def label_rows(n: int = 240, seed: int = 0) -> list[dict]:
    """Texts holding words of 0-3 groups; a record's labels: its groups."""
    rng = random.Random(seed)
    rows = []
    for _ in range(n):
        labels = [g for g in GROUPS if rng.random() < 0.45]
        words = [rng.choice(GROUPS[g]) for g in labels for _ in range(2)] + rng.choices(["the", "a", "on"], k=3)
        rng.shuffle(words)
        rows.append({"text": " ".join(words), "labels": labels})
    return rows


def write_csv(path, rows, column="label", joiner=";"):
    with path.open("w", newline="", encoding="utf-8") as f:
        w = csv.writer(f)
        w.writerow(["text", column])
        w.writerows([r["text"], joiner.join(r["labels"])] for r in rows)
    return path


@pytest.fixture(scope="module")
def run_dir(tmp_path_factory):
    """A run on a CSV file whose `label` column joins the labels with ';' (--label-separator)."""
    tmp = tmp_path_factory.mktemp("multilabel")
    data = write_csv(tmp / "train.csv", label_rows())
    assert main(["train", "--data", str(data), "--out", str(tmp / "run"), "--label-separator", ";", *TINY]) == 0
    return tmp / "run"


@pytest.fixture(scope="module")
def run(run_dir):
    return tformer.load_run(run_dir)


# Records and the kind ---------------------------------------------------------------------------
def test_the_fields_choose_the_kind(tmp_path):
    rows = label_rows(20)
    assert kind_of_data(write(tmp_path / "a.jsonl", rows)).name == "multilabel"
    listed = [{"text": r["text"], "label": r["labels"]} for r in rows]
    assert kind_of_data(write(tmp_path / "b.jsonl", listed)).name == "multilabel"  # a list in "label"
    joined = write_csv(tmp_path / "c.csv", [r for r in rows if r["labels"]])
    assert kind_of_data(joined).name == "classification"  # no separator named: one class a cell
    assert kind_of_data(joined, options={"label_separator": ";"}).name == "multilabel"
    mixed = [{**r, "source": "a", "target": "b"} for r in rows]
    both = r"expected the fields of one kind of data, got source\+target \(seq2seq\) and text\+labels"
    with pytest.raises(ValueError, match=both):
        kind_of_data(write(tmp_path / "d.jsonl", mixed))


def test_a_record_reads_its_labels_once_each_in_order():
    fields = multilabel.FIELDS
    record = fields.check("f:1", {"text": "t", "labels": ["b", "a", "b", 3, 2.0, True]})
    assert record == {"text": "t", "labels": ["b", "a", "3", "2", "true"]}
    assert fields.check("f:1", {"text": "t", "label": []})["labels"] == []  # none applies
    joined = fields.configured(TrainConfig(data="x.csv", label_separator="|"))
    assert joined.check("f:2", {"text": "t", "label": " a | b||c "})["labels"] == ["a", "b", "c"]
    assert joined.check("f:2", {"text": "t", "label": ""})["labels"] == []


@pytest.mark.parametrize("record, error", [
    ({"text": "t", "labels": "a;b"}, r"^f:3: labels: expected a list of labels, got the text 'a;b'; .*--label-separator"),
    ({"text": "t", "labels": {"a": 1}}, r"^f:3: labels: expected a list of labels, got dict"),
    ({"text": "t", "labels": None}, r"^f:3: labels: expected a list of labels, got null"),
    ({"text": "t", "labels": ["a", 0.5]}, r"^f:3: labels\[1\]: label: expected a class name"),
    ({"text": "t", "labels": ["a", ["b"]]}, r"^f:3: labels\[1\]: label: expected a class name"),
    ({"text": "t", "labels": ["a", " "]}, r"^f:3: labels\[1\]: expected a label name, got an empty string"),
    ({"labels": ["a"]}, r"^f:3: missing field 'text'"),
])
def test_bad_labels_are_refused_naming_the_line_and_field(record, error):
    with pytest.raises(ValueError, match=error):
        multilabel.FIELDS.check("f:3", record)


def test_a_bad_record_in_a_file_is_refused_naming_its_line(tmp_path, capsys):
    rows = label_rows(30)
    rows[7] = {"text": "a cat", "labels": "animal"}
    rc = main(["train", "--data", str(write(tmp_path / "bad.jsonl", rows)), "--out", str(tmp_path / "r"), *TINY])
    err = capsys.readouterr().err
    assert rc == 2 and err.count("\n") == 1
    assert "bad.jsonl:8: labels: expected a list of labels, got the text 'animal'" in err


def test_the_separator_is_only_read_by_the_label_kinds(tmp_path, capsys):
    data = write(tmp_path / "s.jsonl", [{"source": "a b", "target": "b a"}] * 20)
    rc = main(["train", "--data", str(data), "--label-separator", ";", *TINY])
    err = capsys.readouterr().err
    assert rc == 2 and "a seq2seq run does not read it (only a multilabel run does)" in err, err


# Scores, thresholds and the baseline, against scikit-learn and brute force -----------------------
def test_f1_scores_match_scikit_learn():
    from sklearn.metrics import f1_score

    rng = np.random.default_rng(0)
    truth = rng.random((200, 7)) < 0.3
    chosen = rng.random((200, 7)) < 0.35
    truth[:, 6] = chosen[:, 6] = False  # a label neither held nor chosen: left out of macro-F1
    truth[:5], chosen[:5] = False, False  # examples with no label given none: F1 1
    halves = Counts.of(chosen[:90], truth[:90]) + Counts.of(chosen[90:], truth[90:])
    got = halves.metrics()
    assert got["micro_f1"] == pytest.approx(f1_score(truth, chosen, average="micro"), abs=1e-12)
    assert got["macro_f1"] == pytest.approx(f1_score(truth[:, :6], chosen[:, :6], average="macro"), abs=1e-12)
    assert got["samples_f1"] == pytest.approx(
        f1_score(truth, chosen, average="samples", zero_division=1.0), abs=1e-12)


def test_the_top_k_baseline_is_the_best_k_by_brute_force():
    from sklearn.metrics import f1_score

    rng = np.random.default_rng(1)
    truth = rng.random((150, 6)) < np.array([0.6, 0.4, 0.3, 0.1, 0.05, 0.02])
    value, k = Counts.of(np.zeros_like(truth), truth).top_k()
    order = np.argsort(-truth.sum(0), kind="stable")
    scores = []
    for n in range(1, 7):
        predicted = np.zeros_like(truth)
        predicted[:, order[:n]] = True
        scores.append(f1_score(truth, predicted, average="micro"))
    assert value == pytest.approx(max(scores), abs=1e-12) and k == 1 + int(np.argmax(scores))


def f1_score(truth: np.ndarray, predicted: np.ndarray) -> float:
    """F1 of one label's decisions, counted directly (0 where nothing is held or chosen)."""
    tp = int((truth & predicted).sum())
    return 2 * tp / max(int(truth.sum()) + int(predicted.sum()), 1)


def test_each_threshold_is_the_best_cut_by_brute_force():
    rng = np.random.default_rng(2)
    truth = rng.random((120, 5)) < 0.3
    probs = np.clip(truth * 0.3 + rng.random((120, 5)) * 0.7, 0, 1).astype(np.float32)
    probs[:10, 0] = 0.5  # ties: a cut never falls between equal probabilities
    truth[:, 4] = False
    truth[:3, 4] = True  # 3 positives: below MIN_POSITIVES, the shared threshold
    chosen = choose_thresholds(probs, truth, min_positives=5)
    for c in range(4):
        best = max(f1_score(truth[:, c], probs[:, c] >= t) for t in np.unique(probs[:, c]))
        assert f1_score(truth[:, c], probs[:, c] >= chosen[c]) == pytest.approx(best, abs=1e-12)
    shared = max(f1_score(truth.ravel(), probs.ravel() >= t) for t in np.unique(probs))
    assert f1_score(truth.ravel(), probs.ravel() >= chosen[4]) == pytest.approx(shared, abs=1e-12)
    assert best_cut(probs[:, 0], np.zeros(120, dtype=bool)) == (0.5, 0.0)  # no positive: nothing to cut


def test_the_head_matches_its_numpy_mirror(tiny_config):
    from helpers import assert_close, copy_weights

    from tformer.nn.heads import MultiLabelClassifier
    from tformer.reference.heads import MultiLabelClassifier as MultiLabelMirror

    config = tiny_config.replace(n_classes=4, pooling="mean")
    model = MultiLabelClassifier(config).double().eval()
    model.thresholds.copy_(torch.tensor([0.1, 0.5, 0.7, 0.99]))
    mirror = MultiLabelMirror(config, np.float64)
    copy_weights(model, mirror)
    ids = np.random.default_rng(3).integers(0, 50, (3, 7))
    mask = np.arange(7)[None, :] < np.array([[7], [3], [5]])
    with torch.no_grad():
        logits = model(torch.from_numpy(ids), torch.from_numpy(mask)).logits
    theirs = mirror(ids, mask).logits
    assert_close(logits, theirs, np.float64, what="logits")
    assert (model.chosen(logits).numpy() == mirror.chosen(theirs)).all()


# A trained run -----------------------------------------------------------------------------------
def test_the_numpy_mirror_loads_the_run(run, run_dir):
    from helpers import assert_close

    from tformer.reference import from_pretrained

    mirror = from_pretrained(run_dir)
    assert type(mirror).__name__ == "MultiLabelClassifier"
    assert np.array_equal(mirror.thresholds, run.model.thresholds.numpy())
    batch = run.objective.collate(run.objective.encode(run.objective.source.inputs(TEXTS, ("text",))))
    with torch.no_grad():
        ours = run.model(batch.input_ids, batch.attention_mask).logits
    assert_close(ours, mirror(batch.input_ids.numpy(), batch.attention_mask.numpy()).logits, np.float32,
                 what="logits")


def test_a_run_learns_and_keeps_its_thresholds_with_its_weights(run, run_dir):
    from safetensors.numpy import load_file

    test = run.test_record()
    assert test["micro_f1"] > test["baseline"] and test["baseline_by"].startswith("the k most frequent labels")
    assert {"macro_f1", "samples_f1"} <= set(test)
    saved = load_file(str(run_dir / "best.safetensors"))["thresholds"]
    assert np.array_equal(saved, run.model.thresholds.numpy()) and not np.allclose(saved, 0.5)
    assert run.describe()["thresholds"] == run.thresholds
    # A finished run's evaluation uses them (it chooses none: it is not training).
    again = run.evaluate(split="validation")
    assert np.array_equal(run.model.thresholds.numpy(), saved)
    streamed, baseline, _ = run.score_stream(run.examples("validation"))
    assert {k: streamed[k] for k in again} == pytest.approx(again)
    assert baseline["baseline_by"].startswith("the k most frequent labels")
    # The test's verdict: micro-F1 sums counts, so its interval is a paired bootstrap of the
    # examples, the same drawn again from the stream.
    if test["examples"] == len(run.examples("test")):
        assert run.score_stream(run.examples("test"))[1]["paired_interval"] == pytest.approx(
            test["gain_interval"], abs=1e-4)


def test_predict_gives_the_chosen_labels_and_every_probability(run):
    answers = run.predict(TEXTS)
    logits = torch.tensor(run.objective.predict(run.model, run.objective.source.inputs(TEXTS, ("text",))))
    probs = torch.sigmoid(logits)
    for answer, p in zip(answers, probs, strict=True):
        assert list(answer["probabilities"]) == run.labels
        assert np.allclose(list(answer["probabilities"].values()), p.numpy(), atol=1e-7)
        assert answer["labels"] == [name for name, q in zip(run.labels, p.tolist(), strict=True)
                                    if q >= run.thresholds[name]]
    (alone,) = run.predict("the cat on the road")  # one str: one text (batched alone: float32 rounding)
    assert alone["probabilities"] == pytest.approx(answers[0]["probabilities"], abs=1e-6)


def test_the_cli_prints_the_labels_or_the_whole_answer(run, run_dir, capsys):
    answers = run.predict(TEXTS)
    assert cli_lines(capsys, ["predict", str(run_dir), *TEXTS]) == [";".join(a["labels"]) for a in answers]
    lines = [json.loads(x) for x in cli_lines(capsys, ["predict", str(run_dir), *TEXTS, "--format", "jsonl"])]
    for line, text, answer in zip(lines, TEXTS, answers, strict=True):
        assert line["text"] == text and line["labels"] == answer["labels"]
        assert line["probabilities"] == pytest.approx(answer["probabilities"], abs=1e-6)


def test_records_train_through_the_python_api(tmp_path):
    rows = [{"text": r["text"], "label": r["labels"]} for r in label_rows(120, seed=1)]  # lists in "label"
    run = tformer.train(data=rows, out=str(tmp_path / "api"), d_model=16, n_heads=2, d_ff=32, n_layers=1,
                        vocab_size=300, steps=4, eval_every=2, threads=1, progress=False, log=lambda *a: None)
    assert isinstance(run, tformer.MultiLabelRun) and run.labels == sorted(GROUPS)
    assert set(run.predict("a red cat")[0]) == {"labels", "probabilities"}


@pytest.mark.slow  # ~20 s: a run and its resume
def test_a_resumed_run_keeps_its_thresholds_and_pairs_are_read(tmp_path):
    from safetensors.numpy import load_file

    rows = [{**r, "text_pair": r["text"].split()[0]} for r in label_rows(120, seed=3)]
    data = str(write(tmp_path / "pairs.jsonl", rows))
    small = [*TINY[:TINY.index("--steps")], "--threads", "1", "--quiet", "--eval-every", "2"]
    assert main(["train", "--data", data, "--out", str(tmp_path / "r"), "--steps", "2", *small]) == 0
    first = load_file(str(tmp_path / "r" / "best.safetensors"))["thresholds"]
    assert main(["train", "--resume", str(tmp_path / "r"), "--steps", "4", "--quiet"]) == 0
    run = tformer.load_run(tmp_path / "r")
    assert run.test_record()["step"] == 4 and run.pairs
    assert load_file(str(tmp_path / "r" / "best.safetensors"))["thresholds"].shape == first.shape
    (paired,) = run.predict(["a red cat"], pairs=["red"])
    (single,) = run.predict(["a red cat"])
    assert paired["probabilities"] != single["probabilities"]  # the pair is read


# Exports ------------------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def pooled_run(tmp_path_factory):
    """--pooling cls: BERT's pooler, exported as a BertForSequenceClassification."""
    tmp = tmp_path_factory.mktemp("multilabel-cls")
    data = write(tmp / "train.jsonl", label_rows(160, seed=2))
    assert main(["train", "--data", str(data), "--out", str(tmp / "run"), "--pooling", "cls", *TINY]) == 0
    return tformer.load_run(tmp / "run")


@pytest.mark.parametrize("which", ["run", "pooled_run"])
def test_the_transformers_export_gives_tformers_probabilities(which, request, tmp_path):
    pipeline = pytest.importorskip("transformers").pipeline
    run = request.getfixturevalue(which)
    out = run.export(hf=tmp_path / "hf")
    config = json.loads((out / "config.json").read_text())
    assert config["problem_type"] == "multi_label_classification"
    assert config["tformer_thresholds"] == pytest.approx(run.thresholds)
    ours = run.predict(TEXTS)
    for function in ("sigmoid", None):  # sigmoid: transformers' default for the problem type too
        options = {} if function is None else {"function_to_apply": function}
        classify = pipeline("text-classification", model=str(out), top_k=None, **options)
        for text, answer in zip(TEXTS, ours, strict=True):
            got = classify(text, truncation=True)
            got = got[0] if isinstance(got[0], list) else got
            assert {g["label"] for g in got} == set(run.labels)
            worst = max(abs(g["score"] - answer["probabilities"][g["label"]]) for g in got)
            assert worst <= TOLERANCE, f"{which} {text!r}: max |pipeline - tformer| = {worst:.2e}"


def test_the_onnx_folder_gives_probabilities_and_thresholds(run, tmp_path):
    ort = pytest.importorskip("onnxruntime")
    from tokenizers import Tokenizer

    out = run.export(onnx=tmp_path / "onnx")
    config = json.loads((out / "config.json").read_text())
    assert config["thresholds"] == pytest.approx(run.thresholds)
    assert config["problem_type"] == "multi_label_classification"
    labels = [config["id2label"][str(i)] for i in range(len(config["id2label"]))]
    tokenizer = Tokenizer.from_file(str(out / "tokenizer.json"))
    session = ort.InferenceSession(str(out / "model.onnx"), providers=["CPUExecutionProvider"])
    assert [o.name for o in session.get_outputs()] == ["logits", "probabilities"]
    for text, answer in zip(TEXTS, run.predict(TEXTS), strict=True):
        enc = tokenizer.encode(text)
        feed = {"input_ids": [enc.ids], "attention_mask": [enc.attention_mask], "token_type_ids": [enc.type_ids]}
        logits, probs = session.run(None, {i.name: np.array(feed[i.name], dtype=np.int64)
                                           for i in session.get_inputs()})
        assert np.abs(probs - torch.sigmoid(torch.from_numpy(logits)).numpy()).max() <= 1e-6
        assert np.abs(probs[0] - list(answer["probabilities"].values())).max() <= TOLERANCE
        chosen = [name for i, name in enumerate(labels) if probs[0, i] >= config["thresholds"][name]]
        assert chosen == answer["labels"]


# Serving: TEI's /predict ---------------------------------------------------------------------------
@pytest.fixture(scope="module")
def server(run_dir):
    pytest.importorskip("uvicorn")
    from serve_fixtures import serve

    live = serve(run_dir)
    yield live
    live.close()


def test_tei_predict_gives_every_labels_probability_and_raw_scores(server, run):
    text = TEXTS[0]
    (answer,) = run.predict([text])
    status, _, got = server.post("/predict", {"inputs": text})
    assert status == 200 and [g["score"] for g in got] == sorted((g["score"] for g in got), reverse=True)
    assert {g["label"]: g["score"] for g in got} == pytest.approx(answer["probabilities"], abs=TOLERANCE)
    status, _, raw = server.post("/predict", {"inputs": [[text]], "raw_scores": True})
    logits = run.objective.predict(run.model, run.objective.source.inputs([text], ("text",)))[0]
    assert status == 200 and {g["label"]: g["score"] for g in raw[0]} == pytest.approx(
        dict(zip(run.labels, logits, strict=True)), abs=TOLERANCE)
    status, _, info = server.request("GET", "/info")
    assert status == 200 and info["model_type"]["classifier"]["id2label"]["0"] == run.labels[0]


def test_inference_client_text_classification(server, run):
    hub = pytest.importorskip("huggingface_hub")
    (answer,) = run.predict([TEXTS[1]])
    got = hub.InferenceClient(model=server.url, timeout=30).text_classification(TEXTS[1])
    assert {e.label: e.score for e in got} == pytest.approx(answer["probabilities"], abs=TOLERANCE)
    top = hub.InferenceClient(model=server.url, timeout=30).text_classification(TEXTS[1], top_k=1)
    assert [e.label for e in top] == [max(answer["probabilities"], key=answer["probabilities"].get)]
