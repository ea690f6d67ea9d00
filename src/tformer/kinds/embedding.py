"""Sentence embeddings: an encoder and a pooling, L2-normalised (tformer.nn.heads.SentenceModel),
trained so that each anchor is closer to its own positive than to every other text of the
batch (in-batch negatives, Henderson et al. 2017; plus each record's hard negative, if any).

    {"anchor": "...", "positive": "..."}  (+ "negative")     tformer embed RUN "a text"

Scored by recall@1 and MRR@10 of each anchor retrieving its own positive among all the split's
positives, against ranking by shared tokens. A finished run is a sentence-transformers
directory. Served with OpenAI's /v1/embeddings and TEI's /embed; a BERT-format or
sentence-transformers directory is served the same way (``EmbeddingRun.from_model_dir``).
"""

from __future__ import annotations

from collections.abc import Iterable
from pathlib import Path
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F
from torch import Tensor, nn

from tformer.config import TransformerConfig
from tformer.embeddings.sentence import WINDOW_POOLING, SentenceEncoder, vectors
from tformer.errors import FieldError
from tformer.export import hf_classifier
from tformer.export import onnx as tonnx
from tformer.export.export_dir import publish_export
from tformer.export.hf_classifier import save_sentence_layout
from tformer.export.model_card import Card, render
from tformer.formats.st_layout import read_layout
from tformer.kinds.base import Kind
from tformer.kinds.run import Run, check_batch_size, texts_of
from tformer.kinds.serving import Item, too_long
from tformer.nn.heads import SentenceModel
from tformer.nn.model import from_pretrained
from tformer.text.batches import EncodedText, EncoderBatch, PairBatch, encoder_batch
from tformer.training import evaluation
from tformer.training.examples import PairExample
from tformer.training.objective import Objective
from tformer.training.records import Fields

FIELDS = Fields("embedding", ("anchor", "positive"), ("negative",), ("anchor",))
# Batches of 4,096 tokens: in-batch negatives want large batches (tformer.training.presets).
PRESET = {"d_model": 128, "n_heads": 4, "d_ff": 512, "n_layers": 2, "activation": "gelu", "vocab_size": 4000,
          "lr": 5e-4, "warmup": 200, "schedule": "linear", "steps": 10000, "max_tokens": 4096,
          "eval_every": 250, "label_smoothing": 0.0, "patience": 8}
MNR_SCALE = 20.0  # similarity scale of the ranking loss (sentence-transformers' default)
OVERLAP = "token overlap"  # the trivial baseline


def embed(model: SentenceModel, batch: EncoderBatch) -> Tensor:
    """The one forward of a batch of texts: (B, D') vectors (tformer.embeddings.sentence.vectors:
    SentenceModel.forward, a long text's windows' pooled)."""
    return vectors(model, batch)


class Embedding(Objective):
    kind, fields, preset = FIELDS.objective, FIELDS, PRESET
    refuses = {"norm_first": "an embedding run is saved as a sentence-transformers BERT, which is post-norm"}
    reads = ("long",)
    pools = WINDOW_POOLING  # a long text's windows: the mean of their vectors
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
        return self.source.encoder_config(pooling="mean")

    def build_model(self, model_config: TransformerConfig | None = None) -> nn.Module:
        """From scratch, mean pooling; a fine-tune keeps its directory's pooling; a run's saved
        config says its own (config.pooling: the run needs nothing else to load)."""
        if model_config is None and self.pretrained is not None:
            encoder = from_pretrained(self.pretrained)
            pooling = "+".join(self.pretrained.layout.pooling)
            config = self.finetune_config(encoder.config).replace(pooling=pooling)
            model = SentenceModel(config)
            model.encoder.load_state_dict(encoder.state_dict())
            return model.train()
        return SentenceModel(model_config or self.model_config())

    def saved_config(self, model_config: TransformerConfig, run_dir: Path) -> TransformerConfig:
        """A finished run's pooling as its own sentence-transformers files say (runs written
        before config.pooling held it kept it only there)."""
        if (run_dir / "modules.json").is_file():
            return model_config.replace(pooling="+".join(read_layout(run_dir).pooling))
        return model_config

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
        """Multiple-negatives ranking loss (Henderson et al. 2017): anchor i must score its own
        positive above every other positive (and every hard negative) of the batch; and the
        in-batch top-1 accuracy."""
        a = embed(model, batch.anchor)  # (B, D)
        candidates = embed(model, batch.positive)  # (B, D)
        if batch.negative is not None:
            candidates = torch.cat([candidates, embed(model, batch.negative)])  # (B + N, D)
        scores = MNR_SCALE * a @ candidates.T  # (B, B + N)
        target = torch.arange(a.size(0), device=a.device)
        loss = F.cross_entropy(scores.float(), target)
        return loss, (scores.argmax(-1) == target).float().mean().item()

    def predict_batch(self, model: nn.Module, batch: PairBatch) -> list[tuple[Tensor, Tensor]]:
        """(anchor, positive) embeddings per example, each (D,)."""
        return list(zip(embed(model, batch.anchor), embed(model, batch.positive), strict=True))

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
        return evaluation.token_overlap_metrics(anchors, positives)[self.main_metric], OVERLAP

    def save_outputs(self, model: nn.Module, run_dir: Path, shown: list) -> None:
        """The sentence-transformers layout, so the run directory loads as a SentenceTransformer."""
        save_sentence_layout(model, run_dir, self.source.tokenizer.max_length)


class EmbeddingRun(Run):
    kind = FIELDS.objective
    verb = "embed"
    pipeline_tag = "sentence-similarity"
    protocols = ("openai.embeddings", "tei.embed", "tei.tokenize")

    def __init__(self, path, model: SentenceModel, objective: Embedding | None, config,
                 record: dict[str, Any] | None = None, tokenizer=None) -> None:
        super().__init__(path, model, objective, config, record)
        # The one forward of every embedding (SentenceModel.forward), in SentenceEncoder's batches.
        self.encoder = SentenceEncoder(model, tokenizer or objective.tokenizer)

    @classmethod
    def from_model_dir(cls, path: str | Path, device, dtype: str = "fp32",
                       max_length: int | None = None) -> EmbeddingRun:
        """A BERT-format or sentence-transformers directory as an embedding run that embeds and
        is served (it has no data: nothing to evaluate, and `tformer export DIR` exports it)."""
        st = SentenceEncoder.from_pretrained(path, dtype=dtype, max_length=max_length, device=device)
        return cls(path, st.sentence, None, None, tokenizer=st.tokenizer)

    @classmethod
    def pretrained_advice(cls, run: Path, kind=None) -> str:
        return f"give the run itself: --from-pretrained {run} (a sentence-transformers directory)"

    @property
    def tokenizer(self):
        return self.encoder.tokenizer

    def read_long(self, long: str | None) -> EmbeddingRun:
        """Run.read_long, for a model directory too (no run: windows only where asked)."""
        if self.objective is not None:
            super().read_long(long)
        elif long not in (None, "windows", "cut"):
            raise FieldError("long", f"expected windows, cut or None, got {long!r}")
        if long is not None:
            self.encoder = self.encoder.windowed(long == "windows")
        return self

    @property
    def description(self) -> str:
        if self.objective is None:
            return f"the model directory {self.path}"
        return self.objective.description

    def embed(self, texts: str | Iterable[str], batch_size: int = 64) -> np.ndarray:
        """(N, D) L2-normalised float32 vectors (one str is one text); no texts: (0, D), as
        SentenceEncoder.encode([]) gives (it raised here)."""
        batch_size = check_batch_size(batch_size)
        if not isinstance(texts, (str, bytes, bytearray)) and isinstance(texts, Iterable):
            texts = list(texts)
            if not texts:
                return np.empty((0, self.dim), dtype=np.float32)
        return self.encoder.encode(texts_of(texts), batch_size=batch_size, show_progress=False)

    @property
    def dim(self) -> int:
        """The length of a vector: the model's width times its pooling modes."""
        return self.encoder.dim

    @property
    def normalize(self) -> bool:
        return self.encoder.normalize

    # Serving: OpenAI's /v1/embeddings, TEI's /embed ------------------------------------------------
    def admit(self, inputs: list[str | list[int]], truncate: bool, limit: int | None = None) -> list[Item]:
        """Texts as the model reads them, cut as the tokenizer cuts (Tokenizer.encode: the one
        path `tformer embed` takes too, a long text tokenized only as far as its cut needs, or
        read in windows where the run reads them: all their tokens counted); a text past the
        limit is refused unless truncating. Token ids (TEI and OpenAI accept them) are taken as
        they are, cut at the max length (no windows: where their specials are is not known)."""
        tokenizer, limit = self.tokenizer, limit or self.max_input_tokens
        out: list[Item | None] = [None] * len(inputs)
        index = [i for i, x in enumerate(inputs) if isinstance(x, str)]
        if index:
            encoded = tokenizer.encode([inputs[i] for i in index])
            too_long([e.full for e in encoded], limit, truncate, index)
            for i, e in zip(index, encoded, strict=True):
                out[i] = Item(e.tokens, e.full, e, e.truncated)
        for i, ids in enumerate(inputs):
            if not isinstance(ids, str):
                too_long([len(ids)], min(limit, tokenizer.max_length), truncate, [i])
                kept = ids[: min(limit, tokenizer.max_length)]
                out[i] = Item(len(kept), len(ids), EncodedText(kept, [0] * len(kept), len(ids)))
        return out  # type: ignore[return-value]

    def run_batch(self, payloads: list[EncodedText], normalize: bool) -> list[np.ndarray]:
        """Embed one batch, as ``SentenceEncoder.encode`` does each of its batches.
        ``normalize`` is the batch's key: inputs batch together only with the same.

        Shape:
            returns B vectors (dim,) float32, in the order of ``payloads``
        """
        batch = encoder_batch(payloads, self.tokenizer.pad_id)
        return list(self.encoder.embed_batch(batch, normalize).numpy())

    def warm_up(self) -> None:
        self.run_batch([item.payload for item in self.admit(["warm up"], True)], True)

    def describe(self) -> dict[str, Any]:
        return {"dim": self.dim, "pooling": list(self.model.pooling), "normalize": self.normalize}

    def tei_model_type(self) -> dict[str, Any]:
        return {"embedding": {"pooling": "+".join(self.model.pooling)}}

    # Exports -----------------------------------------------------------------------------------
    def export_hf(self, out: Path, card: Card) -> Path:
        raise ValueError(f"--hf: {self.path} is an embedding run, already a sentence-transformers "
                         f"directory (SentenceTransformer('{self.path}') loads it); for ONNX use --onnx")

    def export_onnx(self, out: Path, card: Card, opset: int) -> Path:
        """Folder ``out``: model.onnx (token and sentence embeddings), config.json, the
        tokenizer and the sentence-transformers layout (its ONNX backend loads it), a card."""
        out = tonnx.check_folder(out)  # refused before the tracing
        m, tok = self.model, self.tokenizer
        model, diff = tonnx.onnx_bytes(tonnx.SentenceGraph(m.encoder, m.pooling, m.normalize), opset)
        files = {"model.onnx": model,
                 **tonnx.sentence_files(m.config, m.pooling, m.normalize, tok.max_length),
                 **hf_classifier.tokenizer_files(tok.backend, tok.max_length,
                                                 extra_config=hf_classifier.BERT_INPUTS)}
        files["README.md"] = render(card, "an ONNX sentence-embedding folder (model.onnx: "
                                          "sentence_embedding), also a sentence-transformers directory "
                                          "for its ONNX backend",
                                    tonnx.SENTENCE_USAGE.replace("PAD_TOKEN",
                                                                 tok.backend.id_to_token(tok.pad_id)),
                                    library_name="sentence-transformers",
                                    pipeline_tag=self.pipeline_tag, tags=("onnx",))
        written = publish_export(out, files, "--onnx")
        tonnx.report(f"{written}/", diff)
        return written


KIND = Kind(Embedding, EmbeddingRun)
