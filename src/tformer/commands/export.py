"""`tformer export`: write a model in a format other tools load.

    tformer export RUN --hf DIR          classification run: BertForSequenceClassification (with
                                         BERT's pooler) or XLMForSequenceClassification (mean
                                         pooling, the default: exact one text per call); seq2seq
                                         run: MarianMTModel (post-norm) or Pegasus (pre-norm)
    tformer export RUN --onnx DIR        a folder: classifier: model.onnx (logits), tokenizer,
                                         config.json (id2label); embedding run: the same with
                                         sentence embeddings, as a sentence-transformers folder;
                                         seq2seq run: Optimum's layout (encoder_model.onnx,
                                         decoder_model.onnx, decoder_with_past_model.onnx, ...)
    tformer export MODEL_DIR --onnx OUT.onnx   encoder (or sentence embedding): one file

Every export has a model card (README.md with the Hub's YAML header). Nothing is written over
files tformer did not write; a symbolic link to a folder is followed. Details: docs/exports.md.

The work is in ``tformer.commands._export`` (torch is loaded only when the command runs).
"""

from __future__ import annotations

import argparse

HELP = ("export a model: ONNX (--onnx, every run kind and model directories, onnxruntime-checked) or a "
        "classification/seq2seq run for transformers (--hf)")


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("model_dir", metavar="MODEL_DIR",
                        help="a run directory of `tformer train` (any kind), or (--onnx) a BERT-format "
                             "or sentence-transformers model directory")
    what = parser.add_mutually_exclusive_group(required=True)
    what.add_argument(
        "--onnx", metavar="OUT",
        help="write ONNX, checked with onnxruntime before it is written: for a run, a folder OUT "
        "(classifier: model.onnx with logits, tokenizer.json, config.json with id2label; embedding: "
        "the same with sentence_embedding, as a sentence-transformers folder; seq2seq: Optimum's "
        "encoder_model.onnx, decoder_model.onnx, decoder_with_past_model.onnx, config.json, "
        "generation_config.json, tokenizer); for a BERT-format or sentence-transformers model "
        "directory, a file OUT.onnx (never over a file tformer did not write) "
        "(needs: pip install 'tformer[onnx]')",
    )
    what.add_argument("--hf", metavar="DIR",
                      help="write a transformers directory from a run: classification -> "
                           "BertForSequenceClassification (--pooling cls, fine-tunes) or "
                           "XLMForSequenceClassification (mean pooling: exact one text per call, a padded "
                           "batch fails), seq2seq -> MarianMTModel or Pegasus; with the "
                           "tokenizer (truncating at the run's max_length) and a model card")
    parser.add_argument("--opset", type=int, default=18,
                        help="ONNX opset version (18; another only where the installed torch.onnx writes "
                             "it and onnxruntime runs it, else refused before exporting, naming those)")


def run(args: argparse.Namespace) -> int:
    # Heavy (torch) modules load when the command runs, not when the CLI is built, so that
    # `tformer train --engine numpy` never imports torch (tformer.commands.cli builds every parser).
    from tformer.commands import _export

    return _export.run(args)
