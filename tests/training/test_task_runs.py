"""Training on the synthetic tasks: losses, schedules, the config layers, run directories, resume."""

import json

import pytest
import torch
from safetensors.torch import load_file

from tformer import TransformerConfig
from tformer.kinds import load_run, resolve_config, train
from tformer.nn.model import EncoderClassifier, Seq2SeqTransformer
from tformer.storage.checkpoint import check_run_dir
from tformer.training import PRESETS, TrainConfig, forward_loss, learning_rate, make_optimizer, resume_config
from tformer.training.tasks import get_task

# A config small enough to train a few steps in well under a second.
TINY = dict(d_model=16, n_heads=2, d_ff=32, n_layers=1, batch_size=8, valid_size=16,
            test_size=16, eval_every=3, log_every=2, threads=1, warmup=4)


def _config(**options):
    """Training fields and model options side by side, as on the command line."""
    return TrainConfig.from_flat(options)


# Small tensors: one thread is as fast, and polite to a shared machine.
pytestmark = pytest.mark.usefixtures("one_thread")


def _tiny_model(task, cls=Seq2SeqTransformer, **kw):
    config = TransformerConfig(d_model=32, n_heads=4, d_ff=64, n_layers=2, dropout=0.0,
                               vocab_size=len(task.tokenizer), max_len=task.max_len,
                               n_classes=task.n_classes, **kw)
    return cls(config)


@pytest.mark.parametrize("name, cls", [("reverse", Seq2SeqTransformer),
                                       ("brackets", EncoderClassifier)])
def test_overfits_a_tiny_batch(name, cls):
    task = get_task(name, valid_size=10, test_size=10)
    model = _tiny_model(task, cls)
    batch = task.collate(task.train_batch(0, 8))
    opt = torch.optim.Adam(model.parameters(), lr=3e-3)
    for _ in range(150):
        loss, acc = forward_loss(model, batch)
        opt.zero_grad()
        loss.backward()
        opt.step()
    assert loss.item() < 0.05 and acc == 1.0


def test_future_target_tokens_do_not_change_earlier_logits():
    task = get_task("reverse", valid_size=10, test_size=10)
    model = _tiny_model(task).eval()
    b = task.collate(task.split("test")[:4])
    t = 5
    changed = b.tgt_in.clone()
    changed[:, t:] = torch.randint(4, len(task.tokenizer), changed[:, t:].shape)
    kw = dict(src_attention_mask=b.src_mask)
    before = model(b.src, b.tgt_in, **kw).logits  # (B, T, V)
    after = model(b.src, changed, **kw).logits
    torch.testing.assert_close(before[:, :t], after[:, :t], atol=1e-6, rtol=0)
    assert not torch.allclose(before[:, t:], after[:, t:])  # the change is visible later


def test_inverse_sqrt_schedule_peaks_at_warmup():
    c = TrainConfig(lr=1e-3, warmup=100, schedule="inverse_sqrt")
    assert learning_rate(c, 50) == pytest.approx(5e-4)
    assert learning_rate(c, 100) == pytest.approx(1e-3)
    assert learning_rate(c, 400) == pytest.approx(5e-4)  # ~ step^-0.5 (Vaswani et al. §5.3)
    assert max(learning_rate(c, s) for s in range(1, 1000)) == pytest.approx(1e-3)


def test_cosine_schedule_ends_at_zero():
    c = TrainConfig(lr=1e-3, warmup=10, steps=110, schedule="cosine")
    assert learning_rate(c, 10) == pytest.approx(1e-3)
    assert learning_rate(c, 60) == pytest.approx(5e-4)
    assert learning_rate(c, 110) == pytest.approx(0.0, abs=1e-12)


def test_config_layers_presets_file_and_command_line():
    c = resolve_config({"task": "add"}, {"steps": 7})
    assert c.steps == 7 and c.model.d_model == PRESETS["add"]["d_model"]
    assert resolve_config({}).task == "reverse"
    with pytest.raises(ValueError, match="config: unknown key.*bogus"):
        resolve_config({"bogus": 1})
    with pytest.raises(ValueError, match="task: expected one of .*got 'nope'"):
        resolve_config({"task": "nope"})


@pytest.mark.parametrize("change, message", [
    ({"schedule": "step"}, "schedule: expected one of inverse_sqrt, cosine, linear; got 'step'"),
    ({"steps": 0}, "steps: expected a positive number, got 0"),
    ({"lr": "fast"}, "lr: expected float | None, got 'fast'"),
    ({"label_smoothing": 1.0}, r"label_smoothing: expected a value in \[0, 1\), got 1.0"),
    ({"norm_first": 1}, "norm_first: expected bool, got 1"),
    ({"pooling": "avg"}, r"pooling: expected one of cls, max, mean, mean_sqrt_len \(or several joined by '\+'\); got 'avg'"),
    ({"early_stop": 2.0}, r"early_stop: expected a metric in \(0, 1\] or None, got 2.0"),
])
def test_train_config_errors_name_the_field(change, message):
    with pytest.raises((ValueError, TypeError), match=message):
        TrainConfig.from_flat(change)


def test_optimizer_does_not_decay_vectors():
    task = get_task("reverse", valid_size=10, test_size=10)
    opt = make_optimizer(_tiny_model(task), TrainConfig(weight_decay=0.1))
    decayed, plain = opt.param_groups
    assert all(p.dim() >= 2 for p in decayed["params"]) and plain["weight_decay"] == 0.0


def test_run_writes_checkpoint_metrics_and_curves(tmp_path):
    out = tmp_path / "run"
    record = train(_config(task="reverse", steps=6, out=str(out), **TINY),
                   progress=False, log=lambda *a: None)
    ckpt = check_run_dir(out)
    assert ckpt.parent == out / "checkpoints"
    for name in ("config.json", "model.safetensors", "optimizer.safetensors",
                 "trainer_state.json", "train_config.json"):
        assert (ckpt / name).is_file(), name
    for name in ("metrics.jsonl", "curves.png"):
        assert (out / name).is_file(), name
    assert not list(out.rglob("*.tmp"))  # no temp files left behind
    lines = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    assert lines[-1] == record and record["split"] == "test" and record["step"] == 6
    assert {"exact_match", "accuracy", "wall_seconds"} <= set(record)
    assert [r["step"] for r in lines if r["split"] == "validation"] == [3, 6]
    loaded = load_run(out)
    model, source, config = loaded.model, loaded.objective, loaded.config
    assert config.steps == 6 and source.source.task.name == "reverse" and not model.training
    assert not list(out.glob("*.tmp"))  # no temp files left behind


def test_classification_run_reports_majority_baseline(tmp_path):
    record = train(_config(task="brackets", steps=3, out=str(tmp_path), **TINY),
                   progress=False, log=lambda *a: None)
    assert 0 <= record["accuracy"] <= 1 and 0 < record["baseline"] < 1
    assert record["baseline_by"] == "the majority class" and record["main_metric"] == "accuracy"


def _weights(run_dir):
    return load_file(str(check_run_dir(run_dir) / "model.safetensors"))


@pytest.mark.parametrize("task", ["reverse", "brackets"])
def test_resume_is_bit_for_bit(tmp_path, task):
    base = _config(task=task, dropout=0.3, **{**TINY, "eval_every": 4})  # dropout: RNG matters
    quiet = dict(progress=False, log=lambda *a: None)
    train(base.replace(steps=10, out=str(tmp_path / "straight")), **quiet)
    train(base.replace(steps=5, out=str(tmp_path / "resumed")), **quiet)
    train(resume_config(tmp_path / "resumed", {"steps": 10}), resume=True, **quiet)
    a, b = _weights(tmp_path / "straight"), _weights(tmp_path / "resumed")
    assert a.keys() == b.keys()
    for k in a:
        assert torch.equal(a[k], b[k]), k
    state = json.loads((check_run_dir(tmp_path / "resumed") / "trainer_state.json").read_text())
    assert state["step"] == 10


def test_resume_refuses_to_change_the_experiment(tmp_path):
    train(_config(task="reverse", steps=2, out=str(tmp_path), **TINY), progress=False,
          log=lambda *a: None)
    with pytest.raises(ValueError, match="lr: cannot change when resuming"):
        resume_config(tmp_path, {"lr": 0.5})
    with pytest.raises(ValueError, match="already holds a checkpoint"):
        train(_config(task="reverse", steps=2, out=str(tmp_path), **TINY), progress=False)


def test_resume_detects_files_from_different_steps(tmp_path):
    quiet = dict(progress=False, log=lambda *a: None)
    train(_config(task="reverse", steps=2, out=str(tmp_path), **TINY), **quiet)
    path = check_run_dir(tmp_path) / "trainer_state.json"
    state = json.loads(path.read_text())
    path.write_text(json.dumps({**state, "step": 1}))
    with pytest.raises(ValueError, match="from different steps"):
        train(resume_config(tmp_path, {"steps": 4}), resume=True, **quiet)
