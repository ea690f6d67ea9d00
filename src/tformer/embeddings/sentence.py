"""Sentence embeddings: encoder + pooling (+ L2 normalisation), as sentence-transformers does.

    st = SentenceEncoder.from_pretrained(DIR)
    emb = st.encode(["a sentence", "another"])   # np.ndarray (N, D), float32

The pooling comes from the directory (``1_Pooling/config.json``; mean for a plain BERT
directory): ``mean`` and ``mean_sqrt_len`` average over real tokens only, ``max`` takes the
maximum over real tokens, ``cls`` the first position; several modes are concatenated in
sentence-transformers' order. A ``Normalize`` module in ``modules.json`` L2-normalises.
Reimers & Gurevych 2019 (Sentence-BERT) found mean pooling the best default.
"""

from __future__ import annotations

import sys
import time
from collections.abc import Callable, Sequence
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F
from tqdm.auto import tqdm

from tformer.config import POOLING_MODES
from tformer.errors import check_flag
from tformer.formats.model_dir import read_model_dir
from tformer.nn.devices import model_device, resolve_device
from tformer.nn.heads import SentenceModel
from tformer.nn.kernels.compiling import expecting, items_to_come
from tformer.nn.model import Encoder, from_pretrained
from tformer.text.arguments import check_texts, texts_list
from tformer.text.batches import EncoderBatch, encoder_batch
from tformer.text.tokenizer import Tokenizer, load_tokenizer
from tformer.text.windows import rows

# Encode this many batches or more and a progress bar is shown (unless show_progress says).
PROGRESS_MIN_BATCHES = 8
# A text read in windows (tformer.text.windows) is the mean of its windows' vectors (before the
# normalisation, as one longer text's mean pooling would average its tokens).
WINDOW_POOLING = "mean"


def vectors(model: SentenceModel, batch: EncoderBatch, normalize: bool | None = None) -> torch.Tensor:
    """The one forward of a batch of texts (SentenceModel.forward): a vector per text; a long
    text's windows' pooled (``batch.owner``), then normalised as asked or as the model says.

    Shape:
        batch.input_ids (W, S) -> (B, dim)
    """
    if batch.owner is None:
        return model(batch.input_ids, batch.attention_mask, batch.token_type_ids, normalize)
    rows = model(batch.input_ids, batch.attention_mask, batch.token_type_ids, False)  # (W, dim)
    pooled = batch.pooled(rows, WINDOW_POOLING)  # (B, dim)
    if model.normalize if normalize is None else normalize:
        return F.normalize(pooled, p=2.0, dim=-1)
    return pooled


class SentenceEncoder:
    """A SentenceModel (an Encoder, the directory's pooling and normalisation: tformer.nn.heads)
    and its tokenizer, with a batched ``encode``. ``model``: an Encoder, pooled as ``pooling``
    and ``normalize`` say; or a SentenceModel (an embedding run's), which says both itself."""

    def __init__(
        self,
        model: Encoder | SentenceModel,
        tokenizer: Tokenizer,
        pooling: Sequence[str] = ("mean",),
        normalize: bool = False,
    ) -> None:
        if not isinstance(tokenizer, Tokenizer):
            raise TypeError(f"tokenizer: expected a tformer Tokenizer (tformer.load_tokenizer), "
                            f"got {type(tokenizer).__name__}")
        if isinstance(model, SentenceModel):
            self.sentence = model.eval()
        elif isinstance(model, Encoder):
            pooling = (pooling,) if isinstance(pooling, str) else tuple(pooling)  # one mode: its name
            if not pooling:
                raise ValueError(f"pooling: expected at least one of {', '.join(POOLING_MODES)}, got none")
            for mode in pooling:
                if mode not in POOLING_MODES:
                    raise ValueError(f"pooling: expected modes from {', '.join(POOLING_MODES)}, got {mode!r}")
            check_flag("normalize", normalize)
            config = model.config.replace(pooling="+".join(pooling))
            self.sentence = SentenceModel(config, normalize, encoder=model).eval()
        else:
            raise TypeError(f"model: expected an Encoder (tformer.from_pretrained) or a SentenceModel, "
                            f"got {type(model).__name__}")
        self.tokenizer = tokenizer

    def at_most(self, max_length: int | None) -> SentenceEncoder:
        """This encoder with its texts cut at ``max_length`` (None: this one), at most its own."""
        if max_length is None:
            return self
        return SentenceEncoder(self.sentence, self.tokenizer.at_most(max_length))

    def windowed(self, windows: bool = True) -> SentenceEncoder:
        """This encoder reading a text longer than its max length in windows of it, the mean of
        their vectors (tformer.text.windows), or (False) cutting it."""
        return SentenceEncoder(self.sentence, self.tokenizer.windowed(windows))

    @property
    def model(self) -> Encoder:
        """The encoder (its pooling and normalisation: ``pooling``, ``normalize``)."""
        return self.sentence.encoder

    @property
    def pooling(self) -> tuple[str, ...]:
        return self.sentence.pooling

    @property
    def normalize(self) -> bool:
        return self.sentence.normalize

    @classmethod
    def from_pretrained(
        cls,
        directory: str | Path,
        allow_pickle: bool = False,
        max_length: int | None = None,
        dtype: torch.dtype | str | None = None,
        device: torch.device | str = "auto",
    ) -> SentenceEncoder:
        """Model (frozen: ``model.requires_grad_(True)`` to train it), tokenizer, pooling and
        normalisation as the directory describes them.

        ``dtype``: "fp32", "bf16" (bf16 matrix multiplies, fp32 everything else) or "int8"
        (int8 matrix multiplies: see ``tformer.nn.precision.to_precision``), or a torch dtype for
        every parameter. ``device``: where it runs (tformer.nn.devices: auto, cpu, cuda, cuda:N,
        mps); "auto" precision is decided for that device.
        """
        from tformer.nn.precision import resolve_precision

        device = resolve_device(device)
        if isinstance(dtype, str):
            dtype = resolve_precision(dtype, device)[0]
        md = read_model_dir(directory)  # the layout and config.json, read once for all three
        model = from_pretrained(md, allow_pickle=allow_pickle, dtype=dtype).to(device)
        model.requires_grad_(False)  # an inference model: frozen weights run packed (kernels)
        tokenizer = load_tokenizer(md, max_length=max_length)
        return cls(model, tokenizer, md.layout.pooling, md.layout.normalize)

    @property
    def dim(self) -> int:
        return self.sentence.dim

    @torch.inference_mode()
    def encode(
        self,
        texts: str | Sequence[str],
        batch_size: int = 32,
        normalize: bool | None = None,
        show_progress: bool | None = None,
        truncation: bool = True,
        on_long: Callable[[list[int], list[int]], None] | None = None,
    ) -> np.ndarray:
        """Embed texts in batches (similar lengths together), in the input order.

        A blank text (empty or whitespace only) is refused (ValueError naming it), as
        ``run.embed``, ``tformer embed`` and the server refuse it: it has nothing to embed.
        ``normalize``: None follows the directory; ``show_progress``: None shows a bar from
        ``PROGRESS_MIN_BATCHES`` batches on. A long text is read in windows where the tokenizer
        reads them (an embedding run that settled on them: tformer.text.windows; ``windowed``),
        the mean of their vectors. Texts longer than the model reads
        are truncated with one warning (or ``on_long(indices, token counts)`` in its place), or
        raise ValueError (TextTooLong) with ``truncation=False``.

        Shape:
            returns (N, dim) float32, N = len(texts)
        """
        one = isinstance(texts, str)
        texts = texts_list("texts", texts)
        check_texts("texts", texts, one)
        if isinstance(batch_size, bool) or not isinstance(batch_size, int) or batch_size < 1:
            raise ValueError(f"batch_size: expected a positive int, got {batch_size!r}")
        check_flag("normalize", normalize, none=True)  # "no" was truthy: it normalised
        check_flag("show_progress", show_progress, none=True)
        check_flag("truncation", truncation)
        if on_long is not None and not callable(on_long):  # it failed only once a text was long
            raise TypeError(f"on_long: expected a callable (indices, token counts) or None, "
                            f"got {type(on_long).__name__}")
        if len(texts) == 0:
            return np.empty((0, self.dim), dtype=np.float32)
        encoded = self.tokenizer.encode(texts)
        self.tokenizer.check_lengths([e.full for e in encoded], truncation, on_long)  # one warning for all
        # Longest first (a text read in windows: all of them); a batch holds batch_size rows, a
        # window each (tformer.text.windows.rows).
        order = [int(i) for i in np.argsort([-e.tokens for e in encoded], kind="stable")]
        reads = [1 + len(e.rest) for e in encoded]
        n_batches = -(-sum(reads) // batch_size)
        if show_progress is None:
            show_progress = n_batches >= PROGRESS_MIN_BATCHES
        normalize = self.normalize if normalize is None else normalize
        out = np.empty((len(texts), self.dim), dtype=np.float32)
        # Compiled kernels where the eager work left repays them (kernels.compiling.expecting):
        # from the second batch on, the tokens left at the last batch's pace per token (longest
        # first: a text's pace would overstate it), with a caller's texts to come after these
        # (``more_to_come``: `tformer embed` and `index build` encode a chunk at a time).
        tokens = [e.tokens * r for e, r in zip(encoded, reads, strict=True)]
        left, per_token = sum(tokens) + items_to_come() * sum(tokens) / len(texts), 0.0
        with tqdm(total=len(texts), unit="text", disable=not show_progress, file=sys.stderr) as bar:
            start = 0
            while start < len(order):
                idx = rows(order[start:], reads, batch_size)
                batch = encoder_batch([encoded[i] for i in idx], self.tokenizer.pad_id)
                t = time.perf_counter()
                with expecting(per_token * left):
                    out[idx] = self.embed_batch(batch, normalize).numpy()
                done = sum(tokens[i] for i in idx)
                per_token, left = (time.perf_counter() - t) / max(done, 1), left - done
                bar.update(len(idx))
                start += len(idx)
        return out

    @torch.inference_mode()
    def embed_batch(self, batch: EncoderBatch, normalize: bool | None = None) -> torch.Tensor:
        """The pooled (and normalised, as asked or as the directory says) embeddings of one
        padded batch: what ``encode`` runs per batch, and what the server runs.

        Shape:
            batch.input_ids (B, S) -> (B, dim) float32
        """
        batch = batch.to(model_device(self.model))  # to a GPU pinned, without blocking
        emb = vectors(self.sentence, batch, normalize)  # (B, dim)
        return emb.float().cpu()  # pooled in the residual stream's dtype

