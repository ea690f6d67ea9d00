"""tformer against the deployment runtimes: ONNX Runtime (plain, optimized, int8), CTranslate2
(fp32, int8), OpenVINO (f32, default), sentence-transformers, HF BertModel and torch.nn.

    python benchmarks/runtimes.py [--quick] [--rounds N] [--threads N] [--contenders PREFIX ...] [--json FILE]

The same as `tformer bench --only sentences-minilm mixed-base`. Needs `pip install tformer[bench]`
(a missing runtime is skipped with a note). Every contender is built from one random-weight
BERT directory, runs in its own process, is checked against tformer before timing, and is timed
in interleaved rounds; one markdown table.
"""

import sys

from tformer.commands.cli import main

WORKLOADS = ["sentences-minilm", "mixed-base"]

if __name__ == "__main__":
    sys.exit(main(["bench", "--only", *WORKLOADS, *sys.argv[1:]]))
