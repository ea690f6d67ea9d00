"""Your own data as objectives, one class each, chosen by the file's field names:

    Seq2Seq          source -> target: the encoder-decoder, cross-entropy; BLEU and chrF
    Classification   text (+ text_pair) -> label: an encoder, pooled, a linear head
    Embedding        anchor -> positive (+ negative): an encoder, mean pooling, normalised,
                     trained with in-batch negatives

Each encodes records into typed examples (the token ids it needs, and its `cost`: the
tokens it adds to a batch), collates them into tformer.text.batches' types, and predicts.
"""

from __future__ import annotations

from pathlib import Path

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from tformer.config import TransformerConfig, bert_layout
from tformer.embeddings.sentence import pool
from tformer.export.hf_classifier import save_sentence_layout
from tformer.formats.st_layout import read_layout
from tformer.nn.generate import generate
from tformer.nn.model import Encoder, EncoderClassifier, Seq2SeqTransformer, from_pretrained
from tformer.text.batches import EncoderBatch, PairBatch, seq2seq_arrays
from tformer.training import evaluation
from tformer.training.dataset import BatchStream, TextData
from tformer.training.examples import (
    EncodedText,
    LabeledExample,
    PairExample,
    Seq2SeqExample,
    encoder_batch,
)
from tformer.training.objective import (
    EVAL_SAMPLE,
    Data,
    cannot,
    classification_loss,
    evaluating,
    ranking_loss,
    seq2seq_loss,
    validation_sample,
)
from tformer.training.records import Record
from tformer.training.report import plot_confusion

PREDICT_BATCH = 64  # records per forward when predicting


def bert_shaped(config, vocab_size: int, **extra) -> TransformerConfig:
    """A from-scratch encoder of the run's sizes in BERT's layout (config.bert_layout), so it
    exports to transformers and sentence-transformers."""
    return bert_layout(config.model, max_len=config.max_length, vocab_size=vocab_size, **extra)


# The objectives ------------------------------------------------------------------------------
class DataObjective:
    """What the three share: the data, the stream, prediction in batches, evaluation."""

    kind = ""
    main_metric = ""
    model_kind = "encoder"

    def __init__(self, data: TextData, config) -> None:
        self.data, self.config, self.tokenizer = data, config, data.tokenizer
        self.description = f"data {config.data}: {self.what()}"

    def what(self) -> str:
        raise NotImplementedError

    # Subclasses: encode records, collate examples, predict a batch, score predictions.
    def encode(self, records: list[Record]) -> list:
        raise NotImplementedError

    def collate(self, examples: list):
        raise NotImplementedError

    def _predict_batch(self, model: nn.Module, batch, beam_size: int, length_penalty: float,
                       max_len: int | None = None) -> list:
        raise NotImplementedError

    def score(self, records: list[Record], preds: list) -> tuple[dict[str, float], list]:
        raise NotImplementedError

    def model_config(self) -> TransformerConfig:
        raise NotImplementedError

    def build_model(self, model_config: TransformerConfig | None = None) -> nn.Module:
        raise NotImplementedError

    def train_batches(self, start: int, rank: int = 0, world: int = 1) -> BatchStream:
        return BatchStream(self.data, self.encode, self.collate, self.config.max_tokens, start, rank, world)

    @property
    def train_records(self) -> int | None:
        return self.data.train_record_estimate()

    def examples(self, split: str) -> list[Record]:
        return self.data.held_out(split)

    def predict(self, model: nn.Module, records: list[Record], beam_size: int = 1,
                length_penalty: float = 1.0, max_len: int | None = None) -> list:
        """One prediction per record (see the subclasses); labels and targets are not needed.
        max_len: seq2seq's longest output in tokens (default: the run's --max-length)."""
        out: list = []
        with evaluating(model):
            for i in range(0, len(records), PREDICT_BATCH):
                batch = self.collate(self.encode(records[i : i + PREDICT_BATCH]))
                out += self._predict_batch(model, batch, beam_size, length_penalty, max_len)
        return out

    def evaluate(self, model: nn.Module, split: str, beam_size: int = 1,
                 examples: list | None = None) -> tuple[dict[str, float], list]:
        records = validation_sample(split, self.examples(split)) if examples is None else examples
        metrics, preds = self.score(records, self.predict(model, records, beam_size=beam_size))
        with evaluating(model):  # teacher-forced, unsmoothed
            metrics["loss"] = self.loss(model, self.collate(self.encode(records[:EVAL_SAMPLE])))[0].item()
        return metrics, preds

    def loss(self, model: nn.Module, batch, label_smoothing: float = 0.0) -> tuple[Tensor, float]:
        raise NotImplementedError

    def baseline(self) -> dict[str, float]:
        return {}

    def sample_rows(self, records: list[Record], preds: list) -> list[tuple[str, str, str]]:
        return []

    def save_outputs(self, model: nn.Module, run_dir: Path, preds: list) -> None:
        """Nothing beyond the checkpoint (see the subclasses)."""

    # What a trained run does (tformer.training.run): each subclass does one.
    def read_examples(self, data: Data) -> list[Record]:
        if isinstance(data, (str, Path)):
            return list(self.data.read_file(data))
        return self.data.check_records(data, "data")

    def classify(self, model: nn.Module, texts: list[str], pairs: list[str] | None) -> list[dict]:
        raise cannot(self.description, "predict", "a classification run (text+label)")

    def generate(self, model: nn.Module, inputs: list[str], beam_size: int = 1,
                 length_penalty: float = 1.0, max_len: int | None = None) -> list[str]:
        raise cannot(self.description, "generate", "a sequence-to-sequence run (source+target)")

    def embed(self, model: nn.Module, texts: list[str]) -> Tensor:
        raise cannot(self.description, "embed", "an embedding run (anchor+positive)")


class Seq2Seq(DataObjective):
    kind = "seq2seq"
    main_metric = "bleu"
    best_by = "loss"  # the validation sample's BLEU is too noisy to pick weights by (loop._selection)
    model_kind = "seq2seq"

    def what(self) -> str:
        return "sequence-to-sequence (source -> target)"

    def model_config(self) -> TransformerConfig:
        c = self.config
        return c.model.replace(final_norm=c.model.norm_first, vocab_size=self.tokenizer.vocab_size,
                               max_len=c.max_length + 1)

    def build_model(self, model_config: TransformerConfig | None = None) -> nn.Module:
        if model_config is None and self.config.from_pretrained:
            raise ValueError("from_pretrained: fine-tuning needs an encoder objective "
                             "(text+label or anchor+positive); source+target trains from scratch")
        return Seq2SeqTransformer(model_config or self.model_config())

    def encode(self, records: list[Record]) -> list[Seq2SeqExample]:
        tok = self.tokenizer
        sources = tok.pieces([r["source"] for r in records])
        targets = tok.pieces([r.get("target", "") for r in records])
        return [Seq2SeqExample(s + [tok.eos_id], t) for s, t in zip(sources, targets, strict=True)]

    def collate(self, examples: list[Seq2SeqExample]):
        tok = self.tokenizer
        return seq2seq_arrays([e.source for e in examples], [e.target for e in examples],
                              tok.bos_id, tok.eos_id, tok.pad_id).to_torch()

    def loss(self, model: nn.Module, batch, label_smoothing: float = 0.0):
        return seq2seq_loss(model, batch, label_smoothing, self.tokenizer.pad_id)

    def _predict_batch(self, model, batch, beam_size: int, length_penalty: float,
                       max_len: int | None = None) -> list[str]:
        """Output texts."""
        tok = self.tokenizer
        gen = generate(model, batch.src, batch.src_mask, beam_size=beam_size,
                       max_len=max_len or self.config.max_length, length_penalty=length_penalty,
                       bos_id=tok.bos_id, eos_id=tok.eos_id, pad_id=tok.pad_id)
        return [tok.decode(ids) for ids in gen.tolist()]

    def score(self, records: list[Record], preds: list[str]) -> tuple[dict[str, float], list]:
        return evaluation.text_metrics(preds, [r["target"] for r in records]), preds

    def generate(self, model: nn.Module, inputs: list[str], beam_size: int = 1,
                 length_penalty: float = 1.0, max_len: int | None = None) -> list[str]:
        return self.predict(model, [{"source": t} for t in inputs], beam_size, length_penalty, max_len)

    def sample_rows(self, records: list[Record], preds: list) -> list[tuple[str, str, str]]:
        return [(r["source"], p, r["target"]) for r, p in zip(records, preds, strict=True)]


class _EncoderObjective(DataObjective):
    """Classification and embedding: a BERT-shaped encoder, from scratch or pretrained."""

    def build_model(self, model_config: TransformerConfig | None = None) -> nn.Module:
        if model_config is None and self.config.from_pretrained:
            encoder = from_pretrained(self.config.from_pretrained)
            model = self._model(self._config_from(encoder.config))
            model.encoder.load_state_dict(encoder.state_dict())
            self._init_head(model)
            return model.train()
        return self._model(model_config or self.model_config())

    def _model(self, config: TransformerConfig) -> nn.Module:
        raise NotImplementedError

    def _config_from(self, pretrained: TransformerConfig) -> TransformerConfig:
        return pretrained

    def _init_head(self, model: nn.Module) -> None:
        """A new head on a pretrained encoder (none here)."""


class Classification(_EncoderObjective):
    kind = "classification"
    main_metric = "accuracy"
    model_kind = "classifier"

    def what(self) -> str:
        return f"classification into {len(self.data.labels)} labels"

    def model_config(self) -> TransformerConfig:
        # From scratch, mean pooling by default (1.8 points more accurate than BERT's pooler on
        # a 12-label set: benchmarks/classifier_pooling.py); --pooling cls adds the pooler, so
        # the model is a transformers BertForSequenceClassification.
        pooling = self.config.model.pooling
        return bert_shaped(self.config, self.tokenizer.vocab_size, n_classes=len(self.data.labels),
                           pooling=pooling, pooler=pooling == "cls")

    def _model(self, config: TransformerConfig) -> nn.Module:
        return EncoderClassifier(config)

    def _config_from(self, pretrained: TransformerConfig) -> TransformerConfig:
        return pretrained.replace(n_classes=len(self.data.labels))

    def _init_head(self, model: nn.Module) -> None:
        # The new head starts small (BERT: normal, std 0.02), as transformers initialises it.
        nn.init.normal_(model.head.weight, std=0.02)
        nn.init.zeros_(model.head.bias)

    def encode(self, records: list[Record]) -> list[LabeledExample]:
        # Each record on its own: a text pair is kept whatever its neighbours hold.
        inputs = self.tokenizer.encode_inputs([r["text"] for r in records],
                                              [r.get("text_pair") for r in records])
        return [LabeledExample(EncodedText(*x), self.data.label_ids.get(r.get("label", ""), -1))
                for x, r in zip(inputs, records, strict=True)]

    def collate(self, examples: list[LabeledExample]) -> EncoderBatch:
        return encoder_batch([e.text for e in examples], self.tokenizer.pad_id, [e.label for e in examples])

    def loss(self, model: nn.Module, batch: EncoderBatch, label_smoothing: float = 0.0):
        return classification_loss(model, batch, label_smoothing)

    def _predict_batch(self, model, batch: EncoderBatch, beam_size: int, length_penalty: float,
                       max_len: int | None = None) -> list:
        """Class probabilities (lists of floats)."""
        return model(batch.input_ids, batch.attention_mask, batch.token_type_ids).logits.softmax(-1).tolist()

    def classify(self, model: nn.Module, texts: list[str], pairs: list[str] | None) -> list[dict]:
        if pairs is not None and len(pairs) != len(texts):
            raise ValueError(f"pairs: expected {len(texts)} (one per text), got {len(pairs)}")
        records = [{"text": t, **({"text_pair": p} if pairs is not None and p else {})}
                   for t, p in zip(texts, pairs or [None] * len(texts), strict=True)]
        labels = self.data.labels
        return [{"label": labels[max(range(len(p)), key=p.__getitem__)],
                 "probabilities": dict(zip(labels, p, strict=True))} for p in self.predict(model, records)]

    def score(self, records: list[Record], preds: list) -> tuple[dict[str, float], list]:
        predicted = [max(range(len(p)), key=p.__getitem__) for p in preds]
        actual = [self.data.label_ids[r["label"]] for r in records]
        return evaluation.classification_metrics(predicted, actual, len(self.data.labels)), predicted

    def baseline(self) -> dict[str, float]:
        counts: dict[str, int] = {}
        for r in self.examples("test"):
            counts[r["label"]] = counts.get(r["label"], 0) + 1
        return {"majority_baseline": max(counts.values()) / sum(counts.values())}

    def sample_rows(self, records: list[Record], preds: list) -> list[tuple[str, str, str]]:
        labels = self.data.labels
        return [(r["text"], labels[p], r["label"]) for r, p in zip(records, preds, strict=True)]

    def save_outputs(self, model: nn.Module, run_dir: Path, preds: list) -> None:
        """The test confusion matrix."""
        actual = [self.data.label_ids[r["label"]] for r in self.examples("test")]
        matrix = evaluation.confusion(preds, actual, len(self.data.labels))
        plot_confusion(matrix, self.data.labels, run_dir / "confusion.png")


class SentenceModel(nn.Module):
    """An encoder and a pooling (sentence-transformers style): one vector per text,
    L2-normalised (the ranking loss compares cosines)."""

    normalize = True

    def __init__(self, config: TransformerConfig, pooling: tuple[str, ...] = ("mean",)) -> None:
        super().__init__()
        self.config, self.pooling = config, tuple(pooling)
        self.encoder = Encoder(config)

    def forward(self, batch: EncoderBatch) -> Tensor:
        """
        Shape:
            batch.input_ids (B, S) -> (B, D * len(pooling)), L2-normalised
        """
        types = batch.token_type_ids if self.config.type_vocab_size else None
        out = self.encoder(batch.input_ids, batch.attention_mask, token_type_ids=types)
        # The ranking loss compares cosines, so training always normalises.
        return F.normalize(pool(out.last_hidden_state, out.mask, self.pooling), dim=-1)  # (B, D')


class Embedding(_EncoderObjective):
    kind = "embedding"
    main_metric = "mrr_at_10"

    def what(self) -> str:
        return "sentence embeddings (anchor -> positive, in-batch negatives)"

    def model_config(self) -> TransformerConfig:
        return bert_shaped(self.config, self.tokenizer.vocab_size)

    def _model(self, config: TransformerConfig) -> nn.Module:
        # A pretrained directory keeps its own pooling; from scratch: mean.
        pretrained = self.config.from_pretrained
        return SentenceModel(config, read_layout(pretrained).pooling if pretrained else ("mean",))

    def encode(self, records: list[Record]) -> list[PairExample]:
        enc = self.tokenizer.encode_inputs
        anchors = enc([r["anchor"] for r in records])
        positives = enc([r.get("positive", r["anchor"]) for r in records])
        has_negative = [i for i, r in enumerate(records) if "negative" in r]
        negatives: list[EncodedText | None] = [None] * len(records)
        if has_negative:  # each record's own hard negative, or none
            for i, x in zip(has_negative, enc([records[i]["negative"] for i in has_negative]), strict=True):
                negatives[i] = EncodedText(*x)
        return [PairExample(EncodedText(*a), EncodedText(*p), n)
                for a, p, n in zip(anchors, positives, negatives, strict=True)]

    def collate(self, examples: list[PairExample]) -> PairBatch:
        pad_id = self.tokenizer.pad_id
        negatives = [e.negative for e in examples if e.negative is not None]
        return PairBatch(encoder_batch([e.anchor for e in examples], pad_id),
                         encoder_batch([e.positive for e in examples], pad_id),
                         encoder_batch(negatives, pad_id) if negatives else None)

    def loss(self, model: nn.Module, batch: PairBatch, label_smoothing: float = 0.0):
        return ranking_loss(model, batch)

    def _predict_batch(self, model, batch: PairBatch, beam_size: int, length_penalty: float,
                       max_len: int | None = None) -> list:
        """Anchor and positive embeddings, alternating: [a (B, D), p (B, D)]."""
        return [model(batch.anchor), model(batch.positive)]

    def embed(self, model: nn.Module, texts: list[str]) -> Tensor:
        """(N, D) normalised embeddings of texts."""
        return torch.cat(self.predict(model, [{"anchor": t} for t in texts])[0::2])

    def score(self, records: list[Record], preds: list) -> tuple[dict[str, float], list]:
        anchors, positives = torch.cat(preds[0::2]), torch.cat(preds[1::2])
        return evaluation.retrieval_metrics(anchors, positives), []

    def save_outputs(self, model: nn.Module, run_dir: Path, preds: list) -> None:
        """The sentence-transformers layout, so the run directory loads as a SentenceTransformer."""
        save_sentence_layout(model, run_dir, self.tokenizer.max_length)


DATA_OBJECTIVES: dict[str, type[DataObjective]] = {
    "seq2seq": Seq2Seq, "classification": Classification, "embedding": Embedding}


def data_objective(data: TextData, config) -> DataObjective:
    return DATA_OBJECTIVES[data.fields.objective](data, config)
