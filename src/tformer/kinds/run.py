"""A trained run: its model, objective and options, with the verbs of its kind.

    run = load_run("runs/x")        # tformer.kinds: the Run class of the run's kind
    run.evaluate()                  # every kind: metrics on the test split (or on data=...)
    run.export(hf="out/")           # every kind its formats (transformers, ONNX)

Each kind's module subclasses Run with its own verb (``predict``, ``generate``, ``embed``...),
its exports and what the server asks of it (``admit``, ``run_batch``: tformer.kinds.serving).
The commands, the server and the Python API ask the run; none of them asks which kind it is.
"""

from __future__ import annotations

import json
import os
import shlex
from abc import ABC, abstractmethod
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from torch import nn

from tformer.errors import FieldError, as_path
from tformer.export.export_dir import check_destination
from tformer.export.model_card import HUB_NAME, Card
from tformer.export.opsets import check_opset
from tformer.kinds.serving import Item, token_lists
from tformer.nn.devices import model_device
from tformer.storage.locks import output_lock, remove_leftovers
from tformer.text.arguments import check_texts
from tformer.text.prefix import is_cut, plus
from tformer.training.command import train_command
from tformer.training.config import TrainConfig
from tformer.training.objective import Objective
from tformer.training.sources import Data

SPLITS = ("test", "validation")  # what evaluate reads of a run's own data (tformer eval --split)


@dataclass(frozen=True)
class AttentionInput:
    """One text as the run's model reads it (what `tformer attention` draws)."""

    model: nn.Module
    seq2seq: bool  # whether a decoder generates (and draws its own maps)
    ids: list[int]  # the encoder input, specials included
    type_ids: list[int] | None
    token_name: Any  # id -> the token's text
    bos_id: int
    eos_id: int
    pad_id: int
    max_new_tokens: int


class Run(ABC):
    """A run directory's model (eval mode, frozen: its weights run packed, see tformer.nn.kernels),
    objective and TrainConfig."""

    kind = ""  # the kind's name (tformer.kinds)
    verb = ""  # the command that runs this kind on inputs (its error messages name it)
    pipeline_tag = ""  # what its exports' model cards name as their Hub task
    # The server protocols it answers (names tformer.serve.routes knows: "tei.predict", ...),
    # and whose /info fields it gives ("tei" or "tgi").
    protocols: tuple[str, ...] = ("tei.tokenize",)
    info_protocol = "tei"

    def __init__(self, path: str | Path, model: nn.Module, objective: Objective, config: TrainConfig,
                 record: dict[str, Any] | None = None) -> None:
        self.path, self.model, self.objective, self.config = Path(path), model, objective, config
        self.record = record  # the test record of the training that made it, if this process trained it

    def __repr__(self) -> str:
        return f"{type(self).__name__}({str(self.path)!r}: {self.description})"

    @classmethod
    def pretrained_advice(cls, run: Path, kind=None) -> str:
        """What to do with a run of this kind that --from-pretrained named (a kind whose run is
        a model directory itself says to give it; tformer.kinds.check_not_a_run)."""
        if kind is not None and kind.run is not cls:
            return kind.run.pretrained_advice(run, kind)
        return ("fine-tuning starts from an encoder: a BERT-format or sentence-transformers directory, "
                "an embedding run, or a classification run's `tformer export RUN --hf` folder")

    @property
    def description(self) -> str:
        return self.objective.description

    @property
    def tokenizer(self):
        """The run's text tokenizer (tformer.text.tokenizer), or None for a synthetic task."""
        return self.objective.tokenizer

    def truncated(self, texts: list[str], pairs: list[str | None] | None = None) -> list[tuple[int, int]]:
        """(index, token count) of each text longer than the run reads, or read only to its
        reach (an ``Unread`` count, tformer.text.prefix): cut to its maximum length when it
        runs (a command warns, naming them). A synthetic task refuses such an input instead
        (BadInput): none here."""
        tok = self.tokenizer
        if tok is None or tok.max_length is None:
            return []
        if self.decodes:  # an encoder-decoder reads the text's pieces and EOS (Seq2SeqRun._input_ids)
            counts = [plus(n, 1) for n in tok.prefixes(texts, specials=False)[2]]
            return [(i, n) for i, n in enumerate(counts) if is_cut(n, tok.max_length)]
        return [(i, e.full) for i, e in enumerate(tok.encode(texts, pairs)) if e.truncated]

    @property
    def main_metric(self) -> str:
        return self.objective.main_metric

    def read_long(self, long: str | None) -> Run:
        """This run reading a text longer than its max length in windows (``long="windows"``)
        or cut (``"cut"``) from here on, whatever it settled on in training (data.json; None:
        that): `--long` of predict, eval and embed. Only a kind that pools windows
        (``Objective.pools``) reads them; the run itself, changed."""
        if long not in (None, "windows", "cut"):
            raise FieldError("long", f"expected windows, cut or None, got {long!r}")
        if long is not None and self.tokenizer is not None:
            if long == "windows" and not self.objective.pools:
                raise FieldError("long", f"{self.path} is {self.objective.description}, which reads a text "
                                         f"to its max length; expected no windows, got {long!r}")
            self.objective.source = self.objective.source.windowed(long == "windows")
        return self

    def read_aggregation(self, strategy: str | None) -> Run:
        """This run grouping a text's entities by ``strategy``, transformers' aggregation_strategy
        ("first", "simple": tformer.text.word_pieces), from here on (None: as it does): ``predict``'s
        default and `--aggregation-strategy` of predict. Only a kind that finds entities (a
        tagging run) groups them; the run itself, changed."""
        if strategy is None:
            return self
        raise FieldError("aggregation_strategy", f"{self.path} is {self.objective.description}, which "
                         f"finds no entities to group; expected no strategy, got {strategy!r}")

    # What `tformer predict` asks of a run with a ``predict`` verb ------------------------------
    pairs = False  # trained on text pairs (a kind that reads them says so: a property)

    def predict_inputs(self, lines: list[str]) -> tuple[list[str], list[str | None] | None]:
        """The command's input lines as ``predict`` takes them: texts, and their pairs (None). A
        run trained on pairs reads a tab as the end of the text and the start of its pair."""
        if not self.pairs:
            return lines, None
        split = [line.partition("\t") for line in lines]  # text, tab, text_pair
        pairs = [pair or None for _, _, pair in split]
        return [text for text, _, _ in split], pairs if any(pairs) else None

    def printed(self, text: str, answer: Any) -> tuple[str, dict[str, Any]]:
        """What the command prints for an input and its answer: its line of text, and the
        record --format jsonl writes; numbers that are not finite (a broken checkpoint) refused."""
        raise NotImplementedError(f"{type(self).__name__} has no predict")

    # Evaluation ----------------------------------------------------------------------------
    def examples(self, split: str = "test", data: Data | None = None, limit: int | None = None) -> list:
        """A held-out split's examples, or those of `data` (a file or records); only the first
        `limit` (a file is read no further)."""
        return list(self.example_stream(split, data, limit))

    def example_stream(self, split: str = "test", data: Data | None = None, limit: int | None = None
                       ) -> Iterable:
        """examples(), a file's read (and checked) one record at a time as they are taken (a split's:
        the list, whose length a streamed evaluation reads)."""
        if limit is not None and (isinstance(limit, bool) or not isinstance(limit, int) or limit < 1):
            raise ValueError(f"limit: expected a positive int or None, got {limit!r}")
        if data is None:
            if split not in SPLITS:  # another name read as an empty split ("valid"), or the training one
                raise ValueError(f"split: expected one of {', '.join(SPLITS)} (the run's held-out "
                                 f"splits), got {split!r}")
            return self.objective.examples(split)[:limit]
        return self.objective.read_examples(data, limit)

    def evaluate(self, data: Data | None = None, split: str = "test", beam_size: int = 1,
                 examples: list | None = None, early_stopping: bool = False) -> dict[str, float]:
        """Metrics on a split of the run's data, or on `data` (a file or records); a seq2seq
        run's outputs by beam search with ``beam_size`` > 1 (``early_stopping``: Seq2SeqRun.generate)."""
        return self.score(examples if examples is not None else self.examples(split, data),
                          split, beam_size, early_stopping)[0]

    def score(self, examples: list, split: str = "test", beam_size: int = 1, early_stopping: bool = False
              ) -> tuple[dict[str, float], list[tuple[str, str, str]]]:
        """(metrics, sample rows: input, prediction, target) of examples."""
        metrics, shown = self.objective.evaluate(self.model, split, examples=examples,
                                                 **self._decoding(beam_size, early_stopping))
        return metrics, self.objective.sample_rows(examples, shown)

    def score_stream(self, examples: Iterable, beam_size: int = 1, samples: int = 0,
                     early_stopping: bool = False, total: int = 0
                     ) -> tuple[dict[str, float], dict[str, Any], list[tuple[str, str, str]]]:
        """(metrics, baseline, the first `samples` sample rows) of examples taken a window at a
        time (example_stream): memory does not grow with them (``Objective.evaluate_stream``;
        ``total``: how many examples come, where known, over which compiled kernels are repaid)."""
        return self.objective.evaluate_stream(self.model, examples, samples, total=total,
                                              **self._decoding(beam_size, early_stopping))

    def baseline(self, examples: list) -> dict[str, Any]:
        """The trivial baseline of `examples` on the main metric (``Objective.baseline``)."""
        return self.objective.baseline(examples)

    def _decoding(self, beam_size: int, early_stopping: bool = False) -> dict[str, Any]:
        return {}  # only a decoder searches

    # Exports --------------------------------------------------------------------------------
    def export(self, hf: str | Path | None = None, onnx: str | Path | None = None, opset: int = 18) -> Path:
        """What `tformer export RUN --hf DIR` (or `--onnx OUT`) writes, checked before it is
        published; returns the path written."""
        if (hf is None) == (onnx is None):
            got = "both" if hf is not None else "neither"
            raise ValueError(f"export: expected one of hf= or onnx=, got {got}")
        option, target = ("--hf", hf) if hf is not None else ("--onnx", onnx)
        target = as_path(target, option[2:], "a folder")
        if onnx is not None:
            check_opset(opset)  # before the tracing, and before anything is written
        check_destination(target, option)  # a user's folder, a link to nothing: refused before the work
        card = self.card(shlex.join(["tformer", "export", str(self.path), option, str(target)]))
        device = model_device(self.model)
        target.parent.mkdir(parents=True, exist_ok=True)
        # One export writes a folder at a time: a second one to it while this runs is refused
        # naming this pid (both said "wrote" before, and one result was silently lost).
        with output_lock(target, option):
            remove_leftovers(Path(os.path.realpath(target)))  # of an export killed before this one
            self.model.cpu()  # exports are traced and checked on the CPU, whatever device runs the model
            try:
                if hf is not None:
                    return self.export_hf(target, card)
                return self.export_onnx(target, card, opset)
            finally:
                self.model.to(device)

    @abstractmethod
    def export_hf(self, out: Path, card: Card) -> Path:
        """Write the transformers export, checked against this model first."""

    @abstractmethod
    def export_onnx(self, out: Path, card: Card, opset: int) -> Path:
        """Write the ONNX export (each kind its graph), checked in onnxruntime first."""

    def card(self, command: str) -> Card:
        """The model card of an export written by ``command``: the run's data, base model,
        test line (with its baseline) and the `tformer train` command that made it."""
        tok, c = self.tokenizer, self.config
        return Card(name=self.path.resolve().name, kind=self.kind,
                    data=c.data if c.data else f"synthetic task {c.task}",
                    metrics=self.test_record(), labels=self._labels(),
                    max_length=tok.max_length if tok is not None else None, command=command,
                    windows=bool(getattr(tok, "windows", False)),
                    train_command=train_command(c, type(self.objective)), base_model=c.from_pretrained,
                    base_model_id=hub_name(c.from_pretrained),
                    data_summary=self.objective.source.summary(), main_metric=self.main_metric)

    def _labels(self) -> tuple[str, ...]:
        return ()

    def test_record(self) -> dict[str, Any]:
        """The run's test record: metrics.jsonl's last line, when it is one, "eval" lines
        after it (`tformer eval --data`) skipped; not one that training went on past."""
        try:
            lines = (self.path / "metrics.jsonl").read_text().splitlines()
        except OSError:
            return {}
        for line in reversed(lines):
            try:
                record = json.loads(line)
            except json.JSONDecodeError:
                return {}
            if not (isinstance(record, dict) and record.get("split") == "eval"):
                return record if isinstance(record, dict) and record.get("split") == "test" else {}
        return {}

    # Serving (tformer.kinds.serving) ---------------------------------------------------------
    @property
    def max_input_tokens(self) -> int:
        """The most tokens an input is read to (the server's limit; --max-input-tokens lowers it
        for serving only by refusing longer inputs, tformer.kinds.serving.input_limit): the max
        length, or what a run's windows read of one text (tformer.text.windows)."""
        return self.tokenizer.limit

    @property
    def vocab_size(self) -> int:
        return self.tokenizer.vocab_size

    @abstractmethod
    def admit(self, inputs: list, truncate: bool, limit: int | None = None) -> list[Item]:
        """A request's inputs as the model reads them (tokenized in the server's tokenizer
        threads: the batcher packs batches by their token counts); one past ``limit`` (default:
        the run's own) is refused unless ``truncate`` (TooLong)."""

    @abstractmethod
    def run_batch(self, payloads: list, key: Any) -> list:
        """One batch of admitted inputs' payloads, answered in their order, as the command line
        answers them; ``key``: what the batch's inputs share (each protocol's settings)."""

    def tokenize(self, texts: list[str], add_special_tokens: bool) -> list[list[dict[str, Any]]]:
        """/tokenize: each text's tokens with their character offsets."""
        return token_lists(self.tokenizer, texts, add_special_tokens)

    @abstractmethod
    def warm_up(self) -> None:
        """One small batch before serving: the first request should not pay for kernel setup."""

    def describe(self) -> dict[str, Any]:
        """tformer's own /info fields of this kind."""
        return {}

    def tei_model_type(self) -> dict[str, Any]:
        """TEI's /info model_type."""
        return {}

    # Attention pictures ----------------------------------------------------------------------
    def attention_input(self, text: str, max_length: int | None = None) -> AttentionInput:
        """`text` tokenized as the run reads it (cut at max_length, where below the run's)."""
        if not isinstance(text, str):  # one text (texts_of would take a list as several)
            raise TypeError(f"text: expected a str, got {type(text).__name__}")
        texts_of(text, "text")  # not blank: nothing to draw
        source = self.objective.source if max_length is None else self.objective.source.cut_at(max_length)
        source.inputs([text], self.objective.inputs)  # a task's symbols only
        ids, types = self._input_ids(source, text)
        return AttentionInput(self.model, self.decodes, ids, types, source.token_name, source.bos_id,
                              source.eos_id, source.pad_id, source.max_new_tokens)

    decodes = False  # a decoder generates (seq2seq runs)

    def _input_ids(self, source, text: str) -> tuple[list[int], list[int] | None]:
        """An encoder's input: the text with the tokenizer's specials, and its token types."""
        (encoded,) = source.encode_texts([text])
        return encoded.ids, encoded.type_ids


def hub_name(directory: str | None) -> str | None:
    """The Hub name of a fine-tune's base model, where its config.json records one
    (``_name_or_path``, as transformers saves it and the folder is not a local path)."""
    if directory is None:
        return None
    try:
        name = json.loads((Path(directory) / "config.json").read_text()).get("_name_or_path")
    except (OSError, ValueError, AttributeError):
        return None
    if not isinstance(name, str) or not HUB_NAME.match(name) or Path(name).exists():
        return None
    return name


def texts_of(texts: str | Iterable[str], name: str = "texts") -> list[str]:
    """One text (a str is one input, never its characters) or texts (an iterable of str) as a
    list. Refused as the command line and the server refuse them: no texts, a text that is
    not a str, or a blank one (empty or whitespace only: nothing to answer for)."""
    if isinstance(texts, (bytes, bytearray)) or not isinstance(texts, (str, Iterable)):
        raise TypeError(f"{name}: expected a str or an iterable of str, got {type(texts).__name__}")
    out = [texts] if isinstance(texts, str) else list(texts)
    if not out:
        raise ValueError(f"{name}: expected at least one text, got none")
    check_texts(name, out, one=isinstance(texts, str))
    return out


def check_batch_size(batch_size: int) -> int:
    """A verb's batch_size, refused in one line naming it as --batch-size is (a 0 was a bare
    range() error, a negative one an empty answer from generate)."""
    if isinstance(batch_size, bool) or not isinstance(batch_size, int) or batch_size < 1:
        raise ValueError(f"batch_size: expected a positive int, got {batch_size!r}")
    return batch_size
