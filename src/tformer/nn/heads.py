"""Encoders with a head for one job, built on tformer.nn.model's Encoder (transformers' BertFor...).

    SentenceModel   encoder + pooling (+ L2 normalisation): one vector per text
                    (sentence-transformers' Transformer -> Pooling -> Normalize)
    MaskedLM        encoder + BERT's masked-LM head: a distribution over the vocabulary at
                    each position asked for (transformers' BertForMaskedLM)
    TokenClassifier encoder + dropout + linear over each token: one row of logits per token
                    (transformers' BertForTokenClassification)
    MultiLabelClassifier  EncoderClassifier's logits, one independent yes/no per label
                    (a sigmoid each), and the probability above which each label is chosen

Shape legend: B batch, S length, N positions predicted, D model dim, V vocabulary,
C classes. Masks: True = real token (tformer.nn.masks).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from tformer.config import TransformerConfig, check_config
from tformer.nn import kernels
from tformer.nn.dropout import Dropout
from tformer.nn.model import Encoder, EncoderClassifier
from tformer.nn.outputs import ClassifierOutput
from tformer.nn.pooling import pool


class SentenceModel(nn.Module):
    """An encoder and ``config.pooling`` (sentence-transformers' modes, several concatenated), L2
    normalised where ``normalize``: one vector per text. An embedding run trains it (its ranking
    loss compares cosines) and every embedding of a text runs its forward: `tformer embed`, the
    run's ``embed``, the server and evaluation. ``encoder``: an Encoder of ``config`` to wrap
    (a loaded one), instead of a new one."""

    def __init__(self, config: TransformerConfig, normalize: bool = True,
                 encoder: Encoder | None = None) -> None:
        super().__init__()
        self.config, self.normalize = check_config(config), normalize
        self.encoder = Encoder(config) if encoder is None else encoder

    @property
    def pooling(self) -> tuple[str, ...]:
        return self.config.pooling_modes

    @property
    def dim(self) -> int:
        """The length of a vector: the width times the pooling's modes."""
        return self.config.d_model * len(self.pooling)

    def forward(self, input_ids: Tensor, attention_mask: Tensor | None = None,
                token_type_ids: Tensor | None = None, normalize: bool | None = None) -> Tensor:
        """normalize: None follows the model's own.

        Shape:
            input_ids (B, S); attention_mask (B, S) -> (B, D * len(pooling))
        """
        types = token_type_ids if self.config.type_vocab_size else None
        out = self.encoder(input_ids, attention_mask, token_type_ids=types)
        emb = pool(out.last_hidden_state, out.mask, self.pooling)  # (B, D')
        if self.normalize if normalize is None else normalize:
            emb = F.normalize(emb, p=2.0, dim=-1)
        return emb


class MaskedLMHead(nn.Module):
    """BERT's masked-LM head (Devlin et al. 2019; transformers' BertLMPredictionHead): each hidden
    state goes through a dense layer, the activation and a LayerNorm, then onto the vocabulary
    through the word-embedding matrix itself (tied to the input embeddings, as BERT's is) plus a
    bias of its own. Initialised as BERT initialises it: N(0, 0.02) weights, zero biases."""

    def __init__(self, d_model: int, vocab_size: int, activation: str = "gelu",
                 layer_norm_eps: float = 1e-12) -> None:
        super().__init__()
        self.activation = activation
        self.dense = nn.Linear(d_model, d_model)
        self.norm = nn.LayerNorm(d_model, eps=layer_norm_eps)
        self.bias = nn.Parameter(torch.zeros(vocab_size))
        nn.init.normal_(self.dense.weight, std=0.02)
        nn.init.zeros_(self.dense.bias)

    def forward(self, h: Tensor, embedding: Tensor) -> Tensor:
        """
        Shape:
            h (..., D); embedding (V, D): the word embeddings -> logits (..., V)
        """
        h = self.norm(kernels.linear(h, self.dense, self.activation))  # (..., D)
        return kernels.linear_weights(h, embedding, self.bias)  # (..., V)


class MaskedLM(nn.Module):
    """An encoder and BERT's masked-LM head (``MaskedLMHead``), tied to the encoder's token
    embeddings. A masked-LM run trains it and every prediction runs its forward: `tformer
    predict`, the run's ``predict``, the server and evaluation. ``encoder``: an Encoder of
    ``config`` to wrap (a loaded one), instead of a new one."""

    def __init__(self, config: TransformerConfig, encoder: Encoder | None = None) -> None:
        super().__init__()
        self.config = check_config(config)
        if config.vocab_size is None:
            raise ValueError("vocab_size: MaskedLM predicts tokens, it needs a vocabulary, got None")
        self.encoder = Encoder(config) if encoder is None else encoder
        self.head = MaskedLMHead(config.d_model, config.vocab_size, config.activation, config.layer_norm_eps)

    def forward(self, input_ids: Tensor, attention_mask: Tensor | None = None,
                token_type_ids: Tensor | None = None, positions: Tensor | None = None) -> Tensor:
        """positions: the places to predict, True where asked (None: every one). Only those
        reach the vocabulary: a 30k-token projection of every position would cost more than the
        encoder (Devlin et al. predict the masked positions only).

        Shape:
            input_ids (B, S); attention_mask (B, S); positions (B, S) bool
            -> logits (B, S, V), or (N, V) for the N positions asked, in row-major order
        """
        types = token_type_ids if self.config.type_vocab_size else None
        h = self.encoder(input_ids, attention_mask, token_type_ids=types).last_hidden_state  # (B, S, D)
        if positions is not None:
            h = h[positions]  # (N, D)
        return self.head(h, self.encoder.tok_emb.weight)  # (..., V)


class TokenClassifier(nn.Module):
    """An encoder, dropout and one linear layer applied to every token's vector: logits over
    ``config.n_classes`` labels per token, as transformers' BertForTokenClassification computes
    them (its ``bert``, ``dropout`` and ``classifier``: here ``encoder``, ``dropout``, ``head``).
    A run on tokens and tags trains it (each word's label on its first sub-word) and runs its forward
    everywhere it predicts. ``encoder``: an Encoder of ``config`` to wrap, instead of a new one."""

    def __init__(self, config: TransformerConfig, encoder: Encoder | None = None) -> None:
        super().__init__()
        self.config = check_config(config)
        if config.n_classes is None:
            raise ValueError("n_classes: TokenClassifier needs the number of labels, got None")
        self.encoder = Encoder(config) if encoder is None else encoder
        self.dropout = Dropout(config.dropout)
        self.head = nn.Linear(config.d_model, config.n_classes)

    def forward(self, input_ids: Tensor, attention_mask: Tensor | None = None,
                token_type_ids: Tensor | None = None, output_attentions: bool = False,
                output_hidden_states: bool = False) -> ClassifierOutput:
        """
        Shape:
            input_ids (B, S); attention_mask (B, S) -> ClassifierOutput with logits (B, S, C)
            (a padding position's row is the head's bias: its vector is zeros)
        """
        types = token_type_ids if self.config.type_vocab_size else None
        out = self.encoder(input_ids, attention_mask, token_type_ids=types,
                           output_attentions=output_attentions, output_hidden_states=output_hidden_states)
        logits = self.head(self.dropout(out.last_hidden_state))  # (B, S, C)
        return ClassifierOutput(logits, out.hidden_states, out.attentions)


class MultiLabelClassifier(EncoderClassifier):
    """EncoderClassifier's forward (logits (B, C), one per label: sigmoid(logit) is the label's
    probability, each label independent of the others), with ``thresholds`` (C,): the
    probability at or above which each label is chosen. The thresholds are not learned by the
    loss: a run's validation chooses them (tformer.kinds), and they are kept with the weights
    (a state-dict buffer), so that the best validated weights keep the thresholds chosen for
    them."""

    def __init__(self, config: TransformerConfig) -> None:
        super().__init__(config)
        self.register_buffer("thresholds", torch.full((config.n_classes,), 0.5))

    def chosen(self, logits: Tensor) -> Tensor:
        """Which labels are chosen: (B, C) logits -> (B, C) bool, sigmoid(logits) >= thresholds."""
        return torch.sigmoid(logits.float()) >= self.thresholds
