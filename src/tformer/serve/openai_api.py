"""OpenAI's protocol, as the `openai` client sends it.

    POST /v1/embeddings   {"input": str | [str] | token ids | [token ids], "model"?,
                           "encoding_format"?: "float" | "base64", "dimensions"?, "user"?}
                          -> {"object": "list", "data": [{"object", "index", "embedding"}],
                              "model", "usage": {"prompt_tokens", "total_tokens"},
                              "truncated_inputs": [indices of inputs cut to the limit]}
    POST /v1/completions  (a seq2seq run) {"prompt": str | [str], "model"?, "max_tokens"?, "stop"?,
                           "n"?: 1, "echo"?: false, "stream"?: false, "user"?, "seed"?}
                          -> {"id", "object": "text_completion", "created", "model",
                              "choices": [{"index", "text", "finish_reason", "logprobs": null}],
                              "usage": {"prompt_tokens", "completion_tokens", "total_tokens"}}
    GET  /v1/models, /v1/models/{id}   the one model this server holds

Token ids are the model's own (its tokenizer's, as /tokenize gives them) and run as given:
no special tokens are added. Sampling options (temperature, top_p, ...) are accepted at their
neutral values only: decoding is greedy.
"""

from __future__ import annotations

import base64
import time
import uuid
from typing import Any

import numpy as np

from tformer.kinds.serving import Item
from tformer.serve import schema
from tformer.serve.endpoint import Endpoint, Service, json_response

COMPLETION_FIELDS = ("prompt", "model", "max_tokens", "stop", "n", "echo", "stream", "user", "seed",
                     "temperature", "top_p", "best_of", "logprobs", "presence_penalty", "frequency_penalty",
                     "suffix", "logit_bias")


def embeddings(service: Service) -> dict[str, Endpoint]:
    """/v1/embeddings for an embedding model."""
    c, served = service.config, service.served

    def parse_embeddings(body: dict) -> tuple:
        schema.check_fields(body, ("input", "model", "encoding_format", "dimensions", "user"))
        inputs = schema.inputs(body, "input", c.max_client_batch, served.vocab_size)
        schema.string(body, "model")
        schema.string(body, "user")
        encoding = schema.choice(body, "encoding_format", "float", ("float", "base64"))
        schema.integer(body, "dimensions", served.dim, served.dim, served.dim)  # only its own
        return inputs, served.normalize, c.truncate, {"encoding": encoding}

    def respond_embeddings(results: list[np.ndarray], items: list[Item], extra: dict):
        data = [{"object": "embedding", "index": i, "embedding": _vector(v, extra["encoding"])}
                for i, v in enumerate(results)]
        tokens = sum(item.n for item in items)
        return json_response({"object": "list", "data": data, "model": c.model_name,
                              "usage": {"prompt_tokens": tokens, "total_tokens": tokens},
                              "truncated_inputs": [i for i, item in enumerate(items) if item.truncated]})

    return {"/v1/embeddings": Endpoint(parse_embeddings, respond_embeddings)}


def completions(service: Service) -> dict[str, Endpoint]:
    """/v1/completions for a seq2seq run."""
    c, served = service.config, service.served

    def parse_completions(body: dict) -> tuple:
        schema.check_fields(body, COMPLETION_FIELDS)
        texts = schema.texts(body, "prompt", c.max_client_batch)
        for name in ("model", "user", "suffix"):
            schema.string(body, name)
        schema.unsupported(body, "body", {"n": 1, "best_of": 1, "echo": False, "stream": False,
                                          "logprobs": None, "suffix": None, "logit_bias": None},
                           "one greedy completion per prompt, answered whole")
        schema.unsupported(body, "body", {"temperature": 0, "top_p": 1, "presence_penalty": 0,
                                          "frequency_penalty": 0}, "decoding is greedy")
        schema.integer(body, "seed", None, -(2**63), 2**64 - 1)
        new = schema.integer(body, "max_tokens", served.max_new_tokens, 1, served.max_target_tokens)
        stop = body.get("stop")
        stop = [stop] if isinstance(stop, str) else stop
        if stop is not None and not (isinstance(stop, list) and len(stop) <= 4
                                     and all(isinstance(s, str) and s for s in stop)):
            raise schema.RequestError(422, "stop", "stop: expected a string or up to 4 strings, got "
                                      f"{schema._short(body['stop'])}")
        return texts, (1, new, 1.0, False), c.truncate, {"stop": stop or [], "max_new_tokens": new}

    def respond_completions(results: list[str], items: list[Item], extra: dict):
        choices, completion = [], 0
        for i, text in enumerate(results):
            cuts = [j for j in (text.find(s) for s in extra["stop"]) if j >= 0]
            text = text[: min(cuts)] if cuts else text
            tokens = served.output_tokens([text])[0]
            length = not cuts and tokens >= extra["max_new_tokens"]
            completion += tokens + (not length)  # the end token counts where one was generated
            choices.append({"index": i, "text": text, "logprobs": None,
                            "finish_reason": "length" if length else "stop"})
        prompt = sum(item.n for item in items)
        return json_response({"id": f"cmpl-{uuid.uuid4().hex}", "object": "text_completion",
                              "created": int(time.time()), "model": c.model_name, "choices": choices,
                              "usage": {"prompt_tokens": prompt, "completion_tokens": completion,
                                        "total_tokens": prompt + completion}})

    return {"/v1/completions": Endpoint(parse_completions, respond_completions)}


def model_card(service: Service, created: int) -> dict[str, Any]:
    """The one entry of GET /v1/models."""
    return {"id": service.config.model_name, "object": "model", "created": created, "owned_by": "tformer"}


def _vector(vector: np.ndarray, encoding: str) -> list[float] | str:
    if encoding == "base64":  # OpenAI's: the float32 values' little-endian bytes
        return base64.b64encode(vector.astype("<f4").tobytes()).decode()
    return vector.tolist()
