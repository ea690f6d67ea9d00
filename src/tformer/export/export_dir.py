"""Where every export lands: one directory, published whole, never over a user's files.

    publish_export(out, files, option="--hf")

``files`` (name -> bytes) are written into a hidden
temp directory beside ``out`` and swapped in by one atomic step (``tformer.storage.files``): a kill at
any point leaves the old directory or the new one, never a mix. ``out`` may be new, empty, or an
earlier tformer export (its README.md carries ``MARKER``) holding only what that export wrote
(the card lists it, ``FILES``); a folder holding anything else is refused in one line, so a
user's config.json or README.md, or the notes they put into an export, are never overwritten
or deleted by the swap. A symbolic link is followed: the folder it points to is checked and
replaced, and the link stays a link; a link to nothing is refused (it created the folder it named).
"""

from __future__ import annotations

import json
import os
from collections.abc import Collection, Mapping
from pathlib import Path

from tformer.storage.files import replaced_path, write_dir_atomic

# The model card's first line after its YAML header (or its first line, in older exports):
# this folder is tformer's to replace.
MARKER = "<!-- tformer export -->"
# The line after it: what the export wrote, so that a later export replaces only that.
FILES = "<!-- tformer export files: {} -->"


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


def written_files(directory: Path) -> set[str] | None:
    """The paths (relative, "/"-separated) an earlier export's card lists as written, or None
    for an export older than the list."""
    try:
        lines = (directory / "README.md").read_text(encoding="utf-8", errors="replace").splitlines()
    except OSError:
        return None
    prefix, suffix = FILES.split("{}")
    for line in lines:
        if line.startswith(prefix) and line.endswith(suffix):
            try:
                names = json.loads(line[len(prefix) : -len(suffix)])
            except ValueError:
                return None
            return {n for n in names if isinstance(n, str)}
    return None


def _contents(directory: Path) -> list[str]:
    """Every file and link under ``directory`` (a link to a folder not followed), as relative
    "/"-separated paths: what replacing the folder would delete (empty folders lose nothing)."""
    found = []
    for root, dirs, names in os.walk(directory):
        rel = Path(root).relative_to(directory)
        found += [(rel / n).as_posix() for n in names]
        found += [(rel / d).as_posix() for d in dirs if (Path(root) / d).is_symlink()]
    return sorted(found)


def _shown(names: list[str]) -> str:
    return ", ".join(names[:4]) + (", ..." if len(names) > 4 else "")


def check_destination(out: str | Path, option: str, files: Collection[str] | None = None) -> Path:
    """Refuse an ``out`` that is a file, a folder of files tformer did not write, or an earlier
    export holding files it did not write (an older export, which lists nothing: files not
    among ``files``, the paths this export writes, once they are known); returns the folder to
    write (a link's target)."""
    out = replaced_path(out, option)  # the folder a link names (a link to nothing: refused)
    if out.exists() and not out.is_dir():
        raise NotADirectoryError(f"{option}: expected a folder to write, got the file {out}")
    if not out.is_dir() or not any(out.iterdir()):
        return out
    if not is_tformer_export(out):
        raise FileExistsError(
            f"{option}: expected a new or empty folder (or an earlier tformer export), got {out} "
            f"holding {_shown(sorted(p.name for p in out.iterdir()))}; pick another folder"
        )
    listed = written_files(out)
    if listed is None and files is None:
        return out  # an older export: checked once this export's files are known
    extra = [p for p in _contents(out) if p not in (set(files) if listed is None else listed)]
    if extra:
        whose = "tformer did not write" if listed is not None else "this export does not write"
        raise FileExistsError(
            f"{option}: {out} is an earlier tformer export that also holds files {whose} "
            f"({_shown(extra)}); replacing it would delete them: move them out or pick another folder"
        )
    return out


def with_file_list(card: bytes, names: Collection[str]) -> bytes:
    """The model card with ``FILES`` (the export's paths) on the line after ``MARKER``."""
    listed = FILES.format(json.dumps(sorted(names)))
    return card.decode().replace(MARKER, f"{MARKER}\n{listed}", 1).encode()


def publish_export(out: str | Path, files: Mapping[str, bytes], option: str) -> Path:
    """Write ``files`` as directory ``out`` in one atomic step (see the module doc)."""
    out = check_destination(out, option, files)
    if "README.md" not in files or not is_ours(files["README.md"].decode()):
        raise ValueError(f"files: expected a README.md model card starting with {MARKER!r}")
    files = {**files, "README.md": with_file_list(files["README.md"], files)}
    out.parent.mkdir(parents=True, exist_ok=True)
    write_dir_atomic(out, files)
    return out
