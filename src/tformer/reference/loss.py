"""Cross-entropy with label smoothing (Szegedy et al. 2016; Vaswani et al. 2017, §5.4), as
``torch.nn.functional.cross_entropy(logits, labels, ignore_index=..., label_smoothing=...)``.

Shape legend: N rows (B for a classifier, B*T for a decoder), V classes (the vocabulary).
"""

from __future__ import annotations

import numpy as np


def log_softmax(x: np.ndarray, axis: int = -1) -> np.ndarray:
    shifted = x - x.max(axis=axis, keepdims=True)  # the largest exponent is 0: no overflow
    return shifted - np.log(np.exp(shifted).sum(axis=axis, keepdims=True))


def cross_entropy(logits: np.ndarray, labels: np.ndarray, *, ignore_index: int = -100,
                  label_smoothing: float = 0.0) -> tuple[float, tuple]:
    """Mean over the rows whose label is not `ignore_index` of
        (1 - eps) * -log p[label] + eps * mean over classes of -log p[c],
    i.e. the cross-entropy against the target q = (1 - eps) one_hot(label) + eps / V.

    Shape: logits (..., V), labels (...) -> (loss, cache for cross_entropy_backward)
    """
    v = logits.shape[-1]
    logp = log_softmax(logits.reshape(-1, v))  # (N, V)
    labels = np.asarray(labels).reshape(-1)  # (N,)
    real = labels != ignore_index  # (N,)
    n = max(int(real.sum()), 1)
    safe = np.where(real, labels, 0)
    nll = -logp[np.arange(len(labels)), safe]  # (N,)
    smooth = -logp.mean(axis=-1)  # (N,)
    per_row = (1.0 - label_smoothing) * nll + label_smoothing * smooth
    loss = float(per_row[real].sum() / n)
    return loss, (logp, safe, real, n, label_smoothing, logits.shape)


def cross_entropy_backward(cache: tuple) -> np.ndarray:
    """d loss / d logits = (softmax(logits) - q) / N on counted rows, 0 on ignored ones.

    Derivation: loss_row = -sum_c q_c log p_c with log p_c = z_c - logsumexp(z), so
    d loss_row / d z_j = -q_j + p_j sum_c q_c = p_j - q_j, since q sums to 1.

    Shape: -> dlogits, the shape of the logits
    """
    logp, safe, real, n, eps, shape = cache
    v = logp.shape[-1]
    dlogits = np.exp(logp)  # p, (N, V)
    dlogits -= eps / v
    dlogits[np.arange(len(safe)), safe] -= 1.0 - eps
    dlogits *= (real / n)[:, None].astype(logp.dtype)
    return dlogits.reshape(shape)
