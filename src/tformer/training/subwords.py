"""The tokenizer of a data run: trained on your data, or a pretrained model's.

bpe (the default, for every objective): byte-level BPE as in GPT-2 / RoBERTa. Every string
is some sequence of bytes, so there is no unknown token and decoding gives back the exact
text (spaces, case, accents, punctuation, `%s` placeholders, any script); BLEU and chrF are
then computed on the true output text, and a classifier or embedding model never sees an
[UNK] for a word or script missing from training.
wordpiece / unigram: BERT's and SentencePiece's schemes, with a Metaspace pre-tokenizer so
that they round-trip spaces too (characters never seen in training become <unk>).
Encoder inputs are wrapped as "<s> text </s>" (pairs: "<s> a </s> b </s>") by the saved
post-processor, so the file alone tokenizes like training did.
"""

from __future__ import annotations

from collections.abc import Iterable
from pathlib import Path

from tokenizers import AddedToken, decoders, models, normalizers, pre_tokenizers, processors, trainers
from tokenizers import Tokenizer as Backend

from tformer.errors import FieldError
from tformer.formats.model_dir import ModelDir
from tformer.text.specials import BOS, EOS
from tformer.text.tokenizer import Tokenizer, load_tokenizer, pad_id_of
from tformer.training.config import BPE_MIN_VOCAB, MAX_VOCAB

SPECIALS = ("<pad>", "<s>", "</s>", "<unk>")  # ids 0-3: tformer.text.specials' PAD, BOS, EOS, UNK


def train_tokenizer(texts: Iterable[str], scheme: str, vocab_size: int, lowercase: bool = False,
                    extra_specials: tuple[str, ...] = ()) -> Backend:
    """A subword tokenizer (HF `tokenizers`) trained on `texts`; `lowercase`: its normalizer
    lowercases every text first (in training and in every later use of the saved file).
    `extra_specials`: special tokens after tformer's four (ids 4, 5...), such as masked-LM's
    <mask>, which takes the space before it as RoBERTa's does ("a <mask> b": "a", "<mask>", "Ġb"),
    so that a masked word reads as it was trained."""
    specials = [*SPECIALS, *extra_specials]
    if not len(specials) < vocab_size <= MAX_VOCAB:
        raise FieldError("vocab_size", f"expected {len(specials) + 1}..{MAX_VOCAB}, got {vocab_size}")
    least = BPE_MIN_VOCAB + len(extra_specials)
    if scheme == "bpe" and vocab_size < least:  # (the trainer would make it that size, silently)
        raise FieldError("vocab_size", f"expected at least {least} for the bpe tokenizer (its 256-byte "
                         f"alphabet and {len(specials)} special tokens), got {vocab_size}")
    if scheme == "bpe":
        tok = Backend(models.BPE())
        tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
        tok.decoder = decoders.ByteLevel()
        trainer = trainers.BpeTrainer(vocab_size=vocab_size, special_tokens=specials,
                                      initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
                                      show_progress=False)
    elif scheme == "wordpiece":
        tok = Backend(models.WordPiece(unk_token="<unk>"))
        tok.pre_tokenizer = pre_tokenizers.Metaspace()
        tok.decoder = decoders.Metaspace()
        trainer = trainers.WordPieceTrainer(vocab_size=vocab_size, special_tokens=specials,
                                            continuing_subword_prefix="", show_progress=False)
        tok.model = models.WordPiece(unk_token="<unk>", continuing_subword_prefix="")
    else:
        tok = Backend(models.Unigram())
        tok.pre_tokenizer = pre_tokenizers.Metaspace()
        tok.decoder = decoders.Metaspace()
        trainer = trainers.UnigramTrainer(vocab_size=vocab_size, special_tokens=specials,
                                          unk_token="<unk>", show_progress=False)
    if lowercase:
        tok.normalizer = normalizers.Lowercase()
    try:
        tok.train_from_iterator(texts, trainer=trainer)
    except Exception as e:  # tokenizers' own error type; unigram: "... not large enough to contain all chars"
        if "not large enough" not in str(e):
            raise
        raise FieldError("vocab_size", f"expected room for every character of the data and {len(SPECIALS)} "
                         f"special tokens in the {scheme} tokenizer, got {vocab_size}") from None
    if tok.get_vocab_size() > vocab_size:  # wordpiece keeps every character it saw, whatever the size
        raise FieldError("vocab_size", f"expected at least {tok.get_vocab_size()} for the {scheme} tokenizer "
                         f"on this data (every character it holds and {len(SPECIALS)} special tokens), "
                         f"got {vocab_size}")
    for i, s in enumerate(specials):
        assert tok.token_to_id(s) == i, (s, tok.token_to_id(s))
    if extra_specials:  # (the same ids: only how the tokens match changes)
        tok.add_special_tokens([AddedToken(s, lstrip=True, special=True, normalized=False)
                                for s in extra_specials])
    tok.post_processor = processors.TemplateProcessing(
        single="<s> $A </s>", pair="<s> $A </s> $B:1 </s>:1",
        special_tokens=[("<s>", BOS), ("</s>", EOS)])
    return tok


def load_backend(path: Path) -> Backend:
    try:
        return Backend.from_file(str(path))
    except Exception as e:  # the tokenizers library's own error type
        raise ValueError(f"{path}: not a tokenizers file ({e})") from None


def pretrained_backend(model_dir: Path | ModelDir) -> tuple[Backend, int | None]:
    """A pretrained directory's tokenizer backend (lowercasing baked into its normaliser, so
    the run's tokenizer.json alone tokenizes the same) and its maximum length."""
    tok = load_tokenizer(model_dir)
    backend = tok.backend
    if tok.lowercase:  # sentence-transformers' do_lower_case
        steps = [backend.normalizer] if backend.normalizer is not None else []
        backend.normalizer = normalizers.Sequence([*steps, normalizers.Lowercase()])
    return backend, tok.max_length


def run_tokenizer(backend: Backend, max_length: int) -> Tokenizer:
    """The run's tokenizer: its backend, truncating to the run's max_length."""
    return Tokenizer(backend, max_length, pad_id=pad_id_of(backend))
