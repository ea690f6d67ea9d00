"""`tformer train`: train on a synthetic task or on your own files, or resume a run.

One option per TrainConfig field, generated from the dataclass (help: the field's
metadata); values come from the field's default < the preset (per task, or per objective
of a data run) < --config FILE < the command line.
"""

from __future__ import annotations

import argparse
import dataclasses
import os
from typing import Any

HELP = ("train on your own data (--data FILE: JSONL/CSV/TSV) or a synthetic task "
        "(--task copy|reverse|sort|add|listops|brackets)")


def _optional(cast):
    def parse(text: str):
        return None if text.lower() == "none" else cast(text)

    parse.__name__ = cast.__name__  # argparse names the type in its error messages
    return parse


# The option groups of --help, in order (an option in none of them goes under "other options").
GROUPS = (
    ("what to learn", ("data", "valid", "test", "columns", "format", "label_separator", "from_pretrained",
                       "task")),
    ("budget and stopping", ("max_minutes", "steps", "epochs", "early_stop", "patience")),
    ("the model (chosen from the budget unless given)",
     ("d_model", "n_heads", "d_ff", "n_layers", "n_decoder_layers", "dropout", "pretrained_dropout",
      "norm_first", "activation", "pooling", "auto_size")),
    ("text", ("tokenizer", "vocab_size", "lowercase", "max_length", "auto_length", "long")),
    ("optimisation", ("lr", "warmup", "schedule", "batch_size", "max_tokens", "accumulate", "weight_decay",
                      "label_smoothing", "class_weights", "head_init", "score_loss", "clip_grad", "precision",
                      "device", "tf32", "seed")),
    ("evaluation and files",
     ("eval_every", "log_every", "valid_size", "test_size", "out", "keep", "threads", "report_to")),
)


# Options only your data's runs read (the synthetic tasks bring their own vocabulary, lengths and
# splits), only the tasks read, and the one only a classifier reads.
DATA_ONLY = {"data", "valid", "test", "columns", "from_pretrained", "tokenizer", "vocab_size", "lowercase",
             "max_tokens", "epochs", "auto_length", "auto_size", "pretrained_dropout", "long",
             "label_separator", "class_weights", "head_init", "score_loss"}
TASKS_ONLY = {"task", "valid_size", "test_size"}
# What a fine-tune takes from its pretrained model where the option is not given.
FROM_THE_MODEL = {"lr": "by the model's width", "dropout": "the pretrained model's"}


def default_text(name: str, base: Any) -> str:
    """What a run gets for option `name` when it is not given: per kind of data, for a
    fine-tune, and for the synthetic tasks, where those differ (tformer.training.presets)."""
    from tformer.kinds import KINDS
    from tformer.training.presets import FINETUNE_PRESET, PRESETS

    def fmt(value: Any) -> str:
        return "none" if value is None else str(value)

    readers = [k for k in KINDS.values() if name in k.reads]  # an option only some kinds read
    kinds = {k.name: k.objective.preset for k in readers or KINDS.values()}
    data = {kind: fmt(preset.get(name, base)) for kind, preset in kinds.items()}
    tasks = {fmt(preset.get(name, base)) for preset in PRESETS.values()} | {fmt(base)}
    finetune = FINETUNE_PRESET.get(name, base)
    if name in TASKS_ONLY or (set(data.values()) == tasks == {fmt(base)} and finetune == base):
        return fmt(base)
    parts = []
    if name not in TASKS_ONLY:
        values = set(data.values())
        parts.append(f"{values.pop()} on your data" if len(values) == 1 and len(kinds) > 1 else
                     ", ".join(f"{kind} {v}" for kind, v in data.items()))
        if name == "steps":
            parts[0] += " (with --max-minutes: until the budget ends)"
        if name in FROM_THE_MODEL and FINETUNE_PRESET.get(name) is None:
            parts.append("fine-tuning " + FROM_THE_MODEL[name])
        elif finetune != base or name in FINETUNE_PRESET:
            parts.append("fine-tuning " + fmt(finetune))
    if name not in DATA_ONLY:
        parts.append("synthetic tasks " + (fmt(base) if len(tasks) == 1 else f"{fmt(base)} or per task"))
    return "; ".join(parts)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    from tformer.config import TransformerConfig
    from tformer.training.config import (
        DEFAULT_MODEL,
        MODEL_OPTIONS,
        PRESETS,
        TrainConfig,
        field_help,
        train_types,
    )

    parser.usage = ("tformer train (--data FILE | --task NAME) [options]\n"
                    "       tformer train --resume RUN_DIR")
    parser.epilog = ("Defaults differ by what is learned (the kinds of data: seq2seq, classification, "
                     "embedding; a fine-tune; the synthetic tasks): each option says its own. The "
                     "synthetic tasks' presets: " + "; ".join(
                         f"{name}: " + " ".join(f"--{k.replace('_', '-')} {v}" for k, v in p.items())
                         for name, p in PRESETS.items()))
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
    bases: dict[str, Any] = {}  # option -> the field's default, said per kind when help is shown
    parser.formatter_class = _with_defaults(bases)
    fields = {f.name: f for f in dataclasses.fields(TrainConfig) if f.name != "model"}
    fields.update({f.name: f for f in dataclasses.fields(TransformerConfig) if f.name in MODEL_OPTIONS})
    grouped = [name for _, names in GROUPS for name in names]
    groups = [(title, names) for title, names in GROUPS]
    groups.append(("other options", tuple(n for n in fields if n not in grouped)))
    for title, names in groups:
        group = parser.add_argument_group(title)
        for name in names:
            f = fields[name]
            if name in MODEL_OPTIONS:  # a nested model option: its help and default live here
                default, text = getattr(DEFAULT_MODEL, name), MODEL_OPTIONS[name]
            else:
                default, text = f.default, field_help(f)
            kind = types[name]
            if "(default:" not in text:  # (a help that says its own default keeps it)
                bases[name] = default
            kw: dict[str, Any] = {"dest": name, "default": argparse.SUPPRESS, "help": text}
            flag = "--" + name.replace("_", "-")
            if kind.base is bool:
                group.add_argument(flag, action=argparse.BooleanOptionalAction, **kw)
            else:
                cast = _optional(kind.base) if kind.optional else kind.base
                group.add_argument(flag, type=cast, metavar=name.upper(), **kw)


def _with_defaults(bases: dict[str, Any]) -> type[argparse.HelpFormatter]:
    """A help formatter that ends each option's help with its defaults per kind (default_text):
    worked out only when --help is shown, since the kinds' presets import torch, and `tformer
    train --engine numpy` must not."""

    class WithDefaults(argparse.HelpFormatter):
        def _get_help_string(self, action: argparse.Action) -> str:
            if action.dest not in bases:
                return action.help or ""
            return f"{action.help} (default: {default_text(action.dest, bases[action.dest])})"

    return WithDefaults


def run(args: argparse.Namespace) -> int:
    """Train; an error about an option names it as the user wrote it: `--max-minutes` on the
    command line, `FILE: max_minutes` in the --config file (the library names the field)."""
    from tformer.errors import NamedError
    from tformer.training.config import MODEL_OPTIONS, TrainConfig

    try:  # (SIGTERM stops it as Ctrl-C does: tformer.commands.cli)
        return _run(args)
    except NamedError as e:
        fields = {f.name for f in dataclasses.fields(TrainConfig)} | set(MODEL_OPTIONS) | {"resume"}
        name = e.field
        if args.resume is not None and (name == "RUN_DIR" or (name == "out" and "out" not in vars(args))):
            name = "resume" if args.resume else "out"  # the run directory, as the user gave it
        if name in fields:
            if name in vars(args) or name == "resume":  # (options not given are not in args)
                raise e.named(f"--{name.replace('_', '-')}") from None
            if args.config:
                raise e.named(f"{args.config}: {name}") from None
        raise


def _run(args: argparse.Namespace) -> int:
    from tformer.nn.devices import check_spec, resolve_device
    from tformer.training.config import MODEL_OPTIONS, TrainConfig, load_config_file
    from tformer.training.resuming import resume_config

    fields = {f.name for f in dataclasses.fields(TrainConfig)} | set(MODEL_OPTIONS)
    given = {k: v for k, v in vars(args).items() if k in fields}  # only options on the command line
    from_file = load_config_file(args.config) if args.config else {}
    if "device" in given:  # named as the option, as the other commands name it
        check_spec(given["device"], "--device")
    if args.engine == "numpy":  # the NumPy reference trains; torch is never imported
        from tformer.reference.train import train as train_numpy
        from tformer.training.config import resolve_config as resolve_task_config

        if args.resume is not None:
            raise ValueError("--resume: the numpy engine cannot resume a run (no optimizer "
                             "state is saved); use --engine torch")
        if given.get("data") or from_file.get("data"):  # (the kinds of data runs are torch's)
            raise ValueError("--engine: the numpy engine trains the synthetic tasks (--task); "
                             "expected torch for --data, got numpy")
        config = resolve_task_config(from_file, given)
        if config.device not in ("auto", "cpu"):
            raise ValueError(f"--device: the numpy engine runs on the CPU; expected auto or cpu, "
                             f"got {config.device!r}")
        train_numpy(config, progress=not args.quiet)
        return 0
    from tformer.kinds import resolve_config, train
    from tformer.training.distributed import finish

    if args.resume is not None:
        run_dir = args.resume or given.get("out") or from_file.get("out")
        if not run_dir:
            raise ValueError("resume: expected a run directory (--resume RUN_DIR), got none")
        config = resume_config(run_dir, from_file, given)
    else:
        config = resolve_config(from_file, given)
    # Decided once, here (one this machine lacks: one line, before anything is made); under
    # torchrun each rank's process decides its own GPU.
    device = resolve_device(config.device, "--device")
    # --max-minutes counts the whole command: the interpreter's start and the imports too.
    train(config, resume=args.resume is not None, progress=not args.quiet,
          started=getattr(args, "started", None), device=device)
    finish(int(os.environ.get("WORLD_SIZE", "1")))  # torchrun: the ranks end together
    return 0
