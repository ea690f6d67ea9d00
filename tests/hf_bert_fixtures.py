"""Tiny random-weight BERT directories for the checkpoint tests (no download, no network).

``bert_dir()`` / ``st_dir()`` build once per test session (cached) and must not be
modified; a test that breaks a directory copies it first with ``copy_dir``.

The tiny model: a WordPiece vocabulary of 100 tokens, 2 layers, d 32, 4 heads, ff 64,
64 positions, 2 token types. Weights are drawn wider than BERT's 0.02 (std 0.2, random
LayerNorm affine) so attention maps are far from uniform and a wrong key shows.
The tokenizer.json carries hostile settings (truncation to 8, padding to 40) that
tformer must ignore.
"""

from __future__ import annotations

import atexit
import functools
import json
import shutil
import tempfile
from pathlib import Path

import torch

WORDS = (
    "the a an cat cats dog dogs sat sits on mat is was big small red blue green and or of to "
    "in it that for with as at by from this these those be are were has have had not no yes "
    "one two three four five six seven eight nine ten man woman child house car tree river "
    "sun moon star sky water fire earth wind city road book word day night time year good "
    "bad new old light dark fast slow run walk eat"
).split()
SPECIALS = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"]
SUFFIXES = ["##s", "##ed", "##ing", "##er", "##ly", "##est", "##y", "##en"]
VOCAB = SPECIALS + WORDS + SUFFIXES  # 100 tokens

MAX_POSITIONS = 64
ST_MAX_SEQ_LENGTH = 16  # sentence_bert_config.json; below the 64 positions on purpose

SENTENCES = [
    "the cat sat on the mat",
    "a dog",
    "the big red house is on the road by the river",
    "one two three",
    "stars in the night sky",  # '##s' pieces and an unknown-free sentence
]
PAIR_SENTENCES = [("the cat", "a dog sat"), ("one", "two three four")]


def _quiet_transformers() -> None:
    """No progress bars or "newly initialised weights" chatter in test output."""
    from transformers.utils import logging

    logging.set_verbosity_error()
    logging.disable_progress_bar()


def tiny_bert_config(**overrides):
    from transformers import BertConfig

    _quiet_transformers()

    kwargs = dict(
        vocab_size=len(VOCAB),
        hidden_size=32,
        num_hidden_layers=2,
        num_attention_heads=4,
        intermediate_size=64,
        max_position_embeddings=MAX_POSITIONS,
        type_vocab_size=2,
        hidden_act="gelu",
        initializer_range=0.2,
    )
    kwargs.update(overrides)
    return BertConfig(**kwargs)


def write_tokenizer(directory: Path) -> None:
    """vocab.txt, tokenizer_config.json and a tokenizer.json with hostile pad/trunc settings."""
    from tokenizers import BertWordPieceTokenizer

    directory.mkdir(parents=True, exist_ok=True)
    (directory / "vocab.txt").write_text("\n".join(VOCAB) + "\n")
    (directory / "tokenizer_config.json").write_text(json.dumps({"do_lower_case": True}))
    tok = BertWordPieceTokenizer(str(directory / "vocab.txt"), lowercase=True)
    tok.enable_truncation(max_length=8)  # must not win over the model's 64 positions
    tok.enable_padding(length=40, pad_id=0, pad_token="[PAD]")  # must not pad every batch to 40
    tok.save(str(directory / "tokenizer.json"))


def build_bert(arch: str = "BertModel", seed: int = 0, **overrides):
    """A random-weight transformers BERT (eval mode) with the tiny config."""
    from transformers import BertForMaskedLM, BertForSequenceClassification, BertModel

    torch.manual_seed(seed)
    cls = {"BertModel": BertModel, "BertForMaskedLM": BertForMaskedLM,
           "BertForSequenceClassification": BertForSequenceClassification}[arch]
    model = cls(tiny_bert_config(**overrides))
    with torch.no_grad():  # non-trivial LayerNorm affine parameters
        for name, p in model.named_parameters():
            if "LayerNorm.weight" in name:
                p.copy_(1.0 + 0.3 * torch.randn_like(p))
            elif "LayerNorm.bias" in name:
                p.copy_(0.1 * torch.randn_like(p))
    return model.eval()


def make_bert_dir(directory: Path, arch: str = "BertModel", seed: int = 0, **overrides) -> Path:
    """Save a random BERT with transformers' save_pretrained (safetensors) + tokenizer files."""
    model = build_bert(arch, seed, **overrides)
    model.save_pretrained(str(directory))
    write_tokenizer(directory)
    return directory


def make_st_dir(
    directory: Path,
    pooling: str = "mean",
    normalize: bool = True,
    max_seq_length: int = ST_MAX_SEQ_LENGTH,
    seed: int = 1,
) -> Path:
    """A sentence-transformers layout: the BERT at the root, 1_Pooling, 2_Normalize."""
    make_bert_dir(directory, seed=seed)
    modules = [
        {"idx": 0, "name": "0", "path": "", "type": "sentence_transformers.models.Transformer"},
        {"idx": 1, "name": "1", "path": "1_Pooling", "type": "sentence_transformers.models.Pooling"},
    ]
    if normalize:
        modules.append(
            {"idx": 2, "name": "2", "path": "2_Normalize", "type": "sentence_transformers.models.Normalize"}
        )
        (directory / "2_Normalize").mkdir(exist_ok=True)
    (directory / "modules.json").write_text(json.dumps(modules, indent=2))
    (directory / "sentence_bert_config.json").write_text(
        json.dumps({"max_seq_length": max_seq_length, "do_lower_case": False})
    )
    (directory / "1_Pooling").mkdir(exist_ok=True)
    (directory / "1_Pooling" / "config.json").write_text(
        json.dumps(
            {
                "word_embedding_dimension": 32,
                "pooling_mode_cls_token": pooling == "cls",
                "pooling_mode_mean_tokens": pooling == "mean",
                "pooling_mode_max_tokens": pooling == "max",
                "pooling_mode_mean_sqrt_len_tokens": False,
            }
        )
    )
    return directory


# Session-wide cached directories (read-only for tests) ----------------------------------
@functools.cache
def _root() -> Path:
    root = Path(tempfile.mkdtemp(prefix="tformer-bert-"))
    atexit.register(shutil.rmtree, root, ignore_errors=True)
    return root


@functools.cache
def bert_dir() -> Path:
    """BertModel (with pooler) + tokenizer.json + vocab.txt."""
    return make_bert_dir(_root() / "bert")


@functools.cache
def mlm_dir() -> Path:
    """BertForMaskedLM: "bert."-prefixed keys, a cls.* head, no pooler."""
    return make_bert_dir(_root() / "mlm", arch="BertForMaskedLM", seed=2)


@functools.cache
def st_dir(pooling: str = "mean", normalize: bool = True) -> Path:
    return make_st_dir(_root() / f"st-{pooling}-{int(normalize)}", pooling, normalize)


def copy_dir(src: Path, dst: Path) -> Path:
    shutil.copytree(src, dst)
    return dst


def load_hf(directory: Path, eager: bool = True):
    """transformers' BertModel from a directory, eval mode; eager attention to get weights."""
    from transformers import BertModel

    kwargs = {"attn_implementation": "eager"} if eager else {}
    return BertModel.from_pretrained(str(directory), **kwargs).eval()
