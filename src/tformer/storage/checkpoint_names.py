"""Where a run's checkpoints are and which is the newest: names only, torch-free, so that the
NumPy reference (tformer.reference.from_pretrained) finds a run's weights as tformer does.

    RUN/checkpoints/step-000400/     one published checkpoint (step-000400.1 if that step was saved again)
    RUN/checkpoints/latest           the name of the newest
"""

from __future__ import annotations

import re
from pathlib import Path

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
