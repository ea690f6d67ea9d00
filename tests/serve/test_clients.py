"""The real clients, unchanged, against a loopback server: the `openai` package (embeddings,
models, completions) and huggingface_hub's InferenceClient pointed at the server's URL as at a
TEI or TGI server (feature_extraction, sentence_similarity, text_classification, text_generation)."""

from __future__ import annotations

import json
import warnings

import numpy as np
import pytest
from cli_helpers import cli_lines
from hf_bert_fixtures import SENTENCES, WORDS

openai = pytest.importorskip("openai")
hub = pytest.importorskip("huggingface_hub")

TOL = 1e-5  # fp32
LONG = " ".join(WORDS[:30])  # past the directory's 16 tokens: cut


def _openai(live):
    return openai.OpenAI(base_url=f"{live.url}/v1", api_key="unused", max_retries=0, timeout=30)


def test_openai_client_gets_tformer_embeds_embeddings(embedding_server, embedding_dir, capsys):
    texts = [*SENTENCES, LONG]
    cli = np.array([json.loads(line)["embedding"] for line in cli_lines(capsys, ["embed", str(embedding_dir),
                                                                              *texts])])
    client = _openai(embedding_server)
    answer = client.embeddings.create(input=texts, model=embedding_dir.name)  # base64 on the wire
    floats = client.embeddings.create(input=texts[0], model="any", encoding_format="float")
    assert np.abs(np.array([d.embedding for d in answer.data]) - cli).max() <= TOL
    assert np.abs(np.array(floats.data[0].embedding) - cli[0]).max() <= TOL
    assert answer.usage.prompt_tokens == answer.usage.total_tokens > len(texts)
    ids = [t["id"] for t in embedding_server.post("/tokenize", {"inputs": texts[0]})[2][0]]
    by_ids = client.embeddings.create(input=[ids], model="any")  # token-id input
    assert np.abs(np.array(by_ids.data[0].embedding) - cli[0]).max() <= TOL
    assert by_ids.usage.prompt_tokens == len(ids)


def test_openai_client_lists_the_model(embedding_server, embedding_dir):
    client = _openai(embedding_server)
    assert [m.id for m in client.models.list().data] == [embedding_dir.name]
    assert client.models.retrieve(embedding_dir.name).id == embedding_dir.name
    with pytest.raises(openai.NotFoundError):
        client.models.retrieve("another-model")


def test_openai_client_completions_with_full_usage(seq2seq_server, seq2seq_run, capsys):
    texts = ["the cat sat", "hello world, fine. yes!"]
    expected = cli_lines(capsys, ["generate", str(seq2seq_run), *texts])
    answer = _openai(seq2seq_server).completions.create(model="any", prompt=texts)
    assert [c.text for c in answer.choices] == expected
    usage = answer.usage
    assert usage.prompt_tokens > 0 and usage.completion_tokens >= len(texts)
    assert usage.total_tokens == usage.prompt_tokens + usage.completion_tokens


def test_inference_client_feature_extraction(embedding_server, embedding_dir, capsys):
    texts = SENTENCES[:3]
    cli = np.array([json.loads(line)["embedding"] for line in cli_lines(capsys, ["embed", str(embedding_dir),
                                                                              *texts])])
    client = hub.InferenceClient(model=embedding_server.url, timeout=30)
    one = client.feature_extraction(texts[0])
    many = client.feature_extraction(texts, normalize=True, truncate=True)
    assert one.shape == (1, cli.shape[1]) and np.abs(one[0] - cli[0]).max() <= TOL
    assert np.abs(many - cli).max() <= TOL
    # the endpoint's own URL, as a user may copy it, with or without its slash
    for url in (f"{embedding_server.url}/embed", f"{embedding_server.url}/embed/", f"{embedding_server.url}/"):
        got = hub.InferenceClient(model=url, timeout=30).feature_extraction(texts[0])
        assert np.abs(got[0] - cli[0]).max() <= TOL, url


def test_inference_client_sentence_similarity(embedding_server, embedding_dir, capsys):
    texts = SENTENCES[:4]
    cli = np.array([json.loads(line)["embedding"] for line in cli_lines(capsys, ["embed", str(embedding_dir),
                                                                              *texts])], dtype=np.float64)
    unit = cli / np.linalg.norm(cli, axis=1, keepdims=True)
    client = hub.InferenceClient(model=embedding_server.url, timeout=30)
    answer = client.sentence_similarity(texts[0], other_sentences=texts[1:])
    assert np.abs(np.array(answer) - unit[1:] @ unit[0]).max() <= TOL
    status, _, refused = embedding_server.post("/", {"inputs": {"source_sentence": "a", "sentences": [3]}})
    assert status == 422 and refused["error"]["param"] == "inputs.sentences[0]"


def test_inference_client_text_classification(classification_server, classification_run, capsys):
    text = "the cat dog"
    cli = json.loads(cli_lines(capsys, ["predict", str(classification_run), text, "--format", "jsonl"])[0])
    client = hub.InferenceClient(model=classification_server.url, timeout=30)
    answer = client.text_classification(text)
    assert answer[0].label == cli["label"] and len(answer) == len(cli["probabilities"])
    for element in answer:
        assert element.score == pytest.approx(cli["probabilities"][element.label], abs=TOL)
    top = client.text_classification(text, top_k=1)
    assert [e.label for e in top] == [cli["label"]]


def test_inference_client_text_generation(seq2seq_server, seq2seq_run, capsys):
    text = "the cat sat"
    expected = cli_lines(capsys, ["generate", str(seq2seq_run), text])[0]
    client = hub.InferenceClient(model=seq2seq_server.url, timeout=30)
    assert client.text_generation(text) == expected
    assert client.text_generation(text, max_new_tokens=64) == expected
    details = client.text_generation(text, details=True)
    assert details.generated_text == expected and details.details.finish_reason in ("eos_token", "length")
    with warnings.catch_warnings(record=True) as caught:  # sampling: dropped, as for any non-TGI server
        warnings.simplefilter("always")
        assert client.text_generation(text, temperature=0.5) == expected
    assert any("temperature" in str(w.message) for w in caught)
