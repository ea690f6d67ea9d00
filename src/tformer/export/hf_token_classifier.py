"""A token classifier (tformer.nn.heads.TokenClassifier) out to transformers and ONNX.

- `token_classifier_files(model, backend, labels, max_length, card)`: a transformers
  BertForTokenClassification directory (AutoModelForTokenClassification loads it): the encoder
  through hf_bert's key table under "bert.", the head as "classifier.", id2label/label2id, and
  the run's tokenizer (tokenizer.json truncating at its max_length, as the run does).
- `check_in_transformers(files, model, texts, entities)`: the files loaded by transformers must
  give tformer's logits on padded batches (<= TOLERANCE), and its pipeline("token-classification",
  aggregation_strategy="simple") on ``texts`` the entities tformer finds (``entities(texts)``):
  the same groups, words and offsets, scores within SCORE_TOLERANCE. Nothing is written before.
- `onnx_config(config, labels)`: config.json of the ONNX folder (the BERT config where BERT
  expresses the encoder, with id2label).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence

import torch
from safetensors.torch import save as st_save

from tformer.export.hf_check import loaded_in_transformers, max_difference
from tformer.export.hf_classifier import BERT_INPUTS, classifier_state_to_hf, tokenizer_files
from tformer.export.model_card import Card, render
from tformer.formats import hf_bert
from tformer.storage.files import json_bytes

ARCHITECTURE = "BertForTokenClassification"
TOLERANCE = 1e-4  # max abs difference of logits, float32, tformer vs transformers (padded batches)
SCORE_TOLERANCE = 1e-5  # max abs difference of an entity's score, tformer vs the pipeline
USAGE = """
from transformers import pipeline
tagger = pipeline("token-classification", model="DIR", aggregation_strategy="simple")
print(tagger("some text"))  # [{"entity_group", "score", "word", "start", "end"}, ...]
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
    generator = torch.Generator().manual_seed(0)
    training = model.training
    model.eval()
    try:
        loaded = loaded_in_transformers(files, "AutoModelForTokenClassification", ARCHITECTURE)
        with loaded as (theirs, folder):
            for b, s in ((1, 1), (3, min(17, config.max_len))):
                ids = torch.randint(0, config.vocab_size, (b, s), generator=generator)  # (B, S)
                lengths = torch.clamp(s - 5 * torch.arange(b), min=1)  # ragged padding
                mask = (torch.arange(s)[None, :] < lengths[:, None]).long()  # (B, S)
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
