"""`tformer mine`: hard negatives from an index of the positives; the margin holds against scores
computed apart (float64 NumPy over SentenceEncoder's vectors), no positive is mined as its own
pair's negative, and the output trains."""

from __future__ import annotations

import json

import numpy as np
import pytest
from cli_helpers import assert_one_line_error, run_cli
from hf_bert_fixtures import st_dir

from tformer.commands.cli import main

WORDS = "the a cat dog sat on mat is big small red blue river sun moon city road book day night".split()


def _pairs(tmp_path, n=120, seed=0):
    rng = np.random.default_rng(seed)
    rows = []
    for i in range(n):
        words = list(rng.choice(WORDS, 5))
        rows.append({"anchor": " ".join(words[:3]) + f" {i}", "positive": " ".join(words) + f" {i}"})
    rows.append({"anchor": rows[0]["anchor"], "positive": "a second positive of the first anchor"})
    rows.append({"anchor": "an anchor that is also a positive", "positive": rows[1]["positive"]})
    path = tmp_path / "pairs.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path, rows


def _cos(st, a: str, b: str) -> float:
    x, y = st.encode([a, b]).astype(np.float64)
    return float(x @ y / np.linalg.norm(x) / np.linalg.norm(y))


@pytest.mark.parametrize("margin", [["--relative-margin", "0.05"], ["--absolute-margin", "0.02",
                                                                    "--relative-margin", "0"]])
def test_the_margin_holds_and_no_positive_is_its_pairs_negative(capsys, tmp_path, margin):
    from tformer.embeddings.sentence import SentenceEncoder

    data, rows = _pairs(tmp_path)
    out = tmp_path / "mined.jsonl"
    rc, _, err = run_cli(capsys, "mine", st_dir(), "--data", data, "--out", out, "--negatives", 2, *margin)
    assert rc == 0, err
    mined = [json.loads(line) for line in out.read_text().splitlines()]
    positives_of: dict[str, set[str]] = {}
    for r in rows:
        positives_of.setdefault(r["anchor"], set()).add(r["positive"])
    # every pair is there, in order, each with up to 2 negatives (or none)
    pairs = [(m["anchor"], m["positive"]) for m in mined]
    assert list(dict.fromkeys(pairs)) == [(r["anchor"], r["positive"]) for r in rows]
    st = SentenceEncoder.from_pretrained(st_dir())
    with_negative = [m for m in mined if "negative" in m]
    assert len(with_negative) >= 20  # (a random tiny model scores everything alike: the margin skips many)
    corpus = {r["positive"] for r in rows}
    for m in with_negative:
        assert m["negative"] in corpus  # mined from the positives
        assert m["negative"] not in positives_of[m["anchor"]] and m["negative"] != m["anchor"]
        pos, neg = _cos(st, m["anchor"], m["positive"]), _cos(st, m["anchor"], m["negative"])
        ceiling = pos * 0.95 if margin[1] == "0.05" else pos - 0.02
        assert neg <= ceiling + 1e-5, (m, pos, neg)
    assert f"{len(mined):,} records from {len(rows):,} pairs" in err


def test_top_sampling_takes_the_best_candidates_below_the_margin(capsys, tmp_path):
    """With --relative-margin 0 the negative is the best-scoring text that is not a positive of the
    pair and scores no higher than its positive."""
    from tformer.embeddings.sentence import SentenceEncoder

    data, rows = _pairs(tmp_path, n=40)
    out = tmp_path / "mined.jsonl"
    rc, _, err = run_cli(capsys, "mine", st_dir(), "--data", data, "--out", out, "--relative-margin", "0")
    assert rc == 0, err
    st = SentenceEncoder.from_pretrained(st_dir())
    corpus = sorted({r["positive"] for r in rows})
    vectors = st.encode(corpus).astype(np.float64)
    vectors /= np.linalg.norm(vectors, axis=1, keepdims=True)
    for m in [json.loads(line) for line in out.read_text().splitlines()][:10]:
        own = {r["positive"] for r in rows if r["anchor"] == m["anchor"]}
        a = st.encode([m["anchor"]]).astype(np.float64)[0]
        scores = vectors @ (a / np.linalg.norm(a))
        pos = _cos(st, m["anchor"], m["positive"])
        allowed = [(s, t) for s, t in zip(scores, corpus, strict=True)
                   if t not in own and t != m["anchor"] and s <= pos + 1e-6]
        if "negative" not in m:
            assert not allowed
            continue
        assert _cos(st, m["anchor"], m["negative"]) == pytest.approx(max(allowed)[0], abs=1e-5)


def test_the_output_trains_as_embedding_data(capsys, tmp_path):
    data, _ = _pairs(tmp_path)
    out = tmp_path / "mined.jsonl"
    assert run_cli(capsys, "mine", st_dir(), "--data", data, "--out", out)[0] == 0
    run = tmp_path / "run"
    assert main(["train", "--data", str(out), "--out", str(run), "--from-pretrained", str(st_dir()),
                 "--steps", "3", "--threads", "1", "--quiet", "--eval-every", "3"]) == 0
    data_json = json.loads((run / "data.json").read_text())
    assert "embedding" in json.dumps(data_json)


def test_a_kept_index_is_reused_and_bad_input_is_one_line(capsys, tmp_path):
    data, _ = _pairs(tmp_path, n=30)
    out, index = tmp_path / "mined.jsonl", tmp_path / "positives"
    rc, _, err = run_cli(capsys, "mine", st_dir(), "--data", data, "--out", out, "--index", index)
    assert rc == 0 and (index / "index.json").is_file(), err
    first = out.read_text()
    rc, _, err = run_cli(capsys, "mine", st_dir(), "--data", data, "--out", out, "--index", index)
    assert rc == 0 and f"searching the index {index}" in err, err
    assert out.read_text() == first
    assert sorted(p.name for p in tmp_path.iterdir()) == ["mined.jsonl", "pairs.jsonl", "positives"]
    (tmp_path / "bad.jsonl").write_text('{"anchor": "a", "positive": "b"}\n{"anchor": "a"}\n')
    rc, _, err = run_cli(capsys, "mine", st_dir(), "--data", tmp_path / "bad.jsonl", "--out", out)
    assert_one_line_error(rc, err, "mine", r"bad\.jsonl:2: positive: expected a non-blank string, got None")
    assert out.read_text() == first  # untouched
    (tmp_path / "notes.txt").write_text("mine")
    rc, _, err = run_cli(capsys, "mine", st_dir(), "--data", data, "--out", tmp_path / "notes.txt")
    assert_one_line_error(rc, err, "mine", r"notes\.txt: exists and is not a file of")
    rc, _, err = run_cli(capsys, "mine", st_dir(), "--data", data, "--out", out, "--range-min", "5",
                         "--range-max", "5")
    assert_one_line_error(rc, err, "mine", r"--range-min, --range-max: expected 0 <= min < max, got 5, 5")
