"""Sequence to sequence: the encoder-decoder learns to generate the target from the source.

    {"source": "...", "target": "..."}                 tformer generate RUN "a source text"

Trained with teacher-forced cross-entropy; scored by generating (greedy, or beam search):
exact match of whole sequences for a synthetic task, BLEU and chrF of the decoded text for
your files, against copying the source. The best weights are kept by the teacher-forced
validation loss. Served with TGI's /generate and OpenAI's /v1/completions.
"""

from __future__ import annotations

import math
import sys
from collections.abc import Iterable
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import nn

from tformer.config import TransformerConfig
from tformer.errors import FieldError
from tformer.export import hf_classifier, hf_seq2seq, onnx_seq2seq
from tformer.export import onnx as tonnx
from tformer.export.model_card import Card
from tformer.kinds.base import Kind
from tformer.kinds.run import Run, check_batch_size, texts_of
from tformer.kinds.serving import Item, too_long
from tformer.nn.generate import generate
from tformer.nn.model import Seq2SeqTransformer
from tformer.nn.search_args import check_early_stopping, check_max_len
from tformer.storage.files import json_bytes
from tformer.text.batches import Seq2SeqBatch, seq2seq_arrays
from tformer.text.prefix import plus
from tformer.training import evaluation
from tformer.training.examples import Seq2SeqExample
from tformer.training.losses import seq2seq_loss
from tformer.training.objective import DeadlinePassed, Objective, Tally
from tformer.training.records import Fields
from tformer.training.tasks.base import sequence_counts, sequence_scores

FIELDS = Fields("seq2seq", ("source", "target"), (), ("source",))
# Pre-norm: it trains stably at a high learning rate without a long warmup (Xiong et al. 2020).
# Batches of 40 pairs (English -> German, 5 minutes: 1,024-token batches reached BLEU 16.3, 2,048
# 8.9): under a short budget the number of updates decides (tformer.training.presets).
PRESET = {"d_model": 128, "n_heads": 4, "d_ff": 512, "n_layers": 3, "norm_first": True, "vocab_size": 4000,
          "lr": 1e-3, "warmup": 400, "schedule": "linear", "steps": 20000, "max_tokens": None,
          "batch_size": 40, "eval_every": 250, "log_every": 50, "patience": 8}

# Generation stops after LENGTH_A * (source tokens) + LENGTH_B tokens (and at the run's max
# length), as Marian (--max-length-factor) and fairseq (--max-len-a/b) bound theirs: an untrained
# or looping model decoded every test sentence to 128 tokens, 200 s after a 3-minute budget.
# Targets of 2x their source and 10 more hold every pair of the English -> German catalogs.
LENGTH_A, LENGTH_B = 2.0, 10
COPYING = "copying the source"  # the trivial baseline


def generation_limit(source_tokens: int, max_new_tokens: int) -> int:
    """The most tokens generated for a source of `source_tokens` (EOS included)."""
    return max(1, min(max_new_tokens, math.ceil(LENGTH_A * source_tokens) + LENGTH_B))


class IdScores:
    """A synthetic task's outputs: whole sequences of symbol ids, by exact match and token
    accuracy (counts that add over windows: tformer.training.tasks.base.sequence_counts)."""

    metric = "exact_match"

    def counts(self, source, ids: list[list[int]], examples: list) -> tuple[np.ndarray, list[str]]:
        counts = sequence_counts(ids, source.pieces([source.field(ex, "target") for ex in examples]))
        return counts, [source.decode(p) for p in ids]

    def copy_counts(self, source, examples: list) -> np.ndarray:
        sources = source.pieces([source.field(ex, "source") for ex in examples])
        copied = [ids + [source.eos_id] for ids in sources]
        return self.counts(source, copied, examples)[0]

    def scores(self, counts: np.ndarray) -> dict[str, float]:
        return sequence_scores(counts)


class TextScores:
    """Your files' outputs: the decoded text by BLEU, chrF (sacrebleu: comparable across papers)
    and exact match (counts that add over windows: tformer.training.evaluation.text_counts)."""

    metric = "bleu"

    def counts(self, source, ids: list[list[int]], records: list) -> tuple[np.ndarray, list[str]]:
        texts = [source.decode(p) for p in ids]
        return evaluation.text_counts(texts, [r["target"] for r in records]), texts

    def copy_counts(self, source, records: list) -> np.ndarray:
        """Each source as its own output: the sources of a translation share its names, numbers
        and placeholders, so that is what a model must beat to have learnt anything."""
        return evaluation.text_counts([r["source"] for r in records], [r["target"] for r in records])

    def scores(self, counts: np.ndarray) -> dict[str, float]:
        return evaluation.text_scores(counts)


class Seq2Seq(Objective):
    kind, fields, preset = FIELDS.objective, FIELDS, PRESET
    model_kind = "seq2seq"
    # A decoder's greedy outputs take a pass per token, small products far below the rate a
    # step's large ones reach (measured on 2 cores: ~4x a step's share per example).
    predict_cost = 4.0
    # An encoder-decoder learns to generate as well as to read: it needs more updates than an
    # encoder. English -> German UI messages from scratch (2 cores, two runs side by side, 1 thread
    # each), d_model 128 x 2 layers against the 256 x 3 that 600 updates allowed: at 3 minutes
    # BLEU 17.6 in 1,769 updates against 11.2 in 834, and 18.8 in 1,748 against 8.1 in 774; at 2
    # minutes 9.2 in 1,135 against 1.8 in 473.
    steps_factor = 2.0
    inputs = ("source",)
    # The validation sample's corpus BLEU moved by a point or more between neighbouring
    # validations, and once picked weights 300 updates older than the loss's (test BLEU 20.2
    # instead of 23.9): the loss is the steadier judge.
    best_by = "loss"

    def __init__(self, source, pretrained=None) -> None:
        super().__init__(source, pretrained)
        self.scores = IdScores() if source.tokenizer is None else TextScores()

    def what(self) -> str:
        return "sequence-to-sequence (source -> target)"

    @property
    def main_metric(self) -> str:
        return self.scores.metric

    def model_config(self) -> TransformerConfig:
        return self.source.seq2seq_config()

    def build_model(self, model_config: TransformerConfig | None = None) -> nn.Module:
        if model_config is None and self.pretrained is not None:
            raise FieldError("from_pretrained", "fine-tuning needs an encoder objective "
                             "(text+label or anchor+positive); source+target trains from scratch")
        return Seq2SeqTransformer(model_config or self.model_config())

    def encode(self, examples: list) -> list[Seq2SeqExample]:
        s = self.source
        sources = s.pieces([s.field(ex, "source") for ex in examples])
        targets = s.pieces([s.field(ex, "target") for ex in examples])
        return [Seq2SeqExample(src + [s.eos_id], tgt) for src, tgt in zip(sources, targets, strict=True)]

    def collate(self, encoded: list[Seq2SeqExample]) -> Seq2SeqBatch:
        s = self.source
        return seq2seq_arrays([e.source for e in encoded], [e.target for e in encoded],
                              s.bos_id, s.eos_id, s.pad_id).to_torch()

    def loss(self, model: nn.Module, batch: Seq2SeqBatch, label_smoothing: float = 0.0):
        """Teacher-forced cross-entropy over the target tokens, and token accuracy for logging."""
        return seq2seq_loss(model, batch, label_smoothing, pad_id=self.source.pad_id)

    def predict_batch(self, model: nn.Module, batch: Seq2SeqBatch, beam_size: int = 1,
                      length_penalty: float = 1.0, max_len: int | None = None,
                      deadline: float | None = None, early_stopping: bool = False) -> list[list[int]]:
        """The one inference forward: generated ids (up to EOS) per example; max_len: the most
        tokens (default: bounded by the batch's longest source, ``generation_limit``); deadline:
        a time.perf_counter() reading at which generation stops: DeadlinePassed where it cut
        outputs short; early_stopping: beam search's peers' rule (tformer.nn.generate.beam_search)."""
        s = self.source
        if max_len is None:
            max_len = generation_limit(int(batch.src_mask.sum(dim=1).max()), s.max_new_tokens)
        out = generate(model, batch.src, batch.src_mask, beam_size=beam_size, max_len=max_len,
                       length_penalty=length_penalty, bos_id=s.bos_id, eos_id=s.eos_id, pad_id=s.pad_id,
                       deadline=deadline, early_stopping=early_stopping)
        if not out.complete:
            raise DeadlinePassed
        return out.tolist()

    def _bounded(self, options: dict[str, Any], deadline: float | None) -> dict[str, Any]:
        return {**options, "deadline": deadline}

    def output_growth(self, examples: list, preds: list[list[int]]) -> float:
        """A decoder's predictions cost about the tokens it writes: a model early in training
        may stop after a few (an empty or a short output), a trained one writes about its
        targets' length. How many times longer the targets are than these outputs (each with its
        end token), at least 1: a test timed on a validation of short outputs scored 72 of 916
        examples. Outputs longer than the targets (a model repeating itself to the length limit)
        are no sign of a shorter test: such a model may still repeat itself at its test."""
        s = self.source
        wanted = sum(len(t) + 1 for t in s.pieces([s.field(ex, "target") for ex in examples]))
        return max(1.0, wanted / sum(len(p) + 1 for p in preds))

    def _baseline(self, examples: list) -> tuple[float, str]:
        """Copying the source: the score of each source given as its own output."""
        return self.scores.scores(self.scores.copy_counts(self.source, examples))[self.main_metric], COPYING

    def tally(self) -> SequenceTally:
        return SequenceTally(self)

    def score(self, examples: list, preds: list[list[int]]) -> tuple[dict[str, float], list[str]]:
        counts, shown = self.scores.counts(self.source, preds, examples)
        return self.scores.scores(counts), shown

    def generate(self, model: nn.Module, texts: list[str], beam_size: int = 1,
                 length_penalty: float = 1.0, max_len: int | None = None, batch_size: int = 32,
                 early_stopping: bool = False) -> list[str]:
        """The output text of each input text."""
        ids = self.predict(model, self.source.inputs(texts, self.inputs), batch_size=batch_size,
                           beam_size=beam_size, length_penalty=length_penalty, max_len=max_len,
                           early_stopping=early_stopping)
        return [self.source.decode(p) for p in ids]


class SequenceTally(Tally):
    """The sequence counts of the outputs and of the copied sources (the baseline), summed
    window by window: the corpus scores of them all, and nothing else kept."""

    def __init__(self, objective: Seq2Seq) -> None:
        self.source, self.scores, self.metric = objective.source, objective.scores, objective.main_metric
        self.outputs: Any = 0  # np.ndarray after the first window
        self.copies: Any = 0

    def add(self, examples: list, preds: list) -> None:
        self.outputs = self.outputs + self.scores.counts(self.source, preds, examples)[0]
        self.copies = self.copies + self.scores.copy_counts(self.source, examples)

    def metrics(self) -> dict[str, float]:
        return self.scores.scores(self.outputs)

    def baseline(self) -> dict[str, Any]:
        return {"baseline": self.scores.scores(self.copies)[self.metric], "baseline_by": COPYING}


class Seq2SeqRun(Run):
    kind = FIELDS.objective
    verb = "generate"
    decodes = True
    pipeline_tag = "text2text-generation"
    protocols = ("tgi.generate", "openai.completions", "tei.tokenize")
    info_protocol = "tgi"

    @property
    def max_new_tokens(self) -> int:
        """What generate generates at most by default: the run's max length (a task's longest
        target and its EOS)."""
        return self.objective.source.max_new_tokens

    @property
    def max_target_tokens(self) -> int:
        """The most tokens the decoder's positions allow."""
        return self.model.config.max_len

    def generate(self, inputs: str | Iterable[str], beam_size: int = 1, length_penalty: float = 1.0,
                 max_len: int | None = None, batch_size: int = 32, early_stopping: bool = False) -> list[str]:
        """The output text per input (one str is one input); at most max_len tokens (default:
        2 x the batch's longest input + 10, at most max_new_tokens: Seq2Seq.predict_batch; at
        most the decoder's positions). ``early_stopping``: with beam_size > 1, an input also stops
        once beam_size of its hypotheses have ended, whatever their scores (the rule of Hugging
        Face's early_stopping=True and CTranslate2: sooner, and it may return a worse output;
        tformer.nn.generate.beam_search)."""
        if max_len is not None:
            check_max_len(max_len, self.model.config.max_len)
        check_early_stopping(early_stopping, beam_size)
        return self.objective.generate(self.model, texts_of(inputs, "inputs"), beam_size, length_penalty,
                                       max_len, batch_size=check_batch_size(batch_size),
                                       early_stopping=early_stopping)

    def answers(self, texts: list[str], batch_size: int = 32, **options: Any) -> list[str]:
        """What `tformer generate` prints per input: the output."""
        return self.generate(texts, batch_size=batch_size, **options)

    def _decoding(self, beam_size: int, early_stopping: bool = False) -> dict[str, Any]:
        check_early_stopping(early_stopping, beam_size)
        return {"beam_size": beam_size, "early_stopping": early_stopping}

    def _input_ids(self, source, text: str) -> tuple[list[int], None]:
        """What the encoder reads: the text's pieces, then EOS (as training encodes sources)."""
        return source.pieces([text])[0] + [source.eos_id], None

    # Serving: TGI's /generate, OpenAI's /v1/completions -----------------------------------------
    def admit(self, texts: list[str], truncate: bool, limit: int | None = None) -> list[Item]:
        texts, _, pieces = self.tokenizer.prefixes(texts, specials=False)  # as the run's source reads them
        full = [plus(n, 1) for n in pieces]  # + the source's EOS
        run_limit = self.max_input_tokens
        limit = limit or run_limit
        too_long(full, limit, truncate and limit == run_limit)
        return [Item(min(n, run_limit), n, t) for n, t in zip(full, texts, strict=True)]

    @torch.no_grad()
    def run_batch(self, texts: list[str], key: tuple[int, int, float, bool]) -> list[str]:
        """Greedy or beam search, as `tformer generate` runs it, with max_new_tokens for its
        limit. ``key``: (beam_size, max_new_tokens, length_penalty, early_stopping), shared by
        the batch."""
        beam_size, max_new_tokens, length_penalty, early_stopping = key
        return self.objective.generate(self.model, texts, beam_size, length_penalty, max_len=max_new_tokens,
                                       early_stopping=early_stopping)

    def output_tokens(self, outputs: list[str]) -> list[int]:
        """Tokens of each generated text, without its end (re-tokenized: what usage and TGI's
        details count)."""
        return [len(e.ids) for e in self.tokenizer.backend.encode_batch(outputs, add_special_tokens=False)]

    def warm_up(self) -> None:
        self.run_batch([item.payload for item in self.admit(["warm up"], True)], (1, 2, 1.0, False))

    def describe(self) -> dict[str, Any]:
        return {"max_new_tokens": self.max_new_tokens}

    def tei_model_type(self) -> dict[str, Any]:
        return {"seq2seq": {}}

    # Exports -----------------------------------------------------------------------------------
    def export_hf(self, out: Path, card: Card) -> Path:
        tok = self.tokenizer
        if tok is None:
            raise ValueError(f"--hf: {self.path} is a synthetic-task run ({self.config.task}) with no text "
                             "tokenizer for transformers; export it with --onnx")
        written, diff = hf_seq2seq.export_seq2seq(out, self.model, tok.backend, tok.max_length, card)
        print(f"wrote {written}/ ({hf_seq2seq.architecture(self.model.config)}, max abs diff {diff:.1e} "
              "on the logits against tformer; AutoModelForSeq2SeqLM.from_pretrained loads it)",
              file=sys.stderr)
        return written

    def export_onnx(self, out: Path, card: Card, opset: int) -> Path:
        """Folder ``out`` in Optimum's layout (tformer.export.onnx_seq2seq)."""
        out = tonnx.check_folder(out)  # refused before the tracing
        tok, source = self.tokenizer, self.objective.source
        ids = {"pad_id": source.pad_id, "bos_id": source.bos_id, "eos_id": source.eos_id}
        try:
            config = hf_seq2seq.config_to_hf(self.model.config, **ids)
        except ValueError:  # neither Marian nor Pegasus: tformer's own config
            config = {"tformer_config": self.model.config.to_dict(), "is_encoder_decoder": True}
        extra = {"config.json": json_bytes(config),
                 "generation_config.json": json_bytes(hf_seq2seq.generation_config(
                     **ids, max_new_tokens=self.max_new_tokens))}
        if tok is not None:
            extra.update(hf_classifier.tokenizer_files(tok.backend, tok.max_length, "$A </s>"))
        written, diff = onnx_seq2seq.export_seq2seq_onnx(self.model, out, card, extra, ids,
                                                         self.max_new_tokens, opset=opset)
        tonnx.report(f"{written}/", diff)
        return written


KIND = Kind(Seq2Seq, Seq2SeqRun)
