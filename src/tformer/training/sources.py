"""Where a run's examples come from: a synthetic task, or your own files. One class each.

    source = TaskSource(get_task("reverse", seed), config)   # generated splits, batches by step
    source = FileSource(TextData.build(config, run_dir))     # your files, length-bucketed batches

An objective (tformer.training.objective; one per kind, tformer.kinds) asks its source for
held-out examples, training batches and token ids, and scores them itself. What the two differ
in: examples (a task's ``Example``, a file's record dict), tokenizers (a task's symbol table
with tformer's specials, a file's trained or pretrained subwords; ``tokenizer`` is None for a
task) and the model's layout (a task's plain encoder; a file's BERT layout for encoders, so
that they export).
"""

from __future__ import annotations

import copy
import itertools
from collections.abc import Callable, Iterable, Iterator, Mapping
from pathlib import Path
from typing import Any

from tformer.config import TransformerConfig, bert_layout
from tformer.errors import BadInput, FieldError, shown
from tformer.text.batches import EncodedText
from tformer.text.specials import BOS, EOS, PAD
from tformer.training.dataset import TextData
from tformer.training.records import Record
from tformer.training.stream import BatchStream
from tformer.training.tasks import Example, Task

Data = str | Path | Any  # a file, or records (an iterable of dicts of fields)


def check_data(name: str, data: Any) -> None:
    """`data` (or `valid`, `test`): a file path or records, else refused in one line naming it
    (a number was a bare "not iterable" from deep inside)."""
    if isinstance(data, (bytes, bytearray, Mapping)) or not isinstance(data, (str, Path, Iterable)):
        hint = " (one record? pass a list of them)" if isinstance(data, Mapping) else ""
        raise ValueError(f"{name}: expected a file path (str or Path) or records (an iterable of dicts), "
                         f"got {type(data).__name__}{hint}")


class TaskSource:
    """A synthetic task (tformer.training.tasks): its splits are generated from the seed, and the batch
    for step k depends only on (seed, k). Inputs are the task's symbols; ids carry tformer's
    specials (PAD, BOS, EOS)."""

    bos_id, eos_id, pad_id = BOS, EOS, PAD
    train_records = None  # an endless stream

    def __init__(self, task: Task, config) -> None:
        self.task, self.config = task, config
        self.kind = task.kind
        self.description = f"task {task.name}: {task.description}"
        self.labels = [str(c) for c in range(task.n_classes or 0)]  # class ids, as printed

    def with_config(self, config) -> TaskSource:
        """The same task under other training options (a plan trying sizes)."""
        return TaskSource(self.task, config)

    # The model's shape ---------------------------------------------------------------------
    def seq2seq_config(self) -> TransformerConfig:
        """The sizes given, the task's vocabulary, lengths and classes."""
        return self.config.task_model(self.task)

    def encoder_config(self, **heads: Any) -> TransformerConfig:
        """As seq2seq_config: a task's classifier is a plain encoder with its own head options."""
        return self.config.task_model(self.task)

    @property
    def max_new_tokens(self) -> int:
        return self.task.max_target_tokens + 1  # its EOS

    # Examples -------------------------------------------------------------------------------
    def examples(self, split: str) -> list[Example]:
        return self.task.split(split)

    def train_batches(self, encode: Callable[[list], list], collate: Callable[[list], Any], start: int,
                      rank: int = 0, world: int = 1) -> Iterator:
        """Batch `step` for each step from `start` whose step % world == rank."""
        step = start
        while True:
            if step % world == rank:
                yield collate(encode(self.task.train_batch(step, self.config.batch_size)))
            step += 1

    def inputs(self, texts: list[str], fields: tuple[str, ...], pairs: list | None = None) -> list[Example]:
        """Examples of texts a user gives (the task's symbols only: a one-line error else)."""
        if pairs is not None and any(pairs):
            raise ValueError(f"pairs: {self.description} takes single inputs, got pairs")
        for i, text in enumerate(texts):
            try:
                n = len(self.task.tokenizer.encode(text, strict=True))
            except FieldError as e:
                raise BadInput(i, e.detail) from None
            if not n:
                raise BadInput(i, f"expected at least one symbol, got {text!r}")
            if n + 1 > self.task.max_len:  # with its EOS (or BOS)
                raise BadInput(i, f"expected at most {self.task.max_len} tokens with specials (this "
                                  f"model's length), got {n + 1} in {shown(text)}")
        return [Example(text) for text in texts]

    def read_examples(self, data: Data, limit: int | None = None) -> Iterator:
        raise FieldError("data", f"{self.description} evaluates on its own generated splits, not on files")

    def summary(self) -> tuple[str, ...]:
        """What a model card says of the data (one line each)."""
        c = self.config
        return (f"generated by the synthetic task {self.task.name} ({self.task.description}), from seed "
                f"{c.seed}: {c.valid_size:,} validation and {c.test_size:,} test examples",)

    # Token ids ------------------------------------------------------------------------------
    def field(self, example: Example, name: str) -> str | None:
        """An example's text by the field name a file would use (a task's input is its source)."""
        return {"source": example.source, "text": example.source, "target": example.target}.get(name)

    def pieces(self, texts: list[str | None]) -> list[list[int]]:
        """Symbol ids without specials (what an encoder-decoder reads, EOS added, and predicts)."""
        return [self.task.tokenizer.encode(t or "") for t in texts]

    def encode_texts(self, texts: list[str], pairs: list | None = None) -> list[EncodedText]:
        """What a classifier reads: BOS, then the symbols (no token types)."""
        return [EncodedText([BOS] + self.task.tokenizer.encode(t), None) for t in texts]

    def label_ids(self, examples: list[Example]) -> list[int]:
        return [ex.label for ex in examples]

    def decode(self, ids: list[int]) -> str:
        return self.task.tokenizer.decode(ids)

    def token_name(self, token_id: int) -> str:
        return self.task.tokenizer.vocab[token_id]

    def cut_at(self, max_length: int) -> TaskSource:
        return self  # a task's inputs are short by construction

    def targets(self, examples: list[Example]) -> list[str]:
        """Each example's target as text (a task's symbols), for the sample table."""
        return [ex.target or str(ex.label) for ex in examples]

    def row(self, example: Example, shown: str) -> tuple[str, str, str]:
        """(input, prediction, target) for the sample table."""
        return example.source, shown, example.target or str(example.label)

    def check_unchanged(self, thorough: bool = True) -> None:
        """Nothing to check: a task's examples are generated, not read."""

    # Files of the run -----------------------------------------------------------------------
    @property
    def tokenizer(self):
        return None  # no text tokenizer (a symbol table): nothing exports to transformers


class FileSource:
    """Your own files (tformer.training.dataset.TextData): the held-out splits, the training
    stream of length-bucketed batches, the run's tokenizer and label names."""

    def __init__(self, data: TextData, config=None) -> None:
        self.config = data.config if config is None else config
        if data.tokenizer is not None and data.tokenizer.max_length != self.config.max_length:
            # A plan trying lengths, a fine-tune's too (its choices stop at the model's positions):
            # a fine-tune's tokenizer once kept the preset's 64 here, so its plan saw every text
            # cut at 64 (none cut at 128: "whole for 100%" where 78% were longer) and the length
            # it chose, 128, never reached its batches.
            data = data.with_max_length(self.config.max_length)
        self.data, self.tokenizer = data, data.tokenizer
        self.kind = data.fields.objective
        self.labels = list(data.labels)
        self.description = f"data {self.config.data}"

    def with_config(self, config) -> FileSource:
        """The same data under other training options (a plan trying lengths and sizes)."""
        return FileSource(self.data, config)

    @property
    def long(self) -> str | None:
        """How the run reads a text longer than max_length: "windows", "cut" (None: not settled
        yet, cut; tformer.training.windows settles it)."""
        return self.data.long

    def windowed(self, windows: bool = True) -> FileSource:
        """This source reading a long text in windows (tformer.text.windows), or cutting it."""
        other = copy.copy(self)
        other.tokenizer = self.tokenizer.windowed(windows)
        return other

    @property
    def train_records(self) -> int | None:
        return self.data.train_record_estimate()

    @property
    def bos_id(self) -> int:
        return self.tokenizer.bos_id

    @property
    def eos_id(self) -> int:
        return self.tokenizer.eos_id

    @property
    def pad_id(self) -> int:
        return self.tokenizer.pad_id

    # The model's shape ---------------------------------------------------------------------
    def seq2seq_config(self) -> TransformerConfig:
        """An encoder-decoder of the sizes given (with a final norm where pre-norm)."""
        c = self.config
        return c.model.replace(final_norm=c.model.norm_first, vocab_size=self.tokenizer.vocab_size,
                               max_len=c.max_length + 1)

    def encoder_config(self, **heads: Any) -> TransformerConfig:
        """An encoder of the sizes given in BERT's layout (config.bert_layout), so that it
        exports to transformers and sentence-transformers, with the layers the options ask for:
        norm_first (pre-norm, with a final norm: `export --hf` refuses it) and activation (the
        presets give BERT's gelu); `heads`: a classifier's (n_classes, pooling, pooler)."""
        m = self.config.model
        return bert_layout(m, max_len=self.config.max_length, vocab_size=self.tokenizer.vocab_size,
                           norm_first=m.norm_first, final_norm=m.norm_first, activation=m.activation,
                           **heads)

    @property
    def max_new_tokens(self) -> int:
        return self.config.max_length

    # Examples -------------------------------------------------------------------------------
    def examples(self, split: str) -> list[Record]:
        return self.data.held_out(split)

    def train_batches(self, encode: Callable[[list], list], collate: Callable[[list], Any], start: int,
                      rank: int = 0, world: int = 1) -> BatchStream:
        return BatchStream(self.data, encode, collate, self.config.max_tokens, start, rank, world)

    def inputs(self, texts: list[str], fields: tuple[str, ...], pairs: list | None = None) -> list[Record]:
        """Records of texts a user gives: texts[i] fills fields[0], pairs[i] (if given and not
        empty) fields[1]: a classifier's text_pair, refused for a run trained without pairs."""
        if pairs is None:
            return [{fields[0]: text} for text in texts]
        if len(pairs) != len(texts):
            raise ValueError(f"pairs: expected {len(texts)} (one per text), got {len(pairs)}")
        if any(pairs) and not self.data.pairs:
            raise ValueError(f"pairs: {self.description} trained on single texts (no "
                             f"{fields[1]} field), got pairs")
        return [{fields[0]: t, **({fields[1]: p} if p else {})} for t, p in zip(texts, pairs, strict=True)]

    def summary(self) -> tuple[str, ...]:
        """What a model card says of the data (one line each): records, splits, renamed columns."""
        c, data = self.config, self.data
        n = data.identity.get("data", {}).get("records")
        lines = [f"{n:,} records in the training file" if n is not None else "records: not recorded"]
        held = [f"{name}: `{path}`" for name, path in (("validation", c.valid), ("test", c.test)) if path]
        hashed = [name for name, path in (("validation", c.valid), ("test", c.test)) if not path]
        if hashed:
            held.append(f"{' and '.join(hashed)}: {data.fraction:.0%} of the training file each, split by a "
                        f"seeded hash of the input text (seed {c.seed}; no input in two splits)")
        lines += held
        if c.columns:
            lines.append(f"columns renamed: `{c.columns}`")
        return tuple(lines)

    def read_examples(self, data: Data, limit: int | None = None) -> Iterator[Record]:
        """The first `limit` records (all: None) of a file, read (and checked) one at a time as
        they are taken and no further than them, or of records given as dicts."""
        check_data("data", data)
        if isinstance(data, (str, Path)):
            return itertools.islice(self.data.read_file(data), limit)
        records = self.data.check_records(itertools.islice(data, limit), "data")
        if not records:
            raise FieldError("data", "expected at least one record, got none")
        return iter(records)

    # Token ids ------------------------------------------------------------------------------
    def field(self, record: Record, name: str) -> str | None:
        return record.get(name)

    def pieces(self, texts: list[str | None]) -> list[list[int]]:
        """Subword ids without specials, each cut to max_length - 1 (room for EOS or BOS)."""
        return self.tokenizer.pieces([t or "" for t in texts])

    def encode_texts(self, texts: list[str], pairs: list | None = None) -> list[EncodedText]:
        """Each text (and its pair, where not None) on its own, with the tokenizer's specials,
        cut to max_length."""
        return self.tokenizer.encode(texts, pairs)

    def label_ids(self, records: list[Record]) -> list[int]:
        """Each record's class id (-1: none, a text to predict)."""
        label = self.data.fields.label
        return [self.data.label_ids.get(r.get(label, ""), -1) for r in records]

    def decode(self, ids: list[int]) -> str:
        return self.tokenizer.decode(ids)

    def token_name(self, token_id: int) -> str:
        return self.tokenizer.token_text(token_id)  # the decoded piece: "the", not "Ġthe"

    def cut_at(self, max_length: int) -> FileSource:
        """This source with its texts cut at max_length tokens, where that is below the run's."""
        other = copy.copy(self)
        other.tokenizer = self.tokenizer.at_most(min(max_length, self.tokenizer.max_length))
        return other

    def check_unchanged(self, thorough: bool = True) -> None:
        """Refuse data files that changed since the run started (TextData.check_unchanged)."""
        self.data.check_unchanged(thorough)

    def row(self, record: Record, shown: str) -> tuple[str, str, str]:
        first, second = self.data.fields.required
        return record[first], shown, record[second]
