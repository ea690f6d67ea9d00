"""The CTranslate2 decoding peer inside its worker process (tformer.commands.benchmarking.worker, task
"decode"): the child's side of decode_peers.ct2_workers, apart so that the worker does not
import the parent's module (and the parent's imports torch's decoding)."""

from __future__ import annotations

from collections.abc import Callable


def ct2_generate(translator, src, mask, max_len: int, eos: int, beams: int) -> list[list[int]]:
    """CTranslate2 greedy (beams 1) or beam search; per row the ids up to EOS."""
    batch = [[f"t{i}" for i in row[m].tolist()] for row, m in zip(src, mask, strict=True)]
    results = translator.translate_batch(batch, beam_size=beams, max_decoding_length=max_len,
                                         end_token=f"t{eos}", return_end_token=True,
                                         length_penalty=1.0)
    return [[int(t[1:]) for t in r.hypotheses[0]] for r in results]


def ct2_decoder(spec: dict) -> Callable[[], list[list[int]]]:
    """In a worker process (tformer.commands.benchmarking.worker, task "decode"): the CTranslate2 model in
    spec["model"] decoding spec["inputs"] (.npz: src, mask) with spec["beams"] beams."""
    import ctranslate2
    import numpy as np

    data = np.load(spec["inputs"])
    src, mask = data["src"], data["mask"].astype(bool)
    translator = ctranslate2.Translator(spec["model"], device="cpu", inter_threads=1,
                                        intra_threads=spec["threads"])
    return lambda: ct2_generate(translator, src, mask, spec["max_len"], spec["eos"], spec["beams"])
