"""``with kernels.readable():``: the plain kernels only (F.linear, the explicit softmax, padded
execution), to compare, to debug, to read. Every choice in tformer.nn.kernels asks ``is_readable``."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

_readable = False


@contextlib.contextmanager
def readable() -> Iterator[None]:
    """Run the plain kernels only (to compare, to debug, to read): ``with kernels.readable():``."""
    global _readable
    previous, _readable = _readable, True
    try:
        yield
    finally:
        _readable = previous


def is_readable() -> bool:
    return _readable
