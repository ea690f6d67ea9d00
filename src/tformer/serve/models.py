"""What a served directory can do: load it, count and cut its inputs' tokens, run a batch.

This is the server's only contact with the rest of tformer's loading code, so a change in how
runs are stored is rewired here alone. Three kinds, one class each:

    EmbeddingModel       a BERT-format / sentence-transformers directory, or an embedding run
    ClassificationModel  a classification run (`tformer train --data` with text+label)
    Seq2SeqModel         a seq2seq run (source+target)

Each one turns a request's texts into ``Item``s at admission (tokenized once, in the server's
tokenizer threads: the batcher needs their token counts to pack batches) and runs a list of
items as one batch in the model thread: ``run(payloads, key)``, where ``key`` holds the settings
that all inputs of a batch share (normalisation; raw scores; beam size and lengths).

A text far longer than the token limit is tokenized only as far as the limit needs
(``Tokenizer.prefixes``, tformer.text.prefix: the one way every command does it): a 5 MB text
costs what a few kB do, the tokens kept are the same, and the model thread gets the prefix.

A run directory is read by ``tformer.runs.load_run``; the two run classes here wrap its run
(its tokenizer, labels and objective, which predicts and generates); the embedding class
reads a sentence-transformers directory itself.
"""

from __future__ import annotations

import warnings
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch

from tformer.text.batches import EncodedText, encoder_batch
from tformer.text.prefix import Unread, is_cut, plus


@dataclass
class Item:
    """One input text as the batcher sees it.

    n: tokens the model will run (after any cut); full: tokens before the cut (at least, for
    a text tokenized only as far as the limit needed; an ``Unread`` for one read only to its
    reach, cut whatever its count); payload: what the model's ``run`` needs (token ids, or the
    text itself)."""

    n: int
    full: int
    payload: Any

    @property
    def truncated(self) -> bool:
        return is_cut(self.full, self.n)


class InputRefused(ValueError):
    """An input this model cannot take: the server answers ``status``, naming the inputs."""

    status = 422


class TooLong(InputRefused):
    """An input longer than the limit, with truncation off: the server answers 413."""

    status = 413


class EmbeddingModel:
    """Encoder + pooling (+ normalisation), run on token ids that were cut at admission."""

    kind = "embedding"

    def __init__(self, path: Path, dtype: str, max_input_tokens: int | None, device: torch.device) -> None:
        from tformer.embeddings.sentence import SentenceEncoder

        try:
            self.st = SentenceEncoder.from_pretrained(path, dtype=dtype, max_length=max_input_tokens,
                                                      device=device)
        except ValueError as e:  # the library names its argument; the user gave the flag
            if str(e).startswith("max_length:"):
                raise ValueError("--max-input-tokens:" + str(e).removeprefix("max_length:")) from None
            raise
        self.max_input_tokens = self.st.tokenizer.max_length
        self.dim = self.st.dim
        self.normalize = self.st.normalize

    def items(self, inputs: list[str | list[int]], truncate: bool) -> list[Item]:
        """Texts as the model reads them, cut as the tokenizer cuts (Tokenizer.encode: the one
        path `tformer embed` takes too, a long text tokenized only as far as its cut needs); a
        text past the limit is refused unless truncating. Token ids (TEI and OpenAI accept
        them) are taken as they are."""
        tokenizer, limit = self.st.tokenizer, self.max_input_tokens
        out: list[Item | None] = [None] * len(inputs)
        index = [i for i, x in enumerate(inputs) if isinstance(x, str)]
        if index:
            encoded = tokenizer.encode([inputs[i] for i in index])
            _too_long([e.full for e in encoded], limit, truncate, index)
            for i, e in zip(index, encoded, strict=True):
                out[i] = Item(len(e.ids), e.full, e)
        for i, ids in enumerate(inputs):
            if not isinstance(ids, str):
                _too_long([len(ids)], limit, truncate, [i])
                kept = ids[:limit]
                out[i] = Item(len(kept), len(ids), EncodedText(kept, [0] * len(kept), len(ids)))
        return out  # type: ignore[return-value]

    def tokenize(self, texts: list[str], add_special_tokens: bool) -> list[list[dict[str, Any]]]:
        return _tokens(self.st.tokenizer, texts, add_special_tokens)

    @property
    def vocab_size(self) -> int:
        return self.st.tokenizer.vocab_size

    def run(self, payloads: list[EncodedText], normalize: bool) -> list[np.ndarray]:
        """Embed one batch, as ``SentenceEncoder.encode`` does each of its batches.
        ``normalize`` is the batch's key: inputs batch together only with the same.

        Shape:
            returns B vectors (dim,) float32, in the order of ``payloads``
        """
        batch = encoder_batch(payloads, self.st.tokenizer.pad_id)
        return list(self.st.embed_batch(batch, normalize).numpy())

    def warm_up(self) -> None:
        self.run([item.payload for item in self.items(["warm up"], True)], True)

    def describe(self) -> dict[str, Any]:
        return {"dim": self.dim, "pooling": list(self.st.pooling), "normalize": self.normalize}

    def tei_model_type(self) -> dict[str, Any]:
        return {"embedding": {"pooling": "+".join(self.st.pooling)}}


class _Run:
    """What the two run kinds share: the run (tformer.runs), its model and text tokenizer."""

    def __init__(self, run, dtype: str, max_input_tokens: int | None) -> None:
        from tformer.nn.model import to_precision

        self.trained, self.objective = run, run.objective
        self.model = run.model if dtype == "fp32" else to_precision(run.model, dtype).eval()
        limit = run.tokenizer.max_length
        if max_input_tokens is not None and max_input_tokens > limit:
            raise ValueError(f"--max-input-tokens: expected at most {limit} (the run's maximum length), "
                             f"got {max_input_tokens}")
        self.max_input_tokens = max_input_tokens or limit
        self.run_limit = limit
        self.tokenizer = run.tokenizer  # thread-safe: counting here while the model thread encodes

    def tokenize(self, texts: list[str], add_special_tokens: bool) -> list[list[dict[str, Any]]]:
        return _tokens(self.tokenizer, texts, add_special_tokens)

    def _items(self, payloads: list, full: list[int], truncate: bool) -> list[Item]:
        # The run cuts at its own max_length (as `tformer predict` / `generate` do); below that,
        # a lower --max-input-tokens can only refuse: a different cut would differ from the CLI.
        _too_long(full, self.max_input_tokens, truncate and self.max_input_tokens == self.run_limit)
        return [Item(min(n, self.run_limit), n, p) for n, p in zip(full, payloads, strict=True)]


class ClassificationModel(_Run):
    kind = "classification"

    @property
    def labels(self) -> list[str]:
        return list(self.trained.labels)

    @property
    def pairs(self) -> bool:
        """Whether the run was trained on text pairs (runs from before this was recorded: yes)."""
        return getattr(getattr(self.objective.source, "data", None), "pairs", True)

    def items(self, records: list[dict[str, str]], truncate: bool) -> list[Item]:
        paired = [i for i, r in enumerate(records) if "text_pair" in r]
        if paired and not self.pairs:
            raise InputRefused(f"input[{paired[0]}].text_pair: this run was trained on single texts "
                               "(no text_pair in its data); send the text alone")
        # Counted as the run encodes them (a pair: "<s> a </s> b </s>", cut longest first), and
        # handed on as far as that cut needs them: the same tokens (Tokenizer.prefixes).
        texts, pairs, full = self.tokenizer.prefixes([r["text"] for r in records],
                                                     [r.get("text_pair") or None for r in records])
        records = [dict(r, text=t, **({"text_pair": p} if p is not None else {}))
                   for r, t, p in zip(records, texts, pairs, strict=True)]
        return self._items(records, full, truncate)

    def run(self, records: list[dict[str, str]], raw: bool = False) -> list[list[float]]:
        """Class probabilities, as `tformer predict` computes them (the objective's predict); with
        ``raw`` (the batch's key: TEI's raw_scores), the logits they come from."""
        out: list[tuple[int, list[float]]] = []
        # Records with and without a pair cannot share a batch (the source encodes one form).
        for paired in (False, True):
            index = [i for i, r in enumerate(records) if bool(r.get("text_pair")) == paired]
            if index:
                chosen = [records[i] for i in index]
                scores = self._logits(chosen) if raw else self.objective.predict(self.model, chosen)
                out += list(zip(index, scores, strict=True))
        return [p for _, p in sorted(out, key=lambda x: x[0])]

    @torch.inference_mode()
    def _logits(self, records: list[dict[str, str]]) -> list[list[float]]:
        batch = self.objective.collate(self.objective.encode(records))
        return self.model(batch.input_ids, batch.attention_mask, batch.token_type_ids).logits.float().tolist()

    def warm_up(self) -> None:
        self.run([item.payload for item in self.items([{"text": "warm up"}], True)])

    def describe(self) -> dict[str, Any]:
        return {"labels": self.labels}

    def tei_model_type(self) -> dict[str, Any]:
        return {"classifier": {"id2label": {str(i): name for i, name in enumerate(self.labels)}}}


class Seq2SeqModel(_Run):
    kind = "seq2seq"

    def items(self, texts: list[str], truncate: bool) -> list[Item]:
        texts, _, pieces = self.tokenizer.prefixes(texts, specials=False)  # as the run's source reads them
        return self._items(texts, [plus(n, 1) for n in pieces], truncate)  # + the source's EOS

    def output_tokens(self, outputs: list[str]) -> list[int]:
        """Tokens of each generated text, without its end (re-tokenized: what usage and TGI's
        details count)."""
        return [len(e.ids) for e in self.tokenizer.backend.encode_batch(outputs, add_special_tokens=False)]

    @property
    def max_new_tokens(self) -> int:
        """What `tformer generate` generates at most: the run's max_length."""
        return self.trained.max_new_tokens

    @property
    def max_target_tokens(self) -> int:
        """The most tokens the decoder's positions allow."""
        return self.model.config.max_len

    @torch.no_grad()
    def run(self, texts: list[str], key: tuple[int, int, float]) -> list[str]:
        """Greedy or beam search, as `tformer generate` runs it (the objective's generate), with
        max_new_tokens for its limit. ``key``: (beam_size, max_new_tokens, length_penalty),
        shared by the batch."""
        beam_size, max_new_tokens, length_penalty = key
        return self.objective.generate(self.model, texts, beam_size, length_penalty, max_len=max_new_tokens)

    def warm_up(self) -> None:
        self.run([item.payload for item in self.items(["warm up"], True)], (1, 2, 1.0))

    def describe(self) -> dict[str, Any]:
        return {"max_new_tokens": self.max_new_tokens}

    def tei_model_type(self) -> dict[str, Any]:
        return {"seq2seq": {}}


Served = EmbeddingModel | ClassificationModel | Seq2SeqModel


def load_served(path: str | Path, dtype: str = "fp32", max_input_tokens: int | None = None,
                device: torch.device | str = "cpu") -> Served:
    """Whatever the directory holds: a sentence-transformers / BERT directory (an embedding run
    is one too, once trained), or a classification / seq2seq run of `tformer train --data`;
    its model on `device` (tformer.devices)."""
    from tformer.devices import resolve_device

    path = Path(path)
    device = resolve_device(device)
    if not path.is_dir():
        raise FileNotFoundError(f"MODEL_DIR_OR_RUN: no such directory {path}")
    is_run = (path / "checkpoints").is_dir()
    if not is_run or (path / "modules.json").is_file():
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            return EmbeddingModel(path, dtype, max_input_tokens, device)
    from tformer.runs import ClassificationRun, Seq2SeqRun, load_run

    run = load_run(path, device=device)
    if run.config.data is None:
        raise ValueError(f"MODEL_DIR_OR_RUN: {path} is a synthetic-task run ({run.config.task}); "
                         "serve a run on your own data or a BERT-format directory")
    served = {ClassificationRun: ClassificationModel, Seq2SeqRun: Seq2SeqModel}.get(type(run))
    if served is None:
        raise ValueError(f"MODEL_DIR_OR_RUN: {path} is an embedding run without its sentence-transformers "
                         "files (modules.json): it has not finished training")
    return served(run, dtype, max_input_tokens)


def _too_long(lengths: list[int], limit: int | None, truncate: bool, positions: list[int] | None = None
              ) -> list[int]:
    """Indices of inputs over the limit (or read only to their reach: an ``Unread``); raises
    TooLong for the first when not truncating. lengths[i]: an ``AtLeast`` (printed "n or
    more") for a text counted only as far as its cut needed; positions[i]: its index in the
    request."""
    long = [i for i, n in enumerate(lengths) if is_cut(n, limit)]
    if long and not truncate:
        i = long[0]
        n, where = lengths[i], f"input[{positions[i] if positions else i}]"
        if isinstance(n, Unread) and n <= limit:  # its count does not say it
            raise TooLong(f"{where}: {n.lost(limit)} (send truncate: true, or shorten it)")
        raise TooLong(f"{where}: expected at most {limit} tokens, got {n} (send truncate: true, or "
                      "shorten it)")
    return long


# /tokenize's answer is ~70 bytes of JSON a token (and ~10x that as Python objects before): a
# request's tokens in all are capped, so that a 16 MB body cannot ask for gigabytes.
TOKENIZE_MAX_TOKENS = 1 << 17


def _tokens(tokenizer, texts: list[str], add_special_tokens: bool) -> list[list[dict[str, Any]]]:
    """TEI's /tokenize: each text's tokens with their character offsets, no truncation; more
    than ``TOKENIZE_MAX_TOKENS`` in all is refused (413)."""
    lowered = [t.lower() for t in texts] if tokenizer.lowercase else texts
    encodings = tokenizer.backend.encode_batch(lowered, add_special_tokens=add_special_tokens)
    total = sum(len(e.ids) for e in encodings)
    if total > TOKENIZE_MAX_TOKENS:
        raise TooLong(f"inputs: expected at most {TOKENIZE_MAX_TOKENS} tokens to list in all, got {total} "
                      "(send fewer or shorter texts)")
    out = []
    for text, e in zip(texts, encodings, strict=True):
        out.append([{"id": i, "text": tok if special else text[a:b], "special": bool(special),
                     "start": None if special else a, "stop": None if special else b}
                    for i, tok, (a, b), special in zip(e.ids, e.tokens, e.offsets, e.special_tokens_mask,
                                                       strict=True)])
    return out
