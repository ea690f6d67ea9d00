"""BERT's masked-LM head (transformers' BertForMaskedLM, ``cls.predictions.*``) <-> tformer's
MaskedLMHead (tformer.nn.heads): the key table, the config, and the head read from a model
directory.

    HEAD_ROWS                          (their key, our key) rows of the head
    head_from_hf(state, d, v, src)     their head tensors -> ours ("head.*"), checked
    head_to_hf(state)                  ours -> theirs, for an export
    read_head(md, embeddings)          the head of a BERT-format directory, or None without one
    config_to_hf(config)               BertForMaskedLM's config.json

The encoder's rows are tformer.formats.hf_bert's (under "bert."); this table adds the head's.
The decoder's weight is the word-embedding matrix itself (tied, as BERT's; transformers 5 saves
no copy of it, some older versions did): it is never loaded from here, and a saved copy must
equal the embeddings. The decoder's bias is ``cls.predictions.bias`` (``decoder.bias`` is the
same tensor in transformers; either name is read). Old TF-converted checkpoints name the
LayerNorm's parameters gamma/beta: read as weight/bias. Torch-free, like hf_bert.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

from tformer.config import TransformerConfig
from tformer.formats import hf_bert

PREFIX = "cls.predictions."
HEAD_ROWS: list[tuple[str, str]] = [
    ("cls.predictions.transform.dense.weight", "head.dense.weight"),  # (D, D)
    ("cls.predictions.transform.dense.bias", "head.dense.bias"),  # (D,)
    ("cls.predictions.transform.LayerNorm.weight", "head.norm.weight"),  # (D,)
    ("cls.predictions.transform.LayerNorm.bias", "head.norm.bias"),  # (D,)
    ("cls.predictions.bias", "head.bias"),  # (V,)
]
# Other names the same tensors have had: transformers' decoder.bias (tied to bias), TF's gamma/beta.
ALIASES = {"cls.predictions.decoder.bias": "cls.predictions.bias",
           "cls.predictions.transform.LayerNorm.gamma": "cls.predictions.transform.LayerNorm.weight",
           "cls.predictions.transform.LayerNorm.beta": "cls.predictions.transform.LayerNorm.bias"}
TIED = "cls.predictions.decoder.weight"  # the word embeddings (V, D), when saved at all
ARCHITECTURE = "BertForMaskedLM"


def head_shapes(d_model: int, vocab_size: int) -> dict[str, tuple[int, ...]]:
    """The shape of each head tensor of a BertForMaskedLM of this width and vocabulary, by their key."""
    shapes = dict.fromkeys((k for k, _ in HEAD_ROWS), (d_model,))
    shapes["cls.predictions.transform.dense.weight"] = (d_model, d_model)
    shapes["cls.predictions.bias"] = (vocab_size,)
    return shapes


def head_from_hf(state: Mapping[str, Any], d_model: int, vocab_size: int, source: str) -> dict[str, Any]:
    """The head's tensors of a BertForMaskedLM state dict (their keys; others are ignored) under
    tformer's keys (``head.*``); a head missing a tensor or of another shape is refused naming
    ``source`` and the tensor."""
    head = {ALIASES.get(k, k): v for k, v in state.items() if k.startswith(PREFIX) and k != TIED}
    for key, shape in head_shapes(d_model, vocab_size).items():
        if key not in head:
            raise ValueError(f"{source}: missing tensor {key!r} of the masked-LM head (it holds "
                             f"{', '.join(sorted(head)) or 'none'})")
        if tuple(head[key].shape) != shape:
            got = tuple(head[key].shape)
            raise ValueError(f"{source}: tensor {key!r}: expected shape {shape}, got {got}")
    return {ours: head[theirs] for theirs, ours in HEAD_ROWS}


def head_to_hf(state: Mapping[str, Any]) -> dict[str, Any]:
    """tformer's head tensors (``head.*``, as MaskedLM's state dict has them) under their keys."""
    return {theirs: state[ours] for theirs, ours in HEAD_ROWS}


def read_head(md, embeddings: Any, framework: str = "pt") -> dict[str, Any] | None:
    """The masked-LM head of the BERT-format directory ``md`` (a tformer.formats.model_dir.ModelDir)
    under tformer's keys, read from its safetensors files alone (the head's tensors only), or
    None when it holds no head (a BertModel, a sentence-transformers folder: BERT's own
    initialisation then starts one). ``embeddings``: the loaded word embeddings (V, D), which a
    saved decoder weight must equal (tformer ties them, as BERT does)."""
    from safetensors import safe_open

    if not md.is_bert or md.is_xlm:
        return None
    files = [p for p in hf_bert.weight_files(md.model_dir) if p.suffix == ".safetensors"]
    found: dict[str, Any] = {}
    for path in files:
        with safe_open(str(path), framework=framework) as f:
            found.update({k: f.get_tensor(k) for k in f.keys() if k.startswith(PREFIX)})
    if not found:
        return None
    source = str(files[0] if len(files) == 1 else Path(md.model_dir) / hf_bert.WEIGHTS_INDEX_FILE)
    tied = found.get(TIED)
    if tied is not None and (tuple(tied.shape) != tuple(embeddings.shape) or bool((tied != embeddings).any())
                             ):
        raise ValueError(f"{source}: {TIED!r} differs from the word embeddings; expected a decoder tied "
                         "to them, as BERT's is (tformer's masked-LM head is tied)")
    vocab_size, d_model = (int(n) for n in embeddings.shape)
    return head_from_hf(found, d_model, vocab_size, source)


def has_head(md) -> bool:
    """Whether a BERT-format directory's safetensors files hold a masked-LM head (read from their
    headers: no tensor is loaded)."""
    from safetensors import safe_open

    if not md.is_bert or md.is_xlm:
        return False
    for path in hf_bert.weight_files(md.model_dir):
        if path.suffix == ".safetensors":
            with safe_open(str(path), framework="numpy") as f:
                if any(k.startswith(PREFIX) for k in f.keys()):
                    return True
    return False


def config_to_hf(config: TransformerConfig) -> dict[str, Any]:
    """BertForMaskedLM's config.json for a MaskedLM's config (hf_bert.NotBert where BERT cannot
    express it): a BERT encoder without a pooler, its decoder tied to the word embeddings."""
    out = hf_bert.config_to_hf(config.replace(pooler=False))
    out.update({"architectures": [ARCHITECTURE], "tie_word_embeddings": True})
    return out
