"""torch.compile and torch.export run the same modules users run (tracing picks plain kernels).

Tolerance: float32 max abs diff <= 1e-5 (helpers.TOLERANCE) between eager and compiled/exported.
"""

from __future__ import annotations

import shutil

import pytest
import torch
from helpers import assert_close, padding_mask

from tformer.nn.model import Encoder, EncoderClassifier, Seq2SeqTransformer

needs_compiler = pytest.mark.skipif(shutil.which("g++") is None and shutil.which("clang++") is None,
                                    reason="torch.compile's inductor needs a C++ compiler")


def _inputs(config, batch, seq, seed=0):
    g = torch.Generator().manual_seed(seed)
    ids = torch.randint(0, config.vocab_size, (batch, seq), generator=g)
    lengths = [max(seq - 3 * i, 1) for i in range(batch)]
    return ids, torch.from_numpy(padding_mask(lengths, seq))


@needs_compiler
@pytest.mark.slow
@pytest.mark.parametrize("fullgraph", [False, True])
def test_compiled_encoder_matches_eager(tiny_config, fullgraph):
    model = Encoder(tiny_config.replace(norm_first=True, final_norm=True)).eval()
    compiled = torch.compile(model, fullgraph=fullgraph, dynamic=True)
    with torch.no_grad():
        for batch, seq in [(3, 9), (5, 14)]:
            ids, mask = _inputs(tiny_config, batch, seq)
            assert_close(compiled(ids, mask).last_hidden_state, model(ids, mask).last_hidden_state,
                         what=f"compiled vs eager at ({batch}, {seq})")


@needs_compiler
@pytest.mark.slow
def test_compiled_training_step_matches_eager(tiny_config):
    model = EncoderClassifier(tiny_config.replace(n_classes=3, pooling="mean", dropout=0.0))
    compiled = torch.compile(model)
    ids, mask = _inputs(tiny_config, 4, 10)
    grads = []
    for m in (model, compiled):
        model.zero_grad()
        m(ids, mask).logits.square().sum().backward()
        grads.append({n: p.grad.clone() for n, p in model.named_parameters()})
    for name in grads[0]:
        assert_close(grads[1][name], grads[0][name], what=f"grad {name}")


def test_export_with_dynamic_batch_and_sequence(tiny_config):
    """One export, two different (B, S), both equal to eager (padding and empty rows included)."""
    model = Encoder(tiny_config.replace(positional="learned")).eval()
    ids, mask = _inputs(tiny_config, 3, 9)
    batch, seq = torch.export.Dim("batch"), torch.export.Dim("seq", max=tiny_config.max_len)
    program = torch.export.export(
        model, (ids,), {"attention_mask": mask},
        dynamic_shapes={"x": {0: batch, 1: seq}, "attention_mask": {0: batch, 1: seq}},
    )
    exported = program.module()
    for b, s in [(2, 5), (6, 17)]:
        ids, mask = _inputs(tiny_config, b, s, seed=b)
        mask[-1] = False  # a row with no real token
        with torch.no_grad():
            expected = model(ids, mask).last_hidden_state
        got = exported(ids, attention_mask=mask).last_hidden_state
        assert_close(got, expected, what=f"exported vs eager at ({b}, {s})")
        assert not got[~mask].any()


def test_export_of_seq2seq(tiny_config):
    model = Seq2SeqTransformer(tiny_config.replace(dropout=0.0)).eval()
    src, src_mask = _inputs(tiny_config, 2, 7)
    tgt, _ = _inputs(tiny_config, 2, 5, seed=1)
    program = torch.export.export(model, (src, tgt, src_mask))
    with torch.no_grad():
        assert_close(program.module()(src, tgt, src_mask).logits, model(src, tgt, src_mask).logits,
                     what="exported seq2seq logits")


def test_compile_model_says_when_no_cxx_compiler(tiny_config, monkeypatch):
    import shutil as sh

    from tformer import compile_model

    monkeypatch.setattr(sh, "which", lambda name: None)
    with pytest.raises(RuntimeError, match="needs a C\\+\\+ compiler at run time"):
        compile_model(Encoder(tiny_config))


def test_meta_device_forward_gives_shapes(tiny_config):
    """A model on the meta device (no data) runs: checks that read values are eager-only."""
    with torch.device("meta"):
        model = Encoder(tiny_config)
        ids = torch.zeros(2, 7, dtype=torch.long)
        out = model(ids, torch.ones(2, 7, dtype=torch.bool), skip_padding=False)
    assert out.last_hidden_state.shape == (2, 7, tiny_config.d_model)


@pytest.mark.parametrize("module", [5, "encoder", None])
def test_compile_model_refuses_what_is_not_a_module_naming_it(module):
    from tformer import compile_model

    # torch.compile's own word was a bare AssertionError from inside dynamo.
    with pytest.raises(TypeError, match=r"^module: expected a torch\.nn\.Module \(e\.g\. an Encoder\), got "):
        compile_model(module)
