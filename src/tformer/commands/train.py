"""`tformer train`: train a model on a synthetic task, or resume a run.

One option per TrainConfig field, generated from the dataclass; values come from the
field's default < the task's preset < --config FILE < the command line.
"""

from __future__ import annotations

import argparse
import dataclasses
from typing import Any

HELP = "train a model on a synthetic task (copy, reverse, sort, add, listops, brackets)"

FIELD_HELP = {
    "task": "which task: copy, reverse, sort, add (seq2seq); listops, brackets (classification)",
    "steps": "optimizer updates in total (a resumed run continues up to this count)",
    "batch_size": "examples per update",
    "lr": "peak learning rate, reached at the end of warmup",
    "warmup": "steps of linear warmup",
    "schedule": "inverse_sqrt (Vaswani et al. 2017, §5.3) or cosine (decays to 0 at --steps)",
    "weight_decay": "AdamW weight decay on matrices",
    "label_smoothing": "label smoothing of the training loss (§5.4 uses 0.1)",
    "clip_grad": "clip the gradient norm to this; 0 = off",
    "eval_every": "validate and checkpoint every N steps",
    "log_every": "append training loss to metrics.jsonl every N steps",
    "valid_size": "examples in the validation split",
    "test_size": "examples in the test split",
    "early_stop": "stop once the validation metric reaches this (none = never)",
    "seed": "seed for the data splits, initialisation and dropout",
    "threads": "torch CPU threads (default: torch's choice); --engine numpy: BLAS threads",
    "max_minutes": "stop training after this many minutes, then test",
    "out": "run directory (default: a new folder under runs/); a non-empty folder that is "
           "not a tformer run is refused",
    "keep": "checkpoints kept in RUN/checkpoints (the newest; older ones are pruned)",
    "d_model": "model width", "n_heads": "attention heads", "d_ff": "feed-forward width",
    "n_layers": "encoder layers (and decoder layers unless --n-decoder-layers)",
    "n_decoder_layers": "decoder layers (default: --n-layers)",
    "dropout": "dropout probability", "norm_first": "pre-norm layers (default: post-norm)",
    "pooling": "classification: pool the first position (cls) or the mean of all (mean)",
}


def _optional(cast):
    def parse(text: str):
        return None if text.lower() == "none" else cast(text)

    parse.__name__ = cast.__name__  # argparse names the type in its error messages
    return parse


def add_arguments(parser: argparse.ArgumentParser) -> None:
    from tformer.train_config import TrainConfig

    parser.add_argument("--config", metavar="FILE",
                        help="JSON or YAML file of options (keys: the option names below, "
                             "with underscores); the command line overrides it")
    parser.add_argument("--resume", nargs="?", const="", default=None, metavar="RUN_DIR",
                        help="continue the run in RUN_DIR (or in --out) from its checkpoint")
    parser.add_argument("--quiet", action="store_true", help="no progress bar")
    parser.add_argument("--engine", choices=("torch", "numpy"), default="torch",
                        help="torch (default), or numpy: train with the NumPy reference (its own "
                             "backward pass and AdamW; torch is never imported; no --resume)")
    casts = {"int": int, "float": float, "str": str}
    for f in dataclasses.fields(TrainConfig):
        flag = "--" + f.name.replace("_", "-")
        base, optional = str(f.type).split(" |")[0], "None" in str(f.type)
        shown = "none" if f.default is None else f.default
        kw: dict[str, Any] = {"dest": f.name, "default": argparse.SUPPRESS,
                              "help": f"{FIELD_HELP.get(f.name, '')} (default: {shown})"}
        if base == "bool":
            parser.add_argument(flag, action=argparse.BooleanOptionalAction, **kw)
        else:
            cast = _optional(casts[base]) if optional else casts[base]
            parser.add_argument(flag, type=cast, metavar=f.name.upper(), **kw)


def run(args: argparse.Namespace) -> int:
    from tformer.train_config import TrainConfig, load_config_file, resolve_config

    fields = {f.name for f in dataclasses.fields(TrainConfig)}
    given = {k: v for k, v in vars(args).items() if k in fields}  # only options on the command line
    from_file = load_config_file(args.config) if args.config else {}
    if args.engine == "numpy":  # the NumPy reference trains; torch is never imported
        from tformer.reference.train import train as train_numpy

        if args.resume is not None:
            raise ValueError("--resume: the numpy engine cannot resume a run (no optimizer "
                             "state is saved); use --engine torch")
        train_numpy(resolve_config(from_file, given), progress=not args.quiet)
        return 0
    from tformer.train import resume_config, train

    if args.resume is not None:
        run_dir = args.resume or given.get("out") or from_file.get("out")
        if not run_dir:
            raise ValueError("resume: expected a run directory (--resume RUN_DIR), got none")
        config = resume_config(run_dir, from_file, given)
    else:
        config = resolve_config(from_file, given)
    train(config, resume=args.resume is not None, progress=not args.quiet)
    return 0
