"""Multi-digit addition written as characters: "123+4567" -> "4690".

Each operand has a length uniform in 1..max_digits (then uniform digits, no leading
zero), so short and long operands are equally common; drawing the numbers uniformly
instead would make almost every operand max_digits long. The sum is written most
significant digit first, as a person would, so the model must resolve carries before
it writes the first digit.
"""

from __future__ import annotations

import random

from tformer.training.tasks.base import Example, SequenceTask
from tformer.training.tasks.tokenizer import Tokenizer


class AddTask(SequenceTask):
    name = "add"
    description = "add two integers of 1-5 digits, '123+4567' -> '4690'"
    max_digits = 5

    def __init__(self, seed: int = 0, valid_size: int = 500, test_size: int = 1000) -> None:
        super().__init__(seed, valid_size, test_size)
        self.tokenizer = Tokenizer([str(d) for d in range(10)] + ["+"], split="chars", joiner="")
        self.max_source_tokens = 2 * self.max_digits + 1
        self.max_target_tokens = self.max_digits + 1

    def _operand(self, rng: random.Random) -> int:
        n = rng.randint(1, self.max_digits)
        return rng.randint(0 if n == 1 else 10 ** (n - 1), 10**n - 1)

    def sample(self, rng: random.Random) -> Example:
        a, b = self._operand(rng), self._operand(rng)
        return Example(f"{a}+{b}", str(a + b))
