"""Tokenization for BERT-format directories, with the ``tokenizers`` library.

``load_tokenizer(DIR)`` reads ``tokenizer.json`` (or builds a WordPiece tokenizer from
``vocab.txt``) and returns a callable that batches, pads to the longest text and truncates
to the model's maximum length:

    tok = load_tokenizer(DIR)
    batch = tok(["a sentence", "another"])  # input_ids, attention_mask, token_type_ids: (B, S)

The maximum length is the smallest of the model's position table (``config.json``) and
sentence-transformers' ``max_seq_length``. Padding and truncation settings stored inside
``tokenizer.json`` are switched off, not trusted: a file saved with ``truncation: 128`` or
``padding: 512`` must not silently change what the model sees.
"""

from __future__ import annotations

import json
import warnings
from collections.abc import Callable, Iterable, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from tformer.errors import FieldError
from tformer.formats.model_dir import ModelDir, read_model_dir
from tformer.text.arguments import check_encodable, pairs_list, texts_list, token_ids
from tformer.text.batches import EncodedText, encoder_arrays
from tformer.text.byte_level import BYTE_OF
from tformer.text.prefix import AtLeast, Unread, cut_reason, edge_chars, is_cut, pair_window, window
from tformer.text.prefix import TextTooLong as TextTooLong  # the callers' name for it here
from tformer.text.windows import MAX_WINDOWS, coverage, split


class Tokenizer:
    """A ``tokenizers.Tokenizer`` with tformer's batching, padding and truncation rules.

    ``encode`` is the one way texts become token ids: each text (with its pair) cut to
    max_length, and how long it was before the cut. Everything that runs a model on text
    calls it (embedding, prediction, the server, training's batches) and decides itself what
    a cut means: a warning, an error, or nothing. It never switches a setting of the backend
    (it cuts the encodings itself, as the backend's truncation would), so threads may share a
    Tokenizer. With ``windows`` a text longer than max_length is read in windows of it instead
    (tformer.text.windows): the first is the cut, the others ride along (``EncodedText.rest``).
    """

    def __init__(
        self,
        backend: Any,
        max_length: int | None,
        pad_id: int = 0,
        lowercase: bool = False,
        windows: bool = False,
    ) -> None:
        backend.no_padding()  # we pad ourselves, to the longest text in the batch
        backend.no_truncation()  # we truncate ourselves, to max_length, and say so
        specials = backend.num_special_tokens_to_add(False)
        if max_length is not None and max_length <= specials:  # the cut could keep no token of a text
            raise FieldError("max_length", f"expected more than the {specials} special tokens each text "
                             f"gets (at least {specials + 1}), got {max_length}")
        self.backend, self.max_length = backend, max_length
        self.pad_id, self.lowercase, self.windows = pad_id, lowercase, windows and max_length is not None
        self._edge: int | None = None  # tformer.text.prefix.edge_chars, found on first use

    def at_most(self, max_length: int | None) -> Tokenizer:
        """This tokenizer cutting at ``max_length`` (None: this one), which may lower its maximum
        length (the model's), never raise it: the one check of a --max-length for every command."""
        if max_length is None:
            return self
        if isinstance(max_length, bool) or not isinstance(max_length, int):
            raise FieldError("max_length", f"expected an int, got {max_length!r}")
        if self.max_length is not None and max_length > self.max_length:
            raise FieldError("max_length", f"expected at most {self.max_length} (the model's maximum "
                                           f"length), got {max_length}")
        return Tokenizer(self.backend, max_length, self.pad_id, self.lowercase, self.windows)

    def windowed(self, windows: bool = True) -> Tokenizer:
        """This tokenizer reading a long text in windows (or, False, cutting it)."""
        return self if windows == self.windows else Tokenizer(self.backend, self.max_length, self.pad_id,
                                                               self.lowercase, windows)

    @property
    def limit(self) -> int | None:
        """The most tokens of one text it reads, specials included: max_length, or with windows
        what MAX_WINDOWS of them read (tformer.text.windows)."""
        if not self.windows:
            return self.max_length
        specials = self.backend.num_special_tokens_to_add(False)
        return specials + coverage(self.max_length - specials)

    def encode(self, texts: str | Sequence[str], pairs: Sequence[str | None] | None = None
               ) -> list[EncodedText]:
        """Each text (and pairs[i], its second segment, where not None) on its own, with the
        tokenizer's specials: ids and token types cut to max_length, and ``full``, the token
        count before the cut (a text is longer than the model takes where full > len(ids)).
        A text far longer than max_length is tokenized only as far as its cut needs
        (tformer.text.prefix: the same ids, but where no cut is in sight by its reach, a bounded
        number of characters); its ``full`` is then an ``AtLeast`` (an ``Unread``, cut whatever
        its count, where more than whitespace was left unread). With windows, a long text's
        first window and the others (``rest``), and the tokens they read (``read``)."""
        return self.read(texts, pairs)[2]

    def read(self, texts: str | Sequence[str], pairs: Sequence[str | None] | None = None
             ) -> tuple[list[str], list[str | None] | None, list[EncodedText]]:
        """``prefixes``' texts and pairs, with what ``encode`` gives of them (a server counts a
        long text's windows at admission, and hands on only the prefixes)."""
        inputs, encodings, full = self._encode_prefixes(texts, pairs, specials=True)
        out = []
        for e, n in zip(encodings, full, strict=True):
            if self.max_length is None or n <= self.max_length:
                out.append(EncodedText(e.ids, e.type_ids, n))
                continue
            (first, *rest), read = split(e, self.max_length, self.windows)
            out.append(EncodedText(*first, n, tuple(EncodedText(*w) for w in rest), read))
        return *_segments(inputs, pairs is not None), out

    def prefixes(self, texts: str | Sequence[str], pairs: Sequence[str | None] | None = None,
                 specials: bool = True) -> tuple[list[str], list[str | None] | None, list[int]]:
        """The texts (and pairs) as far as their cut at max_length needs them, and each one's
        token count before the cut (an ``AtLeast`` where a text was cut short): encoding the
        texts returned gives the ids that encoding the texts given does, at a cost bounded by
        max_length, not by the texts (a server counts and refuses at admission, and hands on
        only the prefixes). They come lowercased where the tokenizer lowercases.
        ``specials=False``: counted and cut as ``pieces`` (no specials, max_length - 1)."""
        inputs, _, full = self._encode_prefixes(texts, pairs, specials)
        return *_segments(inputs, pairs is not None), full

    def _encode_prefixes(self, texts: str | Sequence[str], pairs: Sequence[str | None] | None,
                         specials: bool) -> tuple[list, list[Any], list[int]]:
        """The inputs (a text, or a (text, pair) tuple), each long segment replaced by the prefix
        its cut needs; their encodings, uncut; their token counts before the cut."""
        texts = self._check_texts("texts", texts)
        if pairs is None:
            inputs: list = texts
        else:
            pairs = pairs_list(pairs, len(texts))
            added = self.backend.num_special_tokens_to_add(True)
            paired = any(p is not None for p in pairs)
            if paired and self.max_length is not None and self.max_length < added:
                raise ValueError(f"pairs: a pair has {added} special tokens, more than max_length "
                                 f"({self.max_length}); expected a max_length of at least {added}")
            pairs = [p.lower() if p is not None and self.lowercase else p for p in pairs]
            inputs = [t if p is None else (t, p) for t, p in zip(texts, pairs, strict=True)]
        sure: list[list[int | None]] = [[None]] * len(inputs)  # per segment: tokens known (a prefix)
        if self.max_length is not None:  # a long text: only the prefix its cut keeps (tformer.text.prefix)
            inputs, sure = self._windows(inputs, specials)
        encodings = list(self.backend.encode_batch(inputs, add_special_tokens=specials))
        full = [len(e.ids) if all(n is None for n in known) else self._at_least(e, known)
                for e, known in zip(encodings, sure, strict=True)]
        return inputs, encodings, full

    @property
    def edge(self) -> int:
        """Characters at a prefix's end whose tokens may differ from the whole text's."""
        if self._edge is None:
            self._edge = edge_chars(self.backend)
        return self._edge

    def _windows(self, inputs: list, specials: bool) -> tuple[list, list[list[int | None]]]:
        """Each input with every long segment replaced by the prefix its cut needs, and per
        segment the tokens that prefix surely shares with the whole (None: the whole segment).
        Without specials a text is cut at max_length - 1 (``pieces``: room for EOS or BOS)."""
        out, sure = [], []
        for item in inputs:
            segments = [item] if isinstance(item, str) else list(item)
            budget = (self.max_length - self.backend.num_special_tokens_to_add(len(segments) == 2)
                      if specials else self.max_length - 1)
            if self.windows and specials:  # as far as the windows read (a pair's: either segment)
                budget = coverage(budget) * len(segments)
            if len(segments) == 2:
                cut = list(pair_window(self.backend, *segments, budget, self.edge))
            else:
                cut = [window(self.backend, segments[0], budget, self.edge)]
            out.append(cut[0][0] if isinstance(item, str) else tuple(p for p, _ in cut))
            sure.append([n for _, n in cut])
        return out, sure

    def _at_least(self, encoding: Any, sure: list[int | None]) -> AtLeast:
        """The token count of a text (or pair) tokenized as prefixes: specials, each whole
        segment's tokens and each cut segment's sure tokens; an ``Unread`` where a segment was
        read only to its reach with more than whitespace after it (the first such one named)."""
        segments = encoding.sequence_ids
        n = sum(s is None for s in segments)
        for i, known in enumerate(sure):
            n += known if known is not None else sum(s == i for s in segments)
        unread = [(i, k) for i, k in enumerate(sure) if isinstance(k, Unread)]
        if unread:
            i, k = unread[0]
            return Unread(n, k.read, k.chars, i if len(sure) == 2 else None)
        return AtLeast(n)


    def __call__(
        self,
        texts: str | Sequence[str],
        text_pairs: Sequence[str] | None = None,
        truncation: bool = True,
        return_tensors: str = "pt",
    ) -> dict[str, Any]:
        """Tokenize a batch: pad to the longest, truncate to ``max_length`` with a warning.

        With ``truncation=False`` a text longer than ``max_length`` (or read only to its reach,
        tformer.text.prefix) raises ValueError.
        ``return_tensors``: "pt" (torch int64) or "np" (numpy int64).

        Shape:
            returns input_ids, attention_mask (1 = real token), token_type_ids: each (B, S)
        """
        if text_pairs is not None:
            text_pairs = self._check_texts("text_pairs", text_pairs)
        if return_tensors not in ("pt", "np"):
            raise ValueError(f"return_tensors: expected 'pt' or 'np', got {return_tensors!r}")
        tok = self.windowed(False)  # one row a text: its first window, the cut
        encoded = tok.encode(texts, text_pairs)
        tok.check_lengths([e.full for e in encoded], truncation)
        batch = encoder_arrays([e.ids for e in encoded], self.pad_id, type_ids=[e.type_ids for e in encoded])
        out = {"input_ids": batch.input_ids, "attention_mask": batch.attention_mask.astype(np.int64),
               "token_type_ids": batch.token_type_ids}
        if return_tensors == "pt":
            import torch

            out = {k: torch.from_numpy(v) for k, v in out.items()}
        return out

    def lengths(self, texts: str | Sequence[str]) -> list[int]:
        """Token counts (special tokens included) before any truncation, each text tokenized
        whole (benchmarks sizing their sentences; ``encode`` counts a long text from its prefix)."""
        return [len(e.ids) for e in self.backend.encode_batch(self._check_texts("texts", texts))]

    def tokenize(self, text: str) -> list[str]:
        """The tokens of one text, special tokens included, truncated to ``max_length``."""
        return self.convert_ids_to_tokens(self.encode([text])[0].ids)

    def convert_ids_to_tokens(self, ids: Sequence[int]) -> list[str]:
        return [self.backend.id_to_token(i) or "[?]" for i in self._token_ids(ids)]

    def token_text(self, token_id: int) -> str:
        """A token as a reader sees it (attention pictures): the text it decodes to, spaces
        around it trimmed ("the", not byte-level BPE's "Ġthe" or Metaspace's "▁the"); a
        special token as it is ("<s>"); a space or line break as "␣" / "⏎"; a piece of a
        multi-byte character (byte-level BPE) as its bytes ("<e6 9d>")."""
        (token_id,) = self._token_ids([token_id], "token_id")
        raw = self.backend.id_to_token(token_id)
        if raw is None:
            return "[?]"
        text = self.backend.decode([token_id], skip_special_tokens=False)
        if "\ufffd" in text and set(raw) <= set(BYTE_OF):  # bytes of a character cut apart
            return "<" + " ".join(f"{BYTE_OF[c]:02x}" for c in raw if BYTE_OF[c] != 0x20) + ">"
        if not text.strip():
            return "⏎" if "\n" in text else "␣"
        return text.strip()

    @property
    def vocab_size(self) -> int:
        return self.backend.get_vocab_size()

    @property
    def bos_id(self) -> int | None:
        """The id that starts a sequence: <s> (tformer's vocabularies) or [CLS] (BERT's)."""
        return _first_id(self.backend, ("<s>", "[CLS]"))

    @property
    def eos_id(self) -> int | None:
        """The id that ends a sequence: </s> or [SEP]."""
        return _first_id(self.backend, ("</s>", "[SEP]"))

    def pieces(self, texts: Sequence[str]) -> list[list[int]]:
        """Token ids without specials, each cut to max_length - 1 (room for EOS or BOS):
        what an encoder-decoder reads and predicts. A long text is tokenized only as far as
        its cut needs (tformer.text.prefix)."""
        _, encodings, _ = self._encode_prefixes(texts, None, specials=False)
        cut = self.max_length - 1 if self.max_length is not None else None
        return [e.ids[:cut] for e in encodings]

    def decode(self, ids: Sequence[int]) -> str:
        return self.backend.decode(self._token_ids(ids), skip_special_tokens=True)

    def _token_ids(self, ids: Iterable[int], name: str = "ids") -> list[int]:
        return token_ids(ids, self.vocab_size, name)

    def _check_texts(self, name: str, texts: str | Sequence[str]) -> list[str]:
        texts = texts_list(name, texts)
        if not texts:
            raise ValueError(f"{name}: expected at least one text, got none")
        for i, t in enumerate(texts):
            if not isinstance(t, str):
                raise TypeError(f"{name}[{i}]: expected a str, got {type(t).__name__}")
            check_encodable(f"{name}[{i}]", t)
        return [t.lower() for t in texts] if self.lowercase else texts

    def check_lengths(self, lengths: Sequence[int], truncation: bool = True,
                      on_long: Callable[[list[int], list[int]], None] | None = None) -> list[int]:
        """Indices of texts cut: longer than it reads (``limit``: max_length, or what its windows
        read of one text; a pair's windows say their own, ``EncodedText.truncated``), or read
        only to their reach with more than whitespace left (an ``Unread`` count,
        tformer.text.prefix): one warning, or TextTooLong (a ValueError) if not truncating.
        ``on_long(indices, lengths)`` takes the warning's place (a caller that checks a file
        chunk by chunk warns once, naming lines; ``cut_reason`` words it).

        ``lengths``: token counts before truncation (``EncodedText.full``).
        """
        m = self.limit  # (with windows: what they read)
        long = [i for i, n in enumerate(lengths) if is_cut(n, m)]
        if not long:
            return long
        if not truncation:
            raise TextTooLong(long[0], lengths[long[0]], m)
        if on_long is not None:
            on_long(long, [lengths[i] for i in long])
            return long
        whose = f"the model's {MAX_WINDOWS}-window" if self.windows else "the model's"
        warnings.warn(
            f"{len(long)} of {len(lengths)} texts {cut_reason([lengths[i] for i in long], m, whose)} "
            "(truncation=False / --no-truncate raises instead)",
            UserWarning,
            stacklevel=4,
        )
        return long


def _segments(inputs: list, paired: bool) -> tuple[list[str], list[str | None] | None]:
    """The texts of inputs (a text, or a (text, pair) tuple), and their pairs where `paired`."""
    firsts = [x if isinstance(x, str) else x[0] for x in inputs]
    return firsts, [None if isinstance(x, str) else x[1] for x in inputs] if paired else None


def load_tokenizer(directory: str | Path | ModelDir, max_length: int | None = None) -> Tokenizer:
    """The tokenizer of a BERT-format (or sentence-transformers) directory.

    Reads ``tokenizer.json``, else ``vocab.txt`` (lowercasing as ``tokenizer_config.json``'s
    ``do_lower_case`` says, default true). ``max_length`` may lower the model's limit, never
    raise it past the position table.
    """
    md = read_model_dir(directory)
    limit = md.position_limit
    if md.layout.max_seq_length is not None:
        limit = md.layout.max_seq_length if limit is None else min(limit, md.layout.max_seq_length)

    from tokenizers import Tokenizer as Backend

    tokenizer_json, vocab_txt = md.find("tokenizer.json"), md.find("vocab.txt")
    if tokenizer_json is not None:
        try:
            backend = Backend.from_file(str(tokenizer_json))
        except Exception as e:
            raise ValueError(f"{tokenizer_json}: not a tokenizers file ({e})") from None
    elif vocab_txt is not None:
        from tokenizers import BertWordPieceTokenizer

        lowercase = _tokenizer_config(md.model_dir).get("do_lower_case", True)
        with vocab_txt.open(encoding="utf-8", errors="replace") as f:
            tokens = {line.strip() for line in f}
        missing = [t for t in ("[CLS]", "[SEP]") if t not in tokens]
        if missing:  # (the tokenizers library would say only "sep_token not found")
            raise ValueError(f"{vocab_txt}: expected a WordPiece vocabulary (one token per line, "
                             f"with {', '.join(missing)}), got "
                             + ("an empty file" if not tokens - {""} else "none of those"))
        backend = BertWordPieceTokenizer(str(vocab_txt), lowercase=bool(lowercase))._tokenizer
    else:
        raise FileNotFoundError(
            f"{md.model_dir / 'tokenizer.json'}: no such file (nor vocab.txt); "
            "the model directory needs a tokenizer"
        )
    tokenizer = Tokenizer(backend, limit, pad_id_of(backend), lowercase=md.layout.do_lower_case)
    return tokenizer.at_most(max_length)


def _tokenizer_config(model_dir: Path) -> dict[str, Any]:
    path = model_dir / "tokenizer_config.json"
    if not path.is_file():
        return {}
    try:
        data = json.loads(path.read_text())
    except json.JSONDecodeError as e:
        raise ValueError(f"{path}: not valid JSON ({e})") from None
    return data if isinstance(data, dict) else {}


def _first_id(backend: Any, tokens: Sequence[str]) -> int | None:
    for token in tokens:
        i = backend.token_to_id(token)
        if i is not None:
            return int(i)
    return None


def pad_id_of(backend: Any) -> int:
    """<pad>'s or [PAD]'s id; else the pad id tokenizer.json names; else 0 (masked out either way)."""
    pad = _first_id(backend, ("<pad>", "[PAD]"))
    if pad is None and backend.padding:
        pad = backend.padding.get("pad_id")
    return int(pad or 0)
