"""Every script in benchmarks/ runs: a smoke run of each at tiny sizes (seconds; its numbers
mean nothing), so a script cannot rot unnoticed as benchmarks/serve.py once did (an ImportError
that nothing ran). Scripts that need minutes even at their smallest are marked slow."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
from hf_bert_fixtures import st_dir
from text_fixtures import classification_rows, seq2seq_rows, write

ROOT = Path(__file__).resolve().parents[2]
BENCH = ROOT / "benchmarks"
QUICK_BENCH = ["--quick", "--rounds", "1", "--threads", "1"]


def _run(script: str, *args: str, timeout: float = 300) -> str:
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(ROOT / "src"), os.environ.get("PYTHONPATH", "")]))
    done = subprocess.run([sys.executable, str(BENCH / script), *args], capture_output=True, text=True,
                          timeout=timeout, env=env, cwd=ROOT)
    assert done.returncode == 0, f"{script} failed:\n{done.stdout[-2000:]}\n{done.stderr[-3000:]}"
    return done.stdout


def test_every_script_has_a_smoke_run():
    scripts = {p.relative_to(BENCH).as_posix() for p in BENCH.rglob("*.py")}
    covered = {*(s for s, _ in BENCH_SUITE), "serve.py", "serve_wait.py", "classifier_pooling.py", "precision_accuracy.py",
               "precision_training.py", "search_memory.py", "train_own_data.py", "data/build_datasets.py",
               "budget.py", "decode_run.py", "search_ann.py", "mine_negatives.py",
               # tests/benchmarks/test_multilabel_scripts.py
               "class_weights.py", "data/multilabel_data.py", "multilabel_thresholds.py", "multilabel_vs_hf.py"}
    assert scripts == covered, f"scripts without a smoke run: {sorted(scripts - covered)}"


# The scripts that run `tformer bench --only ...`: --quick is its tiny size.
BENCH_SUITE = [("bf16.py", False), ("decoding.py", False), ("gemm.py", False), ("inference.py", False),
               ("memory.py", False), ("numpy_reference.py", False), ("runtimes.py", True),  # ~45 s
               ("training.py", False)]


@pytest.mark.parametrize("script", [pytest.param(s, marks=pytest.mark.slow) if slow else s
                                    for s, slow in BENCH_SUITE])
def test_bench_suite_script(script):
    assert "|" in _run(script, *QUICK_BENCH)  # its markdown table


def test_search_ann(tmp_path):
    pytest.importorskip("faiss")
    _run("search_ann.py", "generate", "--n", "3000", "--dim", "16", "--out", str(tmp_path / "v.npy"))
    _run("search_ann.py", "generate", "--n", "50", "--dim", "16", "--seed", "9", "--centres-of", "3000",
         "--out", str(tmp_path / "q.npy"))
    out = _run("search_ann.py", "commands", "--vectors", str(tmp_path / "v.npy"), "--queries",
               str(tmp_path / "q.npy"), "--ann", "ivfpq", "--work", str(tmp_path / "w"))
    assert "| approximate | 50 |" in out and "recall@10" in out


@pytest.mark.slow
def test_mine_negatives(tmp_path):
    rows = [{"anchor": f"the {w} number {i}", "positive": f"a {w} {i}"}
            for i, w in enumerate(["cat", "dog", "river", "sun", "moon", "book"] * 300)]
    pairs = write(tmp_path / "pairs.jsonl", rows)
    out = _run("mine_negatives.py", "--pairs", str(pairs), "--model", str(st_dir()), "--train", "200",
               "--minutes", "0.5", "--work", str(tmp_path / "w"), timeout=600)
    assert "| mined |" in out


def test_serve(tmp_path):
    out = _run("serve.py", "--quick")
    assert "| tformer serve (fp32) | 64 |" in out


def test_serve_wait():
    pytest.importorskip("openai")
    out = _run("serve_wait.py", "--model-dir", str(st_dir()), "--samples", "2", "--max-batch-tokens", "512")
    assert "| 2 samples |" in out


def test_classifier_pooling(tmp_path):
    data = write(tmp_path / "train.jsonl", classification_rows())
    out = _run("classifier_pooling.py", str(data), "--steps", "2")
    rows = [line.split() for line in out.splitlines() if line.startswith("train ")]
    assert [row[1] for row in rows] == ["cls", "mean", "cls-uniform"], out  # one table row per pooling


def test_budget(tmp_path):
    """One row of the budget's matrix (a 12-second classification run, quiet), then its table."""
    write(tmp_path / "debian_sections.jsonl", classification_rows())
    out = tmp_path / "out"
    row = _run("budget.py", "--runs", "classification", "--minutes", "0.2", "--busy", "0",
               "--data-dir", str(tmp_path), "--out", str(out))
    assert "| classification | 0.2 min | 0 |" in row
    table = _run("budget.py", "--table", str(out / "results.jsonl"))
    assert table.startswith("CPU: ") and "| classification | 0.2 min | 0 |" in table


def test_precision_accuracy():
    assert "int8" in _run("precision_accuracy.py", str(st_dir()), "--count", "8", "--threads", "1")


def test_search_memory(tmp_path):
    assert "| 50 |" in _run("search_memory.py", "--lines", "50", "--dir", str(tmp_path), "--batch-size", "16")


@pytest.mark.slow  # ~10 s: three training processes
def test_precision_training(tmp_path):
    out = _run("precision_training.py", "--data-dir", str(tmp_path / "none"), "--out", str(tmp_path / "runs"),
               "--only", "reverse", "--steps-scale", "0.002", "--threads", "1")
    assert "| reverse |" in out


def test_build_datasets(tmp_path):
    _run("data/build_datasets.py", "--out", str(tmp_path))
    assert (tmp_path / "debian_sections.jsonl").is_file()


@pytest.mark.slow  # ~30 s: both sides train
def test_train_own_data(tmp_path):
    _run("data/build_datasets.py", "--out", str(tmp_path / "data"))
    _run("train_own_data.py", "--data-dir", str(tmp_path / "data"), "--minutes", "0.2", "--threads", "1",
         "--only", "classification", "--out", str(tmp_path / "runs"), timeout=600)


def test_decode_run(tmp_path):
    """A tiny seq2seq run (2 steps) decoded by tformer (and CTranslate2 where installed)."""
    from tformer.kinds import resolve_config, train

    data = write(tmp_path / "d.jsonl", seq2seq_rows(300))
    train(resolve_config({"data": str(data), "d_model": 32, "n_heads": 2, "d_ff": 64, "n_layers": 1,
                          "vocab_size": 300, "steps": 2, "threads": 1, "precision": "fp32",
                          "out": str(tmp_path / "run")}), progress=False, log=lambda line: None)
    out = _run("decode_run.py", str(tmp_path / "run"), "--count", "12", "--rounds", "1", "--threads", "1")
    assert "| tformer beam 4 |" in out and out.count("/12 |") >= 2, out
