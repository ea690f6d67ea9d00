"""Dynamic int8 inference (tformer.nn.int8): rotation, per-token quantization, the int8 kernel.

Tolerances: the rotation is orthogonal to 1e-6 (float32) and preserves products to 1e-10
(float64); the kernel equals a float64 product of its own integers to 1e-5 relative (the
sums are exact integers, only the fp32 scaling rounds); sentence embeddings of a tiny
random-weight model stay within min cosine 0.99 of fp32 (the real all-MiniLM-L6-v2's numbers,
0.9987-0.9994, are in the README: they need the real weights).
"""

from __future__ import annotations

import contextlib

import numpy as np
import pytest
import torch
from hf_bert_fixtures import SENTENCES, st_dir

from tformer.commands.cli import main
from tformer.embeddings.sentence import SentenceEncoder
from tformer.nn import int8, kernels
from tformer.nn.model import Encoder
from tformer.nn.precision import to_precision


@pytest.mark.parametrize(("k", "m", "block"), [(384, 1152, 128), (1536, 384, 32), (30, 64, 2)])
def test_rotation_is_an_orthogonal_block_of_the_expected_size(k, m, block):
    r = int8.rotation(k, m)
    assert r.shape == (block, block)
    assert torch.allclose(r @ r.t(), torch.eye(block), atol=1e-6)


def test_rotating_both_sides_preserves_the_product():
    r = int8.rotation(96, 256, dtype=torch.float64)
    x, w = torch.randn(7, 96, dtype=torch.float64), torch.randn(40, 96, dtype=torch.float64)
    with kernels.readable():
        got = int8.rotate(x, r) @ int8.rotate(w, r).t()
    assert float((got - x @ w.t()).abs().max()) <= 1e-10


@pytest.mark.parametrize("bits", [7, 8])
def test_quantize_per_token_rounds_to_the_nearest_step(bits):
    x = torch.randn(6, 50) * torch.logspace(-3, 3, 6)[:, None]
    x[2] = 0.0  # a row of zeros: scale stays finite, q = zero
    q, scale, zero = int8.quantize_per_token(x, bits)
    qmax = 2 ** (bits - 1) - 1
    assert q.dtype == torch.uint8 and zero == 2 ** (bits - 1)
    assert int((q.int() - zero).abs().max()) == qmax  # each nonzero row's largest value hits qmax
    assert torch.isfinite(scale).all() and not (q[2].int() - zero).any()
    err = (x - (q.float() - zero) * scale).abs()
    assert bool((err <= scale * 0.5 * (1 + 1e-5)).all())


def test_rotation_spreads_an_outlier_channel():
    """One channel 50x the rest (as in LayerNorm outputs): rotating first cuts the per-token
    quantization error of the product several times."""
    x, w = torch.randn(64, 256), torch.randn(512, 256) / 16
    x[:, 3] *= 50
    exact = x @ w.t()
    r = int8.rotation(256, 512)

    def error(xr, wr):
        q, s, zero = int8.quantize_per_token(xr, 8)
        return float(((q.float() - zero) * s @ wr.t() - exact).norm() / exact.norm())

    with kernels.readable():
        plain, rotated = error(x, w), error(int8.rotate(x, r), int8.rotate(w, r))
    assert rotated <= plain / 4, (plain, rotated)


@pytest.mark.parametrize("rotated", [True, False])
@pytest.mark.parametrize("readable", [False, True])
def test_int8_linear_computes_its_integers_exactly(readable, rotated):
    layer = torch.nn.Linear(128, 96)
    q_layer = int8.Int8Linear(layer, rotated=rotated)
    x = torch.randn(3, 5, 128)
    with torch.no_grad(), (kernels.readable() if readable else contextlib.nullcontext()):
        y = q_layer(x, "gelu")
    layer.requires_grad_(False)
    r = None if q_layer.rotation is None else q_layer.rotation.double()
    xr = int8.rotate(x.reshape(-1, 128).double(), r)
    q, s, zero = int8.quantize_per_token(xr.float(), q_layer.bits)
    sums = (q.double() - zero) @ q_layer.weight_int8.double().t()  # exact integers
    pre = sums * q_layer.weight_scale.double() * s.double() + layer.bias.double()
    expected = torch.nn.functional.gelu(pre).reshape(3, 5, 96)
    assert y.dtype == torch.float32
    assert float((y.double() - expected).abs().max() / expected.abs().max()) <= 1e-5


def test_the_probed_bits_keep_the_largest_sums_exact():
    """Every product at its largest magnitude, in every pair: exact in int32 at exact_bits()."""
    bits = int8.exact_bits()
    layer = torch.nn.Linear(256, 64, bias=False)
    with torch.no_grad():
        layer.weight.copy_(torch.randint(0, 2, (64, 256)) * 2.0 - 1)
    q_layer = int8.Int8Linear(layer, bits)
    # inputs whose rotated values are all +-1: the rotation of the weights' sign pattern
    x = int8.rotate(torch.randint(0, 2, (16, 256)) * 2.0 - 1, q_layer.rotation.t().contiguous())
    with torch.no_grad():
        fast = q_layer(x)
        with kernels.readable():
            plain = q_layer(x)  # float32 sums of the same integers: exact below 2^24
    assert float((fast - plain).abs().max() / plain.abs().max()) <= 1e-6


def test_int8_model_keeps_fp32_outside_the_multiplies(tiny_config):
    """(The suite pins has_bf16 to False: the down projection int8 leaves in float is fp32.)"""
    model = to_precision(Encoder(tiny_config), "int8").eval()
    layer = model.layers[0]
    assert isinstance(layer.ffn.up, int8.Int8Linear) and isinstance(layer.self_attn.out_proj, int8.Int8Linear)
    vnni = int8.exact_bits() == 8
    assert isinstance(layer.self_attn.qkv_proj, int8.Int8Linear) == vnni
    assert layer.self_attn.out_proj.rotation is None and layer.ffn.up.rotation is not None
    assert isinstance(layer.ffn.down, torch.nn.Linear) == vnni  # int8.keep_float: fp32 (no bf16 units here)
    kept = layer.ffn.down if vnni else layer.self_attn.qkv_proj
    assert kept.weight.dtype == torch.float32
    ids = torch.randint(0, tiny_config.vocab_size, (3, 9))
    mask = torch.ones(3, 9, dtype=torch.bool)
    mask[1, 4:] = False
    with torch.no_grad():
        packed = model(ids, mask).last_hidden_state
        padded = model(ids, mask, skip_padding=False).last_hidden_state
    assert packed.dtype == torch.float32 and not packed[~mask].any()
    # per-token scales: a token's result does not depend on the other tokens in the batch
    assert float((packed - padded).abs().max()) <= 1e-5
    with pytest.raises(ValueError, match="already int8 and keeps no float weights"):
        to_precision(model, "fp32")


@pytest.mark.parametrize(("bits", "in_float"), [(8, {"down"}), (7, {"qkv_proj"})])
def test_the_layout_left_in_float_follows_the_bits(tiny_config, bits, in_float):
    """8-bit activations leave the down projection in float; 7-bit ones (CPUs without VNNI)
    the attention's input projection, the layout their speed was measured with."""
    model = int8.quantize(Encoder(tiny_config).eval(), bits=bits)
    layer = model.layers[0]
    linears = {"qkv_proj": layer.self_attn.qkv_proj, "out_proj": layer.self_attn.out_proj,
               "up": layer.ffn.up, "down": layer.ffn.down}
    assert {n for n, m in linears.items() if not isinstance(m, int8.Int8Linear)} == in_float
    assert set(int8.keep_float(bits)) & set(linears) == in_float


def test_sentence_encoder_int8_is_close_to_fp32():
    fp32 = SentenceEncoder.from_pretrained(st_dir("mean", True)).encode(SENTENCES)
    q8 = SentenceEncoder.from_pretrained(st_dir("mean", True), dtype="int8").encode(SENTENCES)
    cos = (fp32 * q8).sum(axis=1)
    assert q8.dtype == np.float32
    assert cos.min() >= 0.99, f"min cosine {cos.min():.6f} < 0.99"


def test_cli_embed_dtype_int8(tmp_path):
    base = ["embed", str(st_dir("mean", True)), *SENTENCES]
    assert main([*base, "--out", str(tmp_path / "fp32.npy")]) == 0
    assert main([*base, "--dtype", "int8", "--out", str(tmp_path / "int8.npy")]) == 0
    fp32, q8 = np.load(tmp_path / "fp32.npy"), np.load(tmp_path / "int8.npy")
    assert (fp32 * q8).sum(axis=1).min() >= 0.99


def test_int8_leaves_the_down_projection_in_bf16_where_the_cpu_has_bf16_units(tiny_config, monkeypatch):
    import tformer.nn.precision

    monkeypatch.setattr(tformer.nn.precision, "has_bf16", lambda: True)
    fp32 = Encoder(tiny_config.replace(activation="gelu")).eval()
    model = Encoder(tiny_config.replace(activation="gelu")).eval()
    model.load_state_dict(fp32.state_dict())
    to_precision(model, "int8")
    ffn = model.layers[0].ffn
    assert isinstance(ffn.up, int8.Int8Linear) and ffn.up.weight_scale.dtype == torch.float32
    assert isinstance(ffn.down, torch.nn.Linear) and ffn.down.weight.dtype == torch.bfloat16
    ids = torch.randint(0, tiny_config.vocab_size, (2, 7))
    with torch.no_grad():
        out, expected = model(ids).last_hidden_state, fp32(ids).last_hidden_state
    assert out.dtype == torch.float32
    assert float(torch.nn.functional.cosine_similarity(out, expected, dim=-1).min()) >= 0.99


def test_int8_linear_edge_inputs():
    """No tokens gives an empty result; a zero token gives the bias (no division by zero)."""
    layer = torch.nn.Linear(64, 32)
    q_layer = int8.Int8Linear(layer)
    with torch.no_grad():
        assert q_layer(torch.zeros(0, 5, 64)).shape == (0, 5, 32)
        y = q_layer(torch.zeros(2, 3, 64))
        assert torch.equal(y, layer.bias.expand(2, 3, 32))
