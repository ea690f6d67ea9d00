"""On a CUDA GPU (`make test-gpu`; skipped with the reason where torch sees none): attention runs
SDPA's flash and memory-efficient kernels, training steps run bf16 autocast (fp16 with a
GradScaler where bf16 is missing) and fused AdamW on the device, outputs equal the CPU's, and two
GPUs train and embed together over NCCL. The device-aware tests of the rest of the suite also run
on the GPU there (pytest --device cuda)."""

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch
from hf_bert_fixtures import st_dir
from text_fixtures import seq2seq_rows, write

from tformer.config import TransformerConfig
from tformer.kinds import make_objective, resolve_config
from tformer.nn.model import Encoder
from tformer.training.steps import grad_scaler, make_optimizer, train_step

pytestmark = pytest.mark.gpu
SRC = str(Path(__file__).resolve().parents[1] / "src")
CONFIG = TransformerConfig(d_model=64, n_heads=4, d_ff=128, n_layers=2, dropout=0.1, max_len=64, vocab_size=100)


@pytest.fixture
def gpu() -> torch.device:
    return torch.device("cuda", 0)


def _sdpa_only(backend):
    from torch.nn.attention import SDPBackend, sdpa_kernel

    return sdpa_kernel(getattr(SDPBackend, backend))


def test_training_attention_runs_the_flash_kernel_dropout_included(gpu):
    """With only the flash kernel allowed, a bf16 training step (dropout 0.1) runs: tformer's
    attention reaches SDPA with what flash takes (no mask, bf16, dropout inside the kernel)."""
    if not torch.cuda.is_bf16_supported():
        pytest.skip("flash attention in bf16 needs a GPU with bf16 (Ampere or later)")
    model = Encoder(CONFIG).to(gpu).train()
    ids = torch.randint(0, 100, (4, 32), device=gpu)
    with _sdpa_only("FLASH_ATTENTION"), torch.autocast("cuda", dtype=torch.bfloat16):
        model(ids).last_hidden_state.float().square().mean().backward()
    assert all(torch.isfinite(p.grad).all() for p in model.parameters() if p.grad is not None)


def test_padded_batches_run_the_memory_efficient_kernel(gpu):
    model = Encoder(CONFIG).to(gpu).train()
    ids = torch.randint(0, 100, (4, 32), device=gpu)
    mask = torch.ones(4, 32, dtype=torch.bool, device=gpu)
    mask[2:, 20:] = False
    with _sdpa_only("EFFICIENT_ATTENTION"):
        out = model(ids, mask).last_hidden_state
    out.square().mean().backward()
    assert torch.isfinite(out[mask]).all()


def test_the_gpu_computes_the_cpu_s_numbers(gpu):
    """fp32, eval mode: the same weights on the CPU and the GPU agree to 1e-4 (TF32 is off for
    float32 matrix products by default)."""
    torch.manual_seed(0)
    model = Encoder(CONFIG).eval()
    ids = torch.randint(0, 100, (3, 20))
    mask = torch.ones(3, 20, dtype=torch.bool)
    mask[1, 12:] = False
    with torch.no_grad():
        cpu = model(ids, mask).last_hidden_state
        on_gpu = model.to(gpu)(ids.to(gpu), mask.to(gpu)).last_hidden_state.cpu()
    assert (cpu - on_gpu)[mask].abs().max() <= 1e-4


@pytest.mark.parametrize("bf16_units", [True, False])
def test_a_training_step_on_the_gpu(gpu, monkeypatch, bf16_units):
    """16-bit autocast (bf16, or fp16 with a GradScaler where a GPU lacks bf16: forced here),
    fused AdamW whose state lives on the GPU, batches copied there."""
    if bf16_units and not torch.cuda.is_bf16_supported():
        pytest.skip("this GPU has no bf16 units")
    if not bf16_units:
        monkeypatch.setattr(torch.cuda, "is_bf16_supported", lambda *a, **k: False)
    config = resolve_config({"task": "reverse", "d_model": 32, "n_heads": 2, "d_ff": 64, "n_layers": 1,
                             "device": "cuda"})
    objective = make_objective(config)
    model = objective.build_model().to(gpu)
    optimizer = make_optimizer(model, config)
    scaler = grad_scaler(model, True)
    assert (scaler is None) == bf16_units and optimizer.defaults["fused"]
    before = {k: v.clone() for k, v in model.state_dict().items()}
    batches = objective.train_batches(0)
    for _ in range(3):
        loss, *_ = train_step(model, optimizer, objective, batches, config, 1e-3, bf16=True, scaler=scaler)
    assert np.isfinite(loss)
    assert any(not torch.equal(before[k], v) for k, v in model.state_dict().items())
    state = next(iter(optimizer.state.values()))
    assert state["exp_avg"].device == gpu


def test_bench_on_the_gpu_writes_its_table(tmp_path):
    proc = subprocess.run([sys.executable, "-m", "tformer", "bench", "--device", "cuda", "--quick",
                           "--json", str(tmp_path / "b.json")], capture_output=True, text=True,
                          env={**os.environ, "PYTHONPATH": SRC}, timeout=900)
    assert proc.returncode == 0, proc.stderr[-2000:]
    rows = json.loads((tmp_path / "b.json").read_text())["rows"]
    assert {r["workload"] for r in rows} == {"device-train", "device-sentences"}


two_gpus = pytest.mark.skipif(torch.cuda.device_count() < 2 or shutil.which(
    "torchrun", path=str(Path(sys.executable).parent)) is None, reason="needs two CUDA GPUs and torchrun")


@two_gpus
def test_two_gpus_train_over_nccl(tmp_path):
    data = write(tmp_path / "d.jsonl", seq2seq_rows(200))
    torchrun = str(Path(sys.executable).parent / "torchrun")
    proc = subprocess.run([torchrun, "--standalone", "--nproc_per_node", "2", "-m", "tformer", "train",
                           "--data", str(data), "--out", str(tmp_path / "run"), "--device", "cuda",
                           "--steps", "6", "--eval-every", "3", "--d-model", "32", "--n-heads", "2",
                           "--d-ff", "64", "--n-layers", "1", "--vocab-size", "300", "--quiet"],
                          capture_output=True, text=True, env={**os.environ, "PYTHONPATH": SRC}, timeout=600)
    assert proc.returncode == 0, proc.stderr[-2000:]
    last = json.loads((tmp_path / "run" / "metrics.jsonl").read_text().splitlines()[-1])
    assert last["split"] == "test" and last["device"] == "cuda:0"


@two_gpus
def test_two_gpus_embed_a_corpus_over_nccl(tmp_path):
    corpus = tmp_path / "c.txt"
    corpus.write_text("".join(f"text number {i}\n" for i in range(3000)))
    torchrun = str(Path(sys.executable).parent / "torchrun")
    env = {**os.environ, "PYTHONPATH": SRC}
    common = ["embed", str(st_dir()), "--file", str(corpus), "--dtype", "fp32"]
    for cmd, out in (([sys.executable, "-m", "tformer"], "one.npy"),
                     ([torchrun, "--standalone", "--nproc_per_node", "2", "-m", "tformer"], "two.npy")):
        proc = subprocess.run([*cmd, *common, "--device", "cuda", "--out", str(tmp_path / out)],
                              capture_output=True, text=True, env=env, timeout=600)
        assert proc.returncode == 0, proc.stderr[-2000:]
    assert np.abs(np.load(tmp_path / "one.npy") - np.load(tmp_path / "two.npy")).max() <= 1e-4
