"""ListOps (Nangia & Bowman 2018): evaluate nested list operations over digits.

Example: "[MAX 2 9 [MIN 4 7 ] 0 ]" -> 9. Operators: MAX, MIN, MED (median, truncated
to an int as in the Long Range Arena generator) and SM (sum modulo 10). The label is
the value, 0-9. Trees are bounded in depth and in length (tokens), far shorter than
LRA's 2k tokens so a CPU can learn them; the classes are not balanced (MAX and SM
favour some digits), so compare with `majority_baseline()`.
"""

from __future__ import annotations

import random
import statistics

from tformer.training.tasks.base import ClassificationTask, Example
from tformer.training.tasks.tokenizer import Tokenizer

OPERATORS = ("[MAX", "[MIN", "[MED", "[SM")


def evaluate(op: str, values: list[int]) -> int:
    if op == "[MAX":
        return max(values)
    if op == "[MIN":
        return min(values)
    if op == "[MED":
        return int(statistics.median(values))
    return sum(values) % 10


class ListOpsTask(ClassificationTask):
    name = "listops"
    description = "value (0-9) of a nested [MAX/[MIN/[MED/[SM expression, depth <= 4"
    n_classes = 10
    max_depth = 4
    max_args = 5
    max_tokens = 64

    def __init__(self, seed: int = 0, valid_size: int = 500, test_size: int = 1000) -> None:
        super().__init__(seed, valid_size, test_size)
        self.tokenizer = Tokenizer(list(OPERATORS) + ["]"] + [str(d) for d in range(10)],
                                   split="words", joiner=" ")
        self.max_source_tokens = self.max_tokens
        self.max_target_tokens = 0

    def _tree(self, rng: random.Random, depth: int) -> tuple[list[str], int]:
        # Deeper levels are more likely to be leaves, so trees have mixed depths.
        if depth > 1 and (depth >= self.max_depth or rng.random() < 0.2 * depth):
            d = rng.randrange(10)
            return [str(d)], d
        op = rng.choice(OPERATORS)
        tokens, values = [op], []
        for _ in range(rng.randint(2, self.max_args)):
            t, v = self._tree(rng, depth + 1)
            tokens += t
            values.append(v)
        return tokens + ["]"], evaluate(op, values)

    def sample(self, rng: random.Random) -> Example:
        while True:
            tokens, value = self._tree(rng, 1)
            if len(tokens) <= self.max_tokens:
                return Example(" ".join(tokens), label=value)
