"""The token-classification head (tformer.nn.heads.TokenClassifier) against its NumPy mirror
(tformer.reference.heads.TokenClassifier): the forward in float64 and float32, on BERT's layout
with token types and padding; the backward against torch autograd (float64, every parameter)
and against finite differences through the dropout."""

import numpy as np
import pytest
import torch
from helpers import GRAD_RTOL, assert_close, assert_grads_match, copy_weights, finite_difference, padding_mask

from tformer.config import bert_layout
from tformer.nn.heads import TokenClassifier
from tformer.reference.heads import TokenClassifier as RefTokenClassifier

pytestmark = pytest.mark.usefixtures("one_thread")

B, S, C = 3, 9, 5


def _config(**changes):
    return bert_layout(d_model=16, n_heads=4, d_ff=32, n_layers=2, dropout=0.1, max_len=32, vocab_size=40,
                       n_classes=C, **changes)


def _pair(config, dtype):
    theirs = TokenClassifier(config).to(torch.float64 if dtype == np.float64 else torch.float32).eval()
    ours = RefTokenClassifier(config, dtype)
    copy_weights(theirs, ours)
    return theirs, ours


@pytest.mark.parametrize("dtype", [np.float64, np.float32])
@pytest.mark.parametrize("norm_first", [False, True])
def test_forward_matches_the_reference(dtype, norm_first):
    config = _config(norm_first=norm_first, final_norm=norm_first)
    theirs, ours = _pair(config, dtype)
    rng = np.random.default_rng(0)
    ids, mask = rng.integers(0, 40, (B, S)), padding_mask([S, 4, 1], S)
    types = np.zeros((B, S), dtype=np.int64)
    types[:, 5:] = 1
    with torch.no_grad():
        logits = theirs(torch.from_numpy(ids), torch.from_numpy(mask), torch.from_numpy(types)).logits
    assert logits.shape == (B, S, C)
    assert_close(logits, ours(ids, mask, types).logits, dtype, where=mask, what="logits")
    # A padding position's vector is zeros: its row is the head's bias, on both sides.
    assert_close(logits[1, 4:], np.broadcast_to(ours.head.bias, (S - 4, C)), dtype, what="padding rows")


def test_backward_matches_torch():
    config = _config()
    theirs, ours = _pair(config, np.float64)
    rng = np.random.default_rng(1)
    ids, mask = rng.integers(0, 40, (B, S)), padding_mask([S, 4, 2], S)
    logits = theirs(torch.from_numpy(ids), torch.from_numpy(mask)).logits
    g = rng.standard_normal((B, S, C)) * mask[..., None]  # what a loss ignoring padding sends back
    (logits * torch.from_numpy(g)).sum().backward()
    mine, cache = ours.forward_train(ids, mask)
    assert float(np.abs(mine - logits.detach().numpy()).max()) <= GRAD_RTOL
    grads = ours.zero_grads()
    assert ours.backward(g, cache, grads) is None  # token ids have no gradient
    assert_grads_match(grads, theirs, "TokenClassifier")


def test_backward_matches_finite_differences_with_dropout():
    """Through the dropout before the head: a fixed seed draws the same masks on every call."""
    ours = RefTokenClassifier(_config(), np.float64)
    rng = np.random.default_rng(0)
    for value in ours.state_dict().values():
        value[...] = rng.standard_normal(value.shape) * 0.3 + (value if value.ndim == 1 else 0)
    ids, mask = rng.integers(0, 40, (B, S)), padding_mask([S, 4, 2], S)
    g = rng.standard_normal((B, S, C))

    def loss():
        logits, _ = ours.forward_train(ids, mask, rng=np.random.default_rng(5))
        return float((logits * g).sum())

    logits, cache = ours.forward_train(ids, mask, rng=np.random.default_rng(5))
    assert not np.allclose(logits, ours(ids, mask).logits)  # dropout drew something
    grads = ours.zero_grads()
    ours.backward(g, cache, grads)
    state = ours.state_dict()
    for key in ["head.weight", "head.bias", "encoder.layers.1.ffn.down.weight", "encoder.tok_emb.weight"]:
        for index in [tuple(rng.integers(0, n) for n in state[key].shape) for _ in range(3)]:
            fd = finite_difference(loss, state[key], index)
            assert abs(fd - grads[key][index]) <= 1e-7 * max(1.0, abs(fd)), (key, index)
