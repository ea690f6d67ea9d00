"""Label-smoothed cross-entropy against torch.nn.functional.cross_entropy (float64)."""

import numpy as np
import pytest
import torch
from helpers import GRAD_RTOL, relative_error

from tformer.reference.loss import cross_entropy, cross_entropy_backward

# Small tensors: one torch thread is as fast, and polite to a shared machine.
pytestmark = pytest.mark.usefixtures("one_thread")


@pytest.mark.parametrize("label_smoothing", [0.0, 0.1])
@pytest.mark.parametrize("ignore", [False, True])
def test_cross_entropy_and_its_gradient_match_torch(label_smoothing, ignore):
    rng = np.random.default_rng(0)
    logits = rng.standard_normal((3, 5, 7)) * 3
    labels = rng.integers(0, 7, (3, 5))
    if ignore:
        labels[1, 2:] = 0  # PAD, ignored
    t = torch.from_numpy(logits).requires_grad_()
    expected = torch.nn.functional.cross_entropy(
        t.flatten(0, 1), torch.from_numpy(labels).flatten(), label_smoothing=label_smoothing,
        ignore_index=0 if ignore else -100)
    expected.backward()
    loss, cache = cross_entropy(logits, labels, ignore_index=0 if ignore else -100,
                                label_smoothing=label_smoothing)
    assert abs(loss - expected.item()) <= 1e-14 * abs(expected.item())
    assert relative_error(cross_entropy_backward(cache), t.grad) <= GRAD_RTOL


def test_all_rows_ignored_gives_zero_loss_and_gradient():
    loss, cache = cross_entropy(np.ones((2, 4)), np.zeros(2, int), ignore_index=0)
    assert loss == 0.0 and (cross_entropy_backward(cache) == 0).all()
