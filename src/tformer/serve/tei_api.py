"""text-embeddings-inference's protocol (TEI), as its clients send it.

    POST /embed     {"inputs": str | [str] | token ids, "normalize"?, "truncate"?,
                     "truncation_direction"?, "prompt_name"?, "dimensions"?}  -> [[float, ...], ...]
    POST /predict   {"inputs": str | [text, text_pair] | [[text], [text, text_pair], ...],
                     "truncate"?, "truncation_direction"?, "raw_scores"?}
                    -> [{"label", "score"}] (one input) or [[...], ...] (a batch), best first:
                    every label's probability as the run computes it (a classifier's softmax, a
                    multi-label run's sigmoid of each label: ``Run.scores_function``), or the
                    logits with raw_scores
    POST /rerank    {"query", "texts": [str], "truncate"?, "truncation_direction"?, "raw_scores"?,
                     "return_text"?} -> [{"index", "text"?, "score"}], best first (a reranker:
                     each text scored with the query as a pair; a score is the output's sigmoid,
                     raw_scores its logit)
    POST /tokenize  {"inputs": str | [str], "add_special_tokens"?}
                    -> [[{"id", "text", "special", "start", "stop"}, ...], ...]
    POST /          what TEI answers there: /embed for an embedding model, /predict for a
                    classifier, /rerank for a reranker; and Hugging Face's task API, which huggingface_hub's
                    InferenceClient(model=URL) sends: feature extraction with its options at the
                    root (as /embed), sentence similarity with {"inputs": {"source_sentence",
                    "sentences"}} (-> the cosine of the source with each), text classification
                    with {"inputs", "parameters": {"function_to_apply"?, "top_k"?}}, answered
                    with one list per input.

``tei_info`` gives the fields of TEI's GET /info. Differences from TEI: only right truncation;
/tokenize's start/stop count characters (TEI's count bytes).
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from tformer.kinds.serving import Item
from tformer.serve import schema
from tformer.serve.endpoint import Endpoint, Service, json_response

EMBED_FIELDS = ("inputs", "normalize", "truncate", "truncation_direction", "prompt_name", "dimensions",
                "encoding_format")
PREDICT_FIELDS = ("inputs", "truncate", "truncation_direction", "raw_scores")
RERANK_FIELDS = ("query", "texts", "truncate", "truncation_direction", "raw_scores", "return_text")
FUNCTIONS = ("softmax", "sigmoid", "none")


def _truncation(service: Service, body: dict) -> bool:
    schema.choice(body, "truncation_direction", "right", ("right", "Right"))
    return schema.boolean(body, "truncate", service.config.truncate)


def embedding(service: Service) -> dict[str, Endpoint]:
    """/embed and / for an embedding model."""
    c, served = service.config, service.served

    def parse(body: dict) -> tuple:
        schema.check_fields(body, EMBED_FIELDS)
        inputs = schema.inputs(body, "inputs", c.max_client_batch, served.vocab_size)
        normalize = schema.boolean(body, "normalize", served.normalize)
        _no_prompt(body)
        schema.integer(body, "dimensions", served.dim, served.dim, served.dim)  # only its own
        schema.choice(body, "encoding_format", "float", ("float",))
        return inputs, normalize, _truncation(service, body), {}

    def respond(results: list[np.ndarray], items: list[Item], extra: dict):
        if extra.get("similarity"):  # the source's cosine with each other sentence
            unit = [v / max(float(np.linalg.norm(v)), 1e-12) for v in results]
            return json_response([float(unit[0] @ v) for v in unit[1:]])
        return json_response([v.tolist() for v in results])

    def parse_root(body: dict) -> tuple:
        """/: feature extraction (as /embed), or Hugging Face's sentence-similarity task, what
        InferenceClient.sentence_similarity sends: {"inputs": {"source_sentence", "sentences"}}."""
        if not isinstance(body.get("inputs"), dict):
            return parse(body)
        schema.check_fields(body, ("inputs", "parameters"))
        if schema.obj(body, "parameters"):
            raise schema.RequestError(422, "parameters", "parameters: expected none for sentence similarity")
        pair = body["inputs"]
        schema.check_fields(pair, ("source_sentence", "sentences"), "inputs")
        if not isinstance(pair.get("source_sentence"), str):
            raise schema.RequestError(422, "inputs.source_sentence", "inputs.source_sentence: expected a "
                                      f"string, got {schema._type(pair.get('source_sentence'))}")
        named = {f"inputs.{k}": v for k, v in pair.items()}  # so that errors name inputs.sentences[i]
        texts = [*schema.texts(named, "inputs.source_sentence", 1),
                 *schema.texts(named, "inputs.sentences", c.max_client_batch - 1)]
        return texts, True, _truncation(service, {}), {"similarity": True}

    embed = Endpoint(parse, respond)
    return {"/embed": embed, "/": Endpoint(parse_root, respond)}


def classification(service: Service) -> dict[str, Endpoint]:
    """/predict and / (also Hugging Face's task API: a parameters object) for a classifier."""
    c, served = service.config, service.served

    def parse(body: dict, task_api: bool = False) -> tuple:
        schema.check_fields(body, PREDICT_FIELDS + (("parameters",) if task_api else ()))
        records, batched = schema.records(body, "inputs", c.max_client_batch)
        raw = schema.boolean(body, "raw_scores", False)
        params = schema.obj(body, "parameters")
        schema.check_fields(params, ("function_to_apply", "top_k"), "parameters")
        own = served.scores_function  # what the run's probabilities are (the batch key: False)
        function = schema.choice(params, "function_to_apply", "none" if raw else own, FUNCTIONS, "parameters")
        top_k = schema.integer(params, "top_k", None, 1, len(served.labels), "parameters")
        applied = None if function == own else function  # on the logits: raw_scores' batches
        extra = {"batched": batched or task_api, "function": applied, "top_k": top_k}
        return records, applied is not None, _truncation(service, body), extra

    def respond(results: list[list[float]], items: list[Item], extra: dict):
        answers = [_ranked(served.labels, scores, extra["function"], extra["top_k"]) for scores in results]
        return json_response(answers if extra["batched"] else answers[0])

    return {"/predict": Endpoint(parse, respond),
            "/": Endpoint(lambda body: parse(body, "parameters" in body), respond)}


def rerank(service: Service) -> dict[str, Endpoint]:
    """/rerank and / for a reranker: the query paired with each text, ranked best first."""
    c = service.config

    def parse(body: dict) -> tuple:
        schema.check_fields(body, RERANK_FIELDS)
        if "query" not in body or body["query"] is None:
            raise schema.RequestError(422, "query", "query: required (a string), got nothing")
        schema._text(body["query"], "query")
        texts = schema.texts(body, "texts", c.max_client_batch)
        raw = schema.boolean(body, "raw_scores", False)
        extra = {"texts": texts, "return_text": schema.boolean(body, "return_text", False)}
        records = [{"text": body["query"], "text_pair": t} for t in texts]
        return records, raw, _truncation(service, body), extra

    def respond(results: list[list[float]], items: list[Item], extra: dict):
        order = sorted(range(len(results)), key=lambda i: -results[i][0])  # equal scores: as sent
        return json_response([{"index": i, **({"text": extra["texts"][i]} if extra["return_text"] else {}),
                               "score": float(results[i][0])} for i in order])

    endpoint = Endpoint(parse, respond)
    return {"/rerank": endpoint, "/": endpoint}


def tokenize(service: Service) -> dict[str, Endpoint]:
    """/tokenize, for every model kind."""

    def parse(body: dict) -> tuple:
        schema.check_fields(body, ("inputs", "add_special_tokens", "prompt_name"))
        texts = schema.texts(body, "inputs", service.config.max_client_batch)
        _no_prompt(body)
        return texts, schema.boolean(body, "add_special_tokens", True), False, {}

    return {"/tokenize": Endpoint(parse, lambda tokens, items, extra: json_response(tokens),
                                  tokenize_only=True)}


def _no_prompt(body: dict) -> None:
    if body.get("prompt_name") is not None:
        raise schema.RequestError(422, "prompt_name", "prompt_name: expected null (this model has no "
                                  f"prompts), got {schema._short(body['prompt_name'])}")


def _ranked(labels: list[str], scores: list[float], function: str | None, top_k: int | None
            ) -> list[dict[str, Any]]:
    """[{"label", "score"}], best first; ``function`` None: scores are the run's probabilities;
    else they are the logits, given as they are (none: TEI's raw_scores) or through a sigmoid or
    a softmax."""
    if function == "sigmoid":
        scores = [1 / (1 + math.exp(-s)) if s > -700 else 0.0 for s in scores]
    elif function == "softmax":
        top = max(scores)
        exps = [math.exp(s - top) for s in scores]
        scores = [e / sum(exps) for e in exps]
    ranked = sorted(zip(labels, scores, strict=True), key=lambda x: -x[1])
    return [{"label": label, "score": float(score)} for label, score in ranked[:top_k]]


def info(service: Service) -> dict[str, Any]:
    """The fields of TEI's /info, for this server."""
    c, served = service.config, service.served
    return {
        "model_id": c.model_name, "model_sha": None, "model_dtype": c.dtype,
        "model_type": served.tei_model_type(), "max_concurrent_requests": c.max_connections,
        "max_input_length": service.input_limit, "max_batch_tokens": c.max_batch_tokens,
        "max_batch_requests": None, "max_client_batch_size": c.max_client_batch,
        "auto_truncate": c.truncate, "tokenization_workers": c.tokenization_workers,
    }
