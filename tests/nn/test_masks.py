import numpy as np
import pytest
import torch

from tformer.nn import masks
from tformer.reference import masks as np_masks


def test_key_padding_mask_converts_to_our_polarity():
    kpm = torch.tensor([[False, False, True]])  # PyTorch: True = pad
    assert masks.from_key_padding_mask(kpm).tolist() == [[True, True, False]]
    with pytest.raises(TypeError, match="key_padding_mask: expected a bool tensor"):
        masks.from_key_padding_mask(torch.tensor([[0, 1]]))


def test_hf_attention_mask_converts():
    assert masks.from_hf_attention_mask(torch.tensor([[1, 1, 0]])).tolist() == [[True, True, False]]
    with pytest.raises(ValueError, match="only 0 and 1"):
        masks.from_hf_attention_mask(torch.tensor([[0.5, 1.0]]))


def test_additive_mask_converts_and_rejects_biases():
    add = torch.tensor([[0.0, float("-inf")], [torch.finfo(torch.float32).min, 0.0]])
    assert masks.from_additive_mask(add).tolist() == [[True, False], [False, True]]
    with pytest.raises(ValueError, match="a bias"):
        masks.from_additive_mask(torch.tensor([[0.0, -0.5]]))


def test_causal_mask_with_and_without_cache():
    assert masks.causal_mask(3).tolist() == [[1, 0, 0], [1, 1, 0], [1, 1, 1]]
    # Two new queries after three cached positions: they are positions 3 and 4 of 5.
    assert masks.causal_mask(2, 5).int().tolist() == [[1, 1, 1, 1, 0], [1, 1, 1, 1, 1]]


def test_combined_mask_matches_pytorch_conventions():
    """Our combined mask blocks exactly what torch's (key_padding_mask, attn_mask) pair blocks."""
    b, t, s = 2, 4, 4
    kpm = torch.tensor([[False, False, True, True], [False, False, False, False]])
    torch_attn_mask = torch.triu(torch.ones(t, s, dtype=torch.bool), 1)  # torch: True = blocked
    ours = masks.make_mask(masks.from_key_padding_mask(kpm), ~torch_attn_mask, b, t, s)
    blocked = kpm[:, None, None, :] | torch_attn_mask[None, None]
    assert torch.equal(ours.allowed.expand(b, 1, t, s), ~blocked)
    causal = masks.make_mask(None, None, b, t, s, causal=True)
    assert torch.equal(causal.allowed[0, 0], ~torch_attn_mask)


def test_numpy_masks_mirror_torch():
    rng = np.random.default_rng(0)
    am = rng.random((2, 5)) < 0.7
    gm = rng.random((2, 3, 5)) < 0.5
    t = masks.make_mask(torch.from_numpy(am), torch.from_numpy(gm), 2, 3, 5, causal=True)
    n = np_masks.make_mask(am, gm, 2, 3, 5, causal=True)
    assert np.array_equal(t.allowed.numpy(), n.allowed)
    assert np.array_equal(np_masks.causal_mask(2, 5), masks.causal_mask(2, 5).numpy())
