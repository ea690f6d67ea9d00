import json

import pytest

from tformer import TransformerConfig


def test_json_round_trip(tmp_path):
    config = TransformerConfig(d_model=64, n_heads=4, vocab_size=100, activation="gelu_tanh",
                               norm_first=True, final_norm=True, positional="learned")
    assert TransformerConfig.from_dict(config.to_dict()) == config
    config.save(tmp_path / "config.json")
    assert TransformerConfig.load(tmp_path / "config.json") == config
    assert json.loads((tmp_path / "config.json").read_text())["d_model"] == 64


@pytest.mark.parametrize("changes,error,message", [
    (dict(d_model=30, n_heads=4), ValueError, r"d_model: expected a multiple of n_heads \(4\), got 30"),
    (dict(d_ff=0), ValueError, "d_ff: expected a positive int, got 0"),
    (dict(n_layers=-1), ValueError, "n_layers: expected a positive int, got -1"),
    (dict(n_heads=2.0), TypeError, "n_heads: expected a positive int, got 2.0"),
    (dict(dropout=1.0), ValueError, r"dropout: expected a probability in \[0, 1\), got 1.0"),
    (dict(dropout=-0.1), ValueError, "dropout"),
    (dict(activation="swish"), ValueError, "activation: expected one of relu, gelu, gelu_tanh; got 'swish'"),
    (dict(positional="rope"), ValueError, "positional: expected one of"),
    (dict(vocab_size=0), ValueError, "vocab_size: expected a positive int, got 0"),
    (dict(layer_norm_eps=0), ValueError, "layer_norm_eps"),
    (dict(type_vocab_size=2), ValueError, "type_vocab_size"),
])
def test_validation(changes, error, message):
    with pytest.raises(error, match=message):
        TransformerConfig(**changes)


def test_unknown_keys_are_named(tmp_path):
    with pytest.raises(ValueError, match="unknown key.*d_modle"):
        TransformerConfig.from_dict({"d_modle": 64})
    (tmp_path / "bad.json").write_text("[1, 2]")
    with pytest.raises(ValueError, match="expected a JSON object"):
        TransformerConfig.load(tmp_path / "bad.json")
    with pytest.raises(FileNotFoundError, match="no such config file"):
        TransformerConfig.load(tmp_path / "missing.json")


def test_non_finite_layer_norm_eps_is_refused():
    with pytest.raises(ValueError, match="layer_norm_eps: expected a positive number, got inf"):
        TransformerConfig(layer_norm_eps=float("inf"))
