import pytest
import torch

from tformer import TransformerConfig


@pytest.fixture
def tiny_config() -> TransformerConfig:
    """The small config every test starts from (replace() what a test varies)."""
    return TransformerConfig(
        d_model=32, n_heads=4, d_ff=64, n_layers=2, dropout=0.1, max_len=64, vocab_size=50
    )


@pytest.fixture(autouse=True)
def _seed():
    torch.manual_seed(0)
