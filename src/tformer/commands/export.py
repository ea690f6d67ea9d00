"""`tformer export`: write a model in a format other tools load.

    tformer export MODEL_DIR --onnx OUT.onnx   # encoder (or sentence embedding), onnxruntime-checked
    tformer export RUN_DIR --hf DIR            # a trained classifier for transformers

`transformers.AutoModelForSequenceClassification.from_pretrained(DIR)` gives the same logits as
the run (and AutoTokenizer the same tokens). Embedding runs need no export: the run directory
is already a sentence-transformers model.
"""

from __future__ import annotations

import argparse
import sys

HELP = "export a model: ONNX (--onnx, dynamic batch and sequence) or a classifier run for transformers (--hf)"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("model_dir", metavar="MODEL_DIR",
                        help="a BERT-format, sentence-transformers or tformer model directory "
                             "(--onnx), or a classification run directory (--hf)")
    what = parser.add_mutually_exclusive_group(required=True)
    what.add_argument(
        "--onnx", metavar="OUT.onnx",
        help="write an ONNX file: inputs input_ids, attention_mask (+ token_type_ids), output "
        "last_hidden_state, or sentence_embedding for a sentence-transformers directory; "
        "checked with onnxruntime before it is written (needs: pip install 'tformer[onnx]')",
    )
    what.add_argument("--hf", metavar="DIR",
                      help="write a BertForSequenceClassification directory from a classification run")
    parser.add_argument("--opset", type=int, default=18, help="ONNX opset version (18)")


def run(args: argparse.Namespace) -> int:
    if args.hf is not None:
        from tformer.convert.hf_classifier import export_classifier

        out = export_classifier(args.model_dir, args.hf)
        print(f"wrote {out}/ (AutoModelForSequenceClassification.from_pretrained loads it)")
        return 0
    from tformer.convert.onnx import TOLERANCE, export_onnx

    diff = export_onnx(args.model_dir, args.onnx, opset=args.opset)
    print(f"wrote {args.onnx} (onnxruntime matches tformer: max abs diff {diff:.2g} <= {TOLERANCE:g})",
          file=sys.stderr)
    return 0
