"""NumPy AdamW and clipping against torch, step for step, float64."""

import numpy as np
import pytest
import torch
from helpers import relative_error

from tformer.reference.optim import AdamW, clip_grad_norm_

# Small tensors: one torch thread is as fast, and polite to a shared machine.
pytestmark = pytest.mark.usefixtures("one_thread")


@pytest.mark.parametrize("fused", [False, True])  # tformer.train uses the fused kernel
def test_adamw_matches_torch_step_for_step(fused):
    rng = np.random.default_rng(0)
    shapes = {"w": (4, 3), "b": (3,)}
    ours = {k: rng.standard_normal(s) for k, s in shapes.items()}
    theirs = {k: torch.nn.Parameter(torch.from_numpy(v.copy())) for k, v in ours.items()}
    decay = {"w": 0.01, "b": 0.0}  # as make_optimizer: no decay on 1-d parameters
    torch_opt = torch.optim.AdamW(
        [{"params": [theirs["w"]], "weight_decay": 0.01}, {"params": [theirs["b"]], "weight_decay": 0.0}],
        lr=1e-3, betas=(0.9, 0.98), eps=1e-9, fused=fused)
    opt = AdamW(ours, lr=1e-3, betas=(0.9, 0.98), eps=1e-9, weight_decay=decay)
    for step in range(1, 21):
        lr = 1e-3 * min(step / 5, (5 / step) ** 0.5)  # a schedule, set per step
        grads = {k: rng.standard_normal(s) * 10 for k, s in shapes.items()}
        for group in torch_opt.param_groups:
            group["lr"] = lr
        for k, p in theirs.items():
            p.grad = torch.from_numpy(grads[k].copy())
        torch_opt.step()
        opt.step(grads, lr)
        for k in shapes:
            assert relative_error(ours[k], theirs[k]) <= 1e-14, (step, k)


def test_clip_grad_norm_matches_torch():
    rng = np.random.default_rng(0)
    for scale in (0.01, 10.0):  # below and above the limit
        grads = {"a": rng.standard_normal((5, 4)) * scale, "b": rng.standard_normal(4) * scale}
        params = [torch.nn.Parameter(torch.zeros(g.shape, dtype=torch.float64)) for g in grads.values()]
        for p, g in zip(params, grads.values(), strict=True):
            p.grad = torch.from_numpy(g.copy())
        expected = torch.nn.utils.clip_grad_norm_(params, 1.0)
        assert abs(clip_grad_norm_(grads, 1.0) - expected.item()) <= 1e-14 * expected.item()
        for p, g in zip(params, grads.values(), strict=True):
            assert relative_error(g, p.grad) <= 1e-15
