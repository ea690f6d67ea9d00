import pytest
import torch
from torch.utils.flop_counter import FlopCounterMode

from tformer import TransformerConfig
from tformer.config.sizes import flops_per_token, parameter_count
from tformer.nn.heads import MaskedLM
from tformer.nn.model import Encoder, EncoderClassifier, Seq2SeqTransformer


@pytest.mark.parametrize("seq", [16, 64])
def test_flops_match_torch_flop_counter(seq):
    """Our analytic count vs PyTorch's own counter of matmul/attention FLOPs."""
    config = TransformerConfig(d_model=64, n_heads=4, d_ff=256, n_layers=2, dropout=0.0,
                               positional="none")
    enc = Encoder(config).eval()
    x = torch.randn(2, seq, 64)
    # output_attentions: the explicit matmul path, which the counter sees (it does not
    # count the CPU flash-attention kernel).
    with FlopCounterMode(display=False) as counter, torch.no_grad():
        enc(x, output_attentions=True)
    assert counter.get_total_flops() == flops_per_token(config, seq) * 2 * seq


def test_parameter_count_matches_module(tiny_config):
    assert parameter_count(tiny_config) == sum(p.numel() for p in Encoder(tiny_config).parameters())


@pytest.mark.parametrize("model", ["encoder", "seq2seq", "classifier", "masked_lm"])
@pytest.mark.parametrize("changes", [{}, {"n_layers": 3, "n_decoder_layers": 2},
                                     {"norm_first": True, "final_norm": True, "bias": False},
                                     {"positional": "learned", "tie_output": False,
                                      "tgt_vocab_size": 30, "n_classes": 3}])
def test_parameter_count_matches_the_built_module(tiny_config, model, changes):
    config = tiny_config.replace(**{"n_classes": 4, **changes})
    built = {"encoder": Encoder, "seq2seq": Seq2SeqTransformer, "classifier": EncoderClassifier,
             "masked_lm": MaskedLM}[model]
    assert parameter_count(config, model) == sum(p.numel() for p in built(config).parameters())


@pytest.mark.parametrize("changes", [{"type_vocab_size": 2, "embedding_norm": True, "pooler": True,
                                      "positional": "learned"}, {"positional": "none", "vocab_size": None}])
def test_parameter_count_matches_bert_shaped_encoders(tiny_config, changes):
    config = tiny_config.replace(**changes)
    assert parameter_count(config) == sum(p.numel() for p in Encoder(config).parameters())


def test_a_masked_lm_adds_its_head_on_the_share_of_tokens_predicted():
    """BERT's head (dense, then the tied vocabulary projection) runs on the 15% of tokens
    predicted: 3 of 20 here, as PyTorch's own counter counts its products."""
    config = TransformerConfig(d_model=64, n_heads=4, d_ff=256, n_layers=2, vocab_size=96)
    model, seq = MaskedLM(config).eval(), 20
    h = torch.randn(3, 64)  # the 3 positions predicted (N, D)
    with FlopCounterMode(display=False) as counter, torch.no_grad():
        model.head(h, model.encoder.tok_emb.weight)
    head = (flops_per_token(config, seq, "masked_lm") - flops_per_token(config, seq)) * seq
    assert counter.get_total_flops() == head
