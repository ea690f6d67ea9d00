"""Entities in tag sequences: the schemes read, the spans they mark, and the scores of spans.

    check_tags(tags, where)            # O, B-/I- (BIO, IOB2), E-/S- (IOBES): one line per error
    to_iob2(tags)                      # the same entities, each B-TYPE then I-TYPE...
    entities(tags)                     # [(type, first, last)]: seqeval's chunks, exactly
    counts = span_counts(true, pred)   # per type: [true, predicted, correct]; counts add
    span_scores(counts)                # precision, recall and F1 overall (micro) and per type (f1/PER)
    scored = SpanCounts(); scored.add(true, pred); scored.scores()   # the same, summed as it goes
    SpanDictionary.learn(...).tag(tokens)  # the trivial baseline: the spans seen in training

A span is an entity's type and its first and last word. ``entities`` finds them as seqeval
(the package transformers' token-classification example scores with) does in its default
mode: one chunk per B- (or S-), continued by I-/E- of the same type, ended by O, another type,
an E- or S-, or a new B-; an I- or E- after O or after another type starts a chunk. Scores are
seqeval's too: precision = correct / predicted, recall = correct / true, F1 their harmonic
mean (0 where a count is 0), overall as its "micro avg", and per type.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Iterable, Sequence

PREFIXES = ("B", "I", "E", "S")  # begin, inside, end (IOBES), single (IOBES)
OUTSIDE = "O"


def split_tag(tag: str) -> tuple[str, str]:
    """(prefix, type) of a tag as seqeval reads it: "B-PER" -> ("B", "PER"), "O" -> ("O", "_")
    (any first character is a prefix, the rest after one "-" the type; "_" when none)."""
    return tag[0], tag[1:].split("-", maxsplit=1)[-1] or "_"


def _ends(prev: str, prev_type: str, tag: str, type_: str) -> bool:
    """Whether a chunk ended between the previous word and this one (seqeval's end_of_chunk)."""
    if prev in ("E", "S"):
        return True
    if prev in ("B", "I") and tag in ("B", "S", "O"):
        return True
    return prev not in ("O", ".") and prev_type != type_


def _starts(prev: str, prev_type: str, tag: str, type_: str) -> bool:
    """Whether a chunk started at this word (seqeval's start_of_chunk)."""
    if tag in ("B", "S"):
        return True
    if prev in ("E", "S", "O") and tag in ("E", "I"):
        return True
    return tag not in ("O", ".") and prev_type != type_


def entities(tags: Sequence[str]) -> list[tuple[str, int, int]]:
    """The chunks of one sentence's tags: (type, first word, last word), in order."""
    out = []
    prev, prev_type, begin = "O", "", 0
    for i, tag in enumerate([*tags, OUTSIDE]):
        prefix, type_ = split_tag(tag)
        if _ends(prev, prev_type, prefix, type_):
            out.append((prev_type, begin, i - 1))
        if _starts(prev, prev_type, prefix, type_):
            begin = i
        prev, prev_type = prefix, type_
    return out


def check_tags(tags: Sequence[str], where: str, name: str = "tags") -> None:
    """Refuse a tag outside the schemes read (O; B-, I-, E-, S- and a type), and an I- or E-
    tag right after a B- or I- tag of another type (B-PER I-LOC: a PER entity cut short, or a
    LOC one started with I-? the file should say), in one line starting with ``where``."""
    for i, tag in enumerate(tags):
        if tag == OUTSIDE:
            continue
        prefix, sep, type_ = tag.partition("-")
        if prefix not in PREFIXES or not sep or not type_.strip() or type_ != type_.strip():
            raise ValueError(f"{where}: {name}[{i}]: expected O or B-, I-, E- or S- and a type (BIO/IOB2, "
                             f"IOBES), got {tag!r}")
        if i and prefix in ("I", "E"):
            before, _, other = tags[i - 1].partition("-")
            if before in ("B", "I") and other != type_:
                raise ValueError(f"{where}: {name}[{i}]: expected {prefix}-{other} (the {other} entity "
                                 f"going on) or B-{type_} (a new one) after {tags[i - 1]}, got {tag}")


def to_iob2(tags: Sequence[str]) -> list[str]:
    """The same entities (``entities``) written in IOB2: B-TYPE on each one's first word, I-TYPE
    on the rest, O elsewhere (IOBES's E-/S-, and IOB1's I- starting an entity, become these)."""
    out = [OUTSIDE] * len(tags)
    for type_, first, last in entities(tags):
        out[first] = f"B-{type_}"
        for i in range(first + 1, last + 1):
            out[i] = f"I-{type_}"
    return out


def label_names(types: Iterable[str]) -> list[str]:
    """The labels a model of these entity types predicts: O, then B- and I- of each, sorted."""
    return [OUTSIDE] + [f"{p}-{t}" for t in sorted(set(types)) for p in ("B", "I")]


# Counts ------------------------------------------------------------------------------------
def span_counts(true: Iterable[Sequence[str]], predicted: Iterable[Sequence[str]]
                ) -> dict[str, list[int]]:
    """Per entity type: [true spans, predicted spans, spans predicted exactly (type, first and
    last word)], over sentences. The counts of two sets of sentences add up."""
    counts: dict[str, list[int]] = {}
    for gold, guess in zip(true, predicted, strict=True):
        ours, theirs = set(entities(gold)), set(entities(guess))
        for span in ours:
            counts.setdefault(span[0], [0, 0, 0])[0] += 1
        for span in theirs:
            counts.setdefault(span[0], [0, 0, 0])[1] += 1
        for span in ours & theirs:
            counts[span[0]][2] += 1
    return counts


def sentence_rows(true: Iterable[Sequence[str]], predicted: Iterable[Sequence[str]]
                  ) -> list[tuple[int, int, int]]:
    """Per sentence: (its true spans, the spans predicted, those predicted exactly), the rows of
    the verdict's paired bootstrap (tformer.training.verdict.f1_interval): summed, span_scores' f1."""
    rows = []
    for gold, guess in zip(true, predicted, strict=True):
        ours, theirs = set(entities(gold)), set(entities(guess))
        rows.append((len(ours), len(theirs), len(ours & theirs)))
    return rows


def add_counts(total: dict[str, list[int]], more: dict[str, list[int]]) -> dict[str, list[int]]:
    for name, (t, p, c) in more.items():
        row = total.setdefault(name, [0, 0, 0])
        row[0] += t
        row[1] += p
        row[2] += c
    return total


def _prf(true: int, predicted: int, correct: int) -> tuple[float, float, float]:
    precision = correct / predicted if predicted else 0.0
    recall = correct / true if true else 0.0
    f1 = 2 * precision * recall / (precision + recall) if precision + recall else 0.0
    return precision, recall, f1


def span_scores(counts: dict[str, list[int]]) -> dict[str, float]:
    """"precision", "recall" and "f1" over every span (seqeval's micro average), then per type
    (as seqeval's report): "precision/TYPE", "recall/TYPE", "f1/TYPE" and "support/TYPE" (the
    type's true spans). One flat mapping of numbers, as every run's metrics are."""
    t, p, c = (sum(row[k] for row in counts.values()) for k in range(3))
    precision, recall, f1 = _prf(t, p, c)
    out: dict[str, float] = {"precision": precision, "recall": recall, "f1": f1}
    for name in sorted(counts):
        pt, rt, ft = _prf(*counts[name])
        out.update({f"precision/{name}": pt, f"recall/{name}": rt, f"f1/{name}": ft,
                    f"support/{name}": counts[name][0]})
    return out


class SpanCounts:
    """Span counts per type and the words tagged right, summed over sentences as they come:
    ``scores`` are span_scores of them all, and "accuracy", the share of words tagged right."""

    def __init__(self) -> None:
        self.counts: dict[str, list[int]] = {}
        self.right = self.words = 0

    def add(self, true: Sequence[Sequence[str]], predicted: Sequence[Sequence[str]]) -> None:
        add_counts(self.counts, span_counts(true, predicted))
        for gold, guess in zip(true, predicted, strict=True):
            self.right += sum(g == p for g, p in zip(gold, guess, strict=True))
            self.words += len(gold)

    def scores(self) -> dict[str, float]:
        return {**span_scores(self.counts), "accuracy": self.right / max(self.words, 1)}


# The baseline ------------------------------------------------------------------------------
class SpanDictionary:
    """The spans seen in training that were entities more often than not there (a word set in
    italics once is not a placeholder everywhere), each with its most frequent type. A sentence
    looked up marks its longest known spans, left to right; a span never seen is never marked."""

    def __init__(self, spans: dict[tuple[str, ...], str]) -> None:
        self.spans = spans
        self.longest = max((len(s) for s in spans), default=0)

    @classmethod
    def learn(cls, sentences: Callable[[], Iterable[tuple[Sequence[str], Sequence[str]]]]) -> SpanDictionary:
        """From (tokens, tags) of the training sentences: ``sentences()`` gives them anew, twice
        (once for the entities' spans, once for their words where they were no entity)."""
        seen: dict[tuple[str, ...], Counter] = {}
        for tokens, tags in sentences():
            for type_, first, last in entities(tags):
                seen.setdefault(tuple(tokens[first : last + 1]), Counter())[type_] += 1
        lengths = sorted({len(s) for s in seen})
        for tokens, tags in sentences():
            marked = {(first, last) for _, first, last in entities(tags)}
            for n in lengths:
                for i in range(len(tokens) - n + 1):
                    counts = seen.get(tuple(tokens[i : i + n]))
                    if counts is not None and (i, i + n - 1) not in marked:
                        counts[OUTSIDE] += 1
        spans = {}
        for span, counts in seen.items():
            outside = counts.pop(OUTSIDE, 0)
            if sum(counts.values()) > outside:  # an entity more often than not: its most frequent type
                spans[span] = min(counts.items(), key=lambda kv: (-kv[1], kv[0]))[0]  # ties: by name
        return cls(spans)

    def tag(self, tokens: Sequence[str]) -> list[str]:
        """IOB2 tags of one sentence."""
        out, i = [OUTSIDE] * len(tokens), 0
        while i < len(tokens):
            for n in range(min(self.longest, len(tokens) - i), 0, -1):
                type_ = self.spans.get(tuple(tokens[i : i + n]))
                if type_ is not None:
                    out[i : i + n] = [f"B-{type_}"] + [f"I-{type_}"] * (n - 1)
                    i += n
                    break
            else:
                i += 1
        return out

    def to_json(self) -> list[list]:
        return [[list(span), type_] for span, type_ in sorted(self.spans.items())]

    @classmethod
    def from_json(cls, rows: list) -> SpanDictionary:
        return cls({tuple(span): type_ for span, type_ in rows})
