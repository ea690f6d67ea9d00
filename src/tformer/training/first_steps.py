"""The run's first real updates: they confirm the plan's precision, and its pace.

A plan that predicted 16-bit autocast without having measured this model (a first run on a
machine: tformer.training.planning) has its first 2 x CONFIRM_ROUNDS updates alternate 16-bit
and fp32 autocast, where the plan expects fp32's to take at most CONFIRM_SHARE of the training
time (and only until they have: a plan's estimate may be optimistic). Each is a real update
(the weights, the optimizer and the schedule are fp32 either way), so confirming costs the run
nothing but the slower precision's few steps, where a probe before training cost two throwaway
models (a 2.5-minute budget could not pay for them, and the run trained in fp32 on a CPU where
bf16 steps were 1.5-1.8x faster). The faster by its
fastest time per token (each precision's first update, which creates its kernels, left out)
is kept, and remembered for the next run. Each of these updates first passes its batch once
untimed (``FirstSteps.warms``, tformer.training.steps.warm_pass): oneDNN makes a 16-bit kernel
per new shape, and a run's batches keep bringing new shapes for its first tens of updates, so
timed on them bf16 looked 1.3x faster than fp32 for a d_model-384 classifier on an Intel Xeon
with AMX whose steady steps were 1.9x faster (88 ms against 170); with the pass, 1.7x.

Then REPLAN_AFTER updates in the kept precision time the pace at the plan's batch (EARLY_AFTER,
where each is EARLY_RATIO times slower than planned or more): the machine's rate is remembered
(the next plan estimates from it), and where the pace disagrees with the plan's (a seq2seq plan
expected 150 ms a step and got 467: a model sized for three times the updates it got),
tformer.training.plan.replan chooses the size again, once.
"""

from __future__ import annotations

import statistics

from tformer.nn.kernels import autotune
from tformer.training.plan import CONFIRM_ROUNDS, CONFIRM_SHARE, Plan, replan
from tformer.training.precision import MIN_STEP_SPEEDUP, precision_why

CONFIRM_UPDATES = 2 * CONFIRM_ROUNDS  # CONFIRM_ROUNDS of each precision (the first of each left out)
REPLAN_AFTER = 5  # updates in the kept precision that time the pace
# ... or this many, where each took EARLY_RATIO times the plan's or more: beside two busy
# processes a plan of 128 ms a step ran 1.3 s, and 5 more updates were a fifth of its budget.
EARLY_AFTER, EARLY_RATIO = 2, 3.0


class FirstSteps:
    """What the loop asks before each of a new run's first updates (``bf16``) and tells after
    it (``stepped``): a line to print when a precision is kept, and a new plan when the pace
    calls for one. `speeds`, `data`: the plan's (tformer.training.planning)."""

    def __init__(self, plan: Plan, speeds, data, device, bf16: bool, confirm: bool, replans: bool) -> None:
        self.plan, self.speeds, self.data, self.device = plan, speeds, data, device
        self.confirming = confirm
        self.bf16 = bf16
        self.times: dict[bool, list[float]] = {False: [], True: []}
        self.spent: dict[bool, float] = {False: 0.0, True: 0.0}  # seconds of each precision's updates
        self.last_other = 0.0  # seconds of the latest update in the precision the plan did not predict
        self.paced: list[float] = []
        self.seen = 0  # updates this process has made
        self.first_paced = False  # the first paced update was this process's first
        self.pacing = speeds is not None
        self.replans = replans

    def precision(self, update: int) -> bool:
        """16-bit autocast for the run's `update`-th update (1-based)? By the run's count, so that
        a run resumed within its first CONFIRM_UPDATES alternates as the same run straight would."""
        return update % 2 == 1 if self.confirming and update <= CONFIRM_UPDATES else self.bf16

    def warms(self, update: int) -> bool:
        """Whether the `update`-th update is timed against the other precision, and so has its
        batch passed once untimed first (tformer.training.steps.warm_pass): each precision is
        compared on kernels already made for the batch's shapes, as most of a run's updates
        find them, not on a first update's making of them."""
        return self.confirming and update <= CONFIRM_UPDATES

    def stepped(self, bf16: bool, seconds: float, tokens: int, seconds_left: float,
                update: int = 0, warm: float = 0.0) -> tuple[str | None, Plan | None]:
        """(a line to print, a new plan) after the run's `update`-th update (of `tokens` tokens)
        took `seconds` (and its untimed pass `warm` more: counted in what each precision's
        timing cost, ``warms``); then the threads the run chose are checked again
        (``ThreadWatch``), but not while both precisions are timed (a change would favour one),
        and a pace timed at the old count is timed again."""
        line, new = self._stepped(bf16, seconds, tokens, seconds_left, update, warm)
        watch = getattr(self.speeds, "threads", None)
        if watch is None or self.confirming or new is not None or (moved := watch.check()) is None:
            return line, new
        self.paced = []
        return (f"{line}\n{moved}" if line else moved), None

    def _stepped(self, bf16: bool, seconds: float, tokens: int, seconds_left: float,
                 update: int, warm: float = 0.0) -> tuple[str | None, Plan | None]:
        self.seen += 1
        if self.confirming:
            self.times[bf16].append(seconds / max(tokens, 1))
            self.spent[bf16] += seconds + warm
            if bf16 != self.bf16:
                self.last_other = seconds + warm
            other = self.spent[not self.bf16]  # the precision the plan did not predict
            # Stopped once it passed the share, or before an update of it still due that would (as
            # long as its latest: beside two busy processes a 2-minute fine-tune's second fp32 update
            # took its fp32 ones from 4 s to 8.2 s). (None spent yet: a first update that ended past
            # the deadline.)
            share = CONFIRM_SHARE * (sum(self.spent.values()) + seconds_left)
            due = update < CONFIRM_UPDATES and len(self.times[not self.bf16]) < CONFIRM_ROUNDS
            if other and (other > share or (due and other + self.last_other > share)):
                self.confirming = False  # (the plan's estimate was optimistic: not remembered)
                planned = self.plan.half if self.bf16 else "fp32"
                why = "more than" if other > share else "and one more would pass"
                return (f"precision: {planned} from here on, as planned: the first updates' "
                        f"{'fp32' if self.bf16 else self.plan.half} ones took {other:,.1f} s, {why} "
                        f"{CONFIRM_SHARE:.0%} of the training time, to time"), None
            if update < CONFIRM_UPDATES and min(len(t) for t in self.times.values()) < CONFIRM_ROUNDS:
                return None, None
            return self._keep(), None
        if not self.pacing:
            return None, None
        if not self.paced:
            self.first_paced = self.seen == 1
        planned = self.plan.config.max_tokens or tokens
        self.paced.append(seconds * planned / max(tokens, 1))
        # (the process's first update, which creates its kernels, is no evidence of a steady pace)
        steady = self.paced[1:] if self.first_paced else self.paced
        far = len(steady) >= EARLY_AFTER and bool(self.plan.step_seconds) and \
            min(steady) >= EARLY_RATIO * self.plan.step_seconds
        if len(self.paced) < REPLAN_AFTER and not far:
            return None, None
        self.pacing = False
        measured = min(steady) if far and len(self.paced) < REPLAN_AFTER else statistics.median(self.paced)
        config, kind = self.plan.config, self.data.kind
        length = self.data.keys(config.max_length)
        if self.speeds is not None and self.device.type == "cpu" and config.max_tokens:
            self.speeds.learned(kind, self.plan.half if self.bf16 else "fp32", measured,
                                self.data.model_for(config), config.max_tokens, length)
        new = None if not self.replans else replan(self.plan, self.data, self.speeds, measured, seconds_left,
                                                   update)
        if new is None:
            return None, None
        was, now = self.plan.config, new.config
        moved = {"max length": was.max_length != now.max_length, "model size": was.model != now.model}
        changed = "; ".join(f"{what} {new.why(what)}" for what in moved if moved[what] and new.why(what))
        line = (f"re-plan: the first updates took {measured * 1000:,.0f} ms each where the plan expected "
                f"{self.plan.step_seconds * 1000:,.0f}: {changed}; starting again")
        self.plan = new
        return line, new

    def _keep(self) -> str | None:
        """Keep the faster precision; remember it; the line that says so."""
        from tformer.training.planning import precision_key

        self.confirming = False
        half = self.plan.half
        config = self.plan.config
        key = precision_key(config, self.data.model_for(config), self.data.kind)
        known = autotune.known("train-precision", key, {"fp32", half}, self.device)
        if known is not None:  # remembered: its choice, as the plan said it (nothing new to say)
            self.bf16 = known["choice"] == half
            return None
        if min(len(t) for t in self.times.values()) < 2:  # (a resume saw too few of them: as it was)
            return None
        fp32, sixteen = min(self.times[False][1:]), min(self.times[True][1:])
        self.bf16 = fp32 >= MIN_STEP_SPEEDUP * sixteen
        decision = autotune.decision(half if self.bf16 else "fp32", {"fp32": fp32, half: sixteen})
        autotune.remember("train-precision", key, decision, self.device)
        rounds = 2 * CONFIRM_ROUNDS
        return (f"precision: {half if self.bf16 else 'fp32'} from here on, timed on the first {rounds} "
                f"updates ({precision_why(decision, half)}; remembered for the next run)")
