"""What the cross-encoder kinds share (scores of texts and text pairs; a query's passages): an encoder
that reads two texts as one input ("<s> a </s> b </s>", token types 0 and 1), BERT's pooler
over the first position, and one output: tformer.nn.model.EncoderClassifier with n_classes = 1,
which is a transformers BertForSequenceClassification with num_labels = 1, the model
sentence-transformers' CrossEncoder loads (tformer.export.hf_cross_encoder).

    objective.encode(records)   -> Candidates: each record's pairs (one, or a query's candidates)
    objective.predict(model, records)   -> each record's logits, one per pair
    run.scores(records, raw)    -> each record's scores, the kind's activation applied

The pooler, not a mean of the tokens: CrossEncoder runs padded batches, and transformers'
classes that take BERT's weights pool the first position (a mean-pooled model exports only as
XLM, exact one text per call: tformer.export.hf_xlm).
"""

from __future__ import annotations

import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from torch import Tensor, nn

from tformer.config import TransformerConfig
from tformer.export import hf_classifier
from tformer.export import onnx as tonnx
from tformer.export.export_dir import publish_export
from tformer.export.hf_cross_encoder import ACTIVATIONS, LABEL, export_cross_encoder
from tformer.export.model_card import Card, render
from tformer.kinds.run import Run
from tformer.kinds.serving import Item, too_long
from tformer.nn.devices import model_device
from tformer.nn.model import EncoderClassifier, from_pretrained
from tformer.storage.files import json_bytes
from tformer.text.batches import EncodedText, EncoderBatch, _Batch, encoder_batch
from tformer.training.objective import EVAL_SAMPLE, Objective, evaluating

# An evaluation's loss (a number logged beside the metrics) is taken on its first examples up to
# this many tokens of pairs, in batches of at most LOSS_BATCH: Objective's first 500 examples in
# one batch are 10,000 pairs for 500 queries of 20 candidates (minutes of a CPU, gigabytes).
LOSS_TOKENS, LOSS_BATCH = 8192, 4096
# A pre-norm encoder has no BertForSequenceClassification (nor CrossEncoder) to export to.
POST_NORM = {"norm_first": "a cross-encoder exports as a BertForSequenceClassification, which is post-norm"}


@dataclass
class Candidates:
    """A record's pairs as the model reads them, and their targets (a score or a relevance
    each; none when predicting)."""

    pairs: list[EncodedText]
    targets: list[float] | None

    @property
    def cost(self) -> int:
        return sum(len(p.ids) for p in self.pairs)

    @property
    def longest(self) -> int:
        return max(len(p.ids) for p in self.pairs)

    @property
    def lengths(self) -> tuple[int, ...]:
        """Each pair's tokens: the plan's summary (each cut at the max length on its own)."""
        return tuple(len(p.ids) for p in self.pairs)


@dataclass
class PairsBatch(_Batch):
    """Every pair of a batch's records, padded: pairs (N, S); targets (N,) float or None;
    groups (N,) long: the record each pair belongs to (0, 0, 1, 2, 2, 2, ...)."""

    pairs: EncoderBatch
    targets: Tensor | None
    groups: Tensor

    def n_tokens(self) -> int:
        return self.pairs.n_tokens()

    def n_examples(self) -> int:
        return int(self.groups[-1]) + 1 if len(self.groups) else 0


def logits_of(model: nn.Module, batch: PairsBatch) -> Tensor:
    """The one inference forward of the cross-encoders: (N,) one logit per pair."""
    p = batch.pairs
    return model(p.input_ids, p.attention_mask, p.token_type_ids).logits[:, 0]


def activate(logits: list[float], activation: str) -> list[float]:
    """A kind's scores from its logits: themselves (identity) or their sigmoid, in float32 as
    the model computes them (sentence-transformers applies the same torch module)."""
    if activation == "identity":
        return list(logits)
    return torch.sigmoid(torch.tensor(logits, dtype=torch.float32)).tolist()


class CrossEncoding(Objective):
    """An objective over text pairs with one output. Subclasses say what a record's pairs are
    (``candidates``), their loss, scores and baseline, and ``activation``."""

    model_kind = "classifier"
    refuses = POST_NORM
    activation = "sigmoid"  # what turns a logit into the kind's score ("identity" or "sigmoid")

    def candidates(self, record: dict[str, Any]) -> tuple[str, list[str | None], list[float] | None]:
        """(the first text, each pair's second text (None: the first alone), their targets)."""
        raise NotImplementedError

    def model_config(self) -> TransformerConfig:
        return self.source.encoder_config(n_classes=1, pooling="cls", pooler=True)

    def build_model(self, model_config: TransformerConfig | None = None) -> nn.Module:
        """From scratch, or a fine-tune: the pretrained encoder with BERT's pooler (its own, or a
        new one where it has none, as transformers makes it) and a new one-output head."""
        if model_config is None and self.pretrained is not None:
            encoder = from_pretrained(self.pretrained)
            config = self.finetune_config(encoder.config).replace(n_classes=1, pooling="cls", pooler=True)
            model = EncoderClassifier(config)
            missing = model.encoder.load_state_dict(encoder.state_dict(), strict=False).missing_keys
            if missing:  # only the pooler may be new (an embedding model's encoder has none)
                assert set(missing) <= {"pooler.weight", "pooler.bias"}, missing
                nn.init.normal_(model.encoder.pooler.weight, std=0.02)  # BERT's initialisation
                nn.init.zeros_(model.encoder.pooler.bias)
            nn.init.normal_(model.head.weight, std=0.02)
            nn.init.zeros_(model.head.bias)
            return model.train()
        return EncoderClassifier(model_config or self.model_config())

    def encode(self, examples: list) -> list[Candidates]:
        firsts, seconds, sizes, targets = [], [], [], []
        for record in examples:
            first, others, target = self.candidates(record)
            firsts += [first] * len(others)
            seconds += others
            sizes.append(len(others))
            targets.append(target)
        encoded = self.source.encode_texts(firsts, seconds if any(s is not None for s in seconds) else None)
        out, start = [], 0
        for n, target in zip(sizes, targets, strict=True):
            out.append(Candidates(encoded[start : start + n], target))
            start += n
        return out

    def collate(self, encoded: list[Candidates]) -> PairsBatch:
        pairs = [p for c in encoded for p in c.pairs]
        sizes = torch.tensor([len(c.pairs) for c in encoded])
        groups = torch.repeat_interleave(torch.arange(len(encoded)), sizes)
        targets = None
        if all(c.targets is not None for c in encoded):
            targets = torch.tensor([t for c in encoded for t in c.targets], dtype=torch.float32)
        return PairsBatch(encoder_batch(pairs, self.source.pad_id), targets, groups)

    def predict_batch(self, model: nn.Module, batch: PairsBatch) -> list[list[float]]:
        """Each record's logits, one per pair."""
        logits = logits_of(model, batch).float().tolist()
        sizes = torch.bincount(batch.groups).tolist()
        out, start = [], 0
        for n in sizes:
            out.append(logits[start : start + n])
            start += n
        return out

    def _sample_loss(self, model: nn.Module, examples: list) -> float:
        """The loss of the first examples up to LOSS_TOKENS tokens (at least one), LOSS_BATCH at a
        time, each batch's mean weighted by its examples."""
        encoded = self.encode(examples[:EVAL_SAMPLE])
        batches, batch, tokens = [[]], 0, 0
        for example in encoded:
            if batches[-1] and batch + example.cost > LOSS_BATCH:
                batches.append([])
                batch = 0
            batches[-1].append(example)
            batch, tokens = batch + example.cost, tokens + example.cost
            if tokens >= LOSS_TOKENS:
                break
        total = 0.0
        with evaluating(model):
            for b in batches:
                total += self.loss(model, self.collate(b).to(model_device(model)))[0].item() * len(b)
        return total / sum(len(b) for b in batches)

    def sample_rows(self, examples: list, shown: list) -> list[tuple[str, str, str]]:
        return [self.row(ex, s) for ex, s in zip(examples, shown, strict=True)]

    def row(self, record: dict[str, Any], shown: str) -> tuple[str, str, str]:
        """(input, prediction, target) of a record in the sample table."""
        raise NotImplementedError

    def scores(self, model: nn.Module, records: list[dict], raw: bool = False,
               batch_size: int = 64) -> list[list[float]]:
        """Each record's scores (its logits with ``raw``), one per pair."""
        logits = self.predict(model, records, batch_size=batch_size)
        return logits if raw else [activate(r, self.activation) for r in logits]


class CrossEncoderRun(Run):
    """A cross-encoder run: scores of pairs from records, served, and exported as a
    sentence-transformers CrossEncoder (transformers' BertForSequenceClassification) and ONNX."""

    @property
    def scores_function(self) -> str:
        """What turns the logits into predict's scores, in TEI's names (function_to_apply)."""
        return {"identity": "none"}.get(self.objective.activation, self.objective.activation)

    pipeline_tag = "text-classification"
    labels = [LABEL]  # TEI's /predict names the one output

    @property
    def pairs(self) -> bool:
        """Whether the run reads text pairs (its data had them)."""
        return True

    @classmethod
    def pretrained_advice(cls, run: Path, kind=None) -> str:
        return (f"write its encoder as one with `tformer export {run} --hf DIR` (pip install "
                "'tformer[hf]'), then give --from-pretrained DIR")

    def _records(self, texts: list[str], pairs: list[str | None] | None) -> list[dict[str, str]]:
        """Inference records of texts (and their pairs) as the kind's fields hold them."""
        raise NotImplementedError

    def pair_scores(self, texts: list[str], pairs: list[str | None] | None, raw: bool = False,
                    batch_size: int = 64) -> list[float]:
        """One score per text (and its pair), the kind's activation applied unless ``raw``."""
        records = self._records(texts, pairs)
        return [s for r in self.objective.scores(self.model, records, raw, batch_size) for s in r]

    # Serving ------------------------------------------------------------------------------------
    def admit(self, records: list[dict[str, str]], truncate: bool, limit: int | None = None) -> list[Item]:
        """{"text", "text_pair"} records counted as the run encodes them (tformer.kinds.serving)."""
        texts, pairs, full = self.tokenizer.prefixes([r["text"] for r in records],
                                                     [r.get("text_pair") or None for r in records])
        records = [dict(r, text=t, **({"text_pair": p} if p is not None else {}))
                   for r, t, p in zip(records, texts, pairs, strict=True)]
        run_limit = self.max_input_tokens
        limit = limit or run_limit
        too_long(full, limit, truncate and limit == run_limit)
        return [Item(min(n, run_limit), n, r) for n, r in zip(full, records, strict=True)]

    @torch.inference_mode()
    def run_batch(self, records: list[dict[str, str]], raw: bool = False) -> list[list[float]]:
        """[score] per record, as the command line gives it; with ``raw``, [logit]."""
        out: list[tuple[int, float]] = []
        for paired in (False, True):  # a text alone and a pair cannot share a batch
            index = [i for i, r in enumerate(records) if bool(r.get("text_pair")) == paired]
            if index:
                pairs = [records[i].get("text_pair") for i in index] if paired else None
                scores = self.pair_scores([records[i]["text"] for i in index], pairs, raw)
                out += list(zip(index, scores, strict=True))
        return [[s] for _, s in sorted(out, key=lambda x: x[0])]

    def warm_up(self) -> None:
        record = {"text": "warm up", **({"text_pair": "a pair"} if self.pairs else {})}
        self.run_batch([item.payload for item in self.admit([record], True)])

    def describe(self) -> dict[str, Any]:
        return {"labels": self.labels, "activation": self.objective.activation}

    # Exports ------------------------------------------------------------------------------------
    def export_hf(self, out: Path, card: Card) -> Path:
        """A BertForSequenceClassification with one label that CrossEncoder(DIR) loads, checked."""
        activation = self.objective.activation
        what = ("a transformers BertForSequenceClassification directory (num_labels 1, activation "
                f"{activation})" + (", a sentence-transformers CrossEncoder" if self.pairs else ""))
        scores = None
        if self.pairs:
            def scores(pairs: list[tuple[str, str]]) -> list[float]:
                return self.pair_scores([a for a, _ in pairs], [b for _, b in pairs])
        written, checked = export_cross_encoder(out, self.model, self.tokenizer, activation, card, what,
                                                self.usage(), self.pipeline_tag, scores)
        loads = f"CrossEncoder('{written}')" if self.pairs else "pipeline('text-classification')"
        print(f"wrote {written}/ (BertForSequenceClassification, {checked}; {loads} loads it)",
              file=sys.stderr)
        return written

    def usage(self) -> str:
        """The model card's snippet for the transformers export."""
        if not self.pairs:
            return ('\nfrom transformers import pipeline\n'
                    'score = pipeline("text-classification", model="DIR")\n'
                    'print(score("some text"))  # [{"label": "score", "score": ...}]\n')
        return ('\nfrom sentence_transformers import CrossEncoder\nmodel = CrossEncoder("DIR")\n'
                'print(model.predict([("first text", "second text")]))\n')

    def export_onnx(self, out: Path, card: Card, opset: int) -> Path:
        """Folder ``out``: model.onnx (logits (B, 1), and scores (B,): the activation applied),
        config.json (num_labels 1, the activation), the tokenizer, a card."""
        out = tonnx.check_folder(out)  # refused before the tracing
        model, diff = tonnx.onnx_bytes(ScoresGraph(self.model, self.objective.activation), opset)
        config = tonnx.classifier_config(self.model.config, self.labels)
        config["sentence_transformers"] = {"activation_fn": ACTIVATIONS[self.objective.activation]}
        files = {"model.onnx": model, "config.json": json_bytes(config),
                 **hf_classifier.tokenizer_files(self.tokenizer.backend, self.tokenizer.max_length,
                                                 extra_config=hf_classifier.BERT_INPUTS)}
        files["README.md"] = render(card, "an ONNX cross-encoder (model.onnx: logits and scores)", ONNX_USAGE,
                                    library_name="onnx", pipeline_tag=self.pipeline_tag, tags=("onnx",))
        written = publish_export(out, files, "--onnx")
        tonnx.report(f"{written}/", diff)
        return written


class ScoresGraph(tonnx.ClassifierGraph):
    """A cross-encoder's ONNX graph: the logits (B, 1) and the scores (B,), its activation applied."""

    output_names = ["logits", "scores"]

    def __init__(self, classifier: nn.Module, activation: str) -> None:
        super().__init__(classifier)
        self.sigmoid = activation == "sigmoid"

    def forward(self, input_ids: Tensor, attention_mask: Tensor,
                token_type_ids: Tensor | None = None) -> tuple[Tensor, Tensor]:
        """Shape: (B, S) each -> (B, 1), (B,)."""
        logits = self.classifier(input_ids, attention_mask, token_type_ids).logits  # (B, 1)
        return logits, torch.sigmoid(logits[:, 0]) if self.sigmoid else logits[:, 0]


ONNX_USAGE = """
import numpy as np
import onnxruntime as ort
from tokenizers import Tokenizer

tokenizer = Tokenizer.from_file("DIR/tokenizer.json")  # cuts pairs at the run's max_length
session = ort.InferenceSession("DIR/model.onnx")
enc = tokenizer.encode("first text", "second text")
feed = {"input_ids": [enc.ids], "attention_mask": [enc.attention_mask], "token_type_ids": [enc.type_ids]}
inputs = {i.name: np.array(feed[i.name], dtype=np.int64) for i in session.get_inputs()}
logits, scores = session.run(None, inputs)
print(scores[0])
"""
