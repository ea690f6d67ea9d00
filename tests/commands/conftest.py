"""Fixtures shared by the command tests."""

import pytest
import torch
from helpers import tiny_train_argv


def _tiny_run(root, rows):
    """A tiny run of two steps on ``rows`` (a data file written under ``root``), trained quietly."""
    import contextlib
    import io

    from text_fixtures import write

    from tformer.commands.cli import main

    data = write(root / "train.jsonl", rows)
    out = root / "run"
    threads = torch.get_num_threads()
    with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(io.StringIO()):
        assert main(["train", "--data", str(data), "--out", str(out), "--steps", "2",
                     "--d-model", "16", "--n-heads", "2", "--d-ff", "32", "--n-layers", "1",
                     "--vocab-size", "260", "--max-tokens", "256", "--eval-every", "2",
                     "--threads", "1", "--quiet"]) == 0
    torch.set_num_threads(threads)
    return out


@pytest.fixture(scope="session")
def classification_run(tmp_path_factory):
    """A tiny classification run on a data file (text, label), trained once for the session.
    Read-only: a test that breaks it copies it first."""
    from text_fixtures import classification_rows

    return _tiny_run(tmp_path_factory.mktemp("classification"), classification_rows(80))


@pytest.fixture(scope="session")
def seq2seq_run(tmp_path_factory):
    """A tiny seq2seq run on a data file (source, target), trained once for the session. Read-only."""
    from text_fixtures import seq2seq_rows

    return _tiny_run(tmp_path_factory.mktemp("seq2seq"), seq2seq_rows(80))


@pytest.fixture(scope="session")
def task_runs(tmp_path_factory):
    """name -> a tiny run of that synthetic task (reverse, listops, ...), trained once for the
    session on first use. Read-only."""
    import contextlib
    import io

    from tformer.commands.cli import main

    runs = {}

    def get(task: str):
        if task not in runs:
            out = tmp_path_factory.mktemp("tasks") / task
            threads = torch.get_num_threads()
            with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(io.StringIO()):
                assert main(tiny_train_argv(out, "--eval-every", 2, task=task)) == 0
            torch.set_num_threads(threads)
            runs[task] = out
        return runs[task]

    return get
