"""The training loop: one loop for every source (synthetic task or your own files).

    record = train(resolve_config({"task": "reverse"}))
    record = train(resolve_config({"data": "train.jsonl"}))

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
are averaged (all-reduce, gloo) before each update, so N ranks with --accumulate A take
the same steps as one process with --accumulate N*A. Only rank 0 writes.
"""

from __future__ import annotations

import contextlib
import functools
import itertools
import math
import sys
import time
from functools import partial
from pathlib import Path
from typing import Any

import torch
from safetensors.torch import save as st_save
from torch import nn
from tqdm import tqdm

from tformer.config import TransformerConfig
from tformer.stats import check_fits
from tformer.storage.checkpoint import (
    check_run_dir,
    latest_checkpoint,
    load_training_state,
    load_weights,
    save_checkpoint,
)
from tformer.storage.files import new_run_dir, write_atomic, write_json_atomic
from tformer.storage.rundir import discard_unstarted, open_run_dir, resume_metrics
from tformer.tasks import get_task
from tformer.training.budget import PROBE, Budget
from tformer.training.config import TrainConfig, read_train_config
from tformer.training.data_objectives import data_objective
from tformer.training.dataset import TextData
from tformer.training.distributed import any_rank, average_gradients, barrier, rank_and_world, sum_over_ranks
from tformer.training.objective import Objective
from tformer.training.precision import choose_precision, confirm_bf16, step_class
from tformer.training.report import Meter, append_jsonl, plot_curves, sample_table, summary
from tformer.training.schedule import learning_rate
from tformer.training.sizing import (
    batch_tokens,
    choose_length,
    choose_size,
    finetune_lr,
    time_steps,
    truncated,
    wants_auto_length,
    wants_auto_size,
)
from tformer.training.task_objectives import task_objective


# Objectives, models, schedule ---------------------------------------------------------------
def make_objective(config: TrainConfig, run_dir: Path | None = None, write: bool = True,
                   existing: bool = False) -> Objective:
    """The objective a config trains: a synthetic task's, or your data's (its tokenizer trained
    and written to run_dir; with `existing`, read back from run_dir without the data files)."""
    if config.data is None:
        return task_objective(get_task(config.task, config.seed, config.valid_size, config.test_size),
                              config)
    data = TextData.from_run(run_dir, config) if existing else TextData.build(config, run_dir, write=write)
    return data_objective(data, config)


def make_optimizer(model: nn.Module, config: TrainConfig) -> torch.optim.AdamW:
    # No weight decay on biases, LayerNorm gains and embeddings' 1-d cousins: decaying
    # them toward 0 only fights the normalisation.
    decay = [p for p in model.parameters() if p.dim() >= 2]
    no_decay = [p for p in model.parameters() if p.dim() < 2]
    groups = [{"params": decay, "weight_decay": config.weight_decay},
              {"params": no_decay, "weight_decay": 0.0}]
    # Adam betas and eps of Vaswani et al. 2017, §5.3; fine-tuning uses BERT's (0.999, 1e-6).
    betas, eps = ((0.9, 0.999), 1e-6) if config.from_pretrained else ((0.9, 0.98), 1e-9)
    # fused: one kernel for all parameters (several times faster on CPU than the loop).
    return torch.optim.AdamW(groups, lr=config.lr, betas=betas, eps=eps, fused=True)


def load_run(run_dir: str | Path) -> tuple[nn.Module, Objective, TrainConfig]:
    """The model (eval mode, frozen: its weights run packed, see tformer.kernels), objective
    and TrainConfig of a run directory. The weights are the best validated ones
    (best.safetensors: what the run's test result describes), else the newest checkpoint's."""
    run_dir = Path(run_dir)
    saved = check_run_dir(run_dir)  # the newest checkpoint's files
    config = read_train_config(saved)
    objective = make_objective(config, run_dir, existing=True)  # tokenizer, labels
    model_config = TransformerConfig.load(saved / "config.json")
    check_fits(model_config, objective.model_kind, what=str(saved / "config.json"))
    model = objective.build_model(model_config)
    best = run_dir / "best.safetensors"
    load_weights(model, best if best.is_file() else saved / "model.safetensors")
    return model.eval().requires_grad_(False), objective, config


# The loop ----------------------------------------------------------------------------------------
def train(config: TrainConfig, resume: bool = False, progress: bool = True,
          log=print) -> dict[str, Any]:
    """Train, checkpoint, test; return the test record (also the last line of metrics.jsonl).

    resume: continue the run in `config.out` from its checkpoint.
    """
    started = time.perf_counter()
    rank, world = rank_and_world()
    writer = rank == 0
    if not writer:
        log = lambda *a, **k: None  # noqa: E731
    if config.threads is not None:
        torch.set_num_threads(config.threads)
    precision = choose_precision(config.precision)  # the machine's answer; _train may refine it
    run_dir = Path(config.out) if config.out else new_run_dir(config.name)
    if world > 1 and config.out is None:
        raise ValueError("out: data-parallel runs need --out (every rank must agree on it)")
    config = config.replace(out=str(run_dir))
    if config.data is None:  # the model is known before any file is touched: check its size
        task = make_objective(config)
        check_fits(task.model_config(), task.model_kind, training=True,
                   batch=config.batch_size, what="model")
    # Rank 0 checks, creates and locks the run directory, until training ends however it ends.
    created = writer and not run_dir.exists()
    try:
        with open_run_dir(run_dir, resume) if writer else contextlib.nullcontext():
            return _train(config, resume, progress, log, rank, world, started, precision)
    except (ValueError, OSError):
        if created and latest_checkpoint(run_dir) is None:
            discard_unstarted(run_dir)  # e.g. a bad data file: no directory holding only a lock
        raise


def _train(config: TrainConfig, resume: bool, progress: bool, log, rank: int, world: int,
           started: float, precision: tuple[str, str]) -> dict[str, Any]:
    writer = rank == 0
    bf16, why_precision = precision[0] == "bf16", precision[1]
    run_dir = Path(config.out)
    metrics_path = run_dir / "metrics.jsonl"
    # Rank 0 trains the tokenizer and writes it; the others wait, then read that very file.
    source = make_objective(config, run_dir) if writer else None
    barrier(world)
    if source is None:
        source = make_objective(config, run_dir, write=False)
    if config.lr is None:  # resumed runs saved theirs
        config, why = finetune_lr(config, source.model_config().d_model)
        source = data_objective(source.data, config)
        log(f"learning rate: {why}")
    if wants_auto_length(config, resume, world):
        data = source.data

        def at_length(c: TrainConfig):
            return data_objective(data.with_max_length(c.max_length), c)

        config, why = choose_length(config, at_length, next(data.epoch_pools()),
                                    0.9 * (config.max_minutes * 60 - (time.perf_counter() - started)),
                                    partial(time_steps, step=_probe_step(config, bf16)),
                                    source.train_records or 1)
        source = at_length(config)
        write_json_atomic(run_dir / "data.json", source.data.describe())  # resuming reads it
        log(f"max length: {why} (--max-length sets it)")
    if config.data is not None and (not resume or config.max_tokens is None):
        sample = source.encode(next(source.data.epoch_pools()))  # a pool: a sample of the file
        cut = truncated([ex.longest for ex in sample], source.tokenizer.max_length)
        if cut and not resume:  # a resumed run said it when it started
            log(cut)
        if config.max_tokens is None:
            config, why = batch_tokens(config, [ex.cost for ex in sample])
            source = data_objective(source.data, config)
            log(f"batch: {why}")
    if wants_auto_size(config, resume, world):
        config, why = choose_size(config, lambda c: data_objective(source.data, c),
                                  0.9 * (config.max_minutes * 60 - (time.perf_counter() - started)),
                                  source.train_batches(0), _probe_step(config, bf16))
        source = data_objective(source.data, config)
        log(f"model size: {why} (size options turn this off)")
    check_fits(source.model_config(), source.model_kind, training=True, what="model")
    if config.precision == "auto" and bf16 and not resume:  # generic product faster: this model too?
        # One batch, again and again: the steady state, not the first call of each new shape's
        # kernels (which bf16 pays more for); drawn only if the choice is not known yet.
        batch = functools.cache(lambda: next(source.train_batches(0)))
        shape = f"{config.max_tokens} tokens" if config.max_tokens else (
            f"{config.batch_size} x {config.max_length}")
        if config.from_pretrained:  # its own shape, not the size options': named by its directory
            shape += f", from {Path(config.from_pretrained).resolve()}"
        bf16, why_precision = confirm_bf16(
            lambda b: time_steps(source, _probe_step(config, b), itertools.repeat(batch())),
            step_class(source.model_kind, source.model_config(), shape))
        bf16 = any_rank(bf16, world)  # every rank trains in the same precision
    torch.manual_seed(config.seed)
    model = source.build_model()
    optimizer = make_optimizer(model, config)
    state: dict[str, Any] = {"step": 0, "wall_seconds": 0.0, "schedule": config.schedule}
    if resume:
        state = load_training_state(run_dir, model, optimizer)
        state.setdefault("best_by", source.main_metric)  # what picked the best before best_by
        if config.precision == "auto" and state.get("precision") in ("fp32", "bf16"):
            bf16, why_precision = state["precision"] == "bf16", "as the run chose when it started"
        finished = resume_metrics(metrics_path, state, config.steps) if writer else None
        if finished is not None:
            log(f"{run_dir} already finished at step {state['step']}; its test result:")
            log(summary(finished, source.main_metric))
            return finished
    state["precision"] = "bf16" if bf16 else "fp32"
    log(f"precision: {state['precision']} ({why_precision})")
    n_params = sum(p.numel() for p in model.parameters())
    log(f"{source.description}; {n_params:,} parameters; run dir {run_dir}")
    baseline = source.baseline()
    if baseline:
        log(f"majority-class baseline (test accuracy): {baseline['majority_baseline']:.3f}")

    key = source.main_metric
    previous_wall = float(state["wall_seconds"])
    budget = Budget(config, started, getattr(source, "train_records", None))
    budget.test_examples = len(source.examples("test"))
    bar = _progress_bar(budget, state["step"], disabled=not progress or not writer)
    meter = Meter()
    stop_reason = "steps"
    batches = source.train_batches(state["step"] * config.accumulate * world, rank, world)

    def wall() -> float:
        return previous_wall + budget.now()

    while state["step"] < config.steps:
        if any_rank(budget.out_of_time(), world):
            stop_reason = "max_minutes"
            break
        if config.epochs is not None and any_rank(batches.epoch >= config.epochs, world):
            stop_reason = "epochs"
            break
        total = budget.planned_steps(state["step"])
        lr = learning_rate(config, state["step"] + 1, total)
        t = time.perf_counter()
        loss, acc, tokens, examples = train_step(model, optimizer, source, batches, config, lr, world, bf16)
        budget.stepped(time.perf_counter() - t, examples)
        state["step"] += 1
        if not math.isfinite(loss):
            bar.close()
            raise ValueError(
                f"loss: expected a finite number, got {loss} at step {state['step']} (lr {lr:.3g});"
                f" stopped, keeping the last good checkpoint (if any) in {run_dir}; try a lower --lr"
            )
        meter.add(loss, acc, tokens)
        _advance(bar, budget)
        time_up = budget.out_of_time()
        last = state["step"] >= budget.planned_steps(state["step"]) or time_up
        if state["step"] % config.log_every == 0 or last:
            record = {"split": "train", "step": state["step"], **meter.flush(), "lr": lr,
                      "planned_steps": total, "wall_seconds": round(wall(), 2)}
            if writer:
                append_jsonl(metrics_path, record)
            bar.set_postfix(step=state["step"], loss=f"{record['loss']:.3f}", acc=f"{record['accuracy']:.3f}",
                            tok_s=f"{record['tokens_per_second'] * world:.0f}")
        if any_rank(budget.should_validate(state["step"], last), world):
            valid = _validate(model, source, budget)
            if writer:
                append_jsonl(metrics_path, {"split": "validation", "step": state["step"], **valid,
                                            "valid_share": round(budget.valid_share(), 4),
                                            "wall_seconds": round(wall(), 2)})
                bar.write(f"step {state['step']}: validation {key} {valid[key]:.4f} "
                          f"loss {valid['loss']:.4f}")
            state["wall_seconds"] = wall()
            improved = _track_best(state, *_selection(source, valid))
            if writer:
                t = time.perf_counter()
                _checkpoint(run_dir, model, optimizer, config, state, best=improved)
                budget.saved(time.perf_counter() - t)
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
    bar.close()
    state["wall_seconds"] = wall()
    state["stopped_by"] = stop_reason
    if writer:
        _checkpoint(run_dir, model, optimizer, config, state, best=False)
    if (run_dir / "best.safetensors").is_file():
        load_weights(model, run_dir / "best.safetensors")  # test the best validated weights
    test, preds = source.evaluate(model, "test")
    record = {"split": "test", "task": config.name, "step": state["step"], **test,
              "wall_seconds": round(wall(), 2), "stopped_by": stop_reason,
              "valid_share": round(budget.valid_share(), 4), "parameters": n_params, **baseline}
    if not writer:
        return record
    rows = source.sample_rows(source.examples("test"), preds)
    if rows:
        log(sample_table(rows))
    log(summary(record, key))
    append_jsonl(metrics_path, record)
    plot_curves(metrics_path, run_dir / "curves.png", key)
    source.save_outputs(model, run_dir, preds)
    log(f"wrote {run_dir}/ (checkpoint, metrics.jsonl, curves.png)")
    return record


def _probe_step(config: TrainConfig, bf16: bool):
    """One update of a throwaway model, as train_step does it (for timing)."""
    # by model: each model kept alive here, so that no later model reuses its id
    optimizers: dict[int, tuple[nn.Module, torch.optim.Optimizer]] = {}

    def step(model: nn.Module, batch, objective) -> None:
        if id(model) not in optimizers:
            optimizers[id(model)] = (model, make_optimizer(model, config))
        optimizer = optimizers[id(model)][1]
        optimizer.zero_grad(set_to_none=True)
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=bf16):
            loss, _ = objective.loss(model, batch, config.label_smoothing)
        loss.backward()
        optimizer.step()

    return step


def _validate(model: nn.Module, source: Objective, budget: Budget) -> dict[str, float]:
    """Metrics on the validation sample; a timed run first times a few examples to size it."""
    examples = source.examples("validation")
    if budget.needs_probe():
        t = time.perf_counter()
        probe = examples[:PROBE]
        source.evaluate(model, "validation", examples=probe)
        budget.probed(time.perf_counter() - t, len(probe))
    sample = examples[: budget.sample_size(len(examples))]
    t = time.perf_counter()
    valid, _ = source.evaluate(model, "validation", examples=sample)
    budget.validated(time.perf_counter() - t, len(sample))
    if not all(math.isfinite(v) for v in valid.values()):
        raise ValueError(f"validation: expected finite outputs, got {valid}; stopped, keeping the "
                         "last good checkpoint (if any); try a lower --lr")
    return valid


def _progress_bar(budget: Budget, step: int, disabled: bool):
    """Counts seconds toward --max-minutes when there is one, else steps toward --steps.
    Redraws a few times a second on a terminal; in a log file, every 30 s is plenty."""
    interval = 0.1 if sys.stderr.isatty() else 30
    if budget.timed:
        return tqdm(total=round(budget.seconds), initial=round(budget.now()), unit="s", disable=disabled,
                    dynamic_ncols=True, leave=False, mininterval=interval,
                    bar_format="{l_bar}{bar}| {n:.0f}/{total:.0f}s [{elapsed}<{remaining}{postfix}]")
    return tqdm(total=budget.config.steps, initial=step, disable=disabled, dynamic_ncols=True,
                leave=False, mininterval=interval)


def _advance(bar, budget: Budget) -> None:
    if budget.timed:
        bar.update(max(min(budget.now(), budget.seconds) - bar.n, 0))
    else:
        bar.update(1)


def train_step(model: nn.Module, optimizer: torch.optim.Optimizer, source, batches, config: TrainConfig,
               lr: float, world: int = 1, bf16: bool = False) -> tuple[float, float, int, int]:
    """One update at learning rate `lr` from `config.accumulate` batches; returns the mean
    (loss, accuracy) of the batches, their token count and their example count."""
    for group in optimizer.param_groups:
        group["lr"] = lr
    model.train()
    optimizer.zero_grad(set_to_none=True)
    total_loss = total_acc = 0.0
    tokens = examples = 0
    for _ in range(config.accumulate):
        batch = next(batches)
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=bf16):
            loss, acc = source.loss(model, batch, config.label_smoothing)
        (loss / config.accumulate if config.accumulate > 1 else loss).backward()
        total_loss, total_acc = total_loss + loss.item(), total_acc + acc
        tokens += batch.n_tokens()
        examples += batch.n_examples()
    if world > 1:
        average_gradients(model, world)
        total_loss, total_acc, tokens = sum_over_ranks([total_loss / world, total_acc / world, tokens])
    if config.clip_grad > 0:
        nn.utils.clip_grad_norm_(model.parameters(), config.clip_grad)
    optimizer.step()
    return total_loss / config.accumulate, total_acc / config.accumulate, int(tokens), examples


def _selection(source: Objective, valid: dict[str, float]) -> tuple[str, float]:
    """(what picks the best weights, its score: higher is better): the objective's ``best_by``
    (a sequence-to-sequence run's teacher-forced loss: corpus BLEU on the validation sample
    moved by a point or more between neighbouring validations, and once picked weights 300
    updates older than the loss's: test BLEU 20.2 instead of 23.9), else its main metric."""
    by = getattr(source, "best_by", source.main_metric)
    return by, -valid[by] if by == "loss" else valid[by]


def _track_best(state: dict[str, Any], by: str, value: float) -> bool:
    """Record a new best validation score (higher is better); count validations since. A run
    resumed with another selection (a seq2seq run an older version picked by BLEU) starts over."""
    if state.get("best_by") != by:
        state["best"], state["best_by"] = None, by
    best = state.get("best")
    if best is None or value > best:
        state["best"], state["best_step"], state["since_best"] = value, state["step"], 0
        return True
    state["since_best"] = state.get("since_best", 0) + 1
    return False


def _checkpoint(run_dir: Path, model: nn.Module, optimizer: torch.optim.Optimizer, config: TrainConfig,
                state: dict[str, Any], best: bool) -> None:
    """Every file the loop writes about the model goes through here (tformer.storage.checkpoint owns
    the format): the checkpoint, and the best validated weights."""
    if best:
        weights = {k: v.detach().contiguous() for k, v in model.state_dict().items()}
        write_atomic(run_dir / "best.safetensors", st_save(weights))
    save_checkpoint(run_dir, model, optimizer, config, state, keep=config.keep)
