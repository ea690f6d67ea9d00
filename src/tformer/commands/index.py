"""`tformer index build MODEL_DIR --corpus lines.txt --out INDEX`: embed a corpus once.

`tformer search INDEX "query"` then embeds only the queries. The index directory holds the
vectors, the texts and the model's identity (a hash of its files); it is written as one
unit by one process at a time, and a search with another model is refused (see tformer.embeddings.index).
Under torchrun the corpus is shared out among the processes (one per GPU, on one machine or many)
and rank 0 writes the index (tformer.embeddings.shards).
"""

from __future__ import annotations

import argparse
import sys

from tformer.commands._inputs import check_options, device_of
from tformer.commands._pretrained import add_model_arguments, load_sentence_encoder, one_line_warnings

INTERMIXED = False  # it has a sub-action
HELP = "build a search index: embed a corpus once (then `tformer search INDEX QUERY`)"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    sub = parser.add_subparsers(dest="action", metavar="ACTION", required=True)
    build = sub.add_parser("build", help="embed a corpus file into a new index directory")
    add_model_arguments(build)
    build.add_argument("--corpus", required=True,
                       help="a text file, one document per line ('-': standard input)")
    build.add_argument("--out", required=True, help="the index directory to write")
    build.add_argument("--progress", action=argparse.BooleanOptionalAction, default=None,
                       help="progress bar (default: when large)")


def run(args: argparse.Namespace) -> int:
    from tformer.embeddings.index import build_index
    from tformer.text.lines import TextLines
    from tformer.training.distributed import process_group

    check_options(args)
    corpus = TextLines(args.corpus, "--corpus")
    with process_group(device_of(args)) as (rank, world), one_line_warnings("index"):
        # torchrun: each process embeds its share of the corpus
        st = load_sentence_encoder(args)
        meta = build_index(st, args.model_dir, corpus, args.out, batch_size=args.batch_size,
                           truncation=not args.no_truncate, max_length=args.max_length,
                           show_progress=args.progress, rank=rank, world=world, dtype=args.dtype)
    if meta is None:  # not rank 0: it wrote the index
        return 0
    print(f"wrote {args.out}: {meta['n']} vectors of dimension {meta['dim']} "
          f"(model {meta['model_id']})", file=sys.stderr)
    return 0
