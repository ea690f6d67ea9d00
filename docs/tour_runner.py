"""Run the tour's code: every ```python block of docs/tour*.md, in order, in one namespace per file.

A ```text block right after a python block is that block's printed output, compared exactly
(trailing spaces aside) by tests/test_docs.py. After changing the code or the tour:

    PYTHONPATH=src python docs/tour_runner.py --update   # rewrite the output blocks, then read the diff

The blocks are executed as they are written, which is the point: the tour cannot drift from the
code. (A doc test is the one place tformer runs code from text.)
"""

from __future__ import annotations

import contextlib
import io
import re
import sys
from dataclasses import dataclass
from pathlib import Path

DOCS = Path(__file__).resolve().parent
# A fenced block: ```lang, the body, ``` on its own line.
FENCE = re.compile(r"^```(\w*)[^\n]*\n(.*?)^```[ \t]*$", re.S | re.M)


@dataclass
class Block:
    code: str
    line: int  # where the code starts in the file (1-based)
    output: str | None  # the ```text block that follows, if any
    output_span: tuple[int, int] | None  # its body's character span in the file


def tour_files() -> list[Path]:
    return sorted(DOCS.glob("tour*.md"))


def blocks(text: str) -> list[Block]:
    """The python blocks of a markdown text, each with the text block right after it (if any)."""
    fences = list(FENCE.finditer(text))
    out = []
    for i, m in enumerate(fences):
        if m.group(1) != "python":
            continue
        nxt = fences[i + 1] if i + 1 < len(fences) else None
        follows = nxt is not None and nxt.group(1) == "text" and not text[m.end() : nxt.start()].strip()
        out.append(
            Block(
                code=m.group(2),
                line=text.count("\n", 0, m.start(2)) + 1,
                output=nxt.group(2) if follows else None,
                output_span=nxt.span(2) if follows else None,
            )
        )
    return out


def run(path: Path):
    """Execute the blocks of `path` in order; yield (block, what it printed)."""
    namespace: dict = {"__name__": f"tour:{path.name}"}
    for block in blocks(path.read_text(encoding="utf-8")):
        printed = io.StringIO()
        with contextlib.redirect_stdout(printed):
            exec(compile(block.code, f"{path.name}:{block.line}", "exec"), namespace)
        yield block, printed.getvalue()


def same(expected: str, printed: str) -> bool:
    def norm(s):
        return [line.rstrip() for line in s.strip("\n").splitlines()]

    return norm(expected) == norm(printed)


def update(path: Path) -> int:
    """Rewrite `path`'s output blocks with what the code prints now; returns how many changed."""
    text = path.read_text(encoding="utf-8")
    edits = [
        (b.output_span, printed) for b, printed in run(path) if b.output_span and not same(b.output, printed)
    ]
    for (start, end), printed in reversed(edits):
        text = text[:start] + printed.rstrip() + "\n" + text[end:]
    path.write_text(text, encoding="utf-8")
    return len(edits)


if __name__ == "__main__":
    for p in tour_files():
        if "--update" in sys.argv:
            print(f"{p.name}: {update(p)} output block(s) rewritten")
        else:
            bad = [b.line for b, printed in run(p) if b.output is not None and not same(b.output, printed)]
            print(f"{p.name}: {'ok' if not bad else f'output differs for the blocks at lines {bad}'}")
