"""Real text and random-weight BERT directories for the peer workloads; nothing is downloaded.

The sentences are the docstrings of Python's own standard library (present wherever Python is),
cut into texts of varied, realistic lengths; the WordPiece vocabulary is trained on the same text
with `tokenizers`. The model weights are random (HF's initialiser): speed does not depend on them,
and every contender reads the same ones.
"""

from __future__ import annotations

import json
import math
import random
import re
import shutil
import sysconfig
from pathlib import Path

from tokenizers import BertWordPieceTokenizer

VOCAB_SIZE = 30522  # BERT's, and all-MiniLM-L6-v2's
SPECIALS = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"]
# (layers, d_model, heads, d_ff): all-MiniLM-L6-v2's shape, BERT-base, and the --quick stand-in.
SHAPES = {"minilm": (6, 384, 12, 1536), "base": (12, 768, 12, 3072), "tiny": (2, 32, 4, 64)}


def paragraphs(limit_words: int = 200_000) -> list[str]:
    """Prose paragraphs from the stdlib's docstrings (top-level modules, sorted: deterministic for
    one Python version); doctest examples and code-like lines are left out."""
    stdlib = Path(sysconfig.get_paths()["stdlib"])
    out, words = [], 0
    for path in sorted(stdlib.glob("*.py")):
        try:
            source = path.read_text(encoding="utf-8")
        except (OSError, UnicodeDecodeError):
            continue
        for doc in re.findall(r'"""(.*?)"""', source, re.S):
            for para in re.split(r"\n\s*\n", doc):
                lines = [ln.strip() for ln in para.splitlines()]
                if not lines or any(ln.startswith((">>>", "...", "$", "#")) for ln in lines):
                    continue
                text = " ".join(" ".join(lines).split())
                n = len(text.split())
                if n >= 3 and sum(c.isalpha() for c in text) > 0.6 * len(text):
                    out.append(text)
                    words += n
        if words >= limit_words:
            break
    return out


def sentences(count: int, min_tokens: int, max_tokens: int, count_tokens, seed: int = 0) -> list[str]:
    """`count` texts whose token counts (``count_tokens(text)``, special tokens included) are drawn
    log-uniformly from [min_tokens, max_tokens]: many short texts, a tail of long ones, as real
    sentence-embedding inputs are. Each text is consecutive prose from a random paragraph's start."""
    paras = paragraphs()
    stream = " ".join(paras).split()  # words, in order
    starts = [0]  # where each paragraph begins in the stream
    for para in paras[:-1]:
        starts.append(starts[-1] + len(para.split()))
    starts = [i for i in starts if i < len(stream) - 2 * max_tokens]
    rng = random.Random(seed)
    texts = []
    for _ in range(count):
        target = round(math.exp(rng.uniform(math.log(min_tokens), math.log(max_tokens))))
        start = rng.choice(starts)
        n = max(1, target)  # words; a word is >= 1 token, so start at the target and shrink
        while n > 1 and count_tokens(" ".join(stream[start : start + n])) > target:
            n = max(1, int(n * 0.9) if n > 10 else n - 1)
        texts.append(" ".join(stream[start : start + n]))
    return texts


def write_vocab(directory: Path, texts: list[str], size: int = VOCAB_SIZE) -> None:
    """A lowercase WordPiece vocabulary trained on `texts`, padded with [unused] tokens to `size`
    (as BERT's own vocabulary is), plus tokenizer.json and tokenizer_config.json."""
    trainer = BertWordPieceTokenizer(lowercase=True)
    trainer.train_from_iterator(texts, vocab_size=size, special_tokens=SPECIALS, show_progress=False)
    vocab = sorted(trainer.get_vocab().items(), key=lambda kv: kv[1])
    tokens = [t for t, _ in vocab][:size]
    tokens += [f"[unused{i}]" for i in range(size - len(tokens))]
    directory.mkdir(parents=True, exist_ok=True)
    (directory / "vocab.txt").write_text("\n".join(tokens) + "\n")
    (directory / "tokenizer_config.json").write_text(json.dumps(
        {"do_lower_case": True, "tokenizer_class": "BertTokenizer", "model_max_length": 512}))
    BertWordPieceTokenizer(str(directory / "vocab.txt"), lowercase=True).save(
        str(directory / "tokenizer.json"))


def write_bert(directory: Path, shape: str, vocab_dir: Path | None = None, seed: int = 0) -> Path:
    """A random-weight BertModel (with pooler) saved by transformers, and a tokenizer.

    config.json also says ``position_embedding_type: absolute``: CTranslate2's converter asserts it
    and transformers 5 no longer writes it."""
    # transformers is optional (tformer[bench]); a peer process imports torch only when it uses it
    import torch
    from transformers import BertConfig, BertModel

    quiet_transformers()
    layers, d, heads, ff = SHAPES[shape]
    config = BertConfig(vocab_size=VOCAB_SIZE, hidden_size=d, num_hidden_layers=layers,
                        num_attention_heads=heads, intermediate_size=ff, max_position_embeddings=512,
                        type_vocab_size=2, hidden_act="gelu", layer_norm_eps=1e-12)
    torch.manual_seed(seed)
    BertModel(config).eval().save_pretrained(str(directory))
    raw = json.loads((directory / "config.json").read_text())
    raw["position_embedding_type"] = "absolute"
    (directory / "config.json").write_text(json.dumps(raw, indent=2))
    if vocab_dir is not None:
        for name in ("vocab.txt", "tokenizer.json", "tokenizer_config.json"):
            shutil.copy(vocab_dir / name, directory / name)
    return directory


def quiet_transformers() -> None:
    """No progress bars or load reports from transformers in the benchmark's output."""
    from transformers.utils import logging  # optional (tformer[bench])

    logging.set_verbosity_error()
    logging.disable_progress_bar()


def write_sentence_layout(directory: Path, max_seq_length: int = 256) -> Path:
    """Turn a BERT directory into a sentence-transformers one: mean pooling, then Normalize
    (all-MiniLM-L6-v2's modules; its max_seq_length is 256)."""
    d = json.loads((directory / "config.json").read_text())["hidden_size"]
    modules = [
        {"idx": 0, "name": "0", "path": "", "type": "sentence_transformers.models.Transformer"},
        {"idx": 1, "name": "1", "path": "1_Pooling", "type": "sentence_transformers.models.Pooling"},
        {"idx": 2, "name": "2", "path": "2_Normalize", "type": "sentence_transformers.models.Normalize"},
    ]
    (directory / "modules.json").write_text(json.dumps(modules, indent=2))
    (directory / "sentence_bert_config.json").write_text(
        json.dumps({"max_seq_length": max_seq_length, "do_lower_case": False}))
    (directory / "1_Pooling").mkdir(exist_ok=True)
    (directory / "1_Pooling" / "config.json").write_text(json.dumps({
        "word_embedding_dimension": d, "pooling_mode_cls_token": False,
        "pooling_mode_mean_tokens": True, "pooling_mode_max_tokens": False,
        "pooling_mode_mean_sqrt_len_tokens": False}))
    (directory / "2_Normalize").mkdir(exist_ok=True)
    return directory
