"""A cross-encoder (an encoder over a text pair, BERT's pooler, one output) as a transformers
BertForSequenceClassification directory with num_labels = 1: what sentence-transformers'
CrossEncoder loads, and transformers' text-classification pipeline.

    export_cross_encoder(out, model, tokenizer, activation, card, what, usage, pipeline_tag, pairs,
                         scores) -> (out, max abs diff)

The output's activation is written into config.json where both libraries read it:
sentence-transformers' ``sentence_transformers.activation_fn`` (``sbert_ce_default_activation_function``
before its version 4; CrossEncoder's default with one label is a sigmoid, and a model trained on
raw scores needs Identity), and ``problem_type``
(transformers' pipeline applies nothing for "regression", a sigmoid to one label otherwise).
Before anything is published, transformers must give the model's logits (padded batches, both
token types: tformer.export.hf_classifier's check), and CrossEncoder(DIR).predict must give
tformer's scores of real text pairs (``scores``: the run's own, activation included) within
``TOLERANCE``.
"""

from __future__ import annotations

import json
import tempfile
from collections.abc import Callable, Sequence
from pathlib import Path

from tformer.export import hf_classifier
from tformer.export.export_dir import publish_export
from tformer.export.model_card import Card, render
from tformer.storage.files import json_bytes

TOLERANCE = 1e-4  # max abs difference of scores, float32, tformer vs sentence-transformers
LABEL = "score"  # the one output's name (id2label)
# The activation of a cross-encoder's output, as sentence-transformers names the torch module.
ACTIVATIONS = {"identity": "torch.nn.modules.linear.Identity",
               "sigmoid": "torch.nn.modules.activation.Sigmoid"}
CHECK_PAIRS = (("How do I list the files of a folder?", "ls lists the contents of a directory."),
               ("a cat sat on the mat", "The weather in Lisbon, café au lait, 東京"),
               ("x", "Straße " * 200))  # one long enough to be cut


def cross_encoder_files(model, tokenizer, activation: str) -> dict[str, bytes]:
    """config.json, the weights and the tokenizer of the BertForSequenceClassification
    (hf_classifier's, num_labels 1), with the activation written in."""
    if activation not in ACTIVATIONS:
        raise ValueError(f"activation: expected one of {', '.join(ACTIVATIONS)}, got {activation!r}")
    files = hf_classifier.classifier_files(model, tokenizer.backend, (LABEL,), tokenizer.max_length,
                                           Card(name="", kind=""))
    del files["README.md"]  # the kind's own card is written below
    config = json.loads(files["config.json"])
    config.pop("problem_type")  # one label and none: transformers' pipeline applies a sigmoid
    if activation == "identity":
        config["problem_type"] = "regression"  # the pipeline applies nothing
    config["sentence_transformers"] = {"activation_fn": ACTIVATIONS[activation]}
    config["sbert_ce_default_activation_function"] = ACTIVATIONS[activation]  # (sentence-transformers 3)
    files["config.json"] = json_bytes(config)
    return files


def check_in_sentence_transformers(files: dict[str, bytes], pairs: Sequence[tuple[str, str]],
                                   expected: Sequence[float]) -> float | None:
    """max |CrossEncoder(DIR).predict(pairs) - expected|, raising above TOLERANCE; None where
    sentence-transformers is not installed (transformers' check still ran)."""
    try:
        from sentence_transformers import CrossEncoder
    except ImportError:
        return None
    with tempfile.TemporaryDirectory(prefix="tformer-ce-") as tmp:
        for name, data in files.items():
            (Path(tmp) / name).write_bytes(data)
        from transformers.utils import logging

        bar = logging.is_progress_bar_enabled()
        logging.disable_progress_bar()  # its "Loading weights" bar is not the user's business
        try:
            model = CrossEncoder(tmp, device="cpu", local_files_only=True)
        finally:
            if bar:
                logging.enable_progress_bar()
        got = model.predict(list(pairs), batch_size=len(pairs), show_progress_bar=False,
                            convert_to_numpy=True)
    diff = max(abs(float(g) - float(e)) for g, e in zip(got, expected, strict=True))
    if not diff <= TOLERANCE:
        raise ValueError(f"--hf: sentence-transformers' CrossEncoder scores the export's pairs {diff:.2e} "
                         f"away from tformer's, expected <= {TOLERANCE:.0e}; nothing was written")
    return diff


def export_cross_encoder(out: str | Path, model, tokenizer, activation: str, card: Card, what: str,
                         usage: str, pipeline_tag: str,
                         scores: Callable[[list[tuple[str, str]]], list[float]] | None) -> tuple[Path, str]:
    """Publish ``out`` once transformers and sentence-transformers agree with tformer (``scores``:
    tformer's scores of pairs, as the run gives them; None for a model of single texts, which
    CrossEncoder does not take); returns (out, what was checked)."""
    files = cross_encoder_files(model, tokenizer, activation)
    logits = hf_classifier.check_in_transformers(files, model)
    checked = f"max abs diff {logits:.1e} on the logits in transformers"
    if scores is not None:
        pairs = list(CHECK_PAIRS)
        diff = check_in_sentence_transformers(files, pairs, scores(pairs))
        checked += (f", {diff:.1e} on CrossEncoder.predict's scores" if diff is not None
                    else "; sentence-transformers is not installed: CrossEncoder not checked")
    files["README.md"] = render(card, f"{what} ({checked})", usage, library_name="sentence-transformers",
                                pipeline_tag=pipeline_tag, tags=("cross-encoder",))
    return publish_export(out, files, "--hf"), checked
