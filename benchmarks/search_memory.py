"""Peak memory (RSS) of `tformer embed`, `search`, `index build` and `search INDEX` against
the number of corpus lines: a workload, not a timing (each command runs once, in a fresh
process; its peak RSS is read from wait4).

    python benchmarks/search_memory.py [--lines 10000 40000 160000] [--dir /tmp/search-memory]

Uses a tiny random-weight BERT (2 layers, d 32), so the numbers show how memory grows with
the corpus, not the model's size. Prints one markdown table.
"""

from __future__ import annotations

import argparse
import os
import random
import subprocess
import sys
from pathlib import Path

WORDS = ("the a cat dog sat on mat is big small red blue and of to in it for with one two "
         "three man woman house car tree river sun moon city road book day night good new old").split()


def make_model(directory: Path) -> None:
    from transformers import BertConfig, BertModel

    config = BertConfig(vocab_size=len(WORDS) + 5, hidden_size=32, num_hidden_layers=2,
                        num_attention_heads=4, intermediate_size=64, max_position_embeddings=64)
    BertModel(config).save_pretrained(str(directory))
    (directory / "vocab.txt").write_text("\n".join(["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]",
                                                    *WORDS]) + "\n")


def make_corpus(path: Path, n: int) -> None:
    rng = random.Random(n)
    with path.open("w") as f:
        for _ in range(n):
            f.write(" ".join(rng.choices(WORDS, k=rng.randint(4, 14))) + "\n")


def peak_rss_mib(argv: list[str]) -> float:
    proc = subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    _, status, usage = os.wait4(proc.pid, 0)
    err = proc.stderr.read().decode() if proc.stderr else ""
    if os.waitstatus_to_exitcode(status) != 0:
        raise SystemExit(f"{' '.join(argv)} failed: {err.strip()[-300:]}")
    return usage.ru_maxrss / 1024  # KiB on Linux


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--lines", type=int, nargs="+", default=[10_000, 40_000, 160_000])
    parser.add_argument("--dir", default="/tmp/search-memory")
    parser.add_argument("--no-onednn", action="store_true",
                        help="keep the fast path off oneDNN's linear, whose per-shape primitive "
                             "cache grows with the number of distinct packed batch sizes")
    parser.add_argument("--batch-size", type=int, default=256,
                        help="texts per forward pass (fixed, so memory shows what grows with N)")
    args = parser.parse_args()
    root = Path(args.dir)
    root.mkdir(parents=True, exist_ok=True)
    model = root / "model"
    if not (model / "config.json").is_file():
        make_model(model)
    tformer = [sys.executable, "-m", "tformer.commands.cli"]
    if args.no_onednn:
        tformer = [sys.executable, "-c", "import sys; from tformer.nn.kernels import linear_kernels; "
                   "linear_kernels._ONEDNN = False; from tformer.commands.cli import main; sys.exit(main())"]
    batch = ["--batch-size", str(args.batch_size)]
    print(f"tiny random BERT (2 layers, d 32), batch size {args.batch_size}"
          f"{', fast path without oneDNN linear' if args.no_onednn else ''}; peak RSS per command")
    print("| lines | embed --out .npy | search --corpus | index build | search INDEX |")
    print("|---:|---:|---:|---:|---:|")
    for n in args.lines:
        corpus = root / f"corpus-{n}.txt"
        if not corpus.is_file():
            make_corpus(corpus, n)
        index = root / f"index-{n}"
        if index.exists():
            import shutil

            shutil.rmtree(index)
        rows = [
            peak_rss_mib([*tformer, "embed", str(model), "--file", str(corpus),
                          "--out", str(root / f"emb-{n}.npy"), "--no-progress", *batch]),
            peak_rss_mib([*tformer, "search", str(model), "--corpus", str(corpus), "red car",
                          "--no-progress", *batch]),
            peak_rss_mib([*tformer, "index", "build", str(model), "--corpus", str(corpus),
                          "--out", str(index), "--no-progress", *batch]),
            peak_rss_mib([*tformer, "search", str(index), "red car"]),
        ]
        print(f"| {n:,} | " + " | ".join(f"{r:,.0f} MiB" for r in rows) + " |", flush=True)


if __name__ == "__main__":
    main()
