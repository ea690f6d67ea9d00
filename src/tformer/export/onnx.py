"""Export a model to ONNX with dynamic batch and sequence axes, checked with onnxruntime.

    export_onnx(graph_for(MODEL_DIR), "model.onnx")      an encoder (or sentence embedding)
    export_onnx(ClassifierGraph(model), "clf.onnx")       a classifier: logits
    export_seq2seq_onnx(model, "OUT/", card)              encoder.onnx + decoder.onnx, KV cache

The graphs are traced by torch.onnx's dynamo exporter from the same modules users run
(tracing makes ``tformer.kernels`` choose the plain, exportable kernels). Encoder-side inputs:
``input_ids`` and ``attention_mask`` (B, S) int64, plus ``token_type_ids`` when the model has
token types. Outputs: ``last_hidden_state`` (B, S, D), zeros at padding; ``sentence_embedding``
(B, dim) for a sentence-transformers directory or an embedding run; ``logits`` (B, C) for a
classifier. Every file is checked against tformer in onnxruntime at shapes other than the
traced one before it is published through ``tformer.storage.files`` (a file: temp file and rename; the
seq2seq folder: ``export_dir.publish_export``).

The seq2seq pair, for a greedy or beam loop outside Python:
    encoder.onnx  input_ids, attention_mask (B, S) -> last_hidden_state (B, S, D), cross_keys,
                  cross_values (L, B, H, S, Dh): every decoder layer's cross-attention keys and
                  values, computed once per input
    decoder.onnx  decoder_input_ids (B, T), encoder_attention_mask (B, S), past_keys, past_values
                  (L, B, H, P, Dh) (P = 0 at the first step), cross_keys, cross_values
                  -> logits (B, T, V), present_keys, present_values (L, B, H, P + T, Dh)
"""

from __future__ import annotations

import sys
import tempfile
from pathlib import Path

import torch
from torch import Tensor, nn

from tformer.embeddings.sentence import pool
from tformer.errors import require
from tformer.export.export_dir import check_destination, publish_export
from tformer.export.model_card import Card, render
from tformer.formats.st_layout import read_layout
from tformer.nn.model import Encoder
from tformer.storage.files import replaced_on_success

EXTRA = "onnx"
TOLERANCE = 1e-4  # max abs difference, float32, tformer vs onnxruntime


class OnnxGraph(nn.Module):
    """What the ONNX file computes: the encoder, and pooling + normalisation when asked."""

    def __init__(self, encoder: Encoder, pooling: tuple[str, ...] | None = None,
                 normalize: bool = False) -> None:
        super().__init__()
        self.encoder, self.pooling, self.normalize = encoder, pooling, normalize

    @property
    def config(self):
        return self.encoder.config

    @property
    def input_names(self) -> list[str]:
        types = ["token_type_ids"] if self.config.type_vocab_size else []
        return ["input_ids", "attention_mask", *types]

    @property
    def output_names(self) -> list[str]:
        return [self.output_name]

    @property
    def output_name(self) -> str:
        return "sentence_embedding" if self.pooling else "last_hidden_state"

    def forward(self, input_ids: Tensor, attention_mask: Tensor,
                token_type_ids: Tensor | None = None) -> Tensor:
        """Shape: (B, S) each -> (B, S, D), or (B, dim) when pooling."""
        out = self.encoder(input_ids, attention_mask, token_type_ids=token_type_ids)
        if not self.pooling:
            return out.last_hidden_state
        emb = pool(out.last_hidden_state, out.mask, self.pooling)
        return nn.functional.normalize(emb, p=2.0, dim=-1) if self.normalize else emb


class ClassifierGraph(OnnxGraph):
    """A classifier (``config.n_classes``; an ``encoder`` and a head): logits (B, C)."""

    def __init__(self, classifier: nn.Module) -> None:
        super().__init__(classifier.encoder)
        self.classifier = classifier

    @property
    def output_name(self) -> str:
        return "logits"

    def forward(self, input_ids: Tensor, attention_mask: Tensor,
                token_type_ids: Tensor | None = None) -> Tensor:
        """Shape: (B, S) each -> (B, C)."""
        return self.classifier(input_ids, attention_mask, token_type_ids).logits


def graph_for(directory: str | Path) -> OnnxGraph:
    """The module to export for a model directory (sentence-transformers: with pooling)."""
    layout = read_layout(directory)
    encoder = Encoder.from_pretrained(directory)
    if (Path(directory) / "modules.json").is_file():
        return OnnxGraph(encoder, layout.pooling, layout.normalize).eval()
    return OnnxGraph(encoder).eval()


def example_inputs(graph: OnnxGraph, batch: int, seq: int, seed: int = 0) -> dict[str, Tensor]:
    """Random ids with ragged padding (row i has seq - i real tokens, at least 1)."""
    config = graph.config
    g = torch.Generator().manual_seed(seed)
    ids = torch.randint(0, config.vocab_size, (batch, seq), generator=g)
    inputs = {"input_ids": ids, "attention_mask": _ragged_mask(batch, seq)}
    if config.type_vocab_size:
        inputs["token_type_ids"] = torch.zeros_like(ids)
    return inputs


def _ragged_mask(batch: int, seq: int) -> Tensor:
    lengths = torch.clamp(seq - torch.arange(batch), min=1)
    return (torch.arange(seq)[None, :] < lengths[:, None]).long()  # (B, S)


def _check_out(out: Path) -> None:
    if out.is_dir():
        raise IsADirectoryError(f"--onnx: {out} is a directory; expected a file path like model.onnx")
    if not out.parent.is_dir():
        raise FileNotFoundError(f"--onnx: the folder {out.parent} does not exist")


def _trace(graph: nn.Module, inputs: dict[str, Tensor], dynamic: dict, path: Path, opset: int) -> None:
    """Trace ``graph`` at ``inputs`` and save the ONNX program to ``path``."""
    graph.eval()
    with torch.no_grad():
        program = torch.onnx.export(
            graph, (), kwargs=inputs, dynamo=True, dynamic_shapes=dynamic, opset_version=opset,
            input_names=list(inputs), output_names=graph.output_names, verbose=False,
        )
    program.save(str(path))


def report(out, diff: float) -> None:
    """The line an export prints once onnxruntime has checked it."""
    print(f"wrote {out} (onnxruntime matches tformer: max abs diff {diff:.2g} <= {TOLERANCE:g})",
          file=sys.stderr)


def export_onnx(graph: OnnxGraph | str | Path, out: str | Path, opset: int = 18) -> float:
    """Write ``out`` atomically; return the max abs difference measured with onnxruntime.
    ``graph``: an OnnxGraph/ClassifierGraph, or a model directory (see ``graph_for``)."""
    require("onnx", EXTRA, "ONNX export")
    require("onnxscript", EXTRA, "ONNX export")
    out = Path(out)
    _check_out(out)
    if not isinstance(graph, nn.Module):
        graph = graph_for(graph)
    graph = graph.eval()
    inputs = example_inputs(graph, 2, min(8, graph.config.max_len))
    batch, seq = torch.export.Dim("batch"), torch.export.Dim("sequence", max=graph.config.max_len)
    dynamic = {name: {0: batch, 1: seq} for name in graph.input_names}
    with replaced_on_success(out) as tmp:  # published only once onnxruntime agrees
        _trace(graph, inputs, dynamic, tmp, opset)
        diff = check_onnx(tmp, graph)
    return diff


def _session(path: str | Path):
    ort = require("onnxruntime", EXTRA, "checking an ONNX export")
    return ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])


def _compare(what: str, got, expected: Tensor) -> float:
    expected = expected.numpy()
    diff = float(abs(got - expected).max()) if got.size else 0.0
    if got.shape != expected.shape or not diff <= TOLERANCE:
        raise ValueError(
            f"ONNX check ({what}): expected shape {expected.shape} within {TOLERANCE:g} of tformer, "
            f"got shape {got.shape}, max abs diff {diff:.3g}"
        )
    return diff


def check_onnx(path: str | Path, graph: OnnxGraph,
               shapes: tuple[tuple[int, int], ...] = ((1, 5), (3, 17))) -> float:
    """Run the file in onnxruntime at ``shapes`` (B, S); raise if it differs from tformer."""
    session = _session(path)
    worst = 0.0
    for b, s in shapes:
        s = min(s, graph.config.max_len)  # learned positions stop at max_len
        inputs = example_inputs(graph, b, s, seed=b * 100 + s)
        with torch.no_grad():
            expected = graph(**inputs)
        (got,) = session.run(None, {k: v.numpy() for k, v in inputs.items()})
        worst = max(worst, _compare(f"(B, S) = ({b}, {s})", got, expected))
    return worst


# Seq2seq: an encoder file and a decoder file with a KV cache ---------------------------------
class Seq2SeqEncoderGraph(nn.Module):
    """Source -> memory, and every decoder layer's cross-attention keys and values."""

    output_names = ["last_hidden_state", "cross_keys", "cross_values"]

    def __init__(self, model: nn.Module) -> None:
        super().__init__()
        self.model = model

    def forward(self, input_ids: Tensor, attention_mask: Tensor) -> tuple[Tensor, Tensor, Tensor]:
        """Shape: (B, S) each -> (B, S, D), (L, B, H, S, Dh), (L, B, H, S, Dh)."""
        memory = self.model.encode(input_ids, attention_mask).last_hidden_state  # (B, S, D)
        start = input_ids[:, :1]  # (B, 1): any token; only the cross keys/values are kept
        past = self.model.decode(start, memory, attention_mask, use_cache=True).past_key_values
        return memory, torch.stack([p[2] for p in past]), torch.stack([p[3] for p in past])


class Seq2SeqDecoderGraph(nn.Module):
    """New target tokens + the self-attention cache + the cross keys/values -> logits, new cache."""

    output_names = ["logits", "present_keys", "present_values"]

    def __init__(self, model: nn.Module) -> None:
        super().__init__()
        self.model = model

    def forward(self, decoder_input_ids: Tensor, encoder_attention_mask: Tensor, past_keys: Tensor,
                past_values: Tensor, cross_keys: Tensor, cross_values: Tensor) -> tuple[Tensor, ...]:
        """Shape: (B, T), (B, S), (L, B, H, P, Dh) x 2, (L, B, H, S, Dh) x 2
        -> (B, T, V), (L, B, H, P + T, Dh) x 2."""
        past = tuple(zip(past_keys.unbind(0), past_values.unbind(0), cross_keys.unbind(0),
                         cross_values.unbind(0), strict=True))
        out = self.model.decode(decoder_input_ids, None, encoder_attention_mask,
                                past_key_values=past, use_cache=True)
        presents = out.past_key_values
        return out.logits, torch.stack([p[0] for p in presents]), torch.stack([p[1] for p in presents])


def _decoder_inputs(model: nn.Module, ids: Tensor, mask: Tensor, past_len: int, t: int,
                    seed: int) -> dict[str, Tensor]:
    """Decoder-file inputs: random new tokens, a random self cache of ``past_len`` and the
    real cross keys/values of ``ids``."""
    c = model.config
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        _, cross_keys, cross_values = Seq2SeqEncoderGraph(model)(ids, mask)
    cache = (c.decoder_layers, ids.size(0), c.n_heads, past_len, c.head_dim)  # (L, B, H, P, Dh)
    return {"decoder_input_ids": torch.randint(0, c.vocab_size, (ids.size(0), t), generator=g),
            "encoder_attention_mask": mask,
            "past_keys": torch.randn(cache, generator=g), "past_values": torch.randn(cache, generator=g),
            "cross_keys": cross_keys, "cross_values": cross_values}


def _source(config, b: int, s: int, seed: int) -> tuple[Tensor, Tensor]:
    g = torch.Generator().manual_seed(seed)
    return torch.randint(0, config.vocab_size, (b, s), generator=g), _ragged_mask(b, s)


def seq2seq_onnx_files(model: nn.Module, scratch: Path, opset: int = 18) -> tuple[dict[str, bytes], float]:
    """encoder.onnx and decoder.onnx for a Seq2SeqTransformer (traced into folder ``scratch``),
    each checked in onnxruntime; returns the files and the max abs difference."""
    require("onnx", EXTRA, "ONNX export")
    require("onnxscript", EXTRA, "ONNX export")
    model = model.eval()
    c = model.config
    batch = torch.export.Dim("batch")
    src = torch.export.Dim("source", max=c.max_len)
    tgt, past = torch.export.Dim("target", max=c.max_len), torch.export.Dim("past", max=c.max_len)
    ids, mask = _source(c, 2, min(7, c.max_len), seed=0)
    enc_path, dec_path = scratch / "encoder.onnx", scratch / "decoder.onnx"
    _trace(Seq2SeqEncoderGraph(model), {"input_ids": ids, "attention_mask": mask},
           {"input_ids": {0: batch, 1: src}, "attention_mask": {0: batch, 1: src}}, enc_path, opset)
    cache = {1: batch, 3: past}
    _trace(Seq2SeqDecoderGraph(model), _decoder_inputs(model, ids, mask, past_len=3, t=2, seed=1),
           {"decoder_input_ids": {0: batch, 1: tgt}, "encoder_attention_mask": {0: batch, 1: src},
            "past_keys": cache, "past_values": cache,
            "cross_keys": {1: batch, 3: src}, "cross_values": {1: batch, 3: src}}, dec_path, opset)
    worst = check_seq2seq_onnx(enc_path, dec_path, model)
    return {"encoder.onnx": enc_path.read_bytes(), "decoder.onnx": dec_path.read_bytes()}, worst


def check_seq2seq_onnx(encoder_path: str | Path, decoder_path: str | Path, model: nn.Module,
                       shapes: tuple[tuple[int, int], ...] = ((1, 5), (3, 11))) -> float:
    """Both files against tformer at other shapes, the decoder at P = 0 (first step) and P > 0."""
    enc, dec = _session(encoder_path), _session(decoder_path)
    worst = 0.0
    for b, s in shapes:
        s = min(s, model.config.max_len)
        ids, mask = _source(model.config, b, s, seed=b * 100 + s)
        with torch.no_grad():
            expected = Seq2SeqEncoderGraph(model)(ids, mask)
        got = enc.run(None, {"input_ids": ids.numpy(), "attention_mask": mask.numpy()})
        for name, g, e in zip(Seq2SeqEncoderGraph.output_names, got, expected, strict=True):
            worst = max(worst, _compare(f"encoder {name} at (B, S) = ({b}, {s})", g, e))
        for past_len, t in ((0, 1), (4, 1), (2, 3)):
            inputs = _decoder_inputs(model, ids, mask, past_len, t, seed=past_len)
            with torch.no_grad():
                expected = Seq2SeqDecoderGraph(model)(**inputs)
            got = dec.run(None, {k: v.numpy() for k, v in inputs.items()})
            for name, g, e in zip(Seq2SeqDecoderGraph.output_names, got, expected, strict=True):
                worst = max(worst, _compare(f"decoder {name} at P = {past_len}, T = {t}", g, e))
    return worst


USAGE = """
import onnxruntime as ort   # encoder.onnx once per input, then decoder.onnx once per token
encoder = ort.InferenceSession("DIR/encoder.onnx")
decoder = ort.InferenceSession("DIR/decoder.onnx")
# see README.md of tformer: `tformer export RUN --onnx DIR` for the inputs and outputs
"""


def export_seq2seq_onnx(model: nn.Module, out: str | Path, card: Card, extra_files: dict[str, bytes],
                        opset: int = 18) -> tuple[Path, float]:
    """Publish folder ``out`` with encoder.onnx, decoder.onnx, ``extra_files`` (the tokenizer)
    and a model card; returns it and the max abs difference measured with onnxruntime."""
    out = check_destination(out, "--onnx")  # refuse before the tracing
    with tempfile.TemporaryDirectory() as scratch:
        files, diff = seq2seq_onnx_files(model, Path(scratch), opset)
    files.update(extra_files)
    files["README.md"] = render(card, "ONNX (encoder.onnx + decoder.onnx with a KV cache)", USAGE)
    return publish_export(out, files, "--onnx"), diff
