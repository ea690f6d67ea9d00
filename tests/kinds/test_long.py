"""Long documents (tformer.text.windows, tformer.training.windows): a text longer than the max
length read in windows and pooled, in training, evaluation, prediction, embedding and serving;
--long auto|windows|cut."""

from __future__ import annotations

import json
import random
import re

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from cli_helpers import cli_lines
from text_fixtures import seq2seq_rows, write

import tformer
from tformer.commands.cli import main
from tformer.text.batches import encoder_batch
from tformer.training.windows import choose

TINY = dict(d_model=16, n_heads=2, d_ff=32, n_layers=1, vocab_size=300, threads=1, progress=False,
            log=lambda *a: None)


def keyed_rows(n: int, seed: int) -> list[dict[str, str]]:
    """Texts of 30 letters whose label only one word decides, the 19th to 30th: past the first
    10 tokens a max length of 12 reads."""
    rng = random.Random(seed)
    rows = []
    for _ in range(n):
        label = rng.choice(["yes", "no"])
        words = [rng.choice("abcdef") for _ in range(30)]
        words[rng.randrange(18, 30)] = "alpha" if label == "yes" else "beta"
        rows.append({"text": " ".join(words), "label": label})
    return rows


def keyed_run(tmp, long: str, log=None):
    return tformer.train(data=keyed_rows(400, 0), test=keyed_rows(100, 1), long=long, max_length=12,
                         tokenizer="wordpiece", steps=100, eval_every=1000, lr=1e-2, warmup=10,
                         label_smoothing=0.0, out=str(tmp / long), **{**TINY, "log": log or TINY["log"]})


@pytest.fixture(scope="module")
def keyed(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("keyed")
    logs: dict[str, list[str]] = {"windows": [], "cut": []}
    return {long: keyed_run(tmp, long, logs[long].append) for long in logs}, logs


def test_a_label_decided_past_the_max_length_is_learned_in_windows_and_not_cut(keyed):
    runs, _ = keyed
    assert runs["windows"].record["examples"] == runs["cut"].record["examples"] == 100
    assert runs["windows"].record["accuracy"] >= 0.9  # the window that holds the word decides
    assert runs["cut"].record["accuracy"] < 0.75  # the word is never read: about chance


def test_the_run_says_how_it_reads_long_texts_and_keeps_to_it(keyed):
    runs, logs = keyed
    (line,) = [line for line in logs["windows"] if line.startswith("long texts:")]
    assert line == ("long texts: 383 of 383 training texts (100%, a sample) are longer than 12 tokens: "
                           "read in 1,532 windows (4.0 each, a new one every 75% of a window, at most 16; "
                           "--long windows)")
    assert [line for line in logs["cut"] if line.startswith("long texts:")] == [
        "long texts: 383 of 383 training texts (100%, a sample) are longer than 12 tokens: cut there "
        "(--long cut)"]
    for long, run in runs.items():
        assert json.loads((run.path / "data.json").read_text())["long"] == long
        loaded = tformer.load_run(run.path)
        assert loaded.tokenizer.windows == (long == "windows") and loaded.max_input_tokens == loaded.tokenizer.limit
    windowed = tformer.load_run(runs["windows"].path)
    # An export reads a text's first window only: the card of the windowed run says so, the cut one's not.
    from tformer.export.model_card import render

    def card(run):
        return render(run.card("tformer export"), "a transformers directory", "").decode()

    assert "this export reads only a text's first 12 tokens" in card(windowed)
    assert "inputs truncated to 12 tokens" in card(tformer.load_run(runs["cut"].path))
    assert windowed.read_long("cut").tokenizer.windows is False
    assert windowed.evaluate()["accuracy"] < 0.75  # the model trained on windows, read cut


def test_a_long_texts_logits_are_the_mean_of_its_windows(keyed):
    """The run's one forward against the model run on each window alone (fp32, <= 1e-6)."""
    run = tformer.load_run(keyed[0]["windows"].path)
    texts = [r["text"] for r in keyed_rows(5, 2)] + ["a b", " ".join("abcdef" * 40)]
    logits = run.objective.predict(run.model, [{"text": t} for t in texts], batch_size=3)
    for text, got in zip(texts, logits, strict=True):
        (encoded,) = run.tokenizer.encode([text])
        alone = [run.model(encoder_batch([w], run.tokenizer.pad_id).input_ids).logits[0] for w in encoded.windows]
        assert np.abs(np.array(got) - torch.stack(alone).mean(0).numpy()).max() <= 1e-6
    assert len(run.tokenizer.encode([texts[-1]])[0].windows) == 16  # (the longest: cut after its 16th)
    assert [a["label"] for a in run.predict(texts)] == [run.labels[int(np.argmax(x))] for x in logits]


@pytest.fixture(scope="module")
def embedding_run(tmp_path_factory):
    rng = random.Random(0)
    words = "the cat dog sat on a mat big red house river".split()
    rows = []
    for _ in range(80):
        anchor = " ".join(rng.choice(words) for _ in range(rng.randint(3, 30)))
        rows.append({"anchor": anchor, "positive": anchor.upper()})
    return tformer.train(data=rows, long="windows", max_length=8, steps=2, eval_every=2, max_tokens=256,
                         out=str(tmp_path_factory.mktemp("emb") / "run"), **TINY)


def _mean_of_windows(model, tokenizer, text: str) -> np.ndarray:
    (encoded,) = tokenizer.encode([text])
    rows = [model(encoder_batch([w], tokenizer.pad_id).input_ids, normalize=False)[0] for w in encoded.windows]
    return F.normalize(torch.stack(rows).mean(0), dim=-1).numpy()


def test_an_embedding_is_the_mean_of_its_windows_vectors(embedding_run):
    run = tformer.load_run(embedding_run.path)
    assert run.tokenizer.windows
    texts = ["the cat", " ".join(["big red house river dog"] * 3)]
    got = run.embed(texts, batch_size=2)
    for text, vector in zip(texts, got, strict=True):
        assert np.abs(vector - _mean_of_windows(run.model, run.tokenizer, text)).max() <= 1e-6
    assert len(run.tokenizer.encode(texts[1:])[0].windows) > 1
    # A model directory reads windows where asked (embed --long windows), and cuts by default.
    from hf_bert_fixtures import st_dir

    from tformer.embeddings.sentence import SentenceEncoder

    st = SentenceEncoder.from_pretrained(st_dir())
    long = " ".join(["the cat sat on a mat"] * 8)
    windowed = st.windowed().encode([long])[0]
    assert np.abs(windowed - _mean_of_windows(st.sentence, st.windowed().tokenizer, long)).max() <= 1e-6
    assert np.abs(st.encode([long], on_long=lambda *_: None)[0] - windowed).max() > 1e-3


def test_the_server_answers_a_long_text_as_the_run_does(keyed, embedding_run):
    pytest.importorskip("uvicorn", reason="the serve extra: pip install 'tformer[serve]'")
    from serve_fixtures import serve

    run = tformer.load_run(keyed[0]["windows"].path)
    texts = [r["text"] for r in keyed_rows(3, 3)] + [" ".join("abcdef" * 40)]
    live = serve(run.path)
    try:
        status, headers, body = live.post("/predict", {"inputs": [[t] for t in texts], "raw_scores": True})
        served = live.app.state.service.served
        items = served.admit([{"text": t} for t in texts], True)
    finally:
        live.close()
    assert status == 200 and headers["x-truncated-inputs"] == "3"  # past its 16 windows
    logits = run.objective.predict(run.model, [{"text": t} for t in texts])
    for scores, expected in zip(body, logits, strict=True):
        got = {s["label"]: s["score"] for s in scores}
        assert max(abs(got[label] - x) for label, x in zip(run.labels, expected, strict=True)) <= 1e-6
    assert [i.n for i in items] == [e.tokens for e in run.tokenizer.encode(texts)]
    assert [i.truncated for i in items] == [False, False, False, True]
    emb = tformer.load_run(embedding_run.path)
    long = " ".join(["big red house river dog"] * 3)
    live = serve(emb.path)
    try:
        status, _, vectors = live.post("/embed", {"inputs": ["the cat", long]})
        refused = live.post("/embed", {"inputs": " ".join(["dog"] * 500), "truncate": False})
    finally:
        live.close()
    assert status == 200
    assert np.abs(np.array(vectors) - emb.embed(["the cat", long])).max() <= 1e-6
    assert refused[0] == 413 and f"expected at most {emb.max_input_tokens} tokens" in refused[2]["error"]["message"]


def test_long_is_refused_where_no_window_is_read(tmp_path):
    data = write(tmp_path / "s.jsonl", seq2seq_rows(20))
    with pytest.raises(ValueError, match=r"^long: a seq2seq run does not read it \(only a classification or "
                                         r"an embedding or a multilabel run does\); expected no --long, got 'windows'$"):
        tformer.train(data=str(data), long="windows", **TINY)
    with pytest.raises(ValueError, match=r"^long: the synthetic task listops brings its own data"):
        tformer.train(task="listops", long="cut", **{k: v for k, v in TINY.items() if k != "vocab_size"})
    with pytest.raises(ValueError, match=r"^long: expected one of auto, windows, cut; got 'all'$"):
        tformer.train(data=keyed_rows(20, 0), long="all", **TINY)


def test_auto_reads_windows_where_the_max_length_cuts_texts_and_the_budget_pays_for_them():
    """Untimed, auto reads windows once the max length cuts 1% of the texts; timed, only where
    the budget pays for WINDOW_PASSES times the passes a length needs over the windows: at 1 and
    3 minutes cut won in all six measured runs (benchmarks/README.md, "Long documents")."""
    from tformer.training.windows import WINDOW_PASSES

    assert choose("auto", 0.3)[0] == "windows" and choose("auto", 0.0)[0] == "cut"
    assert choose("cut", 0.9) == ("cut", "--long cut") and choose("windows", 0.0)[0] == "windows"
    assert choose("auto", 0.3, passes=2.1, needed=2.0) == (
        "cut", f"--long auto: the budget pays for about 2.1 passes over their windows, fewer than "
               f"{WINDOW_PASSES * 2:g}; --long windows reads them whole")
    assert choose("auto", 0.3, passes=WINDOW_PASSES * 2.0, needed=2.0)[0] == "windows"
    assert choose("windows", 0.3, passes=0.1, needed=2.0)[0] == "windows"  # asked for: as asked


@pytest.mark.parametrize("step_seconds, long", [pytest.param(1.0, "cut", marks=pytest.mark.slow),  # (26 s)
                                                (1e-4, "windows")])
def test_a_timed_run_reads_long_texts_in_windows_only_where_its_budget_pays_for_them(
        tmp_path, monkeypatch, step_seconds, long):
    """Texts 3x the max length, in a 30-second run on a machine whose steps are planned at 1 s
    (about 27 updates of 32: 0.8 passes over their 4 windows each) or at 0.1 ms: --long auto
    cuts them in the first, says why and records it (what predict reads); the second reads
    them in windows."""
    from tformer.training import planning

    monkeypatch.setattr(planning.MachineSpeeds, "step_seconds", lambda self, *a: step_seconds)
    log: list[str] = []
    run = tformer.train(data=keyed_rows(300, 0), max_minutes=0.5, max_length=12, tokenizer="wordpiece",
                        out=str(tmp_path / "r"), **{**TINY, "log": log.append})
    (line,) = [line for line in log if line.startswith("long texts:")]
    if long == "cut":
        assert re.search(r"cut there \(--long auto: the budget pays for about 0\.\d passes over their "
                         r"windows, fewer than 4; --long windows reads them whole\)$", line), line
    else:
        assert "read in 1,096 windows" in line, line
    assert json.loads((run.path / "data.json").read_text())["long"] == long
    assert tformer.load_run(run.path).tokenizer.windows is (long == "windows")


def test_predict_and_eval_read_long_texts_as_asked(keyed, capsys, tmp_path):
    path = keyed[0]["windows"].path
    texts = [r["text"] for r in keyed_rows(40, 4)]
    windows = cli_lines(capsys, ["predict", str(path), *texts])
    cut = cli_lines(capsys, ["predict", str(path), *texts, "--long", "cut"])
    truth = [r["label"] for r in keyed_rows(40, 4)]
    assert sum(a == b for a, b in zip(windows, truth, strict=True)) >= 36
    assert sum(a == b for a, b in zip(cut, truth, strict=True)) < 36
    data = write(tmp_path / "more.jsonl", keyed_rows(30, 5))
    assert main(["eval", str(path), "--data", str(data), "--long", "cut", "--samples", "0"]) == 0
    record = json.loads((path / "metrics.jsonl").read_text().splitlines()[-1])
    assert record["split"] == "eval" and record["long"] == "cut"


def test_a_fine_tune_reads_windows_of_its_checkpoints_length(tmp_path):
    """The windows of a fine-tune are as long as its checkpoint reads (its 64 positions): a
    longer --max-length is refused, naming it."""
    from hf_bert_fixtures import bert_dir

    rng = random.Random(0)
    rows = [{"text": " ".join(rng.choice(["the", "cat", "dog", "sat", "mat"]) for _ in range(100)),
             "label": rng.choice(["yes", "no"])} for _ in range(40)]
    options = {**TINY, "steps": 1, "eval_every": 1000}
    for name in ("d_model", "n_heads", "d_ff", "n_layers", "vocab_size"):  # the checkpoint's own
        options.pop(name)
    log: list[str] = []
    run = tformer.train(data=rows, from_pretrained=str(bert_dir()), out=str(tmp_path / "ft"),
                        **{**options, "log": log.append})
    assert run.tokenizer.max_length == 64 and run.tokenizer.windows
    (line,) = [line for line in log if line.startswith("long texts:")]
    assert "are longer than 64 tokens: read in" in line and "--long auto: 1% of them or more" in line
    with pytest.raises(ValueError, match=r"^max_length: expected at most 64 \(the maximum length of .*\), "
                                         r"got 200$"):
        tformer.train(data=rows, from_pretrained=str(bert_dir()), max_length=200, out=str(tmp_path / "x"),
                      **options)


def test_embed_reads_a_model_directorys_long_text_in_windows_where_asked(capsys):
    from hf_bert_fixtures import st_dir

    from tformer.embeddings.sentence import SentenceEncoder

    directory, long = str(st_dir()), " ".join(["the cat sat on a mat"] * 8)
    st = SentenceEncoder.from_pretrained(directory)
    windows = [json.loads(line)["embedding"] for line in cli_lines(capsys, ["embed", directory, long, "--long",
                                                                         "windows"])]
    cut = [json.loads(line)["embedding"] for line in cli_lines(capsys, ["embed", directory, long])]
    assert np.abs(np.array(windows) - st.windowed().encode([long])).max() <= 1e-6
    assert np.abs(np.array(cut) - st.encode([long], on_long=lambda *_: None)).max() <= 1e-6


def _bert_and_long_texts(tmp_path):
    """(a BERT-format folder of 256 positions, a file of 200 two-label texts of 102 tokens each)."""
    from hf_bert_fixtures import make_bert_dir

    model = make_bert_dir(tmp_path / "bert", max_position_embeddings=256)
    rng = random.Random(0)
    rows = [{"text": " ".join(rng.choice(["the", "cat", "dog", "sat", "mat"]) for _ in range(100)),
             "label": rng.choice(["yes", "no"])} for _ in range(200)]
    return model, write(tmp_path / "d.jsonl", rows)


def test_a_fine_tunes_plan_reads_its_texts_at_the_models_length(tmp_path):
    """A fine-tune's plan counted its texts' tokens cut at the preset's 64 (none cut at 128:
    "whole for 100%" where 78% of the man pages' DESCRIPTIONs were longer), and the length it
    chose never reached its batches (data.json said 64 after "max length: 128 tokens")."""
    from tformer.kinds import make_objective, resolve_config
    from tformer.training.planning import summarize

    model, data = _bert_and_long_texts(tmp_path)
    config = resolve_config({"data": str(data), "from_pretrained": str(model), "max_minutes": 0.5,
                             "out": str(tmp_path / "x")})
    assert config.max_length == 64  # the fine-tune preset's, where the plan starts
    objective = make_objective(config, run_dir=None, write=False)
    summary = summarize(objective)
    assert summary.cut_share(64) == 1.0 and summary.cut_share(128) == 0.0
    assert summary.mean_cost(128) == pytest.approx(102, abs=1)
    assert objective.with_config(config.replace(max_length=128)).source.tokenizer.max_length == 128


@pytest.mark.slow  # (a 30-second run; the plan's counts above are the default suite's)
def test_a_fine_tune_trains_at_the_length_its_plan_chose(tmp_path):
    """The length a fine-tune's plan chose is the one its batches get (data.json said 64 after
    "max length: 128 tokens")."""
    model, data = _bert_and_long_texts(tmp_path)
    log: list[str] = []
    run = tformer.train(data=str(data), from_pretrained=str(model), max_minutes=0.5, out=str(tmp_path / "ft"),
                        progress=False, log=log.append)
    (line,) = [x for x in log if x.startswith("max length:")]
    chosen = int(line.split()[2])
    assert chosen in (64, 128), line  # 128 where the budget pays for it (whole for 100%)
    assert ("whole for 100%" in line) == (chosen == 128), line
    assert run.tokenizer.max_length == chosen == json.loads((tmp_path / "ft" / "data.json").read_text())["max_length"]
