"""The regression kind (scores of texts and of text pairs): tiny runs trained in seconds, their
one forward, baselines and metrics, the exports loaded by sentence-transformers, transformers
and onnxruntime with the run's scores, the server, the command line, and bad records."""

from __future__ import annotations

import json

import numpy as np
import pytest
from cli_helpers import assert_one_line_error, cli_lines, run_cli
from crossencoder_fixtures import TINY, score_rows
from text_fixtures import write

import tformer
from tformer.kinds import kind_of_fields
from tformer.training.ranking import overlap_cosine, score_metrics

TOL = 1e-4  # the issue's tolerance for the exports' scores
PAIRS = [("the cat sat on", "cat sat a mat"), ("hello world, fine.", "東京 café naïve"), ("red house", "red house")]


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    root = tmp_path_factory.mktemp("scores")
    # Scores in [0, 1]: learned through a sigmoid (--score-loss auto: bce); "mse": the raw output.
    return {"pairs": tformer.train(data=score_rows(), out=str(root / "p"), **TINY),
            "texts": tformer.train(data=score_rows(pair=False), out=str(root / "t"), **TINY),
            "mse": tformer.train(data=score_rows(), out=str(root / "m"), score_loss="mse", **TINY)}


def sigmoid(x: float) -> float:
    return 1.0 / (1.0 + float(np.exp(-x)))


def test_the_fields_choose_the_kind():
    assert kind_of_fields(["text", "score"], "x").name == "regression"
    assert kind_of_fields(["text", "text_pair", "score"], "x").name == "regression"
    with pytest.raises(ValueError, match=r"^x: expected the fields of one kind of data, got .*text\+label"):
        kind_of_fields(["text", "score", "label"], "x")


@pytest.mark.parametrize(("name", "activate"), [("pairs", sigmoid), ("mse", lambda x: x)])
def test_predict_is_the_evaluations_forward(runs, name, activate):
    """Run.predict, the objective's predictions of the test split and its metrics: the same
    numbers (the output's sigmoid where the loss was bce, the output itself where mse)."""
    run = runs[name]
    examples = run.examples("test")
    got = run.predict([r["text"] for r in examples], pairs=[r["text_pair"] for r in examples])
    logits = run.objective.predict(run.model, examples)
    assert [a["score"] for a in got] == pytest.approx([activate(x) for (x,) in logits], abs=1e-6)
    metrics = run.evaluate()
    expected = score_metrics([a["score"] for a in got], [r["score"] for r in examples])
    for key in ("spearman", "pearson", "mse"):
        assert metrics[key] == pytest.approx(expected[key], abs=1e-6)
    one = run.predict("the cat sat", pairs="cat sat")  # one text, one pair
    assert len(one) == 1 and set(one[0]) == {"score"}


def test_the_record_compares_with_the_train_mean_and_the_token_overlap(runs):
    """data.json tallies the training records' scores (not the held-out ones): the train mean
    (the constant baseline and its MSE); for pairs, the overlap cosine's Spearman."""
    run = runs["pairs"]
    held = {(r["text"], r["text_pair"]) for s in ("test", "validation") for r in run.examples(s)}
    train = [r["score"] for r in score_rows() if (r["text"], r["text_pair"]) not in held]
    assert run.objective.train_mean == pytest.approx(float(np.mean(train)), abs=1e-9)
    test = run.examples("test")
    record = run.test_record()
    truth = [r["score"] for r in test]
    assert record["mean_mse"] == pytest.approx(float(np.mean((np.array(truth) - np.mean(train)) ** 2)))
    tok = run.tokenizer
    words = [set(tok.encode([r[f]])[0].ids) - {tok.bos_id, tok.eos_id, tok.pad_id}
             for r in test for f in ("text", "text_pair")]
    overlap = score_metrics([overlap_cosine(words[2 * i], words[2 * i + 1]) for i in range(len(test))], truth)
    assert record["baseline"] == pytest.approx(max(overlap["spearman"], 0.0))
    assert record["main_metric"] == "spearman" and "baseline_by" in record
    # The verdict's interval: a paired bootstrap of the test's pairs (Spearman's is no mean of
    # per-example scores), the same drawn again from the examples as `tformer eval` streams them.
    if record["examples"] == len(test):
        _, streamed, _ = run.score_stream(test)
        assert streamed["paired_interval"] == pytest.approx(record["gain_interval"], abs=1e-4)


@pytest.mark.parametrize(("name", "activation"), [("pairs", "Sigmoid"), ("mse", "Identity")])
def test_the_hf_export_is_a_cross_encoder_with_the_runs_scores(runs, tmp_path, name, activation):
    """CrossEncoder(DIR) and the pipeline give the run's scores: through the sigmoid it learned
    with (bce: CrossEncoder's default for one label), or raw (mse: "regression", no activation)."""
    from sentence_transformers import CrossEncoder
    from transformers import pipeline

    run = runs[name]
    out = run.export(hf=tmp_path / "hf")
    model = CrossEncoder(str(out), local_files_only=True)
    assert type(model.activation_fn).__name__ == activation
    ours = [a["score"] for a in run.predict([a for a, _ in PAIRS], pairs=[b for _, b in PAIRS])]
    assert np.abs(model.predict(PAIRS) - np.array(ours)).max() <= TOL
    config = json.loads((out / "config.json").read_text())
    assert config["num_labels"] == 1
    assert config.get("problem_type") == ("regression" if activation == "Identity" else None)
    classify = pipeline("text-classification", model=str(out))
    got = classify({"text": PAIRS[0][0], "text_pair": PAIRS[0][1]})
    assert got["score"] == pytest.approx(ours[0], abs=TOL)


def test_a_single_text_run_exports_for_the_pipeline(runs, tmp_path):
    from transformers import pipeline

    run = runs["texts"]
    assert not run.pairs
    out = run.export(hf=tmp_path / "hf")
    texts = ["the cat sat on a mat", "東京 hello"]
    got = [r["score"] for r in pipeline("text-classification", model=str(out))(texts)]
    assert np.abs(np.array(got) - [a["score"] for a in run.predict(texts)]).max() <= TOL
    with pytest.raises(ValueError, match="pairs: .* trained on single texts"):
        run.predict("a text", pairs="a pair")


def test_the_onnx_export_gives_the_scores(runs, tmp_path):
    ort = pytest.importorskip("onnxruntime")
    from tokenizers import Tokenizer

    run = runs["pairs"]
    out = run.export(onnx=tmp_path / "onnx")
    tok = Tokenizer.from_file(str(out / "tokenizer.json"))
    session = ort.InferenceSession(str(out / "model.onnx"), providers=["CPUExecutionProvider"])
    assert [o.name for o in session.get_outputs()] == ["logits", "scores"]
    ours = [a["score"] for a in run.predict([a for a, _ in PAIRS], pairs=[b for _, b in PAIRS])]
    for (a, b), expected in zip(PAIRS, ours, strict=True):
        enc = tok.encode(a, b)
        feed = {"input_ids": [enc.ids], "attention_mask": [enc.attention_mask], "token_type_ids": [enc.type_ids]}
        inputs = {i.name: np.array(feed[i.name], dtype=np.int64) for i in session.get_inputs()}
        logits, scores = session.run(None, inputs)
        assert abs(float(scores[0]) - expected) <= TOL and logits.shape == (1, 1)
    assert json.loads((out / "config.json").read_text())["sentence_transformers"]["activation_fn"].endswith(
        "Sigmoid")


def test_the_server_answers_teis_predict(runs):
    pytest.importorskip("uvicorn")
    from serve_fixtures import serve

    run = runs["pairs"]
    live = serve(run.path)
    try:
        ours = run.predict([a for a, _ in PAIRS], pairs=[b for _, b in PAIRS])
        status, _, body = live.post("/predict", {"inputs": [[a, b] for a, b in PAIRS]})
        assert status == 200
        assert [r[0]["label"] for r in body] == ["score"] * len(PAIRS)
        assert [r[0]["score"] for r in body] == pytest.approx([a["score"] for a in ours], abs=1e-5)
        status, _, one = live.post("/predict", {"inputs": list(PAIRS[0]), "raw_scores": True})
        p = ours[0]["score"]  # the output's sigmoid (bce); raw_scores: the output itself
        assert status == 200 and one[0]["score"] == pytest.approx(float(np.log(p / (1 - p))), abs=1e-4)
        status, _, info = live.request("GET", "/info")
        assert info["kind"] == "regression" and info["model_type"] == {"classifier": {"id2label": {"0": "score"}}}
        assert live.post("/rerank", {"query": "a", "texts": ["b"]})[0] == 404  # a reranker's
    finally:
        live.close()


def test_the_command_prints_the_scores(runs, capsys, tmp_path):
    run = runs["pairs"]
    lines = [f"{a}\t{b}" for a, b in PAIRS]
    ours = [a["score"] for a in run.predict([a for a, _ in PAIRS], pairs=[b for _, b in PAIRS])]
    printed = cli_lines(capsys, ["predict", str(run.path), *lines, "--threads", "1"])
    assert [float(x) for x in printed] == pytest.approx(ours, rel=1e-5)
    records = [json.loads(x) for x in cli_lines(capsys, ["predict", str(run.path), lines[0], "--format", "jsonl"])]
    assert records == [{"text": lines[0], "score": round(ours[0], 6)}]


@pytest.mark.parametrize("score, expected", [
    ("abc", r"score: expected a finite number \(such as 0\.73 or \"4\.5\"\), got 'abc'"),
    (None, r"score: expected a finite number .*, got None"),
    (True, r"score: expected a finite number .*, got True"),
    ("nan", r"score: expected a finite number .*, got 'nan'"),
    ([0.5], r"score: expected a finite number .*, got \[0\.5\]"),
])
def test_a_bad_score_is_refused_naming_the_line(tmp_path, capsys, score, expected):
    rows = score_rows(20)
    rows[2] = {**rows[2], "score": score}
    data = write(tmp_path / "train.jsonl", rows)
    rc, _, err = run_cli(capsys, "train", "--data", data, "--out", tmp_path / "run", "--steps", "1")
    assert_one_line_error(rc, err, "train", rf"{data}:3: {expected}$")


def test_a_csv_score_is_read_as_a_number(tmp_path):
    rows = [{**r, "score": str(r["score"])} for r in score_rows(60)]
    run = tformer.train(data=str(write(tmp_path / "train.csv", rows)), out=str(tmp_path / "run"), **TINY)
    assert run.kind == "regression" and isinstance(run.examples("test")[0]["score"], float)
    missing = write(tmp_path / "bad.jsonl", [{"text": "a", "text_pair": "b", "score": 1}, {"text": "a b", "score": 1},
                                             {"text": "c", "text_pair": "d"}])
    with pytest.raises(ValueError, match=rf"^{missing}:3: missing field 'score' \(the record has text, text_pair\)"):
        tformer.train(data=str(missing), out=str(tmp_path / "r2"), **TINY)


def test_bce_for_scores_outside_0_1_is_refused_and_auto_learns_them_by_mse(tmp_path, capsys):
    rows = [{**r, "score": 5 * r["score"]} for r in score_rows(60)]  # STS's 0-5
    data = write(tmp_path / "train.jsonl", rows)
    rc, _, err = run_cli(capsys, "train", "--data", data, "--out", tmp_path / "run", "--steps", "1",
                         "--score-loss", "bce")
    assert_one_line_error(rc, err, "train", r"--score-loss: bce learns scores in \[0, 1\]; the training "
                                            r"scores run from 0\.0 to [45]\.0: expected mse or auto$")
    assert not (tmp_path / "run").exists()
    run = tformer.train(data=str(data), out=str(tmp_path / "auto"), **TINY)
    assert run.objective.activation == "identity" and "squared error" in run.objective.what()


def test_a_run_saved_before_score_loss_reads_as_mse(runs, tmp_path):
    """Runs written before --score-loss learned [0, 1] scores by their squared error: their saved
    config (no score_loss) must not now read as bce and put a sigmoid on their outputs."""
    import shutil

    old = tmp_path / "old"
    shutil.copytree(runs["mse"].path, old)
    for path in old.rglob("train_config.json"):
        saved = json.loads(path.read_text())
        assert saved.pop("score_loss") == "mse"
        path.write_text(json.dumps(saved))
    run = tformer.load_run(old)
    assert run.objective.activation == "identity"
    assert run.predict("the cat sat", pairs="cat sat") == runs["mse"].predict("the cat sat", pairs="cat sat")


def test_another_kind_refuses_score_loss(tmp_path, capsys):
    from text_fixtures import classification_rows

    data = write(tmp_path / "train.jsonl", classification_rows(40))
    rc, _, err = run_cli(capsys, "train", "--data", data, "--out", tmp_path / "run", "--steps", "1",
                         "--score-loss", "mse")
    assert_one_line_error(rc, err, "train", r"--score-loss: a classification run does not read it \(only a "
                                            r"regression run does\); expected no --score-loss, got 'mse'$")
