"""The peer workloads' GEMM floors: each fp32 and bf16 row's share of the measured GEMM roofline,
and what a speed target leaves for everything but the matrix products."""

from __future__ import annotations

import pytest
import torch

from tformer.commands.benchmarking import corpus
from tformer.commands.benchmarking.harness import Report, Row, Timing
from tformer.commands.benchmarking.roofline import gemm_throughput
from tformer.commands.benchmarking.runtimes import _gemm_floors
from tformer.config.sizes import flops_per_token
from tformer.formats.pretrained import pretrained_config
from tformer.nn.kernels.machine import has_bf16


def _timing(ms: float) -> Timing:
    return Timing(wall=[ms / 1e3] * 3, cpu=[ms / 1e3] * 3)


def test_gemm_floors_are_the_texts_matrix_products_at_the_roofline(tmp_path):
    model = corpus.write_bert(tmp_path / "model", "tiny")
    config = pretrained_config(model)
    lengths, rows = [5, 17, 40], 62
    timings = {"tformer fp32": _timing(10.0), "OpenVINO f32": _timing(12.0),
               "tformer bf16": _timing(6.0), "OpenVINO default precision": _timing(7.0),
               "tformer int8": _timing(5.0)}
    report = Report(rows=[Row("w", name, median_ms=t.median * 1e3) for name, t in timings.items()]
                    + [Row("w", "CTranslate2 fp32"), Row("other", "tformer fp32", median_ms=1.0)])
    goals = [("tformer fp32", "OpenVINO f32", 1.25), ("tformer bf16", "OpenVINO default precision", 1.3),
             ("tformer int8", "OpenVINO f32", 1.0)]
    _gemm_floors(report, timings, "w", model, lengths, rows, goals, threads=1)

    flops = sum(flops_per_token(config, n) * n for n in lengths)  # each text at its own length
    dtypes = {"fp32": torch.float32, "bf16": torch.bfloat16} if has_bf16() else {"fp32": torch.float32}
    floor = {label: flops / (gemm_throughput(config.d_model, config.d_ff, rows, 1, dtype)["best"] * 1e9)
             * 1e3 for label, dtype in dtypes.items()}
    by_name = {(r.workload, r.contender): r for r in report.rows}
    assert by_name["w", "tformer fp32"].roofline == pytest.approx(floor["fp32"] / 10.0)
    assert by_name["w", "OpenVINO f32"].roofline == pytest.approx(floor["fp32"] / 12.0)
    assert by_name["w", "tformer int8"].roofline is None  # no int8 roofline is measured
    assert by_name["w", "CTranslate2 fp32"].roofline is None  # not timed
    assert by_name["other", "tformer fp32"].roofline is None  # another workload's row stays
    fp32_note = report.notes[0]
    assert fp32_note.startswith(f"w: tformer fp32 >= 1.25x OpenVINO f32 asks for at most {12.0 / 1.25:.0f} ms; "
                                f"the fp32 GEMM floor is {floor['fp32']:.0f} ms")
    assert f"OpenVINO f32 / floor = {12.0 / floor['fp32']:.2f}x" in fp32_note
    assert len(report.notes) == len(dtypes)  # int8: no floor, no note
    if has_bf16():
        assert by_name["w", "OpenVINO default precision"].roofline == pytest.approx(floor["bf16"] / 7.0)
        assert f"OpenVINO default precision / floor = {7.0 / floor['bf16']:.2f}x" in report.notes[1]


def test_a_worker_that_dies_profiling_keeps_its_timings(tmp_path, monkeypatch):
    """The "time:" profile comes after the timed rounds: a tformer worker that dies there keeps
    its row's timings, and its note says it was not profiled."""
    from types import SimpleNamespace

    import numpy as np

    from tformer.commands.benchmarking import runtimes, worker
    from tformer.commands.benchmarking.harness import Measured

    class Dies:
        def ready(self):
            return {"output": np.ones((3, 4), dtype=np.float32), "note": ""}

        def __call__(self):
            return Measured(0.01, 0.02)

        def parts(self):
            raise RuntimeError("worker exited (-9): killed")

        def close(self):
            pass

    monkeypatch.setattr(worker, "start", lambda names, *a: ({n: Dies() for n in names}, {}))
    settings = SimpleNamespace(quick=True, threads=1, contenders=["no peer"], n_rounds=lambda n: 2)
    inputs = tmp_path / "texts.json"
    inputs.write_text("[]")
    report, timings = runtimes._compare(settings, "sentences-minilm", "sentences", tmp_path, inputs, 10, None)
    assert list(timings) == ["tformer fp32"]
    (row,) = [r for r in report.rows if r.contender == "tformer fp32"]
    assert row.median_ms == pytest.approx(10.0)
    assert "time: not profiled (worker exited (-9): killed)" in row.note
