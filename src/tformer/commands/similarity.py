"""`tformer similarity MODEL_DIR "a" "b" ...`: the cosine-similarity matrix of the texts."""

from __future__ import annotations

import argparse
import sys

from tformer.commands._inputs import check_options, input_texts, located
from tformer.commands._pretrained import (
    add_model_arguments,
    load_sentence_encoder,
    one_line_warnings,
    short,
)

HELP = "cosine similarity between texts, with a BERT-format / sentence-transformers model"
# A printed N x N matrix is read by a person: past this it is megabytes no one reads
# (5,000 texts made 200 MB). Larger inputs belong to `search` or `embed`.
MAX_TEXTS = 100


def add_arguments(parser: argparse.ArgumentParser) -> None:
    add_model_arguments(parser)
    parser.add_argument("texts", nargs="*", metavar="TEXT", help="two or more texts")
    parser.add_argument("--file", default=None,
                        help="a text file, one text per line ('-': standard input)")


def cosine_matrix(emb):
    """(N, D) embeddings -> (N, N) cosine similarities."""
    import numpy as np

    norms = np.linalg.norm(emb, axis=1, keepdims=True)  # (N, 1)
    unit = emb / np.maximum(norms, 1e-12)
    return unit @ unit.T  # (N, N)


def run(args: argparse.Namespace) -> int:
    check_options(args)
    texts = input_texts(args, "texts", "TEXT", minimum=2, maximum=MAX_TEXTS,
                        why=" (the matrix is printed; for more, use `tformer search` or "
                            "`tformer embed --out`)")
    from tformer.text.prefix import LongTexts
    from tformer.text.tokenizer import TextTooLong

    def noted(indices: list[int], counts: list[int]) -> None:
        for i, n in zip(indices, counts, strict=True):
            long.note(i, n)

    with one_line_warnings("similarity"):
        st = load_sentence_encoder(args)
        long = LongTexts(st.tokenizer.max_length or 0)  # of the texts' indices
        try:
            emb = st.encode(texts, batch_size=args.batch_size, truncation=not args.no_truncate, on_long=noted)
        except TextTooLong as e:
            raise ValueError(located(args, "texts", "TEXT", e.index, e.expected())) from None
    if long.count:  # named as the matrix names them, and where each came from
        named = long.places(lambda i: f"[{i}] ({located(args, 'texts', 'TEXT', i)})")
        print(f"tformer similarity: warning: {long.count} of {len(texts)} texts {long.reason()}: {named} "
              "(--no-truncate refuses instead)", file=sys.stderr)
    sims = cosine_matrix(emb)
    for i, text in enumerate(texts):
        print(f"[{i}] {short(text)}")
    labels = [f"[{i}]" for i in range(len(texts))]
    width = max(6, max(len(label) for label in labels))
    print(" " * width + "".join(f"{label:>{width + 2}}" for label in labels))
    for label, row in zip(labels, sims, strict=True):
        print(f"{label:<{width}}" + "".join(f"{v:>{width + 2}.3f}" for v in row))
    return 0
