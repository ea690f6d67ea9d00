"""Greedy and beam search over the KV cache."""

import json
from types import SimpleNamespace

import numpy as np
import pytest
import torch
from helpers import briefly_trained_reverse

from tformer import TransformerConfig
from tformer.nn import generate as gen
from tformer.nn.generate import beam_search, generate, greedy_search
from tformer.nn.model import Seq2SeqTransformer
from tformer.training.tasks import EOS, PAD

# Small tensors: one thread is as fast, and polite to a shared machine.
pytestmark = pytest.mark.usefixtures("one_thread")


@pytest.fixture(scope="module")
def model_and_batch(one_thread):
    """A briefly trained reverse model (tests/helpers.py) and six padded sources."""
    return briefly_trained_reverse()


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
    # A bad length penalty is refused whichever search runs (greedy ignored it: a typo passed).
    for penalty in (float("nan"), "1"):
        with pytest.raises(ValueError, match="^length_penalty: expected a number"):
            generate(model, b.src, b.src_mask, beam_size=1, length_penalty=penalty)
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

    model, src, mask, eos = random_model_and_eos
    drops, select = [], gen._select

    def counting_select(cache, keep):
        drops.append(keep.numel())
        return select(cache, keep)

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

    model, src, mask, eos = random_model_and_eos
    drops, select = [], gen._select_beams

    def counting_select(cache, beams, rows):
        drops.append(rows.numel())
        return select(cache, beams, rows)

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

    model, src, mask, _ = random_model_and_eos
    full = greedy_search(model, src, mask, max_len=16, eos_id=-1)
    clock = iter(range(100))
    monkeypatch.setattr(gen, "time", SimpleNamespace(perf_counter=lambda: next(clock)))  # a tick a step
    cut = greedy_search(model, src, mask, max_len=16, eos_id=-1, deadline=2.5)
    assert cut.sequences.shape == (src.size(0), 4)  # steps at ticks 0..3: the fourth passes 2.5
    assert torch.equal(cut.sequences, full.sequences[:, :4])
    assert full.complete and not cut.complete  # cut outputs say so: they are not the model's ends
    beam = beam_search(model, src, mask, beam_size=2, max_len=16, eos_id=-1, deadline=next(clock) + 0.5)
    assert beam.sequences.shape == (src.size(0), 1) and not beam.complete
    # A search that ends (max_len) at the step that passes the deadline was not cut.
    assert greedy_search(model, src, mask, max_len=4, eos_id=-1, deadline=next(clock) + 3.5).complete


# The rule of beam_search spelled out one source at a time, with Python lists and no cache (the
# decoder re-reads each whole prefix), as the oracle of the batched, cached search.
def _plain_beam_search(model, src, mask, beam_size, max_len, length_penalty, bos_id, eos_id,
                       early_stopping=False):
    """One source (S,): the best hypothesis's tokens (EOS included) and total log-probability.
    ``early_stopping``: also stop once beam_size hypotheses have finished (the peers' rule)."""
    memory = model.encode(src[None], src_attention_mask=mask[None]).last_hidden_state
    live = [([bos_id], np.float32(0.0))]  # (tokens with BOS, total log-probability)
    finished = []  # (score / len ** length_penalty, tokens after BOS, total)
    for _ in range(max_len):
        candidates = []
        for prefix, total in live:
            logits = model.decode(torch.tensor([prefix]), memory, memory_attention_mask=mask[None],
                                  use_cache=False).logits[0, -1]
            for token, logp in enumerate(logits.float().log_softmax(dim=-1).numpy()):
                candidates.append((total + logp, prefix + [token]))
        candidates.sort(key=lambda c: -c[0])
        length = len(candidates[0][1]) - 1
        finished += [(total / length ** length_penalty, prefix[1:], total)
                     for total, prefix in candidates[:beam_size] if prefix[-1] == eos_id]
        live = [(prefix, total) for total, prefix in candidates if prefix[-1] != eos_id][:beam_size]
        if finished and max(f[0] for f in finished) >= live[0][1] / length ** length_penalty:
            break  # the best hypothesis scores at least the best live prefix would now
        if early_stopping and len(finished) >= beam_size:
            break  # K hypotheses have finished, whatever their scores
    else:  # max_len: the live prefixes are hypotheses as they are
        finished += [(total / max_len ** length_penalty, prefix[1:], total) for prefix, total in live]
    _, tokens, total = max(finished, key=lambda h: h[0])
    return tokens, float(total)


@pytest.fixture(params=["best first", "in place"])
def beam_order(request, monkeypatch):
    """The next beams best first, or in the order that moves the fewest cache rows from the first
    step on (cache.stay_in_place; a search of these small models would not reach its cache size)."""
    if request.param == "in place":
        monkeypatch.setattr(gen, "_STAY_IN_PLACE_FROM", 0)
    return request.param


@pytest.mark.parametrize("beam_size, length_penalty", [(2, 1.0), (4, 1.0), (4, 0.0), (5, 0.6)])
def test_beam_search_gives_the_plain_searchs_tokens(
        random_model_and_eos, model_and_batch, beam_size, length_penalty, beam_order):
    """The batched search (per-beam top k, the memory shared by a source's beams, the cache
    reordered in place, stopped sources leaving the batch) finds, source by source, the plain
    search's hypothesis, on a random model with sources stopping at many steps and on a trained
    one; scores to fp32 rounding (the cached decoder sums in another order)."""
    model, src, mask, eos = random_model_and_eos
    trained, batch = model_and_batch
    for m, s, sm, e in ((model, src, mask, eos), (trained, batch.src, batch.src_mask, EOS)):
        got = beam_search(m, s, sm, beam_size=beam_size, max_len=14,
                          length_penalty=length_penalty, bos_id=1, eos_id=e, pad_id=PAD)
        with torch.no_grad():
            want = [_plain_beam_search(m, s[i], sm[i], beam_size, 14, length_penalty, 1, e)
                    for i in range(s.size(0))]
        assert got.tolist() == [tokens for tokens, _ in want]
        torch.testing.assert_close(got.scores, torch.tensor([t for _, t in want]), rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("beam_size, length_penalty", [(4, 1.0), (3, 0.0)])
def test_early_stopping_gives_the_plain_searchs_tokens_under_the_peers_rule(
        random_model_and_eos, beam_size, length_penalty, beam_order):
    """early_stopping=True: a source also stops once K hypotheses have finished (Hugging Face's
    early_stopping=True, CTranslate2's rule). Source by source the plain search's hypothesis under
    that rule; on this random model it stops sooner and changes some outputs (why it is an
    option, off by default)."""
    model, src, mask, eos = random_model_and_eos
    args = dict(beam_size=beam_size, max_len=14, length_penalty=length_penalty, bos_id=1, eos_id=eos,
                pad_id=PAD)
    got = beam_search(model, src, mask, early_stopping=True, **args)
    default = beam_search(model, src, mask, **args)
    with torch.no_grad():
        want = [_plain_beam_search(model, src[i], mask[i], beam_size, 14, length_penalty, 1, eos,
                                   early_stopping=True) for i in range(src.size(0))]
    assert got.tolist() == [tokens for tokens, _ in want]
    torch.testing.assert_close(got.scores, torch.tensor([t for _, t in want]), rtol=1e-5, atol=1e-5)
    if length_penalty:  # (without one, EOS first is at once the best: both stop at step 1 here)
        assert got.tolist() != default.tolist()  # the rule changes results here
    assert generate(model, src, mask, early_stopping=True, **args).tolist() == got.tolist()


def test_beam_search_with_a_vocabulary_smaller_than_the_beam(beam_order):
    """With V < K + 1 each beam keeps all V tokens and some beams die (no candidate left that
    is not EOS): still the plain search's hypotheses."""
    torch.manual_seed(3)
    config = TransformerConfig(d_model=16, n_heads=2, d_ff=32, n_layers=1, dropout=0.0,
                               vocab_size=6, max_len=32)
    model = Seq2SeqTransformer(config).eval()
    src = torch.randint(4, 6, (3, 5))
    mask = torch.ones_like(src, dtype=torch.bool)
    got = beam_search(model, src, mask, beam_size=8, max_len=6, bos_id=1, eos_id=4, pad_id=PAD)
    with torch.no_grad():
        want = [_plain_beam_search(model, src[i], mask[i], 8, 6, 1.0, 1, 4) for i in range(3)]
    assert got.tolist() == [tokens for tokens, _ in want]
    torch.testing.assert_close(got.scores, torch.tensor([t for _, t in want]), rtol=1e-5, atol=1e-5)


def test_beam_search_without_length_penalty_is_exact_when_the_beam_holds_every_prefix():
    """With K at least V ** max_len nothing is pruned, and stopping once the best candidate is
    EOS loses nothing under length_penalty 0: the result is the most likely sequence of all,
    found here by enumerating every sequence (float64)."""
    torch.manual_seed(4)
    config = TransformerConfig(d_model=16, n_heads=2, d_ff=32, n_layers=1, dropout=0.0,
                               vocab_size=5, max_len=16)
    model = Seq2SeqTransformer(config).double().eval()
    src = torch.tensor([[3, 4, 2, 4]])
    mask = torch.ones_like(src, dtype=torch.bool)
    eos, max_len = 2, 3
    with torch.no_grad():
        memory = model.encode(src, src_attention_mask=mask).last_hidden_state

        def logp(prefix):  # log-probabilities of the next token after BOS + prefix
            out = model.decode(torch.tensor([[1, *prefix]]), memory, memory_attention_mask=mask)
            return out.logits[0, -1].log_softmax(dim=-1)

        def sequences(prefix):  # every sequence: EOS ends one, max_len cuts one
            if prefix and prefix[-1] == eos or len(prefix) == max_len:
                yield prefix
                return
            for token in range(5):
                yield from sequences([*prefix, token])

        def total(seq):
            return sum(float(logp(seq[:i])[t]) for i, t in enumerate(seq))

        best = max(sequences([]), key=total)
        best_total = total(best)
    got = beam_search(model, src, mask, beam_size=5 ** max_len, max_len=max_len, length_penalty=0.0,
                      bos_id=1, eos_id=eos, pad_id=PAD)
    assert got.tolist()[0] == best
    assert got.scores[0].item() == pytest.approx(best_total, abs=1e-5)


@pytest.mark.parametrize("penalty", [500.0, -500.0, float("inf"), float("nan"), "1"])
def test_a_length_penalty_no_length_can_be_raised_to_is_refused(penalty):
    from tformer.nn.search_args import check_length_penalty

    with pytest.raises(ValueError, match=r"length_penalty: expected a number with max_len \*\* \|length_penalty\| finite \(max_len 64\)"):
        check_length_penalty(penalty, 64)
    check_length_penalty(2.0, 64)
    check_length_penalty(0, 64)


def _small(positional="sinusoidal", max_len=8):
    torch.manual_seed(0)
    return Seq2SeqTransformer(TransformerConfig(d_model=16, n_heads=2, d_ff=32, n_layers=1, dropout=0.0,
                                                vocab_size=12, max_len=max_len, positional=positional)).eval()


SEARCHES = [greedy_search, beam_search, generate]


@pytest.mark.parametrize("search", SEARCHES)
def test_a_search_refuses_sources_that_are_not_tensors_naming_them(search):
    # A list or a numpy array was "'list' object has no attribute 'dim'"; the models take tensors only.
    model, src = _small(), torch.tensor([[5, 6, 7]])
    for bad, got in (([[5, 6, 7]], "list"), (np.array([[5, 6, 7]]), "ndarray")):
        with pytest.raises(TypeError, match=rf"^src_ids: expected a torch.Tensor of token ids, got {got}$"):
            search(model, bad)
    with pytest.raises(TypeError, match=r"^src_attention_mask: expected a torch.Tensor mask .*, got list$"):
        search(model, src, [[1, 1, 1]])


@pytest.mark.parametrize("search", SEARCHES)
def test_a_search_refuses_a_model_that_is_not_an_encoder_decoder(search):
    # An Encoder was "'Encoder' object has no attribute 'encode'" from inside the search.
    from tformer.nn.model import Encoder, EncoderClassifier

    config = TransformerConfig(d_model=16, n_heads=2, d_ff=32, n_layers=1, vocab_size=12, max_len=8)
    for model in (Encoder(config), EncoderClassifier(config.replace(n_classes=2)), None):
        name = type(model).__name__
        with pytest.raises(TypeError, match=rf"^model: expected a Seq2SeqTransformer \(an encoder-decoder\), "
                                            rf"got {name}$"):
            search(model, torch.tensor([[5, 6, 7]]))


@pytest.mark.parametrize("positional", ["sinusoidal", "learned"])
@pytest.mark.parametrize("search", SEARCHES)
def test_max_len_is_at_most_the_models_positions(search, positional):
    """Past config.max_len a learned table has no row (an IndexError-like failure at that step),
    and sinusoids were recomputed every step with a cache allocated for all of max_len: refused
    as `tformer generate --max-len` refuses it. Without max_len: 64, at most the positions."""
    model, src = _small(positional, max_len=8), torch.tensor([[5, 6, 7]])
    with pytest.raises(ValueError, match=r"^max_len: expected 1\.\.8 \(the model's positions\), got 9$"):
        search(model, src, max_len=9)
    with pytest.raises(ValueError, match=r"^max_len: expected 1\.\.8 \(the model's positions\), got 1000000$"):
        search(model, src, max_len=10**6)
    assert search(model, src, max_len=8, eos_id=-1).sequences.shape == (1, 8)
    assert search(model, src, eos_id=-1).sequences.shape == (1, 8)  # the default: all 8 positions


@pytest.mark.parametrize("search", SEARCHES)
def test_a_search_refuses_bad_special_ids_and_deadline_naming_them(search):
    # bos_id 99 was refused as "tgt_ids"; a str id or deadline was a bare TypeError (the
    # deadline's after the first step).
    model, src = _small(), torch.tensor([[5, 6, 7]])
    for kwargs, error, message in [
        (dict(bos_id=99), ValueError, r"^bos_id: expected a token id in \[0, 12\) \(the target vocabulary\), got 99$"),
        (dict(pad_id=-1), ValueError, r"^pad_id: expected a token id in \[0, 12\) \(the target vocabulary\), got -1$"),
        (dict(bos_id="1"), TypeError, r"^bos_id: expected an int token id, got str$"),
        (dict(eos_id=None), TypeError, r"^eos_id: expected an int token id, got NoneType$"),
        (dict(deadline="soon"), TypeError, r"^deadline: expected a time.perf_counter\(\) reading \(a float\) or None, got str$"),
    ]:
        with pytest.raises(error, match=message):
            search(model, src, max_len=4, **kwargs)
    assert search(model, src, max_len=4, eos_id=-1, bos_id=np.int64(1)).sequences.shape == (1, 4)  # -1: no EOS


@pytest.mark.parametrize("search", SEARCHES)
def test_a_search_gives_a_training_model_back_in_training_mode_also_when_it_raises(search):
    # The model was put in eval mode and left there when model.encode refused the sources: the
    # next search then saw it as an eval model, and training went on without dropout.
    model = _small().train()
    with pytest.raises(TypeError, match="^src_ids: "):
        search(model, [[5, 6, 7]])
    assert model.training
    search(model, torch.tensor([[5, 6, 7]]), max_len=2)
    assert model.training and all(m.training for m in model.modules())


def test_a_beam_that_cannot_fit_in_memory_is_refused_before_any_work(model_and_batch, monkeypatch):
    """beam_size 10**7 was killed for memory with no message: the search's state (each beam's
    self-attention cache for max_len positions, a step's logits and log-probabilities) is
    estimated first and refused naming beam_size, before the source is encoded. The torch
    search and the NumPy mirror alike."""
    from tformer.reference.generate import beam_search as numpy_beam_search
    from tformer.reference.model import Seq2SeqTransformer as NumpySeq2Seq

    model, b = model_and_batch
    src, mask = b.src, b.src_mask
    monkeypatch.setattr(model, "encode", lambda *a, **k: pytest.fail("encoded before the check"))
    c = model.config
    need = src.size(0) * 10**7 * (c.decoder_layers * 2 * 8 * c.d_model + 3 * c.target_vocab_size) * 4
    with pytest.raises(ValueError, match=rf"^beam_size: {src.size(0)} sources x 10000000 beams x 8 tokens "
                                         rf"need {need / 2**30:,.1f} GiB \(caches and log-probabilities\); "
                                         r"expected at most the [\d,.]+ GiB available$"):
        beam_search(model, src, mask, beam_size=10**7, max_len=8)
    numpy_model = NumpySeq2Seq(c)
    monkeypatch.setattr(numpy_model, "encode", lambda *a, **k: pytest.fail("encoded before the check"))
    with pytest.raises(ValueError, match=r"^beam_size: 1 sources x 10000000 beams x 8 tokens need "):
        numpy_beam_search(numpy_model, src.numpy(), mask.numpy(), beam_size=10**7, max_len=8)
    monkeypatch.undo()  # a beam that fits is searched
    assert beam_search(model, src, mask, beam_size=3, max_len=8).sequences.size(0) == src.size(0)


@pytest.mark.slow  # 2-3 minutes of tracing and compiling on a busy 2-core machine
@pytest.mark.parametrize("backend", ["aot_eager", "inductor"])
def test_a_compiled_decoding_step_gives_the_eager_searchs_outputs(random_model_and_eos, monkeypatch,
                                                                  tmp_path, backend):
    """Where the decoding step runs compiled (tformer.nn.kernels.compiling; TFORMER_COMPILE=1 lets
    every step's shape class measure it), greedy and beam search return the eager searches'
    tokens and scores. aot_eager traces the step as inductor does (one graph: the cache's
    in-place growth is asked nothing while tracing), without building C++; inductor (slow) is
    what runs."""
    import shutil

    from tformer.nn import step
    from tformer.nn.kernels import autotune, compiling

    if backend == "inductor" and shutil.which("g++") is None and shutil.which("clang++") is None:
        pytest.skip("inductor needs a C++ compiler")
    model, src, mask, eos = random_model_and_eos
    ids = dict(max_len=16, eos_id=eos)
    monkeypatch.setenv("TFORMER_COMPILE", "0")
    greedy, beam = greedy_search(model, src, mask, **ids), beam_search(model, src, mask, beam_size=4, **ids)
    monkeypatch.setenv("TFORMER_COMPILE", "1")
    monkeypatch.setenv("TFORMER_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.setattr(autotune, "_memory", {})
    monkeypatch.setattr(autotune, "ROUNDS", 1)  # each shape class timed once: the choice is not the point
    monkeypatch.setattr(compiling, "BACKEND", backend)
    monkeypatch.setattr(step, "DECODE_STEP", compiling.Compiled("decode-hidden", step.next_hidden,
                                                                shape_class=step._step_class))
    compiling.forget_failures()
    got_greedy = greedy_search(model, src, mask, **ids)
    got_beam = beam_search(model, src, mask, beam_size=4, **ids)
    assert not compiling.summary()  # compiled without a failure (else it ran eagerly)
    assert step.DECODE_STEP.compile_seconds is not None
    assert got_greedy.tolist() == greedy.tolist() and got_beam.tolist() == beam.tolist()
    torch.testing.assert_close(got_greedy.scores, greedy.scores, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(got_beam.scores, beam.scores, rtol=1e-5, atol=1e-5)
    decided = [k for k in json.loads(autotune.cache_path().read_text()) if "compiled:decode-hidden" in k]
    assert decided  # the steps' shape classes were measured (and may have chosen either)


def test_beams_in_place_copy_fewer_cache_rows_and_find_the_same(random_model_and_eos, monkeypatch):
    """The order that keeps beams in their parents' rows (cache.stay_in_place) copies fewer rows
    when the cache is reordered than best first, and the search finds the same hypotheses."""
    model, src, mask, eos = random_model_and_eos
    reorder, moved = gen._reorder_cache, []

    def counting_reorder(cache, beam):
        moved[-1] += int((beam != torch.arange(beam.numel())).sum())
        return reorder(cache, beam)

    monkeypatch.setattr(gen, "_reorder_cache", counting_reorder)
    found = []
    for start in (float("inf"), 0):  # best first, then in place from the first step
        monkeypatch.setattr(gen, "_STAY_IN_PLACE_FROM", start)
        moved.append(0)
        found.append(beam_search(model, src, mask, beam_size=4, max_len=14, bos_id=1, eos_id=eos,
                                 pad_id=PAD).tolist())
    assert found[0] == found[1]
    assert moved[1] < 0.8 * moved[0]
