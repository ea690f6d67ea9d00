"""The interactive attention page: one self-contained HTML file (inline CSS, JS and data).

    maps = [AttentionMaps("encoder self-attention", tokens, tokens, weights)]  # (L, H, S, S)
    write_attention_page("attn.html", maps, model="bert-dir", text="the cat sat")

The page (template: ``attention_page.html`` beside this file) has layer and head pickers,
a line view in which hovering a token shows what it attends to (a query) or what attends
to it (a key), the selected map as a heatmap, and an all-heads overview (one small map per
layer x head; click one to select it). It needs no network: the weights are inline JSON.

After rendering, the page's script writes what it drew into ``<pre id="report">`` (JSON:
per group, the number of query and key tokens, layers, heads and overview maps), which the
browser test reads back. Torch-free: the caller hands in NumPy arrays (or tensors).
"""

from __future__ import annotations

import html
import json
from collections.abc import Sequence
from dataclasses import dataclass
from importlib import resources
from pathlib import Path
from typing import Any

import numpy as np

from tformer.storage.files import refuse_foreign, write_atomic

DECIMALS = 7  # weights are stored rounded to 1e-7: exact to the eye, and a third the size
# What one weight costs in the page: up to "0.1234567," (10 characters), and a row's brackets.
# 512 tokens of a 12 x 12 model made a 373 MB page (and took 3.9 GB to build): refuse first.
BYTES_PER_WEIGHT = 11
MAX_PAGE_BYTES = 64_000_000


@dataclass(frozen=True)
class AttentionMaps:
    """One kind of attention (encoder self-attention, decoder cross-attention...) for one text.

    Shape:
        queries: Tq strings (the rows); keys: Tk strings (the columns)
        weights: (L, H, Tq, Tk), each row a distribution over the keys
    """

    name: str
    queries: Sequence[str]
    keys: Sequence[str]
    weights: Any
    note: str = ""  # shown under the pickers, e.g. what the rows of a decoder map are

    def __post_init__(self) -> None:
        w = self.weights
        if hasattr(w, "detach"):  # a torch tensor
            w = w.detach().cpu().double().numpy()
        w = np.asarray(w, dtype=np.float64)
        object.__setattr__(self, "weights", w)
        expected = ("L", "H", len(self.queries), len(self.keys))
        if w.ndim != 4 or w.shape[2:] != expected[2:]:
            raise ValueError(
                f"{self.name}: weights: expected shape (L, H, Tq, Tk) = {expected}, got {w.shape}"
            )
        if not np.isfinite(w).all():
            raise ValueError(f"{self.name}: weights: expected finite values, got NaN or inf")

    def to_json(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "queries": [str(t) for t in self.queries],
            "keys": [str(t) for t in self.keys],
            "weights": np.round(self.weights, DECIMALS).tolist(),  # L x H x Tq x Tk
            "note": self.note,
        }


def page_data(maps: Sequence[AttentionMaps], model: str, text: str, layer: int = 0, head: int = 0) -> dict:
    """What the page embeds: the model and text named, one entry per AttentionMaps."""
    if not maps:
        raise ValueError("maps: expected at least one AttentionMaps, got none")
    return {
        "model": str(model),
        "text": str(text),
        "initial": {"layer": int(layer), "head": int(head)},
        "groups": [m.to_json() for m in maps],
    }


def attention_page(
    maps: Sequence[AttentionMaps], model: str, text: str, layer: int = 0, head: int = 0
) -> str:
    """The page as a string. ``layer``/``head``: the map selected when it opens."""
    data = page_data(maps, model, text, layer, head)
    # Inside <script>, "</script>" (or "<!--") in a token would end the block: JSON may escape
    # <, > and & as \u sequences, and the parsed values are unchanged.
    blob = json.dumps(data, ensure_ascii=False, separators=(",", ":"))
    blob = blob.replace("<", "\\u003c").replace(">", "\\u003e").replace("&", "\\u0026")
    page = resources.files("tformer.training.viz").joinpath("attention_page.html")
    template = page.read_text(encoding="utf-8")
    title = html.escape(f"attention: {_short(text)} ({model})")
    return template.replace("__TFORMER_TITLE__", title).replace("__TFORMER_DATA__", blob)


def _is_page(path: Path) -> bool:
    """Whether a file starts as attention_page.html does (its "Written by" comment)."""
    try:
        with path.open("rb") as f:
            return b"Written by `tformer attention" in f.read(512)
    except OSError:
        return False


def write_attention_page(
    path: str | Path, maps: Sequence[AttentionMaps], model: str, text: str, layer: int = 0, head: int = 0
) -> Path:
    """Write the page atomically (creating folders); returns the path."""
    path = Path(path)
    if path.suffix.lower() not in (".html", ".htm"):
        raise ValueError(f"path: expected a .html file name, got {str(path)!r}")
    refuse_foreign(path, "--html", _is_page, "a page `tformer attention --html` wrote")
    check_page_size(sum(m.weights.size for m in maps))
    page = attention_page(maps, model, text, layer, head)
    path.parent.mkdir(parents=True, exist_ok=True)
    write_atomic(path, page.encode("utf-8"))  # permissions: the umask's, as any other output
    return path


def page_bytes(n_weights: int) -> int:
    """An upper estimate of the page's size for ``n_weights`` attention weights."""
    return n_weights * BYTES_PER_WEIGHT


def check_page_size(n_weights: int) -> None:
    """Refuse, in one line, a page estimated past MAX_PAGE_BYTES, before building it."""
    size = page_bytes(n_weights)
    if size > MAX_PAGE_BYTES:
        raise ValueError(
            f"TEXT: expected an attention page of at most {MAX_PAGE_BYTES / 1e6:.0f} MB, got an estimated "
            f"{size / 1e6:.0f} MB ({n_weights:,} weights); shorten the text or pass --max-length"
        )


def read_page_data(path: str | Path) -> dict:
    """The JSON a page embeds (for tests and tools): the inverse of ``page_data``."""
    page = Path(path).read_text(encoding="utf-8")
    start_tag = '<script type="application/json" id="data">'
    start = page.index(start_tag) + len(start_tag)
    return json.loads(page[start : page.index("</script>", start)])


def _short(text: str, width: int = 60) -> str:
    return text if len(text) <= width else text[: width - 3] + "..."
