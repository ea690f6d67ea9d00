"""BERT's masking, for masked-LM pre-training (Devlin et al. 2019, §3.1 "Task #1: Masked LM").

    masker = Masker(mask_id, special_ids, vocab_size)
    ids, labels = masker.mask(ids, rng)     # one text's token ids, masked; labels: IGNORE or the id
    rng = batch_rng(seed, k)                # training batch k's draws: (seed, k) alone
    rng = text_rng(seed, text)              # a held-out text's: the same masks at every validation

and what a masked-LM run (a kind of tformer.kinds) trains, predicts and scores with: its
examples (``MaskedExample``), batches (``MaskedBatch``), training stream (``MaskedStream``),
predictions (``Filled``), their fill-mask answer (``fill_answer``), scores (``MaskedTally``) and
the unigram baseline's counts (``TokenCounts``).

Of each text's tokens, 15% are chosen to be predicted (round(0.15 n), at least one, as BERT's
create_pretraining_data.py takes them; never a special token such as <s>, </s>, <pad> or the
mask itself): 80% of those are replaced by the mask token, 10% by a random ordinary token and
10% kept, so that the model cannot learn that only masked positions matter. The labels hold
the original token at each chosen position and IGNORE elsewhere.

Training draws a batch's masks from (seed, k) alone, so batch k is the same batch whether a run
got there straight or resumed (the loop's bit-for-bit resume: tformer.training.loop); a text
that returns in a later epoch is masked anew (RoBERTa's dynamic masking, Liu et al. 2019). A
held-out text is masked once, by (seed, its text), so every validation scores the same
positions and the scores of two validations compare. Torch-free.
"""

from __future__ import annotations

import hashlib
import math
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from typing import Any

import numpy as np

from tformer.errors import BadType, FieldError
from tformer.text.batches import EncoderBatch

MASK_RATE = 0.15  # of each text's ordinary tokens, predicted
MASKED, RANDOM = 0.8, 0.1  # of those: replaced by the mask token, by a random token; the rest kept
IGNORE = -100  # the label of a position not predicted (torch's cross_entropy ignore_index)
UNKNOWN = -1  # the label of a mask a user's text holds: its true token is not known
BATCH_STREAM = 0x6D61736B  # separates the training masks' draws from any other use of the seed


class Masker:
    """BERT's masking for one vocabulary: ``mask_id``, and the special ids that are never
    chosen nor drawn as a random replacement."""

    def __init__(self, mask_id: int, special_ids: Iterable[int], vocab_size: int) -> None:
        self.mask_id = mask_id
        self.special = np.zeros(vocab_size, dtype=bool)  # (V,)
        self.special[[i for i in special_ids if 0 <= i < vocab_size]] = True
        self.special[mask_id] = True
        self.ordinary = np.flatnonzero(~self.special)  # the ids a random replacement is drawn from

    def mask(self, ids: list[int], rng: np.random.Generator) -> tuple[list[int], list[int]]:
        """(the ids with BERT's masking applied, the labels: the original id where chosen,
        IGNORE elsewhere)."""
        ids = np.asarray(ids, dtype=np.int64)  # (S,)
        candidates = np.flatnonzero(~self.special[ids])
        count = max(1, int(MASK_RATE * len(candidates) + 0.5)) if len(candidates) else 0
        chosen = np.sort(rng.choice(candidates, size=count, replace=False))
        labels = np.full(len(ids), IGNORE, dtype=np.int64)
        labels[chosen] = ids[chosen]
        u = rng.random(count)
        out = ids.copy()
        out[chosen[u < MASKED]] = self.mask_id
        swapped = chosen[(u >= MASKED) & (u < MASKED + RANDOM)]
        out[swapped] = self.ordinary[rng.integers(0, len(self.ordinary), len(swapped))]
        return out.tolist(), labels.tolist()


def batch_rng(seed: int, index: int) -> np.random.Generator:
    """The draws of training batch ``index``'s masks: from (seed, index) alone."""
    return np.random.default_rng([seed, BATCH_STREAM, index])


def text_rng(seed: int, text: str) -> np.random.Generator:
    """The draws of a held-out text's masks: from (seed, the text) alone."""
    digest = hashlib.blake2b(f"{seed}\0{text}".encode(), digest_size=8).digest()
    return np.random.default_rng(int.from_bytes(digest, "big"))


@dataclass
class MaskedExample:
    ids: list[int]  # the input ids (masked, or not yet: a training text, masked with its batch)
    labels: list[int] | None  # per position: the id to predict, IGNORE, or UNKNOWN (a user's mask)
    type_ids: list[int] | None = None

    @property
    def cost(self) -> int:
        return len(self.ids)

    @property
    def longest(self) -> int:
        return len(self.ids)


@dataclass
class MaskedBatch(EncoderBatch):
    """An EncoderBatch whose labels are (B, S): the id to predict at each position chosen (a
    user's mask: UNKNOWN), IGNORE elsewhere and at padding."""


@dataclass
class Filled:
    """One text's predictions, at each position predicted (in order): its label, the top
    candidates (ids, probabilities) and the log-probability of the label (0.0 when UNKNOWN)."""

    ids: list[int]  # the input as the model read it
    positions: list[int]
    labels: list[int]
    top_ids: list[list[int]]
    top_scores: list[list[float]]
    label_logprob: list[float]


class MaskedStream:
    """A stream of batches of unmasked examples, each batch masked by draws from (seed, its
    index) alone, then collated: the batch of step k is the same after a resume. `first`: the
    index of the stream's first batch (counting every rank's); `step`: the ranks' stride.
    ``epoch``: the wrapped stream's."""

    def __init__(self, batches: Iterator[list[MaskedExample]], masker: Masker, seed: int,
                 collate: Callable[[list[MaskedExample]], Any], first: int, step: int) -> None:
        self.batches, self.masker, self.seed, self.collate = batches, masker, seed, collate
        self.index, self.step = first, step

    @property
    def epoch(self) -> int:
        return self.batches.epoch

    @property
    def prepared(self) -> tuple[float, float]:
        return self.batches.prepared  # (tformer.training.stream.BatchStream's)

    def __iter__(self) -> MaskedStream:
        return self

    def __next__(self):
        examples = next(self.batches)  # this batch's texts, not masked yet
        rng = batch_rng(self.seed, self.index)
        self.index += self.step
        return self.collate([MaskedExample(*self.masker.mask(e.ids, rng), e.type_ids) for e in examples])


def fill_answer(f: Filled, decode: Callable[..., str]) -> list:
    """transformers' fill-mask answer for one text: per mask, [{"score", "token", "token_str",
    "sequence"}] best first, its sequence the text with that candidate in the mask's place
    (decoded without the special tokens where the text has one mask, as the pipeline does); a
    text with one mask gets that mask's list alone. ``decode(ids, skip_special_tokens=...)``."""
    single, rows = len(f.positions) == 1, []
    for position, ids, scores in zip(f.positions, f.top_ids, f.top_scores, strict=True):
        row = []
        for token, score in zip(ids, scores, strict=True):
            sequence = [token if j == position else i for j, i in enumerate(f.ids)]
            row.append({"score": score, "token": token,
                        "token_str": decode([token], skip_special_tokens=False),
                        "sequence": decode(sequence, skip_special_tokens=single)})
        rows.append(row)
    return rows[0] if single else rows


class MaskedTally:
    """The masked tokens' summed loss, count and correct top candidates, and how often each
    token was a target: the metrics of predictions added window by window, and the baseline's
    perplexity on the same targets (the dot product of those counts with the baseline's
    log-probabilities, ``logprob()``: (V,), asked for only then). A Tally (tformer.training.objective)."""

    def __init__(self, vocab_size: int, logprob: Callable[[], np.ndarray], baseline_by: str) -> None:
        self.logprob, self.baseline_by = logprob, baseline_by
        self.nll, self.sq, self.n, self.correct = 0.0, 0.0, 0, 0  # (sq: the summed squared losses)
        self.targets = np.zeros(vocab_size, np.int64)  # (V,)

    def add(self, examples: list, preds: list[Filled]) -> None:
        for f in preds:
            for label, lp, top in zip(f.labels, f.label_logprob, f.top_ids, strict=True):
                if label >= 0:
                    self.nll -= lp
                    self.sq += lp * lp
                    self.correct += top[0] == label
            self.count_targets(f.labels)

    def count_targets(self, labels: list[int]) -> None:
        known = [label for label in labels if label >= 0]
        self.n += len(known)
        np.add.at(self.targets, known, 1)

    def metrics(self) -> dict[str, float]:
        if not self.n:
            raise ValueError("examples: expected a token to predict in at least one text, got none (texts of "
                             "special tokens only)")
        loss = self.nll / self.n
        return {"perplexity": math.exp(min(loss, 700.0)), "loss": loss, "accuracy": self.correct / self.n,
                "masked_tokens": self.n, "loss_sd": math.sqrt(max(self.sq / self.n - loss * loss, 0.0))}

    def baseline(self) -> dict[str, Any]:
        """The baseline's perplexity, and the spread of its per-token loss ("baseline_loss_sd":
        with "loss_sd", the verdict's margin, tformer.training.verdict.log_gain_se)."""
        hit, n = self.targets > 0, max(self.n, 1)
        nll = -self.logprob()[hit]  # (targets hit,)
        loss, sq = float(self.targets[hit] @ nll) / n, float(self.targets[hit] @ (nll * nll)) / n
        return {"baseline": math.exp(min(loss, 700.0)), "baseline_by": self.baseline_by,
                "baseline_loss_sd": math.sqrt(max(sq - loss * loss, 0.0))}


def target_ids(backend, targets: str | Iterable[str]) -> list[int]:
    """The ids of fill-mask's targets, as the pipeline finds them: the token itself where the
    vocabulary (a tokenizers backend's) holds it, else the first piece of the text; one found
    for none of them is refused."""
    targets = [targets] if isinstance(targets, str) else list(targets)
    ids = []
    for t in targets:
        if not isinstance(t, str):
            raise BadType("targets", f"expected str, got {type(t).__name__}")
        found = backend.token_to_id(t)
        ids += backend.encode(t, add_special_tokens=False).ids[:1] if found is None else [found]
    if not ids:
        raise FieldError("targets", f"expected tokens of the vocabulary, got {targets!r}")
    return sorted(set(ids))


class TokenCounts:
    """How often each token occurs in the first ``cap`` training texts read (what the unigram
    baseline is counted from), and the baseline's log-probabilities: add-one smoothed over the
    ordinary tokens (a special token is never a target: -inf)."""

    def __init__(self, vocab_size: int, cap: int, counts: np.ndarray | None = None) -> None:
        self.cap, self.texts = cap, 0
        self.counts = np.zeros(vocab_size, np.int64) if counts is None else counts  # (V,)

    @property
    def full(self) -> bool:
        return self.texts >= self.cap

    def add(self, texts: list[list[int]]) -> None:
        """Texts' token ids, up to the cap."""
        texts = texts[: self.cap - self.texts]
        if texts:
            self.counts += np.bincount(np.fromiter((i for ids in texts for i in ids), np.int64),
                                       minlength=len(self.counts))
            self.texts += len(texts)

    def logprob(self, special: np.ndarray) -> np.ndarray:
        """(V,) log-probabilities; ``special``: (V,) bool, the tokens never predicted."""
        counts, ordinary = self.counts.astype(np.float64), ~special
        out = np.full(len(counts), -np.inf)
        out[ordinary] = np.log((counts[ordinary] + 1) / (counts[ordinary].sum() + ordinary.sum()))
        return out
