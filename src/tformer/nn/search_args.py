"""The argument checks of a search (greedy and beam), shared by both engines: plain Python, so
the NumPy reference can use them without importing torch, and both give one message."""

from __future__ import annotations

import math
import operator
from typing import Any

# The most tokens a search generates when its caller does not say (fewer where the model has
# fewer positions).
DEFAULT_MAX_LEN = 64


def check_max_len(max_len: int, positions: int | None = None) -> None:
    """A positive int, and at most ``positions`` (the model's) where given."""
    if isinstance(max_len, bool) or not isinstance(max_len, int) or max_len < 1:
        raise ValueError(f"max_len: expected a positive int, got {max_len!r}")
    if positions is not None and max_len > positions:
        raise ValueError(f"max_len: expected 1..{positions} (the model's positions), got {max_len}")


def check_seq2seq(model: Any) -> None:
    """A model that searches: an encoder-decoder, with ``encode`` and ``decode`` (a compiled one
    too). An Encoder failed inside the search on a missing ``encode``."""
    if not (callable(getattr(model, "encode", None)) and callable(getattr(model, "decode", None))):
        raise TypeError(f"model: expected a Seq2SeqTransformer (an encoder-decoder), "
                        f"got {type(model).__name__}")


def search_max_len(model: Any, max_len: int | None) -> int:
    """The most tokens a search of ``model`` generates: ``max_len``, or DEFAULT_MAX_LEN where
    None, at most the model's positions (config.max_len), as `tformer generate --max-len`.
    Refused in one line: a model that is not an encoder-decoder (check_seq2seq), and a max_len
    past the positions (a learned table has no row for them, and the sinusoids of a long one
    were recomputed at every step, with a cache allocated for all of them)."""
    check_seq2seq(model)
    positions = model.config.max_len
    if max_len is None:
        return min(DEFAULT_MAX_LEN, positions)
    check_max_len(max_len, positions)
    return max_len


def check_special_ids(bos_id: int, eos_id: int, pad_id: int, vocab_size: int) -> None:
    """BOS and PAD are fed to the decoder, so they are ids of its vocabulary (a bad one was
    refused as "tgt_ids"); EOS only compared with, so any int (one outside: no row ends)."""
    for name, value in (("bos_id", bos_id), ("eos_id", eos_id), ("pad_id", pad_id)):
        try:
            value = operator.index(value)  # an int, a numpy integer, a 0-d integer tensor
        except TypeError:
            raise TypeError(f"{name}: expected an int token id, got {type(value).__name__}") from None
        if name != "eos_id" and not 0 <= value < vocab_size:
            raise ValueError(f"{name}: expected a token id in [0, {vocab_size}) (the target vocabulary), "
                             f"got {value}")


def check_deadline(deadline: float | None) -> None:
    """None or a time.perf_counter() reading (a str failed after the first step)."""
    if deadline is not None and (isinstance(deadline, bool) or not isinstance(deadline, int | float)):
        raise TypeError(f"deadline: expected a time.perf_counter() reading (a float) or None, "
                        f"got {type(deadline).__name__}")


def check_beam_size(beam_size: int) -> None:
    if isinstance(beam_size, bool) or not isinstance(beam_size, int) or beam_size < 1:
        raise ValueError(f"beam_size: expected a positive int, got {beam_size!r}")


def check_search_fits(config: Any, sources: int, beam_size: int, max_len: int,
                      itemsize: int = 4) -> int:
    """Refuse, before the source is encoded, a search whose state would not fit in memory: per
    beam, every decoder layer's self-attention keys and values for ``max_len`` positions, and a
    step's logits and log-probabilities over the target vocabulary (``itemsize`` bytes a value).
    beam_size 10**7 was killed for memory, with no message. Returns the estimated bytes."""
    from tformer.config.sizes import available_memory  # arithmetic only: no torch

    rows = sources * beam_size
    per_row = (config.decoder_layers * 2 * max_len * config.d_model + 3 * config.target_vocab_size) * itemsize
    need, have = rows * per_row, available_memory()
    if need > have:
        raise ValueError(f"beam_size: {sources} sources x {beam_size} beams x {max_len} tokens need "
                         f"{need / 2**30:,.1f} GiB (caches and log-probabilities); expected at most "
                         f"the {have / 2**30:,.1f} GiB available")
    return need


def check_length_penalty(length_penalty: float, max_len: int) -> None:
    """Refuse a length penalty that no length up to ``max_len`` can be raised to: a score divided
    by an overflowed (inf) or underflowed (0) power would rank every hypothesis alike."""
    try:
        ok = (isinstance(length_penalty, int | float) and not isinstance(length_penalty, bool)
              and math.isfinite(float(max_len) ** abs(length_penalty)))
    except OverflowError:
        ok = False
    if not ok:
        raise ValueError(f"length_penalty: expected a number with max_len ** |length_penalty| finite "
                         f"(max_len {max_len}), got {length_penalty!r}")


def check_early_stopping(early_stopping: bool, beam_size: int) -> None:
    """A bool, and True only for a beam search: greedy search has one output per input and no
    hypotheses to count, so the option would do nothing."""
    if not isinstance(early_stopping, bool):
        raise TypeError(f"early_stopping: expected True or False, got {early_stopping!r}")
    if early_stopping and beam_size == 1:
        raise ValueError("early_stopping: the beam search rule (a source stops once beam_size of its "
                         "hypotheses have ended); expected beam_size >= 2 with it, got beam_size 1")
