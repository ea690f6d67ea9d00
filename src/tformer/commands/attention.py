"""`tformer attention MODEL_DIR "text" --out attn.png`: the model's attention maps as a picture.

A grid of heatmaps, one row per layer and one column per head, with the text's tokens
on both axes (queries down, keys across); ``--layer``/``--head`` keep one row/column.
``--html attn.html`` writes the interactive page instead (or as well): see
``tformer.commands._attention_html``. MODEL_DIR may be a BERT-format or sentence-transformers
directory or a run directory of `tformer train` of any kind (classification, seq2seq,
embedding; your data or a synthetic task); the PNG draws the encoder's self-attention, the
page also a seq2seq run's decoder self- and cross-attention.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from tformer.commands._pretrained import add_model_arguments
from tformer.errors import BadInput

HELP = (
    "draw a model's attention weights for a text: layers x heads heatmaps to a PNG (--out), "
    "or an interactive HTML page (--html)"
)
# Past these, tick labels overlap and the figure is unreadable, and drawing it took minutes
# and gigabytes (256 tokens x 144 maps: 9.6 GB). One map can hold more than a grid.
MAX_TOKENS_GRID = 48
MAX_TOKENS_ONE_MAP = 128


def add_arguments(parser: argparse.ArgumentParser) -> None:
    add_model_arguments(parser, batch=False, runs=True)
    parser.add_argument("text", metavar="TEXT", help="the text to look at")
    parser.add_argument("--out", default=None, help="the PNG file to write")
    parser.add_argument(
        "--html",
        default=None,
        help="the interactive page to write: one self-contained HTML file (layer and head pickers, "
        "hover a token, all heads at a glance); refused in one line when estimated past 64 MB",
    )
    parser.add_argument(
        "--layer", type=int, default=None, help="only this layer (from 0); --html: the layer shown first"
    )
    parser.add_argument(
        "--head", type=int, default=None, help="only this head (from 0); --html: the head shown first"
    )


def run(args: argparse.Namespace) -> int:
    # Heavy (torch) modules load when the command runs, not when the CLI is built, so that
    # `tformer train --engine numpy` never imports torch (tformer.commands.cli builds every parser).
    from tformer.commands import _inputs
    from tformer.commands._attention_html import bert_maps, check_options, run_maps, write_html
    from tformer.commands._pretrained import max_length_option
    from tformer.storage.rundir import is_run_dir
    from tformer.training.viz.plots import plot_attention, save_figure

    _inputs.check_options(args)  # --threads, as every command that runs a model
    if args.out is None and args.html is None:
        raise ValueError(
            "--out/--html: expected a PNG file (--out), an HTML file (--html) or both, got neither"
        )
    if args.out is not None and not args.out.lower().endswith(".png"):
        raise ValueError(f"--out: expected a .png file name, got {args.out!r}")
    if args.html is not None and not args.html.lower().endswith((".html", ".htm")):
        raise ValueError(f"--html: expected a .html file name, got {args.html!r}")
    if is_run_dir(Path(args.model_dir)):
        from tformer.commands._inputs import device_of
        from tformer.kinds import load_run

        run = load_run(args.model_dir, device=device_of(args))
        try:
            with max_length_option():
                maps = run_maps(run.attention_input(args.text, args.max_length))
        except BadInput as e:
            raise ValueError(f"TEXT: {e.reason}") from None
    else:
        maps = bert_maps(args)
    check_options(maps, args.layer, args.head)
    if args.html is not None:
        print(write_html(args, maps), file=sys.stderr)
    if args.out is None:
        return 0
    first = maps[0]  # the PNG draws the encoder's self-attention
    n_layers, n_heads = first.weights.shape[:2]
    check_readable(len(first.queries), args.layer is not None and args.head is not None)
    fig = plot_attention(first.weights, list(first.queries), layer=args.layer, head=args.head,
                         title=f"{args.model_dir}: {args.text[:60]}")
    path = save_figure(fig, args.out, "--out")
    rows = 1 if args.layer is not None else n_layers
    cols = 1 if args.head is not None else n_heads
    print(f"wrote {path} ({rows} x {cols} maps, {len(first.queries)} tokens)", file=sys.stderr)
    return 0


def check_readable(n_tokens: int, one_map: bool) -> None:
    """Refuse a text whose figure would be unreadable (and slow and huge to draw)."""
    limit = MAX_TOKENS_ONE_MAP if one_map else MAX_TOKENS_GRID
    if n_tokens > limit:
        hint = ("" if one_map else
                f"; pick one map with --layer and --head (up to {MAX_TOKENS_ONE_MAP} tokens)")
        raise ValueError(f"TEXT: expected at most {limit} tokens for a readable figure, "
                         f"got {n_tokens}; shorten the text or use --max-length{hint}")
