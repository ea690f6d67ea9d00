"""tformer from Python: train, and the trained run with the command line's verbs as methods.

    import tformer
    run = tformer.train(data=[{"text": "a cat", "label": "animal"}, ...], max_minutes=5)
    run.predict("a dog")            # [{"label": "animal", "probabilities": {...}}]
    run.evaluate()                  # the test split's metrics (or evaluate(data=rows_or_path))
    run.export(hf="out/")           # what `tformer export RUN --hf out/` writes
    run = tformer.load_run("runs/x")  # the same object for a run directory
    tformer.train(..., device="cuda"); tformer.load_run("runs/x", device="cpu")  # tformer.devices

The run is of its kind's class (tformer.runs): a ClassificationRun predicts, a Seq2SeqRun
generates, an EmbeddingRun embeds. `data`, `valid` and `test` take a file path (JSONL/CSV/TSV)
or records (a list or any iterable of dicts with the objective's fields); records are written
once into RUN/data/*.jsonl, so the run resumes and evaluates from its own copy like a file run.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from tformer.devices import resolve_device
from tformer.kernels.allocator import keep_freed_memory
from tformer.runs import ClassificationRun, EmbeddingRun, Run, Seq2SeqRun, load_run
from tformer.storage.files import new_run_dir, write_atomic
from tformer.storage.rundir import open_run_dir
from tformer.training.config import TrainConfig, resolve_config
from tformer.training.loop import train as _train
from tformer.training.records import Record
from tformer.training.sources import Data


def train(data: Data | None = None, valid: Data | None = None, test: Data | None = None,
          progress: bool = True, log=print, **options: Any) -> Run:
    """Train as `tformer train` does, with the same options as keywords (max_minutes=5,
    from_pretrained="DIR", d_model=256, device="cuda", ...), on a file or on records; returns the
    Run, its model on the device it trained on. Without data, trains the synthetic task named by
    task= (default reverse).

    Like the command line, on the CPU it asks glibc's malloc to keep freed memory for reuse in this
    process (tformer.kernels.allocator says why and how to opt out)."""
    if "device" in options:  # a torch.device too; the run records it as text
        options["device"] = str(options["device"])
    device = resolve_device(options.get("device", "auto"))  # a missing device: one line, before anything
    keep_freed_memory(device.type)
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
    run = load_run(run_dir, device=device)
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


__all__ = ["ClassificationRun", "Data", "EmbeddingRun", "Record", "Run", "Seq2SeqRun", "load_run", "train"]
