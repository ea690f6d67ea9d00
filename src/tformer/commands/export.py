"""`tformer export RUN_DIR --hf DIR`: a fine-tuned classifier as a transformers directory.

`transformers.AutoModelForSequenceClassification.from_pretrained(DIR)` then gives the same
logits (and AutoTokenizer the same tokens). Embedding runs need no export: the run
directory is already a sentence-transformers model.
"""

from __future__ import annotations

import argparse

HELP = "export a trained classifier for transformers (--hf DIR)"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("run_dir", metavar="RUN_DIR", help="a classification run (fine-tuned)")
    parser.add_argument("--hf", metavar="DIR", required=True,
                        help="write a BertForSequenceClassification directory here")


def run(args: argparse.Namespace) -> int:
    from tformer.convert.hf_classifier import export_classifier

    out = export_classifier(args.run_dir, args.hf)
    print(f"wrote {out}/ (AutoModelForSequenceClassification.from_pretrained loads it)")
    return 0
