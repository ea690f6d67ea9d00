"""An export's files, loaded as transformers loads them, before anything is published.

    with loaded_in_transformers(files, "AutoModelForSequenceClassification", name) as (model, folder):
        ...   # compare model's outputs with tformer's (folder: the files); raise to publish nothing

The files are written to a scratch folder and read from there by the Auto class (no
``trust_remote_code``, no network); every weight must load (none missing, unexpected or
mismatched) into the class named. Each exporter compares the outputs it cares about.
"""

from __future__ import annotations

import contextlib
import tempfile
from collections.abc import Iterator, Mapping
from pathlib import Path

from torch import Tensor


@contextlib.contextmanager
def loaded_in_transformers(files: Mapping[str, bytes], auto_class: str, architecture: str) -> Iterator:
    """The model (eval mode) that ``transformers.<auto_class>`` reads from ``files``, and the
    scratch folder holding them (for the tokenizer); raises ValueError unless the model is an
    ``architecture`` that loaded every weight."""
    try:
        import transformers
        from transformers.utils import logging
    except ImportError:
        raise ValueError("--hf: the export is checked in transformers before it is written; "
                         "pip install 'tformer[hf]'") from None
    with tempfile.TemporaryDirectory(prefix="tformer-hf-") as tmp:
        for name, data in files.items():
            (Path(tmp) / name).write_bytes(data)
        bar = logging.is_progress_bar_enabled()
        logging.disable_progress_bar()  # transformers' "Loading weights" bar is not the user's business
        try:
            model, info = getattr(transformers, auto_class).from_pretrained(
                tmp, output_loading_info=True, local_files_only=True)
        finally:
            if bar:
                logging.enable_progress_bar()
        unloaded = {k: v for k, v in info.items() if v}  # missing, unexpected or mismatched keys
        if type(model).__name__ != architecture or unloaded:
            raise ValueError(f"--hf: transformers loaded a {type(model).__name__} "
                             f"({unloaded or 'every weight'}); expected a {architecture} with all")
        yield model.eval(), Path(tmp)


def max_difference(got: Tensor, expected: Tensor, what: str, architecture: str, tolerance: float) -> float:
    """max |got - expected|; raises (nothing is then written) above ``tolerance``."""
    diff = (got - expected).abs().max().item() if got.numel() else 0.0
    if got.shape != expected.shape or not diff <= tolerance:
        raise ValueError(f"--hf: the {architecture} export gives {what} {diff:.2e} away from tformer's "
                         f"(shape {tuple(got.shape)}, expected {tuple(expected.shape)}), expected <= "
                         f"{tolerance:.0e}; nothing was written")
    return diff


def ragged_batches(config) -> Iterator[tuple[Tensor, Tensor, Tensor]]:
    """The batches an export is checked on: (ids, mask, types) of one token alone, then 3 rows of
    up to 17 random tokens with ragged padding (row i has s - 5i real tokens, at least 1), the
    second half of each row of token type 1 where the model has two types (a pair). Seeded."""
    import torch

    generator = torch.Generator().manual_seed(0)
    for b, s in ((1, 1), (3, min(17, config.max_len))):
        ids = torch.randint(0, config.vocab_size, (b, s), generator=generator)  # (B, S)
        lengths = torch.clamp(s - 5 * torch.arange(b), min=1)  # ragged padding
        mask = (torch.arange(s)[None, :] < lengths[:, None]).long()  # (B, S)
        types = torch.zeros_like(ids)
        if config.type_vocab_size > 1:
            types[:, s // 2 :] = 1  # the second text of a pair
        yield ids, mask, types
