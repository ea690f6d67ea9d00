"""tformer: the Transformer encoder (and encoder-decoder) in PyTorch, with a NumPy mirror.

    from tformer import TransformerConfig, Encoder
    enc = Encoder(TransformerConfig(d_model=64, n_heads=4, d_ff=256, n_layers=2))

    run = tformer.train(data="train.jsonl", max_minutes=10)   # or data=[{...}, ...]
    run.predict(["a text"])            # run.generate / run.embed / run.evaluate
    tformer.ClassificationRun          # each kind's Run class, from tformer.kinds

Everything but the config is imported lazily, so `tformer.reference` works without torch.
"""

from __future__ import annotations

import importlib

from tformer.config import TransformerConfig

__version__ = "0.1.0"

# public name -> module that defines it
_LAZY = {
    "Encoder": "tformer.nn.model",
    "Decoder": "tformer.nn.model",
    "EncoderOutput": "tformer.nn.model",
    "DecoderOutput": "tformer.nn.model",
    "Seq2SeqTransformer": "tformer.nn.model",
    "Seq2SeqOutput": "tformer.nn.model",
    "EncoderClassifier": "tformer.nn.model",
    "ClassifierOutput": "tformer.nn.model",
    "MultiHeadAttention": "tformer.nn.attention",
    "scaled_dot_product_attention": "tformer.nn.attention",
    "FeedForward": "tformer.nn.feedforward",
    "EncoderLayer": "tformer.nn.layers",
    "DecoderLayer": "tformer.nn.layers",
    "SinusoidalPositionalEncoding": "tformer.nn.positional",
    "LearnedPositionalEmbedding": "tformer.nn.positional",
    "from_pretrained": "tformer.nn.model",
    "compile_model": "tformer.nn.kernels.compiling",
    "save_pretrained": "tformer.formats.pretrained",
    "export_hf": "tformer.formats.pretrained",
    "load_tokenizer": "tformer.text.tokenizer",
    "SentenceEncoder": "tformer.embeddings.sentence",
    "train": "tformer.kinds.api",
    "load_run": "tformer.kinds",
    "Run": "tformer.kinds",
}

__all__ = ["TransformerConfig", *_LAZY]


def __getattr__(name: str):
    if name in _LAZY:
        return getattr(importlib.import_module(_LAZY[name]), name)
    if name.endswith("Run"):  # a kind's Run class: tformer.kinds knows them all
        kinds = importlib.import_module("tformer.kinds")
        if name in kinds.run_classes():
            return kinds.run_classes()[name]
    raise AttributeError(f"module 'tformer' has no attribute {name!r}")


def __dir__() -> list[str]:
    return sorted(__all__)
