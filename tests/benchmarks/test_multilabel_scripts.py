"""Smoke runs of the multi-label and class-weight benchmark scripts (their numbers mean nothing
at these sizes): the data builder, the class-weights comparison, the threshold analysis and
the comparison with Hugging Face."""

from __future__ import annotations

import random

import pytest
from text_fixtures import classification_rows, write

from tests.benchmarks.test_scripts import _run


def label_rows(n: int, seed: int = 0) -> list[dict]:
    rng = random.Random(seed)
    groups = {"animal": ["cat", "dog"], "place": ["house", "river"], "color": ["red", "blue"]}
    rows = []
    for i in range(n):
        labels = [g for g in groups if rng.random() < 0.4]
        words = [rng.choice(groups[g]) for g in labels] + ["the", str(i)]
        rows.append({"text": " ".join(words), "labels": labels})
    return rows


@pytest.mark.slow  # ~40 s: apt's package lists and the man pages are read
def test_multilabel_data(tmp_path):
    _run("data/multilabel_data.py", "--out", str(tmp_path), timeout=600)
    assert (tmp_path / "debtags.jsonl").is_file() and (tmp_path / "sections_skew100.jsonl").is_file()


@pytest.mark.slow  # ~30 s: six training processes
def test_class_weights(tmp_path):
    write(tmp_path / "sections_skew100.jsonl", classification_rows(120))
    write(tmp_path / "debtags.jsonl", label_rows(200))
    out = _run("class_weights.py", "--data-dir", str(tmp_path), "--out", str(tmp_path / "cw"), "--steps", "4",
               "--only", "sections_skew100", "debtags", "--prior", timeout=600)
    assert "| sections_skew100 |" in out and "| debtags |" in out and "sqrt-noprior" in out


def test_multilabel_thresholds(tmp_path):
    from tformer.commands.cli import main

    data = write(tmp_path / "tags.jsonl", label_rows(200))
    assert main(["train", "--data", str(data), "--out", str(tmp_path / "run"), "--d-model", "16", "--n-heads", "2",
                 "--d-ff", "32", "--n-layers", "1", "--vocab-size", "300", "--steps", "4", "--eval-every", "2",
                 "--threads", "1", "--quiet"]) == 0
    out = _run("multilabel_thresholds.py", str(tmp_path / "run"))
    assert out.count("|") >= 2 * 10 and "m=5" in out


@pytest.mark.slow  # ~3 min: three processes train for 1-2 min, side by side (a busy machine starts slowly)
def test_multilabel_vs_hf(tmp_path):
    data = write(tmp_path / "tags.jsonl", label_rows(1200))
    out = _run("multilabel_vs_hf.py", "--data", str(data), "--minutes", "2", "--modes", "scratch", "--out",
               str(tmp_path / "runs"), timeout=600)
    assert "| scratch | 2 min |" in out
