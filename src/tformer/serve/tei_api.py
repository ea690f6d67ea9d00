"""text-embeddings-inference's protocol (TEI), as its clients send it.

    POST /embed     {"inputs": str | [str] | token ids, "normalize"?, "truncate"?,
                     "truncation_direction"?, "prompt_name"?, "dimensions"?}  -> [[float, ...], ...]
    POST /predict   {"inputs": str | [text, text_pair] | [[text], [text, text_pair], ...],
                     "truncate"?, "truncation_direction"?, "raw_scores"?}
                    -> [{"label", "score"}] (one input) or [[...], ...] (a batch), best first
    POST /tokenize  {"inputs": str | [str], "add_special_tokens"?}
                    -> [[{"id", "text", "special", "start", "stop"}, ...], ...]
    POST /          what TEI answers there: /embed for an embedding model, /predict for a
                    classifier; and Hugging Face's task API, which huggingface_hub's
                    InferenceClient(model=URL) sends: feature extraction with its options at the
                    root (as /embed), text classification with {"inputs", "parameters":
                    {"function_to_apply"?, "top_k"?}}, answered with one list per input.

``tei_info`` gives the fields of TEI's GET /info. Differences from TEI: only right truncation;
/tokenize's start/stop count characters (TEI's count bytes).
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from tformer.serve import schema
from tformer.serve.endpoint import Endpoint, Service, json_response
from tformer.serve.models import Item

EMBED_FIELDS = ("inputs", "normalize", "truncate", "truncation_direction", "prompt_name", "dimensions",
                "encoding_format")
PREDICT_FIELDS = ("inputs", "truncate", "truncation_direction", "raw_scores")
FUNCTIONS = ("softmax", "sigmoid", "none")


def endpoints(service: Service) -> dict[str, Endpoint]:
    """TEI's endpoints for this server's model kind."""
    c, served = service.config, service.served

    def truncation(body: dict, where: str = "") -> bool:
        schema.choice(body, "truncation_direction", "right", ("right", "Right"), where)
        return schema.boolean(body, "truncate", c.truncate, where)

    # Embeddings ---------------------------------------------------------------------------------
    def parse_embed(body: dict) -> tuple:
        schema.check_fields(body, EMBED_FIELDS)
        inputs = schema.inputs(body, "inputs", c.max_client_batch, served.vocab_size)
        normalize = schema.boolean(body, "normalize", served.normalize)
        if body.get("prompt_name") is not None:
            raise schema.RequestError(422, "prompt_name", "prompt_name: expected null (this model has no "
                                      f"prompts), got {schema._short(body['prompt_name'])}")
        schema.integer(body, "dimensions", served.dim, served.dim, served.dim)  # only its own
        schema.choice(body, "encoding_format", "float", ("float",))
        return inputs, normalize, truncation(body), {}

    def respond_embed(results: list[np.ndarray], items: list[Item], extra: dict):
        return json_response([v.tolist() for v in results])

    # Classification ---------------------------------------------------------------------------------
    def parse_predict(body: dict, task_api: bool = False) -> tuple:
        schema.check_fields(body, PREDICT_FIELDS + (("parameters",) if task_api else ()))
        records, batched = schema.records(body, "inputs", c.max_client_batch)
        raw = schema.boolean(body, "raw_scores", False)
        params = schema.obj(body, "parameters")
        schema.check_fields(params, ("function_to_apply", "top_k"), "parameters")
        function = schema.choice(params, "function_to_apply", "none" if raw else "softmax", FUNCTIONS,
                                 "parameters")
        top_k = schema.integer(params, "top_k", None, 1, len(served.labels), "parameters")
        extra = {"batched": batched or task_api, "function": function, "top_k": top_k}
        return records, function != "softmax", truncation(body), extra

    def respond_predict(results: list[list[float]], items: list[Item], extra: dict):
        answers = [_ranked(served.labels, scores, extra["function"], extra["top_k"]) for scores in results]
        return json_response(answers if extra["batched"] else answers[0])

    # Tokenization -------------------------------------------------------------------------------------
    def parse_tokenize(body: dict) -> tuple:
        schema.check_fields(body, ("inputs", "add_special_tokens", "prompt_name"))
        texts = schema.texts(body, "inputs", c.max_client_batch)
        if body.get("prompt_name") is not None:
            raise schema.RequestError(422, "prompt_name", "prompt_name: expected null (this model has no "
                                      "prompts)")
        return texts, schema.boolean(body, "add_special_tokens", True), False, {}

    def respond_tokenize(results: list, items: list[Item], extra: dict):
        return json_response(results)

    tokenize = Endpoint(parse_tokenize, respond_tokenize, tokenize_only=True)
    if served.kind == "embedding":
        embed = Endpoint(parse_embed, respond_embed)
        return {"/embed": embed, "/": embed, "/tokenize": tokenize}
    if served.kind == "classification":
        return {"/predict": Endpoint(parse_predict, respond_predict),
                "/": Endpoint(lambda body: parse_predict(body, "parameters" in body), respond_predict),
                "/tokenize": tokenize}
    return {"/tokenize": tokenize}


def _ranked(labels: list[str], scores: list[float], function: str, top_k: int | None) -> list[dict[str, Any]]:
    """[{"label", "score"}], best first; scores are probabilities (softmax), or the logits
    (none: TEI's raw_scores) or their sigmoids."""
    if function == "sigmoid":
        scores = [1 / (1 + math.exp(-s)) if s > -700 else 0.0 for s in scores]
    ranked = sorted(zip(labels, scores, strict=True), key=lambda x: -x[1])
    return [{"label": label, "score": float(score)} for label, score in ranked[:top_k]]


def tei_info(service: Service) -> dict[str, Any]:
    """The fields of TEI's /info, for this server."""
    c, served = service.config, service.served
    return {
        "model_id": c.model_name, "model_sha": None, "model_dtype": c.dtype,
        "model_type": served.tei_model_type(), "max_concurrent_requests": c.max_connections,
        "max_input_length": served.max_input_tokens, "max_batch_tokens": c.max_batch_tokens,
        "max_batch_requests": None, "max_client_batch_size": c.max_client_batch,
        "auto_truncate": c.truncate, "tokenization_workers": c.tokenization_workers,
    }
