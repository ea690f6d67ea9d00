"""Training on a device: the run trains where --device says (the suite's `device` fixture: the
CPU in CI, the GPU under `make test-gpu`), records it, and its checkpoints load and resume on
any device; the precision is chosen for the device (fp16 with a GradScaler on a GPU without
bf16, simulated here); the GradScaler's steps equal plain ones where nothing overflows."""

import json

import pytest
import torch
from text_fixtures import classification_rows, write

import tformer
from tformer.kinds import make_objective, resolve_config, train
from tformer.storage.checkpoint import check_run_dir
from tformer.training import precision as training_precision
from tformer.training import resume_config
from tformer.training.steps import make_optimizer, train_step

TINY = {"d_model": 16, "n_heads": 2, "d_ff": 32, "n_layers": 1, "batch_size": 8, "valid_size": 16,
        "test_size": 16, "eval_every": 2, "threads": 1}


def test_a_run_trains_on_the_device_records_it_and_loads_on_any(tmp_path, device):
    out = tmp_path / "run"
    logged = []
    record = train(resolve_config({"task": "reverse", "steps": 4, "out": str(out), "device": str(device),
                                   **TINY}), progress=False, log=logged.append)
    assert record["device"] == str(device)
    state = json.loads((check_run_dir(out) / "trainer_state.json").read_text())
    assert state["device"] == str(device)
    assert any(line.startswith(f"device: {device}") for line in logged), logged
    inputs = ["3 1 4 1 5", "2 7 1 8"]
    here = tformer.load_run(out, device=device)
    on_cpu = tformer.load_run(out, device="cpu")
    assert next(here.model.parameters()).device == device
    assert next(on_cpu.model.parameters()).device.type == "cpu"
    assert here.generate(inputs) == on_cpu.generate(inputs)  # greedy: the same argmax either way
    # ... and resumes on the CPU, from where it stopped on the device
    train(resume_config(out, {"steps": 6, "device": "cpu"}), resume=True, progress=False, log=logged.append)
    state = json.loads((check_run_dir(out) / "trainer_state.json").read_text())
    assert state["step"] == 6 and state["device"] == "cpu"


def test_a_classification_run_on_the_device_predicts_and_evaluates(tmp_path, device):
    data = write(tmp_path / "d.jsonl", classification_rows(80))
    run = tformer.train(data=str(data), out=str(tmp_path / "c"), device=str(device), steps=2, d_model=16,
                        n_heads=2, d_ff=32, n_layers=1, vocab_size=260, max_tokens=256, eval_every=2,
                        threads=1, progress=False, log=lambda *a: None)
    assert next(run.model.parameters()).device == device
    on_cpu = tformer.load_run(tmp_path / "c", device="cpu")
    for a, b in zip(run.predict(["a big cat", "the river"]), on_cpu.predict(["a big cat", "the river"]),
                    strict=True):
        assert a["label"] == b["label"]
        assert max(abs(a["probabilities"][k] - b["probabilities"][k]) for k in a["probabilities"]) < 1e-4
    assert set(run.evaluate()) >= {"accuracy", "loss"}


def test_the_precision_is_chosen_for_the_device(monkeypatch):
    gpu = torch.device("cuda", 0)
    monkeypatch.setattr(training_precision, "gpu_name", lambda device: "Fake GPU, sm_75")
    monkeypatch.setattr(torch.cuda, "is_bf16_supported", lambda *a, **k: False)
    assert training_precision.choose_precision("auto", gpu)[0] == "fp16"
    with pytest.raises(ValueError, match=r"^precision: this GPU \(Fake GPU, sm_75\) has no bf16 units; expected auto \(fp16 autocast with a GradScaler\) or fp32, got bf16$"):
        training_precision.choose_precision("bf16", gpu)
    monkeypatch.setattr(torch.cuda, "is_bf16_supported", lambda *a, **k: True)
    assert training_precision.choose_precision("auto", gpu)[0] == "bf16"
    assert training_precision.choose_precision("fp32", gpu) == ("fp32", "asked for")
    mps = torch.device("mps")
    assert training_precision.choose_precision("auto", mps)[0] == "fp32"
    with pytest.raises(ValueError, match=r"^precision: bf16 autocast is not supported on mps here"):
        training_precision.choose_precision("bf16", mps)


def _three_updates(config, **step):
    """(model, optimizer) after 3 train_step updates from seed 0 of the reverse task, with `step`'s
    keyword arguments."""
    objective = make_objective(config)
    torch.manual_seed(0)
    model = objective.build_model()
    optimizer = make_optimizer(model, config)
    batches = objective.train_batches(0)
    for _ in range(3):
        train_step(model, optimizer, objective, batches, config, 1e-3, **step)
    return model, optimizer


def test_grad_scaler_steps_equal_plain_steps_where_nothing_overflows(tmp_path):
    """fp16's loss scaling is a power of two: scaled, unscaled before clipping, the update is
    the plain one, bit for bit (the scaler path of train_step, run on the CPU)."""
    config = resolve_config({"task": "reverse", **TINY, "dropout": 0.0})
    weights = []
    for scaler in (None, torch.amp.GradScaler("cpu", init_scale=2.0**8)):
        model, _ = _three_updates(config, scaler=scaler)
        weights.append({k: v.clone() for k, v in model.state_dict().items()})
    assert all(torch.equal(weights[0][k], weights[1][k]) for k in weights[0])


def test_a_warm_pass_leaves_the_update_and_the_random_draws_as_they_were():
    """The precision timing's untimed pass (steps.warm_pass) before an update: the weights, the
    optimizer's moments and the global generator come out bit for bit as without it (dropout
    0.1 draws in both passes), and its seconds are handed back, one entry an update."""
    config = resolve_config({"task": "reverse", **TINY})
    after = []
    for warm in (None, []):
        model, optimizer = _three_updates(config, warm=warm)
        moments = [v.clone() for state in optimizer.state.values() for v in state.values()
                   if torch.is_tensor(v)]
        after.append(({k: v.clone() for k, v in model.state_dict().items()}, moments, torch.get_rng_state()))
        if warm is not None:
            assert len(warm) == 3 and all(seconds > 0 for seconds in warm)
    (weights, moments, rng), (weights_w, moments_w, rng_w) = after
    assert all(torch.equal(weights[k], weights_w[k]) for k in weights)
    assert len(moments) == len(moments_w) > 0
    assert all(torch.equal(a, b) for a, b in zip(moments, moments_w, strict=True))
    assert torch.equal(rng, rng_w)
