"""The budget drives a run: a timed run ends in time, its schedule decays to the deadline,
validation stays within its share; --epochs stops after N passes."""

import json
import math
import random
import time

import pytest
from helpers import build_data, data_objective
from text_fixtures import classification_rows, seq2seq_rows, write

from tformer.kinds import load_run, resolve_config, train
from tformer.training import resume_config
from tformer.training.config import TIMED_STEPS
from tformer.training.objective import FIRST_BATCH_UNDER_DEADLINE
from tformer.training.plan import VALID_SHARE
from tformer.training.schedule import WARMUP_SHARE, learning_rate

QUIET = dict(progress=False, log=lambda *a: None)
TINY = {"d_model": 32, "n_heads": 2, "d_ff": 64, "n_layers": 1, "vocab_size": 300, "max_tokens": 256,
        "threads": 1}



def _lines(run):
    return [json.loads(x) for x in (run / "metrics.jsonl").read_text().splitlines()]


def test_a_timed_run_ends_within_its_budget_and_its_schedule_decays_to_the_deadline(tmp_path):
    data = write(tmp_path / "d.jsonl", seq2seq_rows(400))
    config = resolve_config({"data": str(data), **TINY, "max_minutes": 0.5, "steps": 100_000,
                             "log_every": 1, "precision": "fp32", "out": str(tmp_path / "run")})
    started = time.perf_counter()
    record = train(config, **QUIET)
    seconds = time.perf_counter() - started
    assert seconds <= 0.5 * 60 * 1.05, seconds
    assert record["stopped_by"] == "max_minutes"
    train_lines = [r for r in _lines(tmp_path / "run") if r["split"] == "train"]
    first, last = train_lines[0], train_lines[-1]
    assert last["lr"] <= 0.05 * config.lr, last  # the linear decay reached (nearly) its end
    # Planned for the steps it could take: within 1% (the plan is re-estimated from a smoothed
    # step time, so a few slow steps at the end stop the run a few steps short of it).
    assert last["planned_steps"] <= 1.01 * last["step"] + 2, last
    peak = max(train_lines, key=lambda r: r["lr"])["step"]  # warmup ends early: 10% of what it took
    assert first["planned_steps"] == 100_000 and peak <= 1.5 * WARMUP_SHARE * last["step"] + 2


def test_validation_share_is_recorded_and_stays_under_its_bound(tmp_path):
    data = write(tmp_path / "d.jsonl", classification_rows(600))
    config = resolve_config({"data": str(data), **TINY, "max_minutes": 0.4, "steps": 100_000,
                             "out": str(tmp_path / "run")})
    train(config, **QUIET)
    lines = _lines(tmp_path / "run")
    validations = [r for r in lines if r["split"] == "validation"]
    assert len(validations) >= 2
    assert all("valid_share" in r for r in validations)
    assert lines[-1]["valid_share"] <= 2 * VALID_SHARE, lines[-1]  # ~5%, with the probe and noise


def test_epochs_stop_the_run_after_n_passes(tmp_path):
    data = write(tmp_path / "d.jsonl", classification_rows(200))
    config = resolve_config({"data": str(data), **TINY, "epochs": 2, "steps": 100_000,
                             "eval_every": 1000, "out": str(tmp_path / "run")})
    record = train(config, **QUIET)
    assert record["stopped_by"] == "epochs"
    # ~180 training records in batches of about max_tokens / width each: a few dozen steps.
    assert 2 <= record["step"] <= 200, record


def test_warmup_never_exceeds_its_share_of_the_planned_steps():
    config = resolve_config({"task": "reverse", "warmup": 4000, "steps": 1000, "schedule": "linear"})
    peak = max(range(1, 1001), key=lambda s: learning_rate(config, s))
    assert peak == WARMUP_SHARE * 1000
    assert learning_rate(config, 1000) == 0.0
    assert learning_rate(config, 50, total=100) == 0.0 or learning_rate(config, 100, total=100) == 0.0


SMALL_LADDER = ({"d_model": 32, "n_heads": 2, "d_ff": 64, "n_layers": 1},
                {"d_model": 48, "n_heads": 2, "d_ff": 96, "n_layers": 2})


@pytest.fixture
def probes_paid(tmp_path, monkeypatch):
    """Nothing remembered: every choice is estimated afresh."""
    from tformer.nn.kernels import autotune

    monkeypatch.setenv("TFORMER_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.setattr(autotune, "_memory", {})


@pytest.mark.parametrize("min_steps, expected", [(1, 48), (10**9, 32)])
def test_a_timed_run_without_sizes_takes_the_largest_model_the_budget_trains_enough(
        tmp_path, monkeypatch, min_steps, expected, probes_paid):
    from tformer.training import sizing

    monkeypatch.setattr(sizing, "LADDER", SMALL_LADDER)
    monkeypatch.setattr(sizing, "MIN_STEPS", min_steps)
    data = write(tmp_path / "d.jsonl", classification_rows(200))
    logged = []
    config = resolve_config({"data": str(data), "vocab_size": 300, "max_tokens": 256, "threads": 1,
                             "max_minutes": 0.15, "out": str(tmp_path / "run")})
    assert config.auto_size
    train(config, progress=False, log=logged.append)
    chosen = [line for line in logged if line.startswith("model size: d_model")]
    assert len(chosen) == 1, logged
    # Short of the floor even at the smallest rung, the line says so (not "the largest that gets").
    assert ("the smallest, and even it gets only" in chosen[0]) == (min_steps == 10**9), chosen
    loaded = load_run(tmp_path / "run")  # the chosen size is the run's for good
    model, _, saved = loaded.model, loaded.objective, loaded.config
    assert saved.model.d_model == expected and model.config.d_model == expected


@pytest.mark.parametrize("per_step, largest", [(0.012, True), (1.0, False)])
def test_the_size_is_the_largest_rung_whose_step_time_buys_enough_updates(per_step, largest):
    """A GPU's small steps are bound by kernel launches: every rung timed 12 ms a step (as a
    2-layer model did on an H200), so the largest gets enough updates. At 1 s a step even the
    smallest falls short: no larger rung is asked about, and the line says so."""
    from tformer.training import sizing

    config = resolve_config({"data": None, "task": "reverse", "max_minutes": 1.5})
    asked = []

    def seconds_per_step(candidate):
        asked.append(candidate.model.d_model)
        return per_step

    chosen, why = sizing.choose_size(config, 81.0, seconds_per_step)
    if largest:
        assert chosen.model.d_model == sizing.LADDER[-1]["d_model"]
        assert asked == [r["d_model"] for r in sizing.LADDER] and "12 ms a step" in why, why
    else:
        assert asked == [sizing.LADDER[0]["d_model"]] and chosen.model.d_model == sizing.LADDER[0]["d_model"]
        assert "the smallest, and even it gets only about 81" in why, why


def test_a_probe_past_its_deadline_still_times_one_step_after_the_warm_up():
    """The warm-up's time is never the answer: a GPU's first step loads its kernels (5.4 s on
    an H200, 12 ms a step after), and answering with it made a run pick the smallest model."""
    from types import SimpleNamespace

    from tformer.training.sizing import time_steps

    calls = []

    def step(model, batch, objective):
        time.sleep(0.05 if not calls else 0.001)  # a slow first step, then fast ones
        calls.append(batch)

    objective = SimpleNamespace(build_model=lambda: None, train_batches=lambda epoch: iter(range(10)))
    times = time_steps(objective, step, deadline=time.perf_counter())  # already past
    assert calls == [0, 1]  # the warm-up and one timed step, no more
    assert times.step < 0.02 and times.first > 0.03


def test_size_options_turn_the_choice_off():
    config = resolve_config({"data": None, "task": "reverse", "d_model": 32})
    assert not config.auto_size


def test_without_max_tokens_a_batch_holds_batch_size_examples_of_the_mean_length(tmp_path):
    data = write(tmp_path / "d.jsonl", classification_rows(300))
    logged = []
    config = resolve_config({"data": str(data), **TINY, "max_tokens": None, "batch_size": 8,
                             "steps": 3, "eval_every": 1000, "out": str(tmp_path / "run")})
    train(config, progress=False, log=logged.append)
    assert any(line.startswith("batch: ") for line in logged), logged
    loaded = load_run(tmp_path / "run")  # the chosen tokens are the run's for good
    _, source, saved = loaded.model, loaded.objective, loaded.config
    costs = [ex.cost for ex in source.encode(next(source.source.data.epoch_pools()))]
    assert saved.max_tokens == math.ceil(8 * sum(costs) / len(costs))
    batches = source.train_batches(0)
    sizes = [next(batches).n_examples() for _ in range(30)]
    assert 5 <= sum(sizes) / len(sizes) <= 11, sizes  # 8 on average, give or take the bucketing


def test_a_run_says_what_share_of_its_texts_max_length_cuts(tmp_path):
    from tformer.training.sizing import truncated

    assert truncated([10, 63, 64, 70], 64) == ("max length: 64 tokens cut 50% of the training "
                                               "examples (in a sample of 4; --max-length sets it)")
    assert truncated([10] * 200 + [64], 64) is None  # under 1%: nothing to say
    rows = classification_rows(300)
    for row in rows[::3]:
        row["text"] = " ".join([row["text"]] * 12)  # a third of the texts: 60 words
    logged = []
    config = resolve_config({"data": str(write(tmp_path / "d.jsonl", rows)), **TINY,
                             "max_length": 32, "long": "cut", "steps": 1, "out": str(tmp_path / "run")})
    train(config, progress=False, log=logged.append)  # (a classifier: tformer.training.windows says it)
    cut = [line for line in logged if line.startswith("long texts: ") and "longer than 32 tokens: cut" in line]
    assert len(cut) == 1 and 25 <= int(cut[0].split("(")[1].split("%")[0]) <= 42, logged


def test_fine_tuning_batches_32_examples_unless_max_tokens_is_given(tmp_path):
    data = write(tmp_path / "d.jsonl", classification_rows(20))
    tuned = resolve_config({"data": str(data), "from_pretrained": str(tmp_path)})
    assert tuned.max_tokens is None and tuned.batch_size == 32
    assert resolve_config({"data": str(data), "from_pretrained": str(tmp_path),
                           "max_tokens": 1024}).max_tokens == 1024


def test_a_timed_data_run_is_bounded_by_its_budget_not_the_presets_step_count(tmp_path):
    data = write(tmp_path / "d.jsonl", classification_rows(20))
    assert resolve_config({"data": str(data)}).steps == 10000  # the preset's, untimed
    assert resolve_config({"data": str(data), "max_minutes": 5}).steps == TIMED_STEPS
    assert resolve_config({"data": str(data), "from_pretrained": str(tmp_path),
                           "max_minutes": 5}).steps == TIMED_STEPS
    assert resolve_config({"data": str(data), "max_minutes": 5, "steps": 300}).steps == 300  # asked


def test_the_fine_tuning_learning_rate_follows_the_width_unless_given(tmp_path):
    from tformer.training.sizing import finetune_lr

    data = write(tmp_path / "d.jsonl", classification_rows(20))
    tuned = resolve_config({"data": str(data), "from_pretrained": str(tmp_path)})
    assert tuned.lr is None
    assert finetune_lr(tuned, 128)[0].lr == pytest.approx(2e-4)
    assert finetune_lr(tuned, 768)[0].lr == pytest.approx(2e-4 / 6**0.5)  # BERT-base: 8.2e-5
    assert finetune_lr(tuned, 64)[0].lr == pytest.approx(2e-4)  # not above 2e-4
    assert resolve_config({"data": str(data), "from_pretrained": str(tmp_path), "lr": 2e-5}).lr == 2e-5


def _long_and_short_rows():
    rows = classification_rows(300)
    for row in rows[::2]:
        row["text"] = " ".join([row["text"]] * 16)  # half the texts: 80 words, past 64 tokens
    return rows


@pytest.mark.parametrize("seconds_per_token, longer", [(1e-6, True), (1e-4, False)])
def test_a_timed_run_on_long_texts_takes_the_longest_length_its_budget_passes_over_twice(
        tmp_path, monkeypatch, seconds_per_token, longer, probes_paid):
    from tformer.training import planning, sizing

    timed = []

    def fake_step_seconds(self, config, model, kind, tokens, length, precision):  # in proportion to tokens
        timed.append(config.max_length)
        return seconds_per_token * tokens

    monkeypatch.setattr(planning.MachineSpeeds, "step_seconds", fake_step_seconds)
    data = write(tmp_path / "d.jsonl", _long_and_short_rows())
    logged = []
    config = resolve_config({"data": str(data), **{k: v for k, v in TINY.items() if k != "max_tokens"},
                             "max_minutes": 0.2, "precision": "fp32",  # times lengths only
                             "out": str(tmp_path / "run")})
    assert config.auto_length and config.max_length == 64 and config.max_tokens is None
    train(config, progress=False, log=logged.append)
    chosen = [line for line in logged if line.startswith("max length: ") and "whole for" in line]
    assert len(chosen) == 1, logged
    loaded = load_run(tmp_path / "run")  # the chosen length is the run's for good
    model, source, saved = loaded.model, loaded.objective, loaded.config
    length = saved.max_length
    assert source.tokenizer.max_length == length == json.loads(
        (tmp_path / "run" / "data.json").read_text())["max_length"]
    assert model.config.max_len == length  # the position table
    assert timed[0] == 128, timed  # each longer length is timed on its own batches
    at_limit = source.source.data.with_max_length(sizing.AUTO_LENGTH_LIMIT)
    pool = next(source.source.data.epoch_pools())
    longest = [ex.longest for ex in data_objective(at_limit, saved).encode(pool)]
    if longer:  # fast: doubled until the texts fit
        assert length > 64 and "passes over the data" in chosen[0], chosen
        assert sizing.cut_share(longest, length) < sizing.LENGTH_CUT <= sizing.cut_share(longest, length // 2)
        assert set(timed) == {2**k for k in range(7, length.bit_length())}, timed
    else:  # slow: not even 128 gets two passes, so the preset stays, and the line says why
        assert length == 64 and "128: about " in chosen[0] and set(timed) == {64, 128}, chosen


def test_max_length_given_turns_the_length_choice_off(tmp_path):
    data = write(tmp_path / "d.jsonl", classification_rows(20))
    assert resolve_config({"data": str(data), "max_minutes": 1}).auto_length
    assert not resolve_config({"data": str(data), "max_minutes": 1, "max_length": 64}).auto_length


def test_short_texts_keep_the_preset_length_without_asking_about_longer_ones(tmp_path, monkeypatch):
    from tformer.training import planning

    asked = []
    monkeypatch.setattr(planning.MachineSpeeds, "step_seconds",
                        lambda self, config, *a: asked.append(config.max_length) or 0.001)
    data = write(tmp_path / "d.jsonl", classification_rows(200))
    logged = []
    config = resolve_config({"data": str(data), **TINY, "max_minutes": 0.15, "precision": "fp32",
                             "out": str(tmp_path / "run")})
    train(config, progress=False, log=logged.append)
    assert any(line.startswith("max length: 64 tokens, whole for ") and "the preset" in line
               for line in logged), logged
    assert set(asked) == {64}, asked  # no longer length asked about


def test_the_step_the_clock_makes_last_is_validated_once_and_ends_the_run(tmp_path, monkeypatch):
    """A validation re-sizes the final test's reserve from its own rate; when that moved the
    deadline on, a run that had validated its last step trained a few more and validated again
    (284.7 s and 287.2 s of 300, 11 steps apart). Here every validation frees three steps' time
    of the reserve: the run must still end at the step the clock first made its last."""
    from tformer.training.budget import Budget

    reserve, validated = Budget.reserve, Budget.validated
    freed = {"seconds": 0.0}

    def freeing(self, seconds, examples, *loss_pass, **aside):
        validated(self, seconds, examples, *loss_pass, **aside)
        freed["seconds"] += 3 * (self.step_seconds or 0.0)

    monkeypatch.setattr(Budget, "validated", freeing)
    monkeypatch.setattr(Budget, "reserve", lambda self: max(reserve(self) - freed["seconds"], 0.0))
    deadline = Budget.valid_deadline  # (the time freed moves validation's deadline as well)
    monkeypatch.setattr(Budget, "valid_deadline", lambda self: deadline(self) + freed["seconds"])
    data = write(tmp_path / "d.jsonl", classification_rows(400))
    config = resolve_config({"data": str(data), **TINY, "max_minutes": 0.3, "steps": 100_000,
                             "out": str(tmp_path / "run")})
    record = train(config, **QUIET)
    lines = _lines(tmp_path / "run")
    validations = [r["step"] for r in lines if r["split"] == "validation"]
    assert record["stopped_by"] == "max_minutes"
    assert validations[-1] == record["step"], validations  # the last step is validated ...
    assert len(validations) < 2 or record["step"] - validations[-2] > 5, validations  # ... only once near the end


def test_a_budget_too_small_to_honour_is_refused_up_front_in_one_line(tmp_path, capsys):
    from tformer.commands.cli import main

    data = write(tmp_path / "d.jsonl", classification_rows(50))
    assert main(["train", "--data", str(data), "--out", str(tmp_path / "run"), "--max-minutes", "0.02"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "--max-minutes: 0.02 (1 s) is too short to honour here" in err, err
    assert "expected at least --max-minutes " in err
    assert not (tmp_path / "run").exists()


def test_a_resumed_timed_run_gets_the_time_its_checkpoint_had_left(tmp_path, monkeypatch):
    """The checkpoint records the wall time spent; a run interrupted after it resumes with the
    rest of --max-minutes, and one with too little left is refused, naming what it needs."""
    from tformer.storage.checkpoint import check_run_dir
    from tformer.training.budget import Budget

    data = write(tmp_path / "d.jsonl", classification_rows(200))
    config = resolve_config({"data": str(data), **TINY, "max_minutes": 0.2, "out": str(tmp_path / "run")})
    train(config, **QUIET)
    state_path = check_run_dir(tmp_path / "run") / "trainer_state.json"
    state = json.loads(state_path.read_text())
    assert state["wall_seconds"] > 0 and state["stopped_by"] == "max_minutes"
    del state["stopped_by"]  # as a checkpoint saved while it trained: interrupted after it
    state["wall_seconds"] = 2.0
    state_path.write_text(json.dumps(state))
    budgets = []
    init = Budget.__init__

    def spy(self, *args, **kwargs):
        init(self, *args, **kwargs)
        budgets.append(self.seconds)

    monkeypatch.setattr(Budget, "__init__", spy)
    record = train(resume_config(tmp_path / "run"), resume=True, **QUIET)
    assert budgets == [pytest.approx(0.2 * 60 - 2.0)]
    assert record["wall_seconds"] >= 2.0  # counted from what the checkpoint had spent
    state_path = check_run_dir(tmp_path / "run") / "trainer_state.json"  # the newest checkpoint
    state = json.loads(state_path.read_text())
    del state["stopped_by"]
    state["wall_seconds"] = 0.2 * 60 - 1.0
    state_path.write_text(json.dumps(state))
    with pytest.raises(ValueError, match=r"the run has used 11 s.*expected at least --max-minutes"):
        train(resume_config(tmp_path / "run"), resume=True, **QUIET)


def test_a_resumed_timed_runs_first_step_keeps_to_its_schedule(tmp_path):
    """Until a resumed timed run had timed a step, its schedule planned for --steps: the linear
    decay went back to its peak for the first step after the checkpoint (lr 2.3e-4 at step
    2,361 of ~4,100, then 5.0e-4 at 2,362). The checkpoint keeps the pace it planned with."""
    from tformer.storage.checkpoint import check_run_dir

    data = write(tmp_path / "d.jsonl", classification_rows(200))
    run = tmp_path / "run"
    config = resolve_config({"data": str(data), **TINY, "max_minutes": 0.3, "steps": 100_000,
                             "log_every": 1, "out": str(run)})
    train(config, **QUIET)
    state_path = check_run_dir(run) / "trainer_state.json"
    state = json.loads(state_path.read_text())
    del state["stopped_by"]  # as a checkpoint saved while it trained: interrupted after it
    state["wall_seconds"] = 4.0
    state_path.write_text(json.dumps(state))
    train(resume_config(run), resume=True, **QUIET)
    resumed = [r for r in _lines(run) if r["split"] == "train" and r["step"] > state["step"]]
    first = resumed[0]
    assert first["step"] == state["step"] + 1 and first["planned_steps"] < 100_000, first
    assert first["lr"] < 0.9 * config.lr, first  # well into the decay, as before the stop


@pytest.mark.parametrize("stop", ["max_minutes", "epochs", "steps"])
def test_resuming_a_finished_run_changes_nothing_and_says_so(tmp_path, stop):
    """Whatever stopped it (the clock, the epochs, the steps), a finished run resumed under the
    same options keeps its metrics.jsonl byte for byte and its test record, and says so."""
    data = write(tmp_path / "d.jsonl", classification_rows(200))
    limit = {"max_minutes": {"max_minutes": 0.15}, "epochs": {"epochs": 1, "steps": 100_000},
             "steps": {"steps": 3}}[stop]
    config = resolve_config({"data": str(data), **TINY, **limit, "out": str(tmp_path / "run")})
    record = train(config, **QUIET)
    assert record["stopped_by"] == stop
    before = {p.relative_to(tmp_path): p.read_bytes() for p in (tmp_path / "run").rglob("*") if p.is_file()
              and p.name != ".tformer-run.lock"}
    logged = []
    again = train(resume_config(tmp_path / "run"), resume=True, progress=False, log=logged.append)
    assert again == record
    after = {p.relative_to(tmp_path): p.read_bytes() for p in (tmp_path / "run").rglob("*") if p.is_file()
             and p.name != ".tformer-run.lock"}
    assert after == before  # metrics.jsonl, the checkpoint, the curves: byte for byte
    assert logged[0].startswith(f"{tmp_path / 'run'} had finished: stopped by {stop} at step ")
    assert "nothing changed" in logged[0]
    if stop == "steps":  # a larger limit is asked for: it trains on
        more = train(resume_config(tmp_path / "run", {"steps": 5}), resume=True, **QUIET)
        assert more["step"] == 5


@pytest.mark.parametrize("rows", [seq2seq_rows(3000), classification_rows(3000)], ids=["seq2seq", "classification"])
def test_the_final_test_stops_at_its_deadline_and_the_line_says_how_many_it_scored(tmp_path, monkeypatch, rows):
    """A test slower than its reserve scores the examples it predicted by the deadline (the
    budget holds, but for one small batch); the test line records how many of the split, and the summary says so."""
    from tformer.training.budget import Budget

    monkeypatch.setattr(Budget, "test_deadline", lambda self: time.perf_counter())  # due now
    data = write(tmp_path / "d.jsonl", rows)
    logged = []
    config = resolve_config({"data": str(data), **TINY, "steps": 2, "eval_every": 1000,
                             "out": str(tmp_path / "run")})
    record = train(config, progress=False, log=logged.append)
    assert record["test_examples"] == len(load_run(tmp_path / "run").examples("test")) > 64
    # One batch: the first always runs, and under a deadline it is a small one (an untrained
    # decoder's 64 outputs ran 13 s past a busy machine's deadline).
    assert record["examples"] == FIRST_BATCH_UNDER_DEADLINE == 8
    assert any("scored 8 of " in line and "test examples in the time left" in line for line in logged)
    assert _lines(tmp_path / "run")[-1] == json.loads(json.dumps(record))


def test_a_data_file_changed_while_the_run_trains_stops_it_before_any_result(tmp_path, monkeypatch):
    """Labels swapped 14 s into a run gave accuracy on a mix of old and new records, and exit 0:
    the file is checked at each validation and before the results are published."""
    from tformer.training import loop

    data = write(tmp_path / "d.jsonl", classification_rows(300))
    step = loop.train_step

    def swapping(*args, **kwargs):
        out = step(*args, **kwargs)
        text = data.read_text()
        data.write_text(text.replace('"animal"', '"tmp"').replace('"place"', '"animal"')
                        .replace('"tmp"', '"place"'))
        return out

    monkeypatch.setattr(loop, "train_step", swapping)
    config = resolve_config({"data": str(data), **TINY, "steps": 3, "eval_every": 1000,
                             "out": str(tmp_path / "run")})
    with pytest.raises(ValueError, match=r"data: .*d.jsonl changed while the run trained .*no results "
                                         r"were published"):
        train(config, **QUIET)
    assert not any(r["split"] == "test" for r in _lines(tmp_path / "run"))


def test_the_checkpoints_saved_before_the_test_do_not_eat_its_time():
    """After the last validation come two checkpoint saves, then the test, then the plots and
    outputs. The test's deadline keeps back only what follows it: one that also kept the saves'
    time was passed before a 1-minute seq2seq run's test began."""
    from types import SimpleNamespace

    from tformer.training.budget import LATE_SECONDS, PLOT_SECONDS, SAVE_SECONDS, Budget

    budget = Budget(SimpleNamespace(steps=10**6, epochs=None, max_minutes=1), 100.0)
    budget.saved(1.5)  # each checkpoint took 1.5 s
    budget.valid_seconds_per_example, budget.test_examples = 0.01, 100
    end = 100.0 + 60
    after = SAVE_SECONDS + 1.5 * PLOT_SECONDS  # the outputs after the test (a confusion matrix)
    assert budget.test_deadline() == end - after
    # A validation that ends at its deadline, then the two saves and the curves: the test still
    # has its estimate.
    test_starts = budget.valid_deadline() + 2 * 1.5 + PLOT_SECONDS
    assert budget.test_seconds() > 0
    assert budget.test_deadline() - test_starts == pytest.approx(budget.test_seconds())
    # The training deadline keeps all of it back: a late last step, the last validation, two
    # saves, the curves, the test, the rest.
    assert budget.seconds - budget.train_deadline() == pytest.approx(
        LATE_SECONDS + budget.valid_seconds_per_example * (budget.valid_sample or 0) * 1.2 + 2 * 1.5
        + PLOT_SECONDS + budget.test_seconds() + after)


def test_an_untimed_run_validates_its_last_step(tmp_path):
    """--steps 3 with --eval-every 2: the step-2 weights were tested, the last step never validated."""
    data = write(tmp_path / "d.jsonl", classification_rows(300))
    config = resolve_config({"data": str(data), **TINY, "steps": 3, "eval_every": 2, "out": str(tmp_path / "run")})
    train(config, **QUIET)
    valid = [r["step"] for r in _lines(tmp_path / "run") if r["split"] == "validation"]
    assert valid == [2, 3]


def test_a_timed_runs_test_measures_no_new_kernel_choice(tmp_path, monkeypatch):
    """The final test is the budget's last work: a run's first test on a machine spent 9 s of a
    570 s budget timing kernels for its decoding shapes, past the budget's end. It runs with no
    measuring allowance (a shape not yet known runs its default kernel)."""
    from tformer.nn.kernels import autotune
    from tformer.training.objective import Objective

    evaluate = Objective.evaluate
    allowance = {}

    def recording(self, model, split, *args, **kwargs):
        allowance[split] = autotune._allowance["left"]
        return evaluate(self, model, split, *args, **kwargs)

    monkeypatch.setattr(Objective, "evaluate", recording)
    data = write(tmp_path / "d.jsonl", seq2seq_rows(300))
    config = resolve_config({"data": str(data), **TINY, "max_minutes": 0.3, "out": str(tmp_path / "run")})
    train(config, **QUIET)
    assert allowance["test"] == 0.0 and allowance["validation"] > 0


def test_an_evaluation_computes_its_loss_before_the_predictions_its_deadline_bounds(tmp_path):
    """The teacher-forced loss (of up to EVAL_SAMPLE examples) comes first, so the deadline counts
    its time: after the predictions it took a busy machine's final test 5.7 s past its deadline."""

    config = resolve_config({"data": str(write(tmp_path / "d.jsonl", seq2seq_rows(300))), **TINY})
    objective = data_objective(build_data(config, None, write=False), config)
    model = objective.build_model()
    order = []
    loss, predict = objective.loss, objective.predict
    objective.loss = lambda *a, **k: (order.append("loss"), loss(*a, **k))[1]
    objective.predict = lambda *a, **k: (order.append("predict"), predict(*a, **k))[1]
    metrics, _ = objective.evaluate(model, "test", deadline=time.perf_counter())  # due now
    assert order == ["loss", "predict"] and math.isfinite(metrics["loss"])
    assert metrics["examples"] == FIRST_BATCH_UNDER_DEADLINE  # the first batch only
    assert objective.loss_pass[1] == min(len(objective.examples("test")), 500)


@pytest.mark.parametrize("class_weights", ["none", "weighted"])
def test_a_classifier_s_evaluation_takes_its_loss_from_its_predictions(tmp_path, class_weights):
    """A classifier's predictions are the logits its loss reads: its evaluation makes no loss pass
    of its own (a fine-tune's validation spent half its time repeating its predictions' forward),
    and the loss is the one a pass gives (weighted alike), of the examples it scored."""
    import torch

    from tformer.training.objective import evaluating

    rows = classification_rows(300)
    config = resolve_config({"data": str(write(tmp_path / "d.jsonl", rows)), **TINY,
                             "class_weights": class_weights})
    objective = data_objective(build_data(config, None, write=False), config)
    torch.manual_seed(0)
    model = objective.build_model()
    calls = []
    loss = objective.loss
    objective.loss = lambda *a, **k: (calls.append("loss"), loss(*a, **k))[1]
    examples = objective.examples("test")
    metrics, _ = objective.evaluate(model, "test")
    assert calls == [] and objective.loss_pass == (0.0, 0)
    with evaluating(model):
        batch = objective.collate(objective.encode(examples[:500]))
        expected = loss(model, batch)[0].item()
    assert metrics["loss"] == pytest.approx(expected, rel=1e-5)
    cut, _ = objective.evaluate(model, "test", deadline=time.perf_counter())  # the first batch only
    with evaluating(model):
        first = loss(model, objective.collate(objective.encode(examples[: cut["examples"]])))[0].item()
    assert cut["examples"] == FIRST_BATCH_UNDER_DEADLINE and cut["loss"] == pytest.approx(first, rel=1e-5)


def test_a_timed_fine_tune_validated_at_step_0_still_ends_within_its_budget(tmp_path, embedding_fine_tune, capsys):
    """A sentence-embedding fine-tune validates its pretrained model before the first update: that
    validation is paid from the budget (the clock, validation's share, the test's reserve), and
    the pace line, the planned steps and the end on time stand as for any timed run."""
    config = resolve_config({**embedding_fine_tune, "max_length": 16, "threads": 1, "precision": "fp32",
                             "max_minutes": 0.25, "steps": 100_000, "log_every": 1,
                             "out": str(tmp_path / "run")})
    started = time.perf_counter()
    record = train(config, progress=False, log=lambda *a: None)
    seconds = time.perf_counter() - started
    assert seconds <= 0.25 * 60 * 1.05, seconds
    assert record["stopped_by"] == "max_minutes"
    lines = _lines(tmp_path / "run")
    validations = [r for r in lines if r["split"] == "validation"]
    assert validations[0]["step"] == 0 and validations[-1]["step"] == record["step"], validations
    assert [r["step"] for r in validations].count(0) == 1
    assert record["pretrained_validation"] == validations[0]["mrr_at_10"]
    assert record["valid_share"] <= 2 * VALID_SHARE, record
    train_lines = [r for r in lines if r["split"] == "train"]
    first, last = train_lines[0], train_lines[-1]
    assert first["step"] == 1 and first["planned_steps"] == 100_000, first  # none timed before step 1
    assert last["planned_steps"] <= 1.01 * last["step"] + 2, last
    pace = [line for line in capsys.readouterr().out.splitlines() if line.startswith("pace: ")]
    assert len(pace) == 1 and "updates in the budget" in pace[0], pace


def test_a_run_validated_at_step_0_sizes_its_validation_sample_for_one_validation_more():
    """Validation's share of the budget holds with the step-0 validation counted: the sample a
    validation scores is sized for VALIDATIONS + 1 of them, not VALIDATIONS."""
    from types import SimpleNamespace

    from tformer.training.budget import VALIDATIONS, Budget

    config = SimpleNamespace(steps=10**6, epochs=None, max_minutes=10)
    sizes = []
    for validates_start in (False, True):
        budget = Budget(config, time.perf_counter(), validates_start=validates_start)
        budget.probed(100.0, 1000)  # 100 ms an example: the share pays for 2 validations' samples
        sizes.append(budget.valid_sample)
    assert budget.planned_validations == 2 < VALIDATIONS
    assert sizes[1] == pytest.approx(sizes[0] * 2 / 3, abs=2), sizes


def test_a_run_whose_first_updates_are_far_slower_than_planned_chooses_its_size_again(
        tmp_path, monkeypatch, probes_paid):
    """A seq2seq plan sized its model from a 150 ms probe step and ran 467 ms a step. The run's
    own first updates time the pace; far off the plan's, the size is chosen again (once), the
    run starts over with it, and the run directory holds the model that trained."""
    from tformer.training import planning, sizing

    monkeypatch.setattr(sizing, "LADDER", SMALL_LADDER)
    monkeypatch.setattr(sizing, "MIN_STEPS", 10_000)
    planned = {32: 1e-7, 48: 1e-5}  # seconds an update, as the (made-up) machine estimates them
    monkeypatch.setattr(planning.MachineSpeeds, "step_seconds",
                        lambda self, config, model, *a: planned[model.d_model])
    data = write(tmp_path / "d.jsonl", classification_rows(400))
    logged = []
    config = resolve_config({"data": str(data), "vocab_size": 300, "max_tokens": 256, "threads": 1,
                             "max_minutes": 0.5, "precision": "fp32", "out": str(tmp_path / "run")})
    train(config, progress=False, log=logged.append)
    size = next(line for line in logged if line.startswith("model size: "))
    assert size.startswith("model size: d_model 48"), logged
    again = [line for line in logged if line.startswith("re-plan: ")]
    assert len(again) == 1 and "model size d_model 32" in again[0], logged
    assert load_run(tmp_path / "run").config.model.d_model == 32


@pytest.mark.slow  # ~26 s: a re-plan of the size stays in the default run
def test_a_run_far_slower_than_planned_chooses_its_length_again_with_its_size(
        tmp_path, monkeypatch, probes_paid):
    """Beside two busy processes a plan that expected 145 ms a step at 512 tokens got 1,066 and
    made 17 updates in a minute: the re-plan could only choose the size again, and kept the
    length. It now plans again by the first plan's rules at the real pace: a shorter length,
    recorded in data.json (what a resume and load_run read), and the run trains at it."""
    from tformer.training import planning, sizing

    monkeypatch.setattr(sizing, "LADDER", SMALL_LADDER)
    monkeypatch.setattr(sizing, "MIN_PASSES", 300.0)  # (the real pace affords fewer passes at 256)
    monkeypatch.setattr(planning.MachineSpeeds, "step_seconds",  # a made-up machine, 10^4x too fast
                        lambda self, config, model, kind, tokens, *a: 1e-10 * tokens * model.d_model)
    rng = random.Random(0)
    rows = [{"text": " ".join(rng.choice(["cat", "dog", "city", "road", "the", "a"]) for _ in range(200)),
             "label": rng.choice(["x", "y"])} for _ in range(300)]
    data = write(tmp_path / "d.jsonl", rows)
    logged = []
    config = resolve_config({"data": str(data), "vocab_size": 300, "threads": 1, "max_minutes": 0.5,
                             "precision": "fp32", "long": "cut", "out": str(tmp_path / "run")})
    train(config, progress=False, log=logged.append)
    first = int(next(line for line in logged if line.startswith("max length: ")).split()[2])
    again = [line for line in logged if line.startswith("re-plan: ")]
    assert len(again) == 1 and "max length " in again[0], logged
    run = load_run(tmp_path / "run")
    assert run.config.max_length < first, (run.config.max_length, first)
    assert json.loads((tmp_path / "run" / "data.json").read_text())["max_length"] == run.config.max_length


def test_a_last_step_that_ends_a_little_late_is_still_validated():
    """A tiny model's validation takes milliseconds, and its reserve was all that separated the
    training deadline from validation's: on a busy CI machine a 6 ms step that took 26 ms ended
    past it, the last validation was skipped, and the run tested weights 457 steps older."""
    import time
    from types import SimpleNamespace

    from tformer.training.budget import Budget

    budget = Budget(SimpleNamespace(steps=10**6, epochs=None, max_minutes=0.3), 0.0)
    budget.step_seconds, budget.valid_seconds_per_example, budget.valid_sample = 0.006, 1e-4, 64
    late = budget.train_deadline() + 0.02  # the last step ended 20 ms past the training deadline
    budget.started = time.perf_counter() - late
    assert budget.should_validate(2168, last_step=True) and not budget.skipped_last
    behind = budget.valid_deadline() - budget.started + 1.0  # a second past validation's deadline
    budget.started = time.perf_counter() - behind
    assert not budget.should_validate(2168, last_step=True) and budget.skipped_last


def test_the_tests_reserve_follows_the_pace_of_the_updates_until_validation_measures_it():
    """Beside two busy processes a fine-tune's updates ran 10x slower than planned, nothing was
    validated before its last update, and the test kept back for the plan's pace scored 1 of its
    234 examples. Until validation measures the test's speed, the plan's estimate is scaled by
    how much slower the updates run (never below the plan's; at most TEST_SHARE)."""
    from types import SimpleNamespace

    from tformer.training.budget import Budget
    from tformer.training.plan import TEST_MARGIN, TEST_SHARE

    plan = SimpleNamespace(step_seconds=0.1, test_seconds=3.0, validations=4)
    budget = Budget(SimpleNamespace(steps=10**6, epochs=None, max_minutes=2), time.perf_counter(), plan=plan)
    budget.test_examples = 234
    assert budget.test_seconds() == 3.0 and budget.pace_miss() == 1.0
    budget.stepped(0.05, 32)  # faster than planned: the plan's estimate stands
    assert budget.test_seconds() == 3.0
    budget.restarted()
    for _ in range(3):
        budget.stepped(0.5, 32)  # 5x slower
    assert budget.pace_miss() == pytest.approx(5.0, rel=0.05)
    assert budget.test_seconds() == pytest.approx(15.0, rel=0.05)
    before = budget.test_fits(234, planned=0.05)
    assert before == min(234, int((budget.test_deadline() - time.perf_counter()) / (TEST_MARGIN * 0.05 * 5.0)))
    for _ in range(30):
        budget.stepped(2.0, 32)  # 20x: at most the test's share
    assert budget.test_seconds() == TEST_SHARE * 120
    budget.restarted(SimpleNamespace(step_seconds=2.0, test_seconds=9.0))  # a re-plan at the real pace
    budget.stepped(2.0, 32)
    assert budget.pace_miss() == 1.0 and budget.test_seconds() == 9.0
    budget.validated(4.0, 100)  # measured: validation's speed decides from here on
    assert budget.test_seconds() == pytest.approx(0.04 * 234 * 1.2)
