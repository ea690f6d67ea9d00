"""Greedy decoding of 128 tokens with the KV cache against recomputing the prefix.

    python benchmarks/decoding.py [--quick] [--rounds N] [--threads N] [--json FILE]

The same as `tformer bench --only decode`.
It builds every contender with the same weights, checks their outputs before timing,
times them interleaved in rounds and prints one markdown table.
"""

import sys

from tformer.cli import main

WORKLOADS = ["decode"]

if __name__ == "__main__":
    sys.exit(main(["bench", "--only", *WORKLOADS, *sys.argv[1:]]))
