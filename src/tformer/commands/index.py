"""`tformer index build MODEL_DIR --corpus lines.txt --out INDEX`: embed a corpus once.
`tformer index build --vectors V.npy [--texts lines.txt] --out INDEX`: index vectors you have.

`tformer search INDEX "query"` (or `--query-vectors Q.npy`) then embeds only the queries. The
index directory holds the vectors, the texts and the model's identity (a hash of its files), and
past AUTO_MIN_ROWS vectors an approximate index (--ann; tformer.embeddings.ann); it is written as
one unit by one process at a time, and a search with another model is refused (see
tformer.embeddings.index). Under torchrun the corpus is shared out among the processes (one per
GPU, on one machine or many) and rank 0 writes the index (tformer.embeddings.shards).
"""

from __future__ import annotations

import argparse
import sys

from tformer.commands._inputs import check_options, device_of
from tformer.commands._pretrained import add_model_arguments, load_sentence_encoder, one_line_warnings

INTERMIXED = False  # it has a sub-action
HELP = "build a search index: embed a corpus once, or index vectors (then `tformer search INDEX`)"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    from tformer.embeddings.ann import AUTO_MIN_ROWS, KINDS, TARGET_RECALL

    sub = parser.add_subparsers(dest="action", metavar="ACTION", required=True)
    build = sub.add_parser("build", help="embed a corpus file (or take vectors) into a new index directory")
    add_model_arguments(build)
    for action in build._actions:  # MODEL_DIR: not with --vectors
        if action.dest == "model_dir":
            action.nargs, action.required, action.default = "?", False, None
            action.help += " (not with --vectors)"
    build.add_argument("--corpus", default=None,
                       help="a text file, one document per line ('-': standard input)")
    build.add_argument("--vectors", default=None,
                       help="instead of MODEL_DIR and --corpus: a .npy file of float vectors (N, D), "
                            "indexed as they are (searched by cosine)")
    build.add_argument("--texts", default=None,
                       help="with --vectors: a text file with one line per row, shown with the results")
    build.add_argument("--out", required=True, help="the index directory to write")
    build.add_argument("--ann", choices=KINDS, default="auto",
                       help=f"auto (default): exact below {AUTO_MIN_ROWS:,} vectors, else an approximate "
                            f"IVF-PQ index (FAISS: pip install 'tformer[ann]') whose parameters are "
                            f"measured at build time for recall@10 >= {TARGET_RECALL} on a held-out "
                            "sample; exact: every vector scanned by every search; ivfpq: approximate")
    build.add_argument("--progress", action=argparse.BooleanOptionalAction, default=None,
                       help="progress bar (default: when large)")


def run(args: argparse.Namespace) -> int:
    from tformer.training.distributed import process_group

    check_options(args)
    if args.vectors is not None:
        return _from_vectors(args)
    if args.texts is not None:
        raise ValueError("--texts: only with --vectors (a --corpus is its own texts)")
    if args.model_dir is None or args.corpus is None:
        missing = "MODEL_DIR" if args.model_dir is None else "--corpus"
        raise ValueError(f"{missing}: expected MODEL_DIR and --corpus (or --vectors V.npy), got no {missing}")
    from tformer.embeddings.ann import faiss_module
    from tformer.embeddings.index_build import build_index
    from tformer.text.lines import TextLines

    if args.ann == "ivfpq":
        faiss_module()  # missing: refused before the model loads
    corpus = TextLines(args.corpus, "--corpus")
    with process_group(device_of(args)) as (rank, world), one_line_warnings("index"):
        # torchrun: each process embeds its share of the corpus
        st = load_sentence_encoder(args)
        meta = build_index(st, args.model_dir, corpus, args.out, batch_size=args.batch_size,
                           truncation=not args.no_truncate, max_length=args.max_length,
                           show_progress=args.progress, rank=rank, world=world, dtype=args.dtype,
                           ann=args.ann, threads=_threads(args))
    if meta is None:  # not rank 0: it wrote the index
        return 0
    _wrote(args.out, meta, f"model {meta['model_id']}")
    return 0


def _from_vectors(args: argparse.Namespace) -> int:
    from tformer.embeddings.index_build import build_index_from_vectors

    for given, option in ((args.model_dir, "MODEL_DIR"), (args.corpus, "--corpus")):
        if given is not None:
            raise ValueError(f"{option}: not with --vectors (the vectors are the index's), got {given}")
    meta = build_index_from_vectors(args.vectors, args.out, texts=args.texts, ann=args.ann,
                                    threads=_threads(args))
    texts = f" with the texts of {args.texts}" if args.texts else ""
    _wrote(args.out, meta, f"from {args.vectors}{texts}")
    return 0


def _threads(args: argparse.Namespace) -> int:
    """FAISS's threads: --threads, else torch's (check_options: the cores other processes leave
    free; OpenMP threads that outnumber the free cores spin and wait for each other)."""
    import torch

    return args.threads or torch.get_num_threads()


def _wrote(out: str, meta: dict, source: str) -> None:
    ann = meta.get("ann")
    if ann:
        how = (f"approximate (IVF-PQ, {ann['nlist']} lists, nprobe {ann['nprobe']}, {ann['m']} x "
               f"{ann['nbits']}-bit codes, rerank {ann['rerank']} x k: recall@10 {ann['recall_at_10']:.3f} "
               f"on {ann['sample']:,} held-out vectors)")
    else:
        how = f"exact ({meta['why']})"
    print(f"wrote {out}: {meta['n']} vectors of dimension {meta['dim']} ({source}); search: {how}",
          file=sys.stderr)
    if ann and ann.get("note"):
        print(f"tformer index: warning: {ann['note']}; `tformer search --exact` scans every vector",
              file=sys.stderr)
