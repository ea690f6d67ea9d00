"""A multi-label classifier (tformer.nn.heads.MultiLabelClassifier: logits, one sigmoid per
label, and each label's threshold) out to transformers and ONNX, checked before it is published.

    export_hf(out, model, tokenizer, labels, card, pairs)      -> out
    export_onnx(out, model, tokenizer, labels, card, opset)    -> out

transformers: the classifier's directory as a single-label run writes it (BertForSequenceClassification
with BERT's pooler, else XLMForSequenceClassification: tformer.export.hf_classifier, hf_xlm), with
``problem_type: multi_label_classification``, so that AutoModelForSequenceClassification trains it
with BCE and ``pipeline("text-classification", top_k=None)`` applies a sigmoid to each label (its
default for that problem type; ``function_to_apply="sigmoid"`` says the same): tformer's
probabilities. config.json also holds the thresholds (``tformer_thresholds``: {label: p}), which
transformers keeps but does not apply.

ONNX: a folder as a classifier's (tformer.export.onnx), whose model.onnx gives ``logits`` (B, C)
and ``probabilities`` (B, C), the sigmoid of each; config.json holds id2label and ``thresholds``
(a label is chosen where its probability is at least its threshold).
"""

from __future__ import annotations

import json
import sys
from collections.abc import Sequence
from pathlib import Path

import torch
from torch import Tensor, nn

from tformer.export import hf_classifier, hf_xlm
from tformer.export import onnx as tonnx
from tformer.export.export_dir import publish_export
from tformer.export.model_card import Card, render
from tformer.formats import hf_xlm as hf_xlm_format
from tformer.nn.model import EncoderClassifier
from tformer.storage.files import json_bytes

PROBLEM_TYPE = "multi_label_classification"
HF_USAGE = """
from transformers import pipeline
classify = pipeline("text-classification", model="DIR", top_k=None, function_to_apply="sigmoid")
scores = classify("some text", truncation=True)  # every label's probability, best first
thresholds = classify.model.config.tformer_thresholds  # {label: p}: chosen at or above
print([s["label"] for s in scores if s["score"] >= thresholds[s["label"]]])
"""
ONNX_USAGE = """
import json
import numpy as np
import onnxruntime as ort
from tokenizers import Tokenizer

tokenizer = Tokenizer.from_file("DIR/tokenizer.json")  # cuts texts at the run's max_length
session = ort.InferenceSession("DIR/model.onnx")
config = json.load(open("DIR/config.json"))
labels, thresholds = config["id2label"], config["thresholds"]
enc = tokenizer.encode("some text")
feed = {"input_ids": [enc.ids], "attention_mask": [enc.attention_mask], "token_type_ids": [enc.type_ids]}
inputs = {i.name: np.array(feed[i.name], dtype=np.int64) for i in session.get_inputs()}
logits, probs = session.run(None, inputs)
print([labels[str(c)] for c in range(len(labels)) if probs[0, c] >= thresholds[labels[str(c)]]])
"""


def plain_classifier(model: nn.Module) -> EncoderClassifier:
    """An EncoderClassifier holding ``model``'s weights, without its thresholds (what the
    single-label exporters and their key tables take)."""
    plain = EncoderClassifier(model.config)
    plain.load_state_dict({k: v for k, v in model.state_dict().items() if k != "thresholds"})
    return plain.train(model.training)


def thresholds_of(model: nn.Module, labels: Sequence[str]) -> dict[str, float]:
    return dict(zip(labels, map(float, model.thresholds.tolist()), strict=True))


def hf_files(plain: EncoderClassifier, thresholds: dict[str, float], tokenizer, labels: Sequence[str],
             pairs: bool) -> tuple[dict[str, bytes], str]:
    """The transformers directory's files (README.md aside) of ``plain`` (plain_classifier) and
    its architecture; refusals as the single-label exporters raise them (hf_bert.NotBert,
    hf_xlm.Inexpressible)."""
    if plain.config.pooler:
        files = hf_classifier.classifier_files(plain, tokenizer.backend, tuple(labels), tokenizer.max_length,
                                               Card(name="", kind=""))
        architecture = hf_classifier.ARCHITECTURE
    else:
        files = hf_xlm.classifier_files(plain, tokenizer, tuple(labels), pairs)
        architecture = hf_xlm_format.ARCHITECTURE
    config = json.loads(files["config.json"])
    config.update(problem_type=PROBLEM_TYPE, tformer_thresholds=thresholds)
    files["config.json"] = json_bytes(config)
    return files, architecture


def export_hf(out: Path, model: nn.Module, tokenizer, labels: Sequence[str], card: Card, pairs: bool) -> Path:
    """Publish ``out`` as an AutoModelForSequenceClassification directory of problem type
    multi_label_classification, once transformers gives tformer's logits (the single-label
    exporters' checks: padded batches for BERT, unpadded inputs and the tokenizer's ids for XLM)."""
    plain = plain_classifier(model)
    files, architecture = hf_files(plain, thresholds_of(model, labels), tokenizer, labels, pairs)
    if model.config.pooler:
        diff = hf_classifier.check_in_transformers(files, plain)
    else:
        diff = hf_xlm.check_in_transformers(files, plain, tokenizer, pairs)
    one = "; one text per call (a padded batch would average over its padding)" if not model.config.pooler \
        and model.config.pooling == "mean" else ""
    what = (f"a transformers {architecture} directory of problem type {PROBLEM_TYPE} (checked in "
            f"transformers: max abs diff {diff:.1e} on the logits{one})")
    files["README.md"] = render(card, what, HF_USAGE, library_name="transformers",
                                pipeline_tag="text-classification")
    written = publish_export(out, files, "--hf")
    print(f"wrote {written}/ ({architecture}, problem_type {PROBLEM_TYPE}, max abs diff {diff:.1e} on the "
          "logits against tformer; pipeline('text-classification', top_k=None) gives each label's "
          f"sigmoid{one})", file=sys.stderr)
    return written


class LabelSetGraph(tonnx.ClassifierGraph):
    """A multi-label classifier: logits (B, C) and their sigmoids, the probabilities (B, C)."""

    output_names = ["logits", "probabilities"]

    def forward(self, input_ids: Tensor, attention_mask: Tensor,
                token_type_ids: Tensor | None = None) -> tuple[Tensor, Tensor]:
        """Shape: (B, S) each -> (B, C), (B, C)."""
        logits = self.classifier(input_ids, attention_mask, token_type_ids).logits
        return logits, torch.sigmoid(logits)


def export_onnx(out: Path, model: nn.Module, tokenizer, labels: Sequence[str], card: Card, opset: int,
                pipeline_tag: str) -> Path:
    """Folder ``out``: model.onnx (checked in onnxruntime: logits and probabilities), config.json
    (id2label, problem_type, thresholds), the tokenizer, a card."""
    out = tonnx.check_folder(out)  # refused before the tracing
    onnx_model, diff = tonnx.onnx_bytes(LabelSetGraph(model), opset)
    config = {**tonnx.classifier_config(model.config, labels), "problem_type": PROBLEM_TYPE,
              "thresholds": thresholds_of(model, labels)}
    files = {"model.onnx": onnx_model, "config.json": json_bytes(config)}
    files.update(hf_classifier.tokenizer_files(tokenizer.backend, tokenizer.max_length,
                                               extra_config=hf_classifier.BERT_INPUTS))
    files["README.md"] = render(card, "an ONNX multi-label classifier (model.onnx: logits and probabilities, "
                                "each label's sigmoid; config.json: id2label and each label's threshold)",
                                ONNX_USAGE, library_name="onnx", pipeline_tag=pipeline_tag, tags=("onnx",))
    written = publish_export(out, files, "--onnx")
    tonnx.report(f"{written}/", diff)
    return written
