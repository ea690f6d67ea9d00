"""Greedy and beam search over the KV cache."""

from types import SimpleNamespace

import pytest
import torch

from tformer import TransformerConfig
from tformer.nn.generate import GenerationOutput, beam_search, generate, greedy_search
from tformer.nn.model import Seq2SeqTransformer
from tformer.tasks import EOS, PAD, get_task
from tformer.training import forward_loss

# Small tensors: one thread is as fast, and polite to a shared machine.
pytestmark = pytest.mark.usefixtures("one_thread")


@pytest.fixture(scope="module")
def model_and_batch(one_thread):
    """A briefly trained reverse model: it stops (EOS) at different steps per row but
    is still unsure, so beam search and greedy can disagree."""
    task = get_task("reverse", valid_size=10, test_size=10)
    torch.manual_seed(0)
    config = TransformerConfig(d_model=32, n_heads=4, d_ff=64, n_layers=1, dropout=0.0,
                               vocab_size=len(task.tokenizer), max_len=task.max_len)
    model = Seq2SeqTransformer(config)
    opt = torch.optim.Adam(model.parameters(), lr=3e-3)
    for step in range(120):
        loss, _ = forward_loss(model, task.collate(task.train_batch(step, 32)))
        opt.zero_grad()
        loss.backward()
        opt.step()
    model.eval()
    batch = task.collate(task.split("test")[:6])  # varied lengths -> padded sources
    return model, batch


def test_beam_size_one_equals_greedy(model_and_batch):
    model, b = model_and_batch
    greedy = greedy_search(model, b.src, b.src_mask, max_len=12)
    beam = beam_search(model, b.src, b.src_mask, beam_size=1, max_len=12)
    assert torch.equal(greedy.sequences, beam.sequences)
    torch.testing.assert_close(greedy.scores, beam.scores)


def test_greedy_with_cache_equals_without(model_and_batch):
    model, b = model_and_batch
    cached = greedy_search(model, b.src, b.src_mask, max_len=12)
    full = greedy_search(model, b.src, b.src_mask, max_len=12, use_cache=False)
    assert torch.equal(cached.sequences, full.sequences)
    torch.testing.assert_close(cached.scores, full.scores)


def test_greedy_score_is_the_sequence_log_probability(model_and_batch):
    model, b = model_and_batch
    out = greedy_search(model, b.src[:1], b.src_mask[:1], max_len=8)
    seq = out.sequences[:, : len(out.tolist()[0])]  # (1, L) up to EOS
    tgt_in = torch.cat([torch.ones(1, 1, dtype=torch.long), seq[:, :-1]], dim=1)  # BOS + prefix
    logp = model(b.src[:1], tgt_in, src_attention_mask=b.src_mask[:1]).logits.log_softmax(-1)
    torch.testing.assert_close(out.scores, logp.gather(2, seq[..., None]).sum().reshape(1))


def test_beam_scores_are_the_log_probabilities_of_the_returned_sequences(model_and_batch):
    """Re-score each returned beam with a plain teacher-forced pass (no cache): a beam whose
    cache was reordered wrongly would have been scored on another beam's prefix."""
    model, b = model_and_batch
    out = beam_search(model, b.src, b.src_mask, beam_size=3, max_len=12)
    for i, ids in enumerate(out.tolist()):
        seq = torch.tensor([ids])  # (1, L) up to and including EOS
        tgt_in = torch.cat([torch.ones(1, 1, dtype=torch.long), seq[:, :-1]], dim=1)  # BOS + prefix
        with torch.no_grad():
            logits = model(b.src[i : i + 1], tgt_in, src_attention_mask=b.src_mask[i : i + 1]).logits
        expected = logits.log_softmax(-1).gather(2, seq[..., None]).sum()
        torch.testing.assert_close(out.scores[i], expected, atol=1e-4, rtol=0)


def test_beam_search_is_batch_independent(model_and_batch):
    model, b = model_and_batch
    batched = beam_search(model, b.src, b.src_mask, beam_size=3, max_len=10)
    for i in range(b.src.size(0)):
        n = int(b.src_mask[i].sum())  # unpadded source
        alone = beam_search(model, b.src[i : i + 1, :n], b.src_mask[i : i + 1, :n],
                            beam_size=3, max_len=10)
        assert batched.tolist()[i] == alone.tolist()[0]
        torch.testing.assert_close(batched.scores[i : i + 1], alone.scores)


def test_beam_search_finds_at_least_the_greedy_score_without_length_penalty(model_and_batch):
    model, b = model_and_batch
    greedy = greedy_search(model, b.src, b.src_mask, max_len=10)
    beam = beam_search(model, b.src, b.src_mask, beam_size=4, max_len=10, length_penalty=0.0)
    finished = [EOS in row for row in greedy.tolist()]
    assert sum(finished) >= 3
    for i, done in enumerate(finished):
        if done:  # a finished greedy path is one of the candidates beam search ranks
            assert beam.scores[i] >= greedy.scores[i] - 1e-5


def test_eos_ends_a_row_and_pads_after(model_and_batch):
    model, b = model_and_batch
    for out in (greedy_search(model, b.src, b.src_mask, max_len=12),
                beam_search(model, b.src, b.src_mask, beam_size=2, max_len=12)):
        lengths = {len(row) for row in out.tolist()}
        assert len(lengths) >= 3  # rows stopped at different steps
        for row in out.sequences.tolist():
            if EOS in row:
                assert all(t == PAD for t in row[row.index(EOS) + 1 :])


def test_generate_dispatches_and_checks_arguments(model_and_batch):
    model, b = model_and_batch
    assert torch.equal(generate(model, b.src, b.src_mask, max_len=5).sequences,
                       greedy_search(model, b.src, b.src_mask, max_len=5).sequences)
    with pytest.raises(ValueError, match="beam_size: expected a positive int, got 0"):
        beam_search(model, b.src, b.src_mask, beam_size=0)
    with pytest.raises(ValueError, match=r"src_attention_mask: expected shape \(B, S\)"):
        greedy_search(model, b.src, b.src_mask[:, :2])
    assert model.training is False


@pytest.fixture(scope="module")
def random_model_and_eos(one_thread):
    """A random model (d 32, 2+2 layers, vocab 40) and padded sources, with as EOS the token
    whose first appearance in the greedy outputs varies most across rows: rows then stop
    at many different steps, as a trained model's do."""
    torch.manual_seed(1)
    config = TransformerConfig(d_model=32, n_heads=4, d_ff=64, n_layers=2, dropout=0.0,
                               vocab_size=40, max_len=64)
    model = Seq2SeqTransformer(config).eval()
    src = torch.randint(4, 40, (24, 11))
    mask = torch.arange(11)[None] < torch.randint(3, 12, (24,))[:, None]  # (B, S)
    src = src.masked_fill(~mask, PAD)
    free = greedy_search(model, src, mask, max_len=16, eos_id=-1).sequences  # (B, 16), no EOS

    def first_steps(token):  # the step each row first produces `token` (16: never)
        hit = free == token
        return torch.where(hit.any(1), hit.int().argmax(1), 16)
    eos = max(range(4, 40), key=lambda tok: len(set(first_steps(tok).tolist())))
    return model, src, mask, eos


def test_greedy_drops_finished_rows_and_gives_the_uncached_tokens(random_model_and_eos, monkeypatch):
    """Finished rows leave the batch (their cache rows dropped) without changing any row."""
    from tformer.nn import generate as gen

    model, src, mask, eos = random_model_and_eos
    drops, select = [], gen._select

    def counting_select(cache, keep, capacity):
        drops.append(keep.numel())
        return select(cache, keep, capacity)

    monkeypatch.setattr(gen, "_select", counting_select)
    cached = greedy_search(model, src, mask, max_len=16, eos_id=eos)
    full = greedy_search(model, src, mask, max_len=16, eos_id=eos, use_cache=False)
    assert len({len(row) for row in cached.tolist()}) >= 4  # rows stopped at many steps
    assert drops and drops[-1] < src.size(0)  # the batch shrank
    assert torch.equal(cached.sequences, full.sequences)
    torch.testing.assert_close(cached.scores, full.scores)
    alone = [greedy_search(model, src[i : i + 1], mask[i : i + 1], max_len=16, eos_id=eos).tolist()[0]
             for i in range(src.size(0))]
    assert cached.tolist() == alone


def test_beam_search_of_one_beam_is_greedy_on_a_random_model(random_model_and_eos, monkeypatch):
    """Rows whose beams have all finished leave the batch; the others go on as they would."""
    from tformer.nn import generate as gen

    model, src, mask, eos = random_model_and_eos
    drops, select = [], gen._select_beams

    def counting_select(cache, beams, rows, capacity):
        drops.append(rows.numel())
        return select(cache, beams, rows, capacity)

    monkeypatch.setattr(gen, "_select_beams", counting_select)
    greedy = greedy_search(model, src, mask, max_len=16, eos_id=eos)
    beam = beam_search(model, src, mask, beam_size=1, max_len=16, eos_id=eos)
    assert torch.equal(greedy.sequences, beam.sequences)
    torch.testing.assert_close(greedy.scores, beam.scores)
    beam4 = beam_search(model, src, mask, beam_size=4, max_len=16, eos_id=eos)
    for i in range(src.size(0)):  # batch independence, with sources finishing at many steps
        alone = beam_search(model, src[i : i + 1], mask[i : i + 1], beam_size=4, max_len=16,
                            eos_id=eos)
        assert beam4.tolist()[i] == alone.tolist()[0]
        torch.testing.assert_close(beam4.scores[i : i + 1], alone.scores)
    assert drops  # rows left the batch


def test_generation_stops_at_its_deadline_with_the_rows_as_they_are(random_model_and_eos, monkeypatch):
    """A deadline (the time left of a budget) ends the search after the step that passes it:
    greedy and beam give the first tokens they would have given anyway."""
    from tformer.nn import generate as gen

    model, src, mask, _ = random_model_and_eos
    full = greedy_search(model, src, mask, max_len=16, eos_id=-1)
    clock = iter(range(100))
    monkeypatch.setattr(gen, "time", SimpleNamespace(perf_counter=lambda: next(clock)))  # a tick a step
    cut = greedy_search(model, src, mask, max_len=16, eos_id=-1, deadline=2.5)
    assert cut.sequences.shape == (src.size(0), 4)  # steps at ticks 0..3: the fourth passes 2.5
    assert torch.equal(cut.sequences, full.sequences[:, :4])
    beam = beam_search(model, src, mask, beam_size=2, max_len=16, eos_id=-1, deadline=next(clock) + 0.5)
    assert beam.sequences.shape == (src.size(0), 1)


# The beam search before issue 33 (memory repeated per beam, every (beam, token) candidate ranked,
# the whole cache copied at each step), kept as the oracle of the faster one: the same tokens.
def _beam_search_before(model, src_ids, src_attention_mask, beam_size, max_len, length_penalty,
                        bos_id, eos_id, pad_id):
    b, k = src_ids.size(0), beam_size
    memory = model.encode(src_ids, src_attention_mask=src_attention_mask).last_hidden_state
    memory = memory.repeat_interleave(k, dim=0)  # (B*K, S, D)
    mask = src_attention_mask.repeat_interleave(k, dim=0)
    tokens = torch.full((b * k, 1), bos_id, dtype=torch.long)
    scores = torch.full((b, k), float("-inf"))
    scores[:, 0] = 0.0
    scores = scores.view(-1)
    done = torch.zeros(b * k, dtype=torch.bool)
    lengths = torch.zeros(b * k)
    past = None
    for _ in range(max_len):
        out = model.decode(tokens[:, -1:], memory, memory_attention_mask=mask,
                           past_key_values=past, use_cache=True)
        logp = out.logits[:, -1].float().log_softmax(dim=-1)  # (B*K, V)
        v = logp.size(-1)
        logp.masked_fill_(done[:, None], float("-inf"))
        logp[:, pad_id].masked_fill_(done, 0.0)
        top_scores, top = (scores[:, None] + logp).view(b, k * v).topk(k, dim=-1)
        beam = (top // v + torch.arange(b)[:, None] * k).view(-1)
        token = (top % v).view(-1)
        scores = top_scores.view(-1)
        tokens = torch.cat([tokens.index_select(0, beam), token[:, None]], dim=1)
        past = tuple((sk.index_select(0, beam), sv.index_select(0, beam), ck, cv)
                     for sk, sv, ck, cv in out.past_key_values)
        was_done = done.index_select(0, beam)
        lengths = lengths.index_select(0, beam) + (~was_done).float()
        done = was_done | (token == eos_id)
        if done.all():
            break
    final = (scores / lengths.clamp(min=1) ** length_penalty).view(b, k)
    best = final.argmax(dim=-1) + torch.arange(b) * k
    return tokens[best, 1:], scores[best]


@pytest.mark.parametrize("beam_size, length_penalty", [(2, 1.0), (4, 1.0), (4, 0.0), (5, 0.6)])
def test_beam_search_gives_the_tokens_of_the_search_before_issue_33(
        random_model_and_eos, model_and_batch, beam_size, length_penalty):
    """The faster search (per-beam top k, the memory shared by a source's beams, the cache
    reordered in place, finished sources leaving the batch) finds the same sequences as the
    plain search over every (beam, token) candidate, on a random model with rows finishing at
    many steps and on a trained one; scores to fp32 rounding (grouped attention sums in another
    order)."""
    model, src, mask, eos = random_model_and_eos
    trained, batch = model_and_batch
    for m, s, sm, e in ((model, src, mask, eos), (trained, batch.src, batch.src_mask, EOS)):
        ids = dict(bos_id=1, eos_id=e, pad_id=PAD)
        with torch.no_grad():
            want, want_scores = _beam_search_before(m, s, sm, beam_size, 14, length_penalty, **ids)
        got = beam_search(m, s, sm, beam_size=beam_size, max_len=14,
                          length_penalty=length_penalty, **ids)
        expected = GenerationOutput(want, want_scores, e, PAD).tolist()
        assert got.tolist() == expected
        torch.testing.assert_close(got.scores, want_scores, rtol=1e-5, atol=1e-5)


def test_beam_search_with_a_vocabulary_smaller_than_the_beam(random_model_and_eos):
    """Each beam keeps all V tokens when V < K: the same search as ranking every candidate."""
    torch.manual_seed(3)
    config = TransformerConfig(d_model=16, n_heads=2, d_ff=32, n_layers=1, dropout=0.0,
                               vocab_size=6, max_len=32)
    model = Seq2SeqTransformer(config).eval()
    src = torch.randint(4, 6, (3, 5))
    mask = torch.ones_like(src, dtype=torch.bool)
    ids = dict(bos_id=1, eos_id=4, pad_id=PAD)
    with torch.no_grad():
        want, want_scores = _beam_search_before(model, src, mask, 8, 6, 1.0, **ids)
    got = beam_search(model, src, mask, beam_size=8, max_len=6, **ids)
    assert got.tolist() == GenerationOutput(want, want_scores, 4, PAD).tolist()
    torch.testing.assert_close(got.scores, want_scores, rtol=1e-5, atol=1e-5)
