"""One inference forward per kind: the command line, the Python Run and the server give the same
values for the same run (<= 1e-6 in fp32), since all three call the kind's one forward."""

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from serve_fixtures import TINY_RUN
from text_fixtures import classification_rows, embedding_rows, write

from tformer.commands.cli import main
from tformer.kinds import load_run

TEXTS = ["the cat sat on the mat", "a dog", "stars in the night sky over the river", "one two three"]


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    root = tmp_path_factory.mktemp("forwards")
    out = {}
    for kind, rows in (("embedding", embedding_rows(80)), ("classification", classification_rows(80))):
        data = write(root / f"{kind}.jsonl", rows)
        assert main(["train", "--data", str(data), "--out", str(root / kind), *TINY_RUN]) == 0
        out[kind] = root / kind
    return out


def _command(*argv: str) -> str:
    """`tformer ARGV` as a user runs it: its own process (its standard output)."""
    src = str(Path(__file__).resolve().parents[2] / "src")
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([src, os.environ.get("PYTHONPATH", "")])}
    done = subprocess.run([sys.executable, "-m", "tformer", *argv], capture_output=True, text=True, env=env,
                          timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
    return done.stdout


def test_embed_the_run_and_the_server_give_the_same_vectors(runs):
    pytest.importorskip("uvicorn")
    from serve_fixtures import serve

    run_dir = runs["embedding"]
    out = _command("embed", str(run_dir), *TEXTS, "--dtype", "fp32", "--threads", "1")
    cli = np.array([json.loads(line)["embedding"] for line in out.splitlines()])
    api = load_run(run_dir).embed(TEXTS)
    live = serve(run_dir, dtype="fp32")
    try:
        status, _, body = live.post("/v1/embeddings", {"input": TEXTS})
    finally:
        live.close()
    assert status == 200, body
    served = np.array([d["embedding"] for d in sorted(body["data"], key=lambda d: d["index"])])
    assert cli.shape == api.shape == served.shape == (len(TEXTS), api.shape[1])
    assert np.abs(cli - api).max() <= 1e-6
    assert np.abs(served - api).max() <= 1e-6


def test_predict_the_run_and_the_server_give_the_same_probabilities(runs):
    pytest.importorskip("uvicorn")
    from serve_fixtures import serve

    run_dir = runs["classification"]
    out = _command("predict", str(run_dir), *TEXTS, "--format", "jsonl", "--threads", "1")
    cli = [json.loads(line)["probabilities"] for line in out.splitlines()]
    run = load_run(run_dir)
    api = [p["probabilities"] for p in run.predict(TEXTS)]
    live = serve(run_dir, dtype="fp32")
    try:
        status, _, body = live.post("/predict", {"inputs": [[t] for t in TEXTS]})
        raw_status, _, raw = live.post("/predict", {"inputs": [[t] for t in TEXTS], "raw_scores": True})
    finally:
        live.close()
    assert status == raw_status == 200, (body, raw)
    served = [{s["label"]: s["score"] for s in scores} for scores in body]
    logits = [{s["label"]: s["score"] for s in scores} for scores in raw]
    for c, a, s, z in zip(cli, api, served, logits, strict=True):
        assert set(c) == set(a) == set(s) == set(run.labels)
        for label in run.labels:
            assert abs(c[label] - a[label]) <= 1e-6  # the command line prints 6 decimals
            assert abs(s[label] - a[label]) <= 1e-6
        # the raw scores are the logits the probabilities come from
        exp = np.exp(np.array([z[label] for label in run.labels]) - max(z.values()))
        assert np.allclose(exp / exp.sum(), [a[label] for label in run.labels], atol=1e-6)
