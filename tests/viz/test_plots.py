"""tformer.training.viz.plots: attention grids (one panel per layer x head) and the positional-encoding plot."""

from __future__ import annotations

import matplotlib.image
import numpy as np
import pytest
import torch

from tformer.reference.positional import plot_positions, sinusoidal_table
from tformer.training.viz.plots import DPI, PANEL_INCHES, plot_attention, save_figure

TOKENS = ["[CLS]", "the", "cat", "sat", "[SEP]"]


def _attn(layers=2, heads=4, s=5, seed=0):
    rng = np.random.default_rng(seed)
    a = rng.random((layers, heads, s, s))
    return a / a.sum(-1, keepdims=True)  # (L, H, S, S), rows sum to 1


def test_grid_has_one_panel_per_layer_and_head():
    fig = plot_attention(_attn(), TOKENS)
    assert len(fig.axes) == 2 * 4 + 1  # and the colour bar
    assert [ax.get_title() for ax in fig.axes[:4]] == [f"layer 0 head {h}" for h in range(4)]
    bottom_left = fig.axes[4]
    assert [t.get_text() for t in bottom_left.get_xticklabels()] == TOKENS
    assert [t.get_text() for t in bottom_left.get_yticklabels()] == TOKENS
    np.testing.assert_array_equal(fig.axes[6].images[0].get_array(), _attn()[1, 2])


@pytest.mark.parametrize(
    "layer, head, panels, title",
    [(1, None, 4, "layer 1 head 0"), (None, 2, 2, "layer 0 head 2"), (1, 3, 1, "layer 1 head 3")],
)
def test_select_layer_and_head(layer, head, panels, title):
    fig = plot_attention(_attn(), TOKENS, layer=layer, head=head)
    assert len(fig.axes) == panels + 1 and fig.axes[0].get_title() == title


def test_takes_the_models_tuple_of_batched_tensors():
    a = torch.from_numpy(_attn()).float()
    per_layer = tuple(torch.stack([a[i], a[i]]) for i in range(2))  # 2 x (B=2, H, S, S)
    fig = plot_attention(per_layer, TOKENS)
    assert len(fig.axes) == 8 + 1
    np.testing.assert_allclose(fig.axes[5].images[0].get_array(), _attn()[1, 1], atol=1e-7)


def test_one_colour_scale_for_every_panel_with_a_colour_bar():
    a = _attn()
    a[1, 3, 0, 0] = 2.0  # the largest weight shown sets the top of the scale
    fig = plot_attention(a, TOKENS)
    *panels, bar = fig.axes
    assert bar.get_ylabel() == "attention weight"
    assert {p.images[0].get_clim() for p in panels} == {(0.0, 2.0)}
    assert bar.get_ylim() == (0.0, 2.0)
    one = plot_attention(_attn(), TOKENS, layer=0, head=1)
    assert one.axes[0].images[0].get_clim() == (0.0, _attn()[0, 1].max())


def test_bad_arguments():
    with pytest.raises(ValueError, match=r"layer: expected an index in \[0, 2\), got 2"):
        plot_attention(_attn(), TOKENS, layer=2)
    with pytest.raises(ValueError, match=r"tokens: expected 5 \(the attention length\), got 4"):
        plot_attention(_attn(), TOKENS[:4])
    with pytest.raises(ValueError, match=r"attentions: expected shape \(L, H, S, S\), got \(4, 5, 5\)"):
        plot_attention(_attn()[0], TOKENS)


def test_png_size_matches_the_grid(tmp_path):
    path = save_figure(plot_attention(_attn(3, 2), TOKENS), tmp_path / "sub" / "a.png")
    height, width = matplotlib.image.imread(path).shape[:2]
    side = PANEL_INCHES * DPI
    assert (height, width) == (round(3 * side), round(2 * side + 1.2 * DPI))  # + the colour bar
    with pytest.raises(ValueError, match=r"path: expected a \.png file name"):
        save_figure(plot_attention(_attn(), TOKENS), tmp_path / "a.jpg")


def test_positions_plot_shows_the_table(tmp_path):
    fig = plot_positions(d_model=16, max_len=30)
    heat = fig.axes[0]
    np.testing.assert_array_equal(heat.images[0].get_array(), sinusoidal_table(30, 16))
    assert len(fig.axes[1].lines) == 5  # dims 0, 1, 2, 4, 8
    assert save_figure(fig, tmp_path / "pe.png").stat().st_size > 1000
    with pytest.raises(ValueError, match="d_model: expected a positive int, got 0"):
        plot_positions(d_model=0)


def test_png_is_written_atomically_with_normal_permissions(tmp_path, monkeypatch):
    import os

    from tformer.storage import files

    path = tmp_path / "pe.png"
    old = os.umask(0o022)
    try:
        save_figure(plot_positions(16, 10), path)
    finally:
        os.umask(old)
    assert path.stat().st_mode & 0o777 == 0o644
    before = path.read_bytes()

    def full_disk(what):
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(files, "fault_hook", full_disk)
    with pytest.raises(OSError):
        save_figure(plot_positions(32, 20), path)
    assert path.read_bytes() == before and [p.name for p in tmp_path.iterdir()] == ["pe.png"]
