"""The seeded split of your records, and a data file's identity.

When --valid/--test are not given, each record's input text is hashed with the seed to u in
[0, 1); u < f goes to test, f <= u < 2f to validation, the rest to training (f: split_fraction,
5% of the records, at most 1,000 each; a small file's, small_file_fraction). The same text
always hashes the same, so no input text is in two splits.
"""

from __future__ import annotations

import hashlib
import heapq
import math
from pathlib import Path

SPLIT_FRACTION, SPLIT_CAP = 0.05, 1000
TOKENIZER_SAMPLE = 200_000  # records the tokenizer is trained on (a sample over the file)...
TOKENIZER_CHARS = 50_000_000  # ...or this many characters of them, whichever comes first


def split_fraction(n_records: int) -> float:
    """Each held-out split's share of a file of ``n_records``: 5%, at most SPLIT_CAP records."""
    return min(SPLIT_FRACTION, SPLIT_CAP / max(n_records, 1))


def split_of(key: str, seed: int, fraction: float) -> str:
    """"test", "validation" or "train" for an input text (the module docstring)."""
    return split_of_unit(unit_hash(key, seed), fraction)


def split_of_unit(u: float, fraction: float) -> str:
    return "test" if u < fraction else "validation" if u < 2 * fraction else "train"


# A file of at most SMALL records may get a larger held-out share, up to SMALL_FRACTION each,
# where 5% of it hashed into a split leaves that split empty (a 40-line file: 2 records each,
# on average, and none at times).
SMALL, SMALL_FRACTION = 1000, 0.25


def small_file_fraction(units: list[float], fraction: float, splits: set[str]) -> float:
    """The smallest fraction >= ``fraction`` (at most SMALL_FRACTION) at which each hashed split
    in ``splits`` and training get a record of a small file whose records hash to ``units``;
    ``fraction`` when none does (the error then asks for --valid/--test files)."""
    def fills(f: float) -> bool:
        got = {split_of_unit(u, f) for u in units}
        return "train" in got and splits <= got

    if fills(fraction):
        return fraction
    # A split changes only where f passes a unit u (test: u < f) or u / 2 (validation: u < 2f).
    edges = sorted({math.nextafter(x, 1.0) for u in units for x in (u, u / 2)})
    return next((f for f in edges if fraction < f <= SMALL_FRACTION and fills(f)), fraction)


def unit_hash(key: str, seed: int | str) -> float:
    digest = hashlib.blake2b(f"{seed}\0{key}".encode(), digest_size=8).digest()
    return int.from_bytes(digest, "big") / 2**64


def file_digest(path: str | Path) -> str:
    """blake2b of a file's bytes: a run's data identity."""
    h = hashlib.blake2b(digest_size=16)
    with open(path, "rb") as f:
        while chunk := f.read(1 << 20):
            h.update(chunk)
    return h.hexdigest()


def file_stat(path: str | Path) -> tuple[int, int] | None:
    """(size, modification time in ns) of a file, or None if it is gone: what changes first."""
    try:
        st = Path(path).stat()
    except OSError:
        return None
    return st.st_size, st.st_mtime_ns


class TokenizerSample:
    """The records the tokenizer learns from: all of them when they fit TOKENIZER_SAMPLE records
    and TOKENIZER_CHARS characters, else a seeded sample spread over the whole file (those
    whose second hash is smallest), not its first lines: a file sorted by label or source
    would otherwise teach the tokenizer the first part's words only."""

    def __init__(self, seed: int) -> None:
        self.seed, self.chars = seed, 0
        self._heap: list[tuple[float, int, float, list[str], int]] = []  # (-v, n, u, texts, chars)

    def offer(self, n: int, key: str, u: float, texts: list[str]) -> None:
        chars = sum(map(len, texts))
        heapq.heappush(self._heap, (-unit_hash(key, f"{self.seed}/tokenizer"), n, u, texts, chars))
        self.chars += chars
        while len(self._heap) > 1 and (len(self._heap) > TOKENIZER_SAMPLE
                                       or self.chars > TOKENIZER_CHARS):
            self.chars -= heapq.heappop(self._heap)[4]  # the largest second hash leaves

    def records(self) -> list[tuple[float, list[str]]]:
        """(u, texts) of the sampled records, in file order."""
        return [(u, texts) for _, _, u, texts, _ in sorted(self._heap, key=lambda e: e[1])]
