"""tformer from Python: train, and a trained run with the command line's verbs as methods.
(The top layer, beside tformer.cli: it uses the training package and the export command.)

    import tformer
    run = tformer.train(data=[{"text": "a cat", "label": "animal"}, ...], max_minutes=5)
    run.predict(["a dog"])          # [{"label": "animal", "probabilities": {...}}]
    run.evaluate()                  # the test split's metrics (or evaluate(data=rows_or_path))
    run.export(hf="out/")           # what `tformer export RUN --hf out/` writes
    run.generate(["a text"]), run.embed(["a text"])   # seq2seq and embedding runs
    run = tformer.load_run("runs/x")  # the same object for a run directory

`data`, `valid` and `test` take a file path (JSONL/CSV/TSV) or records (a list or any iterable
of dicts with the objective's fields); records are written once into RUN/data/*.jsonl, so the
run resumes and evaluates from its own copy like a file run.
"""

from __future__ import annotations

import argparse
import json
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

import numpy as np
from torch import nn

from tformer.commands import _export
from tformer.kernels.allocator import keep_freed_memory
from tformer.storage.files import new_run_dir, write_atomic
from tformer.storage.rundir import open_run_dir
from tformer.training.config import TrainConfig, resolve_config
from tformer.training.loop import load_run as _load
from tformer.training.loop import train as _train
from tformer.training.objective import Data, Objective
from tformer.training.records import Record


class Run:
    """A run directory's model, objective and config. Methods raise a one-line ValueError when
    the run's objective does not do what is asked (predict needs a classifier, and so on)."""

    def __init__(self, path: str | Path, model: nn.Module, objective: Objective, config: TrainConfig,
                 record: dict[str, Any] | None = None) -> None:
        self.path, self.model, self.objective, self.config = Path(path), model, objective, config
        self.record = record  # the test record of the training that made it, if this process trained it

    @classmethod
    def load(cls, path: str | Path) -> Run:
        return cls(path, *_load(path))

    def __repr__(self) -> str:
        return f"Run({str(self.path)!r}: {self.objective.description})"

    def predict(self, texts: Iterable[str], pairs: Iterable[str] | None = None) -> list[dict[str, Any]]:
        """Classification: {"label", "probabilities": {label: p}} per text (pairs: text_pair)."""
        return self.objective.classify(self.model, list(texts), None if pairs is None else list(pairs))

    def generate(self, inputs: Iterable[str], beam_size: int = 1, length_penalty: float = 1.0,
                 max_len: int | None = None) -> list[str]:
        """Seq2seq: the output text per input (at most max_len tokens; default the run's)."""
        return self.objective.generate(self.model, list(inputs), beam_size, length_penalty, max_len)

    def embed(self, texts: Iterable[str]) -> np.ndarray:
        """Embedding: (N, D) L2-normalised float32 vectors."""
        return self.objective.embed(self.model, list(texts)).numpy()

    def evaluate(self, data: Data | None = None, split: str = "test", beam_size: int = 1) -> dict[str, float]:
        """Metrics on a split of the run's data, or on `data` (a file or records)."""
        examples = None if data is None else self.objective.read_examples(data)
        return self.objective.evaluate(self.model, split, beam_size=beam_size, examples=examples)[0]

    def export(self, hf: str | Path | None = None, onnx: str | Path | None = None,
               opset: int = 18) -> Path:
        """What `tformer export RUN --hf DIR` (or `--onnx OUT`) writes, checked the same way;
        returns the path written."""
        if (hf is None) == (onnx is None):
            raise ValueError("export: expected one of hf= or onnx=, got "
                             + ("both" if hf is not None else "neither"))
        _export._export_run(self.path, argparse.Namespace(hf=hf, onnx=onnx, opset=opset))
        return Path(hf if hf is not None else onnx)


def load_run(path: str | Path) -> Run:
    """The Run of a directory written by `tformer train` (or tformer.train)."""
    return Run.load(path)


def train(data: Data | None = None, valid: Data | None = None, test: Data | None = None,
          progress: bool = True, log=print, **options: Any) -> Run:
    """Train as `tformer train` does, with the same options as keywords (max_minutes=5,
    from_pretrained="DIR", d_model=256, ...), on a file or on records; returns the Run.
    Without data, trains the synthetic task named by task= (default reverse).

    Like the command line, it asks glibc's malloc to keep freed memory for reuse in this process
    (tformer.kernels.allocator says why and how to opt out)."""
    keep_freed_memory()
    name = Path(data).stem if isinstance(data, (str, Path)) else "data" if data is not None else \
        options.get("task", TrainConfig.task)
    run_dir = Path(options.pop("out", None) or new_run_dir(name))
    files = {"data": data, "valid": valid, "test": test}
    if any(v is not None and not isinstance(v, (str, Path)) for v in files.values()):
        _write_records(run_dir, files)
    for name, value in files.items():
        if value is not None:
            options[name] = str(value)
    config = resolve_config(options, {"out": str(run_dir)})
    record = _train(config, progress=progress, log=log)
    run = Run.load(run_dir)
    run.record = record
    return run


def _write_records(run_dir: Path, files: dict[str, Any]) -> None:
    """Records given as Python objects go into RUN/data/NAME.jsonl (replacing them in `files`),
    under the run's lock: one JSON object per line, as a user's file would be."""
    with open_run_dir(run_dir, resume=False):
        for name, value in files.items():
            if value is None or isinstance(value, (str, Path)):
                continue
            lines = []
            for i, record in enumerate(value, 1):
                if not isinstance(record, Mapping):
                    raise ValueError(f"{name}[{i - 1}]: expected a dict of fields, "
                                     f"got {type(record).__name__}")
                lines.append(json.dumps(dict(record), ensure_ascii=False))
            if not lines:
                raise ValueError(f"{name}: expected at least one record, got none")
            path = run_dir / "data" / f"{name}.jsonl"
            path.parent.mkdir(exist_ok=True)
            write_atomic(path, ("\n".join(lines) + "\n").encode())
            files[name] = path


__all__ = ["Data", "Record", "Run", "load_run", "train"]
