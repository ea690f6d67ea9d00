"""Shared test helpers: one tolerance per dtype, stated once, and a comparison that reports."""

from __future__ import annotations

import numpy as np

# Max abs difference allowed between two implementations run on the same weights.
TOLERANCE = {np.dtype(np.float64): 1e-10, np.dtype(np.float32): 1e-5}


def to_numpy(x) -> np.ndarray:
    if hasattr(x, "detach"):
        x = x.detach().cpu().numpy()
    return np.asarray(x)


def assert_close(actual, expected, dtype=np.float32, where=None, what: str = "") -> float:
    """Max |actual - expected| (over `where` if given, a bool mask) must be <= TOLERANCE[dtype]."""
    a, e = to_numpy(actual).astype(np.float64), to_numpy(expected).astype(np.float64)
    assert a.shape == e.shape, f"{what}: shape {a.shape} != {e.shape}"
    diff = np.abs(a - e)
    if where is not None:
        diff = diff[np.broadcast_to(to_numpy(where), diff.shape[: to_numpy(where).ndim])]
    worst = float(diff.max()) if diff.size else 0.0
    tol = TOLERANCE[np.dtype(dtype)]
    assert worst <= tol, f"{what}: max abs diff {worst:.3e} > {tol:.0e} ({np.dtype(dtype)})"
    return worst


def padding_mask(lengths, max_len=None) -> np.ndarray:
    """(B, S) bool, True = real token, from per-row lengths."""
    max_len = max(lengths) if max_len is None else max_len
    return np.arange(max_len)[None, :] < np.asarray(lengths)[:, None]
