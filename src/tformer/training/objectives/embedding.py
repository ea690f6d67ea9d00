"""Sentence embeddings: an encoder and a pooling, L2-normalised, trained so that each anchor
is closer to its own positive than to every other text of the batch (in-batch negatives,
Henderson et al. 2017; plus each record's hard negative, if it has one). Your files only.

Scored by recall@1 and MRR@10 of each anchor retrieving its own positive among all the
split's positives. A finished run is a sentence-transformers directory.
"""

from __future__ import annotations

from pathlib import Path

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from tformer.config import TransformerConfig
from tformer.export.hf_classifier import save_sentence_layout
from tformer.formats.st_layout import read_layout
from tformer.nn.model import Encoder, from_pretrained
from tformer.nn.pooling import pool
from tformer.text.batches import EncoderBatch, PairBatch, encoder_batch
from tformer.training import evaluation
from tformer.training.examples import PairExample
from tformer.training.losses import ranking_loss
from tformer.training.objectives.base import Objective


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
        return F.normalize(pool(out.last_hidden_state, out.mask, self.pooling), dim=-1)  # (B, D')


class Embedding(Objective):
    kind = "embedding"
    model_kind = "encoder"
    main_metric = "mrr_at_10"
    inputs = ("anchor",)

    def what(self) -> str:
        return "sentence embeddings (anchor -> positive, in-batch negatives)"

    @property
    def starts_complete(self) -> bool:
        """A pretrained encoder and a pooling: no new parameter, a sentence model already."""
        return bool(self.config.from_pretrained)

    def model_config(self) -> TransformerConfig:
        return self.source.encoder_config()

    def build_model(self, model_config: TransformerConfig | None = None) -> nn.Module:
        pretrained = self.config.from_pretrained
        # A pretrained directory keeps its own pooling; from scratch: mean.
        pooling = read_layout(pretrained).pooling if pretrained else ("mean",)
        if model_config is None and pretrained:
            encoder = from_pretrained(pretrained)
            model = SentenceModel(self.finetune_config(encoder.config), pooling)
            model.encoder.load_state_dict(encoder.state_dict())
            return model.train()
        return SentenceModel(model_config or self.model_config(), pooling)

    def encode(self, examples: list) -> list[PairExample]:
        enc = self.source.encode_texts
        anchors = enc([r["anchor"] for r in examples])
        positives = enc([r.get("positive", r["anchor"]) for r in examples])  # (predicting: none)
        has_negative = [i for i, r in enumerate(examples) if "negative" in r]
        negatives: list = [None] * len(examples)
        if has_negative:  # each record's own hard negative, or none
            for i, x in zip(has_negative, enc([examples[i]["negative"] for i in has_negative]), strict=True):
                negatives[i] = x
        return [PairExample(a, p, n) for a, p, n in zip(anchors, positives, negatives, strict=True)]

    def collate(self, encoded: list[PairExample]) -> PairBatch:
        pad_id = self.source.pad_id
        negatives = [e.negative for e in encoded if e.negative is not None]
        return PairBatch(encoder_batch([e.anchor for e in encoded], pad_id),
                         encoder_batch([e.positive for e in encoded], pad_id),
                         encoder_batch(negatives, pad_id) if negatives else None)

    def loss(self, model: nn.Module, batch: PairBatch, label_smoothing: float = 0.0):
        return ranking_loss(model, batch)

    def predict_batch(self, model: nn.Module, batch: PairBatch) -> list[tuple[Tensor, Tensor]]:
        """(anchor, positive) embeddings per example, each (D,)."""
        return list(zip(model(batch.anchor), model(batch.positive), strict=True))

    def score(self, examples: list, preds: list) -> tuple[dict[str, float], list]:
        anchors = torch.stack([a for a, _ in preds])  # (N, D)
        positives = torch.stack([p for _, p in preds])  # (N, D)
        return evaluation.retrieval_metrics(anchors, positives), []

    def sample_rows(self, examples: list, shown: list) -> list[tuple[str, str, str]]:
        return []  # nothing to show per example: the metrics rank the whole split

    def _baseline(self, examples: list) -> tuple[float, str]:
        """Ranking by token overlap: each text a set of its tokens, scored by cosine (shared
        tokens / sqrt of the two sizes): what a model must beat to have learnt more than words
        in common."""
        encoded = self.encode(examples)
        specials = {self.source.bos_id, self.source.eos_id, self.source.pad_id}
        anchors = [set(e.anchor.ids) - specials for e in encoded]
        positives = [set(e.positive.ids) - specials for e in encoded]
        return evaluation.token_overlap_metrics(anchors, positives)[self.main_metric], "token overlap"

    def embed(self, model: nn.Module, texts: list[str], batch_size: int = 64) -> Tensor:
        """(N, D) normalised embeddings of texts, on the CPU."""
        out = self.predict(model, self.source.inputs(texts, self.inputs), batch_size=batch_size)
        return torch.stack([a for a, _ in out]).cpu()

    def save_outputs(self, model: nn.Module, run_dir: Path, shown: list) -> None:
        """The sentence-transformers layout, so the run directory loads as a SentenceTransformer."""
        save_sentence_layout(model, run_dir, self.source.tokenizer.max_length)
