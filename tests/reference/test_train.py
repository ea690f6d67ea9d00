"""Training with the NumPy reference: one step equals PyTorch's, a run directory loads in
PyTorch with the same logits, and the command runs with torch blocked."""

import json
import subprocess
import sys

import numpy as np
import pytest
import torch
from helpers import assert_close, copy_weights, relative_error

from tformer.kinds import load_run
from tformer.kinds.classification import Classification
from tformer.kinds.seq2seq import Seq2Seq
from tformer.reference import train as numpy_train
from tformer.training import steps as torch_train
from tformer.training.config import TrainConfig
from tformer.training.schedule import learning_rate
from tformer.training.sources import TaskSource
from tformer.training.tasks import get_task

# Small tensors: one torch thread is as fast, and polite to a shared machine.
pytestmark = pytest.mark.usefixtures("one_thread")

def _config(**options) -> TrainConfig:
    return TrainConfig.from_flat(options)


TINY = dict(d_model=16, n_heads=2, d_ff=32, n_layers=1, batch_size=8, valid_size=16,
            test_size=16, eval_every=3, log_every=2, warmup=4)


def test_collate_arrays_is_collate_without_torch():
    task = get_task("reverse")
    examples = task.train_batch(0, 5)
    ours, theirs = task.collate_arrays(examples), task.collate(examples)
    for name in ("src", "src_mask", "tgt_in", "tgt_mask", "labels"):
        assert isinstance(getattr(ours, name), np.ndarray)
        np.testing.assert_array_equal(getattr(ours, name), getattr(theirs, name).numpy())


@pytest.mark.parametrize("task_name", ["reverse", "brackets"])
def test_train_steps_equal_pytorch_train_steps(task_name):
    """Loss, gradients, clipping, AdamW, weight decay groups, the schedule: three steps of
    the NumPy loop leave the same weights as tformer.train's (float64, no dropout)."""
    config = _config(task=task_name, dropout=0.0, lr=3e-3, warmup=2, clip_grad=0.5, **{
        k: v for k, v in TINY.items() if k not in ("warmup",)})
    task = get_task(task_name, 0, 16, 16)
    torch.manual_seed(0)
    source = _objective(task, config)
    theirs = source.build_model().double()
    ours = numpy_train.build_model(config, task, np.float64)
    copy_weights(theirs, ours)
    torch_opt = torch_train.make_optimizer(theirs, config)
    our_opt = numpy_train.make_optimizer(ours, config)
    for step in range(3):
        examples = task.train_batch(step, config.batch_size)
        lr = learning_rate(config, step + 1)
        loss_t, _, _, _ = torch_train.train_step(theirs, torch_opt, source,
                                              iter([task.collate(examples)]), config, lr)
        loss_n, _ = numpy_train.train_step(ours, our_opt, task.collate_arrays(examples), config,
                                           lr, None)
        assert abs(loss_n - loss_t) <= 1e-12 * abs(loss_t)
    expected = theirs.state_dict()
    for key, value in ours.state_dict().items():
        assert relative_error(value, expected[key]) <= 1e-9, key


def test_init_weights_follows_the_pytorch_distributions():
    config = _config(task="reverse", d_model=64, d_ff=256)
    task = get_task("reverse", 0, 16, 16)
    model = numpy_train.build_model(config, task)
    numpy_train.init_weights(model, np.random.default_rng(0))
    torch.manual_seed(0)
    reference = _objective(task, config).build_model().state_dict()
    for key, value in model.state_dict().items():
        theirs = reference[key].numpy()
        slack = 6 / np.sqrt(value.size)  # two samples' means and stds: ~4 sigma apart at most
        assert abs(value.std() - theirs.std()) <= slack * theirs.std() + 1e-6, key
        assert abs(value.mean() - theirs.mean()) <= slack * theirs.std() + 1e-6, key


@pytest.mark.parametrize("task_name", ["reverse", "brackets"])
def test_numpy_run_directory_loads_in_pytorch_with_the_same_logits(tmp_path, task_name):
    record = numpy_train.train(_config(task=task_name, steps=4, out=str(tmp_path), **TINY),
                               progress=False, log=lambda *a: None)
    lines = [json.loads(x) for x in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    assert lines[-1] == record and record["split"] == "test" and record["step"] == 4
    assert {r["split"] for r in lines} == {"train", "validation", "test"}
    loaded = load_run(tmp_path)  # the PyTorch side reads it
    model, source, config = loaded.model, loaded.objective, loaded.config
    task = source.source.task
    assert config.task == task_name
    mirror = numpy_train.build_model(config, task)
    mirror.load_safetensors(tmp_path / "model.safetensors")
    batch = task.collate_arrays(task.split("test")[:8])
    with torch.no_grad():
        if task.kind == "seq2seq":
            theirs = model(*(torch.from_numpy(a) for a in (batch.src, batch.tgt_in,
                                                           batch.src_mask, batch.tgt_mask))).logits
            ours = mirror(batch.src, batch.tgt_in, batch.src_mask, batch.tgt_mask).logits
        else:
            theirs = model(torch.from_numpy(batch.input_ids),
                           torch.from_numpy(batch.attention_mask)).logits
            ours = mirror(batch.input_ids, batch.attention_mask).logits
    assert_close(ours, theirs, np.float32, what="logits")
    metrics, _ = source.evaluate(model, "test")  # same test metric both sides
    key = "exact_match" if task.kind == "seq2seq" else "accuracy"
    assert metrics[key] == record[key]


def test_cli_numpy_engine_runs_with_torch_blocked(tmp_path):
    code = (
        "import sys; sys.modules['torch'] = None\n"  # any `import torch` now fails
        "from tformer.commands.cli import main\n"
        f"sys.exit(main(['train', '--task', 'copy', '--engine', 'numpy', '--steps', '3',"
        f" '--d-model', '16', '--n-heads', '2', '--d-ff', '32', '--n-layers', '1',"
        f" '--batch-size', '4', '--valid-size', '8', '--test-size', '8', '--eval-every', '2',"
        f" '--quiet', '--out', {str(tmp_path)!r}]))\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert out.returncode == 0, out.stderr
    assert "test exact_match" in out.stdout
    for name in ("config.json", "model.safetensors", "train_config.json", "metrics.jsonl"):
        assert (tmp_path / name).is_file(), name


def test_cli_numpy_engine_refuses_resume(tmp_path, capsys):
    from tformer.commands.cli import main

    assert main(["train", "--engine", "numpy", "--resume", str(tmp_path)]) == 2
    assert "numpy engine cannot resume" in capsys.readouterr().err


def _numpy_argv(out, *options) -> list[str]:
    from helpers import tiny_train_argv

    return tiny_train_argv(out, "--engine", "numpy", "--eval-every", 2, *options)


@pytest.mark.parametrize("before", ["nothing", "a finished run"])
def test_a_numpy_run_into_an_out_another_process_trains_in_is_refused_as_a_torch_run_is(tmp_path, capsys,
                                                                                      before):
    """Two runs on one --out must not both write (both did: their metrics.jsonl lines interleaved).
    The NumPy engine takes the torch trainer's run lock, and the second gets its one line, whatever
    the directory holds, and touches nothing."""
    import os

    from helpers import tiny_train_argv

    from tformer.commands.cli import main
    from tformer.storage.rundir import RunLock

    out = tmp_path / "run"
    out.mkdir()
    if before == "a finished run":
        assert main(_numpy_argv(out)) == 0
    capsys.readouterr()
    errors = []
    with RunLock(out):  # another process trains there (a real flock, on another open file)
        files = {p.name: p.read_bytes() for p in out.iterdir()}
        for argv in (_numpy_argv(out), tiny_train_argv(out)):  # the NumPy engine, then torch
            assert main(argv) == 2
            errors.append(capsys.readouterr().err)
        assert {p.name: p.read_bytes() for p in out.iterdir()} == files
    assert errors[0] == errors[1] == (f"tformer train: error: --out: {out} is in use by another tformer "
                                      f"process (pid {os.getpid()}); wait for it to finish or choose "
                                      "another --out\n")


def test_a_numpy_run_killed_at_any_write_keeps_a_whole_model_or_starts_again(tmp_path, capsys):
    """kill -9 at each durable write of a NumPy run (its saves at steps 2 and 4 and the final one):
    the directory holds a whole model that loads (a NumPy run does not resume; the same command is
    refused), or none, and the same command then starts it again. A model without its
    train_config.json (killed between the two) was neither: not loadable, and refused as a checkpoint."""
    from cli_helpers import killed_at

    from tformer.commands.cli import main
    from tformer.storage import files

    seen: list[str] = []
    files.fault_hook = seen.append
    try:
        assert main(_numpy_argv(tmp_path / "whole", "--log-every", 1, "--steps", 4)) == 0
    finally:
        files.fault_hook = None
    assert len(seen) == 18, seen  # three saves of three files, each written then renamed
    for k in range(1, len(seen) + 1):
        out = tmp_path / f"k{k}"
        assert killed_at(k, _numpy_argv(out, "--log-every", 1, "--steps", 4)), k
        steps = [r["step"] for r in map(json.loads, (out / "metrics.jsonl").read_text().splitlines())]
        assert steps == sorted(steps) and steps, k  # whole lines of one run
        capsys.readouterr()
        if (out / "model.safetensors").exists():
            assert load_run(out).config.task == "reverse", k  # loads: config, weights, train config
            assert main(_numpy_argv(out, "--steps", 4)) == 2, k
            assert "already holds a checkpoint; choose another --out" in capsys.readouterr().err, k
        else:
            assert main(_numpy_argv(out, "--steps", 4)) == 0, k  # starts again from nothing
            assert json.loads((out / "metrics.jsonl").read_text().splitlines()[-1])["split"] == "test"


def _objective(task, config):
    """The PyTorch side's objective of a synthetic task."""
    return {"seq2seq": Seq2Seq, "classification": Classification}[task.kind](TaskSource(task, config))
