"""BERT's masked-LM head key table (tformer.formats.hf_bert_mlm): read from a BertForMaskedLM
directory under the names transformers has used, refused in one line when it is partial or its
decoder is not tied, absent from a BertModel's; and written back under transformers' names."""

import pytest
import torch
from hf_bert_fixtures import bert_dir, copy_dir, mlm_dir
from safetensors.torch import load_file, save_file

from tformer.formats import hf_bert_mlm
from tformer.formats.model_dir import read_model_dir


def _embeddings(directory):
    return load_file(str(directory / "model.safetensors"))["bert.embeddings.word_embeddings.weight"]


def _rewritten(tmp_path, change):
    directory = copy_dir(mlm_dir(), tmp_path / "mlm")
    state = load_file(str(directory / "model.safetensors"))
    save_file(change(dict(state)), str(directory / "model.safetensors"))
    return directory


def test_the_head_is_read_under_tformers_keys_and_written_back_under_transformers():
    md = read_model_dir(mlm_dir())
    head = hf_bert_mlm.read_head(md, _embeddings(mlm_dir()))
    state = load_file(str(mlm_dir() / "model.safetensors"))
    assert hf_bert_mlm.has_head(md) and set(head) == {ours for _, ours in hf_bert_mlm.HEAD_ROWS}
    back = hf_bert_mlm.head_to_hf(head)
    assert all(torch.equal(back[k], state[k]) for k in back)
    assert not hf_bert_mlm.has_head(read_model_dir(bert_dir()))
    assert hf_bert_mlm.read_head(read_model_dir(bert_dir()), _embeddings(mlm_dir())) is None


def test_older_names_are_read_as_the_same_tensors(tmp_path):
    def renamed(state):
        state["cls.predictions.decoder.bias"] = state.pop("cls.predictions.bias")
        prefix = "cls.predictions.transform.LayerNorm."
        state[prefix + "gamma"], state[prefix + "beta"] = state.pop(prefix + "weight"), state.pop(prefix + "bias")
        state["cls.predictions.decoder.weight"] = state["bert.embeddings.word_embeddings.weight"].clone()
        return state

    directory = _rewritten(tmp_path, renamed)
    head = hf_bert_mlm.read_head(read_model_dir(directory), _embeddings(directory))
    expected = hf_bert_mlm.read_head(read_model_dir(mlm_dir()), _embeddings(mlm_dir()))
    assert all(torch.equal(head[k], expected[k]) for k in expected)


@pytest.mark.parametrize("change, message", [
    (lambda s: {k: v for k, v in s.items() if k != "cls.predictions.transform.dense.bias"},
     r"missing tensor 'cls.predictions.transform.dense.bias' of the masked-LM head"),
    (lambda s: {**s, "cls.predictions.bias": torch.zeros(7)},
     r"tensor 'cls.predictions.bias': expected shape \(100,\), got \(7,\)"),
    (lambda s: {**s, "cls.predictions.decoder.weight": torch.ones(100, 32)},
     r"'cls.predictions.decoder.weight' differs from the word embeddings; expected a decoder tied"),
])
def test_a_partial_or_untied_head_is_refused_naming_the_file_and_tensor(tmp_path, change, message):
    directory = _rewritten(tmp_path, change)
    with pytest.raises(ValueError, match=rf"model.safetensors: {message}"):
        hf_bert_mlm.read_head(read_model_dir(directory), _embeddings(directory))
