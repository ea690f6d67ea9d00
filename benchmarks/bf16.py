"""bf16 inference (model.to(torch.bfloat16)) against fp32 tformer and bf16 peers.

    python benchmarks/bf16.py [--quick] [--rounds N] [--threads N] [--json FILE]

The same as `tformer bench --only bf16`.
It builds every contender with the same weights, checks their outputs before timing,
times them interleaved in rounds and prints one markdown table.
"""

import sys

from tformer.commands.cli import main

WORKLOADS = ["bf16"]

if __name__ == "__main__":
    sys.exit(main(["bench", "--only", *WORKLOADS, *sys.argv[1:]]))
