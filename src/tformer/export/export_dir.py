"""Where every export lands: one directory, published whole, never over a user's files.

    publish_export(out, files, option="--hf")

``files`` (name -> bytes) are written into a hidden
temp directory beside ``out`` and swapped in by one atomic step (``tformer.storage.files``): a kill at
any point leaves the old directory or the new one, never a mix. ``out`` may be new, empty, or an
earlier tformer export (its README.md carries ``MARKER``); a folder holding anything else is
refused in one line, so a user's config.json or README.md is never overwritten.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path

from tformer.storage.files import write_dir_atomic

MARKER = "<!-- tformer export -->"  # the model card's first line: this folder is ours to replace


def is_tformer_export(directory: Path) -> bool:
    card = directory / "README.md"
    try:
        return card.is_file() and card.read_text(encoding="utf-8", errors="replace").startswith(MARKER)
    except OSError:
        return False


def check_destination(out: str | Path, option: str) -> Path:
    """Refuse an ``out`` that is a file, or a folder of files tformer did not write."""
    out = Path(out)
    if out.exists() and not out.is_dir():
        raise NotADirectoryError(f"{option}: expected a folder to write, got the file {out}")
    if out.is_dir() and any(out.iterdir()) and not is_tformer_export(out):
        names = sorted(p.name for p in out.iterdir())
        shown = ", ".join(names[:4]) + (", ..." if len(names) > 4 else "")
        raise FileExistsError(
            f"{option}: expected a new or empty folder (or an earlier tformer export), got {out} "
            f"holding {shown}; pick another folder"
        )
    return out


def publish_export(out: str | Path, files: Mapping[str, bytes], option: str) -> Path:
    """Write ``files`` as directory ``out`` in one atomic step (see the module doc)."""
    out = check_destination(out, option)
    if "README.md" not in files or not files["README.md"].decode().startswith(MARKER):
        raise ValueError(f"files: expected a README.md model card starting with {MARKER!r}")
    out.parent.mkdir(parents=True, exist_ok=True)
    write_dir_atomic(out, files)
    return out
