"""The decoder's cache during a step that leaves it as it is (``grow_cache=False``: what a compiled
decoding step runs) against one that grows it in place, and the two-block attention it uses."""

import pytest
import torch
import torch.nn.functional as F

from tformer import TransformerConfig
from tformer.nn import kernels
from tformer.nn.attention import with_room
from tformer.nn.cache import grow, keep_rows, stay_in_place, with_room_all
from tformer.nn.model import Seq2SeqTransformer
from tformer.nn.step import next_hidden

pytestmark = pytest.mark.usefixtures("one_thread")


@pytest.mark.parametrize("dtype, tol", [(torch.float32, 1e-6), (torch.float64, 1e-14), (torch.bfloat16, 1e-2)])
def test_attention_to_the_past_and_a_new_position_equals_attention_over_both(dtype, tol):
    """One query a row against the cache and its own new key, without concatenating them: the
    result of attention over the concatenation (float64 SDPA on the same values), to the
    dtype's rounding relative to the largest output (bf16: its scores are rounded to bf16)."""
    g = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(6, 4, 1, 16, generator=g).to(dtype) for _ in range(3))
    past_k, past_v = (3 * torch.randn(6, 4, 9, 16, generator=g).to(dtype) for _ in range(2))
    got = kernels.attention_past_and_new(q, past_k, past_v, k, v)
    assert got.dtype == dtype and got.shape == q.shape
    expected = F.scaled_dot_product_attention(q.double(), torch.cat([past_k, k], 2).double(),
                                              torch.cat([past_v, v], 2).double())
    assert float((got.double() - expected).abs().max()) <= tol * float(expected.abs().max())


@pytest.fixture(scope="module")
def model_and_cache():
    """A small random model, its memory of 3 sources, and the caches after 5 steps of 3 x 2 beams
    (with room for 16 positions, as the searches keep them)."""
    torch.manual_seed(0)
    config = TransformerConfig(d_model=32, n_heads=4, d_ff=64, n_layers=2, dropout=0.0,
                               vocab_size=40, max_len=64)
    model = Seq2SeqTransformer(config).eval().requires_grad_(False)
    src = torch.randint(4, 40, (3, 7))
    mask = torch.arange(7)[None] < torch.tensor([[7], [4], [5]])  # (B, S)
    memory = model.encode(src, src_attention_mask=mask).last_hidden_state
    tokens = torch.randint(4, 40, (6, 6))  # 2 beams a source
    out = model.decode(tokens[:, :5], memory, memory_attention_mask=mask, use_cache=True)
    return model, memory, mask, tokens[:, 5:], out.past_key_values


def _copy(cache, room: bool):
    cache = tuple(tuple(t.clone() for t in layer) for layer in cache)
    return with_room_all(cache, 16) if room else cache


@pytest.mark.parametrize("room", [True, False])
def test_a_step_that_leaves_the_cache_equals_one_that_grows_it(model_and_cache, room):
    """model.decode(grow_cache=False) gives the growing step's logits, leaves the past as it was
    (its positions and values), and returns the new positions' keys/values, which ``grow``
    appends into the very cache the growing step returns."""
    model, memory, mask, token, cache = model_and_cache
    grown = model.decode(token, memory, memory_attention_mask=mask, past_key_values=_copy(cache, room),
                         use_cache=True)
    past = _copy(cache, room)
    before = [tuple(t.clone() for t in layer) for layer in past]
    out = model.decode(token, memory, memory_attention_mask=mask, past_key_values=past, use_cache=True,
                       grow_cache=False)
    torch.testing.assert_close(out.logits, grown.logits, rtol=0, atol=1e-6)
    for layer, was, new, whole in zip(past, before, out.past_key_values, grown.past_key_values, strict=True):
        for t, t0 in zip(layer, was, strict=True):
            assert torch.equal(t, t0)  # the past as it was
        assert new[0].shape == new[1].shape == (6, 4, 1, 8)  # the new position only
        torch.testing.assert_close(new[0], whole[0][:, :, 5:], rtol=0, atol=0)
        torch.testing.assert_close(new[1], whole[1][:, :, 5:], rtol=0, atol=0)
    for layer, whole in zip(grow(past, out.past_key_values), grown.past_key_values, strict=True):
        for t, expected in zip(layer, whole, strict=True):
            assert torch.equal(t, expected)


def test_a_traced_step_attends_without_writing_into_its_input(model_and_cache, monkeypatch):
    """Traced (torch.compile; the eager backend runs dynamo's graph as captured), the step takes
    the two-block attention, which writes nothing: its hidden state and new keys/values are the eager
    step's (to float32 rounding: a layer's attention rounds differently, and the next layer's
    keys are computed from it), and the cache's room is untouched."""
    model, memory, mask, token, cache = model_and_cache
    expected_hidden, expected_new = next_hidden(model, token, memory, mask, _copy(cache, True))
    past = _copy(cache, True)
    rooms = [layer[0].as_strided((6, 4, 6, 8), layer[0].stride())[:, :, 5:].clone() for layer in past]
    two_blocks, calls = kernels.attention_past_and_new, []
    monkeypatch.setattr(kernels, "attention_past_and_new", lambda *a: calls.append(1) or two_blocks(*a))
    torch._dynamo.reset()
    hidden, new = torch.compile(next_hidden, backend="eager", fullgraph=True, dynamic=True)(
        model, token, memory, mask, past)
    torch.testing.assert_close(hidden, expected_hidden, rtol=1e-5, atol=1e-5)
    for got, expected in zip(new, expected_new, strict=True):
        torch.testing.assert_close(got[0], expected[0], rtol=1e-5, atol=1e-5)
        torch.testing.assert_close(got[1], expected[1], rtol=1e-5, atol=1e-5)
    for layer, room in zip(past, rooms, strict=True):  # bit for bit: the room is uninitialised, NaN maybe
        after = layer[0].as_strided((6, 4, 6, 8), layer[0].stride())[:, :, 5:]
        assert torch.equal(after.view(torch.int32), room.view(torch.int32))
    assert len(calls) == 2  # a layer each: the two-block attention, not a concatenation


def test_a_traced_beam_step_is_one_graph_when_a_size_equals_the_models_width():
    """16 sources (memory rows) for a model 16 wide: traced with torch's default (sizes equal
    when traced share a symbol), the grouped cross-attention's checks still hold, and the step
    is one graph (fullgraph raises at a break; a check that raised broke it in two before)."""
    torch.manual_seed(0)
    config = TransformerConfig(d_model=16, n_heads=2, d_ff=32, n_layers=1, dropout=0.0, vocab_size=20,
                               max_len=32)
    model = Seq2SeqTransformer(config).eval().requires_grad_(False)
    src, mask = torch.randint(4, 20, (16, 5)), torch.ones(16, 5, dtype=torch.bool)
    memory = model.encode(src, src_attention_mask=mask).last_hidden_state
    tokens = torch.randint(4, 20, (32, 4))  # 2 beams a source
    past = with_room_all(model.decode(tokens[:, :3], memory, memory_attention_mask=mask,
                                      use_cache=True).past_key_values, 8)
    expected, _ = next_hidden(model, tokens[:, 3:], memory, mask, past)
    torch._dynamo.reset()
    got, _ = torch.compile(next_hidden, backend="eager", fullgraph=True, dynamic=True)(
        model, tokens[:, 3:], memory, mask, past)
    torch.testing.assert_close(got, expected, rtol=1e-5, atol=1e-5)


def _moves(parent: list[int], order: list[int]) -> int:
    """Rows copied when slot s takes the beam of rank order[s] (a row stays only in its parent's slot)."""
    return sum(parent[r] != s for s, r in enumerate(order))


@pytest.mark.parametrize("k", [1, 2, 3, 4, 5])
def test_next_beams_stay_in_their_parents_rows_where_they_can(k):
    """Every way K ranked beams can descend from K parents: the order is a permutation that moves
    no more rows than the best of all K! orders (each parent's best child in its own slot), and
    the children that move keep their rank order in the free slots."""
    import itertools

    parents = torch.tensor(list(itertools.product(range(k), repeat=k)))  # (K^K, K)
    order = stay_in_place(parents, torch.arange(k).expand(parents.shape).contiguous())
    assert order.shape == parents.shape
    for parent, got in zip(parents.tolist(), order.tolist(), strict=True):
        assert sorted(got) == list(range(k))
        fewest = min(_moves(parent, list(p)) for p in itertools.permutations(range(k)))
        assert _moves(parent, got) == fewest == k - len(set(parent))
        moved = [r for s, r in enumerate(got) if parent[r] != s]
        assert moved == sorted(moved)
        stays = {parent[r]: r for s, r in enumerate(got) if parent[r] == s}
        assert all(stays[p] == parent.index(p) for p in stays)  # the best child of each parent


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_log_probs_are_written_into_the_searchs_buffer_where_dtypes_allow(dtype):
    """step.log_probs: the log-softmax of h W^T (float64 reference), in the buffer's first rows
    when the buffer, the weight and the scores share a dtype; a bf16 model's in a tensor of its
    own, in the scores' dtype."""
    from tformer.nn.step import log_probs

    g = torch.Generator().manual_seed(0)
    h, w = torch.randn(5, 16, generator=g, dtype=dtype), torch.randn(300, 16, generator=g, dtype=dtype)
    expected = torch.log_softmax(h.double() @ w.double().T, dim=-1)
    buffer = torch.full((8, 300), float("nan"), dtype=dtype)
    got = log_probs(h, w, dtype, buffer)
    assert got.data_ptr() == buffer.data_ptr() and got.shape == (5, 300)
    torch.testing.assert_close(got.double(), expected, rtol=1e-5, atol=1e-5)
    assert torch.isnan(buffer[5:]).all()  # rows past the step's untouched
    bf16 = log_probs(h.bfloat16(), w.bfloat16(), torch.float32, buffer.float())
    assert bf16.dtype == torch.float32 and bf16.data_ptr() != buffer.data_ptr()
    torch.testing.assert_close(bf16.double(), expected, rtol=0.1, atol=0.1)


@pytest.mark.parametrize("index", [[0, 2, 3, 6], [1, 2, 3, 4, 5, 6, 7], [0, 1, 2], [7, 0, 7, 3]])
def test_rows_kept_in_place_equal_the_rows_selected_and_keep_their_room(index):
    """A search's kept rows are moved to its cache's first rows (only those whose place changes),
    a view of the same buffer: the values of t[index], room after their last position as before."""
    cache = with_room(torch.randn(8, 2, 5, 3, dtype=torch.float64), capacity=9)  # (8, 2, 5, 3) of 9
    index = torch.tensor(index, dtype=torch.long)
    expected = cache[index].clone()
    other = torch.randn(8, 4)
    expected_other = other[index].clone()
    kept, kept_other = keep_rows([cache, other], index)
    assert torch.equal(kept, expected) and torch.equal(kept_other, expected_other)
    assert kept.data_ptr() == cache.data_ptr() and kept.stride() == cache.stride()
    grown = grow(((kept, kept.clone(), None, None),), ((torch.ones(len(index), 2, 1, 3),) * 2,))[0][0]
    assert grown.data_ptr() == cache.data_ptr() and torch.equal(grown[:, :, :5], expected)
