"""The NumPy MaskedLM (tformer.reference.heads) against the torch one (tformer.nn.heads): the same
keys, the same logits (float64 1e-10, float32 1e-5) at every position and at the positions asked
for, and the same gradients as autograd (float64, GRAD_RTOL), the tied word embeddings' from both
of their uses; and a masked-LM run's directory read back as the NumPy MaskedLM."""

import numpy as np
import pytest
import torch
from helpers import GRAD_RTOL, assert_close, assert_grads_match, copy_weights, padding_mask, relative_error

from tformer import TransformerConfig
from tformer.config import bert_layout
from tformer.nn.heads import MaskedLM as TorchMaskedLM
from tformer.reference.heads import MaskedLM

pytestmark = pytest.mark.usefixtures("one_thread")

B, S, V = 3, 7, 23


def _config(**changes) -> TransformerConfig:
    return bert_layout(TransformerConfig(d_model=16, n_heads=4, d_ff=32, n_layers=2, dropout=0.1, max_len=32,
                                         vocab_size=V), **changes)


def _pair(config, dtype):
    torch.manual_seed(0)
    theirs = TorchMaskedLM(config).to(torch.float64 if dtype == np.float64 else torch.float32).eval()
    with torch.no_grad():  # a head far from its initial zeros, so that a wrong term shows
        for p in theirs.head.parameters():
            p.add_(0.3 * torch.randn_like(p))
    ours = MaskedLM(config, dtype)
    copy_weights(theirs, ours)
    return theirs, ours


@pytest.mark.parametrize("dtype", [np.float64, np.float32])
@pytest.mark.parametrize("activation", ["gelu", "gelu_tanh", "relu"])
def test_masked_lm_forward_matches_torch(dtype, activation):
    theirs, ours = _pair(_config(activation=activation), dtype)
    rng = np.random.default_rng(0)
    ids, types = rng.integers(0, V, (B, S)), rng.integers(0, 2, (B, S))
    mask = padding_mask([S, 4, 2], S)
    chosen = mask & (rng.random((B, S)) < 0.4)
    args = [torch.from_numpy(a) for a in (ids, mask, types)]
    with torch.no_grad():
        every = theirs(*args)  # (B, S, V)
        asked = theirs(*args, torch.from_numpy(chosen))  # (N, V)
    assert_close(ours(ids, mask, types), every, dtype, where=mask, what="logits at every real position")
    assert_close(ours(ids, mask, types, chosen), asked, dtype, what="logits at the positions asked")
    assert_close(asked, every[torch.from_numpy(chosen)], dtype, what="asked = every, selected")


def test_masked_lm_backward_matches_autograd_with_the_tied_embeddings():
    config = _config(activation="gelu")
    theirs, ours = _pair(config, np.float64)
    rng = np.random.default_rng(1)
    ids, types, mask = rng.integers(0, V, (B, S)), rng.integers(0, 2, (B, S)), padding_mask([S, 4, 1], S)
    chosen = mask & (rng.random((B, S)) < 0.5)
    logits = theirs(*(torch.from_numpy(a) for a in (ids, mask, types, chosen)))
    g = rng.standard_normal(tuple(logits.shape))
    (logits * torch.from_numpy(g)).sum().backward()
    mine, cache = ours.forward_train(ids, mask, types, chosen)
    assert relative_error(mine, logits) <= GRAD_RTOL
    grads = ours.zero_grads()
    ours.backward(g, cache, grads)
    assert_grads_match(grads, theirs, "MaskedLM")


def test_a_masked_lm_run_directory_loads_as_the_numpy_masked_lm(tmp_path):
    from helpers import write_run
    from safetensors.torch import save_file

    from tformer.reference import from_pretrained
    from tformer.storage.checkpoint import weights_metadata

    config = _config(dropout=0.0)
    torch.manual_seed(2)
    saved, best = TorchMaskedLM(config).eval(), TorchMaskedLM(config).eval()
    ids = torch.randint(4, V, (2, 6))
    with_best = write_run(tmp_path / "with-best", saved)  # best.safetensors as the loop writes it
    save_file({k: v.contiguous() for k, v in best.state_dict().items()}, str(with_best / "best.safetensors"),
              metadata=weights_metadata(best))
    for run, expected in ((with_best, best), (write_run(tmp_path / "checkpoint-only", saved), saved)):
        ref = from_pretrained(run, dtype=np.float64)
        assert type(ref) is MaskedLM
        np.testing.assert_allclose(ref(ids.numpy()), expected.double()(ids).detach().numpy(), atol=1e-10)
