"""Inference against torch.nn.TransformerEncoder (fast path) and HF BertModel (sdpa): dense and
50%-padded batches.

    python benchmarks/inference.py [--quick] [--rounds N] [--threads N] [--json FILE]

The same as `tformer bench --only dense-small dense-base-512 padded-small-post padded-small-pre
padded-base-post padded-base-pre`.
It builds every contender with the same weights, checks their outputs before timing,
times them interleaved in rounds and prints one markdown table.
"""

import sys

from tformer.commands.cli import main

WORKLOADS = ["dense-small", "dense-base-512", "padded-small-post", "padded-small-pre",
             "padded-base-post", "padded-base-pre"]

if __name__ == "__main__":
    sys.exit(main(["bench", "--only", *WORKLOADS, *sys.argv[1:]]))
