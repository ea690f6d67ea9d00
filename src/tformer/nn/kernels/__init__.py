"""Which kernel computes a step: the choice, made here, with a one-line reason per condition.

The modules (attention.py, feedforward.py, layers.py, model.py) say *what* is computed; they
call this package for *how*. Every fast kernel computes the plain kernel's numbers, in the same
order (dropout draws included), and tests/kernels/test_kernels.py proves each equal to the plain one
(float32 <= 1e-5, float64 <= 1e-10). ``with kernels.readable():`` runs the plain kernels only:
F.linear, an explicit softmax for attention, and padded execution.

Where the time goes, and what the choices here do about it (profiles in benchmarks/README.md):
- Matrix multiplies are ~80% of an encoder layer. oneDNN's ``_linear_pointwise`` runs them,
  and without autograd fuses the bias and the activation into the multiply (no separate
  activation buffer: one pass less over memory). Fusing the residual add too bought nothing
  measurable (paired, same run, AVX2 EPYC: dense-base 0.995x, train-base 0.98x with it off,
  both inside the noise), so the layers add it themselves, as the NumPy mirror does.
- Padded batches: the position-wise work (projections, FFN, norms) can run on the real tokens
  only, packed as (N, D), with attention once per group of equal-length sequences
  (``Encoder.forward`` chooses this through ``why_not_packed``); under autograd, once per
  bucket of groups padded to its longest where a call costs more than the padding
  (``attention_call_scores``, ``tformer.nn.masks.Packing.buckets``).

Shape legend: B batch, S length, N real tokens, D model dim, H heads, Dh head dim.
"""


import importlib

# The package's face: ``kernels.linear(x, layer)``, ``kernels.attention(q, k, v, ...)``. Imported
# on first use, so that the torch-free parts (machine, allocator) load without torch.
_LAZY = {
    **dict.fromkeys(("attention", "attention_as_is", "attention_call_scores", "attention_dtype",
                     "attention_past_and_new",
                     "attention_kernel", "why_not_fused_attention", "why_not_measured_attention",
                     "why_not_packed"),
                    "attention_kernels"),
    **dict.fromkeys(("ACTIVATIONS", "ACTIVATIONS_IN_PLACE", "TRAIN_KERNELS", "infer_kernel",
                     "int8_linear", "int8_prepack", "linear", "linear_weights", "packed_weight",
                     "train_kernel", "why_not_onednn", "why_not_onednn_int8"), "linear_kernels"),
    **dict.fromkeys(("chunked_topk", "topk", "why_not_chunked_topk"), "search_kernels"),
    **dict.fromkeys(("add_norm", "why_not_compiled_add_norm"), "norm_kernels"),
    **dict.fromkeys(("Compiled", "expecting", "why_not_compiled"), "compiling"),
    "readable": "switch",
}


def __getattr__(name: str):
    if name in _LAZY:
        # Kept as a module attribute: later lookups skip this hook and the import machinery
        # (a decoding step makes ~20 of them, ~1.5 us each through importlib).
        value = globals()[name] = getattr(importlib.import_module(f"tformer.nn.kernels.{_LAZY[name]}"), name)
        return value
    raise AttributeError(f"module 'tformer.nn.kernels' has no attribute {name!r}")
