"""GEMM throughput (torch.mm/MKL and oneDNN, fp32 and bf16): the roofline.

    python benchmarks/gemm.py [--quick] [--rounds N] [--threads N] [--json FILE]

The same as `tformer bench --only gemm`.
It builds every contender with the same weights, checks their outputs before timing,
times them interleaved in rounds and prints one markdown table.
"""

import sys

from tformer.commands.cli import main

WORKLOADS = ["gemm"]

if __name__ == "__main__":
    sys.exit(main(["bench", "--only", *WORKLOADS, *sys.argv[1:]]))
