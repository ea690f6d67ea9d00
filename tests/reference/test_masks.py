"""tformer.reference.masks: the converters take what NumPy users hold (arrays and nested lists)."""

import numpy as np

from tformer.reference import masks


def test_every_converter_takes_a_nested_list_as_from_hf_attention_mask_does():
    want = [[True, True, False]]
    assert masks.from_hf_attention_mask([[1, 1, 0]]).tolist() == want
    assert masks.from_key_padding_mask([[False, False, True]]).tolist() == want
    assert masks.from_additive_mask([[0.0, 0.0, -np.inf]]).tolist() == want
