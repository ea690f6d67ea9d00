import numpy as np
import pytest
import torch
from helpers import assert_close, padding_mask

from tformer.config import POOLING_MODES
from tformer.nn.masks import make_mask
from tformer.nn.pooling import pool
from tformer.reference import pooling as ref_pooling
from tformer.reference.masks import make_mask as ref_make_mask


def test_pool_ignores_padding():
    h = torch.tensor([[[1.0, 5.0], [3.0, -1.0], [0.0, 0.0]]])  # (1, 3, 2), last is padding (zeros)
    mask = make_mask(torch.tensor([[1, 1, 0]]), None, 1, 3, 3)
    assert pool(h, mask, ["mean"]).tolist() == [[2.0, 2.0]]
    assert pool(h, mask, ["max"]).tolist() == [[3.0, 5.0]]
    assert pool(h, mask, ["cls"]).tolist() == [[1.0, 5.0]]
    assert torch.allclose(pool(h, mask, ["mean_sqrt_len"]), torch.tensor([[4.0, 4.0]]) / 2**0.5)


def test_pool_names_the_modes_it_knows():
    with pytest.raises(ValueError, match="pooling: expected one of cls, max, mean, mean_sqrt_len"):
        pool(torch.zeros(1, 2, 3), None, ["last"])


@pytest.mark.parametrize("padded", [False, True])
def test_reference_pool_and_its_backward_match_torch(padded):
    """The mirror pools alike, every mode at once, and its backward is autograd's."""
    rng = np.random.default_rng(0)
    lengths = [5, 3, 0]
    h = rng.standard_normal((3, 5, 4)) * padding_mask(lengths, 5)[..., None] if padded else \
        rng.standard_normal((3, 5, 4))
    mask_np = padding_mask(lengths, 5) if padded else None
    ht = torch.from_numpy(h).requires_grad_()
    mask_t = make_mask(None if mask_np is None else torch.from_numpy(mask_np), None, 3, 5, 5)
    mask_r = ref_make_mask(mask_np, None, 3, 5, 5)
    pooled = pool(ht, mask_t, POOLING_MODES)
    assert_close(pooled, ref_pooling.pool(h, mask_r, POOLING_MODES), np.float64, what="pooled")
    g = rng.standard_normal(pooled.shape)
    (expected,) = torch.autograd.grad((pooled * torch.from_numpy(g)).sum(), [ht])
    dh = ref_pooling.pool_backward(g, h, mask_r, POOLING_MODES)
    if padded:  # the encoder's zeros at padding are constants: compare at real tokens
        expected = expected * torch.from_numpy(mask_np)[..., None]
        dh = dh * mask_np[..., None]
    assert_close(expected, dh, np.float64, what="dh")
