"""The peer contenders of `tformer bench` (issue 11): each, built from a tiny random BERT directory
by the benchmark's own code, agrees with tformer; the worker processes answer as the harness needs.

A contender whose package is missing is skipped with the reason; so are bf16 contenders on a CPU
without bf16 instructions, and tformer dtype modes that do not exist yet.
"""

from __future__ import annotations

import importlib.util

import numpy as np
import pytest
import torch

from tformer.commands.benchmarking import corpus, peers, worker
from tformer.commands.benchmarking.harness import Measured, measure
from tformer.nn.kernels.machine import cpu_info, has_bf16
from tformer.text.tokenizer import load_tokenizer

FP32 = 1e-5  # max abs diff to tformer fp32, at tiny sizes (the benchmark holds 1e-4 at full sizes)
LOW_PRECISION = 0.99  # min cosine of int8 / bf16 contenders on the tiny model


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    """A tiny BERT (sentence-transformers layout), its ONNX export, real texts and a padded batch."""
    work = tmp_path_factory.mktemp("peers")
    corpus.write_vocab(work / "vocab", corpus.paragraphs(limit_words=20_000))
    model = corpus.write_bert(work / "model", "tiny", work / "vocab")
    corpus.write_sentence_layout(model)
    paths = peers.Paths(model, work / "model.onnx", work)
    if importlib.util.find_spec("onnxruntime") or importlib.util.find_spec("openvino"):
        peers.onnx_export(model, paths.onnx)
    tokenizer = load_tokenizer(model)
    texts = corpus.sentences(40, 3, 60, lambda t: tokenizer.lengths([t])[0])
    batch = tokenizer(texts[:6], return_tensors="np")
    threads = torch.get_num_threads()
    reference = peers.BY_NAME["tformer fp32"].load(paths, 1)
    expected = {"batch": reference.forward(*batch.values()), "sentences": reference.encode(texts)}
    yield paths, tokenizer, texts, batch, expected
    torch.set_num_threads(threads)


def test_corpus_texts_have_varied_real_lengths(tiny):
    _, tokenizer, texts, _, _ = tiny
    lengths = tokenizer.lengths(texts)
    assert min(lengths) >= 3 and max(lengths) <= 60 and len(set(lengths)) > 10
    assert all(t.strip() and t.isascii() for t in texts)


@pytest.mark.parametrize("name", [c.name for c in peers.CONTENDERS[1:]])
def test_peer_agrees_with_tformer(name, tiny, monkeypatch):
    paths, tokenizer, texts, batch, expected = tiny
    c = peers.BY_NAME[name]
    if c.package and importlib.util.find_spec(c.package) is None:
        pytest.skip(f"{c.package} is not installed")
    if c.precision == "bf16" and not has_bf16():
        pytest.skip("this CPU has no bf16 instructions")
    for key, value in c.env.items():
        monkeypatch.setenv(key, value)
    try:
        runner = c.load(paths, 1)
    except peers.Unavailable as e:
        pytest.skip(str(e))
    mask = batch["attention_mask"].astype(bool)
    outputs = {}
    if "batch" in c.tasks:
        outputs["batch"] = (runner.forward(*batch.values())[mask], expected["batch"][mask])
    if "sentences" in c.tasks:
        emb = runner.encode(texts) if runner.encode else peers.encode_with(runner.forward, tokenizer, texts)
        outputs["sentences"] = (emb, expected["sentences"])
    for task, (out, ref) in outputs.items():
        out, ref = np.asarray(out, dtype=np.float64), ref.astype(np.float64)
        assert out.shape == ref.shape, (task, out.shape, ref.shape)
        if c.precision == "fp32":
            diff = np.abs(out - ref).max()
            assert diff <= FP32, f"{name} {task}: max abs diff {diff:.2e} > {FP32:.0e}"
        cos = (out * ref).sum(-1) / (np.linalg.norm(out, axis=-1) * np.linalg.norm(ref, axis=-1))
        assert cos.min() >= LOW_PRECISION, f"{name} {task}: min cosine {cos.min():.5f}"


def test_encode_with_matches_sentence_encoder(tiny):
    """The pooling every forward-only peer gets is SentenceEncoder.encode's."""
    paths, tokenizer, texts, _, expected = tiny
    runner = peers.BY_NAME["tformer fp32"].load(paths, 1)
    emb = peers.encode_with(runner.forward, tokenizer, texts)
    assert np.abs(emb - expected["sentences"]).max() <= FP32


@pytest.mark.skipif(importlib.util.find_spec("onnxruntime") is None, reason="onnxruntime is not installed")
def test_workers_run_in_their_own_processes(tiny):
    """Each contender answers one timed call at a time (what measure() interleaves), and the
    output it reports is the one computed in-process."""
    paths, _, _, batch, expected = tiny
    inputs = paths.work / "batch.npz"
    np.savez(inputs, ids=batch["input_ids"], mask=batch["attention_mask"], types=batch["token_type_ids"])
    names = ["tformer fp32", "ONNX Runtime", "tformer int8"]
    workers, skipped = worker.start(names, "batch", inputs, paths, threads=1)
    try:
        ready = {n: w.ready() for n, w in workers.items()}
        mask = batch["attention_mask"].astype(bool)
        for n in ("tformer fp32", "ONNX Runtime"):
            assert np.abs(ready[n]["output"][mask] - expected["batch"][mask]).max() <= FP32, n
        if "skip" in ready["tformer int8"]:
            assert "tformer has no dtype='int8' mode yet" in ready["tformer int8"]["skip"]
        result = workers["ONNX Runtime"]()
        assert isinstance(result, Measured) and result.wall > 0
        timings = measure({n: workers[n] for n in ("tformer fp32", "ONNX Runtime")}, rounds=2, warmup=0)
        assert all(len(t.wall) == 2 and min(t.wall) > 0 for t in timings.values())
    finally:
        for w in workers.values():
            w.close()
    assert not skipped
    assert all(w.proc.returncode == 0 for w in workers.values())


def test_cpu_info_names_the_isa():
    cpu, isa = cpu_info()
    assert cpu and set(isa) <= {"avx2", "avx512f", "avx512_bf16", "avx512_vnni", "avx_vnni", "amx_tile",
                                "amx_bf16", "amx_int8"}
    assert has_bf16() == bool({"avx512_bf16", "amx_bf16"} & set(isa))


def test_tformer_contenders_run_on_the_cpu_where_torch_sees_a_gpu(tiny, monkeypatch):
    """The CPU suite times every contender on the CPU: on a GPU machine, SentenceEncoder's
    default device ("auto") would have timed tformer on the GPU against CPU peers (it did, on
    an H200 host: 41x ONNX Runtime)."""
    paths, _, texts, _, expected = tiny
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 1)
    runner = peers.BY_NAME["tformer fp32"].load(paths, 1)  # "auto" here: cuda:0, absent from this build
    np.testing.assert_allclose(runner.encode(texts), expected["sentences"], atol=FP32)
