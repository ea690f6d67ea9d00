"""The decoding peers of `tformer bench` (decode-marian, decode-default): HF's MarianMTModel built
from tformer's weights computes tformer's logits, and CTranslate2, converted from that export and
run in a process of its own, decodes greedily to tformer's tokens."""

from __future__ import annotations

import importlib.util

import pytest
import torch

from tformer.commands.benchmarking import decode_peers as D
from tformer.commands.benchmarking.harness import Measured, measure
from tformer.nn.generate import beam_search, greedy_search
from tformer.nn.model import Seq2SeqTransformer

pytest.importorskip("transformers")

LOGITS = 1e-5  # fp32 max abs diff of teacher-forced logits at the quick size (the bench holds 1e-4)
MAX_LEN = 10


@pytest.fixture(scope="module")
def setup():
    torch.manual_seed(0)
    model = Seq2SeqTransformer(D.marian_layout_config("quick", 300, max_len=64)).eval()
    torch.nn.init.normal_(model.src_emb.weight, std=0.02)
    src, mask = D.real_sources(6, 300)
    eos = D.spread_eos(model, src, mask, MAX_LEN)
    expected = greedy_search(model, src, mask, max_len=MAX_LEN, bos_id=D.BOS, eos_id=eos,
                             pad_id=D.PAD).tolist()
    return model, D.hf_marian(model), src, mask, eos, expected


def test_hf_marian_computes_tformers_logits(setup):
    model, hf, src, mask, _, _ = setup
    tgt = torch.cat([torch.full((src.size(0), 1), D.BOS), src[:, :5].clamp(min=4)], dim=1)
    with torch.no_grad():
        theirs = hf(input_ids=src, attention_mask=mask, decoder_input_ids=tgt).logits
        ours = model(src, tgt, src_attention_mask=mask).logits
    assert (theirs - ours).abs().max().item() <= LOGITS


def test_hf_generate_decodes_tformers_greedy_tokens(setup):
    _, hf, src, mask, eos, expected = setup
    assert D.hf_generate(hf, src, mask, MAX_LEN, eos, 1) == expected


@pytest.mark.skipif(importlib.util.find_spec("ctranslate2") is None, reason="ctranslate2 is not installed")
def test_ctranslate2_decodes_in_its_own_process(setup, tmp_path):
    """The worker's greedy output is tformer's, token for token; it answers timed calls as
    measure() needs them; both workers exit cleanly."""
    _, hf, src, mask, eos, expected = setup
    workers, why = D.ct2_workers(hf, src, mask, MAX_LEN, eos, threads=1, work=tmp_path)
    assert why == ""
    try:
        ready = {n: w.ready() for n, w in workers.items()}
        assert ready["CTranslate2 greedy"]["output"] == expected
        assert len(ready["CTranslate2 beam 4"]["output"]) == src.size(0)
        timings = measure(workers, rounds=2, warmup=0)
        assert all(len(t.wall) == 2 and min(t.wall) > 0 for t in timings.values())
        assert isinstance(workers["CTranslate2 greedy"](), Measured)
    finally:
        for w in workers.values():
            w.close()
    assert all(w.proc.returncode == 0 for w in workers.values())


def test_sequence_scores_are_what_beam_search_ranked(setup):
    """Teacher-forced scores of beam search's outputs equal the scores the cached search summed
    (two independent paths: a full forward per row set against step-by-step decoding)."""
    model, _, src, mask, eos, _ = setup
    out = beam_search(model, src, mask, beam_size=3, max_len=MAX_LEN, bos_id=D.BOS, eos_id=eos,
                      pad_id=D.PAD)
    rows = out.tolist()
    lengths = torch.tensor([len(r) for r in rows], dtype=torch.float64)
    for penalty in (0.0, 1.0):
        expected = out.scores.double() / lengths**penalty
        got = D.sequence_scores(model, src, mask, rows, length_penalty=penalty)
        assert torch.allclose(got, expected, atol=1e-4, rtol=0), (got, expected)


def test_compared_search_says_which_side_scored_higher(setup):
    model, _, src, mask, eos, expected = setup
    beams = beam_search(model, src, mask, beam_size=3, max_len=MAX_LEN, bos_id=D.BOS, eos_id=eos,
                        pad_id=D.PAD).tolist()
    assert D.compared_search(model, src, mask, beams, beams) == ""
    # Greedy's output where it differs from beam search's scores no higher (a search with a wider
    # beam finds at least greedy's hypothesis here), so greedy as the "peer" scores lower.
    differ = sum(a != b for a, b in zip(expected, beams, strict=True))
    assert differ, "the quick model's greedy and beam outputs should differ on some row"
    note = D.compared_search(model, src, mask, expected, beams)
    assert note.startswith(f"of the {differ} others, 0 score higher and {differ} lower"), note
