"""A fine-tune's new head, fitted before its first update: a linear probe (LP-FT).

A fine-tune adds a head to a pretrained encoder. Started random (transformers: normal, std
0.02), its first updates teach the head through features those same updates change, and a
budget of minutes spends a good share of its updates there: a 1-minute fine-tune of
all-MiniLM-L6-v2 on 6 man-page sections tested 0.43 (the majority class's share), where a
logistic regression on the model's own frozen features of 512 training examples, fitted in
well under a second after ~5 s of forward passes, tests 0.80. So the head is fitted to the
features first and the fine-tune starts from it (Kumar et al. 2022, "Fine-Tuning can Distort
Pretrained Features and Underperform Out-of-Distribution": linear probing, then fine-tuning).

    n, why = sizing.probe_plan(training_seconds, example_seconds, train_examples)   # the plan's
    fit_head(objective, model, n, device, half, log)                              # before step 1

The features are what the head reads (``EncoderClassifier.features``: pooled, before its
dropout), of the first batches of the training stream (the batches the first updates take), in
eval mode and the run's precision. The fit itself is the kind's (``Objective.fit_head``; a
classifier's: ``softmax_head``). Drawing nothing from the random generators, the probe leaves
the run's batches, dropout and data order as they were.
"""

from __future__ import annotations

import time
from collections.abc import Callable

import torch
from torch import Tensor, nn

from tformer.training.objective import Objective, evaluating
from tformer.training.steps import in_precision

L2_GRID = (1e-4, 1e-3, 1e-2, 1e-1)  # on standardized features, chosen on a held-out fifth
HELD_OUT = 5  # every 5th example of the sample scores the grid's fits
FIT_ITERATIONS = 200  # L-BFGS iterations a fit, at most


def fit_head(objective: Objective, model: nn.Module, examples: int, device: torch.device,
             half: bool, log: Callable[[str], None]) -> bool:
    """Fit `model`'s new head to the features of the training stream's first `examples`
    examples (the kind's ``fit_head``) and log a line of it; whether it did (none: 0 examples)."""
    if examples <= 0:
        return False
    t = time.perf_counter()
    features, targets = training_features(objective, model, examples, device, half)
    note = objective.fit_head(model, features, targets)
    log(f"head: {note}, on {len(features):,} training examples' features ({time.perf_counter() - t:.1f} s)")
    return True


def training_features(objective: Objective, model: nn.Module, examples: int, device: torch.device,
                      half: bool) -> tuple[Tensor, Tensor]:
    """((N, width) float64 features, (N,) targets) on the CPU: the head's input for the first
    `examples` rows of the training stream (a long text read in windows: a row each, as it trains)."""
    batches = objective.train_batches(0)
    rows: list[Tensor] = []
    targets: list[Tensor] = []
    n = 0
    with evaluating(model), in_precision(device, half):
        while n < examples:
            batch = next(batches).to(device)
            pooled = model.features(batch.input_ids, batch.attention_mask, batch.token_type_ids)  # (B, width)
            rows.append(pooled.float().cpu())
            targets.append(batch.labels.cpu())
            n += len(rows[-1])
    return torch.cat(rows)[:examples].double(), torch.cat(targets)[:examples]


def softmax_head(features: Tensor, labels: Tensor, classes: int) -> tuple[Tensor, Tensor, str]:
    """(weight (C, D), bias (C,), what was fitted) of the multinomial logistic regression of
    `labels` (N,) on `features` (N, D): each feature standardized over the sample, the L2
    penalty of L2_GRID that scores best on a held-out fifth (the larger on a tie), fitted
    again on all N and folded back to the raw features (logits = features @ weight.T + bias)."""
    x = features.double()
    mean, std = x.mean(0), x.std(0)
    std = std.clamp_min(1e-3 * float(std.max()) + 1e-12)  # (a constant feature: not divided by 0)
    z = (x - mean) / std
    held = torch.arange(len(z)) % HELD_OUT == HELD_OUT - 1
    best, l2 = -1.0, L2_GRID[-1]
    if held.any() and (~held).any():
        for penalty in L2_GRID:
            w, b = logistic(z[~held], labels[~held], classes, penalty)
            score = float(((z[held] @ w.T + b).argmax(-1) == labels[held]).double().mean())
            if score >= best:
                best, l2 = score, penalty
    w, b = logistic(z, labels, classes, l2)
    weight = w / std  # (C, D)
    bias = b - weight @ mean
    held_note = f", {best:.2f} accurate on a fifth held out" if best >= 0 else ""
    return weight.float(), bias.float(), f"a linear probe (L2 {l2:g}{held_note})"


def logistic(z: Tensor, labels: Tensor, classes: int, l2: float) -> tuple[Tensor, Tensor]:
    """(weight (C, D), bias (C,)) minimising mean cross-entropy + l2 * |weight|^2 (the bias
    unpenalised, as scikit-learn's LogisticRegression with C = 1 / (2 l2 N)), float64, L-BFGS
    from zero (deterministic)."""
    w = torch.zeros(classes, z.shape[1], dtype=torch.float64, requires_grad=True)
    b = torch.zeros(classes, dtype=torch.float64, requires_grad=True)
    optimizer = torch.optim.LBFGS([w, b], max_iter=FIT_ITERATIONS, tolerance_grad=1e-9,
                                  tolerance_change=1e-12, line_search_fn="strong_wolfe")
    y = labels.long()

    def closure() -> Tensor:
        optimizer.zero_grad()
        loss = nn.functional.cross_entropy(z @ w.T + b, y) + l2 * w.square().sum()
        loss.backward()
        return loss

    with torch.enable_grad():
        optimizer.step(closure)
    return w.detach(), b.detach()
