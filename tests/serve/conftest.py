"""The tiny directories and runs the server tests serve (the ones other tests use)."""

from __future__ import annotations

from pathlib import Path

import pytest
from hf_bert_fixtures import st_dir
from text_fixtures import classification_rows, seq2seq_rows, write

from tformer.commands.cli import main

pytest.importorskip("uvicorn", reason="the serve extra: pip install 'tformer[serve]'")
pytest.importorskip("starlette", reason="the serve extra: pip install 'tformer[serve]'")

from serve_fixtures import TINY_RUN, serve  # noqa: E402  (after the skips)


@pytest.fixture(autouse=True)
def _kernel_cache_env(monkeypatch):
    """`tformer serve` sizes oneDNN's kernel caches in its process's environment (run in-process
    here): keep that out of the tests and subprocesses that follow."""
    from tformer.commands.serve import KERNEL_CACHE

    for name in KERNEL_CACHE:
        monkeypatch.delenv(name, raising=False)


@pytest.fixture(scope="session")
def embedding_dir() -> Path:
    return st_dir()  # max_seq_length 16: long texts are cut


@pytest.fixture(scope="session")
def classification_run(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("serve-cls")
    data = write(root / "train.jsonl", classification_rows())
    assert main(["train", "--data", str(data), "--out", str(root / "run"), *TINY_RUN]) == 0
    return root / "run"


@pytest.fixture(scope="session")
def seq2seq_run(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("serve-s2s")
    data = write(root / "train.jsonl", seq2seq_rows())
    assert main(["train", "--data", str(data), "--out", str(root / "run"), *TINY_RUN]) == 0
    return root / "run"


@pytest.fixture(scope="module")
def embedding_server(embedding_dir):
    live = serve(embedding_dir)
    yield live
    live.close()


@pytest.fixture(scope="module")
def classification_server(classification_run):
    live = serve(classification_run)
    yield live
    live.close()


@pytest.fixture(scope="module")
def seq2seq_server(seq2seq_run):
    live = serve(seq2seq_run)
    yield live
    live.close()
