"""CoNLL files: one token per line, its tag in the last column, a blank line between sentences
(tformer.training.records reads them as it reads every format: --format conll, or .conll)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

DOCSTART = "-DOCSTART-"  # CoNLL-2003's document separator lines: not sentences


def conll_sentences(path: Path, lines) -> Iterator[tuple[int, int, dict[str, Any]]]:
    """Sentences of CoNLL columns: (first line number, its offset, {"tokens", "tags"}): the
    first column is the token, the last its tag; a blank or -DOCSTART- line ends a sentence."""
    start, tokens, tags = None, [], []
    for line_no, offset, line in lines:
        columns = line.split()
        if not columns or columns[0] == DOCSTART:
            if tokens:
                yield start[0], start[1], {"tokens": tokens, "tags": tags}
            start, tokens, tags = None, [], []
            continue
        if len(columns) < 2:
            raise ValueError(f"{path}:{line_no}: expected a token and its tag (CoNLL columns separated by "
                             f"spaces or tabs, the tag last), got {line.strip()!r}")
        if start is None:
            start = (line_no, offset)
        tokens.append(columns[0])
        tags.append(columns[-1])
    if tokens:
        yield start[0], start[1], {"tokens": tokens, "tags": tags}
