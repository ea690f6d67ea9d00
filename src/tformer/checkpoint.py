"""A training run's checkpoint: what is written, how, and how it is read back.

Every file is written atomically (temp file + fsync + rename) and carries the step it
belongs to, so an interrupted save leaves the previous checkpoint whole, and a mix of
files from two steps is refused on resume. Tensors go to safetensors, the rest to JSON:
nothing is ever unpickled.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import torch
from safetensors.torch import save as st_save
from torch import nn

from tformer.files import json_bytes, write_atomic

CHECKPOINT_FILES = ("config.json", "model.safetensors", "train_config.json")


def save_checkpoint(run_dir: Path, model: nn.Module, optimizer: torch.optim.Optimizer,
                    config: Any, state: dict[str, Any]) -> None:
    """Write the run's checkpoint files, each atomically; trainer_state.json goes last and
    every file carries the step, so a crash between files is detected on resume."""
    step = str(state["step"])
    write_atomic(run_dir / "config.json", json_bytes(model.config.to_dict()))
    weights = {k: v.detach().contiguous() for k, v in model.state_dict().items()}
    write_atomic(run_dir / "model.safetensors", st_save(weights, metadata={"step": step}))
    write_atomic(run_dir / "train_config.json", json_bytes(config.to_dict()))
    opt = optimizer.state_dict()
    tensors = {f"state.{i}.{k}": v.contiguous() for i, s in opt["state"].items()
               for k, v in s.items()}
    tensors["rng.torch"] = torch.get_rng_state()
    meta = {"step": step, "param_groups": json.dumps(opt["param_groups"])}
    write_atomic(run_dir / "optimizer.safetensors", st_save(tensors, metadata=meta))
    write_atomic(run_dir / "trainer_state.json", json_bytes(state))


def check_run_dir(run_dir: str | Path) -> Path:
    run_dir = Path(run_dir)
    if not run_dir.is_dir():
        raise FileNotFoundError(f"RUN_DIR: {run_dir} is not a directory")
    missing = [f for f in CHECKPOINT_FILES if not (run_dir / f).is_file()]
    if missing:
        raise ValueError(
            f"RUN_DIR: {run_dir} is not a checkpoint (missing {', '.join(missing)}); "
            "expected a directory written by `tformer train`"
        )
    return run_dir


def read_safetensors(path: Path) -> tuple[dict[str, torch.Tensor], dict[str, str]]:
    from safetensors import safe_open

    with safe_open(str(path), framework="pt") as f:
        return {k: f.get_tensor(k) for k in f.keys()}, f.metadata() or {}


def load_weights(model: nn.Module, path: Path) -> dict[str, str]:
    """Load `path` into `model`; a file that does not fit is a user error, not a crash."""
    from safetensors import SafetensorError

    try:
        weights, meta = read_safetensors(path)
        model.load_state_dict(weights, strict=True)
    except (SafetensorError, RuntimeError) as e:
        first = str(e).strip().splitlines()[0]
        raise ValueError(f"RUN_DIR: {path} does not fit its config.json ({first})") from None
    return meta


def load_training_state(run_dir: Path, model: nn.Module, optimizer: torch.optim.Optimizer
                         ) -> dict[str, Any]:
    if not (run_dir / "trainer_state.json").is_file():
        raise ValueError(f"resume: {run_dir} has no trainer_state.json, so it cannot be resumed")
    state = json.loads((run_dir / "trainer_state.json").read_text())
    wmeta = load_weights(model, run_dir / "model.safetensors")
    tensors, ometa = read_safetensors(run_dir / "optimizer.safetensors")
    steps = {str(state["step"]), wmeta.get("step"), ometa.get("step")}
    if len(steps) != 1:
        raise ValueError(f"resume: checkpoint files in {run_dir} are from different steps {steps}")
    opt_state: dict[int, dict[str, torch.Tensor]] = {}
    for key, value in tensors.items():
        if key.startswith("state."):
            _, i, name = key.split(".", 2)
            opt_state.setdefault(int(i), {})[name] = value
    optimizer.load_state_dict(
        {"state": opt_state, "param_groups": json.loads(ometa["param_groups"])}
    )
    torch.set_rng_state(tensors["rng.torch"])
    return state
