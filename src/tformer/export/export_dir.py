"""Where every export lands: one directory, published whole, never over a user's files.

    publish_export(out, files, option="--hf")

``files`` (name -> bytes) are written into a hidden
temp directory beside ``out`` and swapped in by one atomic step (``tformer.storage.files``): a kill at
any point leaves the old directory or the new one, never a mix. ``out`` may be new, empty, or an
earlier tformer export (its README.md carries ``MARKER``); a folder holding anything else is
refused in one line, so a user's config.json or README.md is never overwritten. A symbolic link
is followed: the folder it points to is checked and replaced, and the link stays a link.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from pathlib import Path

from tformer.storage.files import write_dir_atomic

# The model card's first line after its YAML header (or its first line, in older exports):
# this folder is tformer's to replace.
MARKER = "<!-- tformer export -->"


def is_ours(card: str) -> bool:
    """Whether a README.md is a tformer export's model card (MARKER first, or right after
    the Hub's YAML header)."""
    if card.startswith("---\n"):
        end = card.find("\n---\n", 3)
        card = card[end + len("\n---\n"):] if end >= 0 else card
    return card.startswith(MARKER)


def is_tformer_export(directory: Path) -> bool:
    card = directory / "README.md"
    try:
        return card.is_file() and is_ours(card.read_text(encoding="utf-8", errors="replace"))
    except OSError:
        return False


def check_destination(out: str | Path, option: str) -> Path:
    """Refuse an ``out`` that is a file, or a folder of files tformer did not write; returns
    the folder to write (a link's target)."""
    out = Path(out)
    if out.is_symlink():
        out = Path(os.path.realpath(out))  # the folder the link names (it may not exist yet)
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
    if "README.md" not in files or not is_ours(files["README.md"].decode()):
        raise ValueError(f"files: expected a README.md model card starting with {MARKER!r}")
    out.parent.mkdir(parents=True, exist_ok=True)
    write_dir_atomic(out, files)
    return out
