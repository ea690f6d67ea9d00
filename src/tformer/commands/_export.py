"""The work of `tformer export` (the parser and the list of what each run kind exports are in
``tformer.commands.export``).

Every export is checked before it is published (onnxruntime, or the key table's verify step)
and published whole (one atomic step; a folder holding files tformer did not write is
refused). HF directories carry the run's tokenizer, truncating at the run's max_length, and a
model card. Embedding runs need no --hf export: the run directory is already a
sentence-transformers model.

A run's exports are its own (tformer.kinds: each kind writes its formats); this module tells a
run directory from a model directory and exports the latter.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from tformer.export import onnx as tonnx
from tformer.export.opsets import check_opset
from tformer.formats import hf_bert
from tformer.storage.rundir import is_run_dir


def run(args: argparse.Namespace) -> int:
    directory = Path(args.model_dir)
    if args.onnx is not None:
        check_opset(args.opset, "--opset")  # named as the command line names it
    if is_run_dir(directory):
        return _export_run(directory, args)
    _refuse_non_model_dirs(directory)
    if args.hf is not None:
        raise ValueError(f"--hf: expected a run directory of `tformer train`, got the model directory "
                         f"{directory}; a BERT-format directory already loads in transformers")
    diff = tonnx.export_onnx(directory, args.onnx, opset=args.opset)
    _report_onnx(args.onnx, diff)
    return 0


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
        if architectures and architectures[0] not in hf_bert.ENCODER_ARCHITECTURES:
            raise ValueError(f"MODEL_DIR: {directory} is a transformers {architectures[0]} directory; "
                             "export the run it came from: tformer export RUN --onnx OUT")


def _export_run(run_dir: Path, args: argparse.Namespace) -> int:
    from tformer.kinds import load_run

    # Exports are traced and checked on the CPU, whatever device the machine has.
    load_run(run_dir, device="cpu").export(hf=args.hf, onnx=args.onnx, opset=args.opset)
    return 0


def _report_onnx(out, diff: float) -> None:
    tonnx.report(out, diff)
