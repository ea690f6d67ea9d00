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


def test_bert_layout_sets_the_layout_and_keeps_the_sizes():
    from tformer.config import BERT_LAYOUT, bert_layout

    base = TransformerConfig(d_model=64, n_heads=4, d_ff=128, n_layers=3, dropout=0.2,
                             vocab_size=100)
    config = bert_layout(base, pooler=True)
    assert {k: getattr(config, k) for k in BERT_LAYOUT} == BERT_LAYOUT
    assert (config.d_model, config.n_layers, config.vocab_size, config.pooler) == (64, 3, 100, True)
    assert config.attention_dropout == 0.2  # follows dropout, as in BERT
    assert bert_layout(base, dropout=0.0).attention_dropout == 0.0
    assert bert_layout(vocab_size=10, norm_first=True).norm_first  # changes come last


def test_check_known_keys_takes_extra_names():
    from tformer.config import check_known_keys

    check_known_keys({"d_model": 8, "lr": 1.0}, TransformerConfig, extra=["lr"])
    with pytest.raises(ValueError, match="unknown key\\(s\\) lr;"):
        check_known_keys({"lr": 1.0}, TransformerConfig)


def test_field_types_come_from_the_type_hints():
    from tformer.config import FieldType, field_types
    from tformer.errors import BadType

    types = field_types(TransformerConfig)
    assert types["d_model"] == FieldType(int) and types["vocab_size"] == FieldType(int, True)
    assert types["dropout"] == FieldType(float) and str(types["vocab_size"]) == "int | None"
    types["dropout"].check("dropout", 1)  # an int is a float
    types["vocab_size"].check("vocab_size", None)
    with pytest.raises(BadType, match="d_model: expected int, got True"):
        types["d_model"].check("d_model", True)  # a bool is not an int
    with pytest.raises(BadType, match="norm_first: expected bool, got 1"):
        types["norm_first"].check("norm_first", 1)
    assert set(types) == {f for f in TransformerConfig.__dataclass_fields__}


def test_every_activation_has_a_kernel_and_a_mirror():
    """The names live in config.ACTIVATIONS; kernels and the NumPy mirror implement each."""
    from tformer.config import ACTIVATIONS
    from tformer.nn import kernels
    from tformer.reference import feedforward as ref_feedforward

    assert tuple(kernels.ACTIVATIONS) == ACTIVATIONS == tuple(ref_feedforward.ACTIVATIONS)


@pytest.mark.parametrize("data, message", [({"d_model": -3}, "d_model: expected a positive int, got -3"),
                                           ({"d_modle": 64}, "unknown key"),
                                           ({"d_model": "wide"}, "d_model")])
def test_a_config_file_holding_a_bad_value_is_named(tmp_path, data, message):
    path = tmp_path / "config.json"
    path.write_text(json.dumps(data))
    with pytest.raises(ValueError, match=f"^{path}: .*{message}"):
        TransformerConfig.load(path)


def test_a_config_path_or_dict_of_another_kind_is_refused_naming_it(tmp_path):
    config = TransformerConfig()
    # A folder was a bare "[Errno 21] Is a directory" (for save, naming a hidden temp file).
    with pytest.raises(IsADirectoryError, match=rf"^{tmp_path}: expected a config file \(e\.g\. "
                                                rf"{tmp_path}/config\.json\), got a directory$"):
        config.save(tmp_path)
    with pytest.raises(IsADirectoryError, match=rf"^{tmp_path}: expected a config file"):
        TransformerConfig.load(tmp_path)
    for call in (config.save, TransformerConfig.load):
        with pytest.raises(TypeError, match=r"^path: expected a config file \(str or os\.PathLike\), got int$"):
            call(5)
    assert list(tmp_path.iterdir()) == []
    with pytest.raises(TypeError, match=r"^data: expected a dict of config fields, got list$"):
        TransformerConfig.from_dict([("d_model", 64)])  # was "'tuple' object ... " from inside
