"""Exports of a classifier that the transformers classes cannot express, refused in one line."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from pathlib import Path

from tformer.formats import hf_bert
from tformer.formats import hf_xlm as hf_xlm_format
from tformer.training.config import MODEL_OPTIONS


@contextlib.contextmanager
def hf_refusals(run_dir: Path) -> Iterator[None]:
    """A classifier the transformers classes cannot express, refused in one line naming the
    option it comes from and the way out (BertForSequenceClassification: post-norm; XLM: its
    widths and padding id)."""
    try:
        yield
    except hf_bert.NotBert as e:  # pre-norm: name the option
        raise ValueError(f"--hf: {run_dir}: {_option(e.field)}: BertForSequenceClassification "
                         f"needs {e.need}, got {e.got!r}; export it with --onnx") from None
    except hf_xlm_format.Inexpressible as e:
        # BertForSequenceClassification takes any feed-forward width and padding id, not the rest.
        cls = (", or train with --pooling cls (BertForSequenceClassification)"
               if e.field in ("d_ff", "pad_id") else "")
        raise ValueError(f"--hf: {run_dir}: {_option(e.field)}: {hf_xlm_format.ARCHITECTURE} (what a "
                         f"classifier without BERT's pooler exports as) needs {e.need}, got {e.got!r}; "
                         f"export it with --onnx{cls}") from None


def _option(field: str) -> str:
    """What the user set that a config field comes from: its option (--d-ff), else the field."""
    if field == "pad_id":
        return "the tokenizer's padding id"
    return f"--{field.replace('_', '-')}" if field in MODEL_OPTIONS else f"config.{field}"
