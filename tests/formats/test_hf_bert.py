"""tformer.formats.hf_bert: the key table, config mapping and verify step (NumPy arrays)."""

from __future__ import annotations

import json
import subprocess
import sys

import numpy as np
import pytest
import torch
from hf_bert_fixtures import tiny_bert_config

from tformer.config import TransformerConfig
from tformer.formats import hf_bert
from tformer.nn.model import Encoder


def _hf_state(model) -> dict[str, np.ndarray]:
    return {k: v.detach().numpy().copy() for k, v in model.state_dict().items()}


def _tiny_hf(pooler: bool = True):
    from transformers import BertModel

    torch.manual_seed(0)
    return BertModel(tiny_bert_config(), add_pooling_layer=pooler).eval()


def _tiny_config(pooler: bool = True) -> TransformerConfig:
    return hf_bert.config_from_hf(tiny_bert_config().to_dict(), has_pooler=pooler)


def _bert_base():
    from transformers import BertConfig

    return BertConfig(
        vocab_size=30522,
        hidden_size=768,
        num_hidden_layers=12,
        num_attention_heads=12,
        intermediate_size=3072,
        max_position_embeddings=512,
        type_vocab_size=2,
    )


# The table ------------------------------------------------------------------------------
@pytest.mark.parametrize("pooler", [True, False])
def test_table_covers_exactly_the_keys_and_shapes_of_both_models(pooler):
    hf = _hf_state(_tiny_hf(pooler))
    config = _tiny_config(pooler)
    cleaned = hf_bert.clean_state_dict(hf)
    assert {k: tuple(v.shape) for k, v in cleaned.items()} == hf_bert.hf_shapes(config)
    ours = {k: tuple(v.shape) for k, v in Encoder(config).state_dict().items()}
    mapped = hf_bert.from_hf(hf, config, np.concatenate)
    assert {k: v.shape for k, v in mapped.items()} == ours


def test_qkv_rows_are_query_then_key_then_value():
    hf = _hf_state(_tiny_hf())
    mapped = hf_bert.from_hf(hf, _tiny_config(), np.concatenate)
    qkv = mapped["layers.1.self_attn.qkv_proj.weight"]  # (3D, D)
    assert qkv.shape == (96, 32)
    for j, name in enumerate(("query", "key", "value")):
        np.testing.assert_array_equal(
            qkv[32 * j : 32 * (j + 1)], hf[f"encoder.layer.1.attention.self.{name}.weight"]
        )


def test_to_hf_inverts_from_hf():
    hf = hf_bert.clean_state_dict(_hf_state(_tiny_hf()))
    config = _tiny_config()
    back = hf_bert.to_hf(hf_bert.from_hf(hf, config, np.concatenate), config)
    assert set(back) == set(hf)
    for k in hf:
        np.testing.assert_array_equal(back[k], hf[k])


def test_bert_base_parameter_count_matches_transformers():
    from transformers import BertModel

    hf_config = _bert_base()
    config = hf_bert.config_from_hf(hf_config.to_dict(), has_pooler=True)
    with torch.device("meta"):  # shapes only: no memory, no init time
        theirs = sum(p.numel() for p in BertModel(hf_config).parameters())
        ours = sum(p.numel() for p in Encoder(config).parameters())
    assert theirs == ours == hf_bert.parameter_count(config) == 109_482_240


# Cleaning and verifying -----------------------------------------------------------------------
def test_clean_strips_prefix_and_drops_heads_and_buffers():
    state = {
        "bert.embeddings.word_embeddings.weight": np.zeros((3, 2)),
        "bert.embeddings.position_ids": np.arange(4),
        "bert.encoder.layer.0.output.LayerNorm.gamma": np.ones(2),
        "bert.encoder.layer.0.output.LayerNorm.beta": np.zeros(2),
        "cls.predictions.bias": np.zeros(3),
    }
    assert sorted(hf_bert.clean_state_dict(state)) == [
        "embeddings.word_embeddings.weight",
        "encoder.layer.0.output.LayerNorm.bias",
        "encoder.layer.0.output.LayerNorm.weight",
    ]


def test_clean_refuses_mixed_prefixes():
    state = {"bert.embeddings.word_embeddings.weight": 0, "pooler.dense.weight": 0}
    with pytest.raises(ValueError, match=r"w\.safetensors: expected every encoder tensor under one"):
        hf_bert.clean_state_dict(state, "w.safetensors")


def test_verify_names_file_and_tensor():
    hf = hf_bert.clean_state_dict(_hf_state(_tiny_hf()))
    config = _tiny_config()
    missing = {k: v for k, v in hf.items() if k != "encoder.layer.1.output.dense.bias"}
    with pytest.raises(ValueError, match=r"^m\.st: missing tensor 'encoder\.layer\.1\.output\.dense"):
        hf_bert.verify_hf(missing, config, "m.st")
    extra = {**hf, "encoder.layer.2.output.dense.bias": np.zeros(32)}
    with pytest.raises(ValueError, match=r"^m\.st: unexpected tensor 'encoder\.layer\.2\.output"):
        hf_bert.verify_hf(extra, config, "m.st")
    wrong = {**hf, "pooler.dense.weight": np.zeros((32, 31))}
    with pytest.raises(
        ValueError,
        match=r"^m\.st: tensor 'pooler\.dense\.weight': expected shape \(32, 32\), got \(32, 31\)",
    ):
        hf_bert.verify_hf(wrong, config, "m.st")


# Config mapping -------------------------------------------------------------------------------
def test_config_mapping():
    hf = tiny_bert_config(
        hidden_dropout_prob=0.2, attention_probs_dropout_prob=0.05, layer_norm_eps=1e-7
    ).to_dict()
    c = hf_bert.config_from_hf(hf, has_pooler=True)
    assert (c.d_model, c.n_heads, c.d_ff, c.n_layers) == (32, 4, 64, 2)
    assert (c.vocab_size, c.max_len, c.type_vocab_size) == (100, 64, 2)
    assert (c.dropout, c.attention_dropout, c.layer_norm_eps) == (0.2, 0.05, 1e-7)
    assert c.positional == "learned" and c.embedding_norm and c.pooler
    assert not (c.scale_embeddings or c.norm_first or c.final_norm)
    assert c.activation == "gelu"
    back = hf_bert.config_to_hf(c)
    for key in (
        "vocab_size",
        "hidden_size",
        "num_hidden_layers",
        "num_attention_heads",
        "intermediate_size",
        "max_position_embeddings",
        "type_vocab_size",
        "layer_norm_eps",
        "hidden_dropout_prob",
        "attention_probs_dropout_prob",
    ):
        assert back[key] == hf[key], key


@pytest.mark.parametrize(
    "act, ours",
    [("gelu", "gelu"), ("gelu_new", "gelu_tanh"), ("gelu_pytorch_tanh", "gelu_tanh"), ("relu", "relu")],
)
def test_activations(act, ours):
    assert hf_bert.config_from_hf(tiny_bert_config(hidden_act=act).to_dict(), True).activation == ours


@pytest.mark.parametrize(
    "change, message",
    [
        (
            {"architectures": ["BertForQuestionAnswering"]},
            r"architectures: expected one of BertModel, BertForMaskedLM, BertForSequenceClassification, "
            r"BertForTokenClassification, got 'BertForQuestion",
        ),
        ({"model_type": "roberta"}, r"model_type: expected 'bert', got 'roberta'"),
        ({"hidden_act": "swish"}, r"hidden_act: expected one of .* got 'swish'"),
        (
            {"position_embedding_type": "relative_key"},
            r"position_embedding_type: expected 'absolute', got 'relative_key'",
        ),
        ({"is_decoder": True}, r"is_decoder: expected false"),
    ],
)
def test_unsupported_configs_name_the_key(change, message):
    hf = {**tiny_bert_config().to_dict(), **change}
    with pytest.raises(ValueError, match=r"^cfg\.json: " + message):
        hf_bert.config_from_hf(hf, True, "cfg.json")


def test_config_to_hf_refuses_what_bert_cannot_express():
    c = TransformerConfig(d_model=32, n_heads=4, d_ff=64, n_layers=1, vocab_size=10)
    with pytest.raises(ValueError, match=r"config\.positional: a BERT export needs 'learned'"):
        hf_bert.config_to_hf(c)


# The directory --------------------------------------------------------------------------------
def test_weight_files(tmp_path):
    with pytest.raises(FileNotFoundError, match=r"model\.safetensors: no such file"):
        hf_bert.weight_files(tmp_path)
    (tmp_path / "pytorch_model.bin").write_bytes(b"")
    with pytest.raises(ValueError, match=r"pytorch_model\.bin: refusing .* --allow-pickle"):
        hf_bert.weight_files(tmp_path)
    assert hf_bert.weight_files(tmp_path, allow_pickle=True) == [tmp_path / "pytorch_model.bin"]
    index = {"weight_map": {"a": "model-00002.safetensors", "b": "model-00001.safetensors"}}
    (tmp_path / "model.safetensors.index.json").write_text(json.dumps(index))
    assert [p.name for p in hf_bert.weight_files(tmp_path)] == [
        "model-00001.safetensors",
        "model-00002.safetensors",
    ]


def test_read_config_names_the_file(tmp_path):
    with pytest.raises(FileNotFoundError, match=r"config\.json: no such file"):
        hf_bert.read_config(tmp_path)


def test_imports_and_converts_without_torch():
    code = (
        "import sys; sys.modules['torch'] = None\n"  # any `import torch` now fails
        "import numpy as np\n"
        "from tformer.formats import hf_bert, st_layout\n"
        "c = hf_bert.config_from_hf({'model_type': 'bert', 'vocab_size': 10, 'hidden_size': 8,"
        " 'num_hidden_layers': 1, 'num_attention_heads': 2, 'intermediate_size': 16,"
        " 'max_position_embeddings': 4}, has_pooler=False)\n"
        "hf = {k: np.zeros(s, np.float32) for k, s in hf_bert.hf_shapes(c).items()}\n"
        "assert len(hf_bert.from_hf(hf, c, np.concatenate)) == len(hf) - 4\n"
    )
    subprocess.run([sys.executable, "-c", code], check=True)
