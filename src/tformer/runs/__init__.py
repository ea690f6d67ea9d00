"""Trained runs, one class per kind, each with its own verbs:

    ClassificationRun   predict(texts) -> labels and probabilities
    Seq2SeqRun          generate(inputs) -> output texts
    EmbeddingRun        embed(texts) -> vectors

    run = load_run("runs/x")        # reads the run directory once; the class its kind names
    run.evaluate(), run.export(hf=DIR) / run.export(onnx=OUT), run.attention_input(text)

A synthetic task's run is the class of its task's kind (reverse: a Seq2SeqRun; listops: a
ClassificationRun), over the task's own symbols.
"""

from __future__ import annotations

from pathlib import Path

from tformer.config import TransformerConfig
from tformer.devices import resolve_device
from tformer.errors import as_path
from tformer.runs.base import AttentionInput, Run
from tformer.runs.classification import ClassificationRun
from tformer.runs.embedding import EmbeddingRun
from tformer.runs.seq2seq import Seq2SeqRun
from tformer.stats import check_fits
from tformer.storage.checkpoint import check_run_dir, load_weights
from tformer.storage.checkpoint_names import read_latest
from tformer.training.config import read_train_config
from tformer.training.objectives import make_objective

RUNS: dict[str, type[Run]] = {"classification": ClassificationRun, "seq2seq": Seq2SeqRun,
                              "embedding": EmbeddingRun}


def describe_run(path: str | Path) -> tuple[str, str]:
    """(what the run in `path` is, the command that takes it), read without its weights."""
    path = as_path(path, "path", "a run directory")
    config = read_latest(path, lambda _: read_train_config(check_run_dir(path)))
    objective = make_objective(config, path, existing=True)
    return objective.description, RUNS[objective.kind].verb


def load_run(path: str | Path, needs: str | None = None, device: str | object = "auto") -> Run:
    """The run in a directory written by `tformer train` (or tformer.train): its model (eval
    mode, frozen), objective and TrainConfig. The weights are the best validated ones
    (best.safetensors: what the run's test result describes), else the newest checkpoint's.

    needs: a method ("predict", "generate", "embed", "answers"...) the caller will use; a run
    of a kind without it is refused in one line naming the command that fits it.
    device: where the model runs (tformer.devices: auto, cpu, cuda, cuda:N, mps, or a
    torch.device), whatever device trained it: weights are read to the CPU, then moved."""
    path, device = as_path(path, "path", "a run directory"), resolve_device(device)
    known = isinstance(needs, str) and any(hasattr(cls, needs) for cls in RUNS.values())
    if needs is not None and not known:  # (a number was getattr's TypeError)
        verbs = ", ".join(cls.verb for cls in RUNS.values())
        raise ValueError(f"needs: expected a run's method ({verbs}, ...) or None, got {needs!r}")
    # A live run may prune the checkpoint being read (it published a newer one): read that one.
    return read_latest(path, lambda _: _load(path, needs, device))


def _load(path: Path, needs: str | None, device) -> Run:
    saved = check_run_dir(path)  # the newest checkpoint's files
    config = read_train_config(saved)
    objective = make_objective(config, path, existing=True)  # tokenizer, labels
    cls = RUNS[objective.kind]
    if needs is not None and not hasattr(cls, needs):
        raise ValueError(f"RUN_DIR: {path} is {objective.description}: use `tformer {cls.verb} {path}`")
    model_config = TransformerConfig.load(saved / "config.json")
    check_fits(model_config, objective.model_kind, what=str(saved / "config.json"))
    model = objective.build_model(model_config)
    best = path / "best.safetensors"
    load_weights(model, best if best.is_file() else saved / "model.safetensors")
    return cls(path, model.to(device).eval().requires_grad_(False), objective, config)


__all__ = ["RUNS", "AttentionInput", "ClassificationRun", "EmbeddingRun", "Run", "Seq2SeqRun", "describe_run",
           "load_run"]
