"""`tformer mine MODEL_DIR --data pairs.jsonl --out mined.jsonl`: hard negatives for embedding
training, mined from an index of the positives with a model (the run being fine-tuned, or any
sentence-transformers / BERT-format directory); see tformer.embeddings.mining.

    tformer mine runs/emb --data pairs.jsonl --out mined.jsonl     # then
    tformer train --data mined.jsonl --from-pretrained runs/emb    # anchor, positive, negative
"""

from __future__ import annotations

import argparse
import os
import sys

from tformer.commands._inputs import check_options
from tformer.commands._pretrained import add_model_arguments, load_sentence_encoder, one_line_warnings

HELP = "mine hard negatives for embedding pairs from an index of their positives"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    from tformer.embeddings.ann import KINDS
    from tformer.embeddings.mining import Mining

    d = Mining()
    add_model_arguments(parser)
    parser.add_argument("--data", required=True, help="a JSONL file of {\"anchor\", \"positive\"} records")
    parser.add_argument("--out", required=True,
                        help="the JSONL file to write: one {\"anchor\", \"positive\", \"negative\"} record "
                             "per negative (a pair left without one is kept as it was)")
    parser.add_argument("--negatives", type=int, default=d.negatives,
                        help=f"negatives per pair ({d.negatives}; each is a record of its own, and records "
                             "of one pair in a batch are each other's in-batch negatives)")
    parser.add_argument("--range-min", type=int, default=d.range_min,
                        help=f"skip this many best-ranked candidates ({d.range_min})")
    parser.add_argument("--range-max", type=int, default=d.range_max,
                        help=f"consider the candidates ranked below this ({d.range_max})")
    parser.add_argument("--relative-margin", type=float, default=d.relative_margin,
                        help="skip a candidate scoring above positive x (1 - M): a likely false negative "
                             f"({d.relative_margin}; 0 keeps all below the positive)")
    parser.add_argument("--absolute-margin", type=float, default=None,
                        help="skip a candidate scoring above positive - M (off by default)")
    parser.add_argument("--sampling", choices=("top", "random"), default=d.sampling,
                        help="top: the best-ranked candidates (default); random: drawn among them (--seed)")
    parser.add_argument("--seed", type=int, default=d.seed, help=f"for --sampling random ({d.seed})")
    parser.add_argument("--index", default=None,
                        help="keep the positives' index in this directory (an index already there, built "
                             "by the same model over texts holding every positive, is searched as it is); "
                             "default: a temporary one")
    parser.add_argument("--ann", choices=KINDS, default="auto",
                        help="the positives' index: as `tformer index build --ann` (auto)")


def run(args: argparse.Namespace) -> int:
    from tformer.embeddings.mining import Mining, mine

    check_options(args)
    if int(os.environ.get("WORLD_SIZE", "1")) > 1:
        raise ValueError("torchrun: `tformer mine` runs as one process; build the positives' index with "
                         "`torchrun ... -m tformer index build`, then `tformer mine --index INDEX`")
    how = Mining(negatives=args.negatives, range_min=args.range_min, range_max=args.range_max,
                 absolute_margin=args.absolute_margin, relative_margin=args.relative_margin,
                 sampling=args.sampling, seed=args.seed)
    with one_line_warnings("mine"):
        st = load_sentence_encoder(args)
        summary = mine(st, args.model_dir, args.data, args.out, how, index=args.index, ann=args.ann,
                       batch_size=args.batch_size)
    means = (f"; mean score: positives {summary['mean_positive']}, negatives {summary['mean_negative']}"
             if "mean_positive" in summary else "")
    print(f"wrote {args.out}: {summary['records']:,} records from {summary['pairs']:,} pairs, "
          f"{summary['negatives']:,} negatives, {summary['without']:,} pairs without one{means}",
          file=sys.stderr)
    return 0
