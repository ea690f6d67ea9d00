"""Token tagging (named entities and the like): an encoder and a linear layer over each token
(tformer.nn.heads.TokenClassifier, transformers' BertForTokenClassification).

    {"tokens": [...], "tags": [...]}  (or "ner_tags"), or a CoNLL file     tformer predict RUN "a text"

Tags are BIO/IOB2 (IOBES and IOB1 read as the same entities, tformer.training.entities). Each
word's label goes on its first sub-word; the others are ignored by the loss (-100, as the
transformers token-classification example trains). Scored by entity-level precision, recall
and F1 by exact span (seqeval's), overall and per type, against a dictionary of the spans seen
in training. Its one forward gives each sub-word's logits: evaluation reads each word's first;
`tformer predict`, ``Run.predict`` and the server group them into entities with character
offsets as transformers' pipeline("token-classification") does with aggregation_strategy="first"
(a word takes its first sub-word's label: what evaluation scored; the default of `tformer predict`
and ``Run.predict``) or "simple" (each sub-word its own: the default of the server's HF task API);
`tformer predict --aggregation-strategy` and ``Run.read_aggregation`` choose.
"""

from __future__ import annotations

import json
import sys
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F
from tokenizers import processors
from torch import Tensor, nn

from tformer.config import TransformerConfig
from tformer.errors import FieldError
from tformer.export import hf_token_classifier as hf_tokens
from tformer.export import onnx as tonnx
from tformer.export.model_card import Card
from tformer.formats import hf_bert
from tformer.kinds.base import Kind
from tformer.kinds.run import Run, check_batch_size, texts_of
from tformer.kinds.serving import Item, too_long
from tformer.kinds.tag_fields import TagFields
from tformer.nn.heads import TokenClassifier
from tformer.nn.model import from_pretrained
from tformer.storage.files import write_json_atomic
from tformer.text.batches import EncoderBatch, encoder_arrays, pad_arrays
from tformer.text.word_pieces import (
    IGNORED,
    STRATEGIES,
    Pieces,
    entity_groups,
    first_pieces,
    marked,
    word_pieces,
)
from tformer.training import entities as ent
from tformer.training import probe
from tformer.training.config import MODEL_OPTIONS
from tformer.training.losses import at_least_fp32
from tformer.training.objective import Objective, Tally
from tformer.training.verdict import f1_interval

IGNORE = -100  # a position the loss skips: every sub-word but a word's first, the specials, padding
SPANS_FILE = "spans.json"  # the run's dictionary baseline: the spans seen in training
BASELINE_BY = "a dictionary of the spans seen in training (those that were entities more often than not)"
# Sized as classification's (tformer.training.presets), on sentences: batches of 32, 128 tokens.
PRESET = {"d_model": 128, "n_heads": 4, "d_ff": 512, "n_layers": 2, "activation": "gelu", "vocab_size": 4000,
          "lr": 5e-4, "warmup": 200, "schedule": "linear", "steps": 10000, "max_tokens": None,
          "batch_size": 32, "eval_every": 250, "patience": 8, "max_length": 128, "label_smoothing": 0.0}


FIELDS = TagFields("tagging", ("tokens", "tags"), ("ner_tags",), label="tags", min_labels=2)


def joined(tokens: list[str]) -> tuple[str, list[tuple[int, int]]]:
    """The words as one text (a space between each), and each word's character span in it."""
    spans, at = [], 0
    for token in tokens:
        spans.append((at, at + len(token)))
        at += len(token) + 1
    return " ".join(tokens), spans


@dataclass
class TagExample:
    pieces: Pieces
    labels: list[int]  # per piece: the word's label id on its first piece, IGNORE elsewhere
    firsts: list[int | None]  # per word: its first piece (None: cut off)

    @property
    def cost(self) -> int:
        return len(self.pieces.ids)

    @property
    def longest(self) -> int:
        return len(self.pieces.ids)


class Tagging(Objective):
    kind, fields, preset = FIELDS.objective, FIELDS, PRESET
    reads = ("format", "head_init")
    probes_head = True  # (tformer.training.probe: a row a labelled sub-word)
    model_kind = "classifier"  # an encoder and a head over the labels (per token)
    main_metric = "f1"
    inputs = ("text",)

    def __init__(self, source, pretrained=None) -> None:
        super().__init__(source, pretrained)
        self.spans_file: Path | None = None  # a finished run's SPANS_FILE (saved_config)
        self._dictionary: ent.SpanDictionary | None = None
        backend = source.tokenizer.backend
        if type(backend.pre_tokenizer).__name__ == "ByteLevel" and \
                type(backend.post_processor).__name__ == "TemplateProcessing":
            # Byte-level BPE's pieces start at the space before a word; trimmed, an entity's
            # start is its first character (RoBERTa's tokenizer trims its offsets the same way),
            # in tformer and in the tokenizer.json an export writes. The ids do not change.
            backend.post_processor = processors.Sequence([processors.ByteLevel(trim_offsets=True),
                                                          backend.post_processor])

    @property
    def labels(self) -> list[str]:
        return self.source.labels

    def what(self) -> str:
        types = sorted({label[2:] for label in self.labels if label != "O"})
        return f"token tagging, {len(types)} entity types ({', '.join(types)})"

    def model_config(self) -> TransformerConfig:
        return self.source.encoder_config(n_classes=len(self.labels))

    def build_model(self, model_config: TransformerConfig | None = None) -> nn.Module:
        if model_config is None and self.pretrained is not None:
            encoder = from_pretrained(self.pretrained)
            # BertForTokenClassification has no pooler: the encoder's is left behind.
            config = self.finetune_config(encoder.config).replace(n_classes=len(self.labels), pooler=False)
            model = TokenClassifier(config)
            state = {k: v for k, v in encoder.state_dict().items() if not k.startswith("pooler.")}
            model.encoder.load_state_dict(state)
            # The new head starts small (BERT: normal, std 0.02), as transformers initialises it.
            nn.init.normal_(model.head.weight, std=0.02)
            nn.init.zeros_(model.head.bias)
            return model.train()
        return TokenClassifier(model_config or self.model_config())

    def head_inputs(self, model: nn.Module, batch: EncoderBatch) -> tuple[Tensor, Tensor]:
        """A row a labelled sub-word (each word's first): its vector, as the head reads it, and its label."""
        types = batch.token_type_ids if model.config.type_vocab_size else None
        hidden = model.encoder(batch.input_ids, batch.attention_mask, token_type_ids=types).last_hidden_state
        kept = batch.labels != IGNORE  # (B, S)
        return hidden[kept], batch.labels[kept]  # (N, D), (N,)

    def fit_head(self, model: nn.Module, features: Tensor, targets: Tensor) -> str | None:
        return probe.fit_softmax(model.head, features, targets)

    def saved_config(self, model_config: TransformerConfig, run_dir: Path) -> TransformerConfig:
        self.spans_file = run_dir / SPANS_FILE  # the baseline, as the run learnt it
        return model_config

    # Examples and batches ------------------------------------------------------------------
    def encode(self, examples: list) -> list[TagExample]:
        """Records with tokens (and tags), or texts to tag ({"text"}: no words, no labels)."""
        texts, spans = [], []
        for r in examples:
            text, span = joined(r["tokens"]) if "tokens" in r else (r["text"], [])
            texts.append(text)
            spans.append(span)
        out, ids = [], self.source.data.label_ids
        for r, text, span, p in zip(examples, texts, spans, word_pieces(self.tokenizer, texts), strict=True):
            firsts = first_pieces(text, p, span)
            labels = [IGNORE] * len(p.ids)
            for first, tag in zip(firsts, r.get("tags", ()), strict=False):
                if first is not None:
                    labels[first] = ids[tag]
            out.append(TagExample(p, labels, firsts))
        return out

    def collate(self, encoded: list[TagExample]) -> EncoderBatch:
        arrays = encoder_arrays([e.pieces.ids for e in encoded], self.source.pad_id,
                                type_ids=[e.pieces.type_ids for e in encoded])
        labels, _ = pad_arrays([e.labels for e in encoded], IGNORE)  # (B, S)
        return EncoderBatch(arrays.input_ids, arrays.attention_mask, labels, arrays.token_type_ids).to_torch()

    @staticmethod
    def forward(model: nn.Module, batch: EncoderBatch) -> Tensor:
        """The one inference forward: (B, S, C) logits, a row per sub-word."""
        return model(batch.input_ids, batch.attention_mask, batch.token_type_ids).logits

    def loss(self, model: nn.Module, batch: EncoderBatch, label_smoothing: float = 0.0):
        """Cross-entropy over the words' first sub-words (the rest: IGNORE), and their accuracy."""
        logits = at_least_fp32(self.forward(model, batch)).flatten(0, 1)  # (B * S, C)
        labels = batch.labels.flatten()  # (B * S,)
        kept = labels != IGNORE
        if not bool(kept.any()):  # every word cut off: nothing to learn from this batch
            return logits.sum() * 0.0, 0.0
        loss = F.cross_entropy(logits, labels, ignore_index=IGNORE, label_smoothing=label_smoothing)
        return loss, (logits[kept].argmax(-1) == labels[kept]).float().mean().item()

    def predict_batch(self, model: nn.Module, batch: EncoderBatch) -> list[np.ndarray]:
        """Each example's logits, a row per sub-word (specials included): (len(ids), C)."""
        logits = self.forward(model, batch).float()
        lengths = batch.attention_mask.sum(-1).tolist()
        return [row[:n].cpu().numpy() for row, n in zip(logits, lengths, strict=True)]

    # Scores --------------------------------------------------------------------------------
    def word_tags(self, examples: list, preds: list[np.ndarray]) -> list[list[str]]:
        """Each word's predicted tag: its first sub-word's most probable label (O if cut off)."""
        return [[self.labels[int(logits[f].argmax())] if f is not None else "O" for f in e.firsts]
                for e, logits in zip(self.encode(examples), preds, strict=True)]

    def score(self, examples: list, preds: list) -> tuple[dict, list[list[str]]]:
        scored, predicted = ent.SpanCounts(), self.word_tags(examples, preds)
        scored.add([r["tags"] for r in examples], predicted)
        return scored.scores(), predicted

    def tally(self) -> SpanTally:
        return SpanTally(self)

    def dictionary(self) -> ent.SpanDictionary:
        """The baseline: read from a finished run's SPANS_FILE, else learnt from the training
        records (two passes over them, once)."""
        if self._dictionary is None:
            if self.spans_file is not None and self.spans_file.is_file():
                saved = json.loads(self.spans_file.read_text())["spans"]
                self._dictionary = ent.SpanDictionary.from_json(saved)
            else:
                data = self.source.data
                self._dictionary = ent.SpanDictionary.learn(
                    lambda: ((r["tokens"], r["tags"]) for pool in data.epoch_pools(0) for r in pool))
        return self._dictionary

    def dictionary_tags(self, examples: list) -> list[list[str]]:
        return [self.dictionary().tag(r["tokens"]) for r in examples]

    def _baseline(self, examples: list) -> tuple[float, str]:
        scored = ent.SpanCounts()
        scored.add([r["tags"] for r in examples], self.dictionary_tags(examples))
        return scored.scores()["f1"], BASELINE_BY

    def paired_interval(self, examples: list, preds: list) -> tuple[float, float]:
        """Entity F1 sums spans over sentences (one of 5 entities weighs 5): a paired bootstrap."""
        true = [r["tags"] for r in examples]
        return f1_interval(ent.sentence_rows(true, self.word_tags(examples, preds)),
                           ent.sentence_rows(true, self.dictionary_tags(examples)))

    def sample_rows(self, examples: list, shown: list) -> list[tuple[str, str, str]]:
        return [(" ".join(r["tokens"]), spans_text(r["tokens"], tags), spans_text(r["tokens"], r["tags"]))
                for r, tags in zip(examples, shown, strict=True)]

    def save_outputs(self, model: nn.Module, run_dir: Path, shown: list) -> None:
        """The dictionary baseline (SPANS_FILE): what `tformer eval` compares with later."""
        write_json_atomic(run_dir / SPANS_FILE, {"spans": self.dictionary().to_json()})

    # Text ------------------------------------------------------------------------------------
    def entity_lists(self, model: nn.Module, texts: list[str], strategy: str, batch_size: int = 64,
                     ignore: tuple[str, ...] = IGNORED) -> list[list[dict[str, Any]]]:
        """The entities of each text, as the pipeline gives them with aggregation_strategy
        ``strategy`` (tformer.text.word_pieces)."""
        logits = self.predict(model, [{"text": t} for t in texts], batch_size=batch_size)
        pieces = word_pieces(self.tokenizer, texts)
        backend = self.tokenizer.backend
        return [entity_groups(t, p, x, self.labels, backend, ignore, strategy)
                for t, p, x in zip(texts, pieces, logits, strict=True)]


class SpanTally(Tally):
    """The model's span counts and the dictionary baseline's, summed window by window."""

    def __init__(self, objective: Tagging) -> None:
        self.objective, self.model, self.dictionary = objective, ent.SpanCounts(), ent.SpanCounts()
        self.rows, self.dictionary_rows = [], []  # ent.sentence_rows of each, for the verdict

    def add(self, examples: list, preds: list) -> None:
        true, tagged = [r["tags"] for r in examples], self.objective.word_tags(examples, preds)
        looked_up = self.objective.dictionary_tags(examples)
        self.model.add(true, tagged)
        self.dictionary.add(true, looked_up)
        self.rows += ent.sentence_rows(true, tagged)
        self.dictionary_rows += ent.sentence_rows(true, looked_up)

    def metrics(self) -> dict[str, Any]:
        return self.model.scores()

    def baseline(self) -> dict[str, Any]:
        paired = {"paired_interval": list(f1_interval(self.rows, self.dictionary_rows))} if self.rows else {}
        return {"baseline": self.dictionary.scores()["f1"], "baseline_by": BASELINE_BY, **paired}


def spans_text(tokens: list[str], tags: list[str]) -> str:
    """A sentence's entities as "words/TYPE, ..." (the sample table's columns)."""
    return ", ".join(f"{' '.join(tokens[a : b + 1])}/{t}" for t, a, b in ent.entities(tags)) or "-"


class TaggingRun(Run):
    kind = FIELDS.objective
    verb = "predict"
    pipeline_tag = "token-classification"
    protocols = ("hf.token_classification", "tei.tokenize")

    @property
    def labels(self) -> list[str]:
        return self.objective.labels

    def _labels(self) -> tuple[str, ...]:
        return tuple(self.labels)

    @classmethod
    def pretrained_advice(cls, run: Path, kind=None) -> str:
        return (f"write it as a BERT model with `tformer export {run} --hf DIR` (pip install 'tformer[hf]'), "
                "then give --from-pretrained DIR")

    aggregation = "first"  # how predict groups entities unless told (read_aggregation)

    def read_aggregation(self, strategy: str | None) -> TaggingRun:
        """Run.read_aggregation: ``predict`` groups entities by ``strategy`` from here on."""
        if strategy is not None:
            self.aggregation = checked_strategy("aggregation_strategy", strategy)
        return self

    def predict(self, texts: str | Iterable[str], batch_size: int = 64, aggregation: str | None = None
                ) -> list[list[dict[str, Any]]]:
        """Each text's entities, [{"entity_group", "score", "word", "start", "end"}] (start and end:
        character offsets), as transformers' pipeline("token-classification",
        aggregation_strategy=aggregation) gives them: "first" (a word takes its first sub-word's
        label, as evaluation scores it) or "simple" (each sub-word its own); None: the run's
        (read_aggregation; "first" unless set); one str is one text."""
        strategy = self.aggregation if aggregation is None else checked_strategy("aggregation", aggregation)
        batch_size = check_batch_size(batch_size)
        return self.objective.entity_lists(self.model, texts_of(texts), strategy, batch_size)

    def printed(self, text: str, answer: list[dict[str, Any]]) -> tuple[str, dict[str, Any]]:
        """The text with its entities marked, [words](TYPE); (jsonl) {"text", "entities"}."""
        return marked(text, answer), {"text": text, "entities": [{**e, "score": round(e["score"], 6)}
                                                                 for e in answer]}

    # Serving: Hugging Face's token-classification task --------------------------------------
    def admit(self, texts: list[str], truncate: bool, limit: int | None = None) -> list[Item]:
        """Texts as the model reads them, as far as the run's cut needs them (Tokenizer.prefixes:
        the same pieces and offsets); one past the limit refused unless truncating."""
        texts, _, full = self.tokenizer.prefixes(texts)
        run_limit = self.max_input_tokens
        limit = limit or run_limit
        too_long(full, limit, truncate and limit == run_limit)
        return [Item(min(n, run_limit), n, t) for n, t in zip(full, texts, strict=True)]

    @torch.inference_mode()
    def run_batch(self, texts: list[str], key: tuple = (IGNORED, "simple")) -> list[list[dict[str, Any]]]:
        """The entities of each text (``key``: the batch's, the labels whose groups are left out
        and the pipeline's aggregation strategy)."""
        ignore, strategy = key
        return self.objective.entity_lists(self.model, texts, strategy, ignore=ignore)

    def warm_up(self) -> None:
        self.run_batch([item.payload for item in self.admit(["warm up"], True)])

    def describe(self) -> dict[str, Any]:
        return {"labels": self.labels}

    def tei_model_type(self) -> dict[str, Any]:
        return {"classifier": {"id2label": {str(i): name for i, name in enumerate(self.labels)}}}

    # Exports -----------------------------------------------------------------------------------
    def export_hf(self, out: Path, card: Card) -> Path:
        """BertForTokenClassification, checked in transformers (logits, and its pipeline's
        entities on texts of the run's vocabulary) before anything is written."""
        tok = self.tokenizer
        try:
            written, diff = hf_tokens.export_token_classifier(
                out, self.model, tok, self.labels, card,
                lambda texts: self.objective.entity_lists(self.model, texts, "simple"))
        except hf_bert.NotBert as e:  # pre-norm: name the option
            option = f"--{e.field.replace('_', '-')}" if e.field in MODEL_OPTIONS else f"config.{e.field}"
            raise ValueError(f"--hf: {self.path}: {option}: {hf_tokens.ARCHITECTURE} needs {e.need}, got "
                             f"{e.got!r}; export it with --onnx") from None
        print(f"wrote {written}/ ({hf_tokens.ARCHITECTURE}; transformers' pipeline finds tformer's entities, "
              f"max abs diff {diff:.1e}; AutoModelForTokenClassification.from_pretrained loads it)",
              file=sys.stderr)
        return written

    def export_onnx(self, out: Path, card: Card, opset: int) -> Path:
        """Folder ``out``: model.onnx (logits per sub-word), config.json (id2label), the tokenizer,
        a card."""
        written, diff = hf_tokens.export_onnx_folder(out, self.model, self.tokenizer, self.labels, card,
                                                     opset)
        tonnx.report(f"{written}/", diff)
        return written


def checked_strategy(name: str, strategy: str) -> str:
    """``strategy``, one of STRATEGIES, or refused in one line naming ``name``."""
    if strategy not in STRATEGIES:
        raise FieldError(name, f"expected one of {', '.join(STRATEGIES)}, got {strategy!r}")
    return strategy


KIND = Kind(Tagging, TaggingRun)
