"""The README.md every export directory gets: what the model is, what it was trained on,
how well it did, how it was made and how to load it.

The exporters take a ``Card`` (plain values: the CLI layer reads them from the run), so
this module knows nothing of run directories.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any

from tformer import __version__
from tformer.export.export_dir import MARKER


@dataclass(frozen=True)
class Card:
    """What a model card says. ``metrics``: the run's test record (metrics.jsonl's last line)."""

    name: str  # the run (or model) the export came from
    kind: str  # "classification", "seq2seq", "embedding" or "encoder"
    data: str | None = None  # the training file
    metrics: dict[str, Any] = field(default_factory=dict)
    command: str = ""  # the export command line
    max_length: int | None = None  # tokens per text the run truncated to
    labels: tuple[str, ...] = ()
    warning: str | None = None  # e.g. that the model did not beat its trivial baseline


def render(card: Card, fmt: str, usage: str) -> bytes:
    """The README.md for an export in format ``fmt`` (e.g. "transformers MarianMTModel"), with
    ``usage`` (a short Python snippet) showing how to load it."""
    shown = {k: v for k, v in card.metrics.items() if isinstance(v, (int, float, str)) and k != "split"}
    lines = [
        MARKER,
        f"# {card.name}",
        "",
        f"A {card.kind} model trained with tformer {__version__} and exported as "
        f"{fmt}.",
        "",
        "## Training",
        "",
        f"- data: `{card.data}`" if card.data else "- data: none recorded (a synthetic task)",
    ]
    if card.max_length:
        lines.append(f"- inputs truncated to {card.max_length} tokens (the exported tokenizer does the same)")
    if card.labels:
        lines.append(f"- labels ({len(card.labels)}): {', '.join(card.labels)}")
    lines += ["", "## Test metrics", ""]
    if card.warning:
        lines += [f"**{card.warning[:1].upper()}{card.warning[1:]}**", ""]
    lines += ([f"```json\n{json.dumps(shown, indent=2, sort_keys=True)}\n```"] if shown
              else ["none recorded (the run has no test record)"])
    lines += ["", "## How it was made", "", f"```\n{card.command}\n```" if card.command else "tformer export",
              f"tformer version: {__version__}", "", "## Use", "", f"```python\n{usage.strip()}\n```", ""]
    return "\n".join(lines).encode("utf-8")
