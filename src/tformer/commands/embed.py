"""`tformer embed MODEL_DIR "text" ...`: sentence embeddings, pooled as the directory says.

Texts come from the arguments and/or ``--file`` (one per line). Without ``--out`` each
embedding is printed as a JSON line; ``--out x.npy`` writes an (N, D) float32 array,
``--out x.jsonl`` one {"text", "embedding"} object per line. Texts are read, embedded and
written a chunk at a time (memory does not grow with the number of lines); the file appears
whole at the end (atomically), and an interrupted run resumes where it stopped
(see tformer.embed_output).
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


def numbered_inputs(args: argparse.Namespace):
    """(index, text) for the arguments then the --file lines, read lazily."""
    from tformer.index import iter_lines

    yield from enumerate(args.texts)
    if args.file is not None:
        offset = len(args.texts)
        for i, (_, text) in enumerate(iter_lines(args.file, "--file")):
            yield offset + i, text


def count_inputs(args: argparse.Namespace) -> int:
    from tformer.index import count_lines

    return len(args.texts) + (count_lines(args.file, "--file") if args.file is not None else 0)


def run(args: argparse.Namespace) -> int:
    from tformer.embed_output import open_output

    out = Path(args.out) if args.out else None
    if out is not None and out.suffix not in (".npy", ".jsonl"):
        raise ValueError(f"--out: expected a .npy or .jsonl file name, got {str(out)!r}")
    if out is not None and out.is_dir():
        raise ValueError(f"--out {out}: is a directory; expected a .npy or .jsonl file name")
    n = count_inputs(args)
    if n < 1:
        raise ValueError(f"TEXT: expected at least 1 text(s) as arguments or in --file, got {n}")
    from tformer.index import embed_chunks, model_identity, progress_bar

    with one_line_warnings("embed"):
        st = load_sentence_encoder(args)
        normalize = st.normalize if args.normalize is None else args.normalize
        if out is None:
            for _, texts, emb in embed_chunks(st, numbered_inputs(args), batch_size=args.batch_size,
                                              normalize=normalize, show_progress=False,
                                              truncation=not args.no_truncate):
                for text, vec in zip(texts, emb.tolist(), strict=True):
                    print(json.dumps({"text": text, "embedding": vec}))
            return 0
        # The identity of what is written: an interrupted file resumes only for the same.
        identity = {"model": model_identity(args.model_dir), "texts": _inputs_hash(args),
                    "n": n, "dim": st.dim, "normalize": normalize,
                    "max_length": args.max_length, "truncate": not args.no_truncate}
        with open_output(out, identity) as writer:
            if writer.done:
                print(f"tformer embed: resuming {out} after {writer.done} of {n} texts",
                      file=sys.stderr)
            inputs = (item for item in numbered_inputs(args) if item[0] >= writer.done)
            bar = progress_bar(n, args.progress)
            bar.update(writer.done)
            for _, texts, emb in embed_chunks(st, inputs, batch_size=args.batch_size,
                                              normalize=normalize, show_progress=False,
                                              truncation=not args.no_truncate):
                writer.write(texts, emb)
                bar.update(len(texts))
            bar.close()
    print(f"wrote {n} embeddings of dimension {st.dim} to {out}", file=sys.stderr)
    return 0


def _inputs_hash(args: argparse.Namespace) -> str:
    import hashlib

    digest = hashlib.sha256(json.dumps(list(args.texts)).encode())
    if args.file is not None:
        with open(args.file, "rb") as f:
            while block := f.read(1 << 20):
                digest.update(block)
    return digest.hexdigest()[:16]
