"""--tf32 (issue 55): parsed by `tformer train`, applied to fp32 matrix products only on an NVIDIA
GPU of compute capability 8.0+, within the step, the caller's settings restored after; a CPU or
an older GPU changes nothing. The GPU's answers are simulated here (its capability); the real
run is `make bench-gpu`'s."""

from __future__ import annotations

import pytest
import torch

from tformer.nn.kernels import tf32 as tf32_module
from tformer.nn.kernels.tf32 import tf32, why_not_tf32
from tformer.training.config import resolve_config

CUDA = torch.device("cuda", 0)


def _matmul_precision() -> object:
    matmul = torch.backends.cuda.matmul
    return matmul.fp32_precision if hasattr(matmul, "fp32_precision") else matmul.allow_tf32


@pytest.fixture
def capability(monkeypatch):
    """Pretend CUDA device 0 has the given compute capability."""
    def set_to(major: int):
        monkeypatch.setattr(torch.cuda, "get_device_capability", lambda device=None: (major, 0))
        monkeypatch.setattr(tf32_module, "gpu_name", lambda device: f"a GPU, sm_{major}0")

    return set_to


def test_tf32_is_an_option_of_train_off_by_default(tmp_path):
    assert resolve_config({"task": "reverse"}).tf32 is False
    assert resolve_config({"task": "reverse", "tf32": True}).tf32 is True


def test_the_train_command_parses_tf32_and_documents_it(capsys):
    from tformer.commands.cli import main

    with pytest.raises(SystemExit) as done:  # argparse's --help exits 0
        main(["train", "--help"])
    out = " ".join(capsys.readouterr().out.split())
    assert done.value.code == 0 and "--tf32" in out and "compute capability 8.0" in out


def test_on_a_cpu_tf32_changes_nothing_and_says_why():
    before = _matmul_precision()
    assert "NVIDIA GPU format" in why_not_tf32(torch.device("cpu"))
    with tf32(torch.device("cpu"), True) as on:
        assert on is False and _matmul_precision() == before


def test_on_an_ampere_gpu_tf32_runs_within_the_block_only(capability):
    capability(8)
    before = _matmul_precision()
    assert why_not_tf32(CUDA) is None
    with tf32(CUDA, False) as on:  # not asked for: torch's default stays
        assert on is False and _matmul_precision() == before
    with tf32(CUDA, True) as on:
        assert on is True and _matmul_precision() in ("tf32", True)
    assert _matmul_precision() == before  # the caller's setting is back


def test_a_gpu_before_ampere_has_no_tf32(capability):
    capability(7)
    assert "no TF32 units" in why_not_tf32(CUDA)
    before = _matmul_precision()
    with tf32(CUDA, True) as on:
        assert on is False and _matmul_precision() == before


def test_a_training_step_asks_for_tf32_as_the_run_says(tiny_config, monkeypatch):
    """train_step's forward and backward run inside tf32(device, config.tf32)."""
    from types import SimpleNamespace

    from tformer.nn.model import EncoderClassifier
    from tformer.training import steps

    asked = []
    real = steps.tf32

    def spy(device, allowed):
        asked.append((device.type, allowed))
        return real(device, allowed)

    monkeypatch.setattr(steps, "tf32", spy)
    model = EncoderClassifier(tiny_config.replace(n_classes=2, pooling="mean"))
    batch = SimpleNamespace(n_tokens=lambda: 8, n_examples=lambda: 2, to=lambda device: batch)
    objective = SimpleNamespace(loss=lambda m, b, smoothing: (
        m(torch.ones(2, 4, dtype=torch.long)).logits.square().mean(), 0.5))
    config = SimpleNamespace(accumulate=1, label_smoothing=0.0, clip_grad=0.0, tf32=True)
    optimizer = torch.optim.AdamW(model.parameters())
    steps.train_step(model, optimizer, objective, iter([batch]), config, 1e-3)
    assert asked == [("cpu", True)]
