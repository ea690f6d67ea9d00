"""tformer from Python: train, and the trained run with the command line's verbs as methods.

    import tformer
    run = tformer.train(data=[{"text": "a cat", "label": "animal"}, ...], max_minutes=5)
    run.predict("a dog")            # [{"label": "animal", "probabilities": {...}}]
    run.evaluate()                  # the test split's metrics (or evaluate(data=rows_or_path))
    run.export(hf="out/")           # what `tformer export RUN --hf out/` writes
    run = tformer.load_run("runs/x")  # the same object for a run directory
    tformer.train(..., device="cuda"); tformer.load_run("runs/x", device="cpu")  # tformer.nn.devices

The run is of its kind's class (tformer.kinds): a ClassificationRun predicts, a Seq2SeqRun
generates, an EmbeddingRun embeds, a RegressionRun predicts scores (run.predict(texts,
pairs=...) -> [{"score": x}]) and a RerankingRun reranks (run.rerank(query, passages) ->
[{"index", "score"}], best first). `data`, `valid` and `test` take a file path (JSONL/CSV/TSV)
or records (a list or any iterable of dicts with the objective's fields); records are written
once into RUN/data/*.jsonl, so the run resumes and evaluates from its own copy like a file run.
"""

from __future__ import annotations

import json
import shutil
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from tformer.errors import BadType, as_path
from tformer.kinds import Run, load_run, resolve_config
from tformer.kinds import train as train_run
from tformer.nn.devices import resolve_device
from tformer.nn.kernels.allocator import keep_freed_memory
from tformer.storage.checkpoint import latest_checkpoint
from tformer.storage.files import new_run_dir, write_atomic
from tformer.storage.rundir import RunLock, open_run_dir
from tformer.training.config import TrainConfig, check_keys
from tformer.training.records import Record
from tformer.training.sources import Data, check_data


def train(data: Data | None = None, valid: Data | None = None, test: Data | None = None,
          progress: bool = True, log=print, quiet: bool = False, **options: Any) -> Run:
    """Train as `tformer train` does, with the same options as keywords (max_minutes=5,
    from_pretrained="DIR", d_model=256, device="cuda", quiet=True, ...), on a file or on records;
    returns the Run, its model on the device it trained on. Without data, trains the synthetic
    task named by task= (default reverse). ``quiet`` (--quiet): no progress bar, as
    ``progress=False``.

    A train that fails (bad records, a bad option, a file that is not there, an interrupt
    before the first checkpoint) raises and leaves nothing behind: a run directory it created
    is removed whole, records copy included.

    Like the command line, on the CPU it asks glibc's malloc to keep freed memory for reuse in this
    process (tformer.nn.kernels.allocator says why and how to opt out)."""
    progress = progress and not quiet
    if not callable(log):  # (it failed at the first line logged, once training had started)
        raise BadType("log", f"expected a callable taking a line (e.g. print), got {type(log).__name__}")
    if "device" in options:  # a torch.device too; the run records it as text
        options["device"] = str(options["device"])
    device = resolve_device(options.get("device", "auto"))  # a missing device: one line, before anything
    keep_freed_memory(device.type)
    given = {"data": data, "valid": valid, "test": test}
    check_keys({**options, **{k: v for k, v in given.items() if v is not None}})
    lines = {name: _record_lines(name, value) for name, value in given.items()
             if value is not None and not isinstance(value, (str, Path))}  # checked before any file
    name = Path(data).stem if isinstance(data, (str, Path)) else "data" if data is not None else \
        options.get("task", TrainConfig.task)
    out = options.pop("out", None)
    run_dir = new_run_dir(name) if out is None else as_path(out, "out", "a run directory")
    created = [p for p in (run_dir, *run_dir.parents) if not p.exists()]  # the run's, and runs/
    try:
        if lines:
            given.update(_write_records(run_dir, lines))
        for key, value in given.items():
            if value is not None:
                options[key] = str(value)
        config = resolve_config(options, {"out": str(run_dir)})
        record = train_run(config, progress=progress, log=log, device=device)
    except BaseException:
        if created and run_dir.is_dir() and latest_checkpoint(run_dir) is None:
            _remove(created)
        raise
    run = load_run(run_dir, device=device)
    run.record = record
    return run


def _remove(created: list[Path]) -> None:
    """The run directory this call created, and the folders above it that it created while
    they are empty. Not a run another process trains in: it made the folder at the same moment."""
    try:
        lock = RunLock(created[0])
    except ValueError:  # in use by that other process
        return
    with lock:
        shutil.rmtree(created[0], ignore_errors=True)
    for folder in created[1:]:
        try:
            folder.rmdir()
        except OSError:
            break


def _record_lines(name: str, records: Any) -> list[str]:
    """Records given as Python objects, as JSONL lines; refused in one line (naming the
    argument, or the record) when they are not an iterable of dicts of JSON values."""
    check_data(name, records)
    lines = []
    for i, record in enumerate(records):
        if not isinstance(record, Mapping):
            raise ValueError(f"{name}[{i}]: expected a dict of fields, got {type(record).__name__}")
        try:
            lines.append(json.dumps(dict(record), ensure_ascii=False))
        except (TypeError, ValueError) as e:
            raise ValueError(f"{name}[{i}]: expected JSON values (str, int, float, bool), got {e}") from None
    if not lines:
        raise ValueError(f"{name}: expected at least one record, got none")
    return lines


def _write_records(run_dir: Path, lines: dict[str, list[str]]) -> dict[str, Path]:
    """Records go into RUN/data/NAME.jsonl, under the run's lock: one JSON object per line,
    as a user's file would be. Returns the files written, by argument name."""
    written = {}
    with open_run_dir(run_dir, resume=False):
        for name, rows in lines.items():
            path = run_dir / "data" / f"{name}.jsonl"
            path.parent.mkdir(exist_ok=True)
            write_atomic(path, ("\n".join(rows) + "\n").encode())
            written[name] = path
    return written


__all__ = ["Data", "Record", "Run", "load_run", "train"]
