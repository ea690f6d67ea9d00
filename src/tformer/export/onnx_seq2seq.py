"""A Seq2SeqTransformer as an ONNX folder in Optimum's layout (ORTModelForSeq2SeqLM's files):

    encoder_model.onnx            input_ids, attention_mask (B, S) -> last_hidden_state (B, S, D)
    decoder_model.onnx            the first step: input_ids (B, T), encoder_hidden_states (B, S, D),
                                  encoder_attention_mask (B, S) -> logits (B, T, V) and, per
                                  decoder layer i, present.i.decoder.key/value (B, H, T, Dh) and
                                  present.i.encoder.key/value (B, H, S, Dh)
    decoder_with_past_model.onnx  each later step: input_ids (B, T), encoder_attention_mask and
                                  past_key_values.i.{decoder,encoder}.{key,value} -> logits and
                                  present.i.decoder.key/value (B, H, P + T, Dh)
    config.json, generation_config.json, tokenizer.json, tokenizer_config.json, README.md

config.json is the transformers config (MarianMTModel or Pegasus, ``hf_seq2seq``) where one
expresses the model, else tformer's own. The hidden states are tformer's (not permuted as the
transformers export permutes them): only the files above read them. Every file is checked
against tformer in onnxruntime (first step, and later steps with a cache) before the folder is
published whole; the model card shows a greedy decoding loop with onnxruntime and tokenizers.
"""

from __future__ import annotations

import tempfile
from pathlib import Path

import torch
from torch import Tensor, nn

from tformer.errors import require
from tformer.export.export_dir import check_destination, publish_export
from tformer.export.model_card import Card, render
from tformer.export.onnx import (
    EXTRA,
    _compare,
    _ragged_mask,
    _session,
    _trace,
    check_opset_written,
    quiet_exporter,
)

FILES = ("encoder_model.onnx", "decoder_model.onnx", "decoder_with_past_model.onnx")


def cache_names(prefix: str, layers: int, cross: bool = True) -> list[str]:
    """Optimum's cache names, layer by layer: PREFIX.i.decoder.key, .decoder.value (self-
    attention), then PREFIX.i.encoder.key, .encoder.value (cross-attention) when ``cross``."""
    parts = ("decoder", "encoder") if cross else ("decoder",)
    return [f"{prefix}.{i}.{part}.{kv}" for i in range(layers) for part in parts for kv in ("key", "value")]


class EncoderGraph(nn.Module):
    output_names = ["last_hidden_state"]

    def __init__(self, model: nn.Module) -> None:
        super().__init__()
        self.model = model

    def forward(self, input_ids: Tensor, attention_mask: Tensor) -> Tensor:
        """Shape: (B, S) each -> (B, S, D)."""
        return self.model.encode(input_ids, attention_mask).last_hidden_state


class DecoderGraph(nn.Module):
    """The first decoding step(s): no cache in; every layer's self and cross keys/values out."""

    def __init__(self, model: nn.Module) -> None:
        super().__init__()
        self.model = model
        self.output_names = ["logits", *cache_names("present", model.config.decoder_layers)]

    def forward(self, input_ids: Tensor, encoder_hidden_states: Tensor, encoder_attention_mask: Tensor
                ) -> tuple[Tensor, ...]:
        """Shape: (B, T), (B, S, D), (B, S) -> (B, T, V), then 4 x L of (B, H, T or S, Dh)."""
        out = self.model.decode(input_ids, encoder_hidden_states, encoder_attention_mask,
                                use_cache=True)
        return (out.logits, *[t for layer in out.past_key_values for t in layer])


class DecoderWithPastGraph(nn.Module):
    """A later step: the cache in (self keys/values so far, the cross keys/values), the new
    tokens' logits and the grown self cache out."""

    def __init__(self, model: nn.Module) -> None:
        super().__init__()
        self.model = model
        layers = model.config.decoder_layers
        self.input_names = ["input_ids", "encoder_attention_mask",
                            *cache_names("past_key_values", layers)]
        self.output_names = ["logits", *cache_names("present", layers, cross=False)]

    def forward(self, input_ids: Tensor, encoder_attention_mask: Tensor, *past: Tensor
                ) -> tuple[Tensor, ...]:
        """Shape: (B, T), (B, S), 4 x L of (B, H, P or S, Dh)
        -> (B, T, V), 2 x L of (B, H, P + T, Dh)."""
        layers = tuple(tuple(past[i : i + 4]) for i in range(0, len(past), 4))  # (k, v, cross k, cross v)
        out = self.model.decode(input_ids, None, encoder_attention_mask, past_key_values=layers,
                                use_cache=True)
        return (out.logits, *[t for layer in out.past_key_values for t in layer[:2]])


def _source(config, b: int, s: int, seed: int) -> tuple[Tensor, Tensor]:
    g = torch.Generator().manual_seed(seed)
    return torch.randint(0, config.vocab_size, (b, s), generator=g), _ragged_mask(b, s)


def _step_inputs(model: nn.Module, b: int, s: int, past: int, t: int, seed: int) -> tuple[dict, dict, dict]:
    """Inputs of the three files for one source batch: the encoder's; the first step's (t new
    tokens); a later step's (a random self cache of length ``past``, the real cross cache)."""
    c, g = model.config, torch.Generator().manual_seed(seed + 1)
    ids, mask = _source(c, b, s, seed)
    with torch.no_grad():
        memory = EncoderGraph(model)(ids, mask)
        first = DecoderGraph(model)(torch.randint(0, c.vocab_size, (b, t), generator=g), memory, mask)
    cross = [first[1 + 4 * i + j] for i in range(c.decoder_layers) for j in (2, 3)]  # (B, H, S, Dh)
    shape = (b, c.n_heads, past, c.head_dim)
    caches = []
    for i in range(c.decoder_layers):
        caches += [torch.randn(shape, generator=g), torch.randn(shape, generator=g),
                   *cross[2 * i : 2 * i + 2]]
    new = torch.randint(0, c.vocab_size, (b, t), generator=g)
    return ({"input_ids": ids, "attention_mask": mask},
            {"input_ids": new, "encoder_hidden_states": memory, "encoder_attention_mask": mask},
            {"input_ids": new, "encoder_attention_mask": mask, "past": caches})


def _trace_all(model: nn.Module, scratch: Path, opset: int) -> None:
    c = model.config
    batch = torch.export.Dim("batch")
    src, tgt = torch.export.Dim("source", max=c.max_len), torch.export.Dim("target", max=c.max_len)
    past = torch.export.Dim("past", max=c.max_len)
    enc, first, later = _step_inputs(model, 2, min(7, c.max_len), past=3, t=2, seed=0)
    _trace(EncoderGraph(model), enc, {name: {0: batch, 1: src} for name in enc}, scratch / FILES[0], opset)
    first_shapes = {"input_ids": {0: batch, 1: tgt}, "encoder_hidden_states": {0: batch, 1: src},
                    "encoder_attention_mask": {0: batch, 1: src}}
    _trace(DecoderGraph(model), first, first_shapes, scratch / FILES[1], opset)
    graph = DecoderWithPastGraph(model).eval()
    caches = [{0: batch, 2: past if k % 4 < 2 else src} for k in range(len(later["past"]))]
    with torch.no_grad(), quiet_exporter():
        program = torch.onnx.export(
            graph, (later["input_ids"], later["encoder_attention_mask"], *later["past"]), dynamo=True,
            dynamic_shapes=({0: batch, 1: tgt}, {0: batch, 1: src}, tuple(caches)),  # *past: one tuple
            opset_version=opset,
            input_names=graph.input_names, output_names=graph.output_names, verbose=False)
    program.save(str(scratch / FILES[2]))
    check_opset_written(scratch / FILES[2], opset)


def check_files(scratch: Path, model: nn.Module,
                shapes: tuple[tuple[int, int], ...] = ((1, 5), (3, 11))) -> float:
    """The three files against tformer at other shapes: the first step of 1 and 3 tokens, later
    steps after caches of 1 and 4; returns the max abs difference."""
    enc, first, later = (_session(scratch / name) for name in FILES)
    worst = 0.0
    for b, s in shapes:
        s = min(s, model.config.max_len)
        for past, t in ((1, 1), (4, 3)):
            e_in, f_in, l_in = _step_inputs(model, b, s, past, t, seed=b * 100 + s + past)
            steps = DecoderWithPastGraph(model)
            with torch.no_grad():
                expected = [(EncoderGraph(model)(**e_in),), DecoderGraph(model)(**f_in),
                            steps(l_in["input_ids"], l_in["encoder_attention_mask"], *l_in["past"])]
            l_feed = {"input_ids": l_in["input_ids"],
                      "encoder_attention_mask": l_in["encoder_attention_mask"],
                      **dict(zip(steps.input_names[2:], l_in["past"], strict=True))}
            checks = ((FILES[0], enc, e_in, expected[0]), (FILES[1], first, f_in, expected[1]),
                      (FILES[2], later, l_feed, expected[2]))
            for name, session, feed, want in checks:
                got = session.run(None, {k: v.numpy() for k, v in feed.items()})
                outputs = [o.name for o in session.get_outputs()]
                for out_name, g, w in zip(outputs, got, want, strict=True):
                    where = f"{name} {out_name} at (B, S) = ({b}, {s}), P = {past}"
                    worst = max(worst, _compare(where, g, w))
    return worst


def seq2seq_onnx_files(model: nn.Module, opset: int = 18) -> tuple[dict[str, bytes], float]:
    """The three ONNX files of ``model`` (a Seq2SeqTransformer), each checked in onnxruntime;
    returns them and the max abs difference measured."""
    require("onnx", EXTRA, "ONNX export")
    require("onnxscript", EXTRA, "ONNX export")
    model = model.eval()
    with tempfile.TemporaryDirectory() as scratch:
        _trace_all(model, Path(scratch), opset)
        diff = check_files(Path(scratch), model)
        return {name: (Path(scratch) / name).read_bytes() for name in FILES}, diff


USAGE = """
import numpy as np
import onnxruntime as ort
from tokenizers import Tokenizer

tokenizer = Tokenizer.from_file("DIR/tokenizer.json")  # cuts sources at the run's max_length
encoder, decoder, decoder_with_past = (ort.InferenceSession(f"DIR/{{name}}.onnx") for name in
                                       ("encoder_model", "decoder_model", "decoder_with_past_model"))
BOS, EOS, MAX_NEW_TOKENS = {bos}, {eos}, {max_new_tokens}


def generate(text):
    ids = np.array([tokenizer.encode(text).ids], dtype=np.int64)  # the source and its </s>
    mask = np.ones_like(ids)
    (memory,) = encoder.run(None, {{"input_ids": ids, "attention_mask": mask}})
    outputs = decoder.run(None, {{"input_ids": np.array([[BOS]]), "encoder_hidden_states": memory,
                                 "encoder_attention_mask": mask}})
    names = [o.name for o in decoder.get_outputs()]
    cache = dict(zip([n.replace("present", "past_key_values") for n in names[1:]], outputs[1:]))
    tokens = []
    while True:  # greedy: the most likely next token, until </s>
        token = int(outputs[0][0, -1].argmax())
        if token == EOS or len(tokens) == MAX_NEW_TOKENS:
            return tokenizer.decode(tokens)
        tokens.append(token)
        outputs = decoder_with_past.run(None, {{"input_ids": np.array([[token]]),
                                               "encoder_attention_mask": mask, **cache}})
        later = [o.name.replace("present", "past_key_values") for o in decoder_with_past.get_outputs()]
        cache.update(zip(later[1:], outputs[1:]))  # the self-attention cache grows; the cross one stays


print(generate("some text"))
"""


def export_seq2seq_onnx(model: nn.Module, out: str | Path, card: Card, extra_files: dict[str, bytes],
                        ids: dict[str, int], max_new_tokens: int, opset: int = 18) -> tuple[Path, float]:
    """Publish folder ``out``: the three files, ``extra_files`` (config.json, the tokenizer...)
    and a model card with the decoding loop; returns it and the max abs difference measured.
    ``ids``: bos_id, eos_id of the run's vocabulary."""
    out = check_destination(out, "--onnx")  # refuse before the tracing
    files, diff = seq2seq_onnx_files(model, opset)
    files.update(extra_files)
    usage = USAGE.format(bos=ids["bos_id"], eos=ids["eos_id"], max_new_tokens=max_new_tokens)
    files["README.md"] = render(card, "ONNX in Optimum's layout (encoder_model.onnx, decoder_model.onnx, "
                                      "decoder_with_past_model.onnx; ORTModelForSeq2SeqLM loads it)", usage,
                                library_name="onnx", pipeline_tag="text2text-generation",
                                tags=("onnx", "optimum"))
    return publish_export(out, files, "--onnx"), diff
