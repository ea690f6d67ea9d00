"""The training workload's GEMM floor: each row's share of the measured GEMM roofline and the
bound it puts on any ratio over HF."""

from __future__ import annotations

import pytest
import torch

from tformer.commands.benchmarking import models as M
from tformer.commands.benchmarking.harness import Report, Row
from tformer.commands.benchmarking.roofline import gemm_throughput
from tformer.commands.benchmarking.training import _gemm_floor
from tformer.config.sizes import flops_per_token


def test_gemm_floor_is_the_steps_matrix_products_at_the_roofline():
    config = M.bert_config("small", quick=True)
    batch, seq = 4, 16
    report = Report(rows=[
        Row("train-x", "tformer (fused AdamW)", median_ms=10.0),
        Row("train-x", "HF BertModel sdpa (fused AdamW)", median_ms=20.0),
        Row("train-x", "tformer (fused AdamW), bf16 autocast", median_ms=5.0),
        Row("train-x", "HF BertModel sdpa (fused AdamW), bf16 autocast", median_ms=8.0),
        Row("train-x", "a row that was not timed"),
        Row("other", "tformer (fused AdamW)", median_ms=1.0),
    ])
    _gemm_floor(report, "train-x", config, batch, seq, threads=1)
    flops = 3.0 * flops_per_token(config, seq) * batch * seq  # forward, dx, dW
    floor = {dtype: flops / (gemm_throughput(config.d_model, config.d_ff, batch * seq, 1, dtype)["best"]
                             * 1e9) * 1e3 for dtype in (torch.float32, torch.bfloat16)}
    fp32, hf32, bf16, hf16, untimed, other = report.rows
    assert fp32.roofline == pytest.approx(floor[torch.float32] / 10.0)
    assert hf32.roofline == pytest.approx(floor[torch.float32] / 20.0)
    assert bf16.roofline == pytest.approx(floor[torch.bfloat16] / 5.0)
    assert untimed.roofline is None and other.roofline is None  # another workload's row stays
    fp32_note, bf16_note = report.notes
    assert fp32_note.startswith(f"train-x: GEMM floor fp32 {floor[torch.float32]:.0f} ms")
    assert f"HF (fused AdamW) / floor = {20.0 / floor[torch.float32]:.2f}x" in fp32_note
    assert f"HF (fused AdamW) / floor = {8.0 / floor[torch.bfloat16]:.2f}x" in bf16_note
