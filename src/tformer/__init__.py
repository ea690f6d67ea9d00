"""tformer: the Transformer encoder (and encoder-decoder) in PyTorch, with a NumPy mirror.

    from tformer import TransformerConfig, Encoder
    enc = Encoder(TransformerConfig(d_model=64, n_heads=4, d_ff=256, n_layers=2))

    run = tformer.train(data="train.jsonl", max_minutes=10)   # or data=[{...}, ...]
    run.predict(["a text"])            # run.generate / run.embed / run.evaluate

Everything but the config is imported lazily, so `tformer.reference` works without torch.
"""

from __future__ import annotations

import importlib

from tformer.config import TransformerConfig

__version__ = "0.1.0"

# public name -> module that defines it
_LAZY = {
    "Encoder": "tformer.model",
    "Decoder": "tformer.model",
    "EncoderOutput": "tformer.model",
    "DecoderOutput": "tformer.model",
    "Seq2SeqTransformer": "tformer.model",
    "Seq2SeqOutput": "tformer.model",
    "EncoderClassifier": "tformer.model",
    "ClassifierOutput": "tformer.model",
    "MultiHeadAttention": "tformer.attention",
    "scaled_dot_product_attention": "tformer.attention",
    "FeedForward": "tformer.feedforward",
    "EncoderLayer": "tformer.layers",
    "DecoderLayer": "tformer.layers",
    "SinusoidalPositionalEncoding": "tformer.positional",
    "LearnedPositionalEmbedding": "tformer.positional",
    "from_pretrained": "tformer.model",
    "compile_model": "tformer.compiling",
    "save_pretrained": "tformer.pretrained",
    "export_hf": "tformer.pretrained",
    "load_tokenizer": "tformer.tokenizer",
    "SentenceEncoder": "tformer.sentence",
    "train": "tformer.api",
    "load_run": "tformer.api",
    "Run": "tformer.api",
}

__all__ = ["TransformerConfig", *_LAZY]


def __getattr__(name: str):
    if name in _LAZY:
        return getattr(importlib.import_module(_LAZY[name]), name)
    raise AttributeError(f"module 'tformer' has no attribute {name!r}")


def __dir__() -> list[str]:
    return sorted(__all__)
