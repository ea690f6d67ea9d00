"""One decoding step with the KV cache, run as it is or compiled: what tformer.nn.generate's
searches call every step.

A step after the first leaves the cache as it is and returns the new positions' keys/values
(``next_hidden``, ``model.decode(..., grow_cache=False, project=False)``), which
``decode_step`` appends in place (tformer.nn.cache.grow): compiled code cannot write into its
input's room, and torch.cat would copy the whole cache every step. The vocabulary projection
and the log-softmax follow outside it, into the search's buffer (``log_probs``).

Shape legend: B' rows still searching (beams), Bm memory rows, S source length, D model dim,
H heads, Dh head dim, V vocab.
"""

from __future__ import annotations

import torch
from torch import Tensor

from tformer.nn import kernels
from tformer.nn.cache import Cache, grow
from tformer.nn.kernels.compiling import Compiled


def decode_step(model, token: Tensor, memory: Tensor, mask: Tensor | None, past: Cache | None,
                dtype: torch.dtype, step: int, out: Tensor | None = None) -> tuple[Tensor, Cache]:
    """One cached step: the next token's log-probabilities in `dtype` and the cache one position
    longer (the first step builds it; later ones append to it in place, into its room). The
    log-probabilities are written into the first rows of ``out`` (a search's own (B', V) buffer,
    reused every step) where its dtype is the model's and `dtype`.

    Shape: token (B', 1); memory (Bm, S, D); mask (Bm, S) -> (B', V), the cache one position longer
    """
    if past is None:
        first = model.decode(token, memory, memory_attention_mask=mask, use_cache=True, project=False)
        h, present = first.decoder_last_hidden_state[:, -1], first.past_key_values
    else:
        h, new = (DECODE_STEP if step >= _COMPILED_FROM else next_hidden)(model, token, memory, mask,
                                                                         past)
        present = grow(past, new)
    return log_probs(h, model.output_weight, dtype, out), present


def log_probs(h: Tensor, weight: Tensor, dtype: torch.dtype, out: Tensor | None = None) -> Tensor:
    """log_softmax(h W^T) in `dtype`, into ``out``'s first rows where dtypes allow.

    Outside the compiled step, into a buffer the search reuses: the step's logits (8 MB at
    256 x 8,000) are then written where the last step's were, still in the caches, and the
    log-softmax and top-k read them there. Against a fresh tensor each step, a beam 4 search of
    the default-size model took 0.90x its time (compiled step; 0.91x eager, greedy 0.95x) and
    0.99x at Marian's size (Intel Xeon, 2 threads, paired). The multiply is MKL's (torch.mm):
    oneDNN's fused linear writes only into a tensor of its own.

    Shape: h (B', D), weight (V, D) -> (B', V)
    """
    if out is not None and h.dtype == weight.dtype == dtype == out.dtype and not h.requires_grad:
        logits = torch.mm(h, weight.t(), out=out[: h.size(0)])
    else:
        logits = kernels.linear_weights(h, weight).to(dtype)  # this step's own tensor (or a copy)
    if logits.device.type == "cpu":  # written over in place: no second (B', V) buffer to fill
        # (256 x 8,000: ~0.8x the time on an Intel Xeon, 2 threads; the same values to the bit)
        return torch.log_softmax(logits, dim=-1, out=logits)
    return logits.log_softmax(dim=-1)


def next_hidden(model, token: Tensor, memory: Tensor, mask: Tensor | None, past: Cache
                ) -> tuple[Tensor, Cache]:
    """A step after the first, the cache left as it is: the decoder's last hidden state and each
    layer's new keys/values, which ``decode_step`` appends. The step that runs eagerly or
    compiled: a compiled step cannot write into its input's room, and torch.cat would copy the
    whole cache every step. (The output projection and log-softmax stay outside: log_probs.)

    Shape: token (B', 1); memory (Bm, S, D); mask (Bm, S) -> (B', D), per layer (B', H, 1, Dh) x 2
    """
    out = model.decode(token, memory, memory_attention_mask=mask, past_key_values=past, use_cache=True,
                       grow_cache=False, project=False)
    return out.decoder_last_hidden_state[:, -1], out.past_key_values


def _step_class(model, token: Tensor, memory: Tensor, mask, past: Cache) -> str:
    """The decoding steps that share a choice: the model's sizes, rows and cached positions
    rounded up to powers of two, and the dtype."""
    c, rows, length = model.config, token.size(0), past[0][0].size(2)
    return (f"d{c.d_model}h{c.n_heads}f{c.d_ff}x{c.decoder_layers}v{c.target_vocab_size}/"
            f"{1 << (rows - 1).bit_length()}x{1 << (length - 1).bit_length()}/"
            f"{str(next(model.parameters()).dtype).removeprefix('torch.')}")


# A step after the first, run as it is or compiled (torch.compile), whichever is measured faster
# here where the work repays a compilation (tformer.nn.kernels.compiling: by default only where the
# caller expects enough of it: the benchmark, a long prediction's later batches): a small step is
# ~100 operator calls that inductor fuses into a few. (Named "decode-hidden": the choices
# remembered for "decode-step", which included the vocabulary projection, do not hold for it.)
DECODE_STEP = Compiled("decode-hidden", next_hidden, shape_class=_step_class)
# From the third step on: the first builds the caches, and the second's one cached position
# would be compiled as a constant (torch.compile specialises sizes of 1) and compiled again.
_COMPILED_FROM = 2


def fresh_inputs(memory: Tensor, mask: Tensor | None) -> tuple[Tensor, Tensor | None]:
    """Copies of the memory and the mask made here, as the rows kept when sources leave are:
    a compiled step then meets one kind of input all search long (a view, or a tensor made
    outside the caller's inference_mode, is another graph; after 8, torch runs it eagerly)."""
    return memory.clone(), None if mask is None else mask.clone()
