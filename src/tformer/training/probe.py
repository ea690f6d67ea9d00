"""A fine-tune's new head, fitted before its first update: a linear probe (LP-FT).

A fine-tune adds a head to a pretrained encoder. Started random (transformers: normal, std
0.02), its first updates teach the head through features those same updates change, and a
budget of minutes spends a good share of its updates there: fine-tunes of all-MiniLM-L6-v2 on
6 man-page sections tested 0.53 at half a minute and 0.75 at one (the majority class: 0.43),
where a logistic regression on the model's own frozen features of 512 training examples alone
tests 0.80. So the head is fitted to the features first and the fine-tune starts from it
(Kumar et al. 2022, "Fine-Tuning can Distort Pretrained Features and Underperform
Out-of-Distribution": linear probing, then fine-tuning): 0.73 and 0.84 (benchmarks/README.md).

    n, why = sizing.probe_plan(training_seconds, example_seconds, train_examples)   # the plan's
    fit_head(objective, model, n, device, half, log)                              # before step 1

The features are what the head reads (``Objective.head_inputs``: a classifier's pooled
features before its dropout, ``EncoderClassifier.pooled``; a tagger's labelled sub-words), of
the first batches of the training stream (the batches the first updates take), in eval mode and
the run's precision. The fit is the kind's (``Objective.fit_head``: ``fit_softmax`` over
classes, ``fit_sigmoid`` per label). Drawing nothing from the random generators, the probe
leaves the run's batches, dropout and data order as they were.
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
ROWS_MAX = 4096  # rows a fit reads, at most (a tagger's: a row each labelled token)


def fit_head(objective: Objective, model: nn.Module, examples: int, device: torch.device,
             half: bool, log: Callable[[str], None]) -> bool:
    """Fit `model`'s new head to the features of the training stream's first `examples`
    examples (the kind's ``fit_head``) and log a line of it; whether it did (not for 0 examples,
    nor where they hold nothing to fit)."""
    if examples <= 0:
        return False
    t = time.perf_counter()
    features, targets, seen = training_features(objective, model, examples, device, half)
    note = objective.fit_head(model, features, targets)
    if note is None:
        log(f"head: random (nothing to fit in the {seen:,} training examples read: one class, or no "
            "label both held and missed)")
        return False
    rows = "" if len(features) == seen else f" ({len(features):,} rows)"
    log(f"head: {note}, on {seen:,} training examples' features{rows}, {time.perf_counter() - t:.1f} s")
    return True


def training_features(objective: Objective, model: nn.Module, examples: int, device: torch.device,
                      half: bool) -> tuple[Tensor, Tensor, int]:
    """((N, width) float64 features, (N, ...) targets, examples read) on the CPU: what the head
    reads, and learns, in the training stream's first batches, until they held `examples`
    examples (Objective.head_inputs: a row an example, or a window of a long text read in
    windows, or a tagger's labelled token), at most ROWS_MAX rows."""
    batches = objective.train_batches(0)
    rows: list[Tensor] = []
    targets: list[Tensor] = []
    seen = 0
    with evaluating(model), in_precision(device, half):
        while seen < examples:
            batch = next(batches).to(device)
            features, wanted = objective.head_inputs(model, batch)  # (N, width), (N, ...)
            rows.append(features.float().cpu())
            targets.append(wanted.cpu())
            seen += len(batch.input_ids)
    return torch.cat(rows)[:ROWS_MAX].double(), torch.cat(targets)[:ROWS_MAX], seen


def fit_softmax(head: nn.Linear, features: Tensor, labels: Tensor) -> str | None:
    """Set `head` (a class's logit an output) to ``softmax_head`` of the class ids; what was
    fitted, or None where the sample holds fewer than two classes (the head is left as it was)."""
    seen = torch.bincount(labels.long(), minlength=head.out_features) > 0  # (C,)
    if int(seen.sum()) < 2:
        return None
    weight, bias, what = softmax_head(features, labels, head.out_features)
    set_head(head, weight, bias, seen)
    return what


def fit_sigmoid(head: nn.Linear, features: Tensor, targets: Tensor, pos_weight: Tensor | None) -> str | None:
    """Set `head` (a label's logit an output) to ``sigmoid_head`` of the multi-hot targets; None
    where no label is both held and missed in the sample (the head is left as it was)."""
    held = targets.sum(0)  # (C,)
    seen = (held > 0) & (held < len(targets))
    if not bool(seen.any()):
        return None
    weight, bias, what = sigmoid_head(features, targets, pos_weight)
    set_head(head, weight, bias, seen)
    return what


def set_head(head: nn.Linear, weight: Tensor, bias: Tensor, seen: Tensor) -> None:
    """A fitted head's rows into the model's (its dtype and device), those of the outputs `seen`
    (C,) in the sample only: an unpenalised bias of an output the sample never shows (a class
    absent, a label never held or always held) only grows with the fit's iterations, and the
    output keeps the start it had (random; a multi-label run's prior)."""
    with torch.no_grad():
        head.weight[seen] = weight[seen].to(head.weight)
        head.bias[seen] = bias[seen].to(head.bias)


def softmax_head(features: Tensor, labels: Tensor, classes: int) -> tuple[Tensor, Tensor, str]:
    """(weight (C, D), bias (C,), what was fitted) of the multinomial logistic regression of
    `labels` (N,) on `features` (N, D) (``fitted``: standardized, its penalty chosen on a
    held-out fifth by accuracy)."""
    def accuracy(logits: Tensor, y: Tensor) -> float:
        return float((logits.argmax(-1) == y).double().mean())

    def fit(z: Tensor, y: Tensor, l2: float) -> tuple[Tensor, Tensor]:
        return logistic(z, y, classes, l2)

    weight, bias, l2, best = fitted(features, labels, fit, accuracy)
    held = f", {best:.2f} accurate on a fifth held out" if best is not None else ""
    return weight, bias, f"a linear probe (L2 {l2:g}{held})"


def sigmoid_head(features: Tensor, targets: Tensor, pos_weight: Tensor | None = None
                 ) -> tuple[Tensor, Tensor, str]:
    """(weight (C, D), bias (C,), what was fitted) of C logistic regressions, one a label, of
    the multi-hot `targets` (N, C) on `features` (N, D), each positive weighted by `pos_weight`
    (C,) as the run's loss weighs it (``fitted``: its penalty chosen on a held-out fifth by
    that loss)."""
    def minus_loss(logits: Tensor, y: Tensor) -> float:
        return -float(binary_loss(logits, y, pos_weight))

    def fit(z: Tensor, y: Tensor, l2: float) -> tuple[Tensor, Tensor]:
        return logistic(z, y, targets.shape[1], l2, pos_weight)

    weight, bias, l2, best = fitted(features, targets.double(), fit, minus_loss)
    held = f", loss {-best:.3f} on a fifth held out" if best is not None else ""
    return weight, bias, f"a linear probe, a logistic regression per label (L2 {l2:g}{held})"


def fitted(features: Tensor, targets: Tensor, fit: Callable, score: Callable[[Tensor, Tensor], float]
           ) -> tuple[Tensor, Tensor, float, float | None]:
    """(weight (C, D), bias (C,), the penalty, its held-out score or None) of `fit` (z, targets,
    l2) -> (w, b) on `features` (N, D): each feature standardized over the sample, the L2
    penalty of L2_GRID whose fit on four fifths scores best on the fifth held out (`score`:
    higher is better; the larger penalty on a tie), fitted again on all N and folded back to
    the raw features (logits = features @ weight.T + bias)."""
    x = features.double()
    mean, std = x.mean(0), x.std(0)
    std = std.clamp_min(1e-3 * float(std.max()) + 1e-12)  # (a constant feature: not divided by 0)
    z = (x - mean) / std
    held = torch.arange(len(z)) % HELD_OUT == HELD_OUT - 1
    best, l2 = None, L2_GRID[-1]
    if held.any() and (~held).any():
        for penalty in L2_GRID:
            w, b = fit(z[~held], targets[~held], penalty)
            value = score(z[held] @ w.T + b, targets[held])
            if best is None or value >= best:
                best, l2 = value, penalty
    w, b = fit(z, targets, l2)
    weight = w / std  # (C, D)
    return weight.float(), (b - weight @ mean).float(), l2, best


def binary_loss(logits: Tensor, targets: Tensor, pos_weight: Tensor | None) -> Tensor:
    """The mean binary cross-entropy over the N x C decisions (the multi-label run's loss)."""
    weight = None if pos_weight is None else pos_weight.to(logits.dtype)
    return nn.functional.binary_cross_entropy_with_logits(logits, targets.to(logits.dtype), pos_weight=weight)


def logistic(z: Tensor, targets: Tensor, classes: int, l2: float, pos_weight: Tensor | None = None
             ) -> tuple[Tensor, Tensor]:
    """(weight (C, D), bias (C,)) minimising the mean loss + l2 * |weight|^2 (the bias
    unpenalised), float64, L-BFGS from zero (deterministic). The loss: cross-entropy over the
    classes for (N,) class ids (scikit-learn's LogisticRegression with C = 1 / (2 l2 N));
    ``binary_loss`` for (N, C) multi-hot targets."""
    w = torch.zeros(classes, z.shape[1], dtype=torch.float64, requires_grad=True)
    b = torch.zeros(classes, dtype=torch.float64, requires_grad=True)
    optimizer = torch.optim.LBFGS([w, b], max_iter=FIT_ITERATIONS, tolerance_grad=1e-9,
                                  tolerance_change=1e-12, line_search_fn="strong_wolfe")
    multi_hot = targets.dim() == 2

    def closure() -> Tensor:
        optimizer.zero_grad()
        logits = z @ w.T + b
        loss = binary_loss(logits, targets, pos_weight) if multi_hot else \
            nn.functional.cross_entropy(logits, targets.long())
        loss = loss + l2 * w.square().sum()
        loss.backward()
        return loss

    with torch.enable_grad():
        optimizer.step(closure)
    return w.detach(), b.detach()
