"""Export an encoder to ONNX with dynamic batch and sequence axes, checked with onnxruntime.

    export_onnx(MODEL_DIR, "model.onnx")

The graph is traced by torch.onnx's dynamo exporter from the same modules users run (tracing
makes ``tformer.kernels`` choose the plain, exportable kernels). Inputs: ``input_ids`` and
``attention_mask`` (B, S) int64, plus ``token_type_ids`` when the model has token types.
Output: ``last_hidden_state`` (B, S, D), zeros at padding; or, for a sentence-transformers
directory (``modules.json``), ``sentence_embedding`` (B, dim) pooled (and normalised) as the
directory says. The file is checked against tformer in onnxruntime at a second shape before
it replaces anything at the output path.
"""

from __future__ import annotations

import os
import tempfile
from pathlib import Path

import torch
from torch import Tensor, nn

from tformer.convert.st_layout import read_layout
from tformer.errors import require
from tformer.model import Encoder
from tformer.sentence import pool

EXTRA = "onnx"
TOLERANCE = 1e-4  # max abs difference, float32, tformer vs onnxruntime


class OnnxGraph(nn.Module):
    """What the ONNX file computes: the encoder, and pooling + normalisation when asked."""

    def __init__(self, encoder: Encoder, pooling: tuple[str, ...] | None = None,
                 normalize: bool = False) -> None:
        super().__init__()
        self.encoder, self.pooling, self.normalize = encoder, pooling, normalize

    @property
    def input_names(self) -> list[str]:
        types = ["token_type_ids"] if self.encoder.config.type_vocab_size else []
        return ["input_ids", "attention_mask", *types]

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


def graph_for(directory: str | Path) -> OnnxGraph:
    """The module to export for a model directory (sentence-transformers: with pooling)."""
    layout = read_layout(directory)
    encoder = Encoder.from_pretrained(directory)
    if (Path(directory) / "modules.json").is_file():
        return OnnxGraph(encoder, layout.pooling, layout.normalize).eval()
    return OnnxGraph(encoder).eval()


def example_inputs(graph: OnnxGraph, batch: int, seq: int, seed: int = 0) -> dict[str, Tensor]:
    """Random ids with ragged padding (row i has seq - i real tokens, at least 1)."""
    config = graph.encoder.config
    g = torch.Generator().manual_seed(seed)
    ids = torch.randint(0, config.vocab_size, (batch, seq), generator=g)
    lengths = torch.clamp(seq - torch.arange(batch), min=1)
    mask = (torch.arange(seq)[None, :] < lengths[:, None]).long()
    inputs = {"input_ids": ids, "attention_mask": mask}
    if config.type_vocab_size:
        inputs["token_type_ids"] = torch.zeros_like(ids)
    return inputs


def export_onnx(directory: str | Path, out: str | Path, opset: int = 18) -> float:
    """Write ``out`` atomically; return the max abs difference measured with onnxruntime."""
    require("onnx", EXTRA, "ONNX export")
    require("onnxscript", EXTRA, "ONNX export")
    out = Path(out)
    if out.is_dir():
        raise IsADirectoryError(f"--onnx: {out} is a directory; expected a file path like model.onnx")
    if not out.parent.is_dir():
        raise FileNotFoundError(f"--onnx: the folder {out.parent} does not exist")
    graph = graph_for(directory)
    inputs = example_inputs(graph, 2, 8)
    batch, seq = torch.export.Dim("batch"), torch.export.Dim("sequence", max=graph.encoder.config.max_len)
    dynamic = {name: {0: batch, 1: seq} for name in graph.input_names}
    fd, tmp = tempfile.mkstemp(dir=out.parent, prefix=f".{out.name}.", suffix=".tmp")
    os.close(fd)
    try:
        with torch.no_grad():
            program = torch.onnx.export(
                graph, (), kwargs=inputs, dynamo=True, dynamic_shapes=dynamic, opset_version=opset,
                input_names=graph.input_names, output_names=[graph.output_name], verbose=False,
            )
        program.save(tmp)
        diff = check_onnx(tmp, graph)
        os.chmod(tmp, 0o666 & ~_umask())  # like any other file the user writes
        os.replace(tmp, out)
    finally:
        Path(tmp).unlink(missing_ok=True)
    return diff


def check_onnx(path: str | Path, graph: OnnxGraph,
               shapes: tuple[tuple[int, int], ...] = ((1, 5), (3, 17))) -> float:
    """Run the file in onnxruntime at ``shapes`` (B, S); raise if it differs from tformer."""
    ort = require("onnxruntime", EXTRA, "checking an ONNX export")
    session = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    worst = 0.0
    for b, s in shapes:
        inputs = example_inputs(graph, b, s, seed=b * 100 + s)
        with torch.no_grad():
            expected = graph(**inputs).numpy()
        (got,) = session.run(None, {k: v.numpy() for k, v in inputs.items()})
        diff = float(abs(got - expected).max()) if got.size else 0.0
        if got.shape != expected.shape or not diff <= TOLERANCE:
            raise ValueError(
                f"ONNX check at (B, S) = ({b}, {s}): expected shape {expected.shape} within "
                f"{TOLERANCE:g} of tformer, got shape {got.shape}, max abs diff {diff:.3g}"
            )
        worst = max(worst, diff)
    return worst


def _umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask
