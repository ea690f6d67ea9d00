"""Compiled kernels (tformer.nn.kernels.compiling): equal to eager, chosen by measurement and the
choice remembered, eager where there is no compiler, where compiling fails, under readable(),
with TFORMER_COMPILE=0, and where the expected work would not repay a compilation.

The plumbing tests compile with torch.compile's "aot_eager" backend (it traces as inductor does,
without building C++: seconds, not a minute); the tests of the compiled kernels themselves use
inductor (needs a C++ compiler). Tolerances: fp32 max abs diff <= 1e-5 (helpers.TOLERANCE), bf16
per compiling.TOLERANCE. No timing is asserted: the measured choice may go either way.
"""

from __future__ import annotations

import json
import math
import shutil
import warnings

import pytest
import torch
from helpers import assert_close

from tformer.nn import kernels
from tformer.nn.kernels import autotune, compiling
from tformer.nn.kernels.compiling import Compiled

needs_compiler = pytest.mark.skipif(shutil.which("g++") is None and shutil.which("clang++") is None,
                                    reason="torch.compile's inductor needs a C++ compiler")


@pytest.fixture(autouse=True)
def _fresh(tmp_path, monkeypatch):
    """Each test measures afresh, in its own cache file; no failure carried over."""
    monkeypatch.setenv("TFORMER_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.setattr(autotune, "_memory", {})
    monkeypatch.setattr(autotune, "_defaults", {})
    compiling.forget_failures()
    yield
    compiling.forget_failures()


@pytest.fixture
def cheap_backend(monkeypatch):
    monkeypatch.setattr(compiling, "BACKEND", "aot_eager")


def _scaled_sum(x, y):
    return (x * 2.0 + y).sin().sum(dim=-1)


def test_a_kernel_outside_any_job_runs_eagerly_and_compiles_nothing(monkeypatch, cheap_backend):
    """The default (TFORMER_COMPILE unset, no ``compiling`` block): a library call on a few
    inputs never waits for a compiler, and measures nothing."""
    monkeypatch.delenv("TFORMER_COMPILE", raising=False)
    kernel = Compiled("sum-a", _scaled_sum)
    x, y = torch.randn(8, 5), torch.randn(8, 5)
    assert kernel.choice(x, y) == "eager" and kernel._compiled is None
    assert_close(kernel(x, y), _scaled_sum(x, y), what="eager")
    assert not autotune.cache_path().exists()  # nothing measured, nothing remembered
    with compiling.expecting(0.5):  # a job too short for a compilation to pay (COLD_GUESS s)
        assert kernel.choice(x, y) == "eager" and kernel._compiled is None


def test_a_long_job_measures_the_compiled_kernel_and_remembers_the_choice(monkeypatch, cheap_backend):
    monkeypatch.delenv("TFORMER_COMPILE", raising=False)
    kernel = Compiled("sum-b", _scaled_sum)
    x, y = torch.randn(8, 5), torch.randn(8, 5)
    with compiling.expecting(math.inf):
        choice = kernel.choice(x, y)
        assert_close(kernel(x, y), _scaled_sum(x, y), what=f"{choice} vs eager")
    assert choice in ("eager", "compiled") and kernel.compile_seconds is not None
    saved = json.loads(autotune.cache_path().read_text())
    (key, decision), = ((k, v) for k, v in saved.items() if "compiled:sum-b" in k)
    assert decision["choice"] == choice and decision["compile_s"] >= 0.0
    assert set(decision["seconds"]) == {"eager", "compiled"}
    # A new process: the choice is read, not measured again (a measurement would fail here).
    monkeypatch.setattr(autotune, "_memory", {})
    monkeypatch.setattr(compiling.Compiled, "_decide", lambda *a: pytest.fail("measured again"))
    with compiling.expecting(math.inf):
        assert Compiled("sum-b", _scaled_sum).choice(x, y) == choice
    # ... and a short job does not compile even a kernel remembered as faster compiled, unless
    # the expected work repays the compilation the cache remembers.
    if choice == "compiled":
        with compiling.expecting(0.0):
            assert Compiled("sum-b", _scaled_sum).choice(x, y) == "eager"


def test_a_remembered_kernel_compiles_where_its_measured_saving_repays_the_compilation(monkeypatch,
                                                                                        cheap_backend):
    """Once a kernel's saving per call is measured here (eager 2 s, compiled 1 s a call) and its
    share of the job's eager time is known (a tenth: its eager calls inside jobs are timed), a
    job compiles it only where that saving over the work expected, 0.5 x 0.1 x seconds, repays
    the remembered compilation (10 s): 150 s of work do not (PAYBACK's 5x alone said they did;
    the job would have lost 2.5 s), 250 do."""
    monkeypatch.delenv("TFORMER_COMPILE", raising=False)
    x, y = torch.randn(8, 5), torch.randn(8, 5)
    kernel = Compiled("sum-g", _scaled_sum)
    autotune.remember("compiled:sum-g", kernel.shape_class(x, y),
                      {**autotune.decision("compiled", {"eager": 2.0, "compiled": 1.0}), "compile_s": 10.0})
    monkeypatch.setattr(torch, "compile", lambda *a, **k: pytest.fail("compiled"))  # choices only
    with compiling.expecting(150.0):  # its share unknown yet: PAYBACK's rule
        assert kernel.choice(x, y) == "compiled"
    monkeypatch.setitem(compiling._job, "seconds", 10.0)
    kernel.eager_seconds = 1.0
    with compiling.expecting(150.0):
        assert kernel.choice(x, y) == "eager"
    with compiling.expecting(250.0):
        assert kernel.choice(x, y) == "compiled"
    # Its eager calls inside a job are what its share is timed from; outside one, nothing is.
    timed = Compiled("sum-h", _scaled_sum)
    before = compiling._job["seconds"]
    timed(x, y)
    assert timed.eager_seconds == 0.0 and compiling._job["seconds"] == before
    with compiling.expecting(0.0), compiling.expecting(0.0):  # nested: the job's time counted once
        assert_close(timed(x, y), _scaled_sum(x, y), what="eager in a job")
    assert 0.0 < timed.eager_seconds <= compiling._job["seconds"] - before


def test_a_compilation_that_fails_runs_eagerly_says_so_once_and_is_not_retried(monkeypatch, cheap_backend):
    monkeypatch.setenv("TFORMER_COMPILE", "1")
    attempts = []

    def broken(fn, **kwargs):
        def run(*args):
            attempts.append(1)
            raise RuntimeError("C++ compile error: simulated\nmore lines")

        return run

    monkeypatch.setattr(torch, "compile", broken)
    kernel = Compiled("sum-c", _scaled_sum)
    x, y = torch.randn(8, 5), torch.randn(8, 5)
    with pytest.warns(RuntimeWarning, match="compiling sum-c failed, it runs eagerly: RuntimeError: C"):
        out = kernel(x, y)
    assert_close(out, _scaled_sum(x, y), what="the eager fallback")
    assert "compiling sum-c failed here: RuntimeError: C++ compile error: simulated" in kernel.why_not(x.device)
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # warned once: no second warning, no second attempt
        assert_close(kernel(x, y), _scaled_sum(x, y), what="eager again")
    assert len(attempts) == 1 and compiling.summary() == {"sum-c": kernel.why_not(x.device).split(": ", 1)[1]}


def test_no_cxx_compiler_readable_and_compile_off_all_mean_eager(monkeypatch):
    import shutil as sh

    x = torch.randn(4, 3)
    monkeypatch.setenv("TFORMER_COMPILE", "1")
    monkeypatch.setattr(sh, "which", lambda name: None)
    compiling._cxx.cache_clear()  # looked up once per process: again, without any compiler
    assert "no C++ compiler" in compiling.why_not_compiled(x.device)
    compiling._cxx.cache_clear()
    monkeypatch.undo()
    monkeypatch.setenv("TFORMER_COMPILE", "0")
    assert compiling.why_not_compiled(x.device) == "TFORMER_COMPILE=0 turns compiled kernels off"
    monkeypatch.setenv("TFORMER_COMPILE", "1")
    with kernels.readable():
        assert "readable" in compiling.why_not_compiled(x.device)
    kernel = Compiled("sum-d", _scaled_sum)
    monkeypatch.setattr(torch, "compile", lambda *a, **k: pytest.fail("compiled"))
    monkeypatch.setenv("TFORMER_COMPILE", "off")
    assert_close(kernel(x, x), _scaled_sum(x, x), what="eager")


@needs_compiler
def test_compiled_add_norm_equals_eager_fp32_and_bf16(monkeypatch):
    """The post-norm residual's add and LayerNorm (kernels.add_norm), inductor-compiled: fp32 to
    1e-5, bf16 inputs (precision "bf16") to bf16's rounding; the layer's output alike."""
    from tformer.nn.kernels import norm_kernels

    monkeypatch.setenv("TFORMER_COMPILE", "1")
    norm = torch.nn.LayerNorm(48).requires_grad_(False)
    torch.nn.init.normal_(norm.weight)
    torch.nn.init.normal_(norm.bias)
    x = torch.randn(37, 48)
    for y in (torch.randn(37, 48).bfloat16(), torch.randn(37, 48)):
        expected = norm(x + y)
        got = norm_kernels.ADD_NORM.run_compiled(x, y, norm.weight, norm.bias, norm.eps)
        assert_close(got, expected, what=f"compiled add+norm, y {y.dtype}")
        with torch.no_grad():
            assert_close(kernels.add_norm(x, y, norm), expected, what=f"kernels.add_norm, y {y.dtype}")
    assert norm_kernels.why_not_compiled_add_norm(x, x, norm) is not None  # fp32: eager's is faster
    trained = torch.nn.LayerNorm(48)
    assert "autograd" in norm_kernels.why_not_compiled_add_norm(x, x.bfloat16(), trained)


@needs_compiler
@pytest.mark.slow
@pytest.mark.parametrize("precision", ["fp32", "bf16"])
def test_a_post_norm_encoder_with_compiled_kernels_equals_eager(tiny_config, monkeypatch, precision):
    from tformer.nn.model import Encoder
    from tformer.nn.precision import to_precision

    model = to_precision(Encoder(tiny_config.replace(dropout=0.0)).eval(), precision)
    model.requires_grad_(False)
    ids = torch.randint(0, tiny_config.vocab_size, (3, 11))
    mask = torch.arange(11)[None] < torch.tensor([[11], [6], [2]])
    with torch.no_grad():
        monkeypatch.setenv("TFORMER_COMPILE", "0")
        expected = model(ids, mask).last_hidden_state
        monkeypatch.setenv("TFORMER_COMPILE", "1")
        got = model(ids, mask).last_hidden_state
    assert_close(got, expected, what=f"{precision} encoder, compiled kernels vs eager")


def _train_once(model, objective, monkeypatch, value):
    from types import SimpleNamespace

    from tformer.training import steps

    monkeypatch.setenv("TFORMER_COMPILE", value)
    batch = SimpleNamespace(n_tokens=lambda: 12, n_examples=lambda: 3, to=lambda device: batch)
    config = SimpleNamespace(accumulate=1, label_smoothing=0.0, clip_grad=0.0, tf32=False)
    optimizer = torch.optim.AdamW(model.parameters(), lr=0.0)  # the gradients stay to compare
    loss, *_ = steps.train_step(model, optimizer, objective, iter([batch]), config, 0.0)
    return loss, {n: p.grad.clone() for n, p in model.named_parameters()}


def test_a_compiled_training_step_equals_eager_and_a_failure_goes_on_eagerly(tiny_config, monkeypatch,
                                                                              cheap_backend):
    """TFORMER_COMPILE=1: train_step's loss (forward and backward) compiled; the same loss and
    gradients as eager (dropout 0); a compilation that fails warns once and the step runs eagerly."""
    from types import SimpleNamespace

    from tformer.nn.model import EncoderClassifier

    model = EncoderClassifier(tiny_config.replace(n_classes=3, pooling="mean", dropout=0.0))
    ids = torch.randint(0, tiny_config.vocab_size, (3, 4))
    objective = SimpleNamespace(loss=lambda m, b, smoothing: (m(ids).logits.square().mean(), 0.5))
    want_loss, want = _train_once(model, objective, monkeypatch, "0")
    got_loss, got = _train_once(model, objective, monkeypatch, "1")
    assert compiling.summary() == {}  # it compiled
    assert abs(got_loss - want_loss) <= 1e-6 * abs(want_loss)
    for name in want:
        assert_close(got[name], want[name], what=f"grad {name}")

    def broken(*args, **kwargs):
        raise RuntimeError("simulated inductor failure")

    other = SimpleNamespace(loss=objective.loss)
    monkeypatch.setattr(torch, "compile", lambda fn, **kwargs: broken)
    with pytest.warns(RuntimeWarning, match="compiling train-loss failed, it runs eagerly"):
        loss, grads = _train_once(model, other, monkeypatch, "1")
    assert abs(loss - want_loss) <= 1e-6 * abs(want_loss) and "train-loss" in compiling.summary()


@pytest.mark.slow  # ~20 s of CPU (a minute on a busy machine): train_step's own test above is the fast check
def test_the_training_loop_runs_its_steps_through_the_compiled_loss(tmp_path, monkeypatch, cheap_backend):
    """TFORMER_COMPILE=1 reaches the loop's updates (tformer.training.loop -> steps.train_step),
    the first updates that alternate precisions included; the run trains as usual."""
    from text_fixtures import classification_rows, write

    from tformer.kinds import resolve_config, train
    from tformer.training import steps

    compiled = []
    real = torch.compile

    def spy(fn, **kwargs):
        compiled.append(getattr(fn, "__self__", None))
        inner = real(fn, **kwargs)

        def counted(*args):
            calls.append(1)
            return inner(*args)

        return counted

    calls = []
    monkeypatch.setattr(torch, "compile", spy)
    monkeypatch.setattr(steps, "_compiled_losses", {})
    monkeypatch.setenv("TFORMER_COMPILE", "1")
    data = write(tmp_path / "d.jsonl", classification_rows(40))
    record = train(resolve_config({"data": str(data), "d_model": 32, "n_heads": 2, "d_ff": 64, "n_layers": 1,
                                   "vocab_size": 300, "max_tokens": 256, "steps": 3, "threads": 1,
                                   "precision": "fp32", "out": str(tmp_path / "run")}),
                   progress=False, log=lambda *a: None)
    assert len(compiled) == 1 and compiled[0] is not None, compiled  # the run's objective's loss
    assert len(calls) == 3 and "train-loss" not in compiling.summary()
    assert record is not None and (tmp_path / "run" / "metrics.jsonl").exists()


def test_sizes_equal_by_chance_when_traced_stay_apart(monkeypatch):
    """A size that equals a fixed one when first traced (16 rows, a table 16 wide) is not
    compiled as that number: other row counts run the same compilation (a beam search's rows
    shrink as sources finish; each new count was compiled again until the recompile limit)."""
    from torch._dynamo.testing import CompileCounter

    counter = CompileCounter()
    monkeypatch.setattr(compiling, "BACKEND", counter)
    table = torch.randn(128, 16)
    kernel = compiling.Compiled("test-sizes", lambda x, t: x[:, :16] + t[0])
    torch._dynamo.reset()
    for rows in (16, 32, 48):
        torch.testing.assert_close(kernel.compiled(torch.randn(rows, 16), table).shape, (rows, 16))
    assert counter.frame_count == 1


def test_a_compiled_linear_multiplies_then_adds_its_bias_and_exporters_keep_f_linear():
    """Under torch.compile without autograd on a CPU a linear is x W^T + b (inductor then calls
    the GEMM alone and fuses the bias into the next elementwise kernel; from F.linear it called
    addmm, which copies the bias into the output first); with autograd, and under torch.export
    (one Gemm node for ONNX), F.linear as before. The values equal eager's either way."""
    layer = torch.nn.Linear(16, 8)
    x = torch.randn(5, 16)
    graphs = []

    def recording(gm, example_inputs):
        graphs.append({str(n.target) for n in gm.graph.nodes if n.op == "call_function"})
        return gm.forward

    def traced(*tensors):
        torch._dynamo.reset()
        graphs.clear()
        return torch.compile(kernels.linear_weights, backend=recording, fullgraph=True)(*tensors)

    with torch.no_grad():
        assert_close(traced(x, layer.weight, layer.bias), layer(x))
    assert any("matmul" in t for t in graphs[0]) and not any("linear" in t for t in graphs[0]), graphs
    assert_close(traced(x, layer.weight, layer.bias), layer(x))  # autograd: F.linear
    assert any("linear" in t for t in graphs[0]), graphs
    with torch.no_grad():
        assert_close(traced(x, layer.weight, None), x @ layer.weight.t())  # no bias: nothing to move
    assert any("linear" in t for t in graphs[0]), graphs

    class Linear(torch.nn.Module):
        def forward(self, x):
            return kernels.linear_weights(x, layer.weight, layer.bias)

    with torch.no_grad():
        exported = torch.export.export(Linear(), (x,))
    targets = {str(n.target) for n in exported.graph.nodes if n.op == "call_function"}
    assert any("linear" in t for t in targets) and not any("matmul" in t for t in targets), targets
