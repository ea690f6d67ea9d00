"""Digit-list transductions: copy, reverse and sort a list of digits.

Input and output are written as space-separated digits, "3 1 4 1 5" -> "5 1 4 1 3"
(reverse). Lengths are uniform in [min_len, max_len]; the shortest lengths are kept
away from 1-2 so the held-out splits cannot use up all inputs of one length.
"""

from __future__ import annotations

import random

from tformer.training.tasks.base import Example, SequenceTask
from tformer.training.tasks.tokenizer import Tokenizer

DIGITS = [str(d) for d in range(10)]


class DigitListTask(SequenceTask):
    min_len, max_len_digits = 3, 16

    def __init__(self, seed: int = 0, valid_size: int = 500, test_size: int = 1000) -> None:
        super().__init__(seed, valid_size, test_size)
        self.tokenizer = Tokenizer(DIGITS, split="chars", joiner=" ")
        self.max_source_tokens = self.max_target_tokens = self.max_len_digits

    def transform(self, digits: list[str]) -> list[str]:
        raise NotImplementedError

    def sample(self, rng: random.Random) -> Example:
        n = rng.randint(self.min_len, self.max_len_digits)
        digits = [rng.choice(DIGITS) for _ in range(n)]
        return Example(" ".join(digits), " ".join(self.transform(digits)))


class CopyTask(DigitListTask):
    name = "copy"
    description = "copy a list of 3-16 digits"

    def transform(self, digits: list[str]) -> list[str]:
        return list(digits)


class ReverseTask(DigitListTask):
    name = "reverse"
    description = "reverse a list of 3-16 digits"

    def transform(self, digits: list[str]) -> list[str]:
        return digits[::-1]


class SortTask(DigitListTask):
    name = "sort"
    description = "sort a list of 3-16 digits ascending"

    def transform(self, digits: list[str]) -> list[str]:
        return sorted(digits)
