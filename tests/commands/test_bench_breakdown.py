"""`tformer bench`'s "time:" note for tformer rows: where one call's time goes, by part."""

from __future__ import annotations

import io
import json
import math
import sys

import pytest
import torch
import torch.nn.functional as F

from tformer.commands.benchmarking import breakdown, worker


def _layer_like(x, w, q):
    """A linear, attention, a norm and a cast: one operator of each part."""
    h = F.linear(x, w)  # linears (aten::addmm / mm)
    a = F.scaled_dot_product_attention(q, q, q)  # attention
    n = F.layer_norm(h, (h.size(-1),))  # norms/adds/activations
    return n.to(torch.float64), a  # copies/casts


def test_every_part_is_timed_and_the_parts_add_up_to_the_call():
    g = torch.Generator().manual_seed(0)
    x, w = torch.randn(512, 256, generator=g), torch.randn(256, 256, generator=g)
    q = torch.randn(2, 4, 64, 32, generator=g)

    def call():
        h, _ = _layer_like(x, w, q)
        return h.float().log_softmax(-1).topk(4)  # a search's selection

    call()
    seconds = breakdown.time_parts(call)
    assert list(seconds) == [*breakdown.PARTS, breakdown.REST]
    assert all(seconds[part] > 0 for part in breakdown.PARTS), seconds
    assert seconds[breakdown.REST] >= 0
    # a call made of matrix products only is mostly "linears"
    big = torch.randn(1024, 1024, generator=g)
    only = breakdown.time_parts(lambda: [F.linear(big, big) for _ in range(4)])
    assert only["linears"] > 0.5 * sum(only.values()), only


def test_describe_gives_each_part_its_share_in_order():
    text = breakdown.describe({"linears": 3.0, "attention": 1.0, "top-k": 0.001, breakdown.REST: 0.0})
    assert text == "linears 75%, attention 25%, the rest 0%"  # a part under 0.5% left out
    assert breakdown.describe({"linears": 0.0}) == ""
    shares = [float(p.rsplit(" ", 1)[1].rstrip("%")) for p in breakdown.describe(
        {"a": 1.0, "b": 2.0, "c": 4.0}).split(", ")]
    assert math.isclose(sum(shares), 100, abs_tol=1.5)


@pytest.mark.parametrize("profiled", [True, False])
def test_a_worker_answers_profile_between_timed_runs(monkeypatch, profiled):
    """The worker protocol: "profile" gets the parts (tformer's contenders) or {} (a peer),
    and timed "run"s go on after it."""
    calls = []
    monkeypatch.setattr(sys, "stdin", io.StringIO("run\nprofile\nrun\nquit\n"))
    replies = []
    x = torch.randn(64, 64)
    worker._serve(lambda: calls.append(F.linear(x, x)), lambda **kw: replies.append(json.loads(json.dumps(kw))),
                  profiled=profiled)
    assert len(calls) == (4 if profiled else 2)  # profiling: a plain call, then a profiled one
    assert set(replies[0]) == {"wall", "cpu"} and set(replies[2]) == {"wall", "cpu"}
    parts = replies[1]["parts"]
    assert (set(parts) == {*breakdown.PARTS, breakdown.REST}) if profiled else parts == {}
