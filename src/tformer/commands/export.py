"""`tformer export`: write a model in a format other tools load."""

from __future__ import annotations

import argparse
import sys

HELP = "export a model directory (ONNX with dynamic batch and sequence axes)"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("model_dir", metavar="MODEL_DIR",
                        help="a BERT-format, sentence-transformers or tformer model directory")
    parser.add_argument(
        "--onnx", metavar="OUT.onnx", required=True,
        help="write an ONNX file: inputs input_ids, attention_mask (+ token_type_ids), output "
        "last_hidden_state, or sentence_embedding for a sentence-transformers directory; "
        "checked with onnxruntime before it is written (needs: pip install 'tformer[onnx]')",
    )
    parser.add_argument("--opset", type=int, default=18, help="ONNX opset version (18)")


def run(args: argparse.Namespace) -> int:
    from tformer.convert.onnx import TOLERANCE, export_onnx

    diff = export_onnx(args.model_dir, args.onnx, opset=args.opset)
    print(f"wrote {args.onnx} (onnxruntime matches tformer: max abs diff {diff:.2g} <= {TOLERANCE:g})",
          file=sys.stderr)
    return 0
