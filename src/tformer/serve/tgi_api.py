"""text-generation-inference's protocol (TGI), for a seq2seq run, as its clients send it.

    POST /generate  {"inputs": str, "parameters"?: {...}}  -> {"generated_text", "details"?}
    POST /          {"inputs": str, "parameters"?: {...}, "stream"?: false}
                    -> [{"generated_text", "details"?}]    (TGI's compatibility route, which
                       huggingface_hub's InferenceClient(model=URL).text_generation calls)

A list of inputs (a tformer extension) is answered with a list. Parameters done: max_new_tokens,
stop (the text is cut before the first stop sequence), details (finish reason and the count of
generated tokens, re-tokenized), seed (decoding is deterministic: it changes nothing),
return_full_text false, and tformer's own beam_size, length_penalty and early_stopping (beam
search's peers' rule: `tformer generate --early-stopping`). Sampling parameters
(do_sample, temperature, top_k, ...) are refused with the answer Hugging Face's servers give
for parameters a model does not use, so that huggingface_hub drops them and warns.
"""

from __future__ import annotations

from typing import Any

from tformer.kinds.serving import Item
from tformer.nn.search_args import check_early_stopping, check_length_penalty
from tformer.serve import schema
from tformer.serve.endpoint import Endpoint, Service, json_response

MAX_STOP = 4  # TGI's default --max-stop-sequences
SAMPLING = ("do_sample", "temperature", "top_k", "top_p", "typical_p", "repetition_penalty",
            "frequency_penalty", "best_of", "top_n_tokens", "grammar", "adapter_id", "watermark",
            "decoder_input_details")
PARAMETERS = ("max_new_tokens", "stop", "details", "seed", "return_full_text", "truncate", "beam_size",
              "length_penalty", "early_stopping", *SAMPLING)


def generation(service: Service) -> dict[str, Endpoint]:
    """/generate and / for a seq2seq run."""
    c, served = service.config, service.served

    def parse(body: dict, compat: bool) -> tuple:
        schema.check_fields(body, ("inputs", "parameters", "stream") if compat else ("inputs", "parameters"))
        if body.get("stream"):
            raise schema.RequestError(422, "stream", "stream: expected false (this server answers whole "
                                      "texts), got true")
        texts = schema.texts(body, "inputs", c.max_client_batch)
        p = schema.obj(body, "parameters")
        schema.check_fields(p, PARAMETERS, "parameters")
        unused = [name for name in SAMPLING if p.get(name) not in (None, False)]
        if unused:
            raise schema.RequestError(400, f"parameters.{unused[0]}", "The following `model_kwargs` are not "
                                      f"used by the model: {unused} (this server decodes greedily or "
                                      "with beam search)")
        schema.unsupported(p, "parameters", {"return_full_text": False, "truncate": None},
                           "a seq2seq model's output never repeats its input; inputs are cut on the right")
        new = schema.integer(p, "max_new_tokens", served.max_new_tokens, 1, served.max_target_tokens,
                             "parameters")
        beam = schema.integer(p, "beam_size", 1, 1, schema.MAX_BEAM, "parameters")
        penalty = schema.number(p, "length_penalty", 1.0, 0.0, "parameters")
        try:
            check_length_penalty(penalty, new)
        except ValueError as e:
            raise schema.RequestError(422, "parameters.length_penalty", f"parameters.{e}") from None
        early = schema.boolean(p, "early_stopping", False, "parameters")
        try:
            check_early_stopping(early, beam)
        except ValueError as e:
            raise schema.RequestError(422, "parameters.early_stopping", f"parameters.{e}") from None
        schema.integer(p, "seed", None, 0, 2**64 - 1, "parameters")
        stop = _stop(p.get("stop"))
        extra = {"details": schema.boolean(p, "details", False, "parameters"), "stop": stop,
                 "max_new_tokens": new, "listed": compat or isinstance(body["inputs"], list)}
        return texts, (beam, new, penalty, early), c.truncate, extra

    def respond(results: list[str], items: list[Item], extra: dict):
        answers = [_answer(text, item, extra, served) for text, item in zip(results, items, strict=True)]
        return json_response(answers if extra["listed"] else answers[0])

    return {"/generate": Endpoint(lambda body: parse(body, False), respond),
            "/": Endpoint(lambda body: parse(body, True), respond)}


def _stop(value: Any) -> list[str]:
    if value is None:
        return []
    if not isinstance(value, list) or not all(isinstance(s, str) and s for s in value):
        raise schema.RequestError(422, "parameters.stop", "parameters.stop: expected a list of non-empty "
                                  f"strings, got {schema._short(value)}")
    if len(value) > MAX_STOP:
        raise schema.RequestError(422, "parameters.stop", f"parameters.stop: expected at most {MAX_STOP} "
                                  f"sequences, got {len(value)}")
    return value


def _answer(text: str, item: Item, extra: dict, served) -> dict[str, Any]:
    """{"generated_text", "details"?}: cut at the first stop sequence, as TGI stops there."""
    reason = None
    cuts = [i for i in (text.find(s) for s in extra["stop"]) if i >= 0]
    if cuts:
        text, reason = text[: min(cuts)], "stop_sequence"
    out: dict[str, Any] = {"generated_text": text}
    if extra["details"]:
        tokens = served.output_tokens([text])[0]
        if reason is None:
            reason = "length" if tokens >= extra["max_new_tokens"] else "eos_token"
            tokens += reason == "eos_token"
        out["details"] = {"finish_reason": reason, "generated_tokens": tokens, "input_length": item.n,
                          "seed": None, "prefill": [], "tokens": []}
    return out


def info(service: Service) -> dict[str, Any]:
    """The fields of TGI's /info, for a seq2seq run."""
    c, served = service.config, service.served
    return {"model_id": c.model_name, "model_dtype": c.dtype, "model_device_type": c.device.split(":")[0],
            "max_input_tokens": service.input_limit,
            "max_total_tokens": service.input_limit + served.max_target_tokens,
            "max_best_of": 1, "max_stop_sequences": MAX_STOP, "max_client_batch_size": c.max_client_batch}
