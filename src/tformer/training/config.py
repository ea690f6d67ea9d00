"""The training configuration: one frozen dataclass, help text beside each field.

Values come from the field's default < the preset (per synthetic task, or per objective
of a data run) < a config file < the command line; `tformer train` has one option per
field, generated from this dataclass (help: the field's metadata).
"""

from __future__ import annotations

import dataclasses
import functools
import json
import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from tformer.config import FieldType, TransformerConfig, check_known_keys, field_types
from tformer.errors import BadType, FieldError
from tformer.nn import devices
from tformer.nn.kernels.machine import check_threads
from tformer.training.presets import FINETUNE_PRESET, PRESETS, SIZE_OPTIONS, TIMED_STEPS
from tformer.training.records import FORMAT_NAMES, FORMATS
from tformer.training.tasks import TASKS, Task
from tformer.training.unread import check_layers, check_read

SCHEDULES = ("inverse_sqrt", "cosine", "linear")
PRECISIONS = ("auto", "fp32", "bf16")
LONG = ("auto", "windows", "cut")  # --long (tformer.training.windows)
CLASS_WEIGHTS = ("auto", "weighted", "none")  # (tformer.kinds.labels)
HEAD_INITS = ("auto", "random")  # a fine-tune's new head (tformer.training.probe)
SCORE_LOSSES = ("auto", "bce", "mse")  # --score-loss (tformer.kinds.regression)
TOKENIZERS = ("bpe", "wordpiece", "unigram")
# Refused before anything is built: the tokenizer trainer's memory grows with the vocabulary
# (a billion-token request aborts the process), and a learned position table with max_length.
MAX_VOCAB = 1 << 20
BPE_MIN_VOCAB = 256 + 4  # byte-level BPE starts from every byte, and tformer's 4 specials (subwords.py)
MAX_LENGTH = 8192
# Options that may differ when resuming; changing any other would make the resumed run
# a different experiment than the one its checkpoint started.
RESUMABLE = ("steps", "eval_every", "log_every", "threads", "max_minutes", "out", "patience",
             "keep", "epochs", "precision", "report_to", "device", "tf32")
REPORT_TO = ("tensorboard", "csv")  # where --report-to may send the scalars (metrics.jsonl always)

# The TransformerConfig fields a run sets from its options (by their own names: --d-model);
# vocab_size, max_len, n_classes and the BERT layout follow from the data and the objective.
MODEL_OPTIONS: dict[str, str] = {
    "d_model": "model width",
    "n_heads": "attention heads",
    "d_ff": "feed-forward width",
    "n_layers": "encoder layers (and decoder layers unless --n-decoder-layers)",
    "n_decoder_layers": "decoder layers (default: --n-layers)",
    "dropout": "dropout probability (on a fine-tune, of every dropout of the model: the hidden states', "
               "the attention weights' and the head's)",
    "norm_first": "pre-norm layers (else post-norm, as in the paper; an encoder's `export --hf` needs "
                  "post-norm)",
    "activation": "feed-forward activation: relu, gelu (exact) or gelu_tanh",
    "pooling": "classification: the mean of the real tokens (mean: the default on your data, the more "
               "accurate; `export --hf` writes an XLMForSequenceClassification, exact one text per call) "
               "or the first position (cls: the synthetic tasks' default; on your data through BERT's "
               "pooler: a BertForSequenceClassification)",
}
# Small: what a 2-core CPU trains in minutes (the synthetic tasks' defaults).
DEFAULT_MODEL = TransformerConfig(d_model=64, n_heads=4, d_ff=256, n_layers=2, dropout=0.1)


def _f(default: Any, help: str) -> Any:
    return field(default=default, metadata={"help": help})


@dataclass(frozen=True)
class TrainConfig:
    """Everything a training run needs. The CLI (`tformer train`) has one option per field."""

    # What to learn: a synthetic task, or your own files.
    task: str | None = _f("reverse", "synthetic task: copy, reverse, sort, add (seq2seq); listops, "
                          "brackets (classification); not with --data")
    data: str | None = _f(None, "training file (JSONL, CSV or TSV with a header; CoNLL; or .txt: one text "
                          "per line); its fields choose the objective: source+target, "
                          "text+label[+text_pair], text+labels (a list: multi-label), "
                          "anchor+positive[+negative], tokens+tags, text alone (masked-LM pre-training)")
    valid: str | None = _f(None, "validation file (default: a seeded split of --data)")
    test: str | None = _f(None, "test file (default: a seeded split of --data)")
    columns: str | None = _f(None, "rename columns, e.g. 'en=source,fr=target'")
    format: str | None = _f(None, "the format of data files whose suffix does not say it (a .txt file): "
                            "conll (a token and its tag per line), jsonl, csv or tsv")
    label_separator: str | None = _f(None, "text joining labels in a CSV/TSV cell (';' for 'news;sport'): "
                                     "split there, a multi-label run (a JSONL list needs none)")
    class_weights: str = _f("auto", "classification and multi-label: weighted (a loss weighted towards rare "
                            "labels), none, or auto: weighted for skewed multi-label training labels, "
                            "where it measured better on macro-F1 (the first line says what it did)")
    head_init: str = _f("auto", "fine-tunes of classification, multi-label and tagging: the new head's "
                        "start, auto (fitted to the pretrained model's features of up to 512 training "
                        "examples before the first update: a linear probe, where a twentieth of the "
                        "training time pays for 64 or more) or random (small random weights, as "
                        "transformers starts it)")
    score_loss: str = _f("auto", "scores: bce (the binary cross-entropy of the output's sigmoid, for scores "
                         "in [0, 1]), mse (the output's squared error, any scores), or auto: bce where "
                         "every training score lies in [0, 1], where it measured better, else mse")
    from_pretrained: str | None = _f(None, "fine-tune this BERT-format model directory "
                                     "(its tokenizer and sizes are used)")
    tokenizer: str = _f("bpe", "tokenizer trained on --data: bpe (byte-level), wordpiece, unigram")
    vocab_size: int = _f(8000, "tokenizer vocabulary size (trained on --data)")
    lowercase: bool = _f(False, "the tokenizer trained on --data lowercases texts first (with "
                         "--from-pretrained the model's own tokenizer decides)")
    max_length: int = _f(128, "tokens per text (a longer one is read in windows, or cut: --long)")
    long: str = _f("auto", "a text longer than --max-length, for classification and embeddings: windows "
                   "(read in overlapping windows, their logits or vectors averaged), cut (its first "
                   "tokens only) or auto (windows where the max length cuts 1 text in 100 or more)")
    max_tokens: int | None = _f(4096, "data runs: padded tokens per batch (length-bucketed batches); "
                                "none: --batch-size examples of the data's mean length")
    accumulate: int = _f(1, "batches whose gradients are summed per update")
    precision: str = _f("auto", "auto (bf16 autocast where the device computes bf16 natively and a step "
                        "of this model is measured faster in it, else fp32; fp16 with a GradScaler on "
                        "a CUDA GPU without bf16), fp32 or bf16 (fp32 master weights either way)")
    device: str = _f("auto", devices.TRAIN_HELP)
    tf32: bool = _f(False, "fp32 matrix products in TF32 on NVIDIA GPUs that have it (compute "
                    "capability 8.0+), as HF's --tf32: ~3x faster fp32 steps, products rounded to 10 "
                    "mantissa bits; changes nothing elsewhere (tformer.nn.kernels.tf32)")
    # Optimisation.
    steps: int = _f(2000, "optimizer updates in total (a resumed run continues up to this count)")
    epochs: int | None = _f(None, "data runs: stop after this many passes over the training data")
    batch_size: int = _f(64, "examples per update: synthetic tasks, and data runs with "
                         "--max-tokens none")
    lr: float | None = _f(1e-3, "peak learning rate, reached at the end of warmup (none: by the "
                          "model's width)")
    warmup: int = _f(200, "steps of linear warmup")
    schedule: str = _f("inverse_sqrt", "inverse_sqrt (Vaswani et al. 2017, §5.3), cosine or "
                       "linear (both decay to 0 at --steps)")
    weight_decay: float = _f(0.01, "AdamW weight decay on matrices")
    label_smoothing: float = _f(0.1, "label smoothing of the training loss (§5.4 uses 0.1)")
    clip_grad: float = _f(1.0, "clip the gradient norm to this; 0 = off")
    # Evaluation, stopping, bookkeeping.
    eval_every: int = _f(250, "validate and checkpoint every N steps")
    log_every: int = _f(50, "append training loss to metrics.jsonl every N steps")
    valid_size: int = _f(500, "synthetic tasks: examples in the validation split")
    test_size: int = _f(1000, "synthetic tasks: examples in the test split")
    early_stop: float | None = _f(None, "stop once the validation metric reaches this (none = never)")
    patience: int | None = _f(None, "stop after N validations without a new best (none = never)")
    seed: int = _f(0, "seed for the data splits, initialisation and dropout")
    threads: int | None = _f(None, "torch CPU threads (default: one per core that other processes "
                             "leave free, at least one)")
    max_minutes: float | None = _f(None, "the whole command's wall-time budget: starting, the plan's "
                                   "probes, training, validation, the final test and saving end within "
                                   "it (a slower test scores fewer examples; a resumed run gets what "
                                   "its checkpoint had left; one too short is refused)")
    auto_size: bool = _f(True, "with --max-minutes and no size option, a run from scratch takes the "
                         "largest model that gets enough updates in the budget on this machine")
    auto_lr: bool = _f(True, "a run from scratch whose --lr is not given takes its kind's learning rate, "
                       "scaled down for a model wider than 384 (tformer.training.sizing.scratch_lr); "
                       "--lr turns this off")
    pretrained_dropout: bool = _f(True, "a fine-tune trains with the dropout of its --from-pretrained "
                                  "model (hidden states and attention weights); --dropout turns this off")
    auto_length: bool = _f(True, "with --max-minutes and no --max-length, a run from scratch on data "
                           "whose texts are long takes the longest length (doubling from the preset) "
                           "that still passes over the data twice in the budget on this machine")
    out: str | None = _f(None, "run directory (default: a new folder under runs/); a non-empty "
                         "folder that is not a tformer run is refused")
    keep: int = _f(1, "checkpoints kept in RUN/checkpoints (the newest; older ones are pruned)")
    report_to: str | None = _f(None, "also write the run's scalars (HF Trainer's --report_to), "
                               "comma-separated: tensorboard (event files in RUN/tensorboard/; pip install "
                               "'tformer[tensorboard]'), csv (RUN/metrics.csv); none: metrics.jsonl only")
    # The model: a TransformerConfig, nested (its sizes come from the command line as
    # --d-model etc.; vocab_size, max_len and n_classes are filled in from the data).
    model: TransformerConfig = _f(DEFAULT_MODEL, "the model's TransformerConfig")

    def __post_init__(self) -> None:
        if isinstance(self.model, dict):  # read back from train_config.json
            object.__setattr__(self, "model", TransformerConfig.from_dict(self.model))
        if not isinstance(self.model, TransformerConfig):
            raise BadType("model", f"expected a TransformerConfig, got {type(self.model).__name__}")
        if self.data is None and self.task not in TASKS:
            raise FieldError("task", f"expected one of {', '.join(TASKS)}; got {self.task!r}")
        devices.check_spec(self.device)
        for name, choices in (("schedule", SCHEDULES), ("tokenizer", TOKENIZERS), ("precision", PRECISIONS),
                              ("long", LONG), ("class_weights", CLASS_WEIGHTS), ("head_init", HEAD_INITS),
                              ("score_loss", SCORE_LOSSES)):
            if getattr(self, name) not in choices:
                raise FieldError(name, f"expected one of {', '.join(choices)}; "
                                 f"got {getattr(self, name)!r}")
        for f in dataclasses.fields(self):
            name, value, kind = f.name, getattr(self, f.name), train_types()[f.name]
            if name == "model":
                continue
            kind.check(name, value)
            if isinstance(value, float) and not math.isfinite(value):
                raise FieldError(name, f"expected a finite number, got {value}")
        positive = ("steps", "batch_size", "eval_every", "log_every", "valid_size", "test_size", "threads",
                    "vocab_size", "max_length", "max_tokens", "accumulate", "patience", "keep", "epochs")
        for name in positive:
            value = getattr(self, name)
            if value is not None and value <= 0:
                raise FieldError(name, f"expected a positive number, got {value}")
        check_threads(self.threads, "threads")
        if not 0 <= self.seed < 2**63:  # what numpy (non-negative) and torch (64 bits) both take
            raise FieldError("seed", f"expected 0..{2**63 - 1}, got {self.seed}")
        for name, limit in (("vocab_size", MAX_VOCAB), ("max_length", MAX_LENGTH)):
            if getattr(self, name) > limit:
                raise FieldError(name, f"expected at most {limit}, got {getattr(self, name)}")
        for name in ("lr", "max_minutes"):
            value = getattr(self, name)
            if value is not None and not value > 0:
                raise FieldError(name, f"expected a positive number, got {value}")
        for name in ("warmup", "weight_decay", "clip_grad"):
            if getattr(self, name) < 0:
                raise FieldError(name, f"expected >= 0, got {getattr(self, name)}")
        if self.early_stop is not None and not (self.early_stop > 0 and
                                                (self.data is not None or self.early_stop <= 1)):
            raise FieldError("early_stop", f"expected a metric in (0, 1] or None, got {self.early_stop}")
        if not 0 <= self.label_smoothing < 1:
            raise FieldError("label_smoothing", f"expected a value in [0, 1), got {self.label_smoothing}")
        self.reports()  # --report-to names only what tformer writes
        if self.format is not None:
            if self.format not in FORMAT_NAMES:
                raise FieldError("format", f"expected one of {', '.join(FORMAT_NAMES)}, got {self.format!r}")
            own = FORMATS.get(Path(self.data or "").suffix.lower())
            if own is not None and own not in (self.format, "lines"):  # (read as its suffix says)
                raise FieldError("format", f"{self.data} is read as {own} by its suffix; expected no "
                                 "--format (it names the format of a file whose suffix does not say it, "
                                 f"such as .txt), got {self.format!r}")
        sep = self.label_separator
        if sep is not None and (not sep or "\n" in sep or "\r" in sep):
            raise FieldError("label_separator", f"expected the text between two labels (';'), got {sep!r}")
        if self.epochs is not None and self.data is None:
            raise FieldError("epochs", "synthetic tasks are endless streams; --epochs needs --data")
        if self.from_pretrained is not None and self.data is None:
            raise FieldError("from_pretrained", "fine-tuning needs your data too (--data FILE)")
        if self.data is not None and self.tokenizer == "bpe" and self.vocab_size < BPE_MIN_VOCAB:
            raise FieldError("vocab_size", f"expected at least {BPE_MIN_VOCAB} for the bpe tokenizer (its "
                             f"256-byte alphabet and 4 special tokens), got {self.vocab_size}")

    def reports(self) -> tuple[str, ...]:
        """--report-to's destinations ("tensorboard", "csv"); () for none."""
        names = [n.strip() for n in (self.report_to or "").split(",") if n.strip()]
        if names == ["none"]:
            return ()
        unknown = [n for n in names if n not in REPORT_TO]
        if unknown or len(set(names)) != len(names):
            raise FieldError("report_to", f"expected none or some of {', '.join(REPORT_TO)} "
                             f"(comma-separated, each once), got {self.report_to!r}")
        return tuple(names)

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)  # the model nested under "model"

    def replace(self, **changes: Any) -> TrainConfig:
        """Training fields and model options (d_model=...) alike."""
        model = {k: changes.pop(k) for k in list(changes) if k in MODEL_OPTIONS}
        if model:
            changes["model"] = _model(changes.get("model", self.model), model)
        return dataclasses.replace(self, **changes)

    @classmethod
    def from_flat(cls, options: dict[str, Any]) -> TrainConfig:
        """A TrainConfig from one flat mapping of training fields and model options
        (--d-model and --lr side by side, as on the command line); "model" may also hold a
        mapping of TransformerConfig fields."""
        check_keys(options)
        train = {k: v for k, v in options.items() if k not in MODEL_OPTIONS and k != "model"}
        model = {k: v for k, v in options.items() if k in MODEL_OPTIONS}
        return cls(**train, model=_model(options.get("model", DEFAULT_MODEL), model))

    def task_model(self, task: Task) -> TransformerConfig:
        """The model for a synthetic task: the sizes given, the task's vocabulary and lengths."""
        return self.model.replace(
            final_norm=self.model.norm_first,  # pre-norm wants a final norm
            vocab_size=len(task.tokenizer), max_len=task.max_len, n_classes=task.n_classes,
        )

    @property
    def name(self) -> str:
        """What the run learns, for logs and run directory names."""
        return self.task if self.data is None else Path(self.data).stem


def field_help(f: dataclasses.Field) -> str:
    return f.metadata.get("help", "")


def check_keys(options: dict[str, Any]) -> None:
    """Refuse keys that are neither training fields nor model options, naming the known ones."""
    check_known_keys(options, TrainConfig, extra=MODEL_OPTIONS)


@functools.cache
def train_types() -> dict[str, FieldType]:
    """TrainConfig's field types, and those of the model options it takes."""
    model = field_types(TransformerConfig)
    return {**field_types(TrainConfig), **{name: model[name] for name in MODEL_OPTIONS}}


def _model(base: TransformerConfig | dict[str, Any], options: dict[str, Any]) -> TransformerConfig:
    """`base` with model options applied, each type-checked against TransformerConfig's field."""
    if isinstance(base, dict):
        base = DEFAULT_MODEL.replace(**base) if base else DEFAULT_MODEL
    for name, value in options.items():
        train_types()[name].check(name, value)
    return base.replace(**options)


def resolve_config(*layers: dict[str, Any], objective=None) -> TrainConfig:
    """TrainConfig defaults < the preset < each of `layers` in turn (a config file's dict,
    then the options given on the command line). Unknown keys are an error. ``objective``: a
    data run's Objective class (its kind's preset and refusals: tformer.training.objective),
    which tformer.kinds.resolve_config finds from the data file's field names."""
    merged: dict[str, Any] = {}
    for layer in layers:
        check_keys(layer)
        merged.update(layer)
    given = dict(merged)  # what the user set, before the choices that follow from it
    if SIZE_OPTIONS & set(merged) or "model" in merged:
        merged.setdefault("auto_size", False)  # sizes given: the user's flags win
    if "max_length" in merged:
        merged.setdefault("auto_length", False)
    if "lr" in merged and not merged.get("from_pretrained"):  # (a fine-tune's rate is never scaled)
        merged.setdefault("auto_lr", False)  # the user's learning rate stands, at any width
    model = merged.get("model")
    if merged.get("from_pretrained") and ("dropout" in merged or isinstance(model, TransformerConfig)
                                          or (isinstance(model, dict) and "dropout" in model)):
        merged.setdefault("pretrained_dropout", False)  # a fine-tune's dropout given: the user's
    for name, kind in train_types().items():
        value = merged.get(name)
        # YAML 1.1 reads "1e-3" (no dot) as a string; accept what a user means.
        if isinstance(value, str) and kind.base is float:
            try:
                merged[name] = float(value)
            except ValueError:
                pass  # __post_init__ names the field and the bad value
    if merged.get("data"):
        if objective is None:
            raise TypeError("resolve_config: a run on --data needs its kind's objective "
                            "(tformer.kinds.resolve_config reads it from the data file's fields)")
        check_layers(merged, objective)
        check_read(given, objective, merged)
        preset = dict(objective.preset)
        if merged.get("from_pretrained"):
            preset.update(FINETUNE_PRESET)
            preset.update(objective.finetune_preset)  # what the kind changes of it (its batches)
        if merged.get("max_minutes") is not None:
            # A timed run ends at its budget; the preset's count would stop it early (a
            # 5-minute fine-tune of 32-example batches reached 1,000 steps in 44 s).
            preset["steps"] = TIMED_STEPS
        return TrainConfig.from_flat({**preset, "task": None, **merged})
    task = merged.get("task", TrainConfig.task)
    if task not in TASKS:
        raise FieldError("task", f"expected one of {', '.join(TASKS)}; got {task!r}")
    check_read(given, None, task=task)
    return TrainConfig.from_flat({**PRESETS.get(task, {}), **merged})


def read_train_config(run_dir: Path) -> TrainConfig:
    path = run_dir / "train_config.json"
    try:
        saved = json.loads(path.read_text())
        if "bf16" in saved:  # written before --precision: bf16 was a switch
            saved["precision"] = "bf16" if saved.pop("bf16") else "fp32"
        saved.setdefault("score_loss", "mse")  # written before --score-loss: scores learned by MSE
        return TrainConfig(**saved)
    except (json.JSONDecodeError, TypeError, UnicodeDecodeError) as e:
        raise FieldError("RUN_DIR", f"{path} is not a valid TrainConfig ({e})") from None


def load_config_file(path: str | Path) -> dict[str, Any]:
    """A JSON or YAML file holding one mapping of TrainConfig fields."""
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"config: no such file {path}")
    text = path.read_text()
    if path.suffix in (".yaml", ".yml"):
        import yaml

        try:
            data = yaml.safe_load(text)
        except yaml.YAMLError as e:  # its message spans lines and names "<unicode string>"
            mark = getattr(e, "problem_mark", None)
            where = f"{path}:{mark.line + 1}:{mark.column + 1}" if mark is not None else str(path)
            problem = getattr(e, "problem", None) or type(e).__name__
            raise FieldError("config", f"{where}: expected valid YAML, got {problem}") from None
    else:
        try:
            data = json.loads(text)
        except json.JSONDecodeError as e:
            raise FieldError("config", f"{path} is not valid JSON ({e})") from None
    if not isinstance(data, dict):
        raise FieldError("config", f"{path} must hold a mapping of options, got {type(data).__name__}")
    return data
