"""One update: the optimizer, a training step, and the same step on a throwaway model for timing
(what a plan measures before it chooses)."""

from __future__ import annotations

import torch
from torch import nn

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
    # fused: one kernel for all parameters (several times faster on CPU than the loop).
    return torch.optim.AdamW(groups, lr=config.lr, betas=betas, eps=eps, fused=True)


def train_step(model: nn.Module, optimizer: torch.optim.Optimizer, objective, batches, config,
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
            loss, acc = objective.loss(model, batch, config.label_smoothing)
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


def probe_step(config, bf16: bool):
    """`step(model, batch, objective)`: one update of a throwaway model, as train_step does it."""
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
