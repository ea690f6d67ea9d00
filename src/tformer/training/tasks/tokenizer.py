"""A tiny fixed-vocabulary tokenizer shared by every synthetic task.

Ids 0-3 are the same specials everywhere (PAD must be 0: the loss ignores it and
padding masks are ``ids != PAD``); the task's symbols follow in the order given.
"""

from __future__ import annotations

from tformer.errors import FieldError, shown
from tformer.text.specials import BOS, EOS, PAD, UNK

__all__ = ["BOS", "EOS", "PAD", "SPECIALS", "UNK", "Tokenizer"]
SPECIALS = ("<pad>", "<bos>", "<eos>", "<unk>")


class Tokenizer:
    """Maps text to ids and back.

    Args:
        symbols: the task's symbols; each becomes one token.
        split: "chars" (every non-space character is a token; spaces are ignored, so
            "3 1 4" and "314" read the same) or "words" (whitespace-separated tokens,
            for symbols longer than one character such as ListOps' "[MAX").
        joiner: put between tokens by `decode` (" " for digit lists, "" for numbers).
    """

    def __init__(self, symbols: list[str], split: str = "chars", joiner: str = "") -> None:
        if split not in ("chars", "words"):
            raise ValueError(f"split: expected 'chars' or 'words', got {split!r}")
        if split == "chars" and any(len(s) != 1 for s in symbols):
            raise ValueError(f"symbols: split='chars' needs one-character symbols, got {symbols}")
        if len(set(symbols)) != len(symbols) or set(symbols) & set(SPECIALS):
            raise ValueError(f"symbols: expected distinct non-special symbols, got {symbols}")
        self.symbols = list(symbols)
        self.split = split
        self.joiner = joiner
        self.vocab = list(SPECIALS) + self.symbols
        self._ids = {s: i for i, s in enumerate(self.vocab)}

    def __len__(self) -> int:
        return len(self.vocab)

    def tokenize(self, text: str) -> list[str]:
        if self.split == "words":
            return text.split()
        return [c for c in text if not c.isspace()]

    def encode(self, text: str, strict: bool = False) -> list[int]:
        """Text -> ids without specials. Unknown symbols become UNK, or raise if `strict`."""
        ids = []
        for tok in self.tokenize(text):
            i = self._ids.get(tok)
            if i is None or i < len(SPECIALS):
                if strict:
                    raise FieldError(
                        "input", f"{shown(tok)} in {shown(text)} is not in the vocabulary; "
                        f"expected symbols from: {' '.join(self.symbols)}"
                    )
                i = UNK
            ids.append(i)
        return ids

    def decode(self, ids: list[int]) -> str:
        """Ids -> text; stops at the first EOS and drops PAD/BOS (generation output)."""
        out = []
        for i in ids:
            if i == EOS:
                break
            if i in (PAD, BOS):
                continue
            out.append(self.vocab[i] if 0 <= i < len(self.vocab) else SPECIALS[UNK])
        return self.joiner.join(out)
