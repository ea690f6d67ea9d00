"""One update: the optimizer, a training step, and the same step on a throwaway model for timing
(what a plan measures before it chooses).

Every step runs on the model's device (tformer.nn.devices): its batches are moved there (pinned and
without blocking, to a GPU), and 16-bit autocast (``bf16``) computes in bfloat16, or in float16
with a GradScaler on a CUDA GPU without bf16 units (``half_dtype``). With ``--tf32`` the fp32
matrix products of the forward and backward run in TF32 where the device has it
(tformer.nn.kernels.tf32: NVIDIA GPUs of compute capability 8.0+; elsewhere nothing changes).

With ``TFORMER_COMPILE=1`` the loss (the model's forward and the objective's loss, and so their
backward) runs compiled by torch.compile (tformer.nn.kernels.compiling): on a GPU a step of a
BERT-base is bound by its kernel launches, which compiling fuses. Opt-in only, never chosen by
itself: its compilation (a minute or more) would come out of a timed run's budget, which the plan
does not count. A compilation that fails is said once, and the run goes on eagerly. The probes
that time steps for the plan stay eager.
"""

from __future__ import annotations

import time

import torch
from torch import nn

from tformer.nn.devices import half_dtype, model_device, needs_grad_scaler, synchronize
from tformer.nn.kernels import compiling
from tformer.nn.kernels.tf32 import tf32
from tformer.training.distributed import average_gradients, sum_over_ranks


def make_optimizer(model: nn.Module, config) -> torch.optim.AdamW:
    # No weight decay on biases, LayerNorm gains and embeddings' 1-d cousins: decaying
    # them toward 0 only fights the normalisation.
    decay = [p for p in model.parameters() if p.dim() >= 2]
    no_decay = [p for p in model.parameters() if p.dim() < 2]
    groups = [{"params": decay, "weight_decay": config.weight_decay},
              {"params": no_decay, "weight_decay": 0.0}]
    # Adam betas and eps of Vaswani et al. 2017, §5.3; fine-tuning uses BERT's (0.999, 1e-6).
    betas, eps = ((0.9, 0.999), 1e-6) if config.from_pretrained else ((0.9, 0.98), 1e-9)
    # fused: one kernel for all parameters, on their device (several times faster on CPU than the
    # loop; on CUDA one launch instead of several per parameter). A device torch has no fused
    # AdamW for (MPS before torch 2.5) takes the foreach kernels.
    try:
        return torch.optim.AdamW(groups, lr=config.lr, betas=betas, eps=eps, fused=True)
    except RuntimeError:
        return torch.optim.AdamW(groups, lr=config.lr, betas=betas, eps=eps, foreach=True)


def in_precision(device: torch.device, half: bool):
    """The autocast a run's updates take (16-bit where `half`: ``half_dtype``), and so its
    validations and its test: scored in fp32 beside bf16 updates, a fine-tune's validation ran
    2x slower an example than in bf16 (the same accuracy; the loss 1e-4 apart), and its probe
    sized the sample at a fifth of the plan's."""
    return torch.autocast(device.type, dtype=half_dtype(device), enabled=half)


def grad_scaler(model: nn.Module, bf16: bool) -> torch.amp.GradScaler | None:
    """fp16 autocast's loss scaler (a CUDA GPU without bf16 units), else None."""
    device = model_device(model)
    return torch.amp.GradScaler(device.type) if needs_grad_scaler(device, bf16) else None


def train_step(model: nn.Module, optimizer: torch.optim.Optimizer, objective, batches, config,
               lr: float, world: int = 1, bf16: bool = False,
               scaler: torch.amp.GradScaler | None = None,
               warm: list[float] | None = None) -> tuple[float, float, int, int]:
    """One update at learning rate `lr` from `config.accumulate` batches; returns the mean
    (loss, accuracy) of the batches, their token count and their example count. ``bf16``: 16-bit
    autocast (module docstring); ``scaler``: fp16's (``grad_scaler``). ``warm``: the first
    batch is first passed forward and backward once more (``warm_pass``), and the seconds that
    took are appended to it, so that the update's own time is that of kernels already made."""
    for group in optimizer.param_groups:
        group["lr"] = lr
    model.train()
    optimizer.zero_grad(set_to_none=True)
    device = model_device(model)
    total_loss = total_acc = 0.0
    tokens = examples = 0
    for micro in range(config.accumulate):
        batch = next(batches)
        tokens += batch.n_tokens()  # counted on the host, before the copy: no device sync
        examples += batch.n_examples()
        batch = batch.to(device)
        if warm is not None and micro == 0:
            warm.append(warm_pass(model, optimizer, objective, batch, config, bf16))
        with tf32(device, getattr(config, "tf32", False)):
            with in_precision(device, bf16):
                loss, acc = _loss(objective, model, batch, config.label_smoothing, device)
            scaled = loss / config.accumulate if config.accumulate > 1 else loss
            (scaler.scale(scaled) if scaler is not None else scaled).backward()
        total_loss, total_acc = total_loss + loss.item(), total_acc + acc
    if world > 1:
        average_gradients(model, world)
        total_loss, total_acc, tokens = sum_over_ranks([total_loss / world, total_acc / world, tokens])
    if scaler is not None:
        scaler.unscale_(optimizer)  # clip the true gradients
    if config.clip_grad > 0:
        nn.utils.clip_grad_norm_(model.parameters(), config.clip_grad)
    if scaler is not None:
        scaler.step(optimizer)  # skipped where a gradient overflowed; the scale then shrinks
        scaler.update()
    else:
        optimizer.step()
    return total_loss / config.accumulate, total_acc / config.accumulate, int(tokens), examples


def warm_pass(model: nn.Module, optimizer: torch.optim.Optimizer, objective, batch, config,
              bf16: bool) -> float:
    """Seconds of a forward and backward of `batch` whose gradients are dropped and whose random
    draws (dropout, masking) are given back: the update that follows is what it would have been
    without it, and finds the kernels of its shapes made. oneDNN makes a 16-bit kernel for each
    new shape: on an Intel Xeon with AMX a run's first bf16 updates took 1.6x its steady ones
    (141 ms a step against 88 for d_model 384 x 4 layers) where fp32's took ~1.05x, so timed on
    new shapes 16 bits looked 1.3x faster where they were 1.9x (tformer.training.first_steps)."""
    device = model_device(model)
    start = time.perf_counter()
    with torch.random.fork_rng(devices=[device] if device.type == "cuda" else []):
        with tf32(device, getattr(config, "tf32", False)):
            with in_precision(device, bf16):
                loss, _ = _loss(objective, model, batch, config.label_smoothing, device)
            loss.backward()
    optimizer.zero_grad(set_to_none=True)
    synchronize(device)
    return time.perf_counter() - start


_COMPILED_LOSS = "train-loss"
_compiled_losses: dict[int, tuple[object, object]] = {}  # id(objective) -> (objective, its compiled loss)


def _loss(objective, model: nn.Module, batch, label_smoothing: float, device: torch.device):
    """objective.loss(model, batch, label_smoothing), compiled where TFORMER_COMPILE=1 asks for
    it (module docstring), else as it is."""
    if (compiling.mode() != "on" or _COMPILED_LOSS in compiling.summary()
            or compiling.why_not_compiled(device) is not None):
        return objective.loss(model, batch, label_smoothing)
    held, compiled = _compiled_losses.get(id(objective), (None, None))
    if held is not objective:  # (the objective is held too: its id cannot be reused meanwhile)
        compiled = torch.compile(objective.loss, dynamic=True, backend=compiling.BACKEND)
        _compiled_losses[id(objective)] = (objective, compiled)
    try:
        return compiled(model, batch, label_smoothing)
    except Exception as e:  # raised before any update: this batch runs eagerly, and the rest
        compiling.record_failure(_COMPILED_LOSS, e)
        return objective.loss(model, batch, label_smoothing)


def probe_step(config, bf16: bool, device: torch.device):
    """`step(model, batch, objective)`: one update of a throwaway model, as train_step does it,
    on the run's device (the model is moved there on its first step), timed to its end there."""
    # by model: each model kept alive here, so that no later model reuses its id
    optimizers: dict[int, tuple[nn.Module, torch.optim.Optimizer, torch.amp.GradScaler | None]] = {}

    def step(model: nn.Module, batch, objective) -> None:
        if id(model) not in optimizers:
            model.to(device)
            optimizers[id(model)] = (model, make_optimizer(model, config), grad_scaler(model, bf16))
        _, optimizer, scaler = optimizers[id(model)]
        optimizer.zero_grad(set_to_none=True)
        with tf32(device, getattr(config, "tf32", False)):
            with torch.autocast(device.type, dtype=half_dtype(device), enabled=bf16):
                loss, _ = objective.loss(model, batch.to(device), config.label_smoothing)
            (scaler.scale(loss) if scaler is not None else loss).backward()
        if scaler is not None:
            scaler.step(optimizer)
            scaler.update()
        else:
            optimizer.step()
        synchronize(device)  # the caller times steps: a GPU's must have finished

    return step
