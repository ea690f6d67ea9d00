"""Texts one per line, read the same way by every command (predict, generate, embed, search,
index build, similarity).

    lines = TextLines("texts.txt", "--file")      # or "-" for standard input
    lines.count(); for number, text in lines: ...   # read lazily, again on each pass

A line ends at ``\\n`` (a ``\\r`` before it is dropped too) and nowhere else: form feeds,
U+2028 or ``\\x1c`` inside a line are text, not line breaks (``str.splitlines`` would split
there, and a file of 2 lines would give 3 outputs). Each line is one input, so each command
gives one output row per line, always. A blank line (empty or whitespace only) has no text to
give a row for: it is an error naming FILE:LINE, in every command, rather than a row that
silently goes missing. A final newline ends the last line; it does not start a blank one.
"""

from __future__ import annotations

import hashlib
import os
import shutil
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import BinaryIO

STDIN = "-"
CHUNK = 1 << 20  # bytes read at a time from spooled standard input


class TextLines:
    """The lines of a UTF-8 text file (or of standard input for ``-``), one text per line."""

    def __init__(self, path: str | Path, option: str) -> None:
        self.name, self.option = str(path), option
        self._stdin: BinaryIO | None = None
        if self.name == STDIN:  # a pipe cannot be read twice: spooled to an unnamed temp file,
            self._stdin = tempfile.TemporaryFile()  # not memory (it held 5x the input's bytes)
            shutil.copyfileobj(sys.stdin.buffer, self._stdin, 1 << 20)
            self._stdin.flush()
        elif Path(path).is_dir():
            raise IsADirectoryError(f"{option} {path}: expected a file of texts, one per line, "
                                    "got a directory")
        elif not Path(path).exists():
            raise FileNotFoundError(f"{option} {path}: no such file")
        elif not Path(path).is_file():  # a pipe (<(cmd), /dev/stdin) is gone once read: counted, then nothing
            raise ValueError(f"{option} {path}: expected a regular file (read twice), got a pipe or device; "
                             f"for a pipe, give '{STDIN}' and pipe it to standard input")

    def _raw(self) -> Iterator[bytes]:
        if self._stdin is not None:
            yield from _lines_from_start(self._stdin.fileno())
            return
        with open(self.name, "rb") as f:
            for raw in f:  # binary files split at b"\n" only
                yield raw[:-1] if raw.endswith(b"\n") else raw

    def where(self) -> str:
        """The file as errors name it: "--corpus c.txt" (or "--file standard input")."""
        return f"{self.option} {'standard input' if self._stdin is not None else self.name}"

    def at(self, number: int) -> str:
        """Where line `number` is, as errors name it: "--corpus c.txt:3"."""
        return f"{self.where()}:{number}"

    def __iter__(self) -> Iterator[tuple[int, str]]:
        """(line number from 1, text), the line ending removed; a blank line is an error."""
        for number, raw in enumerate(self._raw(), start=1):
            raw = raw[:-1] if raw.endswith(b"\r") else raw
            try:
                text = raw.decode("utf-8-sig" if number == 1 else "utf-8")
            except UnicodeDecodeError as e:
                raise ValueError(f"{self.at(number)}: expected UTF-8 text, "
                                 f"got byte {raw[e.start]:#04x} at column {e.start + 1}") from None
            if not text.strip():
                raise ValueError(f"{self.at(number)}: expected a text, got a blank "
                                 "line (every line is one input)")
            yield number, text

    def texts(self) -> list[str]:
        return [text for _, text in self]

    def count(self) -> int:
        return sum(1 for _ in self)

    def size(self) -> int:
        """Bytes in the file (or in standard input, as read)."""
        if self._stdin is not None:
            return os.fstat(self._stdin.fileno()).st_size
        return os.path.getsize(self.name)

    def digest(self) -> str:
        """A hash of the bytes read: an interrupted output resumes only for the same lines."""
        h = hashlib.sha256()
        for raw in self._raw():
            h.update(raw + b"\n")
        return h.hexdigest()[:16]


def _lines_from_start(fd: int) -> Iterator[bytes]:
    """The lines of an open file, without their b"\\n", read from its start by pread: each pass
    has its own offset, so passes (count, then texts) never disturb each other."""
    offset, pending = 0, []  # pending: the pieces of a line not ended yet
    while chunk := os.pread(fd, CHUNK, offset):
        offset += len(chunk)
        *ended, tail = chunk.split(b"\n")
        if ended:
            ended[0] = b"".join([*pending, ended[0]])
            pending = []
            yield from ended
        pending.append(tail)
    if last := b"".join(pending):
        yield last
