"""Measured kernel choices: the fastest candidate wins (never a slower one by more than the
noise), decisions survive in a cache file that two processes share, and a corrupt file is
measured again."""

import json
import subprocess
import sys
import time
from types import SimpleNamespace

import pytest

from tformer.nn.kernels import autotune


@pytest.fixture(autouse=True)
def _cache(tmp_path, monkeypatch):
    monkeypatch.setenv("TFORMER_CACHE_DIR", str(tmp_path / "cache"))
    autotune._memory.clear()
    autotune._defaults.clear()
    yield
    autotune._memory.clear()
    autotune._defaults.clear()


def _fake(seconds):
    """Candidates whose 'time' is given, measured by a fake clock: no timing noise in tests."""
    calls = {n: 0 for n in seconds}
    return ({n: (lambda n=n: calls.__setitem__(n, calls[n] + 1) or n) for n in seconds},
            lambda call: seconds[call()], calls)


def test_the_fastest_candidate_is_chosen_and_a_tie_keeps_the_default():
    candidates, measure, _ = _fake({"default": 1.0, "fast": 0.5, "slow": 2.0})
    assert autotune.choose("k", "s", candidates, measure) == "fast"
    candidates, measure, _ = _fake({"default": 1.0, "within-noise": 0.97})
    assert autotune.choose("k", "t", candidates, measure) == "default"


def test_a_decision_is_measured_once_then_read_from_the_cache_file():
    candidates, measure, calls = _fake({"a": 2.0, "b": 1.0})
    assert autotune.choose("k", "s", candidates, measure) == "b"
    measured = dict(calls)
    autotune._memory.clear()  # a new process: only the file remains
    assert autotune.choose("k", "s", candidates, measure) == "b"
    assert calls == measured  # nothing measured again
    saved = json.loads(autotune.cache_path().read_text())
    assert [v["choice"] for v in saved.values()] == ["b"]


def test_a_corrupt_cache_file_is_measured_again_and_rewritten():
    autotune.cache_path().parent.mkdir(parents=True)
    autotune.cache_path().write_text('{"half a json')
    candidates, measure, _ = _fake({"a": 2.0, "b": 1.0})
    assert autotune.choose("k", "s", candidates, measure) == "b"
    assert json.loads(autotune.cache_path().read_text())  # valid again


def test_a_damaged_cache_entry_is_measured_again():
    """Valid JSON, but an entry without its seconds (edited by hand, or by an older version):
    measured again, never a KeyError in whoever reads the decision."""
    autotune.cache_path().parent.mkdir(parents=True)
    key = f"{autotune.machine_key()} | k | s"
    autotune.cache_path().write_text(json.dumps({key: {"choice": "a"}}))
    candidates, measure, calls = _fake({"a": 2.0, "b": 1.0})
    decision = autotune.recall("k", "s", lambda: autotune.decide(candidates, measure), {"a", "b"})
    assert decision["choice"] == "b" and set(decision["seconds"]) == {"a", "b"} and calls["b"] > 0


def test_this_machines_decisions_of_an_older_version_are_dropped(monkeypatch):
    """A new VERSION measures again; the old decisions of this machine leave the file when the
    first new one is written; other machines' and other thread counts' stay."""
    autotune.cache_path().parent.mkdir(parents=True)
    old = f"{autotune._machine()} | v{autotune.VERSION - 1} | k | s"
    unversioned = f"{autotune._machine()} | k | s"  # before keys carried a version
    other = f"Another CPU | torch 0 | 2 threads | v{autotune.VERSION - 1} | k | s"
    entry = {"choice": "a", "seconds": {"a": 1.0, "b": 2.0}}
    autotune.cache_path().write_text(json.dumps({old: entry, unversioned: entry, other: entry}))
    candidates, measure, _ = _fake({"a": 2.0, "b": 1.0})
    assert autotune.choose("k", "s", candidates, measure) == "b"  # measured again
    saved = json.loads(autotune.cache_path().read_text())
    assert set(saved) == {other, f"{autotune.machine_key()} | k | s"}


def test_two_processes_add_their_decisions_to_one_cache_file(tmp_path):
    script = (
        "import sys; from tformer.nn.kernels import autotune\n"
        "for i in range(20):\n"
        "    autotune.choose('k', f'{sys.argv[1]}-{i}', {'a': lambda: None, 'b': lambda: None},\n"
        "                    lambda call: 1.0)\n"
    )
    env = {"TFORMER_CACHE_DIR": str(autotune.cache_path().parent), "PATH": ""}
    procs = [subprocess.Popen([sys.executable, "-c", script, name], env=env) for name in ("p", "q")]
    assert all(p.wait(timeout=120) == 0 for p in procs)
    saved = json.loads(autotune.cache_path().read_text())
    assert len(saved) == 40  # no decision lost to the other process's write


def test_a_real_choice_is_never_slower_than_a_forced_remeasurement_beyond_the_noise():
    import torch

    x = torch.randn(256, 256)
    candidates = {"matmul": lambda: x @ x, "einsum": lambda: torch.einsum("ij,jk->ik", x, x)}
    chosen = autotune.choose("test-matmul", "256", candidates)
    again = autotune.decide(candidates, autotune._time_once)["seconds"]
    assert again[chosen] <= min(again.values()) * 3  # the same kernel class: only noise between


def test_a_training_step_measures_its_linear_kernels_once_and_info_shows_them(capsys, tmp_path):
    import torch

    from tformer.commands.cli import main
    from tformer.nn import kernels

    layer = torch.nn.Linear(24, 40)
    x = torch.randn(3, 7, 24, requires_grad=True)
    kernels.linear(x, layer).sum().backward()
    lines = autotune.summary()
    assert any(line.startswith("linear-train | 24x40/32/float32: ") for line in lines), lines
    before = dict(autotune.decisions())
    kernels.linear(x, layer).sum().backward()  # the same shape class: no new measurement
    assert autotune.decisions() == before
    from tformer import TransformerConfig

    TransformerConfig(d_model=16, n_heads=2, d_ff=32, n_layers=1).save(tmp_path / "c.json")
    assert main(["info", str(tmp_path / "c.json"), "--kernels"]) == 0  # the machine's cache: on request
    assert "linear-train | 24x40/32/float32" in capsys.readouterr().out


def test_the_fastest_round_decides_and_a_noisy_measurement_is_taken_again():
    """Other work on the machine only adds time: one slow round of the faster candidate (a
    burst of load) must not flip the choice, and rounds that spread are measured again once."""
    rounds = {"a": iter([1.0] * 20), "b": iter([0.5, 3.0, 3.0, 3.0, 0.5, 0.5] + [0.5] * 20)}
    counts = {"a": 0, "b": 0}

    def measure(call):
        name = call()
        counts[name] += 1
        return next(rounds[name])

    decision = autotune.decide({"a": lambda: "a", "b": lambda: "b"}, measure)
    assert decision["choice"] == "b" and decision["seconds"] == {"a": 1.0, "b": 0.5}
    assert counts == {"a": 1 + 2 * autotune.ROUNDS, "b": 1 + 2 * autotune.ROUNDS}  # measured again
    steady = {"a": 1.0, "b": 0.5}
    counts = {"a": 0, "b": 0}
    autotune.decide({"a": lambda: "a", "b": lambda: "b"},
                    lambda call: counts.__setitem__(call(), counts[call()] + 1) or steady[call()])
    assert counts == {"a": 1 + autotune.ROUNDS, "b": 1 + autotune.ROUNDS}  # quiet: once


def test_kernel_choices_stop_measuring_when_their_allowance_is_spent(monkeypatch):
    """A timed run bounds what its kernel choices cost: a measurement that reaches the end of the
    allowance is abandoned there (one took 4.6 s of a run allowed 3 s), and past it a new shape
    class runs the default (the first candidate), remembered nowhere, so a later run measures it."""
    clock = {"now": 0.0}

    def measure(call):
        name = call()
        clock["now"] += 1.0  # each measurement takes a second
        return 1.0 if name == "default" else 0.5

    candidates = {"default": lambda: "default", "fast": lambda: "fast"}
    monkeypatch.setattr(autotune, "time", SimpleNamespace(perf_counter=lambda: clock["now"],
                                                          strftime=time.strftime))
    with autotune.measuring(5.0):
        assert autotune.choose("k", "first", candidates, measure) == "default"  # 12 s to measure
        assert clock["now"] <= 6.0  # given up at the allowance's end, one measurement past it
        assert autotune.choose("k", "second", candidates, measure) == "default"  # none left
    assert autotune.known("k", "first") is None and autotune.known("k", "second") is None
    autotune._defaults.clear()
    with autotune.measuring(20.0):
        assert autotune.choose("k", "first", candidates, measure) == "fast"  # measured: 12 s
    with autotune.measuring(0.0):
        assert autotune.choose("k", "first", candidates, measure) == "fast"  # known still
    assert autotune.choose("k", "second", candidates, measure) == "fast"  # no limit: measured


def test_a_choice_made_within_another_s_measurement_is_counted_once(monkeypatch):
    """A candidate may make a choice of its own (attention-bf16's fp32 candidate picks its
    attention kernel): its seconds lie within the outer measurement's, so seconds_measuring and
    the allowance count them once. Counted twice, a validation's measuring exceeded its own
    time, and its rate came out at -5.5 ms an example."""
    clock = {"now": 0.0}

    def measure(call):
        call()
        clock["now"] += 1.0
        return 1.0

    inner = {"default": lambda: None, "other": lambda: None}

    def outer_candidate():
        autotune.choose("inner", "nested", inner, measure)  # measured on the first call only

    monkeypatch.setattr(autotune, "time", SimpleNamespace(perf_counter=lambda: clock["now"],
                                                          strftime=time.strftime))
    before, start = autotune.seconds_measuring(), clock["now"]
    with autotune.measuring(100.0):
        autotune.choose("outer", "nested", {"default": outer_candidate, "other": lambda: None}, measure)
        left = autotune._allowance["left"]
    elapsed = clock["now"] - start
    assert autotune.known("inner", "nested") is not None  # the nested choice was measured
    assert autotune.seconds_measuring() - before == elapsed  # not more than the time it took
    assert left == 100.0 - elapsed


def test_a_rate_measured_beside_busy_processes_is_this_process_s_only(monkeypatch):
    """A decision whose seconds are the machine's speed (a product's, a training step's rate) is
    kept in the cache file only when the cores were this process's while it was measured: a
    busy moment's 26x slower product had planned every later run from it. Within the process
    it stands (its plan and re-plan agree); the next process measures again."""
    others = {"now": 2.0}
    monkeypatch.setattr(autotune, "others_running", lambda **k: others["now"])
    monkeypatch.setattr(autotune.torch, "get_num_threads", lambda: 2)
    monkeypatch.setattr(autotune, "usable_cores", lambda: 2)
    measured = []

    def decide_now():
        measured.append(1)
        return autotune.decision("fp32", {"fp32": 0.02 * len(measured)})

    busy = autotune.recall("product", "busy", decide_now, rate=True)
    assert autotune.recall("product", "busy", decide_now, rate=True) == busy and len(measured) == 1
    autotune.remember("train-rate", "busy", autotune.decision("x", {"gflop": 1.0}), rate=True)
    assert not any("busy" in k for k in autotune._read())  # nothing of it in the file
    autotune._memory.clear()  # a new process: measures again
    assert autotune.recall("product", "busy", decide_now, rate=True)["seconds"]["fp32"] == 0.04
    others["now"] = 0.0  # quiet: kept for the next process
    autotune._memory.clear()
    quiet = autotune.recall("product", "busy", decide_now, rate=True)
    autotune.remember("train-rate", "quiet", autotune.decision("x", {"gflop": 1.0}), rate=True)
    autotune._memory.clear()
    assert autotune.recall("product", "busy", decide_now, rate=True) == quiet and len(measured) == 3
    assert autotune.known("train-rate", "quiet")["seconds"] == {"gflop": 1.0}
    # A kernel choice compares its candidates with each other: kept whatever the machine runs.
    others["now"] = 2.0
    autotune.recall("kernel", "choice", decide_now)
    assert any(k.endswith("kernel | choice") for k in autotune._read())


def test_quiet_counts_other_threads_against_the_cores_left_free(monkeypatch):
    monkeypatch.setattr(autotune, "usable_cores", lambda: 2)
    monkeypatch.setattr(autotune.torch, "get_num_threads", lambda: 1)
    for others, expected in ((0.0, True), (1.0, True), (2.0, False)):
        monkeypatch.setattr(autotune, "others_running", lambda others=others, **k: others)
        assert autotune.quiet() is expected


def test_timings_are_measured_once_and_none_without_an_allowance():
    """``timings`` gives each candidate's seconds (a cost model's inputs), measured and kept as
    ``choose``'s decisions are; where nothing is known and the allowance is spent, None."""
    candidates, measure, calls = _fake({"small": 0.001, "large": 0.004})
    with autotune.measuring(0.0):
        assert autotune.timings("cost", "s", candidates, measure) is None
    assert calls == {"small": 0, "large": 0}
    autotune._defaults.clear()  # (a later run, with time to measure)
    assert autotune.timings("cost", "s", candidates, measure) == {"small": 0.001, "large": 0.004}
    measured = dict(calls)
    autotune._memory.clear()  # a new process: read from the file, nothing measured again
    assert autotune.timings("cost", "s", candidates, measure) == {"small": 0.001, "large": 0.004}
    assert calls == measured
