"""Every endpoint against the command line's output on the same inputs, and the batching:
concurrent clients get the answers each input gets alone."""

from __future__ import annotations

import base64
import json
import random
from concurrent.futures import ThreadPoolExecutor

import numpy as np
import pytest
from hf_bert_fixtures import SENTENCES, WORDS
from serve_fixtures import request, serve

from tformer.cli import main
from tformer.embeddings.sentence import SentenceEncoder

TOL = 1e-5  # fp32
LONG = " ".join(WORDS[:30])  # past the directory's 16 tokens: cut


def _cli_lines(capsys, argv: list[str]) -> list[str]:
    capsys.readouterr()
    assert main(argv) == 0
    return capsys.readouterr().out.splitlines()


def test_embeddings_equal_tformer_embed(embedding_server, embedding_dir, capsys):
    texts = [*SENTENCES, LONG]
    cli = np.array([json.loads(line)["embedding"] for line in _cli_lines(capsys, ["embed", str(embedding_dir), *texts])])

    status, headers, tei = embedding_server.post("/embed", {"inputs": texts})
    assert status == 200 and headers["x-truncated-inputs"] == str(len(texts) - 1)
    assert np.abs(np.array(tei) - cli).max() <= TOL

    status, _, openai = embedding_server.post("/v1/embeddings", {"input": texts, "model": "any"})
    assert status == 200 and openai["object"] == "list" and openai["model"] == embedding_dir.name
    assert [d["index"] for d in openai["data"]] == list(range(len(texts)))
    assert np.abs(np.array([d["embedding"] for d in openai["data"]]) - cli).max() <= TOL
    assert openai["truncated_inputs"] == [len(texts) - 1]
    assert openai["usage"]["prompt_tokens"] == openai["usage"]["total_tokens"] > len(texts)

    status, _, b64 = embedding_server.post("/v1/embeddings", {"input": texts[0], "encoding_format": "base64"})
    vector = np.frombuffer(base64.b64decode(b64["data"][0]["embedding"]), dtype="<f4")
    assert status == 200 and np.abs(vector - cli[0]).max() <= TOL

    status, _, raw = embedding_server.post("/embed", {"inputs": texts[0], "normalize": False})
    plain = _cli_lines(capsys, ["embed", str(embedding_dir), texts[0], "--no-normalize"])
    assert status == 200 and np.abs(np.array(raw[0]) - json.loads(plain[0])["embedding"]).max() <= TOL


def test_health_info_metrics(embedding_server):
    assert embedding_server.request("GET", "/health")[:3:2] == (200, {"status": "ok"})
    status, _, info = embedding_server.request("GET", "/info")
    assert status == 200 and info["kind"] == "embedding" and info["dim"] == 32
    assert info["limits"]["max_input_tokens"] == 16 and info["dtype"] == "fp32" and info["version"]
    embedding_server.post("/embed", {"inputs": "a dog"})
    status, headers, text = embedding_server.request("GET", "/metrics")
    assert status == 200 and headers["content-type"].startswith("text/plain")
    for name in ("tformer_serve_requests_total{code=\"200\",endpoint=\"/embed\"}",
                 "tformer_serve_request_duration_seconds_bucket", "tformer_serve_batch_size_count",
                 "tformer_serve_queue_depth 0"):
        assert name in text, name


def test_64_concurrent_clients_get_their_unbatched_answers(embedding_dir):
    rng = random.Random(0)
    requests = [[" ".join(rng.choices(WORDS, k=rng.randint(1, 14))) for _ in range(rng.randint(1, 3))]
                for _ in range(64)]
    st = SentenceEncoder.from_pretrained(embedding_dir)
    alone = {t: st.encode([t], batch_size=1)[0] for r in requests for t in r}
    live = serve(embedding_dir, max_wait_ms=20)
    try:
        with ThreadPoolExecutor(64) as pool:
            answers = list(pool.map(lambda texts: request(live.port, "POST", "/embed", {"inputs": texts}),
                                    requests))
        metrics = live.request("GET", "/metrics")[2]
    finally:
        live.close()
    worst = 0.0
    for texts, (status, _, body) in zip(requests, answers, strict=True):
        assert status == 200, body
        worst = max(worst, max(np.abs(np.array(v) - alone[t]).max() for t, v in zip(texts, body, strict=True)))
    assert worst <= TOL, f"max |served - alone| = {worst:.3g}"
    count = int(next(line for line in metrics.splitlines() if line.startswith("tformer_serve_batch_size_count"))
                .split()[-1])
    assert count < sum(map(len, requests)), "no two inputs shared a batch"


def test_predict_equals_tformer_predict(classification_run, capsys):
    texts = ["the cat dog", "river road big", "a"]
    cli = [json.loads(line) for line in
           _cli_lines(capsys, ["predict", str(classification_run), *texts, "--format", "jsonl"])]
    live = serve(classification_run)
    try:
        status, _, body = live.post("/predict", {"inputs": texts})
        status_pair, _, pair = live.post("/predict", {"inputs": [{"text": "the cat", "text_pair": "a dog"}]})
        assert live.post("/embed", {"inputs": "x"})[0] == 404
    finally:
        live.close()
    assert status == 200 and status_pair == 200
    for served, expected in zip(body["predictions"], cli, strict=True):
        assert served["text"] == expected["text"] and served["label"] == expected["label"]
        for label, p in expected["probabilities"].items():
            assert served["probabilities"][label] == pytest.approx(p, abs=TOL)
    assert pair["predictions"][0]["label"] in cli[0]["probabilities"]


def test_generate_equals_tformer_generate(seq2seq_run, capsys):
    texts = ["the cat sat", "東京 %s café", "hello world, fine. yes!"]
    greedy = _cli_lines(capsys, ["generate", str(seq2seq_run), *texts])
    beam = _cli_lines(capsys, ["generate", str(seq2seq_run), *texts, "--beam-size", "2"])
    live = serve(seq2seq_run)
    try:
        one = [live.post("/generate", {"inputs": t})[2]["outputs"][0] for t in texts]
        status, _, body = live.post("/generate", {"inputs": texts})
        _, _, beamed = live.post("/generate", {"inputs": texts, "beam_size": 2})
        _, _, short = live.post("/generate", {"inputs": texts[0], "max_new_tokens": 1})
    finally:
        live.close()
    assert status == 200 and body["outputs"] == greedy == one
    assert beamed["outputs"] == beam
    assert len(short["outputs"][0].split()) <= 1
