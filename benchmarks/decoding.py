"""Decoding: the KV cache against recomputing the prefix (decode), and tformer greedy / beam 4
against HF generate and CTranslate2 on the same weights (decode-marian: d 256, 3+3 layers, the
issue's HF model size; decode-default: d 64, 2+2, tformer's default seq2seq size).

    python benchmarks/decoding.py [--quick] [--rounds N] [--threads N] [--json FILE]

The same as `tformer bench --only decode decode-marian decode-default`.
It builds every contender with the same weights, checks their outputs before timing,
times them interleaved in rounds and prints one markdown table.
"""

import sys

from tformer.commands.cli import main

WORKLOADS = ["decode", "decode-marian", "decode-default"]

if __name__ == "__main__":
    sys.exit(main(["bench", "--only", *WORKLOADS, *sys.argv[1:]]))
