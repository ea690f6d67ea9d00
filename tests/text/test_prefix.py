"""tformer.text.prefix: a long text tokenized only as far as its cut needs gives the same ids as
the whole text tokenized and then cut (the independent implementation: the backend with
truncation on, over the whole text)."""

from __future__ import annotations

import base64
import copy
import functools
import pickle
import random

import pytest
from helpers import SpyBackend
from hf_bert_fixtures import bert_dir

from tformer.text.prefix import AtLeast, Unread, cut_reason, is_cut, longest, plus, reach
from tformer.text.tokenizer import Tokenizer, load_tokenizer
from tformer.text.windows import split
from tformer.training.subwords import run_tokenizer, train_tokenizer

# Pieces that tokenizers split (or do not split) in their own ways; a cut may fall anywhere.
_RNG = random.Random(0)
LONG_WORD = "".join(_RNG.choice("abcdefghij") for _ in range(150))  # (not a run of one letter: Unigram's
CJK = "".join(_RNG.choice("東京北京大学日本語中文") for _ in range(20000))  # ties break by its cache's history)
LETTERS = "".join(_RNG.choice("abcdefghijklmnopqrstuvwxyz") for _ in range(20000))
PIECES = ["the", "cat", "sat", "house", "river", "Straße", "naïve", "café", "e\u0301", "東京", "北京大学",
          "     ", "\t\t", "\n", "\u00a0", "\u3000", "\x1c", "\u200b", "[SEP]", "</s>", "<s>", ",", "!?",
          "don't", "1234", "😀", LONG_WORD, LONG_WORD[:40], "ab\x1ccd", "%s", " ", " ", " ", "  "]
MAX_LENGTHS = (3, 5, 8, 16, 64)


def texts(seed: int, n: int = 16) -> list[str]:
    rng = random.Random(seed)
    out = []
    for i in range(n):
        size = rng.choice([10, 300, 800, 2500, 5000])
        spaced = i % 3 != 0  # a third with no spaces but those the pieces bring
        out.append((" " if spaced else "").join(rng.choice(PIECES) for _ in range(size)))
    out += [CJK, LETTERS, "word " * 4000, " " * 9000 + "end", "[SEP]".join(LETTERS[i:i + 7] for i in range(2000))]
    return out


@functools.cache
def trained(scheme: str) -> Tokenizer:
    data = [t.replace("<s>", "").replace("</s>", "") for t in texts(99, 12)]  # (specials in data: refused)
    backend = train_tokenizer(data, scheme, 400 if scheme == "bpe" else 300)
    return run_tokenizer(backend, 64)


def tokenizers() -> list[tuple[str, Tokenizer]]:
    return [("bert", load_tokenizer(bert_dir())), *((s, trained(s)) for s in ("bpe", "wordpiece", "unigram"))]


def whole_then_cut(tok: Tokenizer, max_length: int, inputs: list) -> list[tuple[list[int], list[int], int]]:
    """(ids, type ids, token count) of each input tokenized whole, then cut by the backend."""
    backend = type(tok.backend).from_str(tok.backend.to_str())
    backend.no_padding()
    full = [len(e.ids) for e in backend.encode_batch(inputs)]
    backend.enable_truncation(max_length=max_length)
    return [(e.ids, e.type_ids, n) for e, n in zip(backend.encode_batch(inputs), full, strict=True)]


@pytest.mark.parametrize("max_length", [pytest.param(n, marks=pytest.mark.slow) if n == 3 else n  # (28 s)
                                        for n in MAX_LENGTHS])
def test_encode_gives_the_ids_of_the_whole_text_cut(max_length):
    cut_early = 0
    for name, base in tokenizers():
        tok = Tokenizer(base.backend, max_length, base.pad_id, base.lowercase)
        inputs = [t.lower() for t in texts(max_length)] if tok.lowercase else texts(max_length)
        for text, ours, (ids, types, n) in zip(inputs, tok.encode(inputs), whole_then_cut(tok, max_length, inputs),
                                               strict=True):
            where = f"{name}, max_length {max_length}, text {text[:40]!r} ({len(text)} chars)"
            assert ours.ids == ids and ours.type_ids == types, where
            if isinstance(ours.full, AtLeast):  # tokenized as a prefix: a true lower bound past the cut,
                cut_early += 1  # or the whole prefix read (LETTERS, one word: WordPiece's one [UNK])
                assert ours.full <= n and (ours.full > max_length or ours.full == len(ours.ids)), where
            else:
                assert ours.full == n, where
    assert cut_early > 10  # the prefix path was taken


@pytest.mark.parametrize("max_length", (pytest.param(16, marks=pytest.mark.slow), 64))  # (16: 13 s)
def test_pairs_are_cut_longest_first_as_whole_pairs_are(max_length):
    # (the backend cuts a pair into every combination of its two segments' overflowing pieces:
    # whole pairs of texts much longer than this would take gigabytes to cut)
    rng = random.Random(max_length)
    for name, base in tokenizers():
        tok = Tokenizer(base.backend, max_length, base.pad_id, base.lowercase)
        pool = [t[:1600] for t in texts(7 + max_length)]
        pool = [t.lower() for t in pool] if tok.lowercase else pool
        firsts, seconds = list(pool), rng.sample(pool, len(pool))
        firsts += ["the cat " * 200, "the cat " * 200, "sat"]  # both long, equal; one short, one long
        seconds += ["the cat " * 201, "the " * 400, "river " * 300]
        expected = whole_then_cut(tok, max_length, list(zip(firsts, seconds, strict=True)))
        for a, b, ours, (ids, types, n) in zip(firsts, seconds, tok.encode(firsts, seconds), expected, strict=True):
            where = f"{name}, max_length {max_length}, pair {a[:30]!r} ({len(a)}), {b[:30]!r} ({len(b)})"
            assert ours.ids == ids and ours.type_ids == types, where
            assert ours.full <= n and (ours.full == n or ours.full > max_length), where


@pytest.mark.parametrize("max_length", MAX_LENGTHS)
def test_short_pairs_are_cut_as_the_backend_cuts_them_at_every_max_length(max_length):
    """Every LongestFirst case (one short, both past half, equally long, odd budgets, a budget
    of 0) against the backend's own truncation, on pairs short enough for it to cut."""
    rng = random.Random(max_length)
    for name, base in tokenizers():
        tok = Tokenizer(base.backend, max_length, base.pad_id, base.lowercase)
        if max_length < tok.backend.num_special_tokens_to_add(True):
            with pytest.raises(ValueError, match=r"^pairs: a pair has \d special tokens, more than max_length"):
                tok.encode(["the cat"], ["sat"])
            assert tok.encode(["the cat"], [None])[0].ids == tok.encode(["the cat"])[0].ids  # no pair: fine
            continue
        words = [rng.choice(["the", "cat", "sat", "house", "river", "naïve", "東京", "don't", "!?"])
                 for _ in range(400)]
        pool = [" ".join(words[i : i + rng.randint(1, 3 * max_length)]) for i in range(0, 360, 9)]
        pool = [t.lower() for t in pool] if tok.lowercase else pool
        firsts, seconds = pool + pool[:8], rng.sample(pool, len(pool)) + pool[:8]  # the last 8: equal
        expected = whole_then_cut(tok, max_length, list(zip(firsts, seconds, strict=True)))
        for a, b, ours, (ids, types, n) in zip(firsts, seconds, tok.encode(firsts, seconds), expected, strict=True):
            assert (ours.ids, ours.type_ids, ours.full) == (ids, types, n), (name, max_length, a, b)


def test_a_long_pair_at_a_small_max_length_takes_little_memory(tmp_path):
    """The backend's truncation makes every combination of a pair's overflowing pieces: for two
    3000-character CJK texts at max_length 5 that held 3.4 GB (a million combinations of the
    windows' 1024 tokens each). tformer cuts the encoding itself; a process limited to 1 GB of
    address space encodes such a pair (it was killed before)."""
    script = tmp_path / "pair.py"
    script.write_text(
        "import resource, sys\n"
        "resource.setrlimit(resource.RLIMIT_AS, (1 << 30, 1 << 30))\n"
        "from tokenizers import Tokenizer as Backend\n"
        "from tformer.text.tokenizer import Tokenizer\n"
        "backend = Backend.from_file(sys.argv[1])\n"
        "tok = Tokenizer(backend, 5)\n"
        "text = '東' * 3000\n"
        "(e,) = tok.encode([text], [text + ' 東京'])\n"
        "print(len(e.ids), e.full)\n")
    import subprocess
    import sys

    base = load_tokenizer(bert_dir())
    tokenizer_json = tmp_path / "tokenizer.json"
    base.backend.save(str(tokenizer_json))
    done = subprocess.run([sys.executable, str(script), str(tokenizer_json)], capture_output=True, text=True,
                          timeout=120)
    assert done.returncode == 0, done.stderr[-2000:]
    kept, full = done.stdout.strip().split(maxsplit=1)
    assert kept == "5" and full.endswith("or more")


@pytest.mark.parametrize("max_length", MAX_LENGTHS)
def test_pieces_are_the_whole_texts_pieces_cut(max_length):
    for name, base in tokenizers():
        tok = Tokenizer(base.backend, max_length, base.pad_id, base.lowercase)
        inputs = texts(50 + max_length)
        lowered = [t.lower() for t in inputs] if tok.lowercase else inputs
        expected = [e.ids[: max_length - 1] for e in tok.backend.encode_batch(lowered, add_special_tokens=False)]
        assert tok.pieces(inputs) == expected, name


@pytest.mark.parametrize("max_length", (5, 16, 64))
def test_prefixes_encode_as_the_whole_texts_do_with_their_counts(max_length):
    """What a server admits and hands on (Tokenizer.prefixes): texts, pairs and pieces whose
    encodings are the whole inputs' cut, counted as encode counts them, in fewer characters."""
    shortened = 0
    for name, base in tokenizers():
        tok = Tokenizer(base.backend, max_length, base.pad_id, base.lowercase)
        inputs = texts(70 + max_length)
        kept, none, full = tok.prefixes(inputs)
        assert none is None and [e.full for e in tok.encode(inputs)] == full, name
        assert [e.ids for e in tok.encode(kept)] == [e.ids for e in tok.encode(inputs)], name
        kept, _, counts = tok.prefixes(inputs, specials=False)
        assert tok.pieces(kept) == tok.pieces(inputs), name
        lowered = [t.lower() for t in inputs] if tok.lowercase else inputs
        whole = [len(e.ids) for e in tok.backend.encode_batch(lowered, add_special_tokens=False)]
        for n, m, text in zip(counts, whole, inputs, strict=True):  # a cut one: a true lower bound
            assert n == m or (isinstance(n, AtLeast) and max_length - 1 < n <= m), (name, text[:40])
        shortened += sum(len(k) < len(t) for k, t in zip(kept, inputs, strict=True))
        firsts, seconds = [t[:1600] for t in inputs], [None, *(t[:1600] for t in inputs[1:])]
        a, b, full = tok.prefixes(firsts, seconds)
        assert b[0] is None and [e.full for e in tok.encode(firsts, seconds)] == full, name
        assert [e.ids for e in tok.encode(a, b)] == [e.ids for e in tok.encode(firsts, seconds)], name
    assert shortened > 10  # the prefix path was taken


def test_a_cut_count_prints_as_a_lower_bound():
    assert f"{AtLeast(20)}" == "20 or more" and AtLeast(20) > 16
    assert longest([17, 30]) == 30 and not isinstance(longest([17, 30]), AtLeast)
    assert str(longest([AtLeast(20), 30])) == "30 or more"  # the cut one may be the longest


def test_an_unread_count_prints_as_a_lower_bound_and_keeps_its_flag():
    """A text read only to its reach: its count prints as any lower bound, is cut whatever it
    is, and stays an ``Unread`` through copies, pickles and a seq2seq source's + EOS."""
    n = Unread(3, 16384, 40012)
    assert f"{n}" == str(n) == repr(n) == "3 or more" and n == 3 and f"{n:>3}" == "  3 or more"
    assert is_cut(n, 64) and not is_cut(n, None) and not is_cut(AtLeast(3), 64) and is_cut(AtLeast(65), 64)
    for same in (copy.copy(n), copy.deepcopy(n), pickle.loads(pickle.dumps(n)), plus(n, 0)):
        assert isinstance(same, Unread) and (int(same), same.read, same.chars) == (3, 16384, 40012)
    assert isinstance(plus(n, 1), Unread) and plus(n, 1) == 4 and plus(n, 1).read == 16384
    assert cut_reason([n], 64) == (
        "were read only to their first 16,384 characters (of 40,012 in the longest: tokenizing stops "
        "there when no cut to 64 tokens is in sight), so they were truncated")
    assert cut_reason([Unread(70, 20000, 90000), n, Unread(2, 20000, 50000)], 64) == (
        "are longer than the model's maximum length (64 tokens; the longest has 70 or more) or were "
        "read only to their first 16,384 to 20,000 characters (2 of them, of 50,000 in the longest: "
        "tokenizing stops there when no cut to 64 tokens is in sight), so they were truncated")
    assert cut_reason([70, 80], 64) == ("are longer than the model's maximum length (64 tokens; the "
                                        "longest has 80), so they were truncated")  # (as before)
    assert n.lost(64).startswith("read only to its first 16,384 characters of 40,012 (")
    assert Unread(3, 10, 20, 1).lost(64).startswith("its pair read only to its first 10 characters of 20 (")


def test_a_text_read_only_to_its_reach_is_cut_whatever_its_count():
    """A WordPiece word of 40,000 characters (one [UNK], no end in sight) is read only to its
    reach: "hello world" after it was dropped, and with 3 tokens in all (under max_length) the
    text was not seen as cut: no warning, and truncation=False let it through. Its count is now
    an ``Unread``, cut whatever it is; alone or in a pair (naming the segment). The rest is
    scanned, never tokenized."""
    base = load_tokenizer(bert_dir())
    spy = SpyBackend(base.backend)
    tok = Tokenizer(spy, base.max_length, base.pad_id, base.lowercase)
    far = reach(tok.max_length - 2)
    for text in ["a" * 40_000 + " hello world", " " * 40_000 + "end", "the cat" + " " * 40_000 + "x"]:
        spy.seen.clear()
        (alone,) = tok.encode([text])
        assert max(spy.seen) <= far, spy.seen
        full = alone.full
        assert isinstance(full, Unread) and full <= tok.max_length and alone.truncated, (text[:9], full)
        assert (full.read, full.chars, full.segment) == (far, len(text), None)
        (second,), (first,) = tok.encode(["a dog"], [text]), tok.encode([text], ["a dog"])
        assert isinstance(second.full, Unread) and second.full.segment == 1 and second.truncated
        assert isinstance(first.full, Unread) and first.full.segment == 0 and first.truncated
        kept, _, counts = tok.prefixes([text], specials=False)  # (a seq2seq source's count)
        assert isinstance(counts[0], Unread) and kept[0] == text[:far]


def test_only_whitespace_past_the_reach_loses_nothing_and_is_not_flagged():
    tok = load_tokenizer(bert_dir())
    far = reach(tok.max_length - 2)
    for text in ["a" * far + " " * 20_000, "the cat" + " \n\t\u3000" * 10_000]:
        (encoded,) = tok.encode([text])
        assert isinstance(encoded.full, AtLeast) and not isinstance(encoded.full, Unread), text[:9]
        assert not encoded.truncated and encoded.ids == tok.backend.encode(text).ids  # the whole text's


class _NoGilHolding(SpyBackend):
    """A backend whose ``encode`` (one text: tokenizers holds the GIL through it) must not be
    called: ``encode_batch`` lets go of it while it works."""

    def encode(self, text, *args, **kwargs):
        pytest.fail(f"encode held the GIL for {len(text)} characters")


def test_prefixes_are_tokenized_without_holding_the_gil():
    """A 135 kB prefix held the GIL for 43 ms through ``encode``, and with it a server's event
    loop: long texts and pairs go through ``encode_batch`` only."""
    base = load_tokenizer(bert_dir())
    tok = Tokenizer(_NoGilHolding(base.backend), 17, base.pad_id, base.lowercase)
    text = "the cat sat " * 200_000
    (encoded,) = tok.encode([text])
    odd = Tokenizer(tok.backend, 18, base.pad_id, base.lowercase)  # 15 to share: one read whole
    (pair,) = odd.encode([text], [text[: 2 * len(text) // 3]])
    assert len(encoded.ids) == 17 and len(pair.ids) == 18 and tok.backend.seen


def test_a_long_text_is_tokenized_only_as_far_as_its_cut_needs():
    base = load_tokenizer(bert_dir())
    spy = SpyBackend(base.backend)
    tok = Tokenizer(spy, 16, base.pad_id, base.lowercase)
    text = "the cat sat " * 200_000  # 2.4 MB
    (encoded,) = tok.encode([text])
    assert encoded.ids == tok.encode([text[:2000]])[0].ids and len(encoded.ids) == 16
    assert isinstance(encoded.full, AtLeast) and encoded.full > 16
    assert tok.pieces([text]) == tok.pieces([text[:2000]])
    paired = Tokenizer(tok.backend, 17, base.pad_id, base.lowercase)  # 14 tokens to share: an even split
    (pair,) = paired.encode([text], [text + "more"])
    assert len(pair.ids) == 17
    assert max(spy.seen) <= 4 * 64 * 16 * 2, max(spy.seen)  # a few windows, never the 2.4 MB


def long_words(size: int) -> list[str]:
    """Words (no space) that WordPiece, BPE and Unigram each cut into pieces in their own ways."""
    rng = random.Random(size)
    return ["".join(rng.choice("abcdefghij") for _ in range(size)), "a" * size, ("ab" * size)[:size],
            "".join(rng.choice("東京北京大学日本語中文") for _ in range(size)),  # (one word where spaces split)
            base64.b64encode(rng.randbytes(size)).decode()[:size], rng.randbytes(size).hex()[:size]]


@pytest.mark.parametrize("max_length", (3, 16, 64))
def test_a_long_word_is_cut_inside_with_the_whole_texts_ids(max_length):
    """A word of more than LONG_WORD_CHARS is cut inside, its pieces ending far from the cut
    counted: BPE and Unigram give the whole word's first pieces (a piece depends only on the
    characters near it: within 43 of the cut, measured), WordPiece one [UNK] for the word either
    way. A word past the reach followed by more words: BPE and Unigram cut inside the word;
    WordPiece reads the text only to the reach (its [UNK] could run on for megabytes), so its
    ids are those of that prefix: the words after the [UNK] are lost."""
    for name, base in tokenizers():
        tok = Tokenizer(base.backend, max_length, base.pad_id, base.lowercase)
        far = reach(max_length - tok.backend.num_special_tokens_to_add(False))
        words = long_words(3000) + long_words(far + 5000)
        inputs = words + [w + " the cat sat" for w in words[-3:]]
        inputs = [t.lower() for t in inputs] if tok.lowercase else inputs
        read = [t[:far] if name in ("bert", "wordpiece") and len(t) > far else t for t in inputs]
        expected = whole_then_cut(tok, max_length, read)
        for text, ours, (ids, types, n) in zip(inputs, tok.encode(inputs), expected, strict=True):
            where = f"{name}, max_length {max_length}, text {text[:20]!r}...{text[-12:]!r} ({len(text)} chars)"
            assert ours.ids == ids and ours.type_ids == types, where
            if len(text) > far:  # counted from the prefix read: a lower bound
                assert isinstance(ours.full, AtLeast) and ours.full <= n, where


def pair_cut(tok: Tokenizer, a: str, b: str) -> tuple[list[int], list[int]]:
    """The pair tokenized whole, cut longest first (tformer.text.windows.split without windows:
    the backend's LongestFirst, checked against it on short pairs above; the backend's own would
    take gigabytes here)."""
    return split(tok.backend.encode(a, b), tok.max_length, False)[0][0]


@pytest.mark.parametrize("max_length", (16, 17, *(pytest.param(n, marks=pytest.mark.slow) for n in (64, 65))))
def test_two_long_texts_sharing_an_odd_budget_are_read_to_the_reach(max_length):
    """Of two cut segments, LongestFirst gives an odd budget's last token to the one with more
    tokens: known once the shorter is read to its end, or both to the reach, where it goes to
    the one with more tokens in its prefix. Only there can the ids differ from the whole
    pair's cut, in that token; an even budget is shared alike whichever is longer."""
    deviations = 0
    for name, base in tokenizers():
        tok = Tokenizer(base.backend, max_length, base.pad_id, base.lowercase)
        budget = max_length - tok.backend.num_special_tokens_to_add(True)
        far = reach(budget)
        dense, sparse = "the cat sat " * (far // 8), "the  cat  sat  " * (far // 5)  # sparse: more tokens, later
        short = "the river sat " * (far // 20)  # shorter than the reach, longer than the first windows
        pairs = [(dense, sparse), (sparse, dense), (dense, dense + " more"), (dense + " more", dense),
                 (dense, short), (short, sparse), (short, short + " more")]
        for (a, b), ours in zip(pairs, tok.encode(*zip(*pairs, strict=True)), strict=True):
            both_past = len(a) > far and len(b) > far and budget % 2
            expected = pair_cut(tok, *((a[:far], b[:far]) if both_past else (a, b)))
            where = f"{name}, max_length {max_length}, pair of {len(a)} and {len(b)} chars"
            assert (ours.ids, ours.type_ids) == expected, where
            deviations += expected != pair_cut(tok, a, b)
            n = len(tok.backend.encode(a, b).ids)
            assert ours.full == n or (isinstance(ours.full, AtLeast) and ours.full <= n), where
    assert deviations > 0 if max_length % 2 == 0 else deviations == 0  # (3 specials: 16 and 64 leave odd budgets)


def test_a_text_of_megabytes_without_a_cut_in_sight_is_read_only_to_its_reach():
    """A 4 MB word, a flood of 4 MB of spaces, two 2.4 MB texts sharing an odd budget: each
    backend call tokenizes at most the reach's characters (a pair: both prefixes), where they
    were tokenized whole (10 s for a 16 MB word)."""
    for name, base in tokenizers():
        spy = SpyBackend(base.backend)
        for max_length in (16, 17):
            tok = Tokenizer(spy, max_length, base.pad_id, base.lowercase)
            far = reach(max_length - tok.backend.num_special_tokens_to_add(True))
            spy.seen.clear()
            encoded = tok.encode([LETTERS * 200, " " * 4_000_000 + "end", "a" * 4_000_000])
            assert max(spy.seen) <= far and all(isinstance(e.full, AtLeast) for e in encoded), (name, spy.seen)
            long = "the cat sat " * 200_000
            spy.seen.clear()
            (pair,) = tok.encode([long], [long + " more"])
            assert max(spy.seen) <= 2 * far and len(pair.ids) == max_length, (name, max_length, spy.seen)


def test_long_texts_keep_their_count_longest_and_first_places_only():
    """A command's warning about cut texts kept a (place, tokens) pair per cut text until the end
    (embed: 172 MiB more for 10^6 long lines than for 10^5; predict: 92 MiB): LongTexts keeps
    the count, the longest and the first SHOWN places, whatever the number of texts."""
    from tformer.text.prefix import LongTexts

    long = LongTexts(32)
    for i in range(10_000):
        long.note(i if i % 2 else None, AtLeast(70) if i == 3 else 40 + i % 7)  # even: unnamed (a shard's)
    assert (long.count, long.named, long.longest()) == (10_000, 5_000, 70)
    assert isinstance(long.longest(), AtLeast) and str(long.longest()) == "70 or more"
    assert long.first == [1, 3, 5, 7, 9] and long.places(lambda i: f"#{i}") == "#1, #3, #5, #7, #9, ..."
    assert [len(v) for v in vars(long).values() if isinstance(v, list)] == [LongTexts.SHOWN]
    few = LongTexts(16)
    few.note(2, 30)
    assert (few.longest(), few.places()) == (30, "2") and not isinstance(few.longest(), AtLeast)
