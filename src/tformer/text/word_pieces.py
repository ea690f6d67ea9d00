"""Sub-words with their places in the text: words' labels onto their first sub-word, and the
predicted sub-words back into entities with character offsets.

    pieces = word_pieces(tokenizer, texts)        # ids, offsets, specials: cut as the model reads
    firsts = first_pieces(text, pieces, spans)    # the first sub-word of each word (None: cut)
    groups = entity_groups(text, pieces, logits, labels, tokenizer.backend)
    marked(text, groups)                          # "[grep](CMD) prints lines"

``entity_groups`` is transformers' token-classification pipeline, step for step (its
gather_pre_entities, aggregate, aggregate_words and group_entities), with its
``aggregation_strategy`` "simple" or "first". "simple": each sub-word takes its most probable
label and that probability (a float32 softmax). "first": each word takes its first sub-word's, so a
word is never split between entities (a model trained with each word's label on its first sub-word
was scored by those; its other sub-words' labels were never trained). Words are told apart as the
pipeline does: a tokenizer with a continuing-subword prefix (WordPiece's "##") marks a sub-word by
its token's length against its text's; others (byte-level BPE) by the pipeline's heuristic, a
piece that follows its text's previous character with no space between. Then neighbours of one
type join unless the later one is a B- tag; a group is named by its first member's type and
scored by the mean of its members' probabilities; groups of O are dropped. Its "word" is the
tokenizer's decoding of the group's sub-words (an unknown token: the text it stands for), its
start and end the character offsets of its first and last sub-word.
"""

from __future__ import annotations

import bisect
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

IGNORED = ("O",)  # the labels whose groups the pipeline leaves out by default
STRATEGIES = ("first", "simple")  # the pipeline's aggregation strategies served (entity_groups)


@dataclass
class Pieces:
    """One text as the model reads it: ids (specials included) and token types cut to the
    tokenizer's max_length, each id's character span in the text ((0, 0) for a special) and
    whether it is a special; ``full``: the token count before the cut."""

    ids: list[int]
    type_ids: list[int]
    offsets: list[tuple[int, int]]
    special: list[bool]
    full: int

    @property
    def cost(self) -> int:
        return len(self.ids)


def word_pieces(tokenizer, texts: Sequence[str]) -> list[Pieces]:
    """Each text's Pieces: tokenized only as far as its cut at max_length needs (the tokens kept
    are the whole text's: ``Tokenizer.prefixes``), then cut as transformers' tokenizer truncates
    (the specials, and the first sub-words that fit beside them)."""
    prefixes, _, full = tokenizer.prefixes(list(texts))
    out = []
    for e, n in zip(tokenizer.backend.encode_batch(prefixes), full, strict=True):
        special = [bool(s) for s in e.special_tokens_mask]
        room = len(special) - sum(special) if tokenizer.max_length is None else \
            tokenizer.max_length - sum(special)
        keep = []
        for i, is_special in enumerate(special):
            if is_special or room > 0:
                keep.append(i)
                room -= not is_special
        out.append(Pieces([e.ids[i] for i in keep], [e.type_ids[i] for i in keep],
                          [tuple(e.offsets[i]) for i in keep], [special[i] for i in keep], n))
    return out


def first_pieces(text: str, pieces: Pieces, spans: Sequence[tuple[int, int]]) -> list[int | None]:
    """For each word (its character span in ``text``, in order, not overlapping), the index of
    its first sub-word in ``pieces``: the first whose span starts inside the word once leading
    whitespace is skipped (byte-level BPE's pieces start at the space before a word); None for a
    word the cut left out."""
    starts = [a for a, _ in spans]
    out: list[int | None] = [None] * len(spans)
    for i, (a, b) in enumerate(pieces.offsets):
        if pieces.special[i]:
            continue
        while a < b and text[a].isspace():
            a += 1
        if a >= b:
            continue  # a piece of whitespace alone (Metaspace's "▁" before a word)
        w = bisect.bisect_right(starts, a) - 1
        if w >= 0 and a < spans[w][1] and out[w] is None:
            out[w] = i
    return out


def softmax(logits: np.ndarray) -> np.ndarray:
    """Probabilities per row in float32, as the pipeline computes them from the logits.

    Shape: (N, C) -> (N, C)"""
    logits = np.asarray(logits, dtype=np.float32)
    shifted = np.exp(logits - logits.max(axis=-1, keepdims=True))
    return shifted / shifted.sum(axis=-1, keepdims=True)


def _tag(label: str) -> tuple[str, str]:
    """(B or I, type) as the pipeline's get_tag reads a label (not B-/I-: I and the label)."""
    if label.startswith(("B-", "I-")):
        return label[0], label[2:]
    return "I", label


def entity_groups(text: str, pieces: Pieces, logits: np.ndarray, labels: Sequence[str], backend: Any,
                  ignore: Sequence[str] = IGNORED, strategy: str = "simple") -> list[dict[str, Any]]:
    """The pipeline's entities of one text by its aggregation ``strategy`` (see the module
    docstring), ``labels[c]`` naming class c; ``backend``: the tokenizers.Tokenizer (its tokens,
    unknown token, decoder and model).

    Shape: logits (len(pieces.ids), C)"""
    if strategy not in STRATEGIES:
        raise ValueError(f"strategy: expected one of {', '.join(STRATEGIES)}, got {strategy!r}")
    probs = softmax(logits)  # (N, C)
    unk = next((i for i in map(backend.token_to_id, ("<unk>", "[UNK]")) if i is not None), None)
    word_aware = bool(getattr(backend.model, "continuing_subword_prefix", None))
    tokens = []  # (label, score, word, start, end) per sub-word ("first": per word), specials left out
    for i, token_id in enumerate(pieces.ids):
        if pieces.special[i]:
            continue
        start, end = pieces.offsets[i]
        word, ref = backend.id_to_token(token_id), text[start:end]
        joined = start > 0 and " " not in text[start - 1 : start + 1]  # the pipeline's heuristic
        subword = len(word) != len(ref) if word_aware else joined
        if token_id == unk:
            word, subword = ref, False
        if strategy == "first" and subword and tokens:  # the word's label stays its first piece's
            label, score, first, first_start, _ = tokens[-1]
            tokens[-1] = (label, score, first + [word], first_start, end)
            continue
        best = int(probs[i].argmax())
        tokens.append((labels[best], probs[i, best], [word] if strategy == "first" else word, start, end))
    if strategy == "first":  # each word decoded, as the pipeline's aggregate_word does
        tokens = [(label, score, _decoded(words, backend), a, b) for label, score, words, a, b in tokens]
    groups, current = [], []
    for token in tokens:
        if current:
            bi, tag = _tag(token[0])
            if tag != _tag(current[-1][0])[1] or bi == "B":
                groups.append(_grouped(current, backend))
                current = []
        current.append(token)
    if current:
        groups.append(_grouped(current, backend))
    return [g for g in groups if g["entity_group"] not in ignore]


def _decoded(words: list[str], backend: Any) -> str:
    """The tokenizer's string of tokens (transformers' convert_tokens_to_string)."""
    return backend.decoder.decode(words) if backend.decoder is not None else " ".join(words)


def _grouped(tokens: list[tuple], backend: Any) -> dict[str, Any]:
    return {"entity_group": tokens[0][0].split("-", 1)[-1],
            "score": float(np.mean(np.nanmean([t[1] for t in tokens]))),
            "word": _decoded([t[2] for t in tokens], backend), "start": int(tokens[0][3]),
            "end": int(tokens[-1][4])}


def marked(text: str, found: list[dict[str, Any]]) -> str:
    """`tformer predict`'s text line: each entity in brackets with its type, [grep](CMD)."""
    out, at = [], 0
    for e in sorted(found, key=lambda e: e["start"]):
        if e["start"] < at:
            continue
        out += [text[at : e["start"]], f"[{text[e['start'] : e['end']]}]({e['entity_group']})"]
        at = e["end"]
    return "".join(out + [text[at:]])
