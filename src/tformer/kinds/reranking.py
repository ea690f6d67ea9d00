"""Reranking: a query's candidate passages ordered by a cross-encoder's score of each (query,
passage) pair, as sentence-transformers' CrossEncoder reranks and TEI's /rerank serves.

    {"query", "positive", "negatives": [...]}       a query with its candidates, or
    {"query", "passage", "label"}                   one candidate (label 0/1, or graded 0, 1, 2...)
    tformer rerank RUN --query Q --file passages.txt

The model is tformer.kinds.cross_encoder's. Trained with each query's candidates in one softmax
(listwise: the cross-entropy of the relevant candidates' share, Gao et al. 2021's localised
contrastive loss), a candidate given alone with its label's binary cross-entropy (LOSS says
why). Scored by MRR@10 and NDCG@10 over each query's candidates (and precision@1), against
BM25 of the query's words. A score is the output's sigmoid (CrossEncoder's and TEI's default
for one output); raw scores are the logits.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Iterator
from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from tformer.errors import shown
from tformer.kinds.base import Kind
from tformer.kinds.cross_encoder import CrossEncoderRun, CrossEncoding, logits_of
from tformer.kinds.run import check_batch_size, texts_of
from tformer.kinds.serving import InputRefused, Item
from tformer.text.arguments import check_texts
from tformer.training.dataset import POOL
from tformer.training.losses import at_least_fp32
from tformer.training.objective import PREDICT_BATCH
from tformer.training.ranking import BM25, rank_metrics
from tformer.training.records import Fields, Record, check_encodable
from tformer.training.stream import BatchStream

NAME = "reranking"
QUERY = Fields(NAME, ("query",), (), ("query",))
# The loss of a query's candidates (not yet measured: benchmarks/crossencoder_losses.py compares them):
# "listwise" (softmax cross-entropy over them) or "pointwise" (each candidate's binary
# cross-entropy against its relevance / the highest relevance in the training data).
LOSS = "listwise"


class RerankFields(Fields):
    """query as text; then positive + negatives (a list of texts) or passage + label (a
    relevance: a number >= 0). Either form is held as one: {"query", "passages", "relevance"}."""

    def check(self, where: str, record: dict[str, Any]) -> Record:
        out: dict[str, Any] = QUERY.check(where, record)
        grouped = [k for k in ("positive", "negatives") if k in record]
        flat = [k for k in ("passage", "label") if k in record]
        if grouped and flat:
            raise ValueError(f"{where}: expected positive+negatives or passage+label, got both "
                             f"({', '.join(grouped + flat)})")
        if grouped:
            positive = Fields(NAME, ("positive",)).check(where, record)["positive"]
            negatives = record.get("negatives")
            if not isinstance(negatives, list) or not negatives:
                got = ("nothing" if negatives is None
                       else f"{type(negatives).__name__} {shown(str(negatives))}")
                raise ValueError(f"{where}: negatives: expected a list of at least one text, got {got}")
            for i, text in enumerate(negatives):
                if not isinstance(text, str) or not text.strip():
                    raise ValueError(f"{where}: negatives[{i}]: expected text, got {text!r}")
                check_encodable(where, f"negatives[{i}]", text)
            out.update(passages=[positive, *negatives], relevance=[1.0] + [0.0] * len(negatives))
        elif flat:
            out.update(passages=[Fields(NAME, ("passage",)).check(where, record)["passage"]],
                       relevance=[relevance_of(record, where)])
        else:
            raise ValueError(f"{where}: expected positive+negatives (a query's candidates) or passage+label "
                             f"(one candidate), got {', '.join(sorted(record)) or 'no fields'}")
        return out

    def texts_of(self, record: Record) -> list[str]:
        return [record["query"], *record["passages"]]

    def tally(self, counts: dict[str, Any], record: Record) -> None:
        counts["max_relevance"] = max(counts.get("max_relevance", 0.0), *record["relevance"])


def relevance_of(record: dict[str, Any], where: str) -> float:
    """A flat row's label as a relevance: a finite number >= 0 (a JSON number, or text such as
    a CSV's "1"); refused naming ``where`` and what it holds."""
    value = record.get("label")
    number: float | None = None
    if isinstance(value, str):
        try:
            number = float(value.strip())
        except ValueError:
            pass
    elif isinstance(value, (int, float)) and not isinstance(value, bool):
        number = float(value)
    if number is None or not math.isfinite(number) or number < 0:
        raise ValueError(f"{where}: label: expected a relevance, a number >= 0 (0 not relevant; 1, or "
                         f"graded 1, 2, 3...: relevant), got {value!r}")
    return number


FIELDS = RerankFields(NAME, ("query",), (), ("query",))
# Classification's sizes; a query's candidates make one example, so a batch holds 4,096 tokens
# of pairs (a few queries' candidates: batches of 32 queries of 20 would be 640 pairs).
PRESET = {"d_model": 128, "n_heads": 4, "d_ff": 512, "n_layers": 2, "activation": "gelu", "vocab_size": 4000,
          "lr": 5e-4, "warmup": 200, "schedule": "linear", "steps": 10000, "max_tokens": 4096,
          "eval_every": 250, "patience": 8, "max_length": 128}
# A fine-tune's batches too (FINETUNE_PRESET counts 32 examples: 32 queries of 20 candidates
# would be 640 pairs an update, a minute each for MiniLM on a 2-core CPU).
FINETUNE = {"max_tokens": 4096}
BY = "BM25 of the query's words"


class PairPools:
    """A run's training pools (TextData.epoch_pools: records shuffled over the whole file) cut into
    pieces of POOL pairs, for BatchStream to tokenize and bucket one at a time: a pool of 4,096
    queries of 20 candidates is 80,000 pairs, which took 27 s to tokenize on a busy 2-core machine
    before the first batch could start; 4,096 pairs still sort hundreds of queries together."""

    def __init__(self, data) -> None:
        self.data, self.config = data, data.config

    def epoch_pools(self, epoch: int = 0) -> Iterator[list]:
        for pool in self.data.epoch_pools(epoch):
            piece, pairs = [], 0
            for record in pool:
                piece.append(record)
                pairs += len(record["passages"])
                if pairs >= POOL:
                    yield piece
                    piece, pairs = [], 0
            if piece:
                yield piece


def grouped(records: Iterable[dict]) -> list[dict]:
    """Records of one query merged into one (its candidates in the order met): a file of
    query/passage/label rows scored as queries with their candidates."""
    out: dict[str, dict] = {}
    for r in records:
        if r["query"] in out:
            group = out[r["query"]]
            group["passages"] = group["passages"] + r["passages"]
            group["relevance"] = group["relevance"] + r["relevance"]
        else:
            out[r["query"]] = dict(r)
    return list(out.values())


class Reranking(CrossEncoding):
    kind, fields, preset, finetune_preset = NAME, FIELDS, PRESET, FINETUNE
    main_metric = "mrr_at_10"
    inputs = ("query",)
    activation = "sigmoid"

    def what(self) -> str:
        return "reranking (a cross-encoder of query and passage: BERT's pooler and one output)"

    def candidates(self, record: dict[str, Any]) -> tuple[str, list[str | None], list[float] | None]:
        return record["query"], list(record["passages"]), record.get("relevance")

    def __init__(self, source, pretrained=None) -> None:
        super().__init__(source, pretrained)
        self._held_out: dict[str, list] = {}

    def train_batches(self, start: int, rank: int = 0, world: int = 1) -> BatchStream:
        """The training stream, its pools cut into pieces of POOL pairs (PairPools)."""
        return BatchStream(PairPools(self.source.data), self.encode, self.collate, self.config.max_tokens,
                           start, rank, world)

    def examples(self, split: str) -> list:
        """A held-out split's records, one per query (rows of one query merged)."""
        if split not in self._held_out:
            self._held_out[split] = grouped(self.source.examples(split))
        return self._held_out[split]

    def predict(self, model: nn.Module, examples: list, batch_size: int = PREDICT_BATCH,
                **options: Any) -> list:
        """Objective.predict, ``batch_size`` counted in pairs (an example holds a query's candidates)."""
        pairs = sum(len(r["passages"]) for r in examples) / max(len(examples), 1)
        return super().predict(model, examples, batch_size=max(1, round(batch_size / max(pairs, 1.0))),
                               **options)

    def loss(self, model: nn.Module, batch, label_smoothing: float = 0.0) -> tuple[Tensor, float]:
        """Listwise: each query with two or more candidates, one relevant at least, is a softmax
        over them whose cross-entropy with the relevance's shares (relevance / its sum) is the
        loss; other candidates (a query's rows given one at a time) and LOSS "pointwise": the
        binary cross-entropy of each one's sigmoid against its relevance / the data's highest,
        relevant ones weighted by the irrelevant ones per relevant one in the batch.
        Logged: the share of those queries whose best-scored candidate is a relevant one (without
        any: of the candidates whose logit's sign says whether they are relevant)."""
        logits = at_least_fp32(logits_of(model, batch))  # (N,)
        rel, groups = batch.targets, batch.groups  # (N,), (N,)
        sizes = torch.bincount(groups)  # (G,)
        starts = torch.cumsum(sizes, 0) - sizes
        place = torch.arange(len(groups), device=groups.device) - starts[groups]  # (N,) index in its group
        table = logits.new_full((len(sizes), int(sizes.max())), float("-inf"))  # (G, K)
        table[groups, place] = logits
        wanted = rel.new_zeros(table.shape)  # (G, K)
        wanted[groups, place] = rel
        total = wanted.sum(1)  # (G,)
        ranked = (sizes >= 2) & (total > 0)  # (G,) queries with candidates to order
        listwise = ranked if LOSS == "listwise" else torch.zeros_like(ranked)
        top = 1.0 * max(float(self.source.data.tally.get("max_relevance", 1.0)), 1e-12)
        pointwise = ~listwise[groups]  # (N,) candidates scored alone
        losses = []
        if bool(listwise.any()):
            log_p = torch.log_softmax(table[listwise], dim=1)  # (L, K)
            share = wanted[listwise] / total[listwise, None]
            losses.append(-(share * log_p.masked_fill(share == 0, 0.0)).sum(1))  # (L,)
        if bool(pointwise.any()):
            target = (rel[pointwise] / top).clamp(max=1.0)
            # relevant candidates weighted by the irrelevant ones per relevant one (at least 1), as
            # sentence-transformers' BinaryCrossEntropyLoss takes pos_weight for hard negatives
            weight = ((target == 0).sum() / (target > 0).sum().clamp(min=1)).clamp(min=1.0)
            losses.append(F.binary_cross_entropy_with_logits(logits[pointwise], target, pos_weight=weight,
                                                             reduction="none"))
        loss = torch.cat(losses).mean()
        if not bool(ranked.any()):  # candidates alone: the share on the right side of 0
            return loss, float(((logits > 0) == (rel > 0)).float().mean())
        best = table.argmax(1)  # (G,)
        return loss, float((wanted[torch.arange(len(sizes)), best] > 0)[ranked].float().mean())

    def score(self, examples: list, preds: list[list[float]]) -> tuple[dict[str, float], list[str]]:
        merged: dict[str, tuple[list, list]] = {}
        for record, logits in zip(examples, preds, strict=True):
            scores, relevance = merged.setdefault(record["query"], ([], []))
            scores += logits
            relevance += record["relevance"]
        shown_ = [_short(r["passages"][max(range(len(p)), key=p.__getitem__)]) for r, p in
                  zip(examples, preds, strict=True)]
        return rank_metrics(merged.values()), shown_

    def row(self, record: dict[str, Any], shown_: str) -> tuple[str, str, str]:
        relevant = (p for p, r in zip(record["passages"], record["relevance"], strict=True) if r > 0)
        first = next(relevant, "(none)")
        return record["query"], shown_, _short(first)

    def _baseline(self, examples: list) -> tuple[float, str]:
        """BM25 over every passage of the examples (the idf of their words), each query's
        candidates ranked by it."""
        groups = grouped(examples)
        index: dict[str, int] = {}
        for g in groups:
            for p in g["passages"]:
                index.setdefault(p, len(index))
        bm25 = BM25(list(index))
        ranked = [(bm25.scores(g["query"], [index[p] for p in g["passages"]]), g["relevance"])
                  for g in groups]
        return rank_metrics(ranked)[self.main_metric], BY


def _short(text: str, width: int = 60) -> str:
    return text if len(text) <= width else text[: width - 1] + "…"


class RerankingRun(CrossEncoderRun):
    kind = NAME
    verb = "rerank"
    pipeline_tag = "text-ranking"
    # /predict too, as TEI serves a reranker; its / is /rerank (the last protocol's).
    protocols = ("tei.predict", "tei.rerank", "tei.tokenize")

    def rerank(self, query: str, passages: str | Iterable[str], batch_size: int = 64,
               raw: bool = False) -> list[dict[str, float]]:
        """[{"index", "score"}] of each passage (one str is one passage), best first (equal scores
        in the order given); scores are the output's sigmoid, or its logit with ``raw``."""
        if not isinstance(query, str):
            raise TypeError(f"query: expected a str, got {type(query).__name__}")
        check_texts("query", [query], one=True)
        passages = texts_of(passages, "passages")
        scores = self.pair_scores([query] * len(passages), passages, raw, check_batch_size(batch_size))
        order = sorted(range(len(scores)), key=lambda i: -scores[i])
        return [{"index": i, "score": scores[i]} for i in order]

    def _records(self, texts: list[str], pairs: list[str | None] | None) -> list[dict[str, Any]]:
        if pairs is None or any(p is None for p in pairs):
            raise ValueError("pairs: a reranker scores (query, passage) pairs, got a text alone")
        return [{"query": t, "passages": [p]} for t, p in zip(texts, pairs, strict=True)]

    def admit(self, records: list[dict[str, str]], truncate: bool, limit: int | None = None) -> list[Item]:
        alone = [i for i, r in enumerate(records) if not r.get("text_pair")]
        if alone:
            raise InputRefused(f"input[{alone[0]}]: a reranker scores a pair: send [query, text] (or POST "
                               "/rerank with a query and texts)")
        return super().admit(records, truncate, limit)

    def tei_model_type(self) -> dict[str, Any]:
        return {"reranker": {"id2label": {"0": self.labels[0]}, "label2id": {self.labels[0]: 0}}}

    def usage(self) -> str:
        return ('\nfrom sentence_transformers import CrossEncoder\nmodel = CrossEncoder("DIR")\n'
                'print(model.rank("a query", ["a passage", "another passage"]))\n')


KIND = Kind(Reranking, RerankingRun)
