"""Pictures: attention maps (layers x heads, tokens on the axes) and the sinusoidal encoding.

    fig = plot_attention(attentions, tokens)            # one example: (L, H, S, S)
    fig = plot_attention(attentions, tokens, layer=3)   # one row: that layer's heads
    fig.savefig("attn.png")

Figures are built with matplotlib's Agg backend (no display needed) and returned, so
callers (and tests) can inspect the panels: ``fig.axes`` holds one Axes per heatmap.
"""

from __future__ import annotations

import functools
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

PANEL_INCHES = 2.6  # side of one heatmap
DPI = 100


def pyplot():
    import matplotlib

    matplotlib.use("Agg", force=False)  # a headless backend unless the caller chose one
    import matplotlib.pyplot as plt

    return plt


@functools.cache
def warm() -> None:
    """matplotlib's first drawing in a process loads its fonts and renderer (0.85 s of a 1.45 s
    first drawing here): paid once here, with a figure of one line drawn to memory, so that a
    drawing's time tells what the next will take (a budget keeps it back)."""
    import io

    fig, ax = subplots(figsize=(1, 1))
    ax.plot([0, 1], [0, 1], label="x")
    ax.set(title="x", xlabel="x")
    ax.legend()
    fig.savefig(io.BytesIO(), format="png", dpi=20)
    pyplot().close(fig)


def _as_array(x: Any) -> np.ndarray:
    if hasattr(x, "detach"):  # a torch tensor
        x = x.detach().cpu().float().numpy()
    return np.asarray(x)


def attention_stack(attentions: Any, example: int = 0) -> np.ndarray:
    """A model's ``attentions`` (n_layers x (B, H, S, S)) or an (L, H, S, S) array -> (L, H, S, S)."""
    if isinstance(attentions, (list, tuple)):
        layers = [_as_array(a) for a in attentions]
        if layers and layers[0].ndim == 4:  # (B, H, S, S) per layer: pick one example
            layers = [a[example] for a in layers]
        attentions = np.stack(layers)  # (L, H, S, S)
    a = _as_array(attentions)
    if a.ndim != 4 or a.shape[-1] != a.shape[-2]:
        raise ValueError(f"attentions: expected shape (L, H, S, S), got {a.shape}")
    return a


def plot_attention(
    attentions: Any,
    tokens: Sequence[str],
    layer: int | None = None,
    head: int | None = None,
    title: str | None = None,
):
    """A grid of heatmaps: one row per layer, one column per head (query rows, key columns),
    on one colour scale (0 to the largest weight shown) drawn as a colour bar beside them.

    ``layer`` keeps one row, ``head`` one column, both one map. ``fig.axes``: the heatmaps
    row by row, then the colour bar.

    Shape:
        attentions: (L, H, S, S), or the model's tuple of L x (B, H, S, S) (example 0)
        tokens: S strings
    """
    a = attention_stack(attentions)  # (L, H, S, S)
    n_layers, n_heads, s, _ = a.shape
    if len(tokens) != s:
        raise ValueError(f"tokens: expected {s} (the attention length), got {len(tokens)}")
    layers = _select("layer", layer, n_layers)
    heads = _select("head", head, n_heads)

    plt = pyplot()
    rows, cols = len(layers), len(heads)
    side = PANEL_INCHES * max(1.0, s / 12)  # long texts get bigger panels
    fig, axes = plt.subplots(rows, cols, figsize=(cols * side + 1.2, rows * side), dpi=DPI, squeeze=False,
                             layout="constrained")
    font = max(4.0, min(9.0, 140 / max(s, 1)))
    # One scale for every panel, so that colours compare across heads and layers.
    vmax = max(float(a[np.ix_(layers, heads)].max()), 1e-12)
    for r, li in enumerate(layers):
        for c, hi in enumerate(heads):
            ax = axes[r, c]
            image = ax.imshow(a[li, hi], cmap="viridis", vmin=0.0, vmax=vmax, aspect="equal")
            ax.set_title(f"layer {li} head {hi}", fontsize=9)
            ax.set_xticks(range(s))
            ax.set_yticks(range(s))
            # Key tokens below the bottom row, query tokens left of the first column.
            ax.set_xticklabels(tokens if r == rows - 1 else [], rotation=90, fontsize=font)
            ax.set_yticklabels(tokens if c == 0 else [], fontsize=font)
            if r == rows - 1:
                ax.set_xlabel("key")
            if c == 0:
                ax.set_ylabel("query")
    fig.colorbar(image, ax=axes, label="attention weight", shrink=min(1.0, 0.9 / rows ** 0.5))
    if title:
        fig.suptitle(title)
    return fig


# The PNG's "Software" text: a later figure may replace a file that says it (``is_ours``).
SOFTWARE = "tformer"


def is_ours(path: Path) -> bool:
    """Whether a PNG says tformer drew it (its tEXt "Software" chunk, before the image data)."""
    try:
        data = path.read_bytes()[: 1 << 16]
    except OSError:
        return False
    if not data.startswith(b"\x89PNG\r\n\x1a\n"):
        return False
    at = 8
    while at + 8 <= len(data):
        length, kind = int.from_bytes(data[at : at + 4], "big"), data[at + 4 : at + 8]
        if kind == b"IDAT":
            return False
        if kind == b"tEXt" and data[at + 8 : at + 8 + length] == b"Software\0" + SOFTWARE.encode():
            return True
        at += 12 + length
    return False


def save_figure(fig, path: str | Path, option: str | None = None) -> Path:
    """Write a PNG atomically (creating folders) and free the figure. ``option``: the user named
    the file with it: an existing file there that tformer did not draw is refused, not replaced."""
    path = Path(path)
    if path.suffix.lower() != ".png":
        raise ValueError(f"path: expected a .png file name, got {str(path)!r}")
    import io

    from tformer.storage.files import refuse_foreign, write_atomic

    if option is not None:
        refuse_foreign(path, option, is_ours, "a figure tformer drew")
    path.parent.mkdir(parents=True, exist_ok=True)
    buffer = io.BytesIO()
    fig.savefig(buffer, format="png", dpi=DPI, metadata={"Software": SOFTWARE})
    pyplot().close(fig)
    write_atomic(path, buffer.getvalue())  # a crash or full disk keeps any previous file
    return path


def subplots(*args, **kwargs):
    """matplotlib's subplots on a headless backend (unless the caller chose one)."""
    return pyplot().subplots(*args, **kwargs)


def _select(name: str, index: int | None, n: int) -> list[int]:
    if index is None:
        return list(range(n))
    if isinstance(index, bool) or not isinstance(index, int) or not -n <= index < n:
        raise ValueError(f"{name}: expected an index in [0, {n}), got {index!r}")
    return [index % n]
