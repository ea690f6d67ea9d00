"""A sequence-to-sequence run: an input text in, the generated output text out (greedy or beam
search, with the run's own tokenizer and length)."""

from __future__ import annotations

import sys
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from tformer.export import hf_classifier, hf_seq2seq, onnx_seq2seq
from tformer.export import onnx as tonnx
from tformer.export.model_card import Card
from tformer.runs.base import Run, check_batch_size, texts_of
from tformer.search_args import check_max_len
from tformer.storage.files import json_bytes


class Seq2SeqRun(Run):
    verb = "generate"
    decodes = True

    @property
    def max_new_tokens(self) -> int:
        """What generate generates at most by default: the run's max length (a task's longest
        target and its EOS)."""
        return self.objective.source.max_new_tokens

    def generate(self, inputs: str | Iterable[str], beam_size: int = 1, length_penalty: float = 1.0,
                 max_len: int | None = None, batch_size: int = 32) -> list[str]:
        """The output text per input (one str is one input); at most max_len tokens (default:
        2 x the batch's longest input + 10, at most max_new_tokens: Seq2Seq.predict_batch; at
        most the decoder's positions)."""
        if max_len is not None:
            check_max_len(max_len, self.model.config.max_len)
        return self.objective.generate(self.model, texts_of(inputs, "inputs"), beam_size, length_penalty,
                                       max_len, batch_size=check_batch_size(batch_size))

    def answers(self, texts: list[str], batch_size: int = 32, **options: Any) -> list[str]:
        """What `tformer generate` prints per input: the output."""
        return self.generate(texts, batch_size=batch_size, **options)

    def _decoding(self, beam_size: int) -> dict[str, Any]:
        return {"beam_size": beam_size}

    def _input_ids(self, source, text: str) -> tuple[list[int], None]:
        """What the encoder reads: the text's pieces, then EOS (as training encodes sources)."""
        return source.pieces([text])[0] + [source.eos_id], None

    def export_hf(self, out: Path, card: Card) -> Path:
        tok = self.tokenizer
        if tok is None:
            raise ValueError(f"--hf: {self.path} is a synthetic-task run ({self.config.task}) with no text "
                             "tokenizer for transformers; export it with --onnx")
        written, diff = hf_seq2seq.export_seq2seq(out, self.model, tok.backend, tok.max_length, card)
        print(f"wrote {written}/ ({hf_seq2seq.architecture(self.model.config)}, max abs diff {diff:.1e} "
              "on the logits against tformer; AutoModelForSeq2SeqLM.from_pretrained loads it)",
              file=sys.stderr)
        return written

    def export_onnx(self, out: Path, card: Card, opset: int) -> Path:
        """Folder ``out`` in Optimum's layout (tformer.export.onnx_seq2seq)."""
        out = tonnx.check_folder(out)  # refused before the tracing
        tok, source = self.tokenizer, self.objective.source
        ids = {"pad_id": source.pad_id, "bos_id": source.bos_id, "eos_id": source.eos_id}
        try:
            config = hf_seq2seq.config_to_hf(self.model.config, **ids)
        except ValueError:  # neither Marian nor Pegasus: tformer's own config
            config = {"tformer_config": self.model.config.to_dict(), "is_encoder_decoder": True}
        extra = {"config.json": json_bytes(config),
                 "generation_config.json": json_bytes(hf_seq2seq.generation_config(
                     **ids, max_new_tokens=self.max_new_tokens))}
        if tok is not None:
            extra.update(hf_classifier.tokenizer_files(tok.backend, tok.max_length, "$A </s>"))
        written, diff = onnx_seq2seq.export_seq2seq_onnx(self.model, out, card, extra, ids,
                                                         self.max_new_tokens, opset=opset)
        tonnx.report(f"{written}/", diff)
        return written
