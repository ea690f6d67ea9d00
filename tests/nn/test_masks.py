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


@pytest.mark.parametrize("impl", [masks, np_masks], ids=["torch", "reference"])
@pytest.mark.parametrize("bad", [2, -1, 101])
def test_integer_masks_hold_only_zero_and_one(impl, bad):
    """Token ids passed for a mask (or a -1 sentinel) are refused, naming the argument and the
    value, by the converter and by every model argument alike."""
    to = torch.tensor if impl is masks else np.array
    mask = to([[1, 1, 0], [1, bad, 0]])
    with pytest.raises(ValueError, match=rf"^attention_mask: expected only 0 and 1 .*got {bad}$"):
        impl.from_hf_attention_mask(mask)
    with pytest.raises(ValueError, match=rf"^attention_mask: expected only 0 and 1 .*got {bad}$"):
        impl.make_mask(mask, None, 2, 3, 3)
    with pytest.raises(ValueError, match=rf"^attn_mask: expected only 0 and 1 .*got {bad}$"):
        impl.make_mask(None, mask, 2, 3, 3)


@pytest.mark.parametrize("impl", [masks, np_masks], ids=["torch", "reference"])
def test_hf_masks_of_every_dtype_convert(impl):
    to = torch.tensor if impl is masks else np.array
    want = [[True, True, False]]
    for mask in (to([[1, 1, 0]]), to([[1.0, 1.0, 0.0]]), to([[True, True, False]])):
        assert impl.from_hf_attention_mask(mask).tolist() == want
    with pytest.raises(ValueError, match=r"^attention_mask: expected only 0 and 1 .*got 0.5$"):
        impl.from_hf_attention_mask(to([[1.0, 0.5, 0.0]]))


@pytest.mark.parametrize("impl", [masks, np_masks], ids=["torch", "reference"])
def test_hf_extended_additive_mask_is_an_attn_mask(impl):
    """HF's 4-D additive masks, (B, 1, 1, S) padding and (B, 1, T, S) general, converted by
    from_additive_mask, are accepted as attn_mask and block what the 3-D form blocks."""
    to = torch.tensor if impl is masks else np.array
    real = np.array([[1, 1, 1, 0], [1, 1, 0, 0]], dtype=bool)  # (B, S)
    general = np.tril(np.ones((4, 4), dtype=bool))[None] & real[:, None, :]  # (B, T, S)
    neg = np.finfo(np.float32).min
    for four_d, three_d in ((real[:, None, None, :], real[:, None, :]), (general[:, None], general)):
        additive = to(np.where(four_d, 0.0, neg).astype(np.float32))
        ours = impl.make_mask(None, impl.from_additive_mask(additive), 2, 4, 4)
        want = impl.make_mask(None, to(three_d), 2, 4, 4)
        assert np.array_equal(np.asarray(ours.allowed), np.asarray(want.allowed))
    with pytest.raises(ValueError, match=r"attn_mask: .*or \(B, 1, T, S\), got \(2, 2, 4, 4\)"):
        impl.make_mask(None, to(np.ones((2, 2, 4, 4), dtype=bool)), 2, 4, 4)
    with pytest.raises(ValueError, match=r"attention_mask: .*got \(2, 1, 1, 4\); pass a \(B, 1, T, S\) mask as attn_mask"):
        impl.make_mask(to(real[:, None, None, :]), None, 2, 4, 4)


def test_pytorch_masks_convert_as_model_md_says():
    """nn.MultiheadAttention's bool attn_mask (True = blocked) is ~attn_mask; its float masks
    (generate_square_subsequent_mask, a float key_padding_mask) go through from_additive_mask;
    what they block is what torch's own attention blocks (its weights are 0 exactly there)."""
    torch.manual_seed(0)
    t = 4
    bool_attn = torch.rand(t, t) < 0.3
    bool_attn.fill_diagonal_(False)  # every query keeps a key: torch gives NaN otherwise
    causal = torch.nn.Transformer.generate_square_subsequent_mask(t)  # 0 / -inf
    float_kpm = torch.tensor([[0.0, 0.0, 0.0, float("-inf")], [0.0] * t])
    mha = torch.nn.MultiheadAttention(8, 2, batch_first=True)
    x = torch.randn(2, t, 8)
    for theirs, converted in (
        (dict(attn_mask=bool_attn), dict(attn_mask=~bool_attn)),
        (dict(attn_mask=causal), dict(attn_mask=masks.from_additive_mask(causal))),
        (dict(key_padding_mask=float_kpm),
         dict(attention_mask=masks.from_additive_mask(float_kpm))),
    ):
        _, weights = mha(x, x, x, average_attn_weights=False, **theirs)  # (B, H, T, S)
        ours = masks.make_mask(converted.get("attention_mask"), converted.get("attn_mask"), 2, t, t)
        assert torch.equal(ours.allowed.expand(2, 2, t, t), weights != 0)
    for impl, to in ((masks, torch.tensor), (np_masks, np.array)):
        with pytest.raises(TypeError, match="; a float one is additive: convert it with from_additive_mask$"):
            impl.from_key_padding_mask(to([[0.0, float("-inf")]]))


@pytest.mark.parametrize("impl", [masks, np_masks], ids=["torch", "reference"])
def test_a_float_zero_one_mask_is_pointed_to_from_hf_attention_mask(impl):
    """A float 1/0 mask (HF's polarity) passed as a model mask, or to from_additive_mask, is
    pointed to the converter that takes it (it was told to use from_additive_mask, which then
    called it a bias)."""
    to = torch.tensor if impl is masks else np.array
    hf = to([[1.0, 1.0, 0.0]])
    with pytest.raises(TypeError, match=r"convert a 0/1 float mask with .*\.from_hf_attention_mask, "
                                        r"an additive one with from_additive_mask$"):
        impl.make_mask(hf, None, 1, 3, 3)
    with pytest.raises(ValueError, match=r"^mask: expected an additive mask .*got one of only 0 and 1 "
                                         r"\(1 = attend\): convert it with from_hf_attention_mask$"):
        impl.from_additive_mask(hf)
    assert impl.from_hf_attention_mask(hf).tolist() == [[True, True, False]]
    assert impl.from_additive_mask(to([[0.0, 0.0, 0.0]])).tolist() == [[True, True, True]]


@pytest.mark.parametrize("mask", [[[True, True, False]], np.ones((1, 3), dtype=bool)])
def test_a_mask_that_is_not_a_tensor_is_refused_naming_the_argument(mask):
    # It was "'list' object has no attribute 'dtype'".
    with pytest.raises(TypeError, match=r"^attention_mask: expected a torch.Tensor mask .*got (list|ndarray)$"):
        masks.as_bool(mask, "attention_mask")


def _partitions(n):
    """Every split of range(n) into contiguous runs, as (start, end) pairs."""
    if n == 0:
        yield []
        return
    for start in range(n):
        for rest in _partitions(start):
            yield [*rest, (start, n)]


@pytest.mark.parametrize("seed", range(6))
@pytest.mark.parametrize("call_scores", [0.0, 40.0, 300.0, 5000.0])
def test_buckets_are_the_cheapest_runs_and_index_the_padded_positions(seed, call_scores):
    """Packing.buckets: of every split of the sorted groups into runs, one of the cheapest (a
    call's price plus sequences x longest^2 x heads each); each run's index lists its packed
    rows' positions in the run padded to its longest, and its keys mark the real ones."""
    g = torch.Generator().manual_seed(seed)
    lengths = torch.randint(0, 13, (10,), generator=g)
    mask = torch.arange(12)[None] < lengths[:, None]
    packing = masks.make_mask(mask, None, 10, 12, 12).packing
    heads = 2
    buckets = packing.buckets(call_scores, heads)

    def cost(runs):
        return sum(call_scores + heads * sum(c for _, c in packing.groups[a:b]) * packing.groups[b - 1][0] ** 2
                   for a, b in runs)

    chosen, row = [], 0
    for b in buckets:
        assert b.start == row
        row += b.rows
        end = next(i for i in range(len(packing.groups) + 1)
                   if sum(n * c for n, c in packing.groups[:i]) == row)
        chosen.append((len(chosen) and chosen[-1][1], end))
    assert row == packing.index.numel()
    assert cost(chosen) == pytest.approx(min(cost(r) for r in _partitions(len(packing.groups))))
    sorted_lengths = sorted(n for n in lengths.tolist() if n > 0)
    for b, (a, e) in zip(buckets, chosen, strict=True):
        mine = [n for n, c in packing.groups[a:e] for _ in range(c)]
        assert b.count == len(mine) and b.length == max(mine) and b.rows == sum(mine)
        if e - a == 1:
            assert b.index is None and b.keys is None
            continue
        expected = [s * b.length + t for s, n in enumerate(mine) for t in range(n)]
        assert b.index.tolist() == expected
        assert b.keys.shape == (b.count, 1, 1, b.length)
        assert b.keys.flatten().nonzero().squeeze(1).tolist() == expected
    assert sum(b.count for b in buckets) == len(sorted_lengths)
    assert packing.buckets(call_scores, heads) is buckets  # kept: every layer asks
