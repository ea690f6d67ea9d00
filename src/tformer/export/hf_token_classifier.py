"""A token classifier (tformer.nn.heads.TokenClassifier) out to transformers and ONNX.

- `token_classifier_files(model, backend, labels, max_length, card)`: a transformers
  BertForTokenClassification directory (AutoModelForTokenClassification loads it): the encoder
  through hf_bert's key table under "bert.", the head as "classifier.", id2label/label2id, and
  the run's tokenizer (tokenizer.json truncating at its max_length, as the run does).
- `check_in_transformers(files, model, texts, entities)`: the files loaded by transformers must
  give tformer's logits on padded batches (<= TOLERANCE), and its pipeline("token-classification",
  aggregation_strategy="simple") on ``texts`` the entities tformer finds (``entities(texts)``):
  the same groups, words and offsets, scores within SCORE_TOLERANCE. Nothing is written before.
- `export_token_classifier(out, model, tokenizer, labels, card, entities)`: the two above, then
  the folder published whole (``export_dir.publish_export``).
- `export_onnx_folder(out, model, tokenizer, labels, card, opset)`: model.onnx (logits per
  sub-word, checked in onnxruntime), config.json (the BERT config where BERT expresses the
  encoder, with id2label), the tokenizer and a card.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from pathlib import Path

import numpy as np
import torch
from safetensors.torch import save as st_save

from tformer.export import onnx as tonnx
from tformer.export.export_dir import publish_export
from tformer.export.hf_check import loaded_in_transformers, max_difference, ragged_batches
from tformer.export.hf_classifier import BERT_INPUTS, classifier_state_to_hf, tokenizer_files
from tformer.export.model_card import Card, render
from tformer.formats import hf_bert
from tformer.storage.files import json_bytes

ARCHITECTURE = "BertForTokenClassification"
TOLERANCE = 1e-4  # max abs difference of logits, float32, tformer vs transformers (padded batches)
SCORE_TOLERANCE = 1e-5  # max abs difference of an entity's score, tformer vs the pipeline
USAGE = """
from transformers import pipeline
tagger = pipeline("token-classification", model="DIR", aggregation_strategy="first")
print(tagger("some text"))  # [{"entity_group", "score", "word", "start", "end"}, ...]: `tformer predict`'s
"""


def token_classifier_config(config, labels: Sequence[str]) -> dict:
    """The token classifier's TransformerConfig -> BertForTokenClassification's config.json; a
    config BERT cannot express raises hf_bert.NotBert, naming the field."""
    if config.n_classes != len(labels):
        raise ValueError(f"labels: expected {config.n_classes} names (config.n_classes), got {len(labels)}")
    hf_config = hf_bert.config_to_hf(config.replace(n_classes=None, pooler=False))
    hf_config.update({
        "architectures": [ARCHITECTURE],
        "num_labels": len(labels),
        "id2label": {str(i): name for i, name in enumerate(labels)},
        "label2id": {name: i for i, name in enumerate(labels)},
        "classifier_dropout": None,  # the hidden states' dropout, as tformer's head has it
    })
    return hf_config


def token_classifier_files(model, backend, labels: Sequence[str], max_length: int,
                           card: Card) -> dict[str, bytes]:
    """The files of a BertForTokenClassification directory for ``model`` (encoder.*, head.*) and
    the run's tokenizer ``backend``."""
    config = model.config
    files = {"config.json": json_bytes(token_classifier_config(config, labels))}
    # (the same rows as a sequence classifier's: bert.* from hf_bert's table, classifier.* the head)
    state = classifier_state_to_hf(model.state_dict(), config)
    files[hf_bert.WEIGHTS_FILE] = st_save(state, metadata={"format": "pt"})
    files.update(tokenizer_files(backend, max_length, extra_config=BERT_INPUTS))
    files["README.md"] = render(card, f"a transformers {ARCHITECTURE} directory", USAGE,
                                library_name="transformers", pipeline_tag="token-classification")
    return files


def check_in_transformers(files: Mapping[str, bytes], model, texts: Sequence[str],
                          entities: Callable[[list[str]], list[list[dict]]]) -> float:
    """The worst difference found (logits, then entity scores); raises ValueError (nothing is
    then written) where transformers disagrees with tformer."""
    from transformers import AutoTokenizer, pipeline

    config, worst = model.config, 0.0
    training = model.training
    model.eval()
    try:
        loaded = loaded_in_transformers(files, "AutoModelForTokenClassification", ARCHITECTURE)
        with loaded as (theirs, folder):
            for ids, mask, _ in ragged_batches(config):
                with torch.no_grad():
                    ours = model(ids, mask).logits  # (B, S, C)
                    got = theirs(input_ids=ids, attention_mask=mask).logits
                real = mask.bool()  # a padding position's row is not compared (no one reads it)
                worst = max(worst, max_difference(got[real], ours[real], "logits", ARCHITECTURE,
                                                  TOLERANCE))
            tagger = pipeline("token-classification", model=theirs,
                              tokenizer=AutoTokenizer.from_pretrained(folder),
                              aggregation_strategy="simple", device="cpu")
            expected = entities(list(texts))
            for i, text in enumerate(texts):
                worst = max(worst, _same_entities(tagger(text), expected[i], f"texts[{i}] {text[:40]!r}"))
    finally:
        model.train(training)
    return worst


def _same_entities(got: list[dict], expected: list[dict], where: str) -> float:
    keys = ("entity_group", "word", "start", "end")
    theirs = [tuple(e[k] for k in keys) for e in got]
    ours = [tuple(e[k] for k in keys) for e in expected]
    if theirs != ours:
        raise ValueError(f"--hf: the {ARCHITECTURE} export's pipeline finds {theirs} in {where}, tformer "
                         f"{ours}; nothing was written")
    diff = max((abs(float(g["score"]) - e["score"]) for g, e in zip(got, expected, strict=True)), default=0.0)
    if not diff <= SCORE_TOLERANCE:
        raise ValueError(f"--hf: the {ARCHITECTURE} export's pipeline scores {where}'s entities "
                         f"{diff:.2e} away from tformer's, expected <= {SCORE_TOLERANCE:.0e}; nothing "
                         "was written")
    return diff


def onnx_config(config, labels: Sequence[str]) -> dict:
    """config.json of a token classifier's ONNX folder: BertForTokenClassification's where BERT
    expresses the model, else tformer's own config; with the label names either way."""
    try:
        return token_classifier_config(config, labels)
    except hf_bert.NotBert:  # pre-norm: what tformer's config says
        return {"tformer_config": config.to_dict(), "num_labels": len(labels),
                "id2label": {str(i): name for i, name in enumerate(labels)},
                "label2id": {name: i for i, name in enumerate(labels)}}


def export_token_classifier(out: str | Path, model, tokenizer, labels: Sequence[str], card: Card,
                            entities: Callable[[list[str]], list[list[dict]]]) -> tuple[Path, float]:
    """Publish ``out`` as a BertForTokenClassification directory once transformers gives tformer's
    logits, and its pipeline tformer's entities (``entities(texts)``) on texts of the run's own
    vocabulary; returns (out, the worst difference)."""
    files = token_classifier_files(model, tokenizer.backend, labels, tokenizer.max_length, card)
    diff = check_in_transformers(files, model, check_texts(tokenizer), entities)
    return publish_export(out, files, "--hf"), diff


def check_texts(tokenizer, n: int = 8) -> list[str]:
    """Texts an export is checked on: runs of 12 ids of the tokenizer's vocabulary (seeded), decoded."""
    rng = np.random.default_rng(0)
    texts = [tokenizer.decode(rng.integers(0, tokenizer.vocab_size, 12).tolist()) for _ in range(n)]
    return [t for t in texts if t.strip()] or ["a text"]


def export_onnx_folder(out: str | Path, model, tokenizer, labels: Sequence[str], card: Card,
                       opset: int) -> tuple[Path, float]:
    """Folder ``out`` (see the module docstring), checked in onnxruntime before it is published;
    returns (out, max abs diff of the logits)."""
    out = tonnx.check_folder(out)  # refused before the tracing
    onnx_model, diff = tonnx.onnx_bytes(tonnx.ClassifierGraph(model), opset)
    files = {"model.onnx": onnx_model, "config.json": json_bytes(onnx_config(model.config, labels)),
             **tokenizer_files(tokenizer.backend, tokenizer.max_length, extra_config=BERT_INPUTS)}
    files["README.md"] = render(card, "an ONNX token classifier (model.onnx: logits per sub-word; "
                                "config.json: id2label)", ONNX_USAGE, library_name="onnx",
                                pipeline_tag="token-classification", tags=("onnx",))
    return publish_export(out, files, "--onnx"), diff


ONNX_USAGE = """
import json
import numpy as np
import onnxruntime as ort
from tokenizers import Tokenizer

tokenizer = Tokenizer.from_file("DIR/tokenizer.json")  # cuts texts at the run's max_length
session = ort.InferenceSession("DIR/model.onnx")
labels = json.load(open("DIR/config.json"))["id2label"]
enc = tokenizer.encode("some text")
feed = {"input_ids": [enc.ids], "attention_mask": [enc.attention_mask], "token_type_ids": [enc.type_ids]}
(logits,) = session.run(None, {i.name: np.array(feed[i.name], dtype=np.int64) for i in session.get_inputs()})
for token, (start, end), c in zip(enc.tokens, enc.offsets, logits[0].argmax(-1)):
    print(token, start, end, labels[str(c)])  # a label per sub-word (read a word's first)
"""
