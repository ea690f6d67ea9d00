"""How close bf16 and int8 sentence embeddings stay to fp32, on your model and your texts.

    python benchmarks/precision_accuracy.py MODEL_DIR [TEXT_FILE] [--count N]

MODEL_DIR: a BERT-format or sentence-transformers directory (real weights: the outlier
channels that make low precision hard exist only in trained models). TEXT_FILE: one text per
line; without it, N texts of 3..230 tokens cut from the standard library's docstrings (the
sentence workload of `tformer bench`). Prints, per precision, the smallest and the mean
cosine between its embedding and the fp32 one, and which texts came out worst.
"""

from __future__ import annotations

import argparse
import contextlib
import sys

import numpy as np
import torch

from tformer.commands.benchmarking import corpus, harness
from tformer.embeddings.sentence import SentenceEncoder
from tformer.nn import int8, kernels
from tformer.text.lines import TextLines


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("model_dir")
    parser.add_argument("text_file", nargs="?")
    parser.add_argument("--count", type=int, default=480, help="generated texts (480)")
    parser.add_argument("--threads", type=int, default=None)
    parser.add_argument(
        "--int8-bits", type=int, choices=[7, 8], default=None,
        help="int8 activation bits (default: what this CPU's kernel sums exactly); more bits "
        "than that run the plain kernel: the numbers a CPU with VNNI computes, slowly")
    args = parser.parse_args(argv)
    if args.threads:
        torch.set_num_threads(args.threads)
    reference = SentenceEncoder.from_pretrained(args.model_dir, device="cpu")
    if args.text_file:
        texts = TextLines(args.text_file, "TEXT_FILE").texts()
    else:
        lengths = reference.tokenizer.lengths
        texts = corpus.sentences(args.count, 3, 230, lambda t: lengths([t])[0])
    model, flags = harness.cpu_info()
    print(f"CPU: {model}; flags: {', '.join(flags) or 'none of ' + ', '.join(harness.ISA_FLAGS)}; "
          f"int8 activation bits: {args.int8_bits or int8.exact_bits()} "
          f"(exact in this CPU's kernel: {int8.exact_bits()})")
    fp32 = reference.encode(texts, show_progress=False)
    print(f"{len(texts)} texts; cosine to the fp32 embedding:\n")
    print("| precision | min cosine | mean cosine | worst text |\n|---|---|---|---|")
    for precision in ("bf16", "int8"):
        plain = contextlib.nullcontext()
        if precision == "int8" and args.int8_bits:
            low = SentenceEncoder.from_pretrained(args.model_dir, device="cpu")
            int8.quantize(low.model, bits=args.int8_bits)
            if args.int8_bits > int8.exact_bits():
                plain = kernels.readable()  # float sums of the integers: exact, as VNNI's
        else:
            low = SentenceEncoder.from_pretrained(args.model_dir, dtype=precision, device="cpu")
        with plain:
            emb = low.encode(texts, show_progress=False)
        cos = (fp32 * emb).sum(axis=1) / (
            np.linalg.norm(fp32, axis=1) * np.linalg.norm(emb, axis=1)).clip(min=1e-30)
        worst = texts[int(cos.argmin())]
        print(f"| {precision} | {cos.min():.5f} | {cos.mean():.5f} | {worst[:60]!r} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
