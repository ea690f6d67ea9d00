"""A run directory is self-contained: a fine-tune loads, predicts, evaluates, exports and serves
after its base model's folder is gone, and after the run was copied elsewhere. (A fine-tuned
embedding run read its base folder's pooling when loaded: `tformer export RUN --onnx` and
tformer.load_run failed with "BASE: no such model directory" once the base had moved.)"""

import shutil

import numpy as np
import pytest
from cli_helpers import run_cli
from hf_bert_fixtures import WORDS, make_bert_dir
from text_fixtures import near_pair_rows, write

from tformer.commands.cli import main
from tformer.kinds import load_run

FINE_TUNE = ["--steps", "2", "--eval-every", "2", "--threads", "1", "--quiet"]


def _labelled(n: int, seed: int) -> list[dict[str, str]]:
    rows = near_pair_rows(n, seed, tuple(WORDS))
    return [{"text": r["anchor"], "label": "ab"[i % 2]} for i, r in enumerate(rows)]


@pytest.fixture(scope="module")
def moved_runs(tmp_path_factory):
    """(embedding run, classification run): each fine-tuned from a tiny BERT whose folder was then
    deleted, and the run copied to another folder (the original removed too)."""
    root = tmp_path_factory.mktemp("self-contained")
    base = make_bert_dir(root / "base")
    runs = {}
    for kind, rows in (("embedding", near_pair_rows(80, 0, tuple(WORDS))), ("classification", _labelled(80, 0))):
        data = write(root / f"{kind}.jsonl", rows)
        out = root / f"{kind}-run"
        assert main(["train", "--data", str(data), "--from-pretrained", str(base), "--out", str(out),
                     *FINE_TUNE]) == 0
        runs[kind] = shutil.copytree(out, root / "elsewhere" / kind)
        shutil.rmtree(out)
    shutil.rmtree(base)
    return runs["embedding"], runs["classification"]


def test_an_embedding_fine_tune_loads_embeds_and_exports_without_its_base(moved_runs, tmp_path, capsys):
    pytest.importorskip("onnxruntime")
    run_dir, _ = moved_runs
    run = load_run(run_dir)
    vectors = run.embed(["the cat sat", "a dog ran"])
    assert vectors.shape == (2, run.dim) and np.allclose(np.linalg.norm(vectors, axis=1), 1, atol=1e-5)
    assert run.evaluate()["mrr_at_10"] >= 0
    assert run.export(onnx=tmp_path / "onnx") == tmp_path / "onnx"
    rc, out, err = run_cli(capsys, "info", str(run_dir))
    assert rc == 0, err
    rc, out, err = run_cli(capsys, "embed", str(run_dir), "the cat sat", "--dtype", "fp32")
    assert rc == 0, err


def test_a_classification_fine_tune_predicts_evaluates_and_exports_without_its_base(moved_runs, tmp_path):
    pytest.importorskip("onnxruntime")
    _, run_dir = moved_runs
    run = load_run(run_dir)
    assert {p["label"] for p in run.predict(["the cat sat", "a dog ran"])} <= {"a", "b"}
    assert 0 <= run.evaluate()["accuracy"] <= 1
    assert run.export(onnx=tmp_path / "onnx") == tmp_path / "onnx"


def test_moved_fine_tunes_serve(moved_runs):
    pytest.importorskip("uvicorn")
    from serve_fixtures import serve

    embedding_run, classification_run = moved_runs
    live = serve(embedding_run)
    try:
        status, _, body = live.post("/v1/embeddings", {"input": ["the cat sat"]})
        assert status == 200, body
    finally:
        live.close()
    live = serve(classification_run)
    try:
        status, _, body = live.post("/predict", {"inputs": "the cat sat"})
        assert status == 200, body
    finally:
        live.close()
