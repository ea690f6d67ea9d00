"""The NumPy reference: a mirror of tformer's PyTorch modules, with a backward pass.

Same file names, class names, attribute names and state-dict keys; imports without torch.
Each module's ``forward_train`` returns a cache and its ``backward`` the gradients (see
reference/module.py); loss.py, optim.py and train.py train a model in NumPy alone.

    from tformer.reference import Encoder
    ref = Encoder(config, dtype=np.float64)
    ref.load_state_dict({k: v.numpy() for k, v in torch_encoder.state_dict().items()})
    ref.load_safetensors("model.safetensors")  # or straight from a file
"""

from tformer.reference.attention import MultiHeadAttention, scaled_dot_product_attention
from tformer.reference.feedforward import FeedForward
from tformer.reference.layers import DecoderLayer, EncoderLayer
from tformer.reference.model import (
    ClassifierOutput,
    Decoder,
    DecoderOutput,
    Encoder,
    EncoderClassifier,
    EncoderOutput,
    Seq2SeqOutput,
    Seq2SeqTransformer,
)
from tformer.reference.module import Module
from tformer.reference.positional import LearnedPositionalEmbedding, SinusoidalPositionalEncoding
from tformer.reference.pretrained import from_pretrained

__all__ = [
    "ClassifierOutput", "Decoder", "DecoderLayer", "DecoderOutput", "Encoder",
    "EncoderClassifier", "EncoderLayer", "EncoderOutput", "FeedForward",
    "LearnedPositionalEmbedding", "Module", "MultiHeadAttention", "Seq2SeqOutput",
    "Seq2SeqTransformer", "SinusoidalPositionalEncoding", "scaled_dot_product_attention",
    "from_pretrained",
]
