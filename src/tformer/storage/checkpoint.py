"""A training run's checkpoint: one unit, written completely, then published by one atomic step.

    RUN/checkpoints/step-000400/     config.json, model.safetensors, optimizer.safetensors,
                                     trainer_state.json, train_config.json
    RUN/checkpoints/latest           the name of the newest published checkpoint

A save writes a hidden temp directory, fsyncs it, renames it to ``step-NNNNNN`` (the
checkpoint now exists, complete) and then replaces ``latest`` atomically; only then are
older checkpoints pruned down to ``keep``. A kill or a full disk at any moment therefore
leaves the previous checkpoint whole and findable; what the interrupted save left behind
(hidden ``*.tmp``) is removed by the next save or resume. Readers follow ``latest`` (or,
if it is missing, take the newest ``step-*`` directory), so the run directory itself works
as a model directory for ``tformer eval`` and ``generate``.

Tensors go to safetensors, the rest to JSON: nothing is ever unpickled. Weights that are
not finite are neither saved nor loaded. Files hold no device: tensors are written from
wherever the model trained and read to the CPU, so a run trained on a GPU loads on a CPU and
the other way round (``load_state_dict`` copies into the model wherever it is).
"""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path
from typing import Any

import torch
from safetensors.torch import save as st_save
from torch import nn

from tformer.errors import FieldError, FieldNotFound
from tformer.storage.checkpoint_names import CHECKPOINTS, POINTER, latest_checkpoint, order
from tformer.storage.checkpoint_names import published as _published
from tformer.storage.files import json_bytes, remove_temp_files, write_atomic, write_new_dir
from tformer.storage.rundir import holder

CHECKPOINT_FILES = ("config.json", "model.safetensors", "train_config.json")
STATE_FILES = ("optimizer.safetensors", "trainer_state.json")


def weights_metadata(model, **more: str) -> dict[str, str]:
    """What a weights file says of itself: the model class its tensors are for (read back by
    tformer.formats.model_dir.tformer_model_class: never guessed from tensor names)."""
    return {"format": "pt", "model": type(model).__name__, **more}


def save_checkpoint(run_dir: Path, model: nn.Module, optimizer: torch.optim.Optimizer,
                    config: Any, state: dict[str, Any], keep: int = 1) -> Path:
    """Publish a new checkpoint of the run; keep the newest `keep`. Returns its directory."""
    weights = {k: v.detach().contiguous() for k, v in model.state_dict().items()}
    check_finite(weights, "model")
    step = int(state["step"])
    opt = optimizer.state_dict()
    tensors = {f"state.{i}.{k}": v.contiguous() for i, s in opt["state"].items()
               for k, v in s.items()}
    tensors["rng.torch"] = torch.get_rng_state()
    device = _device(model)
    if device.type == "cuda":  # dropout on a GPU draws from its own generator
        tensors["rng.cuda"] = torch.cuda.get_rng_state(device)
    meta = {"step": str(step), "param_groups": json.dumps(opt["param_groups"])}
    files = {
        "config.json": json_bytes(model.config.to_dict()),
        "model.safetensors": st_save(weights, metadata=weights_metadata(model, step=str(step))),
        "train_config.json": json_bytes(config.to_dict()),
        "optimizer.safetensors": st_save(tensors, metadata=meta),
        "trainer_state.json": json_bytes(state),
    }
    root = Path(run_dir) / CHECKPOINTS
    root.mkdir(exist_ok=True)
    remove_temp_files(root)
    name = _free_name(root, step)
    write_new_dir(root / name, files)
    write_atomic(root / POINTER, (name + "\n").encode())
    _prune(root, keep, name)
    return root / name


def check_run_dir(run_dir: str | Path) -> Path:
    """The directory holding the run's newest complete checkpoint files (config.json,
    model.safetensors, train_config.json...): RUN/checkpoints/step-N, or RUN itself for a
    run written before checkpoints were directories."""
    run_dir = Path(run_dir)
    if not run_dir.is_dir():
        raise FieldNotFound("RUN_DIR", f"{run_dir} is not a directory")
    found = latest_checkpoint(run_dir)
    if found is not None:
        return found
    pid = holder(run_dir)
    if pid not in (None, str(os.getpid())):  # not stopped: training towards its first checkpoint now
        raise FieldError(
            "RUN_DIR", f"{run_dir} is training now (pid {pid}) and has no checkpoint yet: nothing to "
            "load until its first validation saves one (`tformer info` shows how far it got)"
        )
    if (run_dir / CHECKPOINTS).is_dir():
        raise FieldError(
            "RUN_DIR", f"{run_dir} has no complete checkpoint (its first save was interrupted); "
            f"start it again with `tformer train --out {run_dir}`"
        )
    missing = [f for f in CHECKPOINT_FILES if not (run_dir / f).is_file()]
    if missing and any((run_dir / name).is_file() for name in ("data.json", "metrics.jsonl")):
        raise FieldError(  # a run's own files, and no checkpoint of any layout
            "RUN_DIR", f"{run_dir} is a run stopped before its first checkpoint: nothing to load or "
            f"resume; start it again with `tformer train --out {run_dir}`"
        )
    if missing:
        raise FieldError(
            "RUN_DIR", f"{run_dir} is not a checkpoint (missing {', '.join(missing)}); "
            "expected a directory written by `tformer train`"
        )
    return run_dir


def after_full_disk(run_dir: Path) -> str:
    """What a save that met a full disk left (every save is published whole or not at all), and
    how to go on once there is room: one clause for the error's line."""
    kept = latest_checkpoint(run_dir)
    if kept is None:
        return (f"{run_dir} has no checkpoint yet (none was saved whole): free some space, then "
                "start it again with the same command")
    return (f"{run_dir} keeps its last good checkpoint, of step {order(kept.name)[0]}: free some space, "
            f"then resume with `tformer train --resume {run_dir}`")


def check_finite(tensors: dict[str, torch.Tensor], source: str) -> None:
    for key, value in tensors.items():
        if value.is_floating_point() and not bool(torch.isfinite(value).all()):
            raise ValueError(f"{source}: tensor {key!r} holds NaN or infinite values; "
                             "expected finite weights")


def read_safetensors(path: Path) -> tuple[dict[str, torch.Tensor], dict[str, str]]:
    """All tensors and the metadata of a safetensors file; an unreadable one is a ValueError."""
    from safetensors import SafetensorError, safe_open

    try:
        with safe_open(str(path), framework="pt") as f:
            return {k: f.get_tensor(k) for k in f.keys()}, f.metadata() or {}
    except (SafetensorError, OSError, RuntimeError) as e:
        first = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
        raise ValueError(f"{path}: not a readable safetensors file ({first})") from None


def load_weights(model: nn.Module, path: Path) -> dict[str, str]:
    """Load `path` into `model`; a file that does not fit is a user error, not a crash."""
    try:
        weights, meta = read_safetensors(path)  # an unreadable file says so, naming it
        check_finite(weights, str(path))
    except ValueError as e:
        raise FieldError("RUN_DIR", f"{e}") from None
    try:
        model.load_state_dict(weights, strict=True)
    except RuntimeError as e:
        first = str(e).strip().splitlines()[0]
        raise FieldError("RUN_DIR", f"{path} does not fit its config.json ({first})") from None
    return meta


def load_training_state(run_dir: Path, model: nn.Module, optimizer: torch.optim.Optimizer
                         ) -> dict[str, Any]:
    """Restore model, optimizer and torch RNG from the run's newest complete checkpoint;
    returns its trainer state (step, wall time...)."""
    ckpt = check_run_dir(run_dir)
    path = ckpt / "trainer_state.json"
    if not path.is_file():
        raise FieldError("resume", f"{ckpt} has no trainer_state.json, so it cannot be resumed")
    try:
        state = json.loads(path.read_text())
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
        raise FieldError("resume", f"{path} is not valid JSON ({e})") from None
    if not isinstance(state, dict) or not isinstance(state.get("step"), int):
        raise FieldError("resume", f"{path}: expected an object with an integer 'step', "
                         f"got {str(state)[:60]}")
    wmeta = load_weights(model, ckpt / "model.safetensors")
    tensors, ometa = read_safetensors(ckpt / "optimizer.safetensors")
    steps = {str(state["step"]), wmeta.get("step"), ometa.get("step")}
    if len(steps) != 1:
        raise FieldError("resume", f"checkpoint files in {ckpt} are from different steps {steps}")
    opt_state: dict[int, dict[str, torch.Tensor]] = {}
    try:
        for key, value in tensors.items():
            if key.startswith("state."):
                _, i, name = key.split(".", 2)
                opt_state.setdefault(int(i), {})[name] = value
        optimizer.load_state_dict(
            {"state": opt_state, "param_groups": json.loads(ometa["param_groups"])}
        )
        torch.set_rng_state(tensors["rng.torch"])
        device = _device(model)
        if device.type == "cuda" and "rng.cuda" in tensors:  # resumed on a GPU, as it trained
            torch.cuda.set_rng_state(tensors["rng.cuda"], device)
    except (KeyError, ValueError, RuntimeError, TypeError) as e:
        raise FieldError("resume", f"{ckpt / 'optimizer.safetensors'} does not fit this model "
                         f"({type(e).__name__}: {e})") from None
    return state


def _free_name(root: Path, step: int) -> str:
    """step-NNNNNN, or step-NNNNNN.k when that step was saved before (a rename cannot
    replace a directory, and the old one must stay until the new one is published): k past
    every published one, so the new name orders last (a pruned name taken again ordered first)."""
    base = f"step-{step:06d}"
    saved = [order(n)[1] for n in _published(root) if order(n)[0] == step]
    k = max(saved) + 1 if saved else 0
    name = f"{base}.{k}" if k else base
    while (root / name).exists():  # (not a checkpoint: something else of that name)
        k += 1
        name = f"{base}.{k}"
    return name


def _prune(root: Path, keep: int, newest: str) -> None:
    """Remove all but the newest `keep` checkpoints (never the one just published)."""
    names = _published(root)
    for name in names[: max(len(names) - max(keep, 1), 0)]:
        if name != newest:
            shutil.rmtree(root / name, ignore_errors=True)


def _device(model: nn.Module) -> torch.device:
    """The device of a model's first parameter (the CPU for a model without one)."""
    return next((p.device for p in model.parameters()), torch.device("cpu"))
