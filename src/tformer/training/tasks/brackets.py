"""Balanced brackets (the Dyck-2 language): is a string over "()[]" balanced?

Half the examples are balanced. The other half are hard negatives: a balanced string
with one mutation (a bracket replaced by another, or two positions swapped), so they
have the same even length and nearly the right counts, and a model must check the
nesting itself rather than count characters or measure the length. Label 1 = balanced.
Strings have at least `min_pairs` pairs: there are only 2 balanced strings of one pair
and 8 of two, so the held-out splits would take them all and training would never see
a short balanced string.
"""

from __future__ import annotations

import random

from tformer.training.tasks.base import ClassificationTask, Example
from tformer.training.tasks.tokenizer import Tokenizer

PAIRS = {")": "(", "]": "["}
CHARS = "()[]"


def is_balanced(text: str) -> bool:
    stack: list[str] = []
    for c in text:
        if c in "([":
            stack.append(c)
        elif not stack or stack.pop() != PAIRS[c]:
            return False
    return not stack


def random_balanced(rng: random.Random, n_pairs: int) -> str:
    """A random balanced string of `n_pairs` pairs: open while pairs remain, or close the
    innermost open bracket, each with probability 1/2 when both are possible."""
    out, stack, opened = [], [], 0
    while len(out) < 2 * n_pairs:
        if opened < n_pairs and (not stack or rng.random() < 0.5):
            c = rng.choice("([")
            stack.append(c)
            opened += 1
            out.append(c)
        else:
            out.append(")" if stack.pop() == "(" else "]")
    return "".join(out)


class BracketsTask(ClassificationTask):
    name = "brackets"
    description = "is a string of 8-20 brackets over ()[] balanced? (label 1 = yes)"
    n_classes = 2
    min_pairs, max_pairs = 4, 10

    def __init__(self, seed: int = 0, valid_size: int = 500, test_size: int = 1000) -> None:
        super().__init__(seed, valid_size, test_size)
        self.tokenizer = Tokenizer(list(CHARS), split="chars")
        self.max_source_tokens = 2 * self.max_pairs
        self.max_target_tokens = 0

    def sample(self, rng: random.Random) -> Example:
        text = random_balanced(rng, rng.randint(self.min_pairs, self.max_pairs))
        if rng.random() < 0.5:
            return Example(text, label=1)
        while True:
            chars = list(text)
            i = rng.randrange(len(chars))
            if rng.random() < 0.5:
                chars[i] = rng.choice([c for c in CHARS if c != chars[i]])
            else:
                j = rng.randrange(len(chars))
                chars[i], chars[j] = chars[j], chars[i]
            mutated = "".join(chars)
            if not is_balanced(mutated):
                return Example(mutated, label=0)
