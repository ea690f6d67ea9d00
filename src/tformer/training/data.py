"""Your own data: streaming readers, the seeded split, the tokenizer and token-count batches.

    data = TextData.build(config, run_dir)       # reads the files, trains or loads a tokenizer
    for batch in data.train_batches(start=0):    # an endless, seeded stream of batches
        ...

Files: JSONL (one object per line), CSV and TSV with a header row, read line by line
(a file larger than memory works: only the held-out splits are kept in memory). Every
error names the file and line. The field names choose the objective (OBJECTIVES).

The split, when --valid/--test are not given: each record's input text (source, text +
text_pair, or anchor) is hashed with the seed to u in [0, 1); u < f goes to test,
f <= u < 2f to validation, the rest to training, with f = min(5%, 1000 / records): about
5% each, at most about 1,000. The same text always hashes the same, so no input text is in
two splits. Given --valid/--test files, training records whose input text is in them are
skipped for the same reason.

Batches hold up to --max-tokens padded tokens: the stream is read in pools of POOL
records, each pool sorted by length and cut into batches of similar lengths (length
bucketing: little padding), the batches shuffled. Everything is seeded by (seed, epoch),
so the stream is the same every time; a resumed run skips the batches it has used.
"""

from __future__ import annotations

import csv
import hashlib
import json
import random
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from torch import Tensor

from tformer.tasks.base import Seq2SeqBatch

# objective -> (required fields, optional fields)
OBJECTIVES: dict[str, tuple[tuple[str, ...], tuple[str, ...]]] = {
    "seq2seq": (("source", "target"), ()),
    "classification": (("text", "label"), ("text_pair",)),
    "embedding": (("anchor", "positive"), ("negative",)),
}
FORMATS = {".jsonl": "jsonl", ".json": "jsonl", ".csv": "csv", ".tsv": "tsv"}
POOL = 4096  # records sorted together for length bucketing
SPLIT_FRACTION, SPLIT_CAP = 0.05, 1000
TOKENIZER_SAMPLE = 200_000  # records the tokenizer is trained on (the first ones)
SPECIALS = ("<pad>", "<s>", "</s>", "<unk>")  # ids 0-3, as the synthetic tasks' PAD, BOS, EOS, UNK


# Reading ------------------------------------------------------------------------------
def parse_columns(spec: str | None) -> dict[str, str]:
    """'en=source,fr=target' -> {'en': 'source', 'fr': 'target'} (their name -> ours)."""
    out: dict[str, str] = {}
    for part in (spec or "").split(","):
        if not part.strip():
            continue
        if part.count("=") != 1 or not all(s.strip() for s in part.split("=")):
            raise ValueError(f"columns: expected 'theirs=ours,...', got {spec!r}")
        theirs, ours = (s.strip() for s in part.split("="))
        out[theirs] = ours
    return out


def read_records(path: str | Path, columns: str | None = None) -> Iterator[tuple[int, dict[str, Any]]]:
    """(line number, record) for each record of a JSONL/CSV/TSV file, one line at a time."""
    path = Path(path)
    kind = FORMATS.get(path.suffix.lower())
    if kind is None:
        raise ValueError(f"{path}: expected a .jsonl, .csv or .tsv file, got {path.suffix or 'no suffix'!r}")
    if not path.is_file():
        raise FileNotFoundError(f"{path}: no such file")
    rename = parse_columns(columns)
    with path.open(encoding="utf-8", newline="") as f:
        try:
            if kind == "jsonl":
                for line_no, line in enumerate(f, 1):
                    if not line.strip():
                        continue
                    try:
                        record = json.loads(line)
                    except json.JSONDecodeError as e:
                        raise ValueError(f"{path}:{line_no}: not valid JSON ({e.msg})") from None
                    if not isinstance(record, dict):
                        raise ValueError(f"{path}:{line_no}: expected a JSON object, got "
                                         f"{type(record).__name__}")
                    yield line_no, {rename.get(k, k): v for k, v in record.items()}
            else:
                reader = csv.reader(f, delimiter="," if kind == "csv" else "\t")
                header = next(reader, None)
                if not header:
                    raise ValueError(f"{path}:1: expected a header row, got an empty file")
                header = [rename.get(h.strip(), h.strip()) for h in header]
                for row in reader:
                    if not any(c.strip() for c in row):
                        continue
                    if len(row) != len(header):
                        raise ValueError(f"{path}:{reader.line_num}: expected {len(header)} "
                                         f"columns ({', '.join(header)}), got {len(row)}")
                    yield reader.line_num, dict(zip(header, row, strict=True))
        except UnicodeDecodeError as e:
            raise ValueError(f"{path}: not UTF-8 text ({e.reason} at byte {e.start})") from None


def objective_of(fields: set[str] | list[str], where: str) -> str:
    """The objective the field names choose (source+target, text+label, anchor+positive)."""
    for objective, (required, _) in OBJECTIVES.items():
        if set(required) <= set(fields):
            return objective
    raise ValueError(
        f"{where}: expected fields source+target, text+label or anchor+positive, got "
        f"{', '.join(sorted(fields)) or 'none'} (rename columns with --columns theirs=ours)"
    )


def peek_objective(path: str | Path, columns: str | None = None) -> str:
    for line_no, record in read_records(path, columns):
        return objective_of(list(record), f"{path}:{line_no}")
    raise ValueError(f"{path}: expected at least one record, got an empty file")


def check_record(path: Path, line_no: int, record: dict[str, Any], objective: str) -> dict[str, str]:
    """The record's objective fields as non-empty strings (labels may be JSON numbers)."""
    required, optional = OBJECTIVES[objective]
    out: dict[str, str] = {}
    for name in required + optional:
        value = record.get(name)
        if value is None:
            if name in optional:
                continue
            raise ValueError(f"{path}:{line_no}: missing field {name!r} (the record has "
                             f"{', '.join(sorted(record)) or 'none'})")
        if name == "label" and isinstance(value, (int, bool)):
            value = str(value)
        if not isinstance(value, str):
            raise ValueError(f"{path}:{line_no}: {name}: expected a string, got {type(value).__name__}")
        if not value.strip():
            raise ValueError(f"{path}:{line_no}: {name}: expected text, got an empty string")
        out[name] = value
    return out


def input_key(record: dict[str, str]) -> str:
    """The text that decides a record's split: the model's input."""
    if "source" in record:
        return record["source"]
    if "text" in record:
        return record["text"] + "\t" + record.get("text_pair", "")
    return record["anchor"]


def split_of(key: str, seed: int, fraction: float) -> str:
    digest = hashlib.blake2b(f"{seed}\0{key}".encode(), digest_size=8).digest()
    u = int.from_bytes(digest, "big") / 2**64
    return "test" if u < fraction else "validation" if u < 2 * fraction else "train"


# The tokenizer ----------------------------------------------------------------------------
def train_tokenizer(texts: Iterator[str], kind: str, vocab_size: int):
    """A subword tokenizer (HF `tokenizers`) trained on `texts`.

    bpe (the default, for every objective): byte-level BPE as in GPT-2 / RoBERTa. Every
    string is some sequence of bytes, so there is no unknown token and decoding gives back
    the exact text (spaces, case, accents, punctuation, `%s` placeholders, any script);
    BLEU and chrF are then computed on the true output text, and a classifier or embedding
    model never sees an [UNK] for a word or script missing from training.
    wordpiece / unigram: BERT's and SentencePiece's schemes, with a Metaspace
    pre-tokenizer so that they round-trip spaces too (characters never seen in training
    become <unk>).
    Encoder inputs are wrapped as "<s> text </s>" (pairs: "<s> a </s> b </s>") by the
    saved post-processor, so the file alone tokenizes like training did.
    """
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors, trainers

    specials = list(SPECIALS)
    if kind == "bpe":
        tok = Tokenizer(models.BPE())
        tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
        tok.decoder = decoders.ByteLevel()
        trainer = trainers.BpeTrainer(vocab_size=vocab_size, special_tokens=specials,
                                      initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
                                      show_progress=False)
    elif kind == "wordpiece":
        tok = Tokenizer(models.WordPiece(unk_token="<unk>"))
        tok.pre_tokenizer = pre_tokenizers.Metaspace()
        tok.decoder = decoders.Metaspace()
        trainer = trainers.WordPieceTrainer(vocab_size=vocab_size, special_tokens=specials,
                                            continuing_subword_prefix="", show_progress=False)
        tok.model = models.WordPiece(unk_token="<unk>", continuing_subword_prefix="")
    else:
        tok = Tokenizer(models.Unigram())
        tok.pre_tokenizer = pre_tokenizers.Metaspace()
        tok.decoder = decoders.Metaspace()
        trainer = trainers.UnigramTrainer(vocab_size=vocab_size, special_tokens=specials,
                                          unk_token="<unk>", show_progress=False)
    tok.train_from_iterator(texts, trainer=trainer)
    for i, s in enumerate(specials):
        assert tok.token_to_id(s) == i, (s, tok.token_to_id(s))
    tok.post_processor = processors.TemplateProcessing(
        single="<s> $A </s>", pair="<s> $A </s> $B:1 </s>:1",
        special_tokens=[("<s>", 1), ("</s>", 2)])
    return tok


class TextTokenizer:
    """A `tokenizers.Tokenizer` as training uses it: ids with specials, truncated.

    From scratch: ids 0-3 are <pad>, <s> (BOS, read as [CLS]), </s> (EOS, [SEP]), <unk>.
    A pretrained directory's tokenizer brings its own [CLS]/[SEP]/[PAD].
    """

    def __init__(self, backend, max_length: int) -> None:
        backend.no_padding()
        backend.no_truncation()
        self.backend, self.max_length = backend, max_length
        pad = backend.token_to_id("<pad>")
        self.pad_id = pad if pad is not None else int(backend.token_to_id("[PAD]") or 0)
        self.bos_id = backend.token_to_id("<s>")
        self.eos_id = backend.token_to_id("</s>")

    @property
    def vocab_size(self) -> int:
        return self.backend.get_vocab_size()

    def pieces(self, texts: list[str]) -> list[list[int]]:
        """Token ids without specials, each cut to max_length - 1 (room for EOS or BOS)."""
        return [e.ids[: self.max_length - 1]
                for e in self.backend.encode_batch(texts, add_special_tokens=False)]

    def encoder_inputs(self, texts: list[str], pairs: list[str] | None = None
                       ) -> list[tuple[list[int], list[int]]]:
        """(ids, token type ids) with the tokenizer's own specials, cut to max_length."""
        self.backend.enable_truncation(self.max_length)
        try:
            inputs = texts if pairs is None else list(zip(texts, pairs, strict=True))
            return [(e.ids, e.type_ids) for e in self.backend.encode_batch(inputs)]
        finally:
            self.backend.no_truncation()

    def decode(self, ids: list[int]) -> str:
        return self.backend.decode(ids, skip_special_tokens=True)


# Batches ------------------------------------------------------------------------------------
def pad(rows: list[list[int]], value: int = 0) -> tuple[Tensor, Tensor]:
    """Right-pad id lists -> (ids (B, L) long, mask (B, L) bool, True = real token)."""
    width = max(len(r) for r in rows)
    ids = torch.full((len(rows), width), value, dtype=torch.long)  # (B, L)
    mask = torch.zeros((len(rows), width), dtype=torch.bool)  # (B, L)
    for i, r in enumerate(rows):
        ids[i, : len(r)] = torch.tensor(r, dtype=torch.long)
        mask[i, : len(r)] = True
    return ids, mask


@dataclass
class EncodedBatch:
    """Encoder inputs: input_ids, attention_mask, token_type_ids (B, S); labels (B,) or None."""

    input_ids: Tensor
    attention_mask: Tensor
    token_type_ids: Tensor
    labels: Tensor | None = None

    def n_tokens(self) -> int:
        return int(self.attention_mask.sum())


@dataclass
class PairBatch:
    """Embedding training: anchors, positives and (optionally) hard negatives, row-aligned."""

    anchor: EncodedBatch
    positive: EncodedBatch
    negative: EncodedBatch | None = None

    def n_tokens(self) -> int:
        return sum(b.n_tokens() for b in (self.anchor, self.positive, self.negative) if b is not None)


def encoded_batch(rows: list[tuple[list[int], list[int]]], pad_id: int,
                  labels: list[int] | None = None) -> EncodedBatch:
    ids, mask = pad([r[0] for r in rows], pad_id)
    types, _ = pad([r[1] for r in rows], 0)
    label_t = torch.tensor(labels, dtype=torch.long) if labels is not None else None
    return EncodedBatch(ids, mask, types, label_t)


def _cost(example: tuple) -> int:
    """Tokens an example adds to a batch's length (the padded width grows with the longest)."""
    return sum(len(part[0]) if isinstance(part, tuple) else len(part)
               for part in example if isinstance(part, (list, tuple)))


def bucket(examples: list[tuple], max_tokens: int, rng: random.Random) -> list[list[tuple]]:
    """Cut examples into batches of similar length with at most max_tokens padded tokens
    (an example longer than that is a batch alone), in a shuffled order."""
    examples = list(examples)
    rng.shuffle(examples)  # ties in length are broken differently every epoch
    examples.sort(key=_cost)
    batches, current, widest = [], [], 0
    for ex in examples:
        width = max(widest, _cost(ex))
        if current and width * (len(current) + 1) > max_tokens:
            batches.append(current)
            current, width = [], _cost(ex)
        current.append(ex)
        widest = width
    if current:
        batches.append(current)
    rng.shuffle(batches)
    return batches


# The data set --------------------------------------------------------------------------------
class TextData:
    """The training stream and the held-out splits of a data run, with its tokenizer.

    objective: "seq2seq", "classification" or "embedding"; labels: classification's label
    names (read from the training file, sorted), the model's class ids index them.
    """

    def __init__(self, config, objective: str, tokenizer: TextTokenizer, labels: list[str],
                 fraction: float) -> None:
        self.config, self.objective, self.tokenizer = config, objective, tokenizer
        self.labels, self.fraction = labels, fraction
        self.label_ids = {name: i for i, name in enumerate(labels)}
        self._held_out: dict[str, list[dict[str, str]]] = {}
        self._held_out_keys: set[str] | None = None

    # Building -------------------------------------------------------------------------------
    @classmethod
    def build(cls, config, run_dir: Path | None = None, write: bool = True) -> TextData:
        """Read the training file once (objective, labels, size); train the tokenizer on it,
        or load the run's / pretrained model's tokenizer; write tokenizer.json and data.json."""
        train_path = Path(config.data)
        objective = peek_objective(train_path, config.columns)
        labels: set[str] = set()
        n = 0
        for line_no, record in read_records(train_path, config.columns):
            fields = check_record(train_path, line_no, record, objective)
            n += 1
            if objective == "classification":
                labels.add(fields["label"])
        if objective == "classification" and len(labels) < 2:
            raise ValueError(f"{train_path}: label: expected at least 2 distinct labels, got "
                             f"{sorted(labels)}")
        fraction = min(SPLIT_FRACTION, SPLIT_CAP / max(n, 1))
        saved = run_dir / "tokenizer.json" if run_dir is not None else None
        if saved is not None and saved.is_file():
            backend = _load_backend(saved)
        elif config.from_pretrained:
            backend = _pretrained_backend(Path(config.from_pretrained))
        else:
            data = cls(config, objective, None, sorted(labels), fraction)  # type: ignore[arg-type]
            backend = train_tokenizer(data._tokenizer_texts(), config.tokenizer, config.vocab_size)
        max_length = config.max_length
        if config.from_pretrained:  # never past the pretrained model's position table
            from tformer.tokenizer import load_tokenizer

            limit = load_tokenizer(config.from_pretrained).max_length
            max_length = min(max_length, limit) if limit else max_length
        data = cls(config, objective, TextTokenizer(backend, max_length), sorted(labels), fraction)
        if write and run_dir is not None:
            from tformer.files import write_atomic, write_json_atomic

            write_atomic(run_dir / "tokenizer.json", backend.to_str().encode())
            write_json_atomic(run_dir / "data.json", data.describe())
        return data

    @classmethod
    def from_run(cls, run_dir: Path, config) -> TextData:
        """The tokenizer and labels of a finished run, without reading its data files."""
        info = json.loads((run_dir / "data.json").read_text())
        backend = _load_backend(run_dir / "tokenizer.json")
        return cls(config, info["objective"], TextTokenizer(backend, info["max_length"]),
                   info["labels"], info["split_fraction"])

    def describe(self) -> dict[str, Any]:
        return {"objective": self.objective, "labels": self.labels, "max_length": self.tokenizer.max_length,
                "split_fraction": self.fraction, "vocab_size": self.tokenizer.vocab_size}

    def _tokenizer_texts(self) -> Iterator[str]:
        for i, record in enumerate(self.train_records()):
            if i >= TOKENIZER_SAMPLE:
                return
            for name, value in record.items():
                if name != "label":
                    yield value

    # Splits ----------------------------------------------------------------------------
    def held_out(self, split: str) -> list[dict[str, str]]:
        """The "validation" or "test" records (each with its "line" for error messages)."""
        if split not in self._held_out:
            path = self.config.valid if split == "validation" else self.config.test
            if path is not None:
                records = list(self.read_file(path, check_labels=True))
            else:
                train = Path(self.config.data)
                records = [dict(r, line=str(line)) for line, r in self._checked(train)
                           if split_of(input_key(r), self.config.seed, self.fraction) == split]
            if not records:
                raise ValueError(f"{split}: expected at least one record, got none (the split of "
                                 f"{self.config.data} is empty: add --valid/--test files)")
            self._held_out[split] = records
        return self._held_out[split]

    def read_file(self, path: str | Path, check_labels: bool = True) -> Iterator[dict[str, str]]:
        """Checked records of a valid/test/eval file (unknown labels are errors)."""
        for line, record in self._checked(Path(path)):
            if check_labels and self.objective == "classification" and record["label"] not in self.label_ids:
                raise ValueError(f"{path}:{line}: label {record['label']!r} is not one of the "
                                 f"training labels ({', '.join(self.labels)})")
            yield dict(record, line=str(line))

    def _checked(self, path: Path) -> Iterator[tuple[int, dict[str, str]]]:
        for line_no, record in read_records(path, self.config.columns):
            yield line_no, check_record(path, line_no, record, self.objective)

    def train_records(self) -> Iterator[dict[str, str]]:
        """The training file's records minus the held-out ones, streamed."""
        c = self.config
        if self._held_out_keys is None:
            given = [s for s, p in (("validation", c.valid), ("test", c.test)) if p is not None]
            self._held_out_keys = {input_key(r) for s in given for r in self.held_out(s)}
        hashed = {s for s, p in (("validation", c.valid), ("test", c.test)) if p is None}
        for _, record in self._checked(Path(c.data)):
            key = input_key(record)
            if key in self._held_out_keys:
                continue
            if hashed and split_of(key, c.seed, self.fraction) in hashed:
                continue
            yield record

    # Encoding and batches ----------------------------------------------------------------
    def encode(self, records: list[dict[str, str]]) -> list[tuple]:
        tok = self.tokenizer
        if self.objective == "seq2seq":
            src = tok.pieces([r["source"] for r in records])
            tgt = tok.pieces([r["target"] for r in records])
            return [(s + [tok.eos_id], t) for s, t in zip(src, tgt, strict=True)]
        if self.objective == "classification":
            pairs = [r.get("text_pair", "") for r in records] if "text_pair" in records[0] else None
            inputs = tok.encoder_inputs([r["text"] for r in records], pairs)
            return [(x, self.label_ids.get(r["label"], -1)) for x, r in zip(inputs, records, strict=True)]
        anchors = tok.encoder_inputs([r["anchor"] for r in records])
        positives = tok.encoder_inputs([r["positive"] for r in records])
        if "negative" in records[0]:
            negatives = tok.encoder_inputs([r.get("negative", r["positive"]) for r in records])
            return list(zip(anchors, positives, negatives, strict=True))
        return list(zip(anchors, positives, strict=True))

    def collate(self, examples: list[tuple]):
        pad_id = self.tokenizer.pad_id
        if self.objective == "seq2seq":
            bos, eos = self.tokenizer.bos_id, self.tokenizer.eos_id
            src, src_mask = pad([e[0] for e in examples], pad_id)
            tgt_in, tgt_mask = pad([[bos] + e[1] for e in examples], pad_id)
            labels, _ = pad([e[1] + [eos] for e in examples], pad_id)
            return Seq2SeqBatch(src, src_mask, tgt_in, tgt_mask, labels)
        if self.objective == "classification":
            return encoded_batch([e[0] for e in examples], pad_id, [e[1] for e in examples])
        parts = [encoded_batch([e[i] for e in examples], pad_id) for i in range(len(examples[0]))]
        return PairBatch(*parts)

    def epoch_batches(self, epoch: int) -> Iterator[list[tuple]]:
        """One pass over the training stream as bucketed batches, seeded by (seed, epoch)."""
        rng = random.Random(f"{self.config.seed}/epoch/{epoch}")
        pool: list[dict[str, str]] = []
        any_record = False
        for record in self.train_records():
            pool.append(record)
            any_record = True
            if len(pool) == POOL:
                yield from bucket(self.encode(pool), self.config.max_tokens, rng)
                pool = []
        if pool:
            yield from bucket(self.encode(pool), self.config.max_tokens, rng)
        if not any_record:
            raise ValueError(f"{self.config.data}: no training records left after the split")

    def train_batches(self, start: int = 0, rank: int = 0, world: int = 1) -> Iterator:
        """The endless stream of training batches from the `start`-th (counting every rank's),
        keeping those of this rank: batch i goes to rank i % world."""
        i, epoch = 0, 0
        while True:
            for examples in self.epoch_batches(epoch):
                if i >= start and i % world == rank:
                    yield self.collate(examples)
                i += 1
            epoch += 1


def _load_backend(path: Path):
    from tokenizers import Tokenizer

    try:
        return Tokenizer.from_file(str(path))
    except Exception as e:
        raise ValueError(f"{path}: not a tokenizers file ({e})") from None


def _pretrained_backend(model_dir: Path):
    """A pretrained directory's tokenizer (tokenizer.json, or built from vocab.txt)."""
    from tformer.tokenizer import load_tokenizer

    tok = load_tokenizer(model_dir)
    backend = tok.backend
    if tok.lowercase:  # sentence-transformers' do_lower_case: bake it into the normaliser
        from tokenizers import normalizers

        steps = [backend.normalizer] if backend.normalizer is not None else []
        backend.normalizer = normalizers.Sequence([*steps, normalizers.Lowercase()])
    return backend
