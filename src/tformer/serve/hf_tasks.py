"""Hugging Face's task API for token classification, as huggingface_hub's
InferenceClient(model=URL).token_classification sends it and transformers' pipeline answers.

    POST /   {"inputs": str | [str], "parameters"?: {"aggregation_strategy"?, "ignore_labels"?,
              "stride"?}, "truncate"?}
             -> [{"entity_group", "score", "word", "start", "end"}, ...] (one input), or a list
                of those (a list of inputs)

The entities are those of pipeline("token-classification") with its aggregation_strategy "simple"
(the default, as Hugging Face's API) or "first" (a word takes its first sub-word's label: what
`tformer eval` scores and `tformer predict` shows; tformer.text.word_pieces); ignore_labels
(default ["O"]) leaves the groups of those labels out, as the pipeline does. A text longer than
the model's inputs is refused (413) unless truncating (the server's --truncate, or "truncate":
true), where the pipeline would cut it silently; stride (the pipeline's overlapping windows) is
not done.
"""

from __future__ import annotations

from tformer.serve import schema
from tformer.serve.endpoint import Endpoint, Service, json_response
from tformer.text.word_pieces import STRATEGIES

PARAMETERS = ("aggregation_strategy", "ignore_labels", "stride")


def token_classification(service: Service) -> dict[str, Endpoint]:
    """/ for a token classifier."""
    c = service.config

    def parse(body: dict) -> tuple:
        schema.check_fields(body, ("inputs", "parameters", "truncate"))
        texts = schema.texts(body, "inputs", c.max_client_batch)
        params = schema.obj(body, "parameters")
        schema.check_fields(params, PARAMETERS, "parameters")
        strategy = schema.choice(params, "aggregation_strategy", "simple", STRATEGIES, "parameters")
        schema.unsupported(params, "parameters", {"stride": None}, "texts are read whole, up to the "
                           "model's length")
        ignore = params.get("ignore_labels")
        if ignore is None:
            ignore = ["O"]
        if not isinstance(ignore, list) or not all(isinstance(x, str) for x in ignore):
            raise schema.RequestError(422, "parameters.ignore_labels", "parameters.ignore_labels: expected a "
                                      f"list of label names, got {schema._short(ignore)}")
        truncate = schema.boolean(body, "truncate", c.truncate)
        key = (tuple(sorted(set(ignore))), strategy)  # what a model batch shares
        return texts, key, truncate, {"batched": isinstance(body["inputs"], list)}

    def respond(results: list[list[dict]], items, extra: dict):
        return json_response(results if extra["batched"] else results[0])

    return {"/": Endpoint(parse, respond)}
