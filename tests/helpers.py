"""Shared test helpers: one tolerance per dtype, stated once, and a comparison that reports."""

from __future__ import annotations

import numpy as np

# Max abs difference allowed between two implementations run on the same weights.
TOLERANCE = {np.dtype(np.float64): 1e-10, np.dtype(np.float32): 1e-5}


def to_numpy(x) -> np.ndarray:
    if hasattr(x, "detach"):
        x = x.detach().cpu().numpy()
    return np.asarray(x)


def assert_close(actual, expected, dtype=np.float32, where=None, what: str = "") -> float:
    """Max |actual - expected| (over `where` if given, a bool mask) must be <= TOLERANCE[dtype]."""
    a, e = to_numpy(actual).astype(np.float64), to_numpy(expected).astype(np.float64)
    assert a.shape == e.shape, f"{what}: shape {a.shape} != {e.shape}"
    diff = np.abs(a - e)
    if where is not None:
        diff = diff[np.broadcast_to(to_numpy(where), diff.shape[: to_numpy(where).ndim])]
    worst = float(diff.max()) if diff.size else 0.0
    tol = TOLERANCE[np.dtype(dtype)]
    assert worst <= tol, f"{what}: max abs diff {worst:.3e} > {tol:.0e} ({np.dtype(dtype)})"
    return worst


def padding_mask(lengths, max_len=None) -> np.ndarray:
    """(B, S) bool, True = real token, from per-row lengths."""
    max_len = max(lengths) if max_len is None else max_len
    return np.arange(max_len)[None, :] < np.asarray(lengths)[:, None]


# Gradients: float64, per tensor, max |ours - torch| / max |torch| (1e-300 when torch's is
# all zero, so two all-zero gradients agree and a spurious non-zero one fails).
GRAD_RTOL = 1e-9


def relative_error(actual, expected) -> float:
    a, e = to_numpy(actual).astype(np.float64), to_numpy(expected).astype(np.float64)
    assert a.shape == e.shape, f"shape {a.shape} != {e.shape}"
    return float(np.abs(a - e).max() / max(np.abs(e).max(), 1e-300)) if e.size else 0.0


def assert_grads_match(grads: dict, torch_module, what: str = "") -> float:
    """Every parameter's gradient (keys as the state dict) within GRAD_RTOL of torch's."""
    theirs = dict(torch_module.named_parameters())
    assert set(grads) == set(theirs), f"{what}: gradient keys differ: {set(grads) ^ set(theirs)}"
    worst, worst_key = 0.0, None
    for key, p in theirs.items():
        expected = p.grad if p.grad is not None else np.zeros(tuple(p.shape))
        assert np.isfinite(grads[key]).all(), f"{what}: {key} has a non-finite gradient"
        err = relative_error(grads[key], expected)
        if err > worst:
            worst, worst_key = err, key
    assert worst <= GRAD_RTOL, f"{what}: max relative error {worst:.3e} at {worst_key}"
    return worst


def copy_weights(torch_module, mirror) -> None:
    """Load the torch module's weights into the NumPy mirror, asserting identical keys."""
    state = {k: v.detach().numpy() for k, v in torch_module.state_dict().items()}
    assert set(state) == set(mirror.state_dict()), "state-dict keys must be identical"
    mirror.load_state_dict(state)


def finite_difference(loss_fn, array: np.ndarray, index: tuple, h: float = 1e-6) -> float:
    """Central difference (loss(a + h) - loss(a - h)) / 2h of loss_fn() in array[index]."""
    saved = array[index]
    array[index] = saved + h
    up = loss_fn()
    array[index] = saved - h
    down = loss_fn()
    array[index] = saved
    return (up - down) / (2 * h)


def data_objective(data, config):
    """The objective of a data run's TextData under `config` (as tformer.kinds builds it)."""
    from tformer.kinds import kind_named
    from tformer.training.sources import FileSource

    return kind_named(data.fields.objective).objective(FileSource(data, config))


def build_data(config, run_dir=None, write=True):
    """TextData.build with the fields of the config's kind (as tformer.kinds.make_objective calls it)."""
    from tformer.kinds import kind_of_config
    from tformer.training.dataset import TextData

    return TextData.build(config, kind_of_config(config, run_dir).fields, run_dir, write=write)


def write_run(run_dir, checkpoint_model, best_model=None):
    """A run directory as `tformer train` leaves it: a published checkpoint of
    `checkpoint_model` and, when given, best.safetensors holding `best_model`'s weights."""
    import torch
    from safetensors.torch import save_file

    from tformer.storage.checkpoint import save_checkpoint

    class _Config:  # the TrainConfig's place: only its to_dict is written
        def to_dict(self):
            return {}

    run_dir.mkdir(parents=True, exist_ok=True)
    opt = torch.optim.SGD(checkpoint_model.parameters(), lr=0.1)
    save_checkpoint(run_dir, checkpoint_model, opt, _Config(), {"step": 7})
    if best_model is not None:
        save_file({k: v.detach().contiguous() for k, v in best_model.state_dict().items()},
                  str(run_dir / "best.safetensors"))
    return run_dir


def record_expectations(monkeypatch, module) -> list:
    """``module.expecting`` (kernels.compiling.expecting, as the module imported it) replaced by
    a block that records the eager seconds each job says it expects. Returns the list."""
    import contextlib

    expected: list = []

    @contextlib.contextmanager
    def recording(seconds):
        expected.append(seconds)
        yield

    monkeypatch.setattr(module, "expecting", recording)
    return expected


def prune_at_first_read(monkeypatch) -> list:
    """A live run's pruning racing a reader, made deterministic: the first time a file of a published
    checkpoint (RUN/checkpoints/step-N/NAME) is read as text, the run publishes a newer one (a copy:
    step-N+1, named by `latest`) and removes step-N, just before the read. Returns the pruned paths."""
    import shutil
    from pathlib import Path

    from tformer.storage.checkpoint_names import NAME, POINTER, order

    read_text, pruned = Path.read_text, []

    def racing(self, *args, **kwargs):
        found = self.parent
        if not pruned and NAME.match(found.name) and found.parent.name == "checkpoints":
            newer = found.with_name(f"step-{order(found.name)[0] + 1:06d}")
            shutil.copytree(found, newer)
            (found.parent / POINTER).write_text(newer.name + "\n")
            shutil.rmtree(found)
            pruned.append(found)
        return read_text(self, *args, **kwargs)

    monkeypatch.setattr(Path, "read_text", racing)
    return pruned


def briefly_trained_reverse(layers: int = 1):
    """A reverse-task seq2seq model (d 32) after 120 updates, in eval mode, and a batch of six test
    sources of varied lengths: its outputs stop (EOS) at different steps but it is still unsure,
    so beam search and greedy disagree on some sources."""
    import torch

    from tformer import TransformerConfig
    from tformer.nn.model import Seq2SeqTransformer
    from tformer.training import forward_loss
    from tformer.training.tasks import get_task

    task = get_task("reverse", valid_size=10, test_size=10)
    torch.manual_seed(0)
    config = TransformerConfig(d_model=32, n_heads=4, d_ff=64, n_layers=layers, dropout=0.0,
                               vocab_size=len(task.tokenizer), max_len=task.max_len)
    model = Seq2SeqTransformer(config)
    opt = torch.optim.Adam(model.parameters(), lr=3e-3)
    for step in range(120):
        loss, _ = forward_loss(model, task.collate(task.train_batch(step, 32)))
        opt.zero_grad()
        loss.backward()
        opt.step()
    return model.eval(), task.collate(task.split("test")[:6])  # varied lengths -> padded sources


# A synthetic-task run small enough for any test: a one-layer model of width 16, batches and
# held-out splits of 8 examples, one thread, no progress bar.
TINY_TRAIN = ("--d-model", "16", "--n-heads", "2", "--d-ff", "32", "--n-layers", "1", "--batch-size", "8",
              "--valid-size", "8", "--test-size", "8", "--threads", "1", "--quiet")


def tiny_train_argv(out, *options, task: str = "reverse", steps: int = 2) -> list[str]:
    """`tformer train` arguments for a tiny run of a synthetic task into `out`, then `options`
    ("--eval-every", 2, ...; one given again overrides TINY_TRAIN's)."""
    return ["train", "--task", task, "--steps", str(steps), "--out", str(out), *TINY_TRAIN,
            *(str(option) for option in options)]


class SpyBackend:
    """A tokenizers backend that records the characters of every text it tokenizes (``seen``):
    for tests that a long text is tokenized only as far as its cut needs."""

    def __init__(self, backend) -> None:
        self.backend, self.seen = backend, []

    def __getattr__(self, name: str):
        return getattr(self.backend, name)

    def encode(self, text, *args, **kwargs):
        self.seen.append(len(text))
        return self.backend.encode(text, *args, **kwargs)

    def encode_batch(self, inputs, *args, **kwargs):
        self.seen.extend(len(x) if isinstance(x, str) else sum(map(len, x)) for x in inputs)
        return self.backend.encode_batch(inputs, *args, **kwargs)
