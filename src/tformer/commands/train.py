"""`tformer train`: train on a synthetic task or on your own files, or resume a run.

One option per TrainConfig field, generated from the dataclass (help: the field's
metadata); values come from the field's default < the preset (per task, or per objective
of a data run) < --config FILE < the command line.
"""

from __future__ import annotations

import argparse
import dataclasses
from typing import Any

HELP = ("train on your own data (--data FILE: JSONL/CSV/TSV) or a synthetic task "
        "(--task copy|reverse|sort|add|listops|brackets)")


def _optional(cast):
    def parse(text: str):
        return None if text.lower() == "none" else cast(text)

    parse.__name__ = cast.__name__  # argparse names the type in its error messages
    return parse


def add_arguments(parser: argparse.ArgumentParser) -> None:
    from tformer.config import TransformerConfig
    from tformer.training.config import (
        DEFAULT_MODEL,
        FINETUNE_PRESET,
        MODEL_OPTIONS,
        OBJECTIVE_PRESETS,
        PRESETS,
        TrainConfig,
        field_help,
        train_types,
    )

    def shown(preset: dict[str, Any]) -> str:
        return " ".join(f"--{k.replace('_', '-')} {'none' if v is None else v}"
                        for k, v in preset.items())

    parser.epilog = (
        "The defaults shown are overridden per run kind: "
        + "; ".join(f"{name} data: {shown(p)}" for name, p in OBJECTIVE_PRESETS.items())
        + f"; with --from-pretrained also: {shown(FINETUNE_PRESET)}; with --max-minutes and no "
        "--steps, data runs are ended by the budget, not by the preset's --steps; "
        + "; ".join(f"task {name}: {shown(p)}" for name, p in PRESETS.items())
    )
    parser.add_argument("--config", metavar="FILE",
                        help="JSON or YAML file of options (keys: the option names below, "
                             "with underscores); the command line overrides it")
    parser.add_argument("--resume", nargs="?", const="", default=None, metavar="RUN_DIR",
                        help="continue the run in RUN_DIR (or in --out) from its checkpoint")
    parser.add_argument("--quiet", action="store_true", help="no progress bar")
    parser.add_argument("--engine", choices=("torch", "numpy"), default="torch",
                        help="torch (default), or numpy: train a synthetic task with the NumPy "
                             "reference (its own backward pass and AdamW; torch is never "
                             "imported; no --resume)")
    types = train_types()
    model_fields = [f for f in dataclasses.fields(TransformerConfig) if f.name in MODEL_OPTIONS]
    for f in [f for f in dataclasses.fields(TrainConfig) if f.name != "model"] + model_fields:
        flag = "--" + f.name.replace("_", "-")
        kind = types[f.name]
        if f.name in MODEL_OPTIONS:  # a nested model option: its help and default live here
            default, text = getattr(DEFAULT_MODEL, f.name), MODEL_OPTIONS[f.name]
        else:
            default, text = f.default, field_help(f)
        shown = "none" if default is None else default
        kw: dict[str, Any] = {"dest": f.name, "default": argparse.SUPPRESS,
                              "help": f"{text} (default: {shown})"}
        if kind.base is bool:
            parser.add_argument(flag, action=argparse.BooleanOptionalAction, **kw)
        else:
            cast = _optional(kind.base) if kind.optional else kind.base
            parser.add_argument(flag, type=cast, metavar=f.name.upper(), **kw)


def run(args: argparse.Namespace) -> int:
    from tformer.training.config import (
        MODEL_OPTIONS,
        TrainConfig,
        load_config_file,
        resolve_config,
        resume_config,
    )

    fields = {f.name for f in dataclasses.fields(TrainConfig)} | set(MODEL_OPTIONS)
    given = {k: v for k, v in vars(args).items() if k in fields}  # only options on the command line
    from_file = load_config_file(args.config) if args.config else {}
    if args.engine == "numpy":  # the NumPy reference trains; torch is never imported
        from tformer.reference.train import train as train_numpy

        if args.resume is not None:
            raise ValueError("--resume: the numpy engine cannot resume a run (no optimizer "
                             "state is saved); use --engine torch")
        train_numpy(resolve_config(from_file, given), progress=not args.quiet)
        return 0
    from tformer.training.loop import train

    if args.resume is not None:
        run_dir = args.resume or given.get("out") or from_file.get("out")
        if not run_dir:
            raise ValueError("resume: expected a run directory (--resume RUN_DIR), got none")
        config = resume_config(run_dir, from_file, given)
    else:
        config = resolve_config(from_file, given)
    # --max-minutes counts the whole command: the interpreter's start and the imports too.
    train(config, resume=args.resume is not None, progress=not args.quiet,
          started=getattr(args, "started", None))
    return 0
