"""Export a model to ONNX with dynamic batch and sequence axes, checked with onnxruntime.

    export_onnx(graph_for(MODEL_DIR), "model.onnx")   a model directory: one file, an encoder
                                                      (or a sentence embedding)
    onnx_folder_files(ClassifierGraph(model), ...)    a run: a folder (see the runs' export_onnx)
    tformer.export.onnx_seq2seq                       a seq2seq run: Optimum's folder layout

The graphs are traced by torch.onnx's dynamo exporter from the same modules users run
(tracing makes ``tformer.nn.kernels`` choose the plain, exportable kernels). Encoder-side inputs:
``input_ids`` and ``attention_mask`` (B, S) int64, plus ``token_type_ids`` when the model has
token types. Outputs: ``last_hidden_state`` (B, S, D), zeros at padding; for an embedding
model also ``sentence_embedding`` (B, dim); ``logits`` (B, C) for a classifier. Every graph is
checked against tformer in onnxruntime at shapes other than the traced one before anything is
published through ``tformer.storage.files`` (a file: temp file and rename, and never over a
file tformer did not write; a folder: ``export_dir.publish_export``).

A run's folder (classifier or embedding) holds model.onnx, the run's tokenizer.json (and
tokenizer_config.json), config.json (the BERT config, with id2label for a classifier) and a
model card; an embedding folder is also a sentence-transformers directory (modules.json,
1_Pooling/, 2_Normalize/) whose model.onnx gives token embeddings to its ONNX backend.
"""

from __future__ import annotations

import contextlib
import json
import logging
import sys
import tempfile
import warnings
from collections.abc import Iterator, Sequence
from pathlib import Path

import torch
from torch import Tensor, nn

from tformer.errors import require
from tformer.export.opsets import DEFAULT_OPSET, check_opset
from tformer.formats.st_layout import read_layout
from tformer.nn.model import Encoder
from tformer.nn.pooling import pool
from tformer.storage.files import check_file_name, replaced_on_success, replaced_path
from tformer.storage.locks import output_lock, remove_leftovers

EXTRA = "onnx"
TOLERANCE = 1e-4  # max abs difference, float32, tformer vs onnxruntime
PRODUCER = "tformer"  # the metadata an exported file carries: a file tformer may replace


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


class SentenceGraph(OnnxGraph):
    """An embedding model: the token embeddings (what sentence-transformers' ONNX backend
    pools) and the pooled, normalised sentence embedding, from one graph."""

    output_names = ["last_hidden_state", "sentence_embedding"]

    @property
    def output_name(self) -> str:
        return "sentence_embedding"

    def forward(self, input_ids: Tensor, attention_mask: Tensor,
                token_type_ids: Tensor | None = None) -> tuple[Tensor, Tensor]:
        """Shape: (B, S) each -> (B, S, D), (B, dim)."""
        out = self.encoder(input_ids, attention_mask, token_type_ids=token_type_ids)
        emb = pool(out.last_hidden_state, out.mask, self.pooling)
        emb = nn.functional.normalize(emb, p=2.0, dim=-1) if self.normalize else emb
        return out.last_hidden_state, emb


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
    if out.exists() and not is_tformer_onnx(out):
        raise FileExistsError(f"--onnx: {out} exists and tformer did not write it; expected a new file "
                              "name (or an earlier tformer export)")


def is_tformer_onnx(path: Path) -> bool:
    """Whether a file is an ONNX model tformer exported (its producer metadata says so)."""
    try:
        import onnx

        model = onnx.load(str(path), load_external_data=False)
    except Exception:  # not ONNX at all: onnx raises its own (DecodeError, ...)
        return False
    return any(p.key == "producer" and p.value == PRODUCER for p in model.metadata_props)


@contextlib.contextmanager
def quiet_exporter() -> Iterator[None]:
    """Silence what torch.onnx's exporter says about its own workings (the torchvision ops it
    skips, dynamic axes it renames, deprecated pytree classes): not the user's business, and
    every export is checked in onnxruntime anyway. Its errors still raise."""
    # onnxscript's version converter logs a traceback when it cannot convert to an older opset,
    # then goes on at its own opset: check_opset_written says so in one line instead.
    loggers = [logging.getLogger(name) for name in ("torch.onnx", "onnxscript.version_converter")]
    levels = [logger.level for logger in loggers]
    for logger in loggers:
        logger.setLevel(logging.CRITICAL if logger.name.startswith("onnxscript") else logging.ERROR)
    try:
        with warnings.catch_warnings():
            for category in (UserWarning, FutureWarning, DeprecationWarning):
                warnings.simplefilter("ignore", category)
            yield
    finally:
        for logger, level in zip(loggers, levels, strict=True):
            logger.setLevel(level)


def check_opset_written(path: Path, opset: int) -> None:
    """The file at ``path`` must be at ``opset``: torch.onnx writes its own opset (18) when it
    cannot convert the graph to an older one, and that file is not what --opset asked for."""
    import onnx

    model = onnx.load(str(path), load_external_data=False)
    written = [o.version for o in model.opset_import if o.domain in ("", "ai.onnx")]
    if written != [opset]:
        raise ValueError(f"--opset: expected an opset torch.onnx can convert this model to "
                         f"({DEFAULT_OPSET} or later), got {opset} (it wrote opset "
                         f"{', '.join(map(str, written))} instead)")


def _trace(graph: nn.Module, inputs: dict[str, Tensor], dynamic: dict, path: Path, opset: int) -> None:
    """Trace ``graph`` at ``inputs`` and save the ONNX program to ``path``."""
    graph.eval()
    with torch.no_grad(), quiet_exporter():
        program = torch.onnx.export(
            graph, (), kwargs=inputs, dynamo=True, dynamic_shapes=dynamic, opset_version=opset,
            input_names=list(inputs), output_names=graph.output_names, verbose=False,
        )
    program.save(str(path))
    check_opset_written(path, opset)
    _mark(path)


def _mark(path: Path) -> None:
    """Record in the file's metadata that tformer wrote it (a later export may replace it)."""
    import onnx

    model = onnx.load(str(path))
    model.metadata_props.add(key="producer", value=PRODUCER)
    onnx.save(model, str(path))


def report(out, diff: float) -> None:
    """The line an export prints once onnxruntime has checked it."""
    print(f"wrote {out} (onnxruntime matches tformer: max abs diff {diff:.2g} <= {TOLERANCE:g})",
          file=sys.stderr)


def export_onnx(graph: OnnxGraph | str | Path, out: str | Path, opset: int = DEFAULT_OPSET) -> float:
    """Write ``out`` atomically; return the max abs difference measured with onnxruntime.
    ``graph``: an OnnxGraph/ClassifierGraph, or a model directory (see ``graph_for``)."""
    require("onnx", EXTRA, "ONNX export")
    require("onnxscript", EXTRA, "ONNX export")
    check_opset(opset)
    check_file_name(out, "--onnx", "a file path like model.onnx (a model directory exports one file)")
    out = replaced_path(out, "--onnx")  # a link's target: the link stays a link
    _check_out(out)
    if not isinstance(graph, nn.Module):
        graph = graph_for(graph)
    graph = graph.eval()
    inputs = example_inputs(graph, 2, min(8, graph.config.max_len))
    batch, seq = torch.export.Dim("batch"), torch.export.Dim("sequence", max=graph.config.max_len)
    dynamic = {name: {0: batch, 1: seq} for name in graph.input_names}
    # One writer of `out` at a time; published only once onnxruntime agrees.
    with output_lock(out, "--onnx"):
        remove_leftovers(out)  # of an export killed before this one
        with replaced_on_success(out) as tmp:
            _trace(graph, inputs, dynamic, tmp, opset)
            diff = check_onnx(tmp, graph)
    return diff


def onnx_bytes(graph: OnnxGraph, opset: int = DEFAULT_OPSET) -> tuple[bytes, float]:
    """The graph's ONNX file, checked in onnxruntime, and the max abs difference measured."""
    require("onnx", EXTRA, "ONNX export")
    require("onnxscript", EXTRA, "ONNX export")
    graph = graph.eval()
    inputs = example_inputs(graph, 2, min(8, graph.config.max_len))
    batch, seq = torch.export.Dim("batch"), torch.export.Dim("sequence", max=graph.config.max_len)
    dynamic = {name: {0: batch, 1: seq} for name in graph.input_names}
    with tempfile.TemporaryDirectory() as scratch:
        path = Path(scratch) / "model.onnx"
        _trace(graph, inputs, dynamic, path, opset)
        return path.read_bytes(), check_onnx(path, graph)


def check_folder(out: str | Path) -> Path:
    """The folder a run's --onnx export is written to (see export_dir.check_destination); a
    name ending in .onnx is refused, since a run exports a folder, not one file."""
    from tformer.export.export_dir import check_destination

    if Path(out).suffix.lower() == ".onnx" and not Path(out).is_dir():
        raise ValueError(f"--onnx: a run exports a folder (model.onnx, tokenizer.json, config.json, "
                         f"README.md), got the file name {out}; name a folder")
    return check_destination(out, "--onnx")


def classifier_config(config, labels: Sequence[str]) -> dict:
    """config.json of a classifier's ONNX folder: the BERT config where BERT expresses the
    encoder (a synthetic task's: tformer's own), and the label names, as transformers keeps them."""
    from tformer.formats import hf_bert

    try:
        out = hf_bert.config_to_hf(config.replace(n_classes=None))
        if config.pooler:  # the whole classifier is a BertForSequenceClassification
            out["architectures"] = ["BertForSequenceClassification"]
        else:
            del out["architectures"]
    except ValueError:  # not BERT-shaped: what tformer's config says
        out = {"tformer_config": config.to_dict()}
    return {**out, "num_labels": len(labels), "problem_type": "single_label_classification",
            "id2label": {str(i): name for i, name in enumerate(labels)},
            "label2id": {name: i for i, name in enumerate(labels)},
            "tformer_pooling": "pooler" if config.pooler else config.pooling}


def sentence_files(config, pooling: Sequence[str], normalize: bool, max_length: int) -> dict[str, bytes]:
    """The sentence-transformers layout around a root model.onnx (Transformer module at the
    root, 1_Pooling, 2_Normalize), so that its ONNX backend loads the folder."""
    from tformer.formats import hf_bert
    from tformer.formats.st_layout import _POOLING_KEYS

    modules = [{"idx": 0, "name": "0", "path": "", "type": "sentence_transformers.models.Transformer"},
               {"idx": 1, "name": "1", "path": "1_Pooling", "type": "sentence_transformers.models.Pooling"}]
    if normalize:
        modules.append({"idx": 2, "name": "2", "path": "2_Normalize",
                        "type": "sentence_transformers.models.Normalize"})
    pooling_config = {"word_embedding_dimension": config.d_model,
                      **{key: mode in pooling for mode, key in _POOLING_KEYS.items()}}
    files = {"config.json": _json(hf_bert.config_to_hf(config)),
             "modules.json": _json(modules),
             "sentence_bert_config.json": _json({"max_seq_length": max_length, "do_lower_case": False}),
             "1_Pooling/config.json": _json(pooling_config)}
    if normalize:
        files["2_Normalize/config.json"] = _json({})
    return files


def _json(value) -> bytes:
    return (json.dumps(value, indent=2, ensure_ascii=False) + "\n").encode("utf-8")


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
        expected = expected if isinstance(expected, tuple) else (expected,)
        got = session.run(None, {k: v.numpy() for k, v in inputs.items()})
        for name, g, e in zip(graph.output_names, got, expected, strict=True):
            worst = max(worst, _compare(f"{name} at (B, S) = ({b}, {s})", g, e))
    return worst


# How an exported folder is used, for its model card (each kind names its own).
CLASSIFIER_USAGE = """
import json
import numpy as np
import onnxruntime as ort
from tokenizers import Tokenizer

tokenizer = Tokenizer.from_file("DIR/tokenizer.json")  # cuts texts at the run's max_length
session = ort.InferenceSession("DIR/model.onnx")
labels = json.load(open("DIR/config.json"))["id2label"]
enc = tokenizer.encode("some text")
feed = {"input_ids": [enc.ids], "attention_mask": [enc.attention_mask], "token_type_ids": [enc.type_ids]}
(logits,) = session.run(None, {i.name: np.array(feed[i.name], dtype=np.int64) for i in session.get_inputs()})
probs = np.exp(logits - logits.max(-1, keepdims=True))
probs /= probs.sum(-1, keepdims=True)
print(labels[str(int(probs[0].argmax()))], probs[0])
"""

# PAD_TOKEN: the run's padding token (<pad>, or a fine-tuned BERT's [PAD]), filled in per run.
SENTENCE_USAGE = """
import numpy as np
import onnxruntime as ort
from tokenizers import Tokenizer

tokenizer = Tokenizer.from_file("DIR/tokenizer.json")  # cuts texts at the run's max_length
tokenizer.enable_padding(pad_id=tokenizer.token_to_id("PAD_TOKEN"), pad_token="PAD_TOKEN")
session = ort.InferenceSession("DIR/model.onnx")
batch = tokenizer.encode_batch(["some text", "another text"])
feed = {"input_ids": [e.ids for e in batch], "attention_mask": [e.attention_mask for e in batch],
        "token_type_ids": [e.type_ids for e in batch]}
inputs = {i.name: np.array(feed[i.name], dtype=np.int64) for i in session.get_inputs()}
tokens, sentences = session.run(None, inputs)  # sentences: (2, dim), L2-normalised
# or, with sentence-transformers[onnx]: SentenceTransformer("DIR", backend="onnx").encode([...])
"""
