"""tformer.text.windows: a long text read in windows; EncoderBatch rows per window, pooled back."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from hf_bert_fixtures import bert_dir

from tformer.text.batches import EncodedText, encoder_batch
from tformer.text.prefix import AtLeast
from tformer.text.tokenizer import load_tokenizer
from tformer.text.windows import MAX_WINDOWS, coverage, rows, split, stride, window_starts


@pytest.mark.parametrize("width", [1, 2, 7, 10, 126])
def test_windows_start_every_stride_and_the_last_ends_at_the_text_end(width):
    for n in [1, width, width + 1, 3 * width + 2, coverage(width), coverage(width) + 1, 40 * width]:
        starts = window_starts(n, width)
        assert starts[0] == 0 and len(starts) <= MAX_WINDOWS
        assert all(0 < b - a <= stride(width) for a, b in zip(starts, starts[1:], strict=False))
        if n <= coverage(width):  # read to its end, the last window a full one
            assert starts[-1] + width >= n and (n <= width or starts[-1] + width == n)
        else:  # MAX_WINDOWS of them, every stride: the rest is cut
            assert starts == [k * stride(width) for k in range(MAX_WINDOWS)]
            assert starts[-1] + width == coverage(width) < n


def _tok(max_length: int):
    return load_tokenizer(bert_dir(), max_length=max_length)


def _content(tok, ids: list[int]) -> list[int]:
    specials = {tok.bos_id, tok.eos_id}
    return [i for i in ids if i not in specials]


@pytest.mark.parametrize("max_length", [5, 8, 12])
def test_a_long_texts_windows_read_all_of_it_and_the_first_is_the_cut(max_length):
    tok = _tok(max_length)
    text = " ".join(["the cat sat on a mat", "big red house", "river dog"] * 2)
    whole = _content(tok, tok.backend.encode(text).ids)
    (cut,) = tok.encode([text])
    (windowed,) = tok.windowed().encode([text])
    assert windowed.ids == cut.ids and windowed.full == cut.full == len(whole) + 2
    width = max_length - 2
    starts = window_starts(len(whole), width)
    assert len(windowed.windows) == len(starts) > 1
    for start, w in zip(starts, windowed.windows, strict=True):
        assert w.ids[0] == tok.bos_id and w.ids[-1] == tok.eos_id and len(w.ids) <= max_length
        assert _content(tok, w.ids) == whole[start : start + width]
        assert w.type_ids == [0] * len(w.ids)
    assert not windowed.truncated and cut.truncated and windowed.read == windowed.full
    assert windowed.tokens == sum(len(w.ids) for w in windowed.windows)
    (short,) = tok.windowed().encode(["a cat"])
    assert short.rest == () and short.windows == [short] and not short.truncated


def test_a_text_past_the_windows_coverage_is_cut_there_and_said_to_be():
    tok = _tok(6).windowed()
    text = " ".join(["cat"] * (coverage(4) + 9))
    (e,) = tok.encode([text])
    assert len(e.windows) == MAX_WINDOWS and e.truncated and e.read == 2 + coverage(4) == tok.limit
    assert e.full == coverage(4) + 9 + 2
    with pytest.warns(UserWarning, match=r"^1 of 1 texts are longer than the model's 16-window maximum "
                      r"length \(51 tokens; the longest has 60\), so they were truncated"):
        assert tok.check_lengths([e.full], True) == [0]
    assert tok.check_lengths([tok.limit], True) == []


def test_a_huge_text_is_windowed_from_a_prefix_with_the_whole_texts_ids():
    """A 500 kB text: tokenized only as far as its windows read (tformer.text.prefix), their ids
    those of the whole text's tokens."""
    tok = _tok(16).windowed()
    text = "the cat sat on the mat. " * 20_000
    (e,) = tok.encode([text])
    whole = tok.backend.encode(text)
    expected, read = split(whole, 16, True)
    assert [(w.ids, w.type_ids) for w in e.windows] == expected and e.read == read
    assert isinstance(e.full, AtLeast) and e.truncated


def test_a_pairs_windows_keep_the_shorter_segment_whole_in_each():
    tok = _tok(12)
    query, document = "red house", " ".join(["the cat sat on a mat"] * 5)
    for first, second in [(query, document), (document, query)]:
        (cut,) = tok.encode([first], [second])
        (e,) = tok.windowed().encode([first], [second])
        assert e.ids == cut.ids and len(e.windows) > 1 and not e.truncated
        q = _content(tok, tok.backend.encode(query).ids)
        d = _content(tok, tok.backend.encode(document).ids)
        width = 12 - 3 - len(q)
        for start, w in zip(window_starts(len(d), width), e.windows, strict=True):
            part = d[start : start + width]
            assert _content(tok, w.ids) == (q + part if first == query else part + q)
            assert w.ids.count(tok.eos_id) == 2 and len(w.ids) <= 12
            assert w.type_ids == [0] * (w.ids.index(tok.eos_id) + 1) + [1] * (len(w.ids) - w.ids.index(tok.eos_id) - 1)


def test_a_batch_has_a_row_per_window_and_pools_them_back():
    texts = [EncodedText([1, 5, 2], [0, 0, 0]),
             EncodedText([1, 6, 7, 2], [0, 0, 0, 0], 9, (EncodedText([1, 8, 2], [0, 0, 0]),
                                                         EncodedText([1, 9, 10, 2], [0, 0, 0, 0]))),
             EncodedText([1, 3, 2], [0, 0, 0])]
    batch = encoder_batch(texts, 0, [0, 1, 0])
    assert batch.input_ids.shape == (5, 4) and batch.owner.tolist() == [0, 1, 1, 1, 2]
    assert batch.n_examples() == 3 and batch.labels.tolist() == [0, 1, 0]
    assert batch.input_ids[3].tolist() == [1, 9, 10, 2] and batch.attention_mask[2].tolist() == [1, 1, 1, 0]
    rng = np.random.default_rng(0)
    values = rng.standard_normal((5, 3, 2))  # (W, ...): a text's rows pooled over W alone
    for dtype in (torch.float32, torch.float64):
        v = torch.tensor(values, dtype=dtype)
        expected = {"mean": [values[0], values[1:4].mean(0), values[4]],
                    "max": [values[0], values[1:4].max(0), values[4]],
                    "first": [values[0], values[1], values[4]]}
        for how, want in expected.items():
            got = batch.pooled(v, how)
            assert got.dtype == dtype and got.shape == (3, 3, 2)
            assert np.abs(got.numpy() - np.stack(want)).max() <= (1e-12 if dtype == torch.float64 else 1e-6), how
    half = batch.pooled(torch.tensor(values, dtype=torch.bfloat16))
    assert half.dtype == torch.float32  # pooled in at least float32
    single = encoder_batch(texts[:1] + texts[2:], 0)
    assert single.owner is None and single.pooled(torch.ones(2, 3)).equal(torch.ones(2, 3))
    with pytest.raises(ValueError, match="^how: expected mean, max or first, got 'sum'$"):
        batch.pooled(torch.ones(5, 2), "sum")


def test_a_batch_holds_as_many_rows_of_long_texts_as_of_short_ones():
    assert rows([0, 1, 2, 3], [1, 1, 1, 1], 2) == [0, 1]
    assert rows([2, 0, 1], [3, 2, 5], 4) == [2]  # (text 2's 5 windows alone: at least one text)
    assert rows([0, 1, 2], [3, 1, 5], 4) == [0, 1]
