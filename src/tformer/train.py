"""Train a model on a synthetic task: config, loop, evaluation and checkpoints.

    metrics = train(resolve_config({"task": "reverse"}))

A run directory holds everything about one run:
    checkpoints/step-N/    one checkpoint, published whole (see tformer.checkpoint):
        config.json            the model's TransformerConfig
        model.safetensors      weights
        optimizer.safetensors  AdamW moments + the torch RNG state (tensors, no pickle)
        trainer_state.json     step, schedule, wall time: everything else needed to resume
        train_config.json      the TrainConfig
    checkpoints/latest     the name of the newest checkpoint
    metrics.jsonl          one JSON object per line; the last one is the test result
    curves.png             loss and accuracy against steps
    .tformer-run.lock      held (flock) while a process trains here (see tformer.rundir)

Resuming is bit-for-bit: the batch for step k depends only on (seed, k), dropout draws
from the restored RNG, and the optimizer moments are restored exactly; so training
2N steps gives the same weights as N steps and then N more after --resume (as long
as the schedule does not depend on the total: cosine does, inverse_sqrt does not).
"""

from __future__ import annotations

import io
import json
import math
import sys
import time
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from tformer.checkpoint import (
    check_run_dir,
    load_training_state,
    load_weights,
    save_checkpoint,
)
from tformer.config import TransformerConfig, check_known_keys
from tformer.files import write_atomic
from tformer.generate import generate
from tformer.model import EncoderClassifier, Seq2SeqTransformer
from tformer.rundir import check_unlocked, open_run_dir, resume_metrics
from tformer.stats import check_fits
from tformer.tasks import Example, Task, get_task
from tformer.tasks.tokenizer import PAD
from tformer.train_config import (  # noqa: F401  (re-exported: tformer.train's public names)
    PRESETS,
    RESUMABLE,
    SCHEDULES,
    TrainConfig,
    learning_rate,
    load_config_file,
    resolve_config,
)


def resume_config(run_dir: str | Path, *layers: dict[str, Any]) -> TrainConfig:
    """The saved TrainConfig of `run_dir` with `layers` applied; only RESUMABLE options may
    change (the others define the experiment being continued)."""
    check_unlocked(run_dir)  # a run in progress replaces its checkpoints while we read
    saved_dir = check_run_dir(run_dir)  # the newest checkpoint's files
    saved = TrainConfig(**json.loads((saved_dir / "train_config.json").read_text()))
    changes: dict[str, Any] = {}
    for layer in layers:
        changes.update(layer)
    changes["out"] = str(Path(run_dir))
    check_known_keys(changes, TrainConfig)
    for name, value in changes.items():
        if name not in RESUMABLE and value != getattr(saved, name):
            raise ValueError(
                f"{name}: cannot change when resuming (the run has {getattr(saved, name)!r}, "
                f"got {value!r}); only {', '.join(RESUMABLE)} can"
            )
    return saved.replace(**changes)


# Model, schedule, loss -------------------------------------------------------------------
def build_model(config: TrainConfig, task: Task) -> nn.Module:
    model_config = config.model_config(task)
    if task.kind == "seq2seq":
        return Seq2SeqTransformer(model_config)
    return EncoderClassifier(model_config)


def make_optimizer(model: nn.Module, config: TrainConfig) -> torch.optim.AdamW:
    # No weight decay on biases, LayerNorm gains and embeddings' 1-d cousins: decaying
    # them toward 0 only fights the normalisation.
    decay = [p for p in model.parameters() if p.dim() >= 2]
    no_decay = [p for p in model.parameters() if p.dim() < 2]
    groups = [{"params": decay, "weight_decay": config.weight_decay},
              {"params": no_decay, "weight_decay": 0.0}]
    # Adam betas and eps of Vaswani et al. 2017, §5.3.
    # fused: one kernel for all parameters (several times faster on CPU than the loop).
    return torch.optim.AdamW(groups, lr=config.lr, betas=(0.9, 0.98), eps=1e-9, fused=True)


def forward_loss(model: nn.Module, batch, label_smoothing: float = 0.0):
    """Teacher-forced loss and (loss, accuracy, n_tokens) for logging."""
    if hasattr(batch, "src"):
        logits = model(batch.src, batch.tgt_in, src_attention_mask=batch.src_mask,
                       tgt_attention_mask=batch.tgt_mask).logits  # (B, T, V)
        labels = batch.labels  # (B, T)
        loss = F.cross_entropy(logits.flatten(0, 1), labels.flatten(), ignore_index=PAD,
                               label_smoothing=label_smoothing)
        real = labels != PAD
        right = ((logits.argmax(-1) == labels) & real).sum()
        acc = right.item() / max(int(real.sum()), 1)
    else:
        logits = model(batch.input_ids, attention_mask=batch.attention_mask).logits  # (B, C)
        loss = F.cross_entropy(logits, batch.labels, label_smoothing=label_smoothing)
        acc = (logits.argmax(-1) == batch.labels).float().mean().item()
    return loss, acc


# Evaluation ----------------------------------------------------------------------------
@torch.no_grad()
def predict(model: nn.Module, task: Task, examples: list[Example], beam_size: int = 1,
            batch_size: int = 250, length_penalty: float = 1.0) -> list:
    """Generated id lists (seq2seq) or class ids (classification), one per example."""
    was_training = model.training
    model.eval()
    out: list = []
    for i in range(0, len(examples), batch_size):
        batch = task.collate(examples[i : i + batch_size])
        if task.kind == "seq2seq":
            gen = generate(model, batch.src, batch.src_mask, beam_size=beam_size,
                           max_len=task.max_target_tokens + 1, length_penalty=length_penalty)
            out += gen.tolist()
        else:
            logits = model(batch.input_ids, attention_mask=batch.attention_mask).logits
            out += logits.argmax(-1).tolist()
    model.train(was_training)
    return out


@torch.no_grad()
def evaluate(model: nn.Module, task: Task, split: str, beam_size: int = 1,
             limit: int | None = None) -> tuple[dict[str, float], list]:
    """Metrics on a held-out split (generation for seq2seq), plus the predictions."""
    examples = task.split(split)[:limit]
    preds = predict(model, task, examples, beam_size=beam_size)
    metrics = task.score(preds, examples)
    was_training = model.training
    model.eval()
    batch = task.collate(examples[:500])
    metrics["loss"] = forward_loss(model, batch)[0].item()  # teacher-forced, unsmoothed
    model.train(was_training)
    return metrics, preds


def main_metric(task: Task) -> str:
    return "exact_match" if task.kind == "seq2seq" else "accuracy"


def format_prediction(task: Task, pred) -> str:
    return task.tokenizer.decode(pred) if task.kind == "seq2seq" else str(pred)


def sample_table(task: Task, examples: list[Example], preds: list, n: int = 6) -> str:
    rows = [("input", "prediction", "target", "")]
    for ex, p in list(zip(examples, preds, strict=True))[:n]:
        target = ex.target if task.kind == "seq2seq" else str(ex.label)
        shown = format_prediction(task, p)
        rows.append((ex.source, shown, target, "ok" if shown == target else "WRONG"))
    widths = [min(max(len(r[i]) for r in rows), 48) for i in range(4)]
    cut = [[c if len(c) <= w else c[: w - 3] + "..." for c, w in zip(r, widths, strict=True)]
           for r in rows]
    return "\n".join("  ".join(c.ljust(w) for c, w in zip(r, widths, strict=True)).rstrip()
                     for r in cut)


# Checkpoints (files in tformer.checkpoint) ------------------------------------------
def load_run(run_dir: str | Path) -> tuple[nn.Module, Task, TrainConfig]:
    """The model (eval mode), task and TrainConfig of a run directory."""
    run_dir = check_run_dir(run_dir)
    try:
        config = TrainConfig(**json.loads((run_dir / "train_config.json").read_text()))
    except (json.JSONDecodeError, TypeError) as e:
        raise ValueError(
            f"RUN_DIR: {run_dir / 'train_config.json'} is not a valid TrainConfig ({e})"
        ) from None
    task = get_task(config.task, config.seed, config.valid_size, config.test_size)
    model_config = TransformerConfig.load(run_dir / "config.json")
    check_fits(model_config, "seq2seq" if task.kind == "seq2seq" else "classifier",
               what=str(run_dir / "config.json"))
    model = (Seq2SeqTransformer if task.kind == "seq2seq" else EncoderClassifier)(model_config)
    load_weights(model, run_dir / "model.safetensors")
    return model.eval(), task, config


# The loop ------------------------------------------------------------------------------
def new_run_dir(task: str) -> Path:
    stamp = time.strftime("%Y%m%d-%H%M%S")
    base = Path("runs") / f"{task}-{stamp}"
    path, i = base, 1
    while path.exists():
        path, i = Path(f"{base}-{i}"), i + 1
    return path


def _append_jsonl(path: Path, record: dict[str, Any]) -> None:
    with path.open("a") as f:
        f.write(json.dumps(record) + "\n")


def train(config: TrainConfig, resume: bool = False, progress: bool = True,
          log=print) -> dict[str, Any]:
    """Train, checkpoint, test; return the test record (also the last line of metrics.jsonl).

    resume: continue the run in `config.out` from its checkpoint.
    """
    if config.threads is not None:
        torch.set_num_threads(config.threads)
    run_dir = Path(config.out) if config.out else new_run_dir(config.task)
    config = config.replace(out=str(run_dir))
    task = get_task(config.task, config.seed, config.valid_size, config.test_size)
    check_fits(config.model_config(task), "seq2seq" if task.kind == "seq2seq" else "classifier",
               training=True, batch=config.batch_size, seq_len=task.max_len, what="model")
    torch.manual_seed(config.seed)
    model = build_model(config, task)
    optimizer = make_optimizer(model, config)
    # Only now, with a valid model, touch the disk: check, create and lock the run dir.
    with open_run_dir(run_dir, resume):  # locked until training ends, however it ends
        return _train(config, task, model, optimizer, resume, progress, log)


def _train(config: TrainConfig, task: Task, model: nn.Module, optimizer: torch.optim.Optimizer,
           resume: bool, progress: bool, log) -> dict[str, Any]:
    from tqdm import tqdm

    started = time.perf_counter()
    run_dir = Path(config.out)
    metrics_path = run_dir / "metrics.jsonl"
    state: dict[str, Any] = {"step": 0, "wall_seconds": 0.0, "schedule": config.schedule}
    if resume:
        state = load_training_state(run_dir, model, optimizer)
        finished = resume_metrics(metrics_path, state, config.steps)
        if finished is not None:
            log(f"{run_dir} already finished at step {state['step']}; its test result:")
            log(_summary(finished, main_metric(task)))
            return finished
    n_params = sum(p.numel() for p in model.parameters())
    log(f"task {task.name}: {task.description}; {n_params:,} parameters; run dir {run_dir}")
    baseline = task.majority_baseline()["accuracy"] if task.kind == "classification" else None
    if baseline is not None:
        log(f"majority-class baseline (test accuracy): {baseline:.3f}")

    key = main_metric(task)
    previous_wall = float(state["wall_seconds"])
    deadline = started + config.max_minutes * 60 if config.max_minutes else math.inf
    # Redraw a few times a second on a terminal; in a log file, every 30 s is plenty.
    bar = tqdm(total=config.steps, initial=state["step"], disable=not progress,
               dynamic_ncols=True, leave=False, mininterval=0.1 if sys.stderr.isatty() else 30)
    meter = _Meter()
    stop_reason = "steps"

    def wall() -> float:
        return previous_wall + time.perf_counter() - started

    while state["step"] < config.steps:
        if time.perf_counter() > deadline:
            stop_reason = "max_minutes"
            break
        batch = task.collate(task.train_batch(state["step"], config.batch_size))
        lr = learning_rate(config, state["step"] + 1)
        loss, acc = train_step(model, optimizer, batch, config, lr)
        state["step"] += 1
        if not math.isfinite(loss):
            bar.close()
            raise ValueError(
                f"loss: expected a finite number, got {loss} at step {state['step']} (lr {lr:.3g});"
                f" stopped, keeping the last good checkpoint in {run_dir}; try a lower --lr"
            )
        meter.add(loss, acc, batch.n_tokens())
        bar.update(1)
        if state["step"] % config.log_every == 0 or state["step"] == config.steps:
            record = {"split": "train", "step": state["step"], **meter.flush(), "lr": lr,
                      "wall_seconds": round(wall(), 2)}
            _append_jsonl(metrics_path, record)
            bar.set_postfix(loss=f"{record['loss']:.3f}", acc=f"{record['accuracy']:.3f}",
                            tok_s=f"{record['tokens_per_second']:.0f}")
        if state["step"] % config.eval_every == 0:
            valid, _ = evaluate(model, task, "validation")
            _append_jsonl(metrics_path, {"split": "validation", "step": state["step"], **valid,
                                         "wall_seconds": round(wall(), 2)})
            bar.write(f"step {state['step']}: validation {key} {valid[key]:.4f} "
                      f"loss {valid['loss']:.4f}")
            state["wall_seconds"] = wall()
            save_checkpoint(run_dir, model, optimizer, config, state, keep=config.keep)
            if config.early_stop is not None and valid[key] >= config.early_stop:
                stop_reason = "early_stop"
                break
    bar.close()
    state["wall_seconds"] = wall()
    state["stopped_by"] = stop_reason
    save_checkpoint(run_dir, model, optimizer, config, state, keep=config.keep)

    test, preds = evaluate(model, task, "test")
    record = {"split": "test", "task": task.name, "step": state["step"], **test,
              "wall_seconds": round(wall(), 2), "stopped_by": stop_reason,
              "parameters": n_params}
    if baseline is not None:
        record["majority_baseline"] = baseline
    log(sample_table(task, task.split("test"), preds))
    log(_summary(record, key))
    _append_jsonl(metrics_path, record)
    plot_curves(metrics_path, run_dir / "curves.png", key)
    log(f"wrote {run_dir}/ (checkpoint, metrics.jsonl, curves.png)")
    return record


def train_step(model: nn.Module, optimizer: torch.optim.Optimizer, batch, config: TrainConfig,
               lr: float) -> tuple[float, float]:
    """One update at learning rate `lr`; returns (loss, accuracy) of the batch."""
    for group in optimizer.param_groups:
        group["lr"] = lr
    model.train()
    loss, acc = forward_loss(model, batch, config.label_smoothing)
    optimizer.zero_grad(set_to_none=True)
    loss.backward()
    if config.clip_grad > 0:
        nn.utils.clip_grad_norm_(model.parameters(), config.clip_grad)
    optimizer.step()
    return loss.item(), acc


class _Meter:
    """Averages of the training loss and accuracy, and tokens per second, since the last flush."""

    def __init__(self) -> None:
        self.reset()

    def reset(self) -> None:
        self.loss = self.acc = 0.0
        self.n = self.tokens = 0
        self.t0 = time.perf_counter()

    def add(self, loss: float, acc: float, tokens: int) -> None:
        self.loss, self.acc = self.loss + loss, self.acc + acc
        self.n, self.tokens = self.n + 1, self.tokens + tokens

    def flush(self) -> dict[str, float]:
        seconds = max(time.perf_counter() - self.t0, 1e-9)
        out = {"loss": self.loss / max(self.n, 1), "accuracy": self.acc / max(self.n, 1),
               "tokens_per_second": self.tokens / seconds}
        self.reset()
        return out


def _summary(record: dict[str, Any], key: str) -> str:
    done = f"after {record['step']} steps, {record['wall_seconds']:.1f} s"
    if key == "exact_match":
        return (f"test exact_match: {record['exact_match']:.4f} "
                f"(token accuracy {record['accuracy']:.4f}) {done}")
    return (f"test accuracy: {record['accuracy']:.4f} "
            f"(majority baseline {record['majority_baseline']:.4f}) {done}")


def plot_curves(metrics_path: Path, png_path: Path, key: str) -> None:
    """Training loss and validation metric against steps, side by side."""
    import matplotlib

    matplotlib.use("Agg")  # no display needed
    import matplotlib.pyplot as plt

    records = [json.loads(line) for line in metrics_path.read_text().splitlines() if line]
    train_r = [r for r in records if r["split"] == "train"]
    valid_r = [r for r in records if r["split"] == "validation"]
    fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(10, 4))
    ax1.plot([r["step"] for r in train_r], [r["loss"] for r in train_r],
             label="train (with label smoothing)")
    ax1.plot([r["step"] for r in valid_r], [r["loss"] for r in valid_r], "o-", label="validation")
    ax1.set(xlabel="step", ylabel="loss", yscale="log", title="loss")
    ax1.legend()
    ax2.plot([r["step"] for r in train_r], [r["accuracy"] for r in train_r],
             label="train " + ("token accuracy (teacher-forced)" if key == "exact_match"
                               else "accuracy"))
    ax2.plot([r["step"] for r in valid_r], [r[key] for r in valid_r], "o-",
             label=f"validation {key}")
    ax2.set(xlabel="step", ylabel="accuracy", ylim=(0, 1.02), title="accuracy")
    ax2.legend(loc="lower right")
    fig.tight_layout()
    buffer = io.BytesIO()
    fig.savefig(buffer, format="png", dpi=100)
    plt.close(fig)
    write_atomic(png_path, buffer.getvalue())
