"""tformer.embeddings.sentence: pooled (and normalised) embeddings equal to pooling transformers' output."""

from __future__ import annotations

import json
import warnings

import numpy as np
import pytest
import torch
from helpers import assert_close
from hf_bert_fixtures import SENTENCES, bert_dir, copy_dir, load_hf, st_dir

import tformer
from tformer.embeddings.sentence import SentenceEncoder
from tformer.text.tokenizer import load_tokenizer


def _hf_embeddings(directory, modes, normalize):
    """sentence-transformers' recipe, written out on transformers' BertModel output."""
    batch = load_tokenizer(directory)(SENTENCES)
    with torch.no_grad():
        h = load_hf(directory, eager=False)(**batch).last_hidden_state  # (B, S, D)
    m = batch["attention_mask"].unsqueeze(-1).float()  # (B, S, 1)
    parts = {
        "cls": h[:, 0],
        "max": torch.where(m.bool(), h, torch.tensor(-1e9)).max(dim=1).values,
        "mean": (h * m).sum(1) / m.sum(1),
    }
    emb = torch.cat([parts[k] for k in modes], dim=-1)
    if normalize:
        emb = emb / emb.norm(dim=-1, keepdim=True)
    return emb.numpy()


@pytest.mark.parametrize(
    "pooling, normalize", [("mean", True), ("cls", False), ("max", False), ("max", True)]
)
def test_matches_pooled_transformers_output(pooling, normalize):
    st = SentenceEncoder.from_pretrained(st_dir(pooling, normalize))
    assert (st.pooling, st.normalize) == ((pooling,), normalize)
    emb = st.encode(SENTENCES, batch_size=2)  # several batches, sorted by length inside
    assert emb.shape == (len(SENTENCES), 32) and emb.dtype == np.float32
    expected = _hf_embeddings(st_dir(pooling, normalize), [pooling], normalize)
    assert_close(emb, expected, what=f"{pooling} pooling")
    if normalize:
        np.testing.assert_allclose(np.linalg.norm(emb, axis=1), 1.0, atol=1e-6)


def test_plain_bert_directory_means_without_normalising():
    st = tformer.SentenceEncoder.from_pretrained(bert_dir())
    assert (st.pooling, st.normalize) == (("mean",), False)
    assert_close(st.encode(SENTENCES), _hf_embeddings(bert_dir(), ["mean"], False))


def test_batching_and_order_do_not_change_results():
    st = SentenceEncoder.from_pretrained(st_dir())
    one = np.stack([st.encode([t])[0] for t in SENTENCES])
    assert_close(st.encode(SENTENCES, batch_size=32), one, what="batch of 5 vs 5 batches of 1")
    assert_close(st.encode(SENTENCES[::-1], batch_size=3)[::-1], one, what="reversed input")


def test_normalize_argument_overrides_the_directory():
    st = SentenceEncoder.from_pretrained(st_dir())
    raw = st.encode(SENTENCES, normalize=False)
    assert not np.allclose(np.linalg.norm(raw, axis=1), 1.0)
    assert_close(raw / np.linalg.norm(raw, axis=1, keepdims=True), st.encode(SENTENCES))


def test_concatenated_poolings(tmp_path):
    d = copy_dir(st_dir(), tmp_path / "st")
    cfg = json.loads((d / "1_Pooling" / "config.json").read_text())
    cfg.update(pooling_mode_cls_token=True, pooling_mode_max_tokens=True)
    (d / "1_Pooling" / "config.json").write_text(json.dumps(cfg))
    st = SentenceEncoder.from_pretrained(d)
    assert st.pooling == ("cls", "max", "mean") and st.dim == 96
    assert_close(st.encode(SENTENCES), _hf_embeddings(d, ["cls", "max", "mean"], True))


def test_long_texts_warn_once_or_raise():
    st = SentenceEncoder.from_pretrained(st_dir())  # max_seq_length 16
    long = " ".join(["cat"] * 40)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        emb = st.encode([long, "a dog", long], batch_size=1)
    messages = [str(w.message) for w in caught]
    assert len(messages) == 1 and "2 of 3 texts" in messages[0] and "(16 tokens" in messages[0]
    assert_close(emb[0], st.encode([" ".join(["cat"] * 14)])[0], what="truncated = 16 tokens")
    with pytest.raises(ValueError, match=r"texts\[2\]: expected at most 16 tokens .* got 42"):
        st.encode(["a", "b", long], truncation=False)


def test_progress_bar(capsys):
    st = SentenceEncoder.from_pretrained(st_dir())
    st.encode(SENTENCES, batch_size=1, show_progress=False)
    assert "text" not in capsys.readouterr().err
    st.encode(SENTENCES, batch_size=1, show_progress=True)
    assert "5/5" in capsys.readouterr().err


def test_edge_cases():
    st = SentenceEncoder.from_pretrained(st_dir())
    assert st.encode([]).shape == (0, 32)
    assert st.encode("a dog").shape == (1, 32)
    with pytest.raises(ValueError, match="batch_size: expected a positive int, got 0"):
        st.encode(SENTENCES, batch_size=0)
    with pytest.raises(TypeError, match=r"texts\[0\]: expected a str, got NoneType"):
        st.encode([None])


@pytest.mark.parametrize(
    "edit, message",
    [
        (
            lambda d: _set_json(d / "1_Pooling" / "config.json", pooling_mode_lasttoken=True),
            r"1_Pooling/config\.json: pooling_mode_lasttoken is not supported",
        ),
        (
            lambda d: _set_json(d / "1_Pooling" / "config.json", pooling_mode_mean_tokens=False),
            r"1_Pooling/config\.json: expected one of .* to be true, got none",
        ),
        (
            lambda d: (d / "modules.json").write_text(
                json.dumps(
                    [
                        {"idx": 0, "path": "", "type": "sentence_transformers.models.Transformer"},
                        {"idx": 1, "path": "2_Dense", "type": "sentence_transformers.models.Dense"},
                    ]
                )
            ),
            r"modules\.json: module type 'sentence_transformers\.models\.Dense' is not supported",
        ),
        (
            lambda d: _set_json(d / "sentence_bert_config.json", max_seq_length=0),
            r"sentence_bert_config\.json: max_seq_length: expected a positive int, got 0",
        ),
    ],
)
def test_bad_sentence_transformers_layouts(tmp_path, edit, message):
    d = copy_dir(st_dir(), tmp_path / "st")
    edit(d)
    with pytest.raises(ValueError, match=message):
        SentenceEncoder.from_pretrained(d)


def _set_json(path, **changes):
    data = json.loads(path.read_text())
    data.update(changes)
    path.write_text(json.dumps(data))


def test_transformer_module_in_a_subfolder(tmp_path):
    """Older sentence-transformers folders keep the BERT in e.g. 0_BERT/."""
    d = copy_dir(st_dir(), tmp_path / "st")
    (d / "0_BERT").mkdir()
    for name in (
        "config.json",
        "model.safetensors",
        "tokenizer.json",
        "vocab.txt",
        "tokenizer_config.json",
        "sentence_bert_config.json",
    ):
        (d / name).rename(d / "0_BERT" / name)
    modules = json.loads((d / "modules.json").read_text())
    modules[0]["path"] = "0_BERT"
    (d / "modules.json").write_text(json.dumps(modules))
    st = SentenceEncoder.from_pretrained(d)
    assert st.tokenizer.max_length == 16
    assert_close(st.encode(SENTENCES), SentenceEncoder.from_pretrained(st_dir()).encode(SENTENCES))


@pytest.mark.parametrize("texts, got", [(5, "int"), (b"a text", "bytes")])
def test_encode_refuses_texts_that_are_not_str_naming_the_argument(texts, got):
    # encode(5) said "object of type 'int' has no len()".
    from tformer.embeddings.sentence import SentenceEncoder

    st = SentenceEncoder.from_pretrained(st_dir("mean", True))
    with pytest.raises(TypeError, match=rf"^texts: expected a str or an iterable of str, got {got}$"):
        st.encode(texts)


def test_a_sentence_encoder_refuses_a_bad_model_or_pooling_naming_it():
    st = SentenceEncoder.from_pretrained(st_dir())
    with pytest.raises(TypeError, match=r"^model: expected an Encoder \(tformer\.from_pretrained\) or a SentenceModel, got int$"):
        SentenceEncoder(5, st.tokenizer)  # was "'int' object has no attribute 'eval'"
    with pytest.raises(TypeError, match=r"^tokenizer: expected a tformer Tokenizer \(tformer\.load_tokenizer\), "
                                        r"got str$"):
        SentenceEncoder(st.model, "bert-base-uncased")  # was an AttributeError at the first encode
    with pytest.raises(ValueError, match=r"^pooling: expected at least one of cls, max, mean, mean_sqrt_len, "
                                         r"got none$"):
        SentenceEncoder(st.model, st.tokenizer, pooling=[])  # was a (N, 0) embedding
    one = SentenceEncoder(st.model, st.tokenizer, pooling="max")  # one mode by its name ('m', 'a', 'x' before)
    assert one.pooling == ("max",) and one.encode("a dog").shape == (1, 32)


@pytest.mark.parametrize("texts, message", [
    ([""], r"^texts\[0\]: expected a non-empty text, got ''$"),
    (["a dog", " \t"], r"^texts\[1\]: expected a non-empty text, got ' \\t'$"),
    ("  ", r"^texts: expected a non-empty text, got '  '$"),
])
def test_encode_refuses_blank_texts_as_run_embed_and_the_cli_do(texts, message):
    # encode([""]) embedded [CLS] [SEP] while run.embed, `tformer embed --file` and the server refused it.
    st = SentenceEncoder.from_pretrained(st_dir())
    with pytest.raises(ValueError, match=message):
        st.encode(texts)


@pytest.mark.parametrize("kwargs, message", [
    (dict(on_long=5), r"^on_long: expected a callable \(indices, token counts\) or None, got int$"),
    (dict(normalize="no"), r"^normalize: expected True or False or None, got 'no'$"),
    (dict(show_progress="yes"), r"^show_progress: expected True or False or None, got 'yes'$"),
    (dict(truncation=None), r"^truncation: expected True or False, got None$"),
])
def test_encode_refuses_bad_options_naming_them_before_embedding(kwargs, message):
    # on_long=5 failed only once a text was long ("'int' object is not callable"); normalize="no"
    # is truthy, and normalised.
    st = SentenceEncoder.from_pretrained(st_dir())
    for texts in (["a dog"], []):  # refused even with nothing to embed
        with pytest.raises(TypeError, match=message):
            st.encode(texts, **kwargs)
    with pytest.raises(TypeError, match=r"^normalize: expected True or False, got 'no'$"):
        SentenceEncoder(st.model, st.tokenizer, normalize="no")
    calls = []
    st.encode(["a dog " * 20], on_long=lambda indices, counts: calls.append(indices))  # a callable: taken
    assert calls == [[0]]
    assert st.encode(["a dog"], normalize=np.bool_(False), truncation=True).shape == (1, 32)


def test_a_long_encode_says_how_much_eager_work_is_left_so_compiled_kernels_may_repay(monkeypatch):
    """From its second batch on, encode expects the eager seconds its tokens left would take at
    the last batch's pace (kernels.compiling.expecting: where that repays a compilation, the
    bf16 add-and-norm runs compiled), counting a caller's texts still to come (more_to_come:
    `tformer embed` and `index build` encode 1,024 at a time); the first batch expects nothing."""
    from helpers import record_expectations

    from tformer.embeddings import sentence
    from tformer.nn.kernels.compiling import more_to_come

    st = SentenceEncoder.from_pretrained(st_dir())
    expected = record_expectations(monkeypatch, sentence)
    texts = [f"sentence number {i} " * (1 + i % 5) for i in range(40)]
    plain = st.encode(texts, batch_size=8)
    assert len(expected) == 5 and expected[0] == 0.0 and all(e > 0 for e in expected[1:])
    assert expected[1] > expected[4]  # the tokens left shrink
    alone = expected[4]
    expected.clear()
    with more_to_come(100_000):
        assert np.array_equal(st.encode(texts, batch_size=8), plain)
    assert expected[0] == 0.0 and expected[4] > 100 * alone
