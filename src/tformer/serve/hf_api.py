"""Hugging Face's task API (its Inference API and Inference Endpoints) for fill-mask, a task TEI
does not serve, as huggingface_hub's InferenceClient(model=URL).fill_mask sends it.

    POST /   {"inputs": str | [str], "parameters"?: {"top_k"?, "targets"?}}
             -> one text: its fill-mask answer, as transformers' pipeline("fill-mask") gives it
                ([{"score", "token", "token_str", "sequence"}] best first; one such list per mask
                where the text has several); a list of texts: one answer per text

Texts longer than the model reads are cut (`--truncate`, on by default) or refused (413); a text
without the model's mask token within its length is refused (422), naming it.
"""

from __future__ import annotations

from tformer.serve import schema
from tformer.serve.endpoint import Endpoint, Service, json_response

TOP_K = 5  # fill-mask's default


def fill_mask(service: Service) -> dict[str, Endpoint]:
    """/ for a masked-LM run."""
    c, served = service.config, service.served

    def parse(body: dict) -> tuple:
        schema.check_fields(body, ("inputs", "parameters"))
        texts = schema.texts(body, "inputs", c.max_client_batch)
        p = schema.obj(body, "parameters")
        schema.check_fields(p, ("top_k", "targets"), "parameters")
        top_k = schema.integer(p, "top_k", TOP_K, 1, served.vocab_size, "parameters")
        targets = p.get("targets")
        if targets is not None:
            if isinstance(targets, str):
                targets = [targets]
            if not isinstance(targets, list) or not targets or not all(isinstance(t, str) for t in targets):
                got = schema._short(targets)
                raise schema.RequestError(422, "parameters.targets", "parameters.targets: expected a "
                                          f"string or a non-empty list of strings, got {got}")
            try:
                targets = tuple(served.target_ids(targets))
            except ValueError as e:
                raise schema.RequestError(422, "parameters.targets", f"parameters.{e}") from None
        return texts, (top_k, targets), c.truncate, {"batched": isinstance(body["inputs"], list)}

    def respond(results: list, items, extra: dict):
        return json_response(results if extra["batched"] else results[0])

    return {"/": Endpoint(parse, respond)}
