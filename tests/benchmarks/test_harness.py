"""The benchmark's own machinery: timing statistics, contenders agreeing, the floor being right."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from helpers import assert_close

from tformer.commands.benchmarking import models as M
from tformer.commands.benchmarking.floor import FloorEncoder
from tformer.commands.benchmarking.harness import Report, Row, Target, Timing, measure, paired_ratio
from tformer.nn.model import Encoder


def test_paired_ratio_is_the_median_of_per_round_ratios():
    slow, fast = Timing(wall=[2.0, 9.0, 3.0]), Timing(wall=[1.0, 3.0, 1.0])
    assert paired_ratio(slow, fast) == 3.0  # ratios 2, 3, 3
    assert Timing(wall=[1.0, 2.0, 3.0, 4.0, 5.0]).spread == pytest.approx(2.0 / 3.0)
    assert Timing(wall=[1.0, 1.0], cpu=[2.0, 1.0]).cores == 1.5


def test_measure_alternates_the_order():
    calls = []
    timings = measure({"a": lambda: calls.append("a"), "b": lambda: calls.append("b")}, rounds=2,
                      warmup=0)
    assert calls == ["a", "b", "b", "a"]
    assert all(len(t.wall) == 2 for t in timings.values())


def test_targets_and_markdown():
    report = Report(rows=[Row("w", "tformer", 10.0, 0.05, 1000.0, 1.0, 1.9)],
                    targets=[Target("w", "fast", 1.3, 1.15), Target("w", "small", 400.0, 300.0, False)])
    assert [t.met for t in report.targets] == [True, False]
    text = report.to_markdown()
    assert "| w | tformer | 10.0 | ±5% | 1,000 | 1.00x | 1.90 |" in text and "**no**" in text


@pytest.mark.parametrize("norm_first,padded", [(False, False), (False, True), (True, True)])
def test_contenders_agree_with_tformer(norm_first, padded):
    config = M.bert_config("small", quick=True, norm_first=norm_first)
    enc = Encoder(config).eval()
    ids, mask = M.inputs(config, 4, 12, padded)
    runs = {"nn": M.torch_nn(enc, M.torch_nn_stack(enc)), "numpy": M.numpy_reference(enc),
            "floor": M.numpy_floor(enc)}
    if not norm_first:
        runs["hf"] = M.hf_bert(M.hf_bert_model(enc))
    with torch.inference_mode():
        expected = M.tformer(enc, skip_padding=padded)(ids, mask)
        for name, run in runs.items():
            assert M.max_abs_diff(run(ids, mask), expected, mask) <= 1e-5, name


def test_floor_matches_the_float64_reference():
    config = M.bert_config("small", quick=True, norm_first=True)
    enc = Encoder(config).double().eval()
    ids, mask = M.inputs(config, 3, 10, padded=True)
    floor = FloorEncoder(config, {k: v.numpy() for k, v in enc.state_dict().items()})
    with torch.no_grad():
        expected = enc(ids, mask).last_hidden_state
    assert_close(floor(ids.numpy(), mask.numpy()), expected, np.float64, where=mask, what="floor")
