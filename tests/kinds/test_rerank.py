"""The reranking kind: tiny runs on a query's candidates (grouped) and on query/passage/label rows,
the listwise loss against its formula, the metrics and BM25 baseline, Run.rerank, the exports
loaded by sentence-transformers and onnxruntime with the run's scores, TEI's /rerank, the
`tformer rerank` command, and bad records."""

from __future__ import annotations

import json
import math

import numpy as np
import pytest
import torch
from cli_helpers import assert_one_line_error, cli_lines, run_cli
from crossencoder_fixtures import TINY, flat_rows, rerank_rows
from text_fixtures import write

import tformer
from tformer.kinds import kind_of_fields
from tformer.kinds.reranking import FIELDS, grouped
from tformer.training.ranking import BM25, rank_metrics

TOL = 1e-4
QUERY, PASSAGES = "cat sat", ["the cat sat on a mat", "東京 hello world, fine.", "red house", "cat"]


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    root = tmp_path_factory.mktemp("rerank")
    return {"grouped": tformer.train(data=rerank_rows(), out=str(root / "g"), **TINY),
            "flat": tformer.train(data=flat_rows(), out=str(root / "f"), **TINY)}


def test_either_form_is_one_record():
    assert kind_of_fields(["query", "positive", "negatives"], "x").name == "reranking"
    assert kind_of_fields(["query", "passage", "label"], "x").name == "reranking"
    assert FIELDS.check("f:1", {"query": "q", "positive": "p", "negatives": ["n1", "n2"]}) == {
        "query": "q", "passages": ["p", "n1", "n2"], "relevance": [1.0, 0.0, 0.0]}
    assert FIELDS.check("f:2", {"query": "q", "passage": "p", "label": "2"}) == {
        "query": "q", "passages": ["p"], "relevance": [2.0]}
    rows = [FIELDS.check("f", r) for r in flat_rows(3)]
    merged = grouped(rows)
    assert len(merged) == 3 and [len(g["passages"]) for g in merged] == [4, 4, 4]
    assert merged[0]["relevance"] == [2.0, 1.0, 0.0, 0.0]


@pytest.mark.parametrize("record, message", [
    ({"query": "q", "positive": "p"}, r"negatives: expected a list of at least one text, got nothing"),
    ({"query": "q", "positive": "p", "negatives": "n"}, r"negatives: expected a list of at least one text, got str"),
    ({"query": "q", "positive": "p", "negatives": []}, r"negatives: expected a list of at least one text"),
    ({"query": "q", "positive": "p", "negatives": ["n", 3]}, r"negatives\[1\]: expected text, got 3"),
    ({"query": "q", "passage": "p", "label": -1}, r"label: expected a relevance, a number >= 0 .*got -1"),
    ({"query": "q", "passage": "p", "label": "yes"}, r"label: expected a relevance, .*got 'yes'"),
    ({"query": "q", "passage": "p"}, r"label: expected a relevance, .*got None"),
    ({"query": "q", "passage": "p", "label": 1, "positive": "x"}, r"expected positive\+negatives or passage\+label, got both"),
    ({"query": "q", "text": "p"}, r"expected positive\+negatives \(a query's candidates\) or passage\+label"),
    ({"query": "", "passage": "p", "label": 1}, r"query: expected text, got an empty string"),
])
def test_a_bad_record_is_refused_naming_the_line(tmp_path, capsys, record, message):
    rows = rerank_rows(20)
    rows[4] = record
    data = write(tmp_path / "train.jsonl", rows)
    rc, _, err = run_cli(capsys, "train", "--data", data, "--out", tmp_path / "run", "--steps", "1")
    assert_one_line_error(rc, err, "train", rf"{data}:5: {message}")


def test_the_listwise_loss_is_each_querys_softmax_cross_entropy(runs):
    """Two queries of 3 and 2 candidates (listwise), one row alone (its binary cross-entropy)."""
    run = runs["flat"]
    objective = run.objective
    records = [{"query": "cat", "passages": ["a", "b", "c"], "relevance": [0.0, 2.0, 1.0]},
               {"query": "dog", "passages": ["d", "e"], "relevance": [1.0, 0.0]},
               {"query": "fish", "passages": ["f"], "relevance": [1.0]}]
    batch = objective.collate(objective.encode(records))
    model = run.model.train(False)
    loss, accuracy = objective.loss(model, batch)
    with torch.no_grad():
        logits = model(batch.pairs.input_ids, batch.pairs.attention_mask, batch.pairs.token_type_ids).logits[:, 0]
    x = logits.double().tolist()
    first = -(2 / 3 * (x[1] - math.log(sum(map(math.exp, x[:3])))) + 1 / 3 * (x[2] - math.log(sum(map(math.exp, x[:3])))))
    second = -(x[3] - math.log(math.exp(x[3]) + math.exp(x[4])))
    top = 2.0  # the highest relevance of the training data: a grade of 1 is half relevant
    # a relevance of 1 among grades up to 2: target 0.5; no irrelevant candidate alone: weight 1
    third = -(0.5 * math.log(1 / (1 + math.exp(-x[5]))) + 0.5 * math.log(1 - 1 / (1 + math.exp(-x[5]))))
    assert run.objective.source.data.tally["max_relevance"] == top
    assert loss.item() == pytest.approx((first + second + third) / 3, abs=1e-5)
    best = [max(range(3), key=x.__getitem__) in (1, 2), x[3] > x[4]]
    assert accuracy == pytest.approx(sum(best) / 2)


def test_rerank_is_the_evaluations_forward(runs):
    for run in runs.values():
        examples = run.examples("test")
        assert len({r["query"] for r in examples}) == len(examples)  # one record per query
        logits = run.objective.predict(run.model, examples)
        first = run.rerank(examples[0]["query"], examples[0]["passages"])
        expected = [1 / (1 + math.exp(-v)) for v in logits[0]]
        assert [r["index"] for r in first] == sorted(range(len(expected)), key=lambda i: -expected[i])
        assert [r["score"] for r in first] == pytest.approx(sorted(expected, reverse=True), abs=1e-6)
        metrics = run.evaluate()
        assert metrics["mrr_at_10"] == pytest.approx(
            rank_metrics(zip(logits, [r["relevance"] for r in examples], strict=True))["mrr_at_10"], abs=1e-9)
        raw = run.rerank(QUERY, PASSAGES, raw=True)
        scored = run.rerank(QUERY, PASSAGES)
        assert [r["index"] for r in raw] == [r["index"] for r in scored]
        assert [1 / (1 + math.exp(-r["score"])) for r in raw] == pytest.approx([r["score"] for r in scored])


def test_the_baseline_is_bm25_of_the_test_split(runs):
    run = runs["grouped"]
    test = run.examples("test")
    record = run.test_record()
    passages = list(dict.fromkeys(p for r in test for p in r["passages"]))
    bm25 = BM25(passages)
    expected = rank_metrics((bm25.scores(r["query"], [passages.index(p) for p in r["passages"]]), r["relevance"])
                            for r in test)["mrr_at_10"]
    assert record["baseline"] == pytest.approx(expected) and record["baseline_by"].startswith("BM25")


def test_the_hf_export_ranks_as_the_run(runs, tmp_path):
    from sentence_transformers import CrossEncoder

    run = runs["grouped"]
    out = run.export(hf=tmp_path / "hf")
    model = CrossEncoder(str(out), local_files_only=True)
    assert type(model.activation_fn).__name__ == "Sigmoid"
    theirs = model.rank(QUERY, PASSAGES)
    ours = run.rerank(QUERY, PASSAGES)
    assert [r["corpus_id"] for r in theirs] == [r["index"] for r in ours]
    assert np.abs(np.array([r["score"] for r in theirs]) - [r["score"] for r in ours]).max() <= TOL


def test_the_onnx_export_gives_the_scores(runs, tmp_path):
    ort = pytest.importorskip("onnxruntime")
    from tokenizers import Tokenizer

    run = runs["flat"]
    out = run.export(onnx=tmp_path / "onnx")
    tok = Tokenizer.from_file(str(out / "tokenizer.json"))
    session = ort.InferenceSession(str(out / "model.onnx"), providers=["CPUExecutionProvider"])
    ours = {r["index"]: r["score"] for r in run.rerank(QUERY, PASSAGES)}
    for i, passage in enumerate(PASSAGES):
        enc = tok.encode(QUERY, passage)
        feed = {"input_ids": [enc.ids], "attention_mask": [enc.attention_mask], "token_type_ids": [enc.type_ids]}
        _, scores = session.run(None, {x.name: np.array(feed[x.name], dtype=np.int64) for x in session.get_inputs()})
        assert abs(float(scores[0]) - ours[i]) <= TOL


def test_the_server_answers_teis_rerank(runs):
    pytest.importorskip("uvicorn")
    from serve_fixtures import serve

    run = runs["grouped"]
    live = serve(run.path)
    try:
        ours = run.rerank(QUERY, PASSAGES)
        status, _, body = live.post("/rerank", {"query": QUERY, "texts": PASSAGES})
        assert status == 200 and [set(r) for r in body] == [{"index", "score"}] * len(PASSAGES)
        assert [r["index"] for r in body] == [r["index"] for r in ours]
        assert [r["score"] for r in body] == pytest.approx([r["score"] for r in ours], abs=1e-5)
        status, _, shown = live.post("/", {"query": QUERY, "texts": PASSAGES, "return_text": True,
                                           "raw_scores": True})
        assert status == 200 and [list(r) for r in shown] == [["index", "text", "score"]] * len(PASSAGES)
        assert [r["text"] for r in shown] == [PASSAGES[r["index"]] for r in ours]
        raw = {r["index"]: r["score"] for r in run.rerank(QUERY, PASSAGES, raw=True)}
        assert [r["score"] for r in shown] == pytest.approx([raw[r["index"]] for r in shown], abs=1e-5)
        status, _, predicted = live.post("/predict", {"inputs": [QUERY, PASSAGES[0]]})
        assert status == 200 and predicted[0]["score"] == pytest.approx(
            next(r["score"] for r in ours if r["index"] == 0), abs=1e-5)
        status, _, info = live.request("GET", "/info")
        assert info["kind"] == "reranking" and "reranker" in info["model_type"]
        for body, field in (({"texts": ["a"]}, "query"), ({"query": "q", "texts": []}, "texts"),
                            ({"query": "q", "texts": ["a"], "top_n": 1}, "top_n"),
                            ({"query": " ", "texts": ["a"]}, "query")):
            status, _, error = live.post("/rerank", body)
            assert status == 422 and error["error"]["message"].startswith(f"{field}:"), error
        status, _, error = live.post("/predict", {"inputs": "a text alone"})
        assert status == 422 and "a reranker scores a pair" in error["error"]["message"]
    finally:
        live.close()


def test_the_command_prints_passages_best_first(runs, capsys, tmp_path):
    run = runs["grouped"]
    ours = run.rerank(QUERY, PASSAGES)
    file = tmp_path / "passages.txt"
    file.write_text("\n".join(PASSAGES[1:]) + "\n")
    lines = cli_lines(capsys, ["rerank", str(run.path), "--query", QUERY, PASSAGES[0], "--file", str(file)])
    assert [line.split("\t", 1)[1] for line in lines] == [PASSAGES[r["index"]] for r in ours]
    assert [float(line.split("\t")[0]) for line in lines] == pytest.approx([r["score"] for r in ours], abs=1e-6)
    top = [json.loads(x) for x in cli_lines(capsys, ["rerank", str(run.path), "--query", QUERY, *PASSAGES,
                                                     "--format", "jsonl", "--top-k", "2"])]
    assert [(r["index"], r["text"]) for r in top] == [(r["index"], PASSAGES[r["index"]]) for r in ours[:2]]
    file.write_text("a passage\n\nanother\n")
    rc, _, err = run_cli(capsys, "rerank", run.path, "--query", QUERY, "--file", file)
    assert_one_line_error(rc, err, "rerank", rf"{file}:2")
    rc, _, err = run_cli(capsys, "rerank", runs["grouped"].path, "--query", "  ", "a")
    assert_one_line_error(rc, err, "rerank", r"--query: expected a non-empty text")


def test_a_reranking_run_is_not_a_classifier(runs, capsys):
    rc, _, err = run_cli(capsys, "predict", runs["grouped"].path, "a text")
    assert_one_line_error(rc, err, "predict", r"use `tformer rerank ")


def test_the_pointwise_loss_weights_the_relevant_candidates(runs, monkeypatch):
    """LOSS "pointwise": every candidate's binary cross-entropy against its relevance / the
    highest, the relevant ones weighted by the irrelevant ones per relevant one."""
    from tformer.kinds import reranking

    monkeypatch.setattr(reranking, "LOSS", "pointwise")
    run = runs["grouped"]
    records = [{"query": "cat", "passages": ["a", "b", "c", "d"], "relevance": [1.0, 0.0, 0.0, 0.0]}]
    batch = run.objective.collate(run.objective.encode(records))
    loss, _ = run.objective.loss(run.model.train(False), batch)
    with torch.no_grad():
        x = run.model(batch.pairs.input_ids, batch.pairs.attention_mask,
                      batch.pairs.token_type_ids).logits[:, 0].double().tolist()
    def sig(v):
        return 1 / (1 + math.exp(-v))
    expected = (-3 * math.log(sig(x[0])) - sum(math.log(1 - sig(v)) for v in x[1:])) / 4
    assert loss.item() == pytest.approx(expected, abs=1e-5)


@pytest.fixture(scope="module")
def emb(tmp_path_factory):
    from text_fixtures import embedding_rows

    return tformer.train(data=embedding_rows(), out=str(tmp_path_factory.mktemp("emb") / "emb"), **TINY)


def test_search_retrieves_then_reranks(runs, emb, tmp_path, capsys):
    """`tformer search EMB --corpus F --rerank RUN` and `search INDEX --rerank RUN`: each query's
    --rerank-top retrieved lines reordered by the reranker's scores, its best -k printed."""
    corpus = tmp_path / "corpus.txt"
    corpus.write_text("\n".join(PASSAGES) + "\n")
    run = runs["grouped"]
    expected = [(PASSAGES[r["index"]], r["score"]) for r in run.rerank(QUERY, PASSAGES)[:2]]
    assert cli_lines(capsys, ["index", "build", str(emb.path), "--corpus", str(corpus), "--out",
                              str(tmp_path / "idx")]) is not None
    for target in ([str(emb.path), "--corpus", str(corpus)], [str(tmp_path / "idx")]):
        lines = cli_lines(capsys, ["search", *target, QUERY, "--rerank", str(run.path), "-k", "2",
                                   "--format", "jsonl"])
        got = [json.loads(x) for x in lines]
        assert [(r["text"], r["rank"]) for r in got] == [(t, i) for i, (t, _) in enumerate(expected, 1)]
        assert [r["score"] for r in got] == pytest.approx([s for _, s in expected], abs=1e-6)
        assert [r["line"] for r in got] == [PASSAGES.index(t) + 1 for t, _ in expected]
    rc, _, err = run_cli(capsys, "search", emb.path, "--corpus", corpus, QUERY, "--rerank", emb.path)
    assert_one_line_error(rc, err, "search", r"use `tformer embed ")
    rc, _, err = run_cli(capsys, "search", emb.path, "--corpus", corpus, QUERY, "--rerank-top", "5")
    assert_one_line_error(rc, err, "search", r"--rerank-top: only with --rerank RERANK_RUN")


def test_search_reranks_what_an_approximate_index_retrieves(runs, emb, tmp_path, capsys, monkeypatch):
    """`search INDEX --rerank RUN` over an IVF-PQ index: the reranker reorders the index's own
    --rerank-top candidates (the approximate search's, or --exact's), its best -k printed with
    the reranker's scores and the rows' ids and line numbers."""
    pytest.importorskip("faiss")
    import random

    from text_fixtures import WORDS

    rng = random.Random(3)
    lines = PASSAGES + [" ".join(rng.choice(WORDS) for _ in range(5)) for _ in range(1200)]
    corpus, idx = tmp_path / "corpus.txt", tmp_path / "idx"
    corpus.write_text("\n".join(lines) + "\n")
    rc, _, err = run_cli(capsys, "index", "build", emb.path, "--corpus", corpus, "--out", idx,
                         "--ann", "ivfpq", "--threads", 1)
    assert rc == 0 and "approximate (IVF-PQ" in err, err
    from tformer.embeddings.index import Index

    searches, search = [], Index.search
    monkeypatch.setattr(Index, "search", lambda self, q, k, exact=False: searches.append((k, exact))
                        or search(self, q, k, exact=exact))
    run = runs["grouped"]
    for how in ([], ["--exact"]):
        retrieved = [json.loads(x) for x in cli_lines(capsys, ["search", str(idx), QUERY, "-k", "8",
                                                               "--format", "jsonl", *how])]
        assert len(retrieved) == 8
        assert all(lines[r["line"] - 1] == r["text"] and r["id"] == r["line"] - 1 for r in retrieved)
        expected = run.rerank(QUERY, [r["text"] for r in retrieved])[:3]
        got = [json.loads(x) for x in cli_lines(capsys, ["search", str(idx), QUERY, "--rerank", str(run.path),
                                                         "--rerank-top", "8", "-k", "3", "--format", "jsonl",
                                                         *how])]
        assert [(r["rank"], r["id"], r["line"], r["text"]) for r in got] == [
            (i, retrieved[e["index"]]["id"], retrieved[e["index"]]["line"], retrieved[e["index"]]["text"])
            for i, e in enumerate(expected, start=1)]
        assert [r["score"] for r in got] == pytest.approx([e["score"] for e in expected], abs=1e-6)
    assert searches == [(8, False), (8, False), (8, True), (8, True)]  # --rerank-top retrieved, as asked


def test_search_rerank_needs_texts(runs, emb, tmp_path, capsys):
    """--rerank scores (query, text) pairs: refused with --query-vectors and over an index of
    vectors built without --texts, before anything is embedded."""
    np.save(tmp_path / "v.npy", np.random.default_rng(0).standard_normal((20, 16)).astype(np.float32))
    idx = tmp_path / "idx"
    assert run_cli(capsys, "index", "build", "--vectors", tmp_path / "v.npy", "--out", idx)[0] == 0
    rerank = runs["grouped"].path
    rc, _, err = run_cli(capsys, "search", idx, QUERY, "--model", emb.path, "--rerank", rerank)
    assert_one_line_error(rc, err, "search", r"--rerank: expected an INDEX with texts to rerank, got .*idx, "
                                             r"built from vectors without --texts")
    rc, _, err = run_cli(capsys, "search", idx, "--query-vectors", tmp_path / "v.npy", "--rerank", rerank)
    assert_one_line_error(rc, err, "search", r"--rerank: not with --query-vectors")
    rc, _, err = run_cli(capsys, "search", idx, "--query-vectors", tmp_path / "v.npy", "--rerank-top", 5)
    assert_one_line_error(rc, err, "search", r"--rerank-top: not with --query-vectors")


def test_the_stream_tokenizes_pools_of_pairs_not_of_queries(monkeypatch):
    """PairPools: each of TextData's shuffled pools, in order, cut into pieces of POOL pairs."""
    from types import SimpleNamespace

    from tformer.kinds import reranking

    monkeypatch.setattr(reranking, "POOL", 10)
    pools = [[{"passages": ["p"] * n} for n in (4, 4, 4, 1, 20, 3)], [{"passages": ["p"] * 11}]]
    data = SimpleNamespace(config="c", epoch_pools=lambda epoch: iter(pools))
    pieces = list(reranking.PairPools(data).epoch_pools(0))
    assert [[len(r["passages"]) for r in p] for p in pieces] == [[4, 4, 4], [1, 20], [3], [11]]


def test_the_plan_counts_each_pair_of_a_query_on_its_own(runs):
    """A query's candidates are pairs the model reads one by one: the plan's summary of an
    example is each pair's tokens (summed as one text, a query of 20 passages cut at 128 was a
    tenth of its cost and never whole)."""
    from tformer.training.planning import summarize

    objective = runs["grouped"].objective
    summary = summarize(objective)
    assert summary.texts and max(len(t) for t in summary.texts) > 2  # (the rows' queries have 3+ candidates)
    encoded = objective.encode(objective.examples("test")[:3])
    assert [list(e.lengths) for e in encoded] == [[len(p.ids) for p in e.pairs] for e in encoded]
    assert summary.mean_cost(10**6) == pytest.approx(
        sum(sum(t) for t in summary.texts) / len(summary.texts))
