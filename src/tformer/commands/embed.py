"""`tformer embed MODEL_DIR "text" ...`: sentence embeddings, pooled as the directory says.

Texts come from the arguments and/or ``--file`` (one per line, read as tformer.text.lines says:
one row per line, always). Without ``--out`` each
embedding is printed as a JSON line; ``--out x.npy`` writes an (N, D) float32 array,
``--out x.jsonl`` one {"text", "embedding"} object per line. Texts are read, embedded and
written a chunk at a time (memory does not grow with the number of lines); the file appears
whole at the end (atomically), one process writes it at a time, and an interrupted run
resumes where it stopped if its inputs, model and options are the same (see
tformer.embeddings.output). Under torchrun the texts are shared out among the processes (one per
GPU, on one machine or many) and rank 0 writes them (tformer.embeddings.shards).
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Iterator
from pathlib import Path

from tformer.commands._inputs import (
    add_long,
    check_count,
    check_options,
    count_inputs,
    device_of,
    file_lines,
    given_texts,
    json_line,
    located,
)
from tformer.commands._pretrained import (
    add_model_arguments,
    load_sentence_encoder,
    one_line_warnings,
)

HELP = "sentence embeddings from a BERT-format / sentence-transformers directory"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    add_model_arguments(parser)
    parser.add_argument("texts", nargs="*", metavar="TEXT", help="texts to embed")
    parser.add_argument("--file", default=None,
                        help="a text file, one text per line ('-': standard input)")
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
    add_long(parser, model_dir=True)
    parser.add_argument(
        "--progress",
        action=argparse.BooleanOptionalAction,
        default=None,
        help="progress bar (default: for large inputs)",
    )


def numbered_inputs(args: argparse.Namespace, lines) -> Iterator[tuple[int, str]]:
    """(input number from 1, text) for the arguments then the --file lines, read lazily."""
    yield from enumerate(args.texts, start=1)
    if lines is not None:
        yield from ((len(args.texts) + i, text) for i, (_, text) in enumerate(lines, start=1))


def run(args: argparse.Namespace) -> int:
    from tformer.storage.files import check_file_name, replaced_path
    from tformer.training.distributed import process_group

    check_options(args)
    if args.out is not None:  # --out "" (an unset shell variable) printed to stdout instead
        check_file_name(args.out, "--out", "a .npy or .jsonl file name")
    out = replaced_path(args.out, "--out") if args.out is not None else None  # a link: its target
    if out is not None and out.suffix not in (".npy", ".jsonl"):
        raise ValueError(f"--out: expected a .npy or .jsonl file name, got {str(out)!r}")
    if out is not None and out.is_dir():
        raise ValueError(f"--out {out}: is a directory; expected a .npy or .jsonl file name")
    given_texts(args, "texts", "TEXT")  # a blank one refused, as a blank --file line is
    lines = file_lines(args)
    n = count_inputs(len(args.texts), lines)
    check_count(n, "TEXT")
    with process_group(device_of(args)) as (rank, world):  # torchrun: this process's share of the texts
        return _embed(args, out, lines, n, rank, world)


def _embed(args: argparse.Namespace, out: Path | None, lines, n: int, rank: int, world: int) -> int:
    from tformer.embeddings.index import model_identity
    from tformer.embeddings.output import open_output
    from tformer.embeddings.stream import embed_chunks, progress_bar
    from tformer.training.distributed import broadcast_int

    with one_line_warnings("embed"):
        st = load_sentence_encoder(args)
        normalize = st.normalize if args.normalize is None else args.normalize
        encode = dict(batch_size=args.batch_size, normalize=normalize, show_progress=False,
                      truncation=not args.no_truncate, rank=rank, world=world, total=n,
                      where=lambda number: located(args, "texts", "TEXT", number - 1))  # TEXT 1, --file f:2
        if out is None:
            for numbers, texts, emb in embed_chunks(st, numbered_inputs(args, lines), **encode):
                for number, text, vec in zip(numbers, texts, emb.tolist(), strict=True):
                    print(json_line({"text": text, "embedding": vec}, f"input {number}"))
            return 0
        if rank != 0:  # rank 0 writes; the others skip what it has written already
            done = broadcast_int(0, world)
            inputs = (item for item in numbered_inputs(args, lines) if item[0] > done)
            for _ in embed_chunks(st, inputs, **encode):
                pass
            return 0
        # The identity of what is written: an interrupted file resumes only for the same
        # inputs and everything that changes the numbers (model files, precision, lengths).
        identity = {"model": model_identity(args.model_dir), "texts": _inputs_hash(args, lines),
                    "n": n, "dim": st.dim, "normalize": normalize, "dtype": args.dtype,
                    "max_length": args.max_length, "truncate": not args.no_truncate,
                    "long": st.tokenizer.windows}
        with open_output(out, identity) as writer:
            if writer.done:
                print(f"tformer embed: resuming {out} after {writer.done} of {n} texts",
                      file=sys.stderr)
            elif writer.discarded:
                print(f"tformer embed: starting {out} over: its interrupted part was for other "
                      "inputs or options", file=sys.stderr)
            broadcast_int(writer.done, world)
            inputs = (item for item in numbered_inputs(args, lines) if item[0] > writer.done)
            bar = progress_bar(n, args.progress)
            bar.update(writer.done)
            for _, texts, emb in embed_chunks(st, inputs, **encode):
                writer.write(texts, emb)
                bar.update(len(texts))
            bar.close()
    print(f"wrote {n} embeddings of dimension {st.dim} to {out}", file=sys.stderr)
    return 0


def _inputs_hash(args: argparse.Namespace, lines) -> str:
    import hashlib

    digest = hashlib.sha256(json.dumps(list(args.texts)).encode())
    if lines is not None:
        digest.update(lines.digest().encode())
    return digest.hexdigest()[:16]
