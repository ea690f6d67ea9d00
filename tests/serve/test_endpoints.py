"""Every endpoint against the command line's output on the same inputs, and the batching:
concurrent clients get the answers each input gets alone."""

from __future__ import annotations

import base64
import json
import random
from concurrent.futures import ThreadPoolExecutor

import numpy as np
import pytest
from cli_helpers import cli_lines
from hf_bert_fixtures import SENTENCES, WORDS
from serve_fixtures import request, serve

from tformer.embeddings.sentence import SentenceEncoder

TOL = 1e-5  # fp32
LONG = " ".join(WORDS[:30])  # past the directory's 16 tokens: cut


def test_embeddings_equal_tformer_embed(embedding_server, embedding_dir, capsys):
    texts = [*SENTENCES, LONG]
    cli = np.array([json.loads(line)["embedding"] for line in cli_lines(capsys, ["embed", str(embedding_dir), *texts])])

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
    plain = cli_lines(capsys, ["embed", str(embedding_dir), texts[0], "--no-normalize"])
    assert status == 200 and np.abs(np.array(raw[0]) - json.loads(plain[0])["embedding"]).max() <= TOL


def test_health_info_metrics(embedding_server):
    assert embedding_server.request("GET", "/health")[:3:2] == (200, {"status": "ok"})
    status, _, info = embedding_server.request("GET", "/info")
    assert status == 200 and info["kind"] == "embedding" and info["dim"] == 32
    assert info["max_input_length"] == 16 and info["max_client_batch_size"] == 256
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


def test_predict_answers_teis_shapes_with_tformer_predicts_scores(classification_server, classification_run,
                                                                  capsys):
    texts = ["the cat dog", "river road big", "a"]
    cli = [json.loads(line) for line in
           cli_lines(capsys, ["predict", str(classification_run), *texts, "--format", "jsonl"])]
    status, _, one = classification_server.post("/predict", {"inputs": texts[0]})
    status_batch, _, batch = classification_server.post("/predict", {"inputs": [[t] for t in texts]})
    status_raw, _, raw = classification_server.post("/predict", {"inputs": texts[0], "raw_scores": True})
    assert (status, status_batch, status_raw) == (200, 200, 200)
    assert len(batch) == len(texts)
    # one text alone and in a batch: the same labels, scores equal up to the kernels' summation
    # order (the linear and attention kernels are chosen per shape class, measured on the machine)
    assert [s["label"] for s in one] == [s["label"] for s in batch[0]]
    assert [s["score"] for s in one] == pytest.approx([s["score"] for s in batch[0]], abs=TOL)
    for served, expected in zip(batch, cli, strict=True):
        assert served[0]["label"] == expected["label"]  # best first
        assert [s["score"] for s in served] == sorted((s["score"] for s in served), reverse=True)
        for s in served:
            assert s["score"] == pytest.approx(expected["probabilities"][s["label"]], abs=TOL)
    logits = {s["label"]: s["score"] for s in raw}
    softmax = np.exp(list(logits.values())) / np.exp(list(logits.values())).sum()
    assert np.abs(softmax - [cli[0]["probabilities"][label] for label in logits]).max() <= TOL
    assert classification_server.post("/embed", {"inputs": "x"})[0] == 404


def test_predict_counts_pairs_and_singles_as_the_run_encodes_them(classification_server, monkeypatch):
    served = classification_server.app.state.service.served
    status, _, body = classification_server.post("/predict", {"inputs": ["the cat", "a dog"]})
    assert served.pairs is False and status == 422  # this run was trained on single texts
    assert body["error"]["message"].startswith("input[0].text_pair: this run was trained on single texts")
    monkeypatch.setattr(served.objective.source.data, "pairs", True)
    tokenizer = served.tokenizer
    items = served.admit([{"text": "the cat"}, {"text": "the cat", "text_pair": "a dog"}], True)
    single, pair = tokenizer.encode(["the cat", "the cat"], [None, "a dog"])
    assert [i.n for i in items] == [len(single.ids), len(pair.ids)]


def test_a_text_read_only_to_its_reach_is_told_as_truncated(embedding_server):
    """A word of 40,000 characters is one [UNK] to the reach, "hello world" after it never read:
    3 tokens, under the 16 of the directory, so it was not named as truncated."""
    texts = ["a dog", "a" * 40_000 + " hello world"]
    status, headers, _ = embedding_server.post("/embed", {"inputs": texts})
    assert status == 200 and headers["x-truncated-inputs"] == "1"
    status, _, openai = embedding_server.post("/v1/embeddings", {"input": texts})
    assert status == 200 and openai["truncated_inputs"] == [1]


def test_long_inputs_are_counted_at_admission_and_handed_on_as_prefixes(classification_server, seq2seq_server,
                                                                         monkeypatch):
    """A 130 kB text (alone, in a pair, as a seq2seq source) is counted at admission as the run
    counts it (a lower bound: "N or more") and handed to the model thread as the prefix its cut
    needs (Tokenizer.prefixes): the model's answer is the one for the whole text."""
    from tformer.kinds.classification import probabilities
    from tformer.kinds.serving import TooLong
    from tformer.text.prefix import AtLeast, reach

    long = " ".join(["the cat sat on the mat"] * 6000)
    served = classification_server.app.state.service.served
    monkeypatch.setattr(served.objective.source.data, "pairs", True)
    records = [{"text": long}, {"text": long, "text_pair": long + " dog"}, {"text": "a dog", "text_pair": long},
               {"text": "a dog", "text_pair": ""}]
    items = served.admit(records, True)
    # Two long texts sharing an odd budget (LongestFirst gives the odd token to the longer) are read
    # no further than the reach either (tformer.text.prefix.pair_window): each then taken as read.
    budget = served.max_input_tokens - served.tokenizer.backend.num_special_tokens_to_add(True)
    assert [isinstance(i.full, AtLeast) for i in items] == [True, True, True, False]
    sizes = [len(i.payload["text"]) + len(i.payload.get("text_pair", "")) for i in items]
    assert sizes[0] < 40_000 and sizes[1] <= 2 * reach(budget) < len(long) and sizes[2] < 40_000
    whole = probabilities(served.objective.predict(served.model, records))  # (its logits)
    assert np.abs(np.array(served.run_batch([i.payload for i in items])) - whole).max() <= 1e-6
    counted = served.tokenizer.encode([r["text"] for r in records], [r.get("text_pair") or None for r in records])
    assert [i.full for i in items] == [e.full for e in counted] and items[3].full == len(counted[3].ids)
    seq2seq = seq2seq_server.app.state.service.served
    (item,) = seq2seq.admit([long], True)
    assert isinstance(item.full, AtLeast) and item.full > seq2seq.max_input_tokens and len(item.payload) < 40_000
    assert seq2seq.run_batch([item.payload], (1, 8, 1.0, False)) == seq2seq.run_batch([long], (1, 8, 1.0, False))
    with pytest.raises(TooLong, match=rf"^input\[0\]: expected at most {seq2seq.max_input_tokens} tokens, "
                       rf"got {int(item.full)} or more \(send truncate"):
        seq2seq.admit([long], False)


def test_generate_speaks_tgi_and_equals_tformer_generate(seq2seq_server, seq2seq_run, capsys):
    texts = ["the cat sat", "東京 %s café", "hello world, fine. yes!"]
    greedy = cli_lines(capsys, ["generate", str(seq2seq_run), *texts])
    beam = cli_lines(capsys, ["generate", str(seq2seq_run), *texts, "--beam-size", "2"])
    early = cli_lines(capsys, ["generate", str(seq2seq_run), *texts, "--beam-size", "3", "--early-stopping"])
    live = seq2seq_server
    one = [live.post("/generate", {"inputs": t})[2]["generated_text"] for t in texts]
    status, _, listed = live.post("/generate", {"inputs": texts})
    _, _, beamed = live.post("/generate", {"inputs": texts, "parameters": {"beam_size": 2}})
    _, _, stopped = live.post("/generate", {"inputs": texts, "parameters": {"beam_size": 3,
                                                                           "early_stopping": True}})
    _, _, short = live.post("/generate", {"inputs": texts[0], "parameters": {"max_new_tokens": 1,
                                                                             "details": True}})
    _, _, compat = live.post("/", {"inputs": texts[0], "parameters": {}, "stream": False})
    assert status == 200 and [x["generated_text"] for x in listed] == greedy == one
    assert [x["generated_text"] for x in beamed] == beam and compat == [{"generated_text": greedy[0]}]
    assert [x["generated_text"] for x in stopped] == early
    assert len(short["generated_text"].split()) <= 1
    assert short["details"]["finish_reason"] in ("length", "eos_token")
    assert short["details"]["generated_tokens"] <= 1


def test_generate_cuts_at_a_stop_sequence():
    from tformer.kinds.serving import Item
    from tformer.serve.tgi_api import _answer

    class Served:  # counts words as tokens
        output_tokens = staticmethod(lambda texts: [len(t.split()) for t in texts])

    extra = {"stop": ["xyz", "sat"], "details": True, "max_new_tokens": 10}
    out = _answer("the cat sat on", Item(3, 3, None), extra, Served())
    assert out["generated_text"] == "the cat " and out["details"]["finish_reason"] == "stop_sequence"
    out = _answer("the cat", Item(3, 3, None), dict(extra, max_new_tokens=2), Served())
    assert out["details"]["finish_reason"] == "length" and out["details"]["generated_tokens"] == 2


def test_tokenize_gives_the_ids_that_embed_the_same(embedding_server):
    status, _, tokens = embedding_server.post("/tokenize", {"inputs": ["the cat sat", "a dog"]})
    assert status == 200 and tokens[0][0]["special"] and not tokens[0][1]["special"]
    assert [t["text"] for t in tokens[0] if not t["special"]] == ["the", "cat", "sat"]
    assert tokens[0][1]["start"] == 0 and tokens[0][1]["stop"] == 3
    ids = [t["id"] for t in tokens[0]]
    by_text = embedding_server.post("/embed", {"inputs": "the cat sat"})[2]
    by_ids = embedding_server.post("/embed", {"inputs": ids})[2]
    openai = embedding_server.post("/v1/embeddings", {"input": [ids, "the cat sat"]})[2]
    assert np.abs(np.array(by_ids) - by_text).max() <= TOL
    assert np.abs(np.array(openai["data"][0]["embedding"]) - by_text[0]).max() <= TOL
    assert openai["usage"]["prompt_tokens"] == 2 * len(ids)


def test_info_names_the_protocols_fields_and_no_path(embedding_server, classification_server, seq2seq_server):
    for live in (embedding_server, classification_server, seq2seq_server):
        status, _, info = live.request("GET", "/info")
        assert status == 200 and info["model_id"] == info["model"] and info["version"]
        text = json.dumps(info)
        assert "/tmp" not in text and str(live.app.state.service.config.model) not in text
    assert embedding_server.request("GET", "/info")[2]["model_type"] == {"embedding": {"pooling": "mean"}}
    labels = classification_server.request("GET", "/info")[2]["model_type"]["classifier"]["id2label"]
    assert list(labels.values()) == classification_server.app.state.service.served.labels
    assert seq2seq_server.request("GET", "/info")[2]["max_stop_sequences"] == 4
