"""tformer.training.viz.html: the self-contained attention page (its data here; a real browser in the slow test)."""

from __future__ import annotations

import os
import re

import numpy as np
import pytest
from browser_helpers import browser_report

from tformer.training.viz.html import AttentionMaps, attention_page, read_page_data, write_attention_page

TOKENS = ["[CLS]", "the", "cat", "</script><b>x</b>", "[SEP]"]  # a token that would end a <script>
def _weights(layers=2, heads=3, tq=5, tk=5, seed=0):
    rng = np.random.default_rng(seed)
    a = rng.random((layers, heads, tq, tk))
    return a / a.sum(-1, keepdims=True)  # (L, H, Tq, Tk), rows sum to 1


def _maps():
    return [
        AttentionMaps("encoder self-attention", TOKENS, TOKENS, _weights()),
        AttentionMaps("decoder cross-attention", ["<bos>", "7"], TOKENS, _weights(tq=2, seed=1)),
    ]


def test_page_embeds_the_weights_and_names_model_and_text(tmp_path):
    path = write_attention_page(tmp_path / "sub" / "a.html", _maps(), "my-model", "the cat <sat>", head=2)
    page = path.read_text()
    assert page.startswith("<!DOCTYPE html>")
    assert "<title>attention: the cat &lt;sat&gt; (my-model)</title>" in page
    assert page.count("</script>") == 2  # the data block and the code: no token ends one early
    data = read_page_data(path)
    assert (data["model"], data["text"], data["initial"]) == (
        "my-model",
        "the cat <sat>",
        {"layer": 0, "head": 2},
    )
    assert [g["name"] for g in data["groups"]] == ["encoder self-attention", "decoder cross-attention"]
    assert data["groups"][0]["queries"] == TOKENS and data["groups"][1]["queries"] == ["<bos>", "7"]
    for group, expected in zip(data["groups"], _maps(), strict=True):
        np.testing.assert_allclose(np.array(group["weights"]), expected.weights, rtol=0, atol=1e-7)
    assert path.stat().st_mode & 0o777 == 0o666 & ~_umask()  # like every other output


def test_page_is_self_contained():
    page = attention_page(_maps(), "m", "t")
    # No fetched resources: no src=/href= to anything, no import(), no fetch().
    assert not re.search(r"""\b(src|href)\s*=\s*["']?(https?:|//|[\w./-]+\.(js|css))""", page)
    assert "fetch(" not in page and "import(" not in page and "@import" not in page


def test_bad_arguments(tmp_path):
    with pytest.raises(
        ValueError,
        match=r"x: weights: expected shape \(L, H, Tq, Tk\) = \('L', 'H', 5, 2\), got \(2, 3, 5, 5\)",
    ):
        AttentionMaps("x", TOKENS, ["a", "b"], _weights())
    with pytest.raises(ValueError, match="x: weights: expected finite values"):
        AttentionMaps("x", TOKENS, TOKENS, _weights() * np.nan)
    with pytest.raises(ValueError, match=r"path: expected a \.html file name, got '.*a\.png'"):
        write_attention_page(tmp_path / "a.png", _maps(), "m", "t")
    with pytest.raises(ValueError, match="maps: expected at least one AttentionMaps, got none"):
        attention_page([], "m", "t")


# In a real browser ---------------------------------------------------------------------------
@pytest.mark.slow
def test_page_renders_in_chromium(tmp_path):
    maps = _maps()
    page = write_attention_page(tmp_path / "a.html", maps, "my-model", "the cat")
    report = browser_report(page, tmp_path, screenshot=tmp_path / "a.png")
    expected = [
        {
            "name": m.name,
            "query_tokens": len(m.queries),
            "key_tokens": len(m.keys),
            "layers": 2,
            "heads": 3,
            "overview_maps": 2 * 3,
            # hovering the first query draws one line per key, at opacity = its weight;
            # hovering the last key draws one line per query and shades every query
            "hover_query_lines": len(m.keys),
            "hover_key_lines": len(m.queries),
            "hover_key_shaded": len(m.queries),
        }
        for m in maps
    ]
    for got, want, m in zip(report["groups"], expected, maps, strict=True):
        assert got.pop("hover_query_err") < 1e-6
        top = round(float(m.weights[0, 0].max()), 3)  # the map shown first: layer 0, head 0
        assert got.pop("colour_bar") == {"top": top, "bottom": 0} and got.pop("heat_max") == top
        assert got == want


def _umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask
