"""tformer.kinds.load_run: a run directory read whole, even while its run trains on."""

import contextlib
import io
import shutil

import pytest
import torch
from helpers import prune_at_first_read, tiny_train_argv

from tformer.commands.cli import main
from tformer.kinds import describe_run, load_run


@pytest.fixture(scope="module")
def trained(tmp_path_factory):
    out = tmp_path_factory.mktemp("runs") / "reverse"
    threads = torch.get_num_threads()
    with contextlib.redirect_stdout(io.StringIO()):
        assert main(tiny_train_argv(out, "--eval-every", 2)) == 0
    torch.set_num_threads(threads)
    return out


def test_a_run_loads_from_the_newer_checkpoint_when_a_live_run_prunes_the_one_it_found(
        tmp_path, monkeypatch, trained):
    """eval, predict and the server load a run through load_run: the checkpoint it found through
    checkpoints/latest is pruned by the live run before its files are read; it reads the newer one."""
    run = tmp_path / "run"
    shutil.copytree(trained, run)
    before = load_run(run, device="cpu")
    pruned = prune_at_first_read(monkeypatch)
    after = load_run(run, device="cpu")
    assert len(pruned) == 1 and not pruned[0].exists()
    assert after.config == before.config
    theirs = after.model.state_dict()
    assert all(torch.equal(v, theirs[k]) for k, v in before.model.state_dict().items())
    monkeypatch.undo()
    pruned = prune_at_first_read(monkeypatch)
    assert describe_run(run) == (before.description, "generate") and len(pruned) == 1


@pytest.mark.parametrize("path, error, message", [
    (5, TypeError, r"^path: expected a run directory \(str or os\.PathLike\), got int$"),
    (None, TypeError, r"^path: expected a run directory \(str or os\.PathLike\), got NoneType$"),
    ("", ValueError, r"^path: expected a run directory, got ''$"),  # was read as ".", the current folder
])
def test_load_run_refuses_a_path_of_another_type_naming_it(path, error, message):
    with pytest.raises(error, match=message):
        load_run(path)
    with pytest.raises(error, match=message):
        describe_run(path)


@pytest.mark.parametrize("needs", [5, "zz"])
def test_load_run_refuses_an_unknown_verb(trained, needs):
    # 5 was getattr's "attribute name must be string"; "zz" told to use another command.
    with pytest.raises(ValueError, match=rf"^needs: expected a run's method \(predict, generate, embed, (\w+, )*\.\.\.\) or "
                                         rf"None, got {needs!r}$"):
        load_run(trained, needs=needs)


def test_load_run_keeps_freed_memory_for_a_model_on_the_cpu(trained, monkeypatch):
    """load_run applies the allocator's setting for the device it resolved, as tformer.train and
    the command line do (a search's steps from Python: 0.85-0.95x the time with it)."""
    import tformer.kinds

    seen = []
    monkeypatch.setattr(tformer.kinds, "keep_freed_memory", seen.append)
    load_run(trained, device="cpu")
    assert seen == ["cpu"]
