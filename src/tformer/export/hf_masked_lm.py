"""A masked-LM model (tformer.nn.heads.MaskedLM) as a transformers BertForMaskedLM directory:
what `pipeline("fill-mask", model=DIR)` loads.

    bert_files(model, backend, max_length)     config.json, model.safetensors, tokenizer files
    write_run_files(run_dir, model, ...)       the same files at a finished run's top: the run is
                                               a BERT-format directory (--from-pretrained RUN)
    export_fill_mask(out, model, ..., card)    `tformer export RUN --hf OUT`: checked, then published

The encoder goes through tformer.formats.hf_bert's key table (under "bert.", no pooler: the
class has none), the head through tformer.formats.hf_bert_mlm's; the decoder is tied to the word
embeddings, so no copy of it is written (transformers ties it on load). The tokenizer files are
the run's (tformer.export.hf_classifier.tokenizer_files): truncating at its max length, and
naming its mask token (<mask> for a tokenizer tformer trained, [MASK] for BERT's), which
fill-mask needs. An export is loaded by AutoModelForMaskedLM from a scratch folder first, and
must give tformer's logits (<= TOLERANCE) on padded batches with both token types.
"""

from __future__ import annotations

import sys
from pathlib import Path

import torch
from safetensors.torch import save as st_save

from tformer.export.export_dir import publish_export
from tformer.export.hf_check import loaded_in_transformers, max_difference, ragged_batches
from tformer.export.hf_classifier import BERT_INPUTS, tokenizer_files
from tformer.export.model_card import Card, render
from tformer.formats import hf_bert, hf_bert_mlm
from tformer.storage.files import json_bytes, write_atomic

TOLERANCE = 1e-4  # max abs difference of logits, float32, tformer vs transformers (padded batches)
USAGE = """
from transformers import pipeline
fill = pipeline("fill-mask", model="DIR")
print(fill("the MASK sat on the mat"))  # [{"score", "token", "token_str", "sequence"}, ...], best first
"""


def state_to_hf(model) -> dict[str, torch.Tensor]:
    """MaskedLM's state dict (encoder.*, head.*) under BertForMaskedLM's keys."""
    state = {k: v.detach().cpu() for k, v in model.state_dict().items()}
    encoder = {k.removeprefix("encoder."): v for k, v in state.items()
               if k.startswith("encoder.") and not k.startswith("encoder.pooler.")}
    config = model.config.replace(pooler=False)
    out = {f"bert.{k}": v for k, v in hf_bert.to_hf(encoder, config).items()}
    out.update(hf_bert_mlm.head_to_hf(state))
    return {k: v.contiguous().clone() for k, v in out.items()}


def bert_files(model, backend, max_length: int) -> dict[str, bytes]:
    """The files of a BertForMaskedLM directory for ``model`` and the run's tokenizer ``backend``
    (hf_bert.NotBert for a model BERT cannot express: pre-norm)."""
    return {"config.json": json_bytes(hf_bert_mlm.config_to_hf(model.config)),
            hf_bert.WEIGHTS_FILE: st_save(state_to_hf(model), metadata={"format": "pt"}),
            **tokenizer_files(backend, max_length, extra_config=BERT_INPUTS)}


def write_run_files(run_dir: Path, model, backend, max_length: int) -> None:
    """A finished run's top as a BertForMaskedLM directory, beside its checkpoints: each file
    written atomically, config.json last. Until config.json is there the run is no model
    directory (and `--from-pretrained RUN` says so); every file of a run holds the same
    architecture and tokenizer, so weights published again by a resumed run still match the
    config.json of an earlier finish: the set is whole at every moment."""
    files = bert_files(model, backend, max_length)
    config = files.pop("config.json")
    for name, data in files.items():
        write_atomic(run_dir / name, data)
    write_atomic(run_dir / "config.json", config)


def check_in_transformers(files: dict[str, bytes], model) -> float:
    """The max abs difference of logits between ``files`` loaded by transformers and ``model``,
    on padded batches (with both token types where the model reads them); raises above TOLERANCE."""
    config, worst = model.config, 0.0
    with loaded_in_transformers(files, "AutoModelForMaskedLM", hf_bert_mlm.ARCHITECTURE) as (theirs, _):
        for ids, mask, types in ragged_batches(config):
            kwargs = {"token_type_ids": types} if config.type_vocab_size else {}
            with torch.no_grad():
                ours = model(ids, mask, types if config.type_vocab_size else None)  # (B, S, V)
                got = theirs(input_ids=ids, attention_mask=mask, **kwargs).logits
            real = mask.bool()  # (the logits at padding mean nothing, on either side)
            worst = max(worst, max_difference(got[real], ours[real], "logits", hf_bert_mlm.ARCHITECTURE,
                                              TOLERANCE))
    return worst


def export_fill_mask(out: str | Path, model, backend, max_length: int, mask_token: str, card: Card) -> Path:
    """Publish ``out`` as a BertForMaskedLM directory with a model card, once transformers gives
    tformer's logits; returns ``out``."""
    files = bert_files(model, backend, max_length)
    files["README.md"] = render(card, f"a transformers {hf_bert_mlm.ARCHITECTURE} directory",
                                USAGE.replace("MASK", mask_token), library_name="transformers",
                                pipeline_tag="fill-mask")
    training = model.training
    model.eval()
    try:
        diff = check_in_transformers(files, model)
    finally:
        model.train(training)
    written = publish_export(out, files, "--hf")
    print(f"wrote {written}/ ({hf_bert_mlm.ARCHITECTURE}, max abs diff {diff:.1e} on the logits against "
          "tformer; pipeline('fill-mask') loads it)", file=sys.stderr)
    return written
