"""Peak RSS growth of one layer at 1024 to 16384 tokens (fresh process, one call each).

    python benchmarks/memory.py [--quick] [--rounds N] [--threads N] [--json FILE]

The same as `tformer bench --only memory`.
It builds every contender with the same weights, checks their outputs before timing,
times them interleaved in rounds and prints one markdown table.
"""

import sys

from tformer.commands.cli import main

WORKLOADS = ["memory"]

if __name__ == "__main__":
    sys.exit(main(["bench", "--only", *WORKLOADS, *sys.argv[1:]]))
