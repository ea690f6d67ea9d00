"""On a device other than the CPU, none of the CPU-only kernels runs (oneDNN's linear and its
packing, mkldnn int8, tformer's dropout draws, the malloc tuning), attention keeps SDPA's fused
kernels with dropout and runs the padded batch, and every measured choice is keyed by the device
it was measured on. A non-CPU tensor is the meta device's here (or a monkeypatched GPU name):
the real GPU runs under `make test-gpu` (tests/test_gpu.py)."""

import json

import pytest
import torch

import tformer.nn.dropout
from tformer.nn import kernels
from tformer.nn.kernels import allocator, attention_kernels, autotune
from tformer.nn.masks import make_mask

META = torch.device("meta")


@pytest.fixture(autouse=True)
def _cache(tmp_path, monkeypatch):
    monkeypatch.setenv("TFORMER_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.setattr(autotune, "_memory", {})


def test_onednn_and_its_int8_kernel_are_cpu_only():
    x, w = torch.ones(4, 8, device=META), torch.ones(8, 8, device=META)
    assert kernels.why_not_onednn(x, w) is not None
    assert kernels.why_not_onednn_int8(x, torch.empty(0)) is not None


def test_attention_dropout_is_fused_off_the_cpu_and_explicit_on_it():
    q = torch.ones(1, 2, 3, 4)
    assert "on CPU" in kernels.why_not_fused_attention(q, q, 0.1, need_weights=False)
    assert kernels.why_not_fused_attention(q.to(META), q.to(META), 0.1, need_weights=False) is None
    assert kernels.why_not_fused_attention(q.to(META), q.to(META), 0.0, need_weights=True) is not None


def test_off_the_cpu_the_padded_batch_runs_unless_packing_is_asked_for(monkeypatch):
    mask = make_mask(torch.tensor([[1, 1, 0], [1, 0, 0]]).bool(), None, 2, 3, 3, device=META)
    monkeypatch.setattr(attention_kernels, "values_readable", lambda t: True)  # as on a GPU
    assert kernels.why_not_packed(mask, False, False, None) == \
        "on a GPU the padded batch runs as one attention call per layer"
    cpu = make_mask(torch.tensor([[1, 1, 0], [1, 0, 0]]).bool(), None, 2, 3, 3)
    assert kernels.why_not_packed(cpu, False, False, None) is None


def test_dropout_off_the_cpu_is_torchs_own_kernel(monkeypatch):
    def refuse(*a, **k):
        raise AssertionError("the CPU dropout kernel ran for a non-CPU tensor")

    monkeypatch.setattr(tformer.nn.dropout, "keep_mask", refuse)
    out = tformer.nn.dropout.dropout(torch.ones(4, 4, device=META), 0.1)
    assert out.device == META and out.shape == (4, 4)


def test_the_malloc_tuning_is_for_the_cpu_only():
    assert allocator.why_not_keep("cuda") == \
        "the model runs on cuda: its tensors come from torch's caching allocator"
    assert allocator.keep_freed_memory("cuda").startswith("malloc as glibc decides (the model runs on cuda")


def test_a_choice_is_keyed_by_the_device_it_was_measured_on(monkeypatch):
    """The same kernel name and shape class measured on the CPU and on a GPU are two decisions,
    each under its device's key in the cache file; the CPU's key is what it always was."""
    monkeypatch.setattr(autotune, "gpu_name", lambda device: "Fake GPU, sm_90")
    gpu = torch.device("cuda", 0)
    cpu_times, gpu_times = {"a": 1.0, "b": 2.0}, {"a": 2.0, "b": 1.0}

    def fake(seconds):
        return {n: (lambda n=n: n) for n in seconds}, lambda call: seconds[call()]

    assert autotune.choose("k", "s", *fake(cpu_times)) == "a"
    assert autotune.choose("k", "s", *fake(gpu_times), device=gpu) == "b"
    assert autotune.choose("k", "s", *fake(cpu_times)) == "a"  # from memory: not the GPU's
    saved = json.loads(autotune.cache_path().read_text())
    assert saved[f"{autotune.machine_key()} | k | s"]["choice"] == "a"
    assert saved[f"Fake GPU, sm_90 | torch {torch.__version__} | cuda | v{autotune.VERSION} | k | s"][
        "choice"] == "b"
    assert autotune.machine_key().startswith(autotune.cpu_info()[0])  # CPU keys unchanged
    autotune._memory.clear()  # a new process: each device reads its own from the file
    assert autotune.choose("k", "s", *fake(gpu_times), device=gpu) == "b"
    assert autotune.summary(device=gpu) == ["k | s: b (a 2000.00 ms, b 1000.00 ms)"]
