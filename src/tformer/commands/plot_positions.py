"""`tformer plot-positions --out pe.png`: the sinusoidal positional encoding (§3.5) as a picture."""

from __future__ import annotations

import argparse
import sys

HELP = "draw the sinusoidal positional encoding table to a PNG"
MAX_CELLS = 1 << 24


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--out", required=True, help="the PNG file to write")
    parser.add_argument("--d-model", type=int, default=128, help="model dimension (128)")
    parser.add_argument("--max-len", type=int, default=100, help="number of positions (100)")


def run(args: argparse.Namespace) -> int:
    from tformer.reference.positional import plot_positions
    from tformer.training.viz.plots import save_figure

    if not args.out.lower().endswith(".png"):
        raise ValueError(f"--out: expected a .png file name, got {args.out!r}")
    for option, value in (("--d-model", args.d_model), ("--max-len", args.max_len)):
        if value <= 0:
            raise ValueError(f"{option}: expected a positive int, got {value}")
    if args.max_len * args.d_model > MAX_CELLS:  # a picture past this is unreadable, and its table huge
        raise ValueError(f"--max-len x --d-model: expected at most {MAX_CELLS:,} values to draw, got "
                         f"{args.max_len:,} x {args.d_model:,}")
    path = save_figure(plot_positions(args.d_model, args.max_len), args.out, "--out")
    print(f"wrote {path} ({args.max_len} positions x {args.d_model} dimensions)", file=sys.stderr)
    return 0
