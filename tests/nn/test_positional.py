import math

import numpy as np
import pytest
import torch

from tformer.nn.positional import LearnedPositionalEmbedding, SinusoidalPositionalEncoding


def test_sinusoids_follow_the_paper_formula():
    """PE(pos, 2i) = sin(pos / 10000^(2i/d)), PE(pos, 2i+1) = cos(...) (§3.5), in float64."""
    d = 6
    pe = SinusoidalPositionalEncoding(d, 20)(20, dtype=torch.float64)
    for pos in (0, 1, 7, 19):
        for i in range(d // 2):
            angle = pos / 10000 ** (2 * i / d)
            assert abs(pe[pos, 2 * i].item() - math.sin(angle)) < 1e-12
            assert abs(pe[pos, 2 * i + 1].item() - math.cos(angle)) < 1e-12


def test_offset_and_extension():
    enc = SinusoidalPositionalEncoding(8, 10)
    assert torch.equal(enc(3, offset=4), enc(10)[4:7])
    longer = enc(15)  # past max_len: computed, not refused
    assert longer.shape == (15, 8) and torch.allclose(longer[:10], enc(10))


def test_learned_table_rows():
    emb = LearnedPositionalEmbedding(10, 4)
    assert torch.equal(emb(3, offset=2), emb.weight[2:5])
    assert np.isclose(float(emb.weight.detach().std()), 0.02, atol=0.01)


@pytest.mark.parametrize("cls, args, message", [
    ("SinusoidalPositionalEncoding", (0, 16), r"^d_model: expected a positive int, got 0$"),  # ZeroDivisionError
    ("SinusoidalPositionalEncoding", (16, -1), r"^max_len: expected a positive int, got -1$"),
    ("LearnedPositionalEmbedding", (-1, 16), r"^max_len: expected a positive int, got -1$"),  # torch's
    ("LearnedPositionalEmbedding", (16, 0), r"^d_model: expected a positive int, got 0$"),  # "negative dimension"
])
def test_positions_refuse_bad_sizes_as_the_reference_does(cls, args, message):
    from tformer.nn import positional
    from tformer.reference import positional as mirror

    for module in (positional, mirror):
        with pytest.raises(ValueError, match=message):
            getattr(module, cls)(*args)
