"""tformer.formats.pretrained: BERT checkpoints give transformers' numbers; save / export round trips.

Compared on real (non-padding) tokens with tests.helpers' tolerance (float32: 1e-5).
"""

from __future__ import annotations

import json

import pytest
import torch
from helpers import assert_close
from hf_bert_fixtures import (
    SENTENCES,
    bert_dir,
    copy_dir,
    load_hf,
    make_bert_dir,
    mlm_dir,
    st_dir,
)
from safetensors.torch import load_file, save_file

import tformer
from tformer.config import TransformerConfig
from tformer.embeddings.sentence import SentenceEncoder
from tformer.formats.pretrained import export_hf, save_pretrained
from tformer.nn.model import Encoder, from_pretrained
from tformer.text.tokenizer import load_tokenizer


def _run_both(directory, model=None, **kwargs):
    """tformer's and transformers' outputs on the padded batch of SENTENCES."""
    batch = load_tokenizer(directory)(SENTENCES)
    model = model if model is not None else from_pretrained(directory)
    with torch.no_grad():
        ours = model(
            batch["input_ids"],
            attention_mask=batch["attention_mask"],
            token_type_ids=batch["token_type_ids"],
            **kwargs,
        )
        theirs = load_hf(directory)(**batch, **kwargs)
    return batch, ours, theirs


def test_bert_matches_transformers_everywhere():
    batch, ours, theirs = _run_both(bert_dir(), output_attentions=True, output_hidden_states=True)
    real = batch["attention_mask"].bool()  # (B, S)
    assert not real.all(), "the batch must hold padding"
    assert_close(ours.last_hidden_state, theirs.last_hidden_state, where=real, what="last_hidden_state")
    assert len(ours.hidden_states) == len(theirs.hidden_states) == 3
    for i, (a, b) in enumerate(zip(ours.hidden_states, theirs.hidden_states, strict=True)):
        assert_close(a, b, where=real, what=f"hidden_states[{i}]")
    assert len(ours.attentions) == 2
    for i, (a, b) in enumerate(zip(ours.attentions, theirs.attentions, strict=True)):
        s = real.shape[1]
        assert a.shape == b.shape == (len(SENTENCES), 4, s, s)
        # (B, H, S, S): real query rows, all keys (padding keys get weight 0 in both)
        assert_close(a.transpose(1, 2), b.transpose(1, 2), where=real, what=f"attentions[{i}]")
    assert_close(ours.pooler_output, theirs.pooler_output, what="pooler_output")


def test_masked_lm_checkpoint_loads_without_its_head():
    keys = load_file(str(mlm_dir() / "model.safetensors")).keys()
    assert any(k.startswith("cls.") for k in keys) and all(k.startswith(("bert.", "cls.")) for k in keys)
    model = from_pretrained(mlm_dir())
    assert model.pooler is None  # BertForMaskedLM has none
    batch, ours, theirs = _run_both(mlm_dir(), model=model)
    real = batch["attention_mask"].bool()
    assert_close(ours.last_hidden_state, theirs.last_hidden_state, where=real)
    assert ours.pooler_output is None


def test_sequence_classifier_checkpoint_loads_its_encoder_without_its_head(tmp_path):
    """A BertForSequenceClassification directory (what `export --hf` writes for a classifier
    with BERT's pooler) gives its encoder: transformers' BertModel numbers, pooler included, in
    PyTorch and in the NumPy mirror (float32, 1e-5)."""
    import numpy as np

    from tformer import reference

    d = make_bert_dir(tmp_path / "clf", arch="BertForSequenceClassification", seed=3, num_labels=3)
    keys = load_file(str(d / "model.safetensors")).keys()
    assert any(k.startswith("classifier.") for k in keys)
    model = from_pretrained(d)
    batch, ours, theirs = _run_both(d, model=model)
    real = batch["attention_mask"].bool()
    assert_close(ours.last_hidden_state, theirs.last_hidden_state, where=real, what="last_hidden_state")
    assert_close(ours.pooler_output, theirs.pooler_output, what="pooler_output")
    mirror = reference.from_pretrained(d)(*(batch[k].numpy() for k in ("input_ids", "attention_mask")),
                                          token_type_ids=batch["token_type_ids"].numpy())
    assert_close(mirror.last_hidden_state, theirs.last_hidden_state, np.float32, where=real,
                 what="NumPy mirror")


@pytest.mark.parametrize("act", ["gelu_new", "relu"])
def test_other_activations_match(tmp_path, act):
    d = make_bert_dir(tmp_path / act, hidden_act=act, layer_norm_eps=1e-6)
    model = from_pretrained(d)
    assert model.config.activation == {"gelu_new": "gelu_tanh", "relu": "relu"}[act]
    assert model.config.layer_norm_eps == 1e-6
    batch, ours, theirs = _run_both(d, model=model)
    real = batch["attention_mask"].bool()
    assert_close(ours.last_hidden_state, theirs.last_hidden_state, where=real)


def test_public_names_forward_here():
    a = tformer.from_pretrained(bert_dir())
    b = Encoder.from_pretrained(bert_dir())
    assert isinstance(a, Encoder) and not a.training
    for (ka, va), (kb, vb) in zip(a.state_dict().items(), b.state_dict().items(), strict=True):
        assert ka == kb and torch.equal(va, vb)


def test_sentence_transformers_layout_loads_the_root_model():
    model = from_pretrained(st_dir())
    assert model.config.d_model == 32 and model.pooler is not None


def test_dtype():
    model = from_pretrained(bert_dir(), dtype=torch.float64)
    assert all(p.dtype == torch.float64 for p in model.parameters())


# Round trips ----------------------------------------------------------------------------------
def test_save_pretrained_round_trip(tmp_path):
    model = from_pretrained(bert_dir())
    save_pretrained(model, tmp_path / "ours")
    saved = json.loads((tmp_path / "ours" / "config.json").read_text())
    assert TransformerConfig.from_dict(saved) == model.config
    assert set(load_file(str(tmp_path / "ours" / "model.safetensors"))) == set(model.state_dict())
    again = from_pretrained(tmp_path / "ours")
    for k, v in model.state_dict().items():
        assert torch.equal(v, again.state_dict()[k]), k
    model.save_pretrained(tmp_path / "method")  # the Encoder method forwards here
    assert (tmp_path / "method" / "model.safetensors").is_file()


def test_export_hf_round_trip(tmp_path):
    """tformer -> HF directory -> transformers loads it -> same outputs."""
    torch.manual_seed(3)
    config = TransformerConfig(
        d_model=32,
        n_heads=4,
        d_ff=64,
        n_layers=2,
        vocab_size=100,
        max_len=64,
        positional="learned",
        scale_embeddings=False,
        type_vocab_size=2,
        embedding_norm=True,
        pooler=True,
        activation="gelu_tanh",
        layer_norm_eps=1e-6,
    )
    model = Encoder(config).eval()
    export_hf(model, tmp_path / "hf")
    hf = load_hf(tmp_path / "hf")
    assert sum(p.numel() for p in hf.parameters()) == sum(p.numel() for p in model.parameters())
    ids = torch.randint(0, 100, (3, 9))
    mask = torch.ones(3, 9, dtype=torch.long)
    mask[1, 5:] = 0
    types = torch.zeros(3, 9, dtype=torch.long)
    types[:, 4:] = 1
    with torch.no_grad():
        ours = model(ids, attention_mask=mask, token_type_ids=types)
        theirs = hf(input_ids=ids, attention_mask=mask, token_type_ids=types)
    assert_close(ours.last_hidden_state, theirs.last_hidden_state, where=mask.bool())
    assert_close(ours.pooler_output, theirs.pooler_output)
    # ...and tformer reads its own export back, bit for bit.
    again = from_pretrained(tmp_path / "hf")
    for k, v in model.state_dict().items():
        assert torch.equal(v, again.state_dict()[k]), k


def test_export_refuses_a_non_bert_config(tmp_path):
    model = Encoder(TransformerConfig(d_model=32, n_heads=4, d_ff=64, n_layers=1, vocab_size=10))
    with pytest.raises(ValueError, match=r"config\.positional: a BERT export needs 'learned'"):
        export_hf(model, tmp_path)


def test_pickle_checkpoint_needs_allow_pickle(tmp_path):
    d = copy_dir(bert_dir(), tmp_path / "m")
    state = load_file(str(d / "model.safetensors"))
    (d / "model.safetensors").unlink()
    torch.save(state, d / "pytorch_model.bin")
    with pytest.raises(ValueError, match=r"pytorch_model\.bin: refusing to load a pickle"):
        from_pretrained(d)
    for truthy in ("no", "false", 1):  # truthy, and would have let the pickle in
        with pytest.raises(TypeError, match=rf"^allow_pickle: expected True or False, got {truthy!r}$"):
            from_pretrained(d, allow_pickle=truthy)
        with pytest.raises(TypeError, match="^allow_pickle: "):
            SentenceEncoder.from_pretrained(d, allow_pickle=truthy)
    model = from_pretrained(d, allow_pickle=True)
    ref = from_pretrained(bert_dir())
    for k, v in ref.state_dict().items():
        assert torch.equal(v, model.state_dict()[k]), k


def test_sharded_safetensors(tmp_path):
    d = copy_dir(bert_dir(), tmp_path / "m")
    state = load_file(str(d / "model.safetensors"))
    (d / "model.safetensors").unlink()
    keys = sorted(state)
    shards = {"model-00001-of-00002.safetensors": keys[:10], "model-00002-of-00002.safetensors": keys[10:]}
    for name, part in shards.items():
        save_file({k: state[k] for k in part}, str(d / name), metadata={"format": "pt"})
    weight_map = {k: name for name, part in shards.items() for k in part}
    (d / "model.safetensors.index.json").write_text(json.dumps({"weight_map": weight_map}))
    model = from_pretrained(d)
    assert torch.equal(model.tok_emb.weight, state["embeddings.word_embeddings.weight"])


# Bad directories: one-line errors naming the file and the tensor -------------------------------
def _rewrite(directory, change):
    path = directory / "model.safetensors"
    state = load_file(str(path))
    change(state)
    save_file(state, str(path), metadata={"format": "pt"})


def test_missing_directory_and_config(tmp_path):
    with pytest.raises(FileNotFoundError, match=r"nope: no such model directory"):
        from_pretrained(tmp_path / "nope")
    with pytest.raises(FileNotFoundError, match=r"config\.json: no such file"):
        from_pretrained(tmp_path)


def test_unsupported_architecture(tmp_path):
    d = copy_dir(bert_dir(), tmp_path / "m")
    cfg = json.loads((d / "config.json").read_text())
    cfg["architectures"] = ["BertForQuestionAnswering"]
    (d / "config.json").write_text(json.dumps(cfg))
    with pytest.raises(ValueError, match=r"config\.json: architectures: expected one of BertModel"):
        from_pretrained(d)


def test_config_that_is_neither_format(tmp_path):
    d = copy_dir(bert_dir(), tmp_path / "m")
    (d / "config.json").write_text(json.dumps({"hidden_size": 32}))
    with pytest.raises(ValueError, match=r"expected a BERT config .* or a tformer config"):
        from_pretrained(d)


def test_missing_tensor(tmp_path):
    d = copy_dir(bert_dir(), tmp_path / "m")
    _rewrite(d, lambda s: s.pop("encoder.layer.1.attention.self.key.bias"))
    with pytest.raises(
        ValueError,
        match=r"model\.safetensors: missing tensor 'encoder\.layer\.1\."
        r"attention\.self\.key\.bias'",
    ):
        from_pretrained(d)


def test_extra_tensor(tmp_path):
    d = copy_dir(bert_dir(), tmp_path / "m")
    _rewrite(d, lambda s: s.update({"encoder.layer.7.output.dense.bias": torch.zeros(32)}))
    with pytest.raises(ValueError, match=r"model\.safetensors: unexpected tensor 'encoder\.layer\.7"):
        from_pretrained(d)


def test_wrong_shape(tmp_path):
    d = copy_dir(bert_dir(), tmp_path / "m")
    _rewrite(d, lambda s: s.update({"embeddings.position_embeddings.weight": torch.zeros(60, 32)}))
    with pytest.raises(
        ValueError,
        match=r"model\.safetensors: tensor 'embeddings\.position_embeddings\.weight': "
        r"expected shape \(64, 32\), got \(60, 32\)",
    ):
        from_pretrained(d)


def test_wrong_shape_in_tformer_format(tmp_path):
    save_pretrained(from_pretrained(bert_dir()), tmp_path / "ours")
    _rewrite(tmp_path / "ours", lambda s: s.update({"pooler.bias": torch.zeros(31)}))
    with pytest.raises(ValueError, match=r"tensor 'pooler\.bias': expected shape \(32,\), got \(31,"):
        from_pretrained(tmp_path / "ours")


def test_corrupt_safetensors(tmp_path):
    d = copy_dir(bert_dir(), tmp_path / "m")
    (d / "model.safetensors").write_bytes(b"garbage")
    with pytest.raises(ValueError, match=r"model\.safetensors: not a readable safetensors file"):
        from_pretrained(d)


def test_saved_directories_carry_the_tokenizer(tmp_path):
    model = from_pretrained(bert_dir())
    save_pretrained(model, tmp_path / "ours", tokenizer_dir=bert_dir())
    export_hf(model, tmp_path / "hf", tokenizer_dir=bert_dir())
    expected = tformer.SentenceEncoder.from_pretrained(bert_dir()).encode(SENTENCES)
    for d in (tmp_path / "ours", tmp_path / "hf"):
        assert (d / "tokenizer.json").is_file() and (d / "vocab.txt").is_file()
        assert_close(tformer.SentenceEncoder.from_pretrained(d).encode(SENTENCES), expected, what=str(d))
    (tmp_path / "x").mkdir()
    with pytest.raises(FileNotFoundError, match=r"tokenizer_dir .*x: no tokenizer\.json or vocab\.txt"):
        save_pretrained(model, tmp_path / "x", tokenizer_dir=tmp_path / "x")


# Crash safety: a saved directory is one unit, and bad weight files are one-line errors ----
def _tiny_encoder(**kw):
    torch.manual_seed(0)
    return Encoder(TransformerConfig(d_model=16, n_heads=2, d_ff=32, n_layers=1, vocab_size=20, **kw))


def test_save_pretrained_interrupted_keeps_the_old_directory_whole(tmp_path, monkeypatch):
    from tformer.storage import files

    out = tmp_path / "model"
    save_pretrained(_tiny_encoder(activation="relu"), out)
    for k in (1, 2, 3):  # each file, then the swap
        steps = []

        def crash(what, k=k, steps=steps):
            steps.append(what)
            if len(steps) == k:
                raise OSError(28, "No space left on device", what)

        monkeypatch.setattr(files, "fault_hook", crash)
        with pytest.raises(OSError):
            save_pretrained(_tiny_encoder(activation="gelu"), out)
        # Same shapes, different activation: a mixed directory would load silently wrong.
        assert TransformerConfig.load(out / "config.json").activation == "relu", k
        assert sorted(p.name for p in tmp_path.iterdir()) == ["model"], k  # no temp dirs left
    monkeypatch.setattr(files, "fault_hook", None)
    save_pretrained(_tiny_encoder(activation="gelu"), out)
    assert from_pretrained(out).config.activation == "gelu"


def test_saved_files_follow_the_umask(tmp_path):
    import os

    old = os.umask(0o022)
    try:
        save_pretrained(_tiny_encoder(), tmp_path / "m")
    finally:
        os.umask(old)
    assert (tmp_path / "m").stat().st_mode & 0o777 == 0o755
    for p in (tmp_path / "m").iterdir():
        assert p.stat().st_mode & 0o777 == 0o644, p


def test_save_pretrained_refuses_a_folder_of_other_files(tmp_path):
    (tmp_path / "notes.txt").write_text("mine")
    with pytest.raises(ValueError, match=r"holds files a saved model does not \(notes\.txt\)"):
        save_pretrained(_tiny_encoder(), tmp_path)
    assert [p.name for p in tmp_path.iterdir()] == ["notes.txt"]


def test_nan_weights_are_refused(tmp_path):
    save_pretrained(_tiny_encoder(), tmp_path / "m")
    state = load_file(str(tmp_path / "m" / "model.safetensors"))
    state["tok_emb.weight"][3, 1] = float("inf")
    save_file(state, str(tmp_path / "m" / "model.safetensors"))
    with pytest.raises(ValueError, match=r"'tok_emb\.weight' holds NaN or infinite values"):
        from_pretrained(tmp_path / "m")


@pytest.mark.parametrize("payload", [b"garbage", b"\x80\x02cos\nsystem\nq\x00X\x02\x00\x00\x00idq\x01\x85q\x02Rq\x03."])
def test_garbage_or_malicious_pickle_is_one_line(tmp_path, capsys, payload):
    from tformer.commands.cli import main

    d = copy_dir(bert_dir(), tmp_path / "m")
    (d / "model.safetensors").unlink()
    (d / "pytorch_model.bin").write_bytes(payload)
    assert main(["embed", str(d), "hi", "--allow-pickle"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "pytorch_model.bin: not a loadable weights-only pickle" in err


# Sizes are checked before anything is allocated -------------------------------------------
def _edit_config(d, **changes):
    config = json.loads((d / "config.json").read_text())
    (d / "config.json").write_text(json.dumps({**config, **changes}))


def test_huge_bert_config_is_refused_before_allocating(tmp_path):
    d = copy_dir(bert_dir(), tmp_path / "m")
    _edit_config(d, num_hidden_layers=10**7)
    with pytest.raises(ValueError, match=r"config\.json: num_hidden_layers: expected at most the 2 layers"):
        from_pretrained(d)


def test_huge_tformer_config_is_refused_from_the_header(tmp_path):
    save_pretrained(_tiny_encoder(), tmp_path / "m")
    _edit_config(tmp_path / "m", n_layers=10**6)
    with pytest.raises(ValueError, match=r"n_layers: expected at most the 1 layers"):
        from_pretrained(tmp_path / "m")
    _edit_config(tmp_path / "m", n_layers=1, d_ff=48)  # same keys, other shapes
    with pytest.raises(ValueError, match=r"'layers\.0\.ffn\.up\.weight': expected shape \(48, 16\), got \(32, 16\)"):
        from_pretrained(tmp_path / "m")


def test_model_too_large_for_memory_is_refused_with_the_number():
    from tformer.config.sizes import check_fits

    config = TransformerConfig(d_model=65536, n_heads=8, d_ff=262144, n_layers=64, vocab_size=10)
    with pytest.raises(ValueError, match=r"config: [\d,]+ parameters need [\d,.]+ GiB .* available"):
        check_fits(config)


def test_bert_config_errors_name_the_bert_key_and_file(tmp_path):
    d = copy_dir(bert_dir(), tmp_path / "m")
    _edit_config(d, max_position_embeddings=0)
    with pytest.raises(ValueError, match=r"m/config\.json: max_position_embeddings: expected a positive int, got 0"):
        from_pretrained(d)


def test_empty_vocab_txt_is_a_clear_error(tmp_path):
    d = copy_dir(bert_dir(), tmp_path / "m")
    (d / "tokenizer.json").unlink(missing_ok=True)
    (d / "vocab.txt").write_text("")
    with pytest.raises(ValueError, match=r"vocab\.txt: expected a WordPiece vocabulary .* got an empty file"):
        load_tokenizer(d)


def test_a_run_directory_gives_its_encoder_and_a_translation_run_is_refused(tmp_path):
    """A trained classifier's or sentence model's run: its encoder, with the weights
    tformer.load_run reads (best.safetensors); the head is left out, as a BERT checkpoint's
    masked-LM head is. A source+target run has no encoder of that shape: one line naming load_run."""
    from helpers import write_run

    from tformer.nn.model import EncoderClassifier, Seq2SeqTransformer
    from tformer.storage.checkpoint_names import latest_checkpoint

    config = TransformerConfig(d_model=16, n_heads=2, d_ff=32, n_layers=2, dropout=0.0, vocab_size=40,
                               max_len=16)
    torch.manual_seed(0)
    saved, best = EncoderClassifier(config.replace(n_classes=3)), EncoderClassifier(config.replace(n_classes=3))
    run = write_run(tmp_path / "cls", saved, best)
    encoder = from_pretrained(run)
    ids = torch.randint(4, 40, (2, 6))
    with torch.no_grad():
        assert torch.equal(encoder(ids).last_hidden_state, best.eval().encoder(ids).last_hidden_state)
    checkpoint = latest_checkpoint(run)  # a checkpoint directory itself: its own weights
    assert torch.equal(from_pretrained(checkpoint).tok_emb.weight, saved.encoder.tok_emb.weight)
    translation = write_run(tmp_path / "s2s", Seq2SeqTransformer(config))
    with pytest.raises(ValueError, match=r"^\S+model\.safetensors: expected an encoder's weights, got a "
                                         r"Seq2SeqTransformer's .*tformer\.load_run\(RUN_DIR\)$"):
        from_pretrained(translation)


class _RunLike:  # what tformer.load_run gives: a model under .model, a TrainConfig under .config
    config = object()

    def export(self, **kwargs):
        raise AssertionError("not called")


@pytest.mark.parametrize("write", [save_pretrained, export_hf])
@pytest.mark.parametrize("model, message", [
    ("x", r"^model: expected a tformer model \(an nn\.Module with a TransformerConfig, e\.g\. an Encoder\), "
          r"got str$"),
    (_RunLike(), r"got _RunLike; a run exports with run\.export\(hf=DIR\), its model is run\.model$"),
])
def test_writing_something_other_than_a_model_is_refused_naming_model(tmp_path, write, model, message):
    # "x" was "'str' object has no attribute 'config'"; a run, an AttributeError about its TrainConfig.
    with pytest.raises(TypeError, match=message):
        write(model, tmp_path / "out")
    assert not (tmp_path / "out").exists()


@pytest.mark.parametrize("write", [save_pretrained, export_hf])
def test_writing_to_a_path_of_another_type_is_refused_naming_it(tmp_path, write):
    model = Encoder(TransformerConfig(d_model=16, n_heads=2, d_ff=32, n_layers=1, vocab_size=50,
                                      positional="learned"))
    with pytest.raises(TypeError, match=r"^directory: expected a directory \(str or os\.PathLike\), got int$"):
        write(model, 5)
    with pytest.raises(TypeError, match=r"^tokenizer_dir: expected a model directory \(str or os\.PathLike\), "
                                        r"got int$"):
        write(model, tmp_path / "out", tokenizer_dir=5)
    assert not (tmp_path / "out").exists()


@pytest.mark.parametrize("read", [from_pretrained, load_tokenizer, tformer.SentenceEncoder.from_pretrained])
def test_reading_a_path_of_another_type_is_refused_naming_it(read):
    # pathlib's bare "expected str, bytes or os.PathLike object, not int" before.
    with pytest.raises(TypeError, match=r"^(path|directory): expected a model directory \(str or os\.PathLike\), "
                                        r"got int$"):
        read(5)


def test_from_pretrained_refuses_a_dtype_of_another_type():
    # 5 reached model.to(5): "Cannot access accelerator device when none is available".
    with pytest.raises(TypeError, match=r"^dtype: expected a precision \(fp32, bf16, int8\), a torch\.dtype or "
                                        r"None, got 5$"):
        from_pretrained(bert_dir(), dtype=5)
