"""What the pretrained-model commands (embed, similarity, search, attention) share:
the MODEL_DIR options (--device; and --batch-size, --threads where they batch) and warnings
printed as one line. Inputs are read by tformer.commands._inputs."""

from __future__ import annotations

import argparse
import contextlib
import sys
import warnings
from collections.abc import Iterator

from tformer.commands._inputs import add_device, add_threads, device_of

DTYPES = ("auto", "fp32", "bf16", "int8")  # tformer.nn.precision.CHOICES, without importing torch


def add_model_arguments(parser: argparse.ArgumentParser, batch: bool = True, index: bool = False,
                        runs: bool = False) -> None:
    """runs: the command takes any run directory of `tformer train` too (attention)."""
    parser.add_argument(
        "model_dir",
        metavar="MODEL_DIR",
        help="a BERT-format or sentence-transformers directory "
        "(config.json, model.safetensors, tokenizer.json or vocab.txt)"
        + (", or an INDEX that `tformer index build` wrote (then no --corpus)" if index else "")
        + (", or a run directory of `tformer train` (any kind)" if runs else ""),
    )
    parser.add_argument(
        "--allow-pickle",
        action="store_true",
        help="also load pytorch_model.bin (torch.load with weights_only=True); "
        "by default only safetensors are read",
    )
    parser.add_argument(
        "--no-truncate",
        action="store_true",
        help="fail on a text longer than the model's maximum length (or read only in part: no cut in "
        "sight by 256 characters a token) instead of truncating it with a warning",
    )
    parser.add_argument(
        "--max-length", type=int, default=None, help="truncate to fewer tokens than the model allows"
    )
    add_device(parser)
    add_threads(parser)
    if not batch:  # attention maps: fp32 only
        return
    parser.add_argument(
        "--dtype", choices=DTYPES, default="auto",
        help="inference precision: auto (the default: bf16 where the device computes it natively "
        "and it is measured faster, else fp32); fp32; bf16 matrix multiplies with fp32 norms, softmax, "
        "residual stream and pooling (cosine >= 0.9999 to fp32; on a CPU faster only with "
        "avx512_bf16 or AMX); int8 multiplies with per-token activations after a Hadamard "
        "rotation (CPU only; cosine ~0.999 to fp32; see tformer.nn.int8)",
    )
    parser.add_argument("--batch-size", type=int, default=32, help="texts per batch (32)")


def load_sentence_encoder(args: argparse.Namespace):
    """MODEL_DIR's SentenceEncoder: an embedding run's own (its run's one forward, read from the
    run directory alone: tformer.kinds; a long text read as the run settled), or a BERT-format
    or sentence-transformers directory's (a long text cut); on --device, in --dtype (decided
    here, once: an output's identity names it); --long (embed's) says otherwise."""
    from pathlib import Path

    from tformer.embeddings.sentence import SentenceEncoder
    from tformer.nn.precision import resolve_precision
    from tformer.storage.rundir import is_run_dir

    device = device_of(args)
    check_not_another_run(args.model_dir)
    args.dtype, _ = resolve_precision(args.dtype, device)
    with max_length_option():
        if is_run_dir(Path(args.model_dir)):
            from tformer.kinds import load_run

            run = load_run(args.model_dir, needs="embed", device=device, dtype=args.dtype)
            st = run.encoder.at_most(args.max_length)
        else:
            st = SentenceEncoder.from_pretrained(
                args.model_dir, allow_pickle=args.allow_pickle, max_length=args.max_length,
                dtype=args.dtype, device=device,
            )
    long = getattr(args, "long", None)
    return st if long is None else st.windowed(long == "windows")


@contextlib.contextmanager
def max_length_option() -> Iterator[None]:
    """The tokenizer's max_length errors named as the user wrote it: --max-length."""
    from tformer.errors import FieldError

    try:
        yield
    except FieldError as e:
        if e.field != "max_length":
            raise
        raise e.named("--max-length") from None


def check_not_another_run(model_dir: str) -> None:
    """A run directory of another kind (a classifier's, a translator's) named as a sentence
    model: say which command takes it, not "config.json: no such file"."""
    from pathlib import Path

    from tformer.kinds import describe_run
    from tformer.storage.checkpoint_names import latest_checkpoint

    path = Path(model_dir)
    if latest_checkpoint(path) is not None:
        what, verb = describe_run(path)  # its weights are not read for an error
        if verb != "embed":
            raise ValueError(f"MODEL_DIR: {path} is {what}, not a sentence embedding model: "
                             f"use `tformer {verb} {path}`")


@contextlib.contextmanager
def one_line_warnings(command: str) -> Iterator[None]:
    """Print warnings (e.g. truncation) as ``tformer CMD: warning: ...``, not as source lines."""
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always", UserWarning)
        try:
            yield
        finally:
            seen = set()
            for w in caught:
                message = str(w.message)
                if not issubclass(w.category, UserWarning):  # not ours: shown as usual
                    warnings.showwarning(w.message, w.category, w.filename, w.lineno)
                elif message not in seen:
                    seen.add(message)
                    print(f"tformer {command}: warning: {message}", file=sys.stderr)


# Characters str.splitlines() breaks at, other than "\n" (a line of the input never holds one):
# printed raw, one result became several lines to a line-based reader.
_LINE_BREAKS = str.maketrans({c: f"\\x{ord(c):02x}" if ord(c) < 256 else f"\\u{ord(c):04x}"
                              for c in "\r\x0b\x0c\x1c\x1d\x1e\x85\u2028\u2029"})


def short(text: str, width: int = 60) -> str:
    """`text` on one line (line-breaking characters escaped), cut to `width`."""
    text = text.translate(_LINE_BREAKS)
    return text if len(text) <= width else text[: width - 3] + "..."
