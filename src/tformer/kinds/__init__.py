"""Every job tformer trains, one module each, registered here once; and what finds a job's kind.

    classification   text (+ text_pair) -> label         ClassificationRun: predict
    seq2seq          source -> target                    Seq2SeqRun: generate
    embedding        anchor -> positive (+ negative)     EmbeddingRun: embed
    masked_lm        text alone (or a .txt file)         MaskedLMRun: predict (fill-mask)
    tagging          tokens -> tags (or a CoNLL file)    TaggingRun: predict (entities)
    multilabel       text (+ text_pair) -> labels        MultiLabelRun: predict

    kind = kind_of_data("train.jsonl")            # the file's field names choose
    config = resolve_config({"data": "train.jsonl", "max_minutes": 5})
    record = train(config)                        # tformer.training.loop, with the kind's objective
    run = load_run("runs/x")                      # the Run class of the run's kind

A kind's module (tformer.kinds.base says what it holds) and one line in KINDS are all a new
kind needs; the loop, the commands and the server ask the kind, never which one it is. A
synthetic task's run is of its task's kind (reverse: seq2seq; listops: classification).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

from tformer.config import TransformerConfig
from tformer.config.sizes import check_fits
from tformer.errors import FieldError, a, as_path
from tformer.formats.model_dir import read_model_dir
from tformer.kinds import (
    classification,
    embedding,
    masked_lm,
    multilabel,
    regression,
    reranking,
    seq2seq,
    tagging,
)
from tformer.kinds.base import Kind
from tformer.kinds.run import AttentionInput, Run
from tformer.kinds.serving import input_limit
from tformer.nn.devices import resolve_device
from tformer.nn.kernels.allocator import keep_freed_memory
from tformer.storage.checkpoint import check_run_dir, load_weights
from tformer.storage.checkpoint_names import CHECKPOINTS, read_latest
from tformer.storage.files import read_json_object
from tformer.storage.rundir import is_run_dir
from tformer.training import config as training_config
from tformer.training.config import TrainConfig, read_train_config
from tformer.training.dataset import TextData
from tformer.training.objective import Objective
from tformer.training.records import first_record
from tformer.training.sources import FileSource, TaskSource
from tformer.training.tasks import TASKS, get_task

# The kinds, each registered once; a file's fields choose the one whose required fields it has.
KINDS: dict[str, Kind] = {k.name: k for k in (
    classification.KIND,
    seq2seq.KIND,
    embedding.KIND,
    regression.KIND,
    reranking.KIND,
    masked_lm.KIND,
    tagging.KIND,
    multilabel.KIND,
)}
MODEL_DIR_KIND = embedding.KIND  # what a BERT-format or sentence-transformers directory serves as


def kind_named(name: str, where: str = "kind") -> Kind:
    if name not in KINDS:
        raise ValueError(f"{where}: expected one of {', '.join(KINDS)}, got {name!r}")
    return KINDS[name]


def kind_of_fields(names: Iterable[str], where: str) -> Kind:
    """The kind whose required fields a record of these field names has (kind_of_record)."""
    return kind_of_record(dict.fromkeys(names, ""), where)


def kind_of_record(record: Mapping[str, Any], where: str, options: Mapping[str, Any] | None = None) -> Kind:
    """The kind that claims a file's first record (its required fields; a kind may look at a
    value or an option: ``Fields.claims``); where several do, the one that reads the most fields
    (text+label is classification, text alone masked-LM pre-training). Two that read as many are
    ambiguous (source+target and text+label: which was meant?) and refused naming both."""
    names = set(record)
    found = [k for k in KINDS.values() if k.fields.claims(record, options or {})]
    most = max((len(k.fields.required) for k in found), default=0)
    found = [k for k in found if len(k.fields.required) == most]
    if len(found) > 1:
        both = " and ".join(f"{'+'.join(k.fields.required)} ({k.name})" for k in found)
        raise ValueError(f"{where}: expected the fields of one kind of data, got {both}; keep one set "
                         "(or rename columns with --columns theirs=ours)")
    if not found:
        *rest, last = ["+".join(k.fields.required) for k in KINDS.values()]
        wanted = f"{', '.join(rest)} or {last}"
        raise ValueError(f"{where}: expected fields {wanted}, got {', '.join(sorted(names)) or 'none'} "
                         "(rename columns with --columns theirs=ours)")
    return found[0]


def kind_of_data(path: str | Path, columns: str | None = None, fmt: str | None = None,
                 options: Mapping[str, Any] | None = None) -> Kind:
    """The kind a data file's first record chooses (its field names; with the run's options;
    ``fmt``: --format, the format of a file whose suffix does not say it)."""
    where, record = first_record(path, columns, fmt)
    return kind_of_record(record, where, options)


def kind_of_config(config: TrainConfig, run_dir: Path | None = None) -> Kind:
    """A run's kind: its data.json's when `run_dir` holds one (the run's own, whatever its file
    holds now), else its data file's fields', else its synthetic task's."""
    if config.data is None:
        return kind_named(TASKS[config.task].kind)
    if run_dir is not None and (run_dir / "data.json").is_file():
        try:
            name = read_json_object(run_dir / "data.json")["objective"]
        except (KeyError, ValueError) as e:
            raise FieldError("RUN_DIR", f"{run_dir / 'data.json'} is not a tformer data.json ({e})") from None
        return kind_named(name, f"RUN_DIR: {run_dir / 'data.json'}: objective")
    return kind_of_data(config.data, config.columns, config.format, vars(config))


def resolve_config(*layers: dict[str, Any]) -> TrainConfig:
    """tformer.training.config.resolve_config, with the kind that the data (or the task) says:
    its preset, and options only other kinds read refused, naming them."""
    merged: dict[str, Any] = {}
    for layer in layers:
        training_config.check_keys(layer)
        merged.update(layer)
    if merged.get("data"):
        kind = kind_of_data(merged["data"], merged.get("columns"), merged.get("format"), merged)
    else:
        task = merged.get("task", TrainConfig.task)
        if task not in TASKS:
            raise FieldError("task", f"expected one of {', '.join(TASKS)}; got {task!r}")
        kind = kind_named(TASKS[task].kind)
    for other in KINDS.values():
        for name in other.reads:
            if name in merged and name not in kind.reads:
                readers = " or ".join(a(k.name) for k in KINDS.values() if name in k.reads)
                raise FieldError(name, f"{a(kind.name)} run does not read it (only {readers} run does); "
                                       f"expected no --{name.replace('_', '-')}, got {merged[name]!r}")
    return training_config.resolve_config(*layers, objective=kind.objective if merged.get("data") else None)


def make_objective(config: TrainConfig, run_dir: Path | None = None, write: bool = True,
                   existing: bool = False, resume: bool = False) -> Objective:
    """The objective a config trains: on its synthetic task's, or on your data (its tokenizer
    trained and written to run_dir; with `existing`, read back from run_dir without the data
    files). A new fine-tune reads its base model's folder once, here; a resumed or existing run
    reads nothing of it (its own directory holds all it needs)."""
    kind = kind_of_config(config, run_dir)
    pretrained = None
    if config.data is None:
        source = TaskSource(get_task(config.task, config.seed, config.valid_size, config.test_size), config)
    elif existing:
        source = FileSource(TextData.from_run(run_dir, config, kind.fields.configured(config)), config)
    else:
        if config.from_pretrained and not resume:  # the base model's folder, read once here
            check_not_a_run(Path(config.from_pretrained))
            pretrained = read_model_dir(config.from_pretrained)
        fields = kind.fields.configured(config)
        data = TextData.build(config, fields, run_dir, write=write, pretrained=pretrained)
        source = FileSource(data, config)
    return kind.objective(source, pretrained)


def train(config: TrainConfig, resume: bool = False, progress: bool = True, log=print,
          started: float | None = None, device=None) -> dict[str, Any]:
    """tformer.training.loop.train with the kinds' objectives: the test record. device: where
    it trains, as the command decided it (None: config.device's)."""
    from tformer.training.loop import train as train_loop

    return train_loop(config, make_objective, resume=resume, progress=progress, log=log, started=started,
                      device=device)


def check_not_a_run(path: Path) -> None:
    """A run directory (or a checkpoint of one) named by --from-pretrained that is no model
    directory, refused in one line saying what it is and what its kind says to do (it was
    "RUN/config.json: no such file"): a run keeps its model in checkpoints/ and its tokenizer at
    its top, so no model directory reader takes it; an embedding run's top is a sentence-
    transformers directory, and is taken."""
    run = path.parent.parent if path.parent.name == CHECKPOINTS else path
    if not path.is_dir() or not is_run_dir(run):
        return  # a model directory (or not one at all: its reader says what it lacks)
    if (path / "modules.json").is_file() or ((path / "config.json").is_file()
                                             and (path / "tokenizer.json").is_file()):
        return  # an embedding run's top (sentence-transformers), a masked-LM run's (BERT), an older run's
    try:
        kind = kind_named(read_json_object(run / "data.json")["objective"])
    except (OSError, ValueError, KeyError):
        kind = None  # a synthetic task's run (its task is in its checkpoint: never an encoder's data)
    job = kind.name if kind else "a synthetic task's"
    what = (f"{path} is a tformer run ({job})" if run == path
            else f"{path} is a checkpoint of the tformer run {run} ({job})")
    raise FieldError("from_pretrained", f"{what}, not a model directory; {Run.pretrained_advice(run, kind)}")


def describe_run(path: str | Path) -> tuple[str, str]:
    """(what the run in `path` is, the command that takes it), read without its weights."""
    path = as_path(path, "path", "a run directory")
    config = read_latest(path, lambda _: read_train_config(check_run_dir(path)))
    objective = make_objective(config, path, existing=True)
    return objective.description, kind_named(objective.kind).verb


def load_run(path: str | Path, needs: str | None = None, device: str | object = "auto",
             dtype: str = "fp32") -> Run:
    """The run in a directory written by `tformer train` (or tformer.train): its model (eval
    mode, frozen), objective and TrainConfig. The weights are the best validated ones
    (best.safetensors: what the run's test result describes), else the newest checkpoint's.
    Everything is read from the run directory itself: a fine-tune's base model may be gone.

    needs: a method ("predict", "generate", "embed", "answers"...) the caller will use; a run
    of a kind without it is refused in one line naming the command that fits it.
    device: where the model runs (tformer.nn.devices: auto, cpu, cuda, cuda:N, mps, or a
    torch.device), whatever device trained it: weights are read to the CPU, then moved.
    dtype: "fp32", or "bf16" / "int8" matrix multiplies (tformer.nn.precision.to_precision).
    On the CPU, as the command line and tformer.train do, it asks glibc's malloc to keep freed
    memory for reuse in this process (tformer.nn.kernels.allocator: why, and how to opt out)."""
    path, device = as_path(path, "path", "a run directory"), resolve_device(device)
    known = isinstance(needs, str) and any(hasattr(k.run, needs) for k in KINDS.values())
    if needs is not None and not known:  # (a number was getattr's TypeError)
        verbs = ", ".join(dict.fromkeys(k.verb for k in KINDS.values()))  # (two kinds may share one)
        raise ValueError(f"needs: expected a run's method ({verbs}, ...) or None, got {needs!r}")
    keep_freed_memory(device.type)  # a beam search from Python: 0.85-0.95x the time (allocator)
    # A live run may prune the checkpoint being read (it published a newer one): read that one.
    return read_latest(path, lambda _: _load(path, needs, device, dtype))


def _load(path: Path, needs: str | None, device, dtype: str) -> Run:
    from tformer.nn.precision import to_precision

    saved = check_run_dir(path)  # the newest checkpoint's files
    config = read_train_config(saved)
    objective = make_objective(config, path, existing=True)  # tokenizer, labels
    cls = kind_named(objective.kind).run
    if needs is not None and not hasattr(cls, needs):
        raise FieldError("RUN_DIR", f"{path} is {objective.description}: use `tformer {cls.verb} {path}`")
    model_config = objective.saved_config(TransformerConfig.load(saved / "config.json"), path)
    check_fits(model_config, objective.model_kind, what=str(saved / "config.json"))
    model = objective.build_model(model_config)
    best = path / "best.safetensors"
    load_weights(model, best if best.is_file() else saved / "model.safetensors")
    model = model.to(device).eval().requires_grad_(False)
    if dtype != "fp32":
        model = to_precision(model, dtype).eval()
    return cls(path, model, objective, config)


def load_served(path: str | Path, device, dtype: str = "fp32", max_input_tokens: int | None = None) -> Run:
    """What `tformer serve` serves: the run in a run directory, or a BERT-format or
    sentence-transformers directory as an embedding model; on `device` in `dtype` (both decided
    where the command starts), its input limit checked against the run's own."""
    path = Path(path)
    if not path.is_dir():
        raise FileNotFoundError(f"MODEL_DIR_OR_RUN: no such directory {path}")
    if not is_run_dir(path):
        try:
            run = MODEL_DIR_KIND.run.from_model_dir(path, device, dtype, max_input_tokens)
        except FieldError as e:  # the library names its argument; the user gave the flag
            if e.field == "max_length":
                raise e.named("--max-input-tokens") from None
            raise
        return run
    run = load_run(path, device=device, dtype=dtype)
    if run.config.data is None:
        raise ValueError(f"MODEL_DIR_OR_RUN: {path} is a synthetic-task run ({run.config.task}); "
                         "serve a run on your own data or a BERT-format directory")
    input_limit(max_input_tokens, run.max_input_tokens)
    return run


def run_classes() -> dict[str, type[Run]]:
    """The Run class of every kind by its name (ClassificationRun, ...), for tformer's exports."""
    return {k.run.__name__: k.run for k in KINDS.values()}


__all__ = ["KINDS", "AttentionInput", "Kind", "Run", "describe_run", "kind_named", "kind_of_data",
           "load_run", "load_served", "make_objective", "resolve_config", "run_classes", "train",
           *run_classes()]


def __getattr__(name: str):
    classes = run_classes()
    if name in classes:  # tformer.kinds.ClassificationRun: each kind's Run class
        return classes[name]
    raise AttributeError(f"module 'tformer.kinds' has no attribute {name!r}")
