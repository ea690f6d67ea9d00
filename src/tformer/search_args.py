"""The argument checks of a search (greedy and beam), shared by both engines: plain Python, so
the NumPy reference can use them without importing torch, and both give one message."""

from __future__ import annotations

import math


def check_max_len(max_len: int) -> None:
    if isinstance(max_len, bool) or not isinstance(max_len, int) or max_len < 1:
        raise ValueError(f"max_len: expected a positive int, got {max_len!r}")


def check_beam_size(beam_size: int) -> None:
    if isinstance(beam_size, bool) or not isinstance(beam_size, int) or beam_size < 1:
        raise ValueError(f"beam_size: expected a positive int, got {beam_size!r}")


def check_length_penalty(length_penalty: float, max_len: int) -> None:
    """Refuse a length penalty that no length up to ``max_len`` can be raised to: a score divided
    by an overflowed (inf) or underflowed (0) power would rank every hypothesis alike."""
    try:
        ok = (isinstance(length_penalty, int | float) and not isinstance(length_penalty, bool)
              and math.isfinite(float(max_len) ** abs(length_penalty)))
    except OverflowError:
        ok = False
    if not ok:
        raise ValueError(f"length_penalty: expected a number with max_len ** |length_penalty| finite "
                         f"(max_len {max_len}), got {length_penalty!r}")
