"""Trained encoders out to the tools users take them to.

- `classifier_files(model, tokenizer, labels, max_length, card)`: a classifier as a
  transformers BertForSequenceClassification directory (AutoModelForSequenceClassification
  loads it): the encoder through hf_bert's key table, plus one row for the head. The
  classifier must pool with the BERT pooler (``config.pooler``): that is what the HF class
  computes. `export_classifier` loads the files in transformers, which must give tformer's
  logits on padded batches (``tformer.export.hf_check``), then publishes them whole
  (``export_dir.publish_export``).
- `tokenizer_files(backend, max_length, ...)`: tokenizer.json (truncating at the run's
  max_length) and a tokenizer_config.json, so AutoTokenizer tokenizes as the run did.
- `save_sentence_layout(model, run_dir, max_length)`: an embedding model in the
  sentence-transformers layout (modules.json, 0_Transformer/ as a BERT directory,
  1_Pooling/, 2_Normalize/), so `SentenceTransformer(run_dir)` and `tformer embed run_dir`
  both load it.

The exporters take objects (model, tokenizer backend, labels, sizes): reading a run
directory is the CLI's job (``tformer.commands.export``).
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from pathlib import Path

import torch
from safetensors.torch import save as st_save
from tokenizers import Tokenizer, processors

from tformer.export.export_dir import publish_export
from tformer.export.hf_check import loaded_in_transformers, max_difference, ragged_batches
from tformer.export.model_card import Card, render
from tformer.formats import hf_bert
from tformer.formats.pretrained import export_hf
from tformer.formats.st_layout import _POOLING_KEYS
from tformer.storage.files import json_bytes, write_atomic, write_json_atomic

# (their key, our key): the classification head; the encoder's rows are hf_bert's, under "bert.".
HEAD_ROWS = (("classifier.weight", "head.weight"), ("classifier.bias", "head.bias"))
ARCHITECTURE = "BertForSequenceClassification"
TOLERANCE = 1e-4  # max abs difference of logits, float32, tformer vs transformers (padded batches)
SPECIAL_NAMES = {"pad_token": ("<pad>", "[PAD]"), "cls_token": ("<s>", "[CLS]"),
                 "sep_token": ("</s>", "[SEP]"), "unk_token": ("<unk>", "[UNK]"),
                 "mask_token": ("<mask>", "[MASK]"), "bos_token": ("<s>",), "eos_token": ("</s>",)}
# BERT models read token types (the second text of a pair is type 1): the tokenizer must return them.
BERT_INPUTS = {"model_input_names": ["input_ids", "token_type_ids", "attention_mask"]}
USAGE = """
from transformers import AutoModelForSequenceClassification, AutoTokenizer
tokenizer = AutoTokenizer.from_pretrained("DIR")
model = AutoModelForSequenceClassification.from_pretrained("DIR")
probs = model(**tokenizer(["some text"], truncation=True, return_tensors="pt")).logits.softmax(-1)
"""


def classifier_state_to_hf(state: dict, config) -> dict:
    """Classifier state dict (encoder.*, head.*) -> BertForSequenceClassification's."""
    encoder = {k[len("encoder."):]: v for k, v in state.items() if k.startswith("encoder.")}
    out = {f"bert.{k}": v for k, v in hf_bert.to_hf(encoder, config).items()}
    for theirs, ours in HEAD_ROWS:
        out[theirs] = state[ours]
    return {k: v.detach().contiguous().clone() for k, v in out.items()}


def classifier_config_to_hf(config, labels: Sequence[str]) -> dict:
    """The classifier's TransformerConfig -> BertForSequenceClassification's config.json;
    a config the class cannot express raises, naming the field."""
    if not config.pooler:
        raise ValueError(
            f"config.pooler: BertForSequenceClassification pools with the BERT pooler "
            f"(tanh(W h[CLS])), expected pooler=True, got pooler=False (pooling {config.pooling!r})"
        )
    if config.n_classes != len(labels):
        raise ValueError(f"labels: expected {config.n_classes} names (config.n_classes), got {len(labels)}")
    hf_config = hf_bert.config_to_hf(config.replace(n_classes=None))
    hf_config.update({
        "architectures": ["BertForSequenceClassification"],
        "num_labels": len(labels),
        "id2label": {str(i): name for i, name in enumerate(labels)},
        "label2id": {name: i for i, name in enumerate(labels)},
        "problem_type": "single_label_classification",
        "classifier_dropout": None,
    })
    return hf_config


def classifier_files(model, tokenizer, labels: Sequence[str], max_length: int,
                     card: Card) -> dict[str, bytes]:
    """The files of a BertForSequenceClassification directory for ``model`` (its
    ``config`` and state dict: encoder.*, head.*) and the run's ``tokenizer`` backend."""
    config = model.config
    files = {"config.json": json_bytes(classifier_config_to_hf(config, labels))}
    state = classifier_state_to_hf(model.state_dict(), config)
    files[hf_bert.WEIGHTS_FILE] = st_save(state, metadata={"format": "pt"})
    files.update(tokenizer_files(tokenizer, max_length, extra_config=BERT_INPUTS))
    files["README.md"] = render(card, "a transformers BertForSequenceClassification directory", USAGE,
                                library_name="transformers", pipeline_tag="text-classification")
    return files


def check_in_transformers(files: Mapping[str, bytes], model) -> float:
    """The max abs difference of logits between ``files`` loaded by transformers and ``model``,
    on padded batches with both token types; raises above TOLERANCE."""
    config, worst = model.config, 0.0
    training = model.training
    model.eval()
    try:
        with loaded_in_transformers(files, "AutoModelForSequenceClassification", ARCHITECTURE) as (theirs, _):
            for ids, mask, types in ragged_batches(config):
                with torch.no_grad():
                    ours = model(ids, mask, types if config.type_vocab_size else None).logits  # (B, C)
                    got = theirs(input_ids=ids, attention_mask=mask,
                                 **({"token_type_ids": types} if config.type_vocab_size else {})).logits
                worst = max(worst, max_difference(got, ours, "logits", ARCHITECTURE, TOLERANCE))
    finally:
        model.train(training)
    return worst


def export_classifier(out: str | Path, model, tokenizer, labels: Sequence[str], max_length: int,
                      card: Card) -> tuple[Path, float]:
    """Publish ``out`` as a BertForSequenceClassification directory (see classifier_files) once
    transformers gives tformer's logits; returns (out, max abs diff)."""
    files = classifier_files(model, tokenizer, labels, max_length, card)
    diff = check_in_transformers(files, model)
    return publish_export(out, files, "--hf"), diff


def tokenizer_files(backend, max_length: int, template: str | None = None,
                    extra_config: dict | None = None) -> dict[str, bytes]:
    """tokenizer.json (truncating at ``max_length`` tokens, specials included, as the run
    did) and a tokenizer_config.json naming the special tokens with model_max_length =
    ``max_length``, so that AutoTokenizer builds a PreTrainedTokenizerFast that tokenizes
    like the run. ``template``: a post-processor "single" template to use instead of the
    file's (e.g. "$A </s>" for a seq2seq source). ``backend`` is left unchanged."""
    tok = Tokenizer.from_str(backend.to_str())  # a copy: the caller's backend keeps its settings
    if template is not None:
        specials = [(t, tok.token_to_id(t)) for t in ("<s>", "</s>") if t in template.split()]
        tok.post_processor = processors.TemplateProcessing(single=template, special_tokens=specials)
    tok.no_padding()
    tok.enable_truncation(max_length)
    vocab = tok.get_vocab()
    config = {"tokenizer_class": "PreTrainedTokenizerFast", "model_max_length": max_length,
              "clean_up_tokenization_spaces": False,  # decode exactly as the run did
              **(extra_config or {})}
    for key, candidates in SPECIAL_NAMES.items():
        for token in candidates:
            if token in vocab:
                config[key] = token
                break
    return {"tokenizer.json": tok.to_str().encode("utf-8"), "tokenizer_config.json": json_bytes(config)}


def write_tokenizer_files(tokenizer_json: Path, out: Path, max_length: int) -> None:
    """tokenizer_files for a tokenizer.json on disk, written into ``out`` (a run's own
    sentence-transformers folder)."""
    out.mkdir(parents=True, exist_ok=True)
    backend = Tokenizer.from_file(str(tokenizer_json))
    for name, data in tokenizer_files(backend, max_length, extra_config=BERT_INPUTS).items():
        write_atomic(out / name, data)


def save_sentence_layout(model, run_dir: Path, max_length: int) -> None:
    """Write the sentence-transformers modules of an embedding run into `run_dir`."""
    transformer = run_dir / "0_Transformer"
    export_hf(model.encoder, transformer)
    write_tokenizer_files(run_dir / "tokenizer.json", transformer, max_length)
    # The encoder has no BERT pooler (sentences are pooled by 1_Pooling): BertModel is built
    # without one, so that sentence-transformers loads every weight and reports none missing.
    # ("model_args": the name sentence-transformers 3 reads, and 5+ still accepts.)
    write_json_atomic(transformer / "sentence_bert_config.json",
                      {"max_seq_length": max_length, "do_lower_case": False,
                       "model_args": {"add_pooling_layer": bool(model.config.pooler)}})
    pooling = {"word_embedding_dimension": model.config.d_model}
    pooling.update({key: mode in model.pooling for mode, key in _POOLING_KEYS.items()})
    (run_dir / "1_Pooling").mkdir(exist_ok=True)
    write_json_atomic(run_dir / "1_Pooling" / "config.json", pooling)
    (run_dir / "2_Normalize").mkdir(exist_ok=True)
    modules = [
        {"idx": 0, "name": "0", "path": "0_Transformer", "type": "sentence_transformers.models.Transformer"},
        {"idx": 1, "name": "1", "path": "1_Pooling", "type": "sentence_transformers.models.Pooling"},
        {"idx": 2, "name": "2", "path": "2_Normalize", "type": "sentence_transformers.models.Normalize"},
    ]
    write_atomic(run_dir / "modules.json", json.dumps(modules, indent=2).encode())
