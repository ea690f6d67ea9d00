"""`tformer embed MODEL_DIR "text" ...`: sentence embeddings, pooled as the directory says.

Texts come from the arguments and/or ``--file`` (one per line). Without ``--out`` each
embedding is printed as a JSON line; ``--out x.npy`` writes an (N, D) float32 array,
``--out x.jsonl`` one {"text", "embedding"} object per line.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from tformer.commands._pretrained import (
    add_model_arguments,
    load_sentence_encoder,
    one_line_warnings,
    read_lines,
)

HELP = "sentence embeddings from a BERT-format / sentence-transformers directory"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    add_model_arguments(parser)
    parser.add_argument("texts", nargs="*", metavar="TEXT", help="texts to embed")
    parser.add_argument("--file", default=None, help="a text file, one text per line")
    parser.add_argument(
        "--out",
        default=None,
        help="write to a .npy (N, D) array or a .jsonl file (default: print JSON lines)",
    )
    norm = parser.add_mutually_exclusive_group()
    norm.add_argument(
        "--normalize",
        dest="normalize",
        action="store_true",
        default=None,
        help="L2-normalise (default: as the directory says)",
    )
    norm.add_argument("--no-normalize", dest="normalize", action="store_false")
    parser.add_argument(
        "--progress",
        action=argparse.BooleanOptionalAction,
        default=None,
        help="progress bar (default: for large inputs)",
    )


def gather_texts(args: argparse.Namespace, minimum: int = 1) -> list[str]:
    texts = list(args.texts)
    if args.file is not None:
        texts += read_lines(args.file, "--file")
    if len(texts) < minimum:
        raise ValueError(
            f"TEXT: expected at least {minimum} text(s) as arguments or in --file, got {len(texts)}"
        )
    return texts


def run(args: argparse.Namespace) -> int:
    out = Path(args.out) if args.out else None
    if out is not None and out.suffix not in (".npy", ".jsonl"):
        raise ValueError(f"--out: expected a .npy or .jsonl file name, got {str(out)!r}")
    texts = gather_texts(args)
    with one_line_warnings("embed"):
        st = load_sentence_encoder(args)
        emb = st.encode(
            texts,
            batch_size=args.batch_size,
            normalize=args.normalize,
            show_progress=args.progress,
            truncation=not args.no_truncate,
        )
    if out is None:
        for text, vec in zip(texts, emb.tolist(), strict=True):
            print(json.dumps({"text": text, "embedding": vec}))
        return 0
    out.parent.mkdir(parents=True, exist_ok=True)
    if out.suffix == ".npy":
        import numpy as np

        np.save(out, emb)
    else:
        with out.open("w", encoding="utf-8") as f:
            for text, vec in zip(texts, emb.tolist(), strict=True):
                f.write(json.dumps({"text": text, "embedding": vec}) + "\n")
    print(f"wrote {len(texts)} embeddings of dimension {emb.shape[1]} to {out}", file=sys.stderr)
    return 0
