"""Where a run's checkpoints are and which is the newest: names only, torch-free, so that the
NumPy reference (tformer.reference.from_pretrained) finds a run's weights as tformer does.

    RUN/checkpoints/step-000400/     one published checkpoint (step-000400.1 if that step was saved again)
    RUN/checkpoints/latest           the name of the newest

A reader of a run that trains now reads through ``read_latest``: the run publishes a newer
checkpoint and prunes the one the reader found between its finding the name and opening the files.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from pathlib import Path
from typing import TypeVar

T = TypeVar("T")

CHECKPOINTS = "checkpoints"
POINTER = "latest"
NAME = re.compile(r"step-(\d+)(?:\.(\d+))?$")  # step-000400, or step-000400.1 if re-saved


def published(root: Path) -> list[str]:
    """Names of the published checkpoints under `root`, oldest first."""
    if not root.is_dir():
        return []
    names = [p.name for p in root.iterdir() if NAME.match(p.name) and p.is_dir()]
    return sorted(names, key=order)


def order(name: str) -> tuple[int, int]:
    m = NAME.match(name)
    assert m is not None
    return int(m.group(1)), int(m.group(2) or 0)


def latest_checkpoint(run_dir: str | Path) -> Path | None:
    """The newest published checkpoint directory of the run, or None."""
    root = Path(run_dir) / CHECKPOINTS
    pointer = root / POINTER
    if pointer.is_file():
        name = pointer.read_text(errors="replace").strip()  # damaged: no name, as if missing
        if NAME.match(name) and (root / name).is_dir():
            return root / name
    found = published(root)  # pointer lost: the newest rename is complete too
    return root / found[-1] if found else None


# How often a reader starts again when a live run pruned the checkpoint it was reading: each time
# the run must publish and prune once more within one read (a save takes far longer than a read).
READ_TRIES = 5


def read_latest(run_dir: str | Path, read: Callable[[Path | None], T]) -> T:
    """read(the newest checkpoint of the run, or None), read again from the newer one when it
    failed (an OSError or ValueError: a file gone) because a live run published a newer one
    meanwhile, and so pruned (or is pruning) the one read; at most READ_TRIES times."""
    for attempt in range(1, READ_TRIES + 1):
        saved = latest_checkpoint(run_dir)
        try:
            return read(saved)
        except (OSError, ValueError):
            if saved is None or attempt == READ_TRIES or latest_checkpoint(run_dir) == saved:
                raise  # not a race: the error is about the newest checkpoint itself
    raise AssertionError("unreachable")
