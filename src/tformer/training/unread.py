"""Options a run would not read are refused, naming them, not accepted and silently ignored.

    check_layers(merged, objective)       # layer options a data run cannot honour
    check_read(given, objective, merged)  # options of another kind of run (tformer.training.config)

`given`: the options as the user set them (a --config file's and the command line's, before the
choices that follow from them); the errors name the field (the CLI names it as its flag).
"""

from __future__ import annotations

from typing import Any

from tformer.errors import FieldError, a
from tformer.training.presets import FINETUNE_PRESET, SIZE_OPTIONS

# The synthetic tasks bring their own vocabulary, lengths and splits; a file run has no generated
# splits; a fine-tune keeps its checkpoint's tokenizer, sizes, layers and pooling (its dropout
# unless --dropout is given: pretrained_dropout), and only a fine-tune has a pretrained dropout.
TASK_ONLY = ("task", "valid_size", "test_size")
# (--epochs and --from-pretrained: __post_init__ refuses them)
DATA_ONLY = ("valid", "test", "columns", "format", "tokenizer", "vocab_size", "lowercase", "max_length",
             "max_tokens", "auto_length", "auto_size", "long")
PRETRAINED_KEEPS = ("tokenizer", "vocab_size", "lowercase", "auto_length", "auto_size", "pooling",
                    *sorted(SIZE_OPTIONS))
SWITCHES_OFF = ("auto_size", "auto_length", "pretrained_dropout")  # False asks for nothing


def check_read(given: dict[str, Any], objective, merged: dict[str, Any] | None = None,
               task: str | None = None) -> None:
    """Refuse options in ``given`` that a run would not read: a data run of ``objective``'s kind
    (its Objective class) when ``merged`` holds its resolved options, else the synthetic
    ``task``. Options that only another kind reads are refused by tformer.kinds, which knows them all."""
    def refuse(name: str, why: str) -> None:
        if name in SWITCHES_OFF and given[name] is False:
            return  # switching off a choice that is not made asks for nothing (a saved config holds it)
        raise FieldError(name, f"{why}; expected no --{name.replace('_', '-')}, got {given[name]!r}")

    if merged is None:
        for name in DATA_ONLY:
            if name in given:
                refuse(name, f"the synthetic task {task} brings its own data, tokenizer and lengths "
                             "(it is read by runs on --data)")
    else:
        for name in TASK_ONLY:
            if name in given:
                refuse(name, f"a run on --data {merged['data']} learns from its file (it is read by "
                             "the synthetic tasks)")
        pretrained = merged.get("from_pretrained")
        for name in PRETRAINED_KEEPS if pretrained else ():
            if name in given:
                refuse(name, f"a fine-tune keeps the tokenizer, sizes and pooling of {pretrained}")
        if pretrained and "dropout" in given and given.get("pretrained_dropout") is True:
            refuse("dropout", f"--pretrained-dropout keeps the dropout of {pretrained}")
        # (Given with --max-tokens too, as a saved run's command gives both: the count it chose.)
        preset = {**objective.preset, **(FINETUNE_PRESET if pretrained else {})}
        if "batch_size" in given and "max_tokens" not in given and preset.get("max_tokens") is not None:
            refuse("batch_size", f"{a(objective.kind)} run's batches hold --max-tokens "
                                 f"{preset['max_tokens']} tokens (--max-tokens none: --batch-size examples)")
    if "pretrained_dropout" in given and not (merged or {}).get("from_pretrained"):
        refuse("pretrained_dropout", "a run from scratch has no pretrained model's dropout to keep (it is "
                                     "read by fine-tunes: --from-pretrained)")


def check_layers(given: dict[str, Any], objective) -> None:
    """Refuse layer options a data run cannot honour, before anything is made: a fine-tune keeps
    the pretrained model's layers, and a kind may refuse layers it cannot save (``refuses``:
    an embedding run's directory is a sentence-transformers BERT, post-norm). Elsewhere
    --norm-first and --activation are honoured."""
    if given.get("from_pretrained"):
        for name in ("norm_first", "activation"):
            if name in given:
                raise FieldError(name, f"a fine-tune keeps the layers of {given['from_pretrained']}; "
                                 f"expected no --{name.replace('_', '-')}, got {given[name]!r}")
        return
    for name, why in objective.refuses.items():
        value = given.get(name)
        if value:
            expected = "False" if isinstance(value, bool) else f"no --{name.replace('_', '-')}"
            raise FieldError(name, f"{why}; expected {expected}, got {value!r}")
