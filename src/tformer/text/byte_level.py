"""GPT-2's byte-level BPE alphabet: which byte each character of a byte-level token stands for
(tformer.text.tokenizer shows a piece of a multi-byte character as its bytes)."""

from __future__ import annotations


def _byte_level_alphabet() -> dict[str, int]:
    """GPT-2's byte-level BPE alphabet (Radford et al. 2019): the character standing for each
    byte (printable bytes stand for themselves; the others are shifted past 255), inverted."""
    printable = [*range(ord("!"), ord("~") + 1), *range(ord("¡"), ord("¬") + 1),
                 *range(ord("®"), ord("ÿ") + 1)]
    chars, shift = {}, 0
    for b in range(256):
        if b in printable:
            chars[chr(b)] = b
        else:
            chars[chr(256 + shift)] = b
            shift += 1
    return chars


BYTE_OF = _byte_level_alphabet()  # character -> the byte it stands for
