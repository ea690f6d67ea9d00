"""The little of torch.nn the NumPy mirror needs: Module, Linear, LayerNorm, Embedding, Dropout.

Parameters are the public ndarray attributes of a module; sub-modules are Module attributes
or lists of them (``layers.0.…``), so state-dict keys come out exactly as in PyTorch.
``forward`` is evaluation mode (dropout is the identity).

Training, llm.c style: beside each ``forward``, a ``forward_train(..., rng) -> (out, cache)``
that also returns what the backward pass needs (dropout draws from ``rng``; None = no
dropout), and a ``backward(dout, cache, grads, prefix) -> dx`` that adds each parameter's
gradient into ``grads`` under its state-dict key (``prefix`` + name, as ``state_dict``
builds it). Nothing is stored on ``self``: the cache is a plain value the caller keeps.
Adding (not assigning) lets a parameter used twice, such as a tied embedding, collect
both contributions.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping

import numpy as np
from safetensors.numpy import load_file


class Module:
    def __call__(self, *args, **kwargs):
        return self.forward(*args, **kwargs)

    def _slots(self, prefix: str = "") -> Iterator[tuple[str, Module, str]]:
        """(state-dict key, owning module, attribute name) for every parameter."""
        for name, value in vars(self).items():
            if name.startswith("_"):
                continue  # constants such as the sinusoid table
            if isinstance(value, np.ndarray):
                yield prefix + name, self, name
            elif isinstance(value, Module):
                yield from value._slots(f"{prefix}{name}.")
            elif isinstance(value, list) and value and isinstance(value[0], Module):
                for i, m in enumerate(value):
                    yield from m._slots(f"{prefix}{name}.{i}.")

    def state_dict(self) -> dict[str, np.ndarray]:
        return {key: getattr(m, attr) for key, m, attr in self._slots()}

    def astype(self, dtype) -> Module:
        for _, m, attr in self._slots():
            setattr(m, attr, getattr(m, attr).astype(dtype))
        return self

    def load_state_dict(self, state: Mapping[str, object]) -> None:
        """Copy arrays (NumPy, or anything np.asarray takes) in, keeping our dtype.

        Key sets must match exactly, and every shape must agree.
        """
        slots = {key: (m, attr) for key, m, attr in self._slots()}
        missing = sorted(set(slots) - set(state))
        unexpected = sorted(set(state) - set(slots))
        if missing or unexpected:
            raise ValueError(
                f"state_dict: missing keys {missing or 'none'}; unexpected keys {unexpected or 'none'}"
            )
        for key, (m, attr) in slots.items():
            ours = getattr(m, attr)
            theirs = np.asarray(state[key])
            if theirs.shape != ours.shape:
                raise ValueError(
                    f"state_dict[{key!r}]: expected shape {ours.shape}, got {theirs.shape}"
                )
            setattr(m, attr, theirs.astype(ours.dtype, copy=True))

    def zero_grads(self) -> dict[str, np.ndarray]:
        """A zero gradient for every parameter, keyed as ``state_dict``."""
        return {key: np.zeros_like(value) for key, value in self.state_dict().items()}

    def load_safetensors(self, path) -> None:
        """Load a tformer ``model.safetensors`` through safetensors' NumPy API (no torch)."""
        self.load_state_dict(load_file(str(path)))


class Linear(Module):
    """y = x W^T + b, with W of shape (out, in) as in torch.nn.Linear."""

    def __init__(self, d_in: int, d_out: int, bias: bool = True):
        self.weight = np.zeros((d_out, d_in), np.float32)
        if bias:
            self.bias = np.zeros(d_out, np.float32)

    def forward(self, x: np.ndarray) -> np.ndarray:
        # One (N, in) @ (in, out) product: on a 3-D x, NumPy would make one BLAS call per row.
        y = x.reshape(-1, x.shape[-1]) @ self.weight.T  # (N, out)
        if hasattr(self, "bias"):
            y += self.bias  # in place: y is ours
        return y.reshape(*x.shape[:-1], y.shape[-1])  # (..., out)

    def forward_train(self, x: np.ndarray, rng=None) -> tuple[np.ndarray, np.ndarray]:
        return self.forward(x), x  # the cache is the input

    def backward(self, dy: np.ndarray, x: np.ndarray, grads: dict, prefix: str = "") -> np.ndarray:
        """y = x W^T + b  =>  dx = dy W,  dW = dy^T x,  db = sum of dy over all rows.

        Shape: dy (..., out), x (..., in) -> dx (..., in)
        """
        dy2 = dy.reshape(-1, dy.shape[-1])  # (N, out)
        grads[prefix + "weight"] += dy2.T @ x.reshape(-1, x.shape[-1])  # (out, N) @ (N, in)
        if hasattr(self, "bias"):
            grads[prefix + "bias"] += dy2.sum(axis=0)
        return (dy2 @ self.weight).reshape(*dy.shape[:-1], self.weight.shape[1])  # (..., in)


class LayerNorm(Module):
    """(x - mean) / sqrt(var + eps) * weight + bias over the last axis (biased variance)."""

    def __init__(self, d: int, eps: float = 1e-5, bias: bool = True):
        self.eps = eps
        self.weight = np.ones(d, np.float32)
        if bias:
            self.bias = np.zeros(d, np.float32)

    def forward(self, x: np.ndarray) -> np.ndarray:
        mean = x.mean(axis=-1, keepdims=True)
        y = x - mean  # centred; the steps below reuse this one array
        var = np.einsum("...d,...d->...", y, y)[..., None] / y.shape[-1]  # mean of squares
        y *= 1.0 / np.sqrt(var + self.eps)
        y *= self.weight
        if hasattr(self, "bias"):
            y += self.bias
        return y

    def forward_train(self, x: np.ndarray, rng=None) -> tuple[np.ndarray, tuple]:
        mean = x.mean(axis=-1, keepdims=True)
        var = ((x - mean) ** 2).mean(axis=-1, keepdims=True)
        rstd = 1.0 / np.sqrt(var + self.eps)  # (..., 1)
        xhat = (x - mean) * rstd  # (..., D)
        y = xhat * self.weight
        if hasattr(self, "bias"):
            y = y + self.bias
        return y, (xhat, rstd)

    def backward(self, dy: np.ndarray, cache: tuple, grads: dict, prefix: str = "") -> np.ndarray:
        """Ba, Kiros & Hinton 2016. With xhat = (x - mean) * rstd and y = xhat * g + b:

        dg = sum dy * xhat, db = sum dy (over all rows), and for one row of D values,
        with g_hat = dy * g (the gradient reaching xhat):
            dx = rstd * (g_hat - mean(g_hat) - xhat * mean(g_hat * xhat)).
        The two means are what the normalisation takes away: shifting x changes nothing
        (so dx sums to 0), and neither does scaling it (so dx is orthogonal to xhat).
        """
        xhat, rstd = cache
        d = dy.shape[-1]
        grads[prefix + "weight"] += (dy * xhat).reshape(-1, d).sum(axis=0)
        if hasattr(self, "bias"):
            grads[prefix + "bias"] += dy.reshape(-1, d).sum(axis=0)
        g_hat = dy * self.weight  # (..., D)
        return rstd * (
            g_hat
            - g_hat.mean(axis=-1, keepdims=True)
            - xhat * (g_hat * xhat).mean(axis=-1, keepdims=True)
        )


class Embedding(Module):
    def __init__(self, n: int, d: int):
        self.weight = np.zeros((n, d), np.float32)

    def forward(self, ids: np.ndarray) -> np.ndarray:
        return self.weight[ids]  # (..., D)

    def forward_train(self, ids: np.ndarray, rng=None) -> tuple[np.ndarray, np.ndarray]:
        return self.forward(ids), ids

    def backward(self, dy: np.ndarray, ids: np.ndarray, grads: dict, prefix: str = "") -> None:
        """A lookup copies row ids[i] to output i, so row v's gradient is the sum of dy over
        every position that holds token v (np.add.at adds repeated ids; += would not)."""
        np.add.at(grads[prefix + "weight"], ids.reshape(-1), dy.reshape(-1, dy.shape[-1]))


LEVELS = 1 << 16  # tformer.nn.dropout: each element's draw is uniform over 65,536 levels


def drop_threshold(p: float) -> int:
    """How many of the 65,536 levels drop an element: p rounded to a multiple of 2^-16."""
    return round(p * LEVELS)


def keep_scaled(shape, p: float, rng) -> np.ndarray:
    """0 where an element is dropped, 1 / (1 - p) where kept, as tformer.nn.dropout draws it: p is
    rounded to a multiple of 2^-16, and each element keeps where its 16-bit uniform draw is at
    least p * 2^16 (torch draws four per 64-bit word; the distribution is the same)."""
    threshold = drop_threshold(p)
    return (rng.integers(0, LEVELS, size=shape) >= threshold) * (LEVELS / (LEVELS - threshold))


class Dropout(Module):
    """Identity in ``forward`` (evaluation mode); ``forward_train`` drops (Srivastava et al. 2014)."""

    def __init__(self, p: float):
        self.p = p

    def forward(self, x: np.ndarray) -> np.ndarray:
        return x

    def forward_train(self, x: np.ndarray, rng=None) -> tuple[np.ndarray, np.ndarray | None]:
        """Zero each element with probability p and scale the rest by 1/(1-p) ("inverted"
        dropout: the expectation is unchanged, so evaluation needs no rescaling)."""
        if rng is None or self.p == 0:
            return x, None
        keep = keep_scaled(x.shape, self.p, rng).astype(x.dtype)  # (..., ) 0 or 1/(1-p)
        return x * keep, keep

    def backward(self, dy: np.ndarray, keep: np.ndarray | None, grads=None, prefix="") -> np.ndarray:
        return dy if keep is None else dy * keep
