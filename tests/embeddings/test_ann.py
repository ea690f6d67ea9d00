"""tformer.embeddings.ann: an approximate (IVF-PQ) index against exact search, on small clustered
sets; its files read through memory maps; FAISS missing named in one line."""

from __future__ import annotations

import sys

import numpy as np
import pytest

from tformer.embeddings import ann
from tformer.embeddings.index import Index
from tformer.embeddings.index_build import build_index_from_vectors

faiss = pytest.importorskip("faiss", reason="the ann extra (faiss-cpu) is not installed")


def clustered(n: int, dim: int = 32, seed: int = 0, centres_seed: int = 7) -> np.ndarray:
    """Rows around n // 40 centres (drawn from `centres_seed`: queries share a corpus's centres)."""
    centres = np.random.default_rng(centres_seed).standard_normal((max(4, n // 40), dim))
    rng = np.random.default_rng(seed)
    return (centres[rng.integers(0, len(centres), n)] + 0.4 * rng.standard_normal((n, dim))).astype(np.float32)


def exact_top(corpus: np.ndarray, queries: np.ndarray, k: int) -> tuple[np.ndarray, np.ndarray]:
    """float64 NumPy: the k best rows by cosine, ties to the lower row."""
    c = corpus.astype(np.float64) / np.linalg.norm(corpus.astype(np.float64), axis=1, keepdims=True)
    q = queries.astype(np.float64) / np.linalg.norm(queries.astype(np.float64), axis=1, keepdims=True)
    sims = q @ c.T
    rows = np.argsort(-sims, axis=1, kind="stable")[:, :k]
    return np.take_along_axis(sims, rows, axis=1), rows


@pytest.fixture(scope="module")
def built(tmp_path_factory):
    root = tmp_path_factory.mktemp("ann")
    corpus = clustered(4000)
    np.save(root / "v.npy", corpus)
    meta = build_index_from_vectors(root / "v.npy", root / "idx", ann="ivfpq", threads=1, report=lambda _: None)
    return root, corpus, meta


def test_parameters_reach_the_target_recall_on_the_held_out_sample(built):
    _, _, meta = built
    chosen = meta["ann"]
    assert chosen["kind"] == "ivfpq" and chosen["recall_at_10"] >= ann.TARGET_RECALL
    assert chosen["sample"] == 400 and chosen["nprobe"] <= chosen["nlist"]  # n // 10 held out
    assert "note" not in chosen


def test_approximate_results_against_exact_search(built):
    root, corpus, _ = built
    queries = clustered(300, seed=3)  # new rows around the corpus's centres: not in the index
    index = Index(root / "idx")
    scores, rows = index.search(queries, 10)
    want_scores, want_rows = exact_top(corpus, queries, 10)
    recall = np.mean([len(set(a) & set(b)) / 10 for a, b in zip(rows.tolist(), want_rows.tolist(), strict=True)])
    assert recall >= 0.9, recall  # measured on other queries than the sample that chose the parameters
    # Each returned score is the row's exact cosine (rescored from vectors.npy), best first.
    c = corpus.astype(np.float64) / np.linalg.norm(corpus, axis=1, keepdims=True)
    q = queries.astype(np.float64) / np.linalg.norm(queries, axis=1, keepdims=True)
    assert np.abs(scores - np.einsum("qd,qkd->qk", q, c[rows])).max() <= 1e-5
    assert (np.diff(scores, axis=1) <= 0).all()
    # --exact on the same index is the float64 answer (ids where scores are not tied to 1e-6).
    exact_scores, exact_rows = index.search(queries, 10, exact=True)
    assert np.abs(exact_scores - want_scores).max() <= 1e-5
    untied = np.abs(np.diff(want_scores, axis=1)).min(axis=1) > 1e-6
    assert (exact_rows[untied] == want_rows[untied]).all()


def test_k_past_the_candidates_and_past_n(built):
    root, corpus, _ = built
    index = Index(root / "idx")
    scores, rows = index.search(corpus[:2], 5000)
    assert rows.shape == (2, 4000)
    for found in rows.tolist():  # every row once: k past the probed lists' rows probes more lists
        assert sorted(found) == list(range(4000))
    assert rows[0, 0] == 0 and scores[0, 0] == pytest.approx(1.0, abs=1e-5)  # a row finds itself first


def _mapped_rss_kib(suffix: str) -> list[int]:
    """Resident KiB of each of this process's mappings of a file whose path ends with `suffix`."""
    found, inside = [], False
    with open("/proc/self/smaps") as f:
        for line in f:
            head = line.split()
            if head and "-" in head[0] and len(head) >= 5:  # a mapping's first line
                inside = len(head) >= 6 and head[-1].endswith(suffix)
            elif inside and line.startswith("Rss:"):
                found.append(int(head[1]))
    return found


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="/proc/self/smaps")
def test_the_lists_and_the_vectors_are_read_through_memory_maps(built):
    """The inverted lists are mapped (an index larger than RAM is searched from disk), and the
    candidates' vectors are read row by row, not mapped: the process never holds the matrix."""
    root, corpus, _ = built
    index = Index(root / "idx")
    index.search(corpus[:50], 10)
    ivf = faiss.extract_index_ivf(index._approximate().index)
    assert type(faiss.downcast_InvertedLists(ivf.invlists)).__name__ == "OnDiskInvertedLists"
    assert _mapped_rss_kib("idx/ann.faiss")  # mapped, not read into memory
    assert _mapped_rss_kib("idx/vectors.npy") == []  # read by pread: a mapping held ~1 MiB a row


def test_a_rebuild_meanwhile_leaves_a_search_on_the_index_it_opened(built, tmp_path):
    root, corpus, _ = built
    np.save(tmp_path / "v.npy", corpus)
    build_index_from_vectors(tmp_path / "v.npy", tmp_path / "idx", ann="ivfpq", threads=1, report=lambda _: None)
    opened = Index(tmp_path / "idx")
    np.save(tmp_path / "w.npy", -corpus[::-1].copy())
    build_index_from_vectors(tmp_path / "w.npy", tmp_path / "idx", ann="ivfpq", threads=1, report=lambda _: None)
    _, rows = opened.search(corpus[:5], 1)
    assert rows[:, 0].tolist() == [0, 1, 2, 3, 4]  # the old vectors, their old rows


def test_without_faiss_auto_stays_exact_and_ivfpq_names_the_extra(monkeypatch):
    monkeypatch.setitem(sys.modules, "faiss", None)  # import faiss -> ImportError
    assert ann.choose_kind("auto", 1000)[0] == "exact"
    kind, why = ann.choose_kind("auto", 10**7)
    assert kind == "exact" and "pip install 'tformer[ann]'" in why
    with pytest.raises(ValueError, match=r"^--ann: an approximate index needs FAISS, which is not installed: "
                                         r"pip install 'tformer\[ann\]'"):
        ann.choose_kind("ivfpq", 5000)


def test_auto_switches_at_its_threshold():
    assert ann.choose_kind("auto", ann.AUTO_MIN_ROWS - 1)[0] == "exact"
    assert ann.choose_kind("auto", ann.AUTO_MIN_ROWS)[0] == "ivfpq"
    with pytest.raises(ValueError, match=r"--ann ivfpq: expected at least 1,000 vectors"):
        ann.choose_kind("ivfpq", 999)


def test_the_parameter_search_finds_the_cheapest_setting_without_trying_every_one():
    """_tune picks, of the (nprobe, rerank) settings whose recall meets the target, the cheapest;
    the deepest rerank goes first and bounds the rest, so settings dearer than the best found are
    never searched (at 10^7 vectors rerank 4 probing all 4,096 lists took most of a build)."""
    held = np.arange(200)
    expected = np.tile(np.arange(1000, 1010), (200, 1))  # each query's 10 true neighbours
    tried = []

    class Searcher:  # recall 1 where nprobe x rerank >= 256, else 0.5
        nprobe = rerank = 1

        def search(self, sample, k):
            tried.append((self.nprobe, self.rerank))
            good = self.nprobe * self.rerank >= 256
            rows = np.concatenate([held[:, None], expected if good else
                                   np.concatenate([expected[:, :5], np.full((200, 5), 5000)], 1)], 1)
            return None, rows

    shape, n = {"nlist": 1024}, 1_000_000
    chosen = ann._tune(Searcher(), held, held, expected, shape, n)
    per_list = n / shape["nlist"]
    settings = [(p, r) for r in ann.RERANKS for p in (2 ** i for i in range(11)) if p * r >= 256]
    cheapest = min(settings, key=lambda s: s[0] * per_list + s[1] * 10 * ann.CANDIDATE)
    assert (chosen["nprobe"], chosen["rerank"]) == cheapest and chosen["recall_at_10"] == 1.0
    exhaustive = sum(len([p for p in (2 ** i for i in range(11)) if p <= 256 // r]) for r in ann.RERANKS)
    assert len(tried) < exhaustive, (tried, exhaustive)
