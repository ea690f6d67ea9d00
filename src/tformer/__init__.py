"""tformer: the Transformer encoder (and encoder-decoder) in PyTorch, with a NumPy mirror."""

from tformer.config import TransformerConfig

__version__ = "0.1.0"
