"""What is learned: the model, the loss and the evaluation of each kind of run.

A source gives the loop everything it needs, whatever the data:
    model = source.build_model()
    for batch in source.train_batches(start): loss, acc = source.loss(model, batch, smoothing)
    metrics, preds = source.evaluate(model, "validation")

TaskSource: a synthetic task (tformer.tasks). DataSource: your own files (training.data),
with three objectives chosen by their fields: seq2seq (the encoder-decoder, cross-entropy),
classification (an encoder, a pooled output and a linear head) and embedding (an encoder,
mean pooling, normalised, trained with in-batch negatives).
"""

from __future__ import annotations

from pathlib import Path

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from tformer.config import TransformerConfig
from tformer.generate import generate
from tformer.model import ClassifierOutput, Encoder, EncoderClassifier, Seq2SeqTransformer
from tformer.sentence import pool
from tformer.tasks import Example, Task
from tformer.tasks.tokenizer import PAD
from tformer.training import evaluation
from tformer.training.data import EncodedBatch, PairBatch, TextData

EVAL_LIMIT = 500  # seq2seq validation decodes at most this many examples (the test: all)
MNR_SCALE = 20.0  # similarity scale of the ranking loss (sentence-transformers' default)


# Models of data runs ------------------------------------------------------------------------
class TextClassifier(nn.Module):
    """An encoder, its pooled output and a linear head over the classes.

    Pooling: the BERT pooler (tanh(W h[CLS]), Devlin et al. 2019 §3) when the encoder has
    one, so a fine-tuned model is a transformers BertForSequenceClassification; else the
    mean over real tokens.
    """

    def __init__(self, config: TransformerConfig) -> None:
        super().__init__()
        if config.n_classes is None:
            raise ValueError("n_classes: a classifier needs the number of classes, got None")
        self.config = config
        self.encoder = Encoder(config)
        self.dropout = nn.Dropout(config.dropout)
        self.head = nn.Linear(config.d_model, config.n_classes)

    def forward(self, input_ids: Tensor, attention_mask: Tensor | None = None,
                token_type_ids: Tensor | None = None) -> ClassifierOutput:
        """
        Shape:
            input_ids, attention_mask, token_type_ids: (B, S) -> logits (B, C)
        """
        types = token_type_ids if self.config.type_vocab_size else None
        out = self.encoder(input_ids, attention_mask, token_type_ids=types)
        if out.pooler_output is not None:
            pooled = out.pooler_output  # (B, D)
        else:
            pooled = pool(out.last_hidden_state, out.mask, ["mean"])  # (B, D)
        return ClassifierOutput(self.head(self.dropout(pooled)))


class SentenceModel(nn.Module):
    """An encoder and a pooling (sentence-transformers style): one vector per text."""

    def __init__(self, config: TransformerConfig, pooling: tuple[str, ...] = ("mean",),
                 normalize: bool = True) -> None:
        super().__init__()
        self.config, self.pooling, self.normalize = config, tuple(pooling), normalize
        self.encoder = Encoder(config)

    def forward(self, batch: EncodedBatch) -> Tensor:
        """
        Shape:
            batch.input_ids (B, S) -> (B, D * len(pooling)), L2-normalised
        """
        types = batch.token_type_ids if self.config.type_vocab_size else None
        out = self.encoder(batch.input_ids, batch.attention_mask, token_type_ids=types)
        # The ranking loss compares cosines, so training always normalises.
        return F.normalize(pool(out.last_hidden_state, out.mask, self.pooling), dim=-1)  # (B, D')


def bert_shaped(config, vocab_size: int, **extra) -> TransformerConfig:
    """A from-scratch encoder with BERT's layout (learned positions, embedding LayerNorm,
    GELU, two token types, post-norm), so it exports to transformers and sentence-transformers."""
    return config.model.replace(
        attention_dropout=config.model.dropout, activation="gelu", norm_first=False, final_norm=False,
        positional="learned", max_len=config.max_length, vocab_size=vocab_size,
        scale_embeddings=False, type_vocab_size=2, embedding_norm=True, layer_norm_eps=1e-12,
        **extra)


# Sources ---------------------------------------------------------------------------------------
class TaskSource:
    """A synthetic task: batches are a function of (seed, step), splits are generated."""

    def __init__(self, task: Task, config) -> None:
        self.task, self.config = task, config
        self.kind = task.kind
        self.main_metric = "exact_match" if task.kind == "seq2seq" else "accuracy"
        self.description = f"task {task.name}: {task.description}"

    def model_config(self) -> TransformerConfig:
        return self.config.task_model(self.task)

    def build_model(self, model_config: TransformerConfig | None = None) -> nn.Module:
        cls = Seq2SeqTransformer if self.kind == "seq2seq" else EncoderClassifier
        return cls(model_config or self.model_config())

    def train_batches(self, start: int, rank: int = 0, world: int = 1):
        step = start
        while True:
            if step % world == rank:
                yield self.task.collate(self.task.train_batch(step, self.config.batch_size))
            step += 1

    def loss(self, model: nn.Module, batch, label_smoothing: float = 0.0):
        return forward_loss(model, batch, label_smoothing)

    def examples(self, split: str) -> list[Example]:
        return self.task.split(split)

    @torch.no_grad()
    def predict(self, model: nn.Module, examples: list[Example], beam_size: int = 1,
                batch_size: int = 250, length_penalty: float = 1.0) -> list:
        """Generated id lists (seq2seq) or class ids (classification), one per example."""
        task, was_training = self.task, model.training
        model.eval()
        out: list = []
        for i in range(0, len(examples), batch_size):
            batch = task.collate(examples[i : i + batch_size])
            if task.kind == "seq2seq":
                gen = generate(model, batch.src, batch.src_mask, beam_size=beam_size,
                               max_len=task.max_target_tokens + 1, length_penalty=length_penalty)
                out += gen.tolist()
            else:
                logits = model(batch.input_ids, attention_mask=batch.attention_mask).logits
                out += logits.argmax(-1).tolist()
        model.train(was_training)
        return out

    @torch.no_grad()
    def evaluate(self, model: nn.Module, split: str, beam_size: int = 1, limit: int | None = None,
                 examples: list | None = None) -> tuple[dict[str, float], list]:
        """Metrics on a held-out split (generation for seq2seq), plus the predictions."""
        examples = self.task.split(split)[:limit] if examples is None else examples
        preds = self.predict(model, examples, beam_size=beam_size)
        metrics = self.task.score(preds, examples)
        was_training = model.training
        model.eval()
        batch = self.task.collate(examples[:500])
        metrics["loss"] = forward_loss(model, batch)[0].item()  # teacher-forced, unsmoothed
        model.train(was_training)
        return metrics, preds

    def baseline(self) -> dict[str, float]:
        if self.kind != "classification":
            return {}
        return {"majority_baseline": self.task.majority_baseline()["accuracy"]}

    def sample_rows(self, examples: list[Example], preds: list) -> list[tuple[str, str, str]]:
        tok = self.task.tokenizer
        return [(ex.source, tok.decode(p) if self.kind == "seq2seq" else str(p),
                 ex.target if self.kind == "seq2seq" else str(ex.label))
                for ex, p in zip(examples, preds, strict=True)]

    def save_outputs(self, model: nn.Module, run_dir: Path, preds: list) -> None:
        """Nothing beyond the checkpoint for a synthetic task."""


class DataSource:
    """Your own files (see training.data), one of the three objectives."""

    MAIN = {"seq2seq": "bleu", "classification": "accuracy", "embedding": "mrr_at_10"}

    def __init__(self, data: TextData, config) -> None:
        self.data, self.config = data, config
        self.kind = data.objective
        self.main_metric = self.MAIN[self.kind]
        what = {"seq2seq": "sequence-to-sequence (source -> target)",
                "classification": f"classification into {len(data.labels)} labels",
                "embedding": "sentence embeddings (anchor -> positive, in-batch negatives)"}
        self.description = f"data {config.data}: {what[self.kind]}"

    # The model ------------------------------------------------------------------------------
    def model_config(self) -> TransformerConfig:
        c, v = self.config, self.data.tokenizer.vocab_size
        if self.kind == "seq2seq":
            return c.model.replace(final_norm=c.model.norm_first, vocab_size=v, max_len=c.max_length + 1)
        if self.kind == "classification":
            return bert_shaped(c, v, n_classes=len(self.data.labels))
        return bert_shaped(c, v)

    def build_model(self, model_config: TransformerConfig | None = None) -> nn.Module:
        c = self.config
        if model_config is None and c.from_pretrained:
            return self._pretrained()
        model_config = model_config or self.model_config()
        if self.kind == "seq2seq":
            return Seq2SeqTransformer(model_config)
        if self.kind == "classification":
            model = TextClassifier(model_config)
        else:
            model = SentenceModel(model_config, *self.pooling())
        return model

    def pooling(self) -> tuple[tuple[str, ...], bool]:
        """Embeddings keep a pretrained directory's pooling; from scratch: mean, normalised."""
        if self.config.from_pretrained:
            from tformer.convert.st_layout import read_layout

            layout = read_layout(self.config.from_pretrained)
            return layout.pooling, True
        return ("mean",), True

    def _pretrained(self) -> nn.Module:
        from tformer.model import from_pretrained

        if self.kind == "seq2seq":
            raise ValueError("from_pretrained: fine-tuning needs an encoder objective "
                             "(text+label or anchor+positive); source+target trains from scratch")
        encoder = from_pretrained(self.config.from_pretrained)
        n = len(self.data.labels) if self.kind == "classification" else None
        config = encoder.config.replace(n_classes=n, max_len=encoder.config.max_len)
        model = self.build_model(config)
        model.encoder.load_state_dict(encoder.state_dict())
        # The new head starts small (BERT: normal, std 0.02), as transformers initialises it.
        if self.kind == "classification":
            nn.init.normal_(model.head.weight, std=0.02)
            nn.init.zeros_(model.head.bias)
        return model.train()

    # Training ---------------------------------------------------------------------------------
    def train_batches(self, start: int, rank: int = 0, world: int = 1):
        return self.data.train_batches(start, rank, world)

    def loss(self, model: nn.Module, batch, label_smoothing: float = 0.0):
        if self.kind == "seq2seq":
            return forward_loss(model, batch, label_smoothing, self.data.tokenizer.pad_id)
        if self.kind == "classification":
            logits = model(batch.input_ids, batch.attention_mask, batch.token_type_ids).logits
            loss = F.cross_entropy(logits, batch.labels, label_smoothing=label_smoothing)
            return loss, (logits.argmax(-1) == batch.labels).float().mean().item()
        return ranking_loss(model, batch)

    # Evaluation -------------------------------------------------------------------------------
    def examples(self, split: str) -> list[dict[str, str]]:
        return self.data.held_out(split)

    @torch.no_grad()
    def predict(self, model: nn.Module, records: list[dict[str, str]], beam_size: int = 1,
                length_penalty: float = 1.0) -> list:
        """Output texts (seq2seq), class ids (classification) or anchor embeddings."""
        was_training = model.training
        model.eval()
        out: list = []
        for batch_records in self._eval_batches(records):
            batch = self.data.collate(self.data.encode(batch_records))
            if self.kind == "seq2seq":
                tok = self.data.tokenizer
                gen = generate(model, batch.src, batch.src_mask, beam_size=beam_size,
                               max_len=self.config.max_length, length_penalty=length_penalty,
                               bos_id=tok.bos_id, eos_id=tok.eos_id, pad_id=tok.pad_id)
                out += [tok.decode(ids) for ids in gen.tolist()]
            elif self.kind == "classification":
                out += model(batch.input_ids, batch.attention_mask, batch.token_type_ids
                             ).logits.softmax(-1).tolist()
            else:
                out += [model(batch.anchor), model(batch.positive)]
        model.train(was_training)
        return out

    def _eval_batches(self, records: list[dict[str, str]], size: int = 64):
        for i in range(0, len(records), size):
            yield records[i : i + size]

    @torch.no_grad()
    def evaluate(self, model: nn.Module, split: str, beam_size: int = 1, limit: int | None = None,
                 examples: list | None = None) -> tuple[dict[str, float], list]:
        records = self.examples(split) if examples is None else examples
        if limit is None and split == "validation" and self.kind == "seq2seq":
            limit = EVAL_LIMIT
        records = records[:limit]
        preds = self.predict(model, records, beam_size=beam_size)
        if self.kind == "seq2seq":
            metrics = evaluation.text_metrics(preds, [r["target"] for r in records])
        elif self.kind == "classification":
            predicted = [max(range(len(p)), key=p.__getitem__) for p in preds]
            actual = [self.data.label_ids[r["label"]] for r in records]
            metrics = evaluation.classification_metrics(predicted, actual, len(self.data.labels))
            preds = predicted
        else:
            anchors, positives = torch.cat(preds[0::2]), torch.cat(preds[1::2])
            metrics = evaluation.retrieval_metrics(anchors, positives)
            preds = []
        was_training = model.training
        model.eval()
        batch = self.data.collate(self.data.encode(records[:256]))
        metrics["loss"] = self.loss(model, batch)[0].item()  # teacher-forced, unsmoothed
        model.train(was_training)
        return metrics, preds

    def baseline(self) -> dict[str, float]:
        if self.kind != "classification":
            return {}
        counts: dict[str, int] = {}
        for r in self.examples("test"):
            counts[r["label"]] = counts.get(r["label"], 0) + 1
        return {"majority_baseline": max(counts.values()) / sum(counts.values())}

    def sample_rows(self, records: list[dict[str, str]], preds: list) -> list[tuple[str, str, str]]:
        if self.kind == "seq2seq":
            return [(r["source"], p, r["target"]) for r, p in zip(records, preds, strict=True)]
        if self.kind == "classification":
            labels = self.data.labels
            return [(r["text"], labels[p], r["label"]) for r, p in zip(records, preds, strict=True)]
        return []

    def save_outputs(self, model: nn.Module, run_dir: Path, preds: list) -> None:
        """The confusion matrix (classification), the sentence-transformers layout (embedding)."""
        if self.kind == "classification":
            actual = [self.data.label_ids[r["label"]] for r in self.examples("test")]
            matrix = evaluation.confusion(preds, actual, len(self.data.labels))
            evaluation.plot_confusion(matrix, self.data.labels, run_dir / "confusion.png")
        elif self.kind == "embedding":
            from tformer.convert.hf_classifier import save_sentence_layout

            save_sentence_layout(model, run_dir, self.data.tokenizer.max_length)


# Losses ---------------------------------------------------------------------------------------
def _at_least_fp32(x: Tensor) -> Tensor:
    """The loss in fp32 under bf16 autocast; float64 (gradient checks) stays float64."""
    return x if x.dtype in (torch.float32, torch.float64) else x.float()


def forward_loss(model: nn.Module, batch, label_smoothing: float = 0.0, pad_id: int = PAD):
    """Teacher-forced loss and (loss, accuracy) for logging."""
    if hasattr(batch, "src"):
        logits = model(batch.src, batch.tgt_in, src_attention_mask=batch.src_mask,
                       tgt_attention_mask=batch.tgt_mask).logits  # (B, T, V)
        labels = batch.labels  # (B, T)
        loss = F.cross_entropy(_at_least_fp32(logits.flatten(0, 1)), labels.flatten(), ignore_index=pad_id,
                               label_smoothing=label_smoothing)
        real = labels != pad_id
        right = ((logits.argmax(-1) == labels) & real).sum()
        acc = right.item() / max(int(real.sum()), 1)
    else:
        logits = model(batch.input_ids, attention_mask=batch.attention_mask).logits  # (B, C)
        loss = F.cross_entropy(_at_least_fp32(logits), batch.labels, label_smoothing=label_smoothing)
        acc = (logits.argmax(-1) == batch.labels).float().mean().item()
    return loss, acc


def ranking_loss(model: nn.Module, batch: PairBatch) -> tuple[Tensor, float]:
    """Multiple-negatives ranking loss (Henderson et al. 2017): anchor i must score its own
    positive above every other positive (and hard negative) of the batch.
    Returns the loss and the in-batch top-1 accuracy."""
    a = model(batch.anchor)  # (B, D)
    candidates = model(batch.positive)  # (B, D)
    if batch.negative is not None:
        candidates = torch.cat([candidates, model(batch.negative)])  # (2B, D)
    scores = MNR_SCALE * a @ candidates.T  # (B, B or 2B)
    target = torch.arange(a.size(0))
    loss = F.cross_entropy(scores.float(), target)
    return loss, (scores.argmax(-1) == target).float().mean().item()
