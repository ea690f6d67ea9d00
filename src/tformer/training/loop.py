"""The training loop: one loop for every source (synthetic task or your own files).

    record = train(config, make_objective)      # tformer.kinds.train passes the kinds' make_objective

A run directory holds everything about one run:
    checkpoints/step-N/    one checkpoint, published whole (see tformer.storage.checkpoint):
        config.json            the model's TransformerConfig
        model.safetensors      weights
        optimizer.safetensors  AdamW moments + the torch RNG state (tensors, no pickle)
        trainer_state.json     step, schedule, wall time, best metric: all else to resume
        train_config.json      the TrainConfig
    checkpoints/latest     the name of the newest checkpoint
    metrics.jsonl          one JSON object per line; the last one is the test result
    curves.png             loss and accuracy against steps
    .tformer-run.lock      held (flock) while a process trains here (see tformer.storage.rundir)
  data runs also:
    tokenizer.json         the tokenizer trained on the data (or the pretrained model's)
    data.json              objective and label names
    best.safetensors       the best validated weights (tested at the end; _selection says by what)
    confusion.png          classification: the test confusion matrix
    modules.json, 0_Transformer/, 1_Pooling/, 2_Normalize/   embedding: sentence-transformers

Resuming is bit-for-bit: the batch for step k depends only on (seed, k), dropout draws
from the restored RNG, and the optimizer moments are restored exactly; so training
2N steps gives the same weights as N steps and then N more after --resume (as long
as the schedule does not depend on the total: cosine and linear do, inverse_sqrt does not).

Data-parallel: under `torchrun --nproc_per_node N -m tformer train ...` every rank builds
the same model (same seed), reads the batches i with i % N == rank, and the gradients
are averaged (all-reduce: NCCL between GPUs, gloo on CPU) before each update, so N ranks with
--accumulate A take the same steps as one process with --accumulate N*A. Only rank 0 writes.

Devices: --device (tformer.nn.devices) places the model, built on the CPU from the seed so that
every device starts from the same weights; the run records where it trained (trainer_state.json,
the test record), and its checkpoints load on any device.
"""

from __future__ import annotations

import contextlib
import math
import shutil
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

from tformer.config import TransformerConfig
from tformer.config.sizes import check_fits
from tformer.errors import FieldError
from tformer.nn.devices import describe, resolve_device
from tformer.nn.kernels import autotune
from tformer.storage.checkpoint import (
    after_full_disk,
    check_run_dir,
    latest_checkpoint,
    load_training_state,
    load_weights,
)
from tformer.storage.files import FULL_DISK, new_run_dir
from tformer.storage.rundir import (
    RunLock,
    discard_unstarted,
    finished,
    limits_of,
    open_run_dir,
    resume_metrics,
    to_train_more,
)
from tformer.training.budget import (
    KERNEL_SHARE,
    PACE_AFTER,
    Budget,
    NoUpdate,
    check_affordable,
    check_minimum,
    pace,
)
from tformer.training.config import TrainConfig
from tformer.training.distributed import any_rank, barrier, rank_and_world
from tformer.training.first_steps import CONFIRM_UPDATES, FirstSteps
from tformer.training.objective import Objective
from tformer.training.planning import plan_run, replanned
from tformer.training.probe import fit_head
from tformer.training.report import (
    Meter,
    Progress,
    Reporter,
    baseline_verdict,
    check_reports,
    plot_curves,
    sample_table,
    summary,
    with_baseline,
)
from tformer.training.schedule import learning_rate
from tformer.training.steps import grad_scaler, in_precision, make_optimizer, train_step
from tformer.training.stream import prepared
from tformer.training.validation import (
    checkpoint,
    from_start,
    save_best,
    score_validation,
    selection,
    track_best,
)


# The loop ----------------------------------------------------------------------------------------
def train(config: TrainConfig, make_objective: Callable[..., Objective], resume: bool = False,
          progress: bool = True, log=print, started: float | None = None,
          device: torch.device | None = None) -> dict[str, Any]:
    """Train, checkpoint, test; return the test record (also the last line of metrics.jsonl).

    make_objective(config, run_dir=None, write=True, resume=False): the objective of the config's kind
    (tformer.kinds.make_objective, decided where the command starts; the loop never asks which).
    resume: continue the run in `config.out` from its checkpoint.
    started: when the command started (a time.perf_counter() reading; `tformer train` passes
    the process's start): --max-minutes counts from there. Default: now.
    device: where it trains, decided where the command starts (default: config.device's, under
    torchrun this rank's GPU).
    """
    started = time.perf_counter() if started is None else started
    device = resolve_device(config.device) if device is None else device  # torchrun: this rank's GPU
    rank, world = rank_and_world(device)
    writer = rank == 0
    if not writer:
        log = lambda *a, **k: None  # noqa: E731
    threads = torch.get_num_threads()
    if config.threads is not None:
        torch.set_num_threads(config.threads)
    run_dir = Path(config.out) if config.out else new_run_dir(config.name)
    if world > 1 and config.out is None:
        raise FieldError("out", "data-parallel runs need --out (every rank must agree on it)")
    config = config.replace(out=str(run_dir))
    check_reports(config)  # --report-to tensorboard without its package: one line, nothing made
    if not resume:
        check_minimum(config, started, before_setup=True)  # before anything: nothing can be done in less
    if config.data is None:  # the model is known before any file is touched: check its size
        task = make_objective(config)
        check_fits(task.model_config(), task.model_kind, training=True, batch=config.batch_size, what="model")
    created = writer and not run_dir.exists()  # rank 0 creates and locks it until training ends
    # New kernel choices (autotune) are measured in KERNEL_SHARE of a timed run's budget, no more.
    measuring = KERNEL_SHARE * config.max_minutes * 60 if config.max_minutes else None
    try:
        with open_run_dir(run_dir, resume) if writer else contextlib.nullcontext(), \
                autotune.measuring(measuring):
            return _train(config, make_objective, resume, progress, log, rank, world, started, device)
    except (ValueError, OSError) as e:
        if writer and isinstance(e, OSError) and e.errno in FULL_DISK:  # say what it left, how to go on
            e.add_note(after_full_disk(run_dir))  # (the command line adds it to the error's line)
        if created and latest_checkpoint(run_dir) is None:
            discard_unstarted(run_dir)  # e.g. a bad data file: no directory holding only a lock
        elif created and isinstance(e, NoUpdate):  # its step-0 checkpoint is no run: nothing kept
            with contextlib.suppress(ValueError), RunLock(run_dir):
                shutil.rmtree(run_dir, ignore_errors=True)
        raise
    except KeyboardInterrupt as e:  # Ctrl-C (or SIGTERM): what was published stays; say how to go on
        if writer and latest_checkpoint(run_dir) is not None:
            raise type(e)(f"{run_dir} keeps its last checkpoint; resume with `tformer train "
                          f"--resume {run_dir}`") from None
        raise
    finally:
        torch.set_num_threads(threads)  # the plan may have chosen fewer: the caller's again


def _train(config: TrainConfig, make_objective: Callable[..., Objective], resume: bool, progress: bool,
           log, rank: int, world: int, started: float, device: torch.device) -> dict[str, Any]:
    writer = rank == 0
    run_dir = Path(config.out)
    metrics_path = run_dir / "metrics.jsonl"
    # Rank 0 trains the tokenizer and writes it; the others wait, then read that very file.
    objective = make_objective(config, run_dir, resume=resume) if writer else None
    barrier(world)
    if objective is None:
        objective = make_objective(config, run_dir, write=False, resume=resume)
    if not resume:
        check_minimum(config, started)
    plan, objective, speeds, data = plan_run(objective, resume, world, started, log,
                                             run_dir if writer else None, device)
    config, bf16, why_precision = plan.config, plan.bf16, plan.why("precision")  # bf16: 16-bit autocast
    bf16 = any_rank(bf16, world)  # every rank trains in the same precision
    check_fits(objective.model_config(), objective.model_kind, training=True, what="model")
    if not resume:  # what the chosen model costs to build, step and save: refused before building it
        check_affordable(config, started, data.model_for(config), data.kind, plan)
    torch.manual_seed(config.seed)
    # A resumed run builds the model its checkpoint holds (a data encoder's config once said relu).
    saved = TransformerConfig.load(check_run_dir(run_dir) / "config.json") if resume else None
    model = objective.build_model(saved).to(device)
    probed = not resume and fit_head(objective, model, plan.probe_sample, device, bf16, log)  # (fine-tunes)
    optimizer = make_optimizer(model, config)
    state: dict[str, Any] = {"step": 0, "wall_seconds": 0.0, "schedule": config.schedule}
    ended = None  # what stopped a resumed run that had ended, and was killed in its test
    if resume:
        state = load_training_state(run_dir, model, optimizer)
        state.setdefault("best_by", objective.main_metric)  # what picked the best before best_by
        if config.precision == "auto" and state.get("precision") in ("fp32", "bf16", "fp16"):
            bf16, why_precision = state["precision"] != "fp32", "as the run chose when it started"
        done = resume_metrics(metrics_path, state, limits_of(config)) if writer else None
        if done is not None:
            log(f"{run_dir} had finished: stopped by {state['stopped_by']} at step {state['step']}; "
                f"nothing changed ({to_train_more(state)}). Its test result:")
            log(summary(done, objective.main_metric))
            if verdict := baseline_verdict(done):
                log(verdict)
            return done
        ended = state["stopped_by"] if finished(state, limits_of(config)) else None
        state.pop("stopped_by", None)  # trains on (or, having ended, tests)
        if writer and state.get("best_step") == state["step"]:
            save_best(run_dir, model)  # a kill may have come before they were written (checkpoint)
        if ended is None:  # (else only the test is left)
            check_minimum(config, started, spent=float(state["wall_seconds"]))
    state["precision"] = plan.half if bf16 else "fp32"
    state["device"] = str(device)
    scaler = grad_scaler(model, bf16)  # fp16 only
    reporter = Reporter(run_dir, config, state["step"] if resume else None) if writer else None
    log(f"device: {describe(device)}")
    log(f"precision: {state['precision']} ({why_precision})")
    n_params = sum(p.numel() for p in model.parameters())
    log(f"{objective.description}; {n_params:,} parameters; run dir {run_dir}")

    key = objective.main_metric
    previous_wall = float(state["wall_seconds"])
    validates_start = (objective.starts_complete or probed) and not resume  # (a resume validated it)
    budget = Budget(config, started, objective.train_records, spent=previous_wall,
                    validates_start=validates_start, pace=state.get("step_seconds"), plan=plan,
                    parameters=n_params)
    budget.test_examples = len(objective.examples("test"))
    # A timed run's bar runs on time (its step count moves with the pace: report.Progress).
    bar = Progress(None if budget.timed else budget.planned_steps(state["step"]), state["step"],
                   not (progress and writer), started + budget.seconds if budget.timed else None)
    first = FirstSteps(plan, speeds, data, device, bf16,
                       confirm=plan.confirm_precision and world == 1 and state["step"] < CONFIRM_UPDATES,
                       replans=plan.sized and world == 1 and budget.timed)
    meter, stop_reason = Meter(), ended or "steps"
    batches = objective.train_batches(state["step"] * config.accumulate * world, rank, world)

    def wall() -> float:
        return previous_wall + budget.now()

    def validate() -> dict[str, float]:
        """Validate the weights as they are, record it, keep them if they are the best yet, and
        checkpoint (every rank validates and tracks the best; rank 0 writes)."""
        objective.source.check_unchanged(thorough=False)  # batches read from a changed file
        with in_precision(device, first.bf16):  # (as the updates run)
            valid = score_validation(model, objective, budget, bar, bar.write if progress and writer else log)
        bar.status("training")
        if writer:
            reporter.write({"split": "validation", "step": state["step"], **valid,
                            "valid_share": round(budget.valid_share(), 4),
                            "wall_seconds": round(wall(), 2)})
            what = " (the model it starts from)" if state["step"] == 0 else ""
            bar.write(f"step {state['step']}{what}: validation {key} {valid[key]:.4f} "
                      f"loss {valid['loss']:.4f}")
        state["wall_seconds"] = wall()
        if budget.step_seconds is not None:  # the pace a resume plans its first step with
            state["step_seconds"] = budget.step_seconds
        improved = track_best(state, *selection(objective, valid), int(valid.get("examples", 0)))
        if writer:
            bar.status("saving")
            t = time.perf_counter()
            checkpoint(run_dir, model, optimizer, config, state, best=improved)
            budget.saved(time.perf_counter() - t)
            if budget.plot_seconds is None:  # drawn early, the last drawing's time is known before it
                budget.plotted(plot_curves(metrics_path, run_dir / "curves.png", key))
        budget.paused()
        return valid

    if validates_start:
        # The model is already whole for its objective: validated before the first update, it is
        # the best until a step beats it, so a fine-tune that only hurts (too high a --lr, too
        # few or noisy records) tests the model it started from, never worse weights.
        validate()
        bar.status("training")

    # The clock is read once a step (and again after a validation, which takes time): a step it
    # did not call the last is never followed by a stop without one more step, so the step the
    # run ends on is the one validated as the last (a second reading a moment later could stop
    # the run unvalidated when the deadline fell between the two).
    time_up = budget.out_of_time()
    first_step = state["step"]
    while ended is None and state["step"] < config.steps:
        if any_rank(time_up, world):
            stop_reason = "max_minutes"
            break
        if config.epochs is not None and any_rank(batches.epoch >= config.epochs, world):
            stop_reason = "epochs"
            break
        total = budget.planned_steps(state["step"])
        lr = learning_rate(config, state["step"] + 1, total)
        half = first.precision(state["step"] + 1)  # (by the run's step: a resume alternates alike)
        warmed = [] if first.warms(state["step"] + 1) else None  # (an untimed pass first: timed apart)
        t, before = time.perf_counter(), prepared(batches)
        loss, acc, tokens, examples = train_step(model, optimizer, objective, batches, config, lr,
                                                 world, half, scaler, warm=warmed)
        aside, warm = prepared(batches, before, config.accumulate), sum(warmed or ())  # (tokenizing a pool)
        seconds = time.perf_counter() - t - aside - warm
        budget.stepped(seconds, examples, aside + warm)
        state["step"] += 1
        left = budget.train_deadline() - budget.now()
        line, new = first.stepped(half, seconds, tokens, left, state["step"], warm)
        if line:
            (bar.write if progress and writer else log)(line)
        state["precision"] = plan.half if first.bf16 else "fp32"
        if new is not None:  # the real pace called for another size: built again, from step 0
            plan, config = new, new.config
            objective = replanned(objective, plan, data, run_dir if writer else None, bar.write)
            torch.manual_seed(config.seed)
            model = objective.build_model().to(device)
            optimizer, meter = make_optimizer(model, config), Meter()
            batches = objective.train_batches(0, rank, world)
            state["step"] = first_step = 0
            budget.restarted(plan)
            n_params = sum(p.numel() for p in model.parameters())
            bar.write(f"{objective.description}; {n_params:,} parameters")
            time_up = budget.out_of_time()
            continue
        if not math.isfinite(loss):
            bar.close()
            raise ValueError(
                f"loss: expected a finite number, got {loss} at step {state['step']} (lr {lr:.3g});"
                f" stopped, keeping the last good checkpoint (if any) in {run_dir}; try a lower --lr"
            )
        meter.add(loss, acc, tokens)
        if budget.timed and writer and state["step"] == first_step + PACE_AFTER:
            bar.write(pace(budget, state["step"]))
        time_up = budget.out_of_time()
        last = state["step"] >= budget.planned_steps(state["step"]) or time_up
        if state["step"] % config.log_every == 0 or last:
            record = {"split": "train", "step": state["step"], **meter.flush(), "lr": lr,
                      "planned_steps": total, "wall_seconds": round(wall(), 2)}
            if writer:
                reporter.write(record)
            bar.stepped(state["step"], budget.planned_steps(state["step"]), loss=f"{record['loss']:.3f}",
                        acc=f"{record['accuracy']:.3f}", tok_s=f"{record['tokens_per_second'] * world:.0f}")
        else:
            bar.stepped(state["step"], budget.planned_steps(state["step"]))
        if any_rank(budget.should_validate(state["step"], last), world):
            valid = validate()
            time_up = budget.out_of_time()
            if config.early_stop is not None and valid[key] >= config.early_stop:
                stop_reason = "early_stop"
                break
            if config.patience is not None and state["since_best"] >= config.patience:
                stop_reason = "patience"
                break
            clock_ended = last and budget.timed and state["step"] < config.steps \
                and (time_up or config.epochs is None)
            if any_rank(clock_ended, world):
                # The clock made this the last step, and it is validated: stop. The validation's
                # rate re-sizes the test's reserve, and the deadline it moved bought a few more
                # steps and a second validation (284.7 s and 287.2 s of 300, 11 steps apart).
                # (With --epochs, `last` may be the epochs' estimate: only the clock stops here.
                # Every rank stops at the same step, or the next step's all-reduce would wait.)
                stop_reason = "max_minutes"
                break
            bar.status("training")
    if budget.timed and state["step"] == 0 and ended is None:
        bar.close()  # out of time before the first update: nothing to test or keep
        raise NoUpdate(config, budget.now(), budget.reserve())
    state.update(wall_seconds=wall(), stopped_by=stop_reason, limits=limits_of(config))
    if writer:
        bar.status("saving")
        checkpoint(run_dir, model, optimizer, config, state, best=False)
        # The curves: drawn before the test, whose deadline then counts their time (4.5 s after a
        # 60 s run's test on a busy 2-core machine), and keeps as much for a confusion matrix.
        budget.plotted(plot_curves(metrics_path, run_dir / "curves.png", key), last=True)
    tested_step = state["step"]
    if (run_dir / "best.safetensors").is_file() and not budget.skipped_last:
        load_weights(model, run_dir / "best.safetensors")  # test the best validated weights
        tested_step = state.get("best_step", tested_step)
    # The test (as the updates run) measures no new kernel choice (9 s of a 570 s budget went to
    # decoding shapes) and scores what its time left pays for (its loss pass has no deadline).
    tested = objective.examples("test")[: budget.test_fits(budget.test_examples, plan.example_seconds)]
    with autotune.measuring(0.0 if budget.timed else None), in_precision(device, first.bf16):
        test, shown = objective.evaluate(model, "test", tested, budget.test_deadline(), paired=True,
                                         progress=lambda done, of: bar.status("testing", done, of))
    bar.close()
    record = {"split": "test", "task": config.name, "step": state["step"], "tested_step": tested_step, **test,
              "test_examples": budget.test_examples, "wall_seconds": round(wall(), 2),
              "stopped_by": stop_reason, "valid_share": round(budget.valid_share(), 4),
              "parameters": n_params, "device": str(device)}
    if not writer:
        return record
    scored = objective.examples("test")[: test["examples"]]
    record = with_baseline(record, key, objective.baseline(scored)) | from_start(metrics_path, objective)
    objective.source.check_unchanged()  # before anything is published
    rows = objective.sample_rows(scored, shown)
    if rows:
        log(sample_table(rows))
    log(summary(record, key))
    if verdict := baseline_verdict(record):
        log(verdict)
    reporter.write(record)
    reporter.close()
    objective.save_outputs(model, run_dir, shown)
    log(f"wrote {run_dir}/ (checkpoint, metrics.jsonl, curves.png)")
    return record
