"""A classifier without BERT's pooler (the default from scratch pools by the mean of its real
tokens) as a transformers XLMForSequenceClassification directory, checked in transformers before
it is published.

    export_classifier(out, model, tokenizer, labels, card, pairs=False) -> (out, max abs diff)

The weights go through ``tformer.formats.hf_xlm``'s key table (which says how XLM expresses
BERT's encoder). Before anything is published the files are loaded from a scratch folder by
AutoModelForSequenceClassification and AutoTokenizer (no ``trust_remote_code``), which must give
tformer's logits (max abs diff <= ``TOLERANCE``) on unpadded inputs of lengths 1 .. max_len and
the run's token ids; then ``export_dir.publish_export`` writes them in one atomic step.

XLM's mean runs over every position, padding included (``formats.hf_xlm``), and no stock
transformers class puts a masked mean over a BERT-layout encoder under a linear head (ModernBERT's
masks padding, over rotary positions and gated units). So a padded batch must fail, not answer:
a mean-pooled export's tokenizer pads with ``NO_PADDING``, a token whose id lies past the model's
vocabulary, and any padded batch (``pipeline(..., batch_size=8)``, ``tokenizer(texts,
padding=True)``) stops in the embedding lookup with an IndexError. With no padding token at all,
transformers refused a batch with advice to pad with the EOS token, which then averaged over the
padding: probabilities off by up to 0.19, without a word. Its card says so.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path

import torch
from safetensors.torch import save as st_save
from tokenizers import AddedToken, Tokenizer

from tformer.export.export_dir import publish_export
from tformer.export.hf_check import loaded_in_transformers
from tformer.export.hf_classifier import tokenizer_files
from tformer.export.model_card import Card, render
from tformer.formats import hf_xlm
from tformer.formats.hf_bert import WEIGHTS_FILE
from tformer.nn.positional import sinusoidal_table
from tformer.storage.files import json_bytes

TOLERANCE = 1e-5  # max abs difference of logits, float32, tformer vs transformers, unpadded inputs
CHECK_TEXTS = ("Hello, world.", "the cat sat on the mat", "Straße, café, 東京 %s")
USAGE = """
from transformers import pipeline
classify = pipeline("text-classification", model="DIR", top_k=None)  # one text per call
print(classify("some text", truncation=True))  # [{"label": ..., "score": ...}, ...]
"""
PAIR_USAGE = """
print(classify({"text": "first text", "text_pair": "second text"}, truncation=True))
# without pipeline, pass the token_type_ids the tokenizer returns: model(**tokenizer(a, b, ...))
"""
PADDING = """
## Padding: one text per call

XLMForSequenceClassification pools with XLM's sequence summary, whose mean runs over every
position of its input, padding included; tformer averages the real tokens only. The two agree on
an unpadded input (max abs diff {diff:.1e} on the logits, checked when exported): one text per
call, as `pipeline` runs by default (batch_size=1). A padded batch would average over the padding
too and give other probabilities, so it fails instead: the tokenizer pads with `{token}`, whose id
lies past the model's vocabulary, and `pipeline(..., batch_size=8)` or `tokenizer(texts,
padding=True)` then stop with `IndexError: index out of range`. Do not give the tokenizer another
padding token (the EOS token, say): the answers would be wrong without a word. For batches, use the
ONNX export (`tformer export RUN --onnx DIR`), which masks the padding.
"""
NO_PADDING = "<|no-padding: one text per call|>"  # a mean-pooled export's padding token, past the vocabulary


def classifier_files(model, tokenizer, labels: Sequence[str], pairs: bool = False) -> dict[str, bytes]:
    """The files of an XLMForSequenceClassification directory for ``model`` (an
    EncoderClassifier without the pooler) and the run's ``tokenizer`` (tformer.text.tokenizer);
    ``pairs``: whether the run was trained on text pairs (the export then takes token types).
    A setting XLM cannot express raises ``hf_xlm.Inexpressible``."""
    config = model.config
    hf_xlm.check_expressible(config)
    token_types = hf_xlm.carries_token_types(config, pairs)
    if token_types and tokenizer.pad_id != 0:
        raise hf_xlm.Inexpressible("pad_id", "0 for a run trained on text pairs (word row 0 carries "
                                   "token type 0)", tokenizer.pad_id)
    mean = config.pooling == "mean"
    sinusoidal = config.positional == "sinusoidal"
    sinusoids = sinusoidal_table(config.max_len, config.d_model) if sinusoidal else None
    files = {
        "config.json": json_bytes(hf_xlm.config_to_hf(config, labels, tokenizer.pad_id, tokenizer.bos_id,
                                                      tokenizer.eos_id)),
        WEIGHTS_FILE: st_save(hf_xlm.to_hf(model.state_dict(), config, token_types, sinusoids),
                              metadata={"format": "pt"}),
    }
    inputs = ["input_ids", *(["token_type_ids"] if token_types else []), "attention_mask"]
    files.update(tokenizer_files(tokenizer.backend, tokenizer.max_length,
                                 extra_config={"model_input_names": inputs}))
    if mean:  # a padded batch fails, not averaged over its padding
        files.update(_padding_past_the_vocabulary(files, config.vocab_size))
    return files


def _padding_past_the_vocabulary(files: dict[str, bytes], vocab_size: int) -> dict[str, bytes]:
    """tokenizer.json and tokenizer_config.json padding with NO_PADDING, an added token whose
    id is ``vocab_size`` or more: XLMModel's embedding lookup raises on it, so a padded batch
    fails where it would have averaged over its padding. (Where the tokenizer's vocabulary is
    smaller than the model's, filler tokens take the ids between, so NO_PADDING's is past both.)"""
    tok = Tokenizer.from_str(files["tokenizer.json"].decode("utf-8"))
    fillers = [AddedToken(f"<|unused-{i}|>", special=True, normalized=False)
               for i in range(tok.get_vocab_size(), vocab_size)]
    tok.add_special_tokens([*fillers, AddedToken(NO_PADDING, special=True, normalized=False)])
    if tok.token_to_id(NO_PADDING) < vocab_size:  # (never: the fillers fill up to it)
        raise ValueError(f"tokenizer: expected the padding token past the model's {vocab_size} ids, got "
                         f"{tok.token_to_id(NO_PADDING)}")
    tok_config = json.loads(files["tokenizer_config.json"])
    tok_config["pad_token"] = NO_PADDING
    return {"tokenizer.json": tok.to_str().encode("utf-8"), "tokenizer_config.json": json_bytes(tok_config)}


def check_in_transformers(files: dict[str, bytes], model, tokenizer, pairs: bool = False) -> float:
    """Load ``files`` as transformers does and compare with ``model``: the max abs difference of
    logits on unpadded inputs (raises above TOLERANCE, or when the tokenizer's ids differ)."""
    config = model.config
    token_types = hf_xlm.carries_token_types(config, pairs)
    architecture = hf_xlm.ARCHITECTURE
    with loaded_in_transformers(files, "AutoModelForSequenceClassification",
                                architecture) as (theirs, folder):
        from transformers import AutoTokenizer

        their_tokenizer = AutoTokenizer.from_pretrained(folder, local_files_only=True)
        return _compare(theirs, their_tokenizer, model, tokenizer, token_types)


def _compare(theirs, their_tokenizer, model, tokenizer, token_types: bool) -> float:
    """check_in_transformers' comparison: the tokens of CHECK_TEXTS, and the logits of random
    unpadded inputs of lengths 1 .. max_len."""
    config = model.config
    for text in CHECK_TEXTS:
        (ours,) = tokenizer.encode([text])
        got = their_tokenizer(text, truncation=True)
        if got["input_ids"] != ours.ids or ("token_type_ids" in got) != token_types:
            raise ValueError(f"--hf: transformers' tokenizer gives {dict(got)} for {text!r}, "
                             f"tformer's ids {ours.ids}")
    worst = 0.0
    generator = torch.Generator().manual_seed(0)
    for length in sorted({1, 2, config.max_len // 2, config.max_len} - {0}):
        ids = torch.randint(0, config.vocab_size - 1, (1, length), generator=generator)  # (1, S)
        ids = ids + (ids >= tokenizer.pad_id).long()  # real tokens: never the padding id
        types = torch.zeros_like(ids)
        if token_types:
            types[:, length // 2:] = 1  # the second text of a pair
        mask = torch.ones_like(ids)
        with torch.no_grad():
            ours = model(ids, mask, types if config.type_vocab_size else None).logits  # (1, C)
            got = theirs(input_ids=ids, attention_mask=mask,
                         **({"token_type_ids": types} if token_types else {})).logits
        worst = max(worst, (got - ours).abs().max().item())
    if not worst <= TOLERANCE:
        raise ValueError(f"--hf: the {hf_xlm.ARCHITECTURE} export gives logits {worst:.2e} away from "
                         f"tformer's, expected <= {TOLERANCE:.0e}; nothing was written")
    return worst


def export_classifier(out: str | Path, model, tokenizer, labels: Sequence[str], card: Card,
                      pairs: bool = False) -> tuple[Path, float]:
    """Publish ``out`` as an XLMForSequenceClassification directory (classifier_files, with a
    model card), once transformers gives tformer's logits; returns (out, max abs diff)."""
    files = classifier_files(model, tokenizer, labels, pairs)
    diff = check_in_transformers(files, model, tokenizer, pairs)
    mean = model.config.pooling == "mean"
    pooled = "the mean of the real tokens" if mean else "the first token"
    usage = USAGE + (PAIR_USAGE if hf_xlm.carries_token_types(model.config, pairs) else "")
    what = (f"a transformers {hf_xlm.ARCHITECTURE} directory (BERT's encoder in XLM's names, {pooled} under "
            f"a linear head; checked in transformers: max abs diff {diff:.1e} on the logits)")
    readme = render(card, what, usage, library_name="transformers", pipeline_tag="text-classification")
    files["README.md"] = readme + (PADDING.format(diff=diff, token=NO_PADDING).encode() if mean else b"")
    return publish_export(out, files, "--hf"), diff
