"""Beam search's selection kernel: the two-stage top-k equals torch.topk."""

import pytest
import torch

from tformer.nn import kernels
from tformer.nn.kernels import autotune, search_kernels


@pytest.mark.parametrize("shape", [(7, 640), (3, 1000), (256, 8000), (2, 5 * 64 + 1)])
@pytest.mark.parametrize("k", [1, 4])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_chunked_topk_equals_torch_topk(shape, k, dtype):
    """Same values, largest first, and the same columns (random values: no ties); the last,
    partial chunk included (V not a multiple of CHUNK), and rows whose k largest crowd into one
    chunk or sit in the tail."""
    g = torch.Generator().manual_seed(0)
    x = torch.randn(shape, generator=g, dtype=dtype).log_softmax(-1)
    x[0, 64:64 + k] += 100.0  # all k largest in one chunk
    x[-1, -1] += 100.0  # the largest in the partial chunk (or the last whole one)
    values, indices = search_kernels.chunked_topk(x, k)
    expected = x.topk(k, dim=-1)
    assert torch.equal(values, expected.values)
    assert torch.equal(indices, expected.indices)


def test_topk_chooses_by_measuring_and_readable_takes_torch_topk(monkeypatch, tmp_path):
    monkeypatch.setenv("TFORMER_CACHE_DIR", str(tmp_path))
    autotune._memory.clear()
    x = torch.randn(16, 4096)
    for choice in ("topk", "chunked"):
        monkeypatch.setattr(autotune, "choose", lambda *a, choice=choice, **kw: choice)
        values, indices = kernels.topk(x, 3)
        assert torch.equal(values, x.topk(3).values) and torch.equal(indices, x.topk(3).indices)
    calls = []
    monkeypatch.setattr(autotune, "choose", lambda *a, **kw: calls.append(a) or "chunked")
    with kernels.readable():
        kernels.topk(x, 3)
    kernels.topk(x[:, :200], 4)  # fewer than k + 1 chunks
    assert calls == []
    kernels.topk(x, 3)
    assert [c[:2] for c in calls] == [("topk", "16x4096/k3/float32")]
    autotune._memory.clear()


def test_why_not_chunked_topk_names_the_reason():
    x = torch.randn(4, 1024)
    assert search_kernels.why_not_chunked_topk(x, 4) is None
    assert "chunks" in search_kernels.why_not_chunked_topk(x[:, :100], 4)
    assert "autograd" in search_kernels.why_not_chunked_topk(x.requires_grad_(), 4)
    with kernels.readable():
        assert "readable" in search_kernels.why_not_chunked_topk(x.detach(), 4)
