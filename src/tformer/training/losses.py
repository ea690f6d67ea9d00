"""The training losses, one per kind of batch (tformer.text.batches), each with the accuracy
it logs. Under bf16 autocast the loss is computed in fp32."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from tformer.text.batches import EncoderBatch, PairBatch, Seq2SeqBatch
from tformer.text.specials import PAD

MNR_SCALE = 20.0  # similarity scale of the ranking loss (sentence-transformers' default)


def at_least_fp32(x: Tensor) -> Tensor:
    """The loss in fp32 under bf16 autocast; float64 (gradient checks) stays float64."""
    return x if x.dtype in (torch.float32, torch.float64) else x.float()


def seq2seq_loss(model: nn.Module, batch: Seq2SeqBatch, label_smoothing: float = 0.0,
                 pad_id: int = PAD) -> tuple[Tensor, float]:
    """Teacher-forced cross-entropy over the target tokens, and token accuracy for logging."""
    logits = model(batch.src, batch.tgt_in, src_attention_mask=batch.src_mask,
                   tgt_attention_mask=batch.tgt_mask).logits  # (B, T, V)
    labels = batch.labels  # (B, T)
    loss = F.cross_entropy(at_least_fp32(logits.flatten(0, 1)), labels.flatten(), ignore_index=pad_id,
                           label_smoothing=label_smoothing)
    real = labels != pad_id
    # max's indices: argmax itself runs 2.4x slower on bf16 logits (autocast) on CPU
    right = ((logits.max(-1).indices == labels) & real).sum()
    return loss, right.item() / max(int(real.sum()), 1)


def classification_loss(model: nn.Module, batch: EncoderBatch,
                        label_smoothing: float = 0.0) -> tuple[Tensor, float]:
    """Cross-entropy over the classes, and accuracy for logging."""
    logits = model(batch.input_ids, batch.attention_mask, batch.token_type_ids).logits  # (B, C)
    loss = F.cross_entropy(at_least_fp32(logits), batch.labels, label_smoothing=label_smoothing)
    return loss, (logits.argmax(-1) == batch.labels).float().mean().item()


def forward_loss(model: nn.Module, batch: Seq2SeqBatch | EncoderBatch, label_smoothing: float = 0.0,
                 pad_id: int = PAD) -> tuple[Tensor, float]:
    """The teacher-forced loss of either batch type, and (loss, accuracy) for logging."""
    if isinstance(batch, Seq2SeqBatch):
        return seq2seq_loss(model, batch, label_smoothing, pad_id)
    return classification_loss(model, batch, label_smoothing)


def ranking_loss(model: nn.Module, batch: PairBatch) -> tuple[Tensor, float]:
    """Multiple-negatives ranking loss (Henderson et al. 2017): anchor i must score its own
    positive above every other positive (and every hard negative) of the batch.
    Returns the loss and the in-batch top-1 accuracy."""
    a = model(batch.anchor)  # (B, D)
    candidates = model(batch.positive)  # (B, D)
    if batch.negative is not None:
        candidates = torch.cat([candidates, model(batch.negative)])  # (B + N, D)
    scores = MNR_SCALE * a @ candidates.T  # (B, B + N)
    target = torch.arange(a.size(0), device=a.device)
    loss = F.cross_entropy(scores.float(), target)
    return loss, (scores.argmax(-1) == target).float().mean().item()
