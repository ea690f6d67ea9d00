"""ONNX for every kind of model beyond the encoder: a classifier (logits) and the seq2seq files
in Optimum's layout (encoder, first decoder step, later steps with a KV cache), each checked
with onnxruntime (random tiny weights)."""

import numpy as np
import pytest
import torch

from tformer.config import TransformerConfig
from tformer.export import onnx as tonnx
from tformer.export.model_card import Card
from tformer.nn.generate import generate
from tformer.nn.model import EncoderClassifier, Seq2SeqTransformer

pytest.importorskip("onnxruntime")
pytest.importorskip("onnxscript")
BOS, EOS, PAD = 1, 2, 0


def _classifier():
    torch.manual_seed(0)
    config = TransformerConfig(d_model=16, n_heads=2, d_ff=32, n_layers=2, vocab_size=30, max_len=24,
                               dropout=0.0, n_classes=3, pooling="mean")
    return EncoderClassifier(config).eval()


def test_classifier_onnx_gives_the_logits(tmp_path):
    import onnxruntime as ort

    model = _classifier()
    out = tmp_path / "clf.onnx"
    diff = tonnx.export_onnx(tonnx.ClassifierGraph(model), out)
    assert diff <= tonnx.TOLERANCE
    session = ort.InferenceSession(str(out), providers=["CPUExecutionProvider"])
    assert [o.name for o in session.get_outputs()] == ["logits"]
    ids = torch.randint(3, 30, (4, 13))
    mask = torch.ones_like(ids)
    mask[1, 9:] = 0
    (got,) = session.run(None, {"input_ids": ids.numpy(), "attention_mask": mask.numpy()})
    with torch.no_grad():
        expected = model(ids, mask).logits.softmax(-1).numpy()
    probs = torch.tensor(got).softmax(-1).numpy()
    assert np.abs(probs - expected).max() <= tonnx.TOLERANCE


def _seq2seq():
    torch.manual_seed(0)
    config = TransformerConfig(d_model=16, n_heads=2, d_ff=32, n_layers=2, n_decoder_layers=2, vocab_size=24,
                               max_len=20, dropout=0.0, norm_first=True, final_norm=True)
    model = Seq2SeqTransformer(config).eval()
    with torch.no_grad():
        model.src_emb.weight.mul_(4.0)  # decisive logits: no near-ties in greedy choices
    return model


def ort_greedy(enc, dec, dec_past, ids: np.ndarray, mask: np.ndarray, max_len: int) -> list[list[int]]:
    """Greedy decoding with the three files, as Optimum (or a user outside Python) runs them."""
    (memory,) = enc.run(None, {"input_ids": ids, "attention_mask": mask})
    b = ids.shape[0]
    tokens = np.full((b, 1), BOS, dtype=np.int64)
    out = dec.run(None, {"input_ids": tokens, "encoder_hidden_states": memory, "encoder_attention_mask": mask})
    past_names = [o.name.replace("present", "past_key_values") for o in dec.get_outputs()][1:]
    cache = dict(zip(past_names, out[1:], strict=True))
    done = np.zeros(b, dtype=bool)
    rows = [[] for _ in range(b)]
    for _ in range(max_len):
        best = out[0][:, -1].argmax(-1)
        for i in range(b):
            if not done[i]:
                rows[i].append(int(best[i]))
        done |= best == EOS
        if done.all():
            break
        out = dec_past.run(None, {"input_ids": best[:, None].astype(np.int64), "encoder_attention_mask": mask,
                                  **cache})
        later = [o.name.replace("present", "past_key_values") for o in dec_past.get_outputs()][1:]
        cache.update(zip(later, out[1:], strict=True))
    return rows


@pytest.mark.slow  # ~22 s: tests/commands/test_export.py checks a seq2seq ONNX folder with its generation loop
def test_seq2seq_onnx_files_generate_the_same_token_ids(tmp_path):
    import onnxruntime as ort

    from tformer.export import onnx_seq2seq

    model = _seq2seq()
    card = Card(name="tiny", kind="seq2seq")
    out, diff = onnx_seq2seq.export_seq2seq_onnx(model, tmp_path / "onnx", card, {"tokenizer.json": b"{}"},
                                                 {"bos_id": BOS, "eos_id": EOS}, max_new_tokens=12)
    assert diff <= tonnx.TOLERANCE
    assert sorted(p.name for p in out.iterdir()) == ["README.md", "decoder_model.onnx",
                                                     "decoder_with_past_model.onnx", "encoder_model.onnx",
                                                     "tokenizer.json"]
    sessions = [ort.InferenceSession(str(out / name), providers=["CPUExecutionProvider"])
                for name in onnx_seq2seq.FILES]
    assert [o.name for o in sessions[1].get_outputs()] == ["logits", *onnx_seq2seq.cache_names("present", 2)]
    assert [o.name for o in sessions[2].get_outputs()] == ["logits", *onnx_seq2seq.cache_names("present", 2,
                                                                                             cross=False)]
    g = torch.Generator().manual_seed(5)
    ids = torch.randint(3, 24, (3, 9), generator=g)
    mask = torch.ones_like(ids)
    mask[1, 6:] = 0
    mask[2, 3:] = 0
    got = ort_greedy(*sessions, ids.numpy(), mask.numpy(), max_len=12)
    with torch.no_grad():
        expected = generate(model, ids, mask, max_len=12, bos_id=BOS, eos_id=EOS, pad_id=PAD).tolist()
    assert got == expected
    assert any(len(row) > 1 for row in got)


def test_a_failed_onnx_write_leaves_the_old_file(tmp_path, monkeypatch):
    """The file is published by files.py's temp-file-and-rename: a failure at the rename
    (a full disk, a kill) keeps the previous file and leaves no temp file."""
    from tformer.storage import files

    out = tmp_path / "clf.onnx"
    tonnx.export_onnx(tonnx.ClassifierGraph(_classifier()), out)  # an earlier export: replaceable
    old = out.read_bytes()

    def fail(what):
        if what.startswith("rename"):
            raise OSError(28, "No space left on device (injected)")

    monkeypatch.setattr(files, "fault_hook", fail)
    with pytest.raises(OSError, match="injected"):
        tonnx.export_onnx(tonnx.ClassifierGraph(_classifier()), out)
    assert out.read_bytes() == old
    assert sorted(p.name for p in tmp_path.iterdir()) == ["clf.onnx"]


def test_a_file_tformer_did_not_write_is_never_replaced(tmp_path):
    out = tmp_path / "model.onnx"
    out.write_bytes(b"a user's file")
    with pytest.raises(FileExistsError, match=r"--onnx: .*model\.onnx exists and tformer did not write it"):
        tonnx.export_onnx(tonnx.ClassifierGraph(_classifier()), out)
    assert out.read_bytes() == b"a user's file"
