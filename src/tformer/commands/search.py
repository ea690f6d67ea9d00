"""`tformer search MODEL_DIR --corpus lines.txt "query" ...`: the corpus lines closest to a query.

Ranks the corpus's non-empty lines by cosine similarity to each query's embedding and
prints the top ``-k`` with their score and line number.
"""

from __future__ import annotations

import argparse

from tformer.commands._pretrained import (
    add_model_arguments,
    load_sentence_encoder,
    one_line_warnings,
    read_numbered_lines,
    short,
)
from tformer.commands.similarity import cosine_matrix

HELP = "semantic search: the lines of a corpus file closest to a query"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    add_model_arguments(parser)
    parser.add_argument("queries", nargs="+", metavar="QUERY", help="one or more queries")
    parser.add_argument("--corpus", required=True, help="a text file, one document per line")
    parser.add_argument("-k", "--top-k", type=int, default=5, help="results per query (5)")
    parser.add_argument(
        "--progress",
        action=argparse.BooleanOptionalAction,
        default=None,
        help="progress bar while embedding the corpus (default: when large)",
    )


def run(args: argparse.Namespace) -> int:
    import numpy as np

    if args.top_k < 1:
        raise ValueError(f"--top-k: expected a positive int, got {args.top_k}")
    numbered = read_numbered_lines(args.corpus, "--corpus")
    if not numbered:
        raise ValueError(f"--corpus {args.corpus}: expected at least one non-empty line, got none")
    numbers, corpus = [n for n, _ in numbered], [text for _, text in numbered]
    with one_line_warnings("search"):
        st = load_sentence_encoder(args)
        truncation = not args.no_truncate
        docs = st.encode(
            corpus, batch_size=args.batch_size, show_progress=args.progress, truncation=truncation
        )
        queries = st.encode(args.queries, batch_size=args.batch_size, truncation=truncation)
    sims = cosine_matrix(np.concatenate([queries, docs]))[: len(queries), len(queries) :]  # (Q, N)
    k = min(args.top_k, len(corpus))
    for q, query in enumerate(args.queries):
        if q:
            print()
        print(f"query: {short(query)}")
        for rank, j in enumerate(np.argsort(-sims[q], kind="stable")[:k], start=1):
            print(f"{rank:>3}. {sims[q, j]:.4f}  line {numbers[j]}: {short(corpus[j], 80)}")
    return 0
