"""The NumPy reference (float32) against HF BertModel and the tutorial-style float64 floor, at
BERT-base width (8 x 128).

    python benchmarks/numpy_reference.py [--quick] [--rounds N] [--threads N] [--json FILE]

The same as `tformer bench --only numpy-base`.
It builds every contender with the same weights, checks their outputs before timing,
times them interleaved in rounds and prints one markdown table.
"""

import sys

from tformer.commands.cli import main

WORKLOADS = ["numpy-base"]

if __name__ == "__main__":
    sys.exit(main(["bench", "--only", *WORKLOADS, *sys.argv[1:]]))
