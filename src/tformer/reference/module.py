"""The little of torch.nn the NumPy mirror needs: Module, Linear, LayerNorm, Embedding, Dropout.

Parameters are the public ndarray attributes of a module; sub-modules are Module attributes
or lists of them (``layers.0.…``), so state-dict keys come out exactly as in PyTorch.
Forward only: dropout is the identity (evaluation mode).
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping

import numpy as np


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

    def load_safetensors(self, path) -> None:
        """Load a tformer ``model.safetensors`` through safetensors' NumPy API (no torch)."""
        from safetensors.numpy import load_file

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


class Embedding(Module):
    def __init__(self, n: int, d: int):
        self.weight = np.zeros((n, d), np.float32)

    def forward(self, ids: np.ndarray) -> np.ndarray:
        return self.weight[ids]  # (..., D)


class Dropout(Module):
    """Identity: the reference runs in evaluation mode only."""

    def __init__(self, p: float):
        self.p = p

    def forward(self, x: np.ndarray) -> np.ndarray:
        return x
