"""Train on a synthetic task with the NumPy reference only: torch is never imported.

    tformer train --task reverse --engine numpy
    train(resolve_config({"task": "reverse"}))     # the same from Python (tformer.training.config)

The run is the one tformer.training makes, computed in NumPy: the same TrainConfig and
presets, the same batches (batch k depends only on (seed, k)), the same schedule,
label-smoothed loss, AdamW (Vaswani et al. 2017, §5.3: betas 0.9/0.98, eps 1e-9; no decay
on 1-d parameters), gradient clipping, dropout and initialisation distributions (not the
same random draws: torch's generator is not NumPy's). Each step is

    logits, cache = model.forward_train(batch, rng)        # keeps what backward needs
    loss, loss_cache = cross_entropy(logits, labels)
    model.backward(cross_entropy_backward(loss_cache), cache, grads)
    clip_grad_norm_(grads); optimizer.step(grads, lr)

The run directory holds what the PyTorch side reads (`tformer eval RUN`, `tformer
generate RUN`): config.json, model.safetensors (the same keys), train_config.json and
metrics.jsonl. Not written: the optimizer state (a NumPy run cannot be resumed) and
curves.png. As the PyTorch trainer's, the directory is checked, created and locked
(tformer.storage.rundir: a second run on it is refused in the same one line), and each save
writes model.safetensors last, each file atomically: a run killed at any moment holds a whole
model that loads, or none, and then starts again with the same command.
"""

from __future__ import annotations

import contextlib
import math
import time
from pathlib import Path
from typing import Any

import numpy as np
from safetensors.numpy import save

from tformer.errors import FieldError
from tformer.reference.generate import greedy_search
from tformer.reference.loss import cross_entropy, cross_entropy_backward
from tformer.reference.model import EncoderClassifier, Seq2SeqTransformer
from tformer.reference.module import Embedding, LayerNorm, Linear, Module
from tformer.reference.optim import AdamW, clip_grad_norm_
from tformer.reference.positional import LearnedPositionalEmbedding
from tformer.storage.files import json_bytes, new_run_dir, write_atomic
from tformer.storage.rundir import append_jsonl, check_unlocked, open_run_dir
from tformer.training.config import TrainConfig
from tformer.training.schedule import learning_rate
from tformer.training.tasks import Example, SequenceTask, Task, get_task
from tformer.training.tasks.tokenizer import PAD

TOKEN_TABLES = ("tok_emb", "src_emb", "tgt_emb")  # scaled by sqrt(D) in the forward (§3.4)


# Model, initialisation, optimizer ---------------------------------------------------------
def build_model(config: TrainConfig, task: Task, dtype=np.float32) -> Module:
    model = Seq2SeqTransformer if isinstance(task, SequenceTask) else EncoderClassifier
    return model(config.task_model(task), dtype)


def init_weights(model: Module, rng: np.random.Generator) -> None:
    """The distributions the PyTorch modules start from (tformer.nn.model, torch.nn defaults):
    Linear weight and bias U(-1/sqrt(in), 1/sqrt(in)); LayerNorm 1 and 0; token tables
    N(0, D^-1/2) when scaled by sqrt(D) (so the scaled input has unit variance), else
    N(0, 0.02); learned positions and token types N(0, 0.02) (BERT's)."""
    config = model.config
    for key, module, attr in model._slots():
        p = getattr(module, attr)
        name = key.rsplit(".", 2)[-2] if "." in key else ""
        if isinstance(module, Linear):
            bound = 1.0 / math.sqrt(module.weight.shape[1])
            p[...] = rng.uniform(-bound, bound, p.shape)
        elif isinstance(module, LayerNorm):
            p[...] = 1.0 if attr == "weight" else 0.0
        elif isinstance(module, LearnedPositionalEmbedding):
            p[...] = rng.normal(0.0, 0.02, p.shape)
        elif isinstance(module, Embedding) and name in TOKEN_TABLES:
            std = config.d_model**-0.5 if config.scale_embeddings else 0.02
            p[...] = rng.normal(0.0, std, p.shape)
        elif isinstance(module, Embedding):
            p[...] = rng.normal(0.0, 0.02, p.shape)
        else:
            raise TypeError(f"init_weights: no rule for {key} ({type(module).__name__})")


def make_optimizer(model: Module, config: TrainConfig) -> AdamW:
    # As tformer.training.steps.make_optimizer: no weight decay on biases and LayerNorm gains.
    params = model.state_dict()
    decay = {k: config.weight_decay if p.ndim >= 2 else 0.0 for k, p in params.items()}
    return AdamW(params, lr=config.lr, betas=(0.9, 0.98), eps=1e-9, weight_decay=decay)


# One step ------------------------------------------------------------------------------
def forward_loss(model: Module, batch, label_smoothing: float = 0.0, rng=None):
    """Teacher-forced loss -> (loss, accuracy, cache for backward_loss)."""
    if hasattr(batch, "src"):  # a Seq2SeqBatch; else a ClassificationBatch
        logits, cache = model.forward_train(batch.src, batch.tgt_in, batch.src_mask,
                                            batch.tgt_mask, rng)  # (B, T, V)
        loss, loss_cache = cross_entropy(logits, batch.labels, ignore_index=PAD,
                                         label_smoothing=label_smoothing)
        real = batch.labels != PAD
        acc = float(((logits.argmax(-1) == batch.labels) & real).sum() / max(real.sum(), 1))
    else:
        logits, cache = model.forward_train(batch.input_ids, batch.attention_mask, rng=rng)
        loss, loss_cache = cross_entropy(logits, batch.labels, label_smoothing=label_smoothing)
        acc = float((logits.argmax(-1) == batch.labels).mean())
    return loss, acc, (cache, loss_cache)


def train_step(model: Module, optimizer: AdamW, batch, config: TrainConfig, lr: float,
               rng: np.random.Generator) -> tuple[float, float]:
    """One update at learning rate `lr`; returns (loss, accuracy) of the batch."""
    loss, acc, (cache, loss_cache) = forward_loss(model, batch, config.label_smoothing, rng)
    grads = model.zero_grads()
    model.backward(cross_entropy_backward(loss_cache), cache, grads)
    if config.clip_grad > 0:
        clip_grad_norm_(grads, config.clip_grad)
    optimizer.step(grads, lr)
    return loss, acc


# Evaluation ----------------------------------------------------------------------------
def predict(model: Module, task: Task, examples: list[Example], batch_size: int = 250) -> list:
    """Greedy outputs (seq2seq) or class ids (classification), one per example."""
    out: list = []
    for i in range(0, len(examples), batch_size):
        batch = task.collate_arrays(examples[i : i + batch_size])
        if isinstance(task, SequenceTask):
            gen = greedy_search(model, batch.src, batch.src_mask,
                                max_len=task.max_target_tokens + 1)
            out += gen.tolist()
        else:
            out += model(batch.input_ids, batch.attention_mask).logits.argmax(-1).tolist()
    return out


def evaluate(model: Module, task: Task, split: str) -> tuple[dict[str, float], list]:
    """Metrics on a held-out split (greedy generation for seq2seq), plus the predictions."""
    examples = task.split(split)
    preds = predict(model, task, examples)
    metrics = task.score(preds, examples)
    metrics["loss"] = forward_loss(model, task.collate_arrays(examples[:500]))[0]  # unsmoothed
    return metrics, preds


# The run directory -----------------------------------------------------------------------
def save_run(run_dir: Path, model: Module, config: TrainConfig, step: int) -> None:
    """config.json, train_config.json, then model.safetensors (keys as the PyTorch model's): the
    weights last, so that a directory holding them holds the other two (which never change during
    a run) and loads; before them, it is a run that never saved (check_run_dir, open_run_dir)."""
    write_atomic(run_dir / "config.json", json_bytes(model.config.to_dict()))
    write_atomic(run_dir / "train_config.json", json_bytes(config.to_dict()))
    weights = {k: np.ascontiguousarray(v) for k, v in model.state_dict().items()}
    write_atomic(run_dir / "model.safetensors", save(weights, metadata={"step": str(step)}))


# The loop ------------------------------------------------------------------------------
def blas_threads(n: int | None):
    """Limit NumPy's BLAS to `n` threads (None: its default) for the `with` block.

    On a busy machine this matters more than anything else here: a BLAS thread that waits
    for a core spins, and one step took 6x longer with 2 threads than with 1 on 2 shared cores.
    """
    if n is None:
        return contextlib.nullcontext()
    try:  # a dependency, but the engine runs without it when --threads is not given
        from threadpoolctl import threadpool_limits
    except ImportError:
        raise FieldError("threads", "the numpy engine sets BLAS threads with threadpoolctl "
                         "(pip install threadpoolctl), which is not installed") from None
    return threadpool_limits(limits=n, user_api="blas")


def train(config: TrainConfig, progress: bool = True, log=print,
          dtype=np.float32) -> dict[str, Any]:
    """Train, checkpoint, test; return the test record (also the last line of metrics.jsonl).

    `config.threads` sets the BLAS threads (see blas_threads). The run directory (`config.out`,
    else a new one under runs/) is locked while the run writes in it."""
    run_dir = Path(config.out) if config.out else new_run_dir(f"{config.task}-numpy")
    check_unlocked(run_dir)  # in use: the PyTorch trainer's refusal, before ours of its checkpoint
    if (run_dir / "model.safetensors").exists():
        raise FieldError("out", f"{run_dir} already holds a checkpoint; choose another --out")
    with blas_threads(config.threads), open_run_dir(run_dir, resume=False):
        return _train(config.replace(out=str(run_dir)), progress, log, dtype)


def _train(config: TrainConfig, progress: bool, log, dtype) -> dict[str, Any]:
    started = time.perf_counter()
    run_dir = Path(config.out)
    metrics_path = run_dir / "metrics.jsonl"  # (open_run_dir removed an unfinished run's)
    task = get_task(config.task, config.seed, config.valid_size, config.test_size)
    model = build_model(config, task, dtype)
    init_weights(model, np.random.default_rng(config.seed))
    dropout_rng = np.random.default_rng([config.seed, 1])
    optimizer = make_optimizer(model, config)
    n_params = sum(p.size for p in model.state_dict().values())
    log(f"task {task.name}: {task.description}; {n_params:,} parameters; NumPy engine "
        f"({np.dtype(dtype).name}); run dir {run_dir}")
    key = task.main_metric
    deadline = started + config.max_minutes * 60 if config.max_minutes else math.inf
    step, stop_reason = 0, "steps"
    sums = {"loss": 0.0, "accuracy": 0.0, "n": 0, "tokens": 0, "t0": time.perf_counter()}
    while step < config.steps:
        if time.perf_counter() > deadline:
            stop_reason = "max_minutes"
            break
        batch = task.collate_arrays(task.train_batch(step, config.batch_size))
        lr = learning_rate(config, step + 1)
        loss, acc = train_step(model, optimizer, batch, config, lr, dropout_rng)
        step += 1
        sums["loss"] += loss
        sums["accuracy"] += acc
        sums["n"] += 1
        sums["tokens"] += batch.n_tokens()
        if step % config.log_every == 0 or step == config.steps:
            seconds = max(time.perf_counter() - sums["t0"], 1e-9)
            record = {"split": "train", "step": step, "loss": sums["loss"] / sums["n"],
                      "accuracy": sums["accuracy"] / sums["n"],
                      "tokens_per_second": sums["tokens"] / seconds, "lr": lr,
                      "wall_seconds": round(time.perf_counter() - started, 2)}
            append_jsonl(metrics_path, record)
            if progress:
                log(f"step {step}: train loss {record['loss']:.4f} acc {record['accuracy']:.4f} "
                    f"({record['tokens_per_second']:.0f} tok/s)")
            sums = {"loss": 0.0, "accuracy": 0.0, "n": 0, "tokens": 0, "t0": time.perf_counter()}
        if step % config.eval_every == 0:
            valid, _ = evaluate(model, task, "validation")
            append_jsonl(metrics_path, {"split": "validation", "step": step, **valid,
                                         "wall_seconds": round(time.perf_counter() - started, 2)})
            log(f"step {step}: validation {key} {valid[key]:.4f} loss {valid['loss']:.4f}")
            save_run(run_dir, model, config, step)
            if config.early_stop is not None and valid[key] >= config.early_stop:
                stop_reason = "early_stop"
                break
    save_run(run_dir, model, config, step)
    test, preds = evaluate(model, task, "test")
    record = {"split": "test", "task": task.name, "step": step, **test,
              "wall_seconds": round(time.perf_counter() - started, 2), "stopped_by": stop_reason,
              "parameters": n_params, "engine": "numpy"}
    append_jsonl(metrics_path, record)
    log(f"test {key}: {test[key]:.4f} after {step} steps, {record['wall_seconds']:.1f} s")
    log(f"wrote {run_dir}/ (config.json, model.safetensors, train_config.json, metrics.jsonl)")
    return record

