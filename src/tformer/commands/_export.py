"""The work of `tformer export` (the parser and the list of what each run kind exports are in
``tformer.commands.export``).

Every export is checked before it is published (onnxruntime, or the key table's verify step)
and published whole (one atomic step; a folder holding files tformer did not write is
refused). HF directories carry the run's tokenizer, truncating at the run's max_length, and a
model card. Embedding runs need no --hf export: the run directory is already a
sentence-transformers model.

This module is the one place that reads a run directory for an export: the exporters in
``tformer.export`` take the model, tokenizer and labels.
"""

from __future__ import annotations

import argparse
import json
import shlex
import sys
from pathlib import Path

from tformer.export import hf_classifier, hf_seq2seq
from tformer.export import onnx as tonnx
from tformer.export.model_card import Card
from tformer.formats import hf_bert
from tformer.storage.checkpoint import latest_checkpoint
from tformer.training.loop import load_run


def run(args: argparse.Namespace) -> int:
    directory = Path(args.model_dir)
    if _is_run_dir(directory):
        return _export_run(directory, args)
    _refuse_non_model_dirs(directory)
    if args.hf is not None:
        raise ValueError(f"--hf: expected a run directory of `tformer train`, got the model directory "
                         f"{directory}; a BERT-format directory already loads in transformers")
    diff = tonnx.export_onnx(directory, args.onnx, opset=args.opset)
    _report_onnx(args.onnx, diff)
    return 0


def _is_run_dir(directory: Path) -> bool:
    if latest_checkpoint(directory) is not None:
        return True
    return (directory / "train_config.json").is_file() and directory.parent.name != "checkpoints"


def _refuse_non_model_dirs(directory: Path) -> None:
    """One-line refusals for directories that look like models but are not what --onnx reads."""
    if directory.parent.name == "checkpoints" and (directory / "train_config.json").is_file():
        run = directory.parent.parent
        raise ValueError(f"MODEL_DIR: {directory} is one checkpoint of the run {run}; "
                         f"export the run: tformer export {run} ...")
    config = directory / "config.json"
    if config.is_file():
        try:
            architectures = json.loads(config.read_text()).get("architectures") or []
        except (json.JSONDecodeError, AttributeError):
            return
        if architectures and architectures[0] not in hf_bert.ARCHITECTURES:
            raise ValueError(f"MODEL_DIR: {directory} is a transformers {architectures[0]} directory; "
                             "export the run it came from: tformer export RUN --onnx OUT")


def _test_metrics(run_dir: Path) -> dict:
    """The run's test record: metrics.jsonl's last line, when it is one."""
    try:
        last = (run_dir / "metrics.jsonl").read_text().splitlines()[-1]
        record = json.loads(last)
    except (OSError, IndexError, json.JSONDecodeError):
        return {}
    return record if isinstance(record, dict) and record.get("split") == "test" else {}


def _export_run(run_dir: Path, args: argparse.Namespace) -> int:
    # Training internals: load_run -> (model, source, train config); source.kind,
    # source.data.{labels, tokenizer.backend, tokenizer.max_length}, config.data / config.task.
    model, source, config = load_run(run_dir)
    kind = source.kind
    data = getattr(source, "data", None)
    tokenizer = data.tokenizer.backend if data is not None else None
    max_length = data.tokenizer.max_length if data is not None else None
    labels = tuple(data.labels) if data is not None and kind == "classification" else ()
    target = args.hf if args.hf is not None else args.onnx
    option = "--hf" if args.hf is not None else "--onnx"
    card = Card(name=run_dir.resolve().name, kind=kind,
                data=config.data if config.data else f"synthetic task {config.task}",
                metrics=_test_metrics(run_dir), labels=labels, max_length=max_length,
                command=shlex.join(["tformer", "export", str(run_dir), option, str(target)]))
    if args.hf is not None:
        if tokenizer is None:
            raise ValueError(f"--hf: {run_dir} is a synthetic-task run ({config.task}) with no text "
                             "tokenizer for transformers; export it with --onnx")
        if kind == "classification":
            if not model.config.pooler:
                raise ValueError(
                    f"--hf: {run_dir} pools by mean (the default from scratch), which "
                    "BertForSequenceClassification cannot express; export it with --onnx, or train "
                    "with --pooling cls for a classifier transformers loads")
            out = hf_classifier.export_classifier(args.hf, model, tokenizer, labels, max_length, card)
            print(f"wrote {out}/ (AutoModelForSequenceClassification.from_pretrained loads it)",
                  file=sys.stderr)
        elif kind == "seq2seq":
            out = hf_seq2seq.export_seq2seq(args.hf, model, tokenizer, max_length, card)
            print(f"wrote {out}/ ({hf_seq2seq.architecture(model.config)}; "
                  "AutoModelForSeq2SeqLM.from_pretrained loads it)", file=sys.stderr)
        else:
            raise ValueError(f"--hf: {run_dir} is an embedding run, already a sentence-transformers "
                             f"directory (SentenceTransformer('{run_dir}') loads it); for ONNX use --onnx")
        return 0
    if kind == "seq2seq":
        extra = hf_classifier.tokenizer_files(tokenizer, max_length, "$A </s>") if tokenizer else {}
        out, diff = tonnx.export_seq2seq_onnx(model, args.onnx, card, extra, opset=args.opset)
        _report_onnx(f"{out}/", diff)
        return 0
    if kind == "classification":
        graph = tonnx.ClassifierGraph(model)
    elif (run_dir / "modules.json").is_file():
        # The run's sentence-transformers folder: what `tformer embed RUN` and SentenceTransformer(RUN)
        # load (the best validated weights; load_run gives the newest checkpoint's).
        graph = tonnx.graph_for(run_dir)
    else:
        graph = tonnx.OnnxGraph(model.encoder, model.pooling, model.normalize)
    _report_onnx(args.onnx, tonnx.export_onnx(graph, args.onnx, opset=args.opset))
    return 0


def _report_onnx(out, diff: float) -> None:
    print(f"wrote {out} (onnxruntime matches tformer: max abs diff {diff:.2g} <= {tonnx.TOLERANCE:g})",
          file=sys.stderr)
