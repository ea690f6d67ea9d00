"""`tformer info CONFIG.json`: parameter count, FLOPs per token and activation memory."""

from __future__ import annotations

import argparse

HELP = "print parameter count, FLOPs per token and activation memory for a config"


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("config", help="a tformer config.json (or a run/model directory holding one)")
    p.add_argument("--model", default="encoder", choices=["encoder", "seq2seq", "classifier"])
    p.add_argument("--seq-len", type=int, default=None, help="sequence length (default: max_len)")
    p.add_argument("--batch", type=int, default=1, help="batch size for the memory estimate")


def _human(n: float, unit: str = "") -> str:
    for prefix in ("", "K", "M", "G", "T"):
        if abs(n) < 1000:
            return f"{n:.3g} {prefix}{unit}".strip()
        n /= 1000
    return f"{n:.3g} P{unit}"


def run(args: argparse.Namespace) -> int:
    from pathlib import Path

    from tformer.config import TransformerConfig
    from tformer.stats import activation_bytes, flops_per_token, parameter_count

    path = Path(args.config)
    if path.is_dir():
        path = path / "config.json"
    config = TransformerConfig.load(path)
    seq = args.seq_len or config.max_len
    if seq <= 0 or args.batch <= 0:
        raise ValueError(f"--seq-len/--batch: expected positive values, got {seq}/{args.batch}")
    params = parameter_count(config, args.model)
    flops = flops_per_token(config, seq, args.model)
    act = activation_bytes(config, seq, args.batch)
    rows = [
        ("model", args.model),
        ("layers x d_model x heads x d_ff",
         f"{config.n_layers} x {config.d_model} x {config.n_heads} x {config.d_ff}"),
        ("parameters", f"{params:,} ({_human(params)})"),
        ("parameter memory (fp32)", f"{params * 4 / 2**20:.1f} MiB"),
        (f"forward FLOPs per token (seq {seq})", f"{flops:,} ({_human(flops, 'FLOP')})"),
        ("training FLOPs per token (~3x forward)", _human(3 * flops, "FLOP")),
        (f"activation memory, training (batch {args.batch} x {seq}, fp32)",
         f"{act / 2**20:.1f} MiB (estimate)"),
    ]
    width = max(len(k) for k, _ in rows)
    for k, v in rows:
        print(f"{k:<{width}}  {v}")
    return 0
