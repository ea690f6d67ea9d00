"""The training stream: a run's records, cut into batches of similar length, epoch after epoch.

    stream = BatchStream(data, encode, collate, max_tokens)   # TextData -> batches, endless
    batch = next(stream); stream.epoch                         # passes completed so far
"""

from __future__ import annotations

import hashlib
import json
import random
import time
from collections.abc import Callable, Iterator
from typing import Any

from tformer.training.dataset import TextData
from tformer.training.records import Record

# Ids ``remembered`` keeps at most (~150 MB as Python lists): a larger training set's later records
# are tokenized again each epoch, as every record was.
MEMO_TOKENS = 4_000_000


def remembered(encode: Callable[[list[Record]], list]) -> Callable[[list[Record]], list]:
    """`encode` (records -> an example each, in order) tokenizing each record once: its example
    is kept by the record's content (a 16-byte hash of it) until MEMO_TOKENS ids are kept, and
    read back in later epochs, where a pool holds it again. A fine-tune on 4,800 manual pages
    tokenized them again each pass, 4.4 s of its 1-thread time each (0.9 ms a text); beside
    busy processes a 2-minute run spent 16 s of its 65 s of updates so. Examples are only read
    once made (batches are built from them, never changed), so one serves every epoch."""
    memo: dict[bytes, Any] = {}
    held = 0

    def encoded(records: list[Record]) -> list:
        nonlocal held
        keys = [hashlib.blake2b(json.dumps(r, sort_keys=True, default=str).encode(), digest_size=16).digest()
                for r in records]
        missing = [i for i, key in enumerate(keys) if key not in memo]
        made = dict(zip(missing, encode([records[i] for i in missing]) if missing else [], strict=True))
        for i, example in made.items():
            if held < MEMO_TOKENS:
                memo[keys[i]] = example
                held += getattr(example, "cost", 1)
        return [made[i] if i in made else memo[key] for i, key in enumerate(keys)]

    return encoded


def prepared(batches, before: float | None = None, taken: int = 1) -> float:
    """Seconds a training stream (one with BatchStream's ``prepared``) has spent preparing its
    batches so far; or, from `before` (such a reading), what it spent since beyond the share of
    the `taken` batches: a pool is read and tokenized within the update that takes its first
    batch, and an update's time less that is the pace of the next (a busy 2-minute run's first
    update took 21 s, mostly tokenizing its first 4,096 texts, and its budget then stopped it:
    one more such step would have ended past the deadline)."""
    seconds, per_batch = getattr(batches, "prepared", (0.0, 0.0))
    return seconds if before is None else max(seconds - before - taken * per_batch, 0.0)


def bucket(examples: list, max_tokens: int, rng: random.Random) -> list[list]:
    """Cut examples (each with a `cost`: the tokens it adds to a batch's padded width) into
    batches of similar length with at most max_tokens padded tokens (an example longer than
    that is a batch alone), in a shuffled order."""
    examples = list(examples)
    rng.shuffle(examples)  # ties in length are broken differently every epoch
    examples.sort(key=lambda ex: ex.cost)
    batches, current, widest = [], [], 0
    for ex in examples:
        width = max(widest, ex.cost)
        if current and width * (len(current) + 1) > max_tokens:
            batches.append(current)
            current, width = [], ex.cost
        current.append(ex)
        widest = width
    if current:
        batches.append(current)
    rng.shuffle(batches)
    return batches


class BatchStream:
    """The endless stream of training batches from the `start`-th (counting every rank's),
    keeping those of this rank (batch i goes to rank i % world). Each epoch's order is seeded
    by (seed, epoch), so the stream is the same every time and a resumed run skips what it used.
    `epoch`: the passes over the training data completed before the batch last returned."""

    def __init__(self, data: TextData, encode: Callable[[list[Record]], list],
                 collate: Callable[[list], Any], max_tokens: int, start: int = 0, rank: int = 0,
                 world: int = 1) -> None:
        self.epoch = 0
        self._seconds, self._made = 0.0, 0  # spent preparing pools (``prepared``), batches they made
        self._batches = self._stream(data, encode, collate, max_tokens, start, rank, world)

    @property
    def prepared(self) -> tuple[float, float]:
        """(seconds spent so far reading, tokenizing and cutting pools into batches, those
        seconds per batch made): the module's ``prepared`` (above) reads it."""
        return self._seconds, self._seconds / max(self._made, 1)

    def __iter__(self) -> BatchStream:
        return self

    def __next__(self):
        return next(self._batches)

    def _stream(self, data, encode, collate, max_tokens, start, rank, world) -> Iterator:
        i = 0
        while True:
            rng = random.Random(f"{data.config.seed}/epoch/{self.epoch}")
            pools = iter(data.epoch_pools(self.epoch))
            while True:
                t = time.perf_counter()  # (reading, tokenizing and cutting a pool: ``prepared``)
                pool = next(pools, None)
                batches = [] if pool is None else bucket(encode(pool), max_tokens, rng)
                self._seconds += time.perf_counter() - t
                self._made += len(batches) / world  # (this rank's share of them)
                if pool is None:
                    break
                for examples in batches:
                    if i >= start and i % world == rank:
                        yield collate(examples)
                    i += 1
            self.epoch += 1
