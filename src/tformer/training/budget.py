"""The run's budget: when to validate, when to stop, and how many steps the schedule plans for.

A run has up to three budgets, and stops at the first one spent:
    --steps N         updates (always set: an upper bound)
    --epochs N        passes over the training data (data runs)
    --max-minutes M   wall time of the whole command: starting, reading the data, the plan's
                      probes, training, validations, the final test and saving all end within
                      M minutes (a resumed run gets what its checkpoint had not spent)

With --max-minutes the clock drives the run. The step count is estimated from the wall time of
real steps, and re-estimated as the run goes, so the learning-rate schedule's warmup ends
early and its decay ends at the deadline (Li et al. 2020, "Budgeted training": a schedule that
decays to zero at the budget beats one planned for steps it never reaches); a busier machine
gets fewer steps, not an overrun. Validation is scheduled by time, on a fixed sample sized so
that it costs at most VALID_SHARE of the budget, and time is kept back for the final test
(estimated from validation's own speed, at most TEST_SHARE of the budget) and for saving. The
test and each validation also stop at their deadline, scoring the examples done by then (the
test line says how many), so a wrong estimate costs examples, never the budget. Only whole
outputs are scored: the first batch (a small one) decodes to its end, and a later one the
deadline cuts is left out (tformer.training.objective.Objective.predict).
A fine-tune whose model is whole before training (a sentence-embedding one) is also validated
before its first update: that validation's time counts like any other's (the clock, the share,
the test's reserve from its rate), and the sample is sized for one validation more.
Without --max-minutes, validation runs every --eval-every steps, as before.
"""

from __future__ import annotations

import bisect
import math
import time

# (torch-free, so that `tformer train` can refuse a budget before importing torch; the untimed
# sample is the objectives' EVAL_SAMPLE, the same 500: tests/training/test_plan.py checks)
from tformer.errors import FieldError
from tformer.training.plan import TEST_MARGIN, TEST_SHARE, VALID_MAX, VALIDATIONS, validation_plan
from tformer.training.sizing import SAVE_BYTES_PER_SECOND, fixed_seconds

EVAL_SAMPLE = VALID_MAX

PROBE = 32  # examples the first validation times before choosing its sample size
PROBE_WARM_UP = 8  # examples scored before them, untimed: the model's first calls in evaluation
FIRST_TEST_BATCH = 8  # the test always scores this many (its first batch runs whatever the clock)
SAVE_SECONDS = 2.0  # kept back for a checkpoint before one is timed (a small model: its bytes' time)
# The curves' drawing before the first validation times it: timed only at the end, a 2-minute run
# at load 4 found it took 5 s, not this, and kept its test its first batch (8 of 926 examples).
PLOT_SECONDS = 1.5
# The last step may end this late (or two of its average steps, if more) and still be validated:
# a busy CI machine's 6 ms step that took 20 ms passed a tiny model's validation deadline (its
# validation's own 8 ms), and the run tested weights 457 steps older than its last.
LATE_SECONDS = 0.25
# The least a timed run needs after reading its data: a few updates, a test of one batch and
# saving (the last checkpoint, the curves).
MIN_AFTER_SETUP = 5.0
# Reading the data and building the objective, at the least (a first check before them): 3-17 s
# on 2 busy cores with the tokenizer's training.
MIN_SETUP = 3.0
KERNEL_SHARE = 0.05  # new kernel choices (autotune) are measured in this share of a timed budget
MIN_UPDATES = 10  # the fewest updates a model must afford in its budget to be built at all
FIRST_STEP_SECONDS = 2.0  # a new model's first update beyond a steady one (kernels, first touch), alone


class NoUpdate(FieldError):
    """A timed run ran out of time before its first update: nothing is tested or kept."""

    def __init__(self, config, seconds: float, kept: float = 0.0) -> None:
        super().__init__("max_minutes", f"{config.max_minutes:g} ({config.max_minutes * 60:.0f} s) ran out "
                         f"before the first update here ({seconds:.1f} s spent starting, reading the data "
                         f"and building the model, {kept:.1f} s kept back for the test and saving); nothing "
                         "was trained or kept: expected a longer --max-minutes (or a quieter machine)")


def check_affordable(config, started: float, model_config, kind: str, plan) -> None:
    """Refuse, before it is built, a model its budget cannot pay for: building it, its first
    update's kernels (FIRST_STEP_SECONDS, as slowed by other work), MIN_UPDATES updates at the
    plan's pace, the least a validation and the test score (a probe's and a first batch's
    predictions, the test's loss over up to VALID_MAX examples), its first checkpoint and the last
    one (weights and the optimizer's two moments at SAVE_BYTES_PER_SECOND) must fit what is left
    (--max-minutes 0.2 with --d-model 1024 --n-layers 8 took 82.7 s: one 20 s step, then 50 s
    saving 3.6 GB; a 1.5-minute fine-tune of all-MiniLM-L6-v2 with ten other threads on 2 cores
    made 1 update in 74 s and ended at 137 s)."""
    from tformer.config.sizes import parameter_count

    if config.max_minutes is None:
        return
    params = parameter_count(model_config, kind)
    build, save = fixed_seconds(params)
    steps = MIN_UPDATES * (plan.step_seconds or 0.0) + FIRST_STEP_SECONDS * plan.extra.get("slowdown", 1.0)
    examples = 2 * (PROBE + 8) + min(VALID_MAX, plan.extra.get("test_examples", 0))
    scoring = examples * (plan.example_seconds or 0.0)
    left = config.max_minutes * 60 - (time.perf_counter() - started) - MIN_AFTER_SETUP
    need = build + steps + save + scoring
    if need <= left:
        return
    raise FieldError(
        "max_minutes",
        f"{config.max_minutes:g} is too short for this model ({params / 1e6:,.1f} M parameters) "
        f"here: building it takes ~{build:.0f} s, its first {MIN_UPDATES} updates ~{steps:.0f} s, the least "
        f"validation and test ~{scoring:.0f} s and saving it ~{save:.0f} s, {need:.0f} s where "
        f"{max(left, 0):.0f} s are left; expected a smaller model or at least "
        f"--max-minutes {math.ceil((config.max_minutes * 60 - left + need) / 6) / 10:g}")


def check_minimum(config, started: float, spent: float = 0.0, before_setup: bool = False) -> None:
    """Refuse, in one line, a budget too small to honour: what is left of --max-minutes after
    starting and reading the data (`started`: when the command started; `spent`: the seconds a
    resumed run already used) must pay for MIN_AFTER_SETUP more; `before_setup` (the data not
    read yet), for MIN_SETUP more too (a 6 s budget was refused after 11.5 s of reading the data)."""
    if config.max_minutes is None:
        return
    setup = time.perf_counter() - started + (MIN_SETUP if before_setup else 0.0)
    need = spent + setup + MIN_AFTER_SETUP
    if config.max_minutes * 60 >= need:
        return
    used = f"the run has used {spent:.0f} s, and " if spent else ""
    raise FieldError(
        "max_minutes", f"{config.max_minutes:g} ({config.max_minutes * 60:.0f} s) is too short to honour "
        f"here: {used}starting and reading the data {'take at least' if before_setup else 'took'} "
        f"{setup:.1f} s, and a few updates, a test and "
        f"saving need about {MIN_AFTER_SETUP:.0f} s more; expected at least --max-minutes "
        f"{math.ceil(need / 6) / 10:g}")


class Budget:
    """The clock and the plan of one run (all times in seconds since the command started).
    `spent`: the wall seconds a resumed run used before (its budget is what is left).
    `pace`: a resumed run's seconds a step when it was saved.
    `validates_start`: the run validates its starting model before the first update (a
    fine-tune whose model is whole from the start: Objective.starts_complete); that validation
    counts in validation's share, as one more of those the sample is sized for."""

    def __init__(self, config, started: float, train_records: int | None = None, spent: float = 0.0,
                 validates_start: bool = False, pace: float | None = None, plan=None,
                 parameters: int | None = None) -> None:
        self.config, self.started = config, started
        self.planned_validations = plan.validations if plan is not None else VALIDATIONS
        self.validates_start = validates_start
        self.validations = self.planned_validations + int(validates_start)  # what the sample is sized for
        self.planned_sample = getattr(plan, "valid_sample", None)  # (what the plan's line said)
        # The test's time, kept back from the start: the plan's estimate until validation measures it.
        self.planned_test = plan.test_seconds if plan is not None else None
        self.planned_step = plan.step_seconds if plan is not None else None  # what the plan expected
        self.plot_seconds: float | None = None  # the curves' drawing, once timed (PLOT_SECONDS before)
        self.drawn = False  # the last curves are drawn: no drawing is ahead of the test
        self.skipped_last = False  # the last validation was past its deadline: the last weights are tested
        self.seconds = config.max_minutes * 60 - spent if config.max_minutes else math.inf
        self.timed = math.isfinite(self.seconds)
        self.train_started = time.perf_counter() - started  # tokenizer and setup come first
        self.step_seconds: float | None = None  # wall time per update (exponential average)
        # A resumed run's pace when it stopped: its schedule's first step plans with it, not with
        # --steps (its linear decay went back to the peak: 2.3e-4 -> 5e-4 at step 2,362 of ~4,100).
        self.resumed_pace = pace
        self.last_step_seconds: float | None = None
        self.examples_per_step: float | None = None
        self.train_records = train_records
        self.valid_seconds_per_example: float | None = None
        # A validation's loss pass (its first EVAL_SAMPLE, one batch) and predictions, per example
        # each: timed as one, 256 examples (two forwards each) made a test of 2,000 (500 in its loss
        # pass) look 1.6x its cost, and it cut itself to 1,498 examples with 12 s left.
        self.loss_seconds_per_example = self.predict_seconds_per_example = None
        self.valid_sample: int | None = None  # fixed after the first timed validation
        self.valid_spent = 0.0
        self.test_examples = 0
        self.save_seconds = 0.0  # the longest checkpoint save so far; before one, a guess from its size:
        # 2 s each kept back 7.75 s of a 9 s run of 31 k parameters, and it made no update
        self.save_guess = min(SAVE_SECONDS, 0.25 + 12 * (parameters or math.inf) / SAVE_BYTES_PER_SECOND)
        self._last_step_end: float | None = None
        self.next_valid = self.train_started + self._valid_interval()

    def saved(self, seconds: float) -> None:
        self.save_seconds = max(self.save_seconds, seconds)

    def plotted(self, seconds: float, last: bool = False) -> None:
        """The curves took `seconds`: so will the last drawing and (x 1.5) the confusion matrix."""
        self.plot_seconds, self.drawn = seconds, last

    def restarted(self, plan=None) -> None:
        """A re-plan built a new model: the pace is measured again, against the new `plan`'s
        estimates (made at the pace the first steps showed)."""
        self.step_seconds = self.last_step_seconds = self.examples_per_step = None
        self._last_step_end = None
        if plan is not None:
            self.planned_test, self.planned_step = plan.test_seconds, plan.step_seconds

    def pace_miss(self) -> float:
        """How many times slower than the plan expected the updates run (1 where they run as fast
        or faster, or before one is timed): the plan's estimates of what validation and the test
        take are scaled by it until validation measures them. The least of the average step and
        the latest, so that the first steps' kernel creation does not count."""
        if not self.planned_step or self.step_seconds is None:
            return 1.0
        real = min(self.step_seconds, self.last_step_seconds or self.step_seconds)
        return max(1.0, real / self.planned_step)

    # The clock -------------------------------------------------------------------------------
    def now(self) -> float:
        return time.perf_counter() - self.started

    def saves_seconds(self) -> float:
        """The run's last two checkpoints (its last validation's and the end's), saved before the test."""
        return 2 * max(self.save_seconds, self.save_guess / 2)

    def publish_seconds(self) -> float:
        """Kept back for saving: the last two checkpoints and the curves (before the test), then
        (after it) the outputs and the metrics line."""
        return self.saves_seconds() + self.drawing_seconds() + self.after_test_seconds()

    def drawing_seconds(self) -> float:
        """The last curves, drawn before the test: 0 once drawn, as long as the latest drawing until then."""
        return 0.0 if self.drawn else PLOT_SECONDS if self.plot_seconds is None else self.plot_seconds

    def after_test_seconds(self) -> float:
        """What follows the test: the outputs (a confusion matrix: the curves' time x 1.5), the rest."""
        return self.save_guess + 1.5 * (PLOT_SECONDS if self.plot_seconds is None else self.plot_seconds)

    def test_seconds(self) -> float:
        """Kept back for the final test: its examples at validation's latest speed (``test_cost``;
        before any is measured, the plan's estimate at the pace of the updates: ``pace_miss``; 5%
        of the budget without one), at most TEST_SHARE of the budget. Beside two busy processes a
        fine-tune's updates ran 10x its plan, nothing was validated before its last, and the
        test kept back for the plan's pace scored 1 of its 234 examples."""
        if (measured := self.test_cost(self.test_examples)) is not None:
            estimate = measured * 1.2
        else:
            planned = self.planned_test
            estimate = 0.05 * self.seconds if planned is None else planned * self.pace_miss()
        return min(estimate, TEST_SHARE * self.seconds)

    def test_cost(self, examples: int) -> float | None:
        """Seconds a test of `examples` takes at the latest validation's speed (None before one):
        its loss pass over the first EVAL_SAMPLE, then a prediction each, each at its part's speed."""
        if self.predict_seconds_per_example is None:
            per = self.valid_seconds_per_example
            return None if per is None else per * examples
        return (self.loss_seconds_per_example or 0.0) * min(examples, EVAL_SAMPLE) \
            + self.predict_seconds_per_example * examples

    def reserve(self) -> float:
        """Seconds kept back for what follows the last step: the last validation, the final
        test, two checkpoints and the plots (each as measured so far, with a margin), and a
        last step that ends late (LATE_SECONDS, or two average steps)."""
        per = self.valid_seconds_per_example
        last_validation = 0.0 if per is None else per * (self.valid_sample or 0) * 1.2
        late = max(LATE_SECONDS, 2 * (self.step_seconds or 0.0))
        return last_validation + late + self.test_seconds() + self.publish_seconds()

    def train_deadline(self) -> float:
        return self.seconds - self.reserve()

    def test_fits(self, examples: int, planned: float | None = None) -> int:
        """How many of the test's `examples` its time left pays for (all, untimed): at the latest
        validation's speed (``test_cost``, no margin: the predictions' deadline keeps the time;
        1.2 left a 1-minute run's last 9 s unused), else at `planned` seconds a prediction x
        TEST_MARGIN; at least FIRST_TEST_BATCH. The loss pass over its first examples has no
        deadline: a 2.5-minute run's test began past its budget at load 14 and ended 34 s later."""
        if not self.timed:
            return examples
        left = self.test_deadline() - time.perf_counter()
        if self.test_cost(examples) is not None:
            fits = bisect.bisect_right(range(examples + 1), left, key=self.test_cost) - 1
        elif planned:
            fits = int(left / (TEST_MARGIN * planned * self.pace_miss()))
        else:
            return examples
        return min(examples, max(FIRST_TEST_BATCH, fits))

    def test_deadline(self) -> float:
        """When the final test stops predicting, whatever it has left (as a perf_counter time):
        only what follows it keeps its time, the checkpoints were saved before it (a deadline
        that also kept theirs started a 1-minute run's test past it)."""
        return self.started + self.seconds - self.after_test_seconds()

    def valid_deadline(self) -> float:
        """When a validation stops predicting: the two saves, the curves and the test keep their time."""
        return self.test_deadline() - self.test_seconds() - self.saves_seconds() - self.drawing_seconds()

    def out_of_time(self) -> bool:
        """Would one more step end past the training deadline?"""
        return self.now() + (self.step_seconds or 0.0) > self.train_deadline()

    def stepped(self, seconds: float, examples: int, aside: float = 0.0) -> None:
        """Record one update's size and time: the wall time since the previous update ended
        (logging and the clock's own checks included; less `aside`, a pool's tokenizing:
        tformer.training.stream.prepared), or `seconds` for the first after a pause."""
        now = self.now()
        wall = seconds if self._last_step_end is None else max(now - self._last_step_end - aside, seconds)
        self._last_step_end = now
        self.last_step_seconds = wall  # the latest alone: past the first steps' warm-up
        a = 0.1  # smooth, but follow a machine that speeds up after warm-up or slows under load
        def average(old: float | None, new: float) -> float:
            return new if old is None else (1 - a) * old + a * new
        self.step_seconds = average(self.step_seconds, wall)
        self.examples_per_step = average(self.examples_per_step, examples)

    def paused(self) -> None:
        """Validation or saving ran since the last update: the next one's wall time starts now."""
        self._last_step_end = None

    # The plan ----------------------------------------------------------------------------------
    def planned_steps(self, step: int, per_step: float | None = None) -> int:
        """The step count the schedule plans for: --steps, or fewer where the clock or the
        epochs end first (re-estimated at every call from the measured step time, or at
        ``per_step`` seconds a step)."""
        total = self.config.steps
        if self.config.epochs is not None and self.train_records and self.examples_per_step:
            total = min(total, math.ceil(self.config.epochs * self.train_records / self.examples_per_step))
        per_step = per_step or self.step_seconds or self.resumed_pace
        if self.timed and per_step:
            left = max(self.train_deadline() - self.now(), 0.0)
            total = min(total, step + int(left / per_step))
        return max(total, step, 1)

    def seconds_left(self) -> float:
        """Until the command ends (its budget), or inf for an untimed run."""
        return self.seconds - self.now()

    # Validation --------------------------------------------------------------------------------
    def _valid_interval(self) -> float:
        return max(self.train_deadline() - self.train_started, 1e-3) / self.planned_validations

    def should_validate(self, step: int, last_step: bool) -> bool:
        if not self.timed:  # and the last step: the weights tested are never older than they must be
            return step % self.config.eval_every == 0 or last_step
        if last_step:
            # Past validation's deadline (a machine far busier than planned) the last validation
            # is not run: the test's time is kept, and the last weights are tested (the schedule
            # decayed to them), not an older best.
            self.skipped_last = time.perf_counter() >= self.valid_deadline()
            return not self.skipped_last
        # A scheduled one due within half an interval of the deadline is left to the last
        # step's (a run validated at 283 s and again at 286 s of 300, ten steps apart).
        now = self.now()
        return now >= self.next_valid and now + self._valid_interval() / 2 < self.train_deadline()

    def needs_probe(self) -> bool:
        """A timed run times PROBE examples before its first validation, to size the sample."""
        return self.timed and self.valid_sample is None

    def probed(self, seconds: float, examples: int, aside: float = 0.0) -> str | None:
        """Size the validation sample at the speed `examples` timed in `seconds` showed (`aside`:
        a warm-up's and kernel choices' seconds: validation's time, not its rate); the line that
        says so where that differs from the plan's (None where it does not)."""
        self.valid_spent += seconds + aside
        self.valid_seconds_per_example = seconds / max(examples, 1)
        train = max(self.train_deadline() - self.train_started, 1e-3)
        # Sized at the measured speed, by the plan's rule: fewer validations, not fewer examples.
        count, self.valid_sample, why = validation_plan(train, self.valid_seconds_per_example, self.available,
                                                        int(self.validates_start))
        planned = (self.planned_validations, self.planned_sample)
        self.planned_validations = count
        self.validations = count + int(self.validates_start)
        if self.planned_sample is None or planned == (count, self.valid_sample):
            return None
        return (f"validation: {why}, timed on {examples} of its examples (the plan's: {planned[0]} times, "
                f"on {planned[1]:,})")

    available = EVAL_SAMPLE  # validation examples the loop has (it sets this before validating)

    def sample_size(self, available: int) -> int:
        """How many validation examples each validation scores: the same every time."""
        return min(self.valid_sample or EVAL_SAMPLE, available)

    def validated(self, seconds: float, examples: int, loss_pass: tuple[float, int] = (0.0, 0),
                  aside: float = 0.0, growth: float = 1.0) -> None:
        """Record a validation's time (`loss_pass`: the seconds and examples of its loss pass,
        within `seconds`) and schedule the next one. The latest validation's speed is what the
        final test will run at (the probe's, 32 examples and first calls, ran 2-3x slower: a
        seq2seq run kept back 70 s of 5 minutes for a 22-second test), its predictions' x
        `growth` (``Objective.growth``: a seq2seq run's early validation, of short outputs, timed
        3 ms an example; its test ran 10 and scored 72 of 916). `aside`: seconds beside `seconds`
        (new kernel choices' measuring): validation's time, not its rate."""
        self.valid_spent += seconds + aside
        if examples:
            loss_seconds, loss_examples = loss_pass
            predicting = max(seconds - loss_seconds, 0.0) * growth
            self.valid_seconds_per_example = (min(loss_seconds, seconds) + predicting) / examples
            self.loss_seconds_per_example = loss_seconds / loss_examples if loss_examples else 0.0
            self.predict_seconds_per_example = predicting / examples
        self.next_valid = self.now() + self._valid_interval()
        self.paused()

    def valid_share(self) -> float:
        """Validation's share of the wall time so far."""
        return self.valid_spent / max(self.now(), 1e-9)


# After this many steps of a timed run, its pace is said: how many updates the budget buys.
PACE_AFTER = 3
# Fewer planned updates than this are said to be few (a 1.5-minute fine-tune of a 22 M-parameter
# model on one busy core got 21, and learned nothing, with no word of it until the end).
FEW_UPDATES = 100


def pace(budget, step: int) -> str:
    """One line, early in a timed run: its step time (the latest step's: the first ones carry
    the warm-up) and the updates the budget buys at it."""
    per = budget.last_step_seconds
    planned = budget.planned_steps(step, per)
    few = "; few to learn from: a longer --max-minutes learns more" if planned < FEW_UPDATES else ""
    return f"pace: {per * 1000:,.0f} ms a step, about {planned:,} updates in the budget{few}"
