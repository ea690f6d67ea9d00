"""One training step (forward + backward + AdamW, dropout 0.1) against HF BertModel and torch.nn.

    python benchmarks/training.py [--quick] [--rounds N] [--threads N] [--json FILE]

The same as `tformer bench --only train-small train-base`.
It builds every contender with the same weights, checks their outputs before timing,
times them interleaved in rounds and prints one markdown table.
"""

import sys

from tformer.commands.cli import main

WORKLOADS = ["train-small", "train-base"]

if __name__ == "__main__":
    sys.exit(main(["bench", "--only", *WORKLOADS, *sys.argv[1:]]))
