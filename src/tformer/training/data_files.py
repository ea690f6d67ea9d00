"""A run's data files: where they are, and whether they are still the ones it trained on.

    identity = {"data": describe_file("train.jsonl", digest)}   # data.json's "identity"
    config = located(config, identity)       # each file where it was when the run started
    check_files(config, identity, stats, todo)  # refused, naming the file and what changed

data.json keeps each file (--data, --valid, --test) as it was typed, the absolute path that
named when the run started (a run is evaluated from any folder: the path as typed is relative
to where training ran, and elsewhere named no file or another one), its size and its digest.
Resuming, evaluating a run's own splits and the end of training all check the digest: a file
edited since (labels swapped, records added) would be scored, or trained on, as if it were the
run's. Torch-free.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from typing import Any

from tformer.errors import FieldError
from tformer.training.splits import file_digest, file_stat

FILES = ("data", "valid", "test")  # the TrainConfig fields naming data files


def describe_file(path: str | os.PathLike, digest: str) -> dict[str, Any]:
    """What data.json keeps of one data file."""
    stat = file_stat(path)
    return {"path": str(path), "resolved": os.path.abspath(path), "blake2b": digest,
            **({"bytes": stat[0]} if stat is not None else {})}


def located(config, identity: dict[str, Any]):
    """``config`` with each data file that data.json identifies by the path the config names
    replaced by where it was when the run started (absolute), while a file is there; a path
    typed absolute, or one the config names anew, stays as it is."""
    changes = {}
    for name in FILES:
        path, saved = getattr(config, name), identity.get(name)
        if path is None or not isinstance(saved, dict) or saved.get("path") != str(path):
            continue
        resolved = saved.get("resolved")
        if isinstance(resolved, str) and resolved != path and os.path.exists(resolved):
            changes[name] = resolved
    return config.replace(**changes) if changes else config


def identified(config, identity: dict[str, Any]) -> Iterator[tuple[str, str, dict[str, Any]]]:
    """(name, path, what data.json says of it) of each data file the run identifies (runs
    written before identities: none)."""
    for name in FILES:
        saved, path = identity.get(name), getattr(config, name)
        if isinstance(saved, dict) and path is not None:
            yield name, path, saved


def check_files(config, identity: dict[str, Any], stats: dict[str, Any], todo: str,
                when: str = "since the run started", names: tuple[str, ...] = FILES,
                thorough: bool = True) -> None:
    """Refuse data files (among ``names``) that differ from those the run started with, in one
    line naming the file, what changed and (``todo``) what to do. ``stats``: path -> (size,
    mtime) when this process last digested it, updated; not ``thorough``: a file whose size
    and modification time have not moved since is not read again."""
    for name, path, saved in identified(config, identity):
        if name not in names or (not thorough and str(path) in stats and stats[str(path)] == file_stat(path)):
            continue
        stat = file_stat(path)
        try:
            digest = file_digest(path)
        except OSError as e:
            resolved = saved.get("resolved")
            where = (f" (the run started with {resolved})"
                     if isinstance(resolved, str) and resolved != os.path.abspath(path) else "")
            raise FieldError(name, f"{path}{where}: the file the run trained on cannot be read "
                                   f"({e.strerror}); {todo}") from None
        stats[str(path)] = stat
        if digest != saved.get("blake2b"):
            then, now = _shown(saved.get("bytes"), saved.get("blake2b")), _shown(stat and stat[0], digest)
            raise FieldError(name, f"{path} changed {when} (then {then}; now {now}); {todo}")


def _shown(size: int | None, digest: str | None) -> str:
    size_text = f"{size:,} bytes, " if isinstance(size, int) else ""
    return f"{size_text}blake2b {str(digest)[:12]}"
