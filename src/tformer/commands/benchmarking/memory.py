"""Peak memory of one encoder layer at long sequences: run by `tformer bench` in a fresh process.

    python -m tformer.commands.benchmarking.memory --lengths 1024 4096 8192 16384

Prints one JSON line per (contender, length): peak RSS growth in MiB and the time of one call.
Peak RSS is reset before each call through /proc/self/clear_refs (Linux), so one process measures
every length; freed memory is handed back to the OS first (malloc_trim), so reuse cannot hide growth.
"""

from __future__ import annotations

import argparse
import ctypes
import gc
import json
import time

import torch

from tformer.commands.benchmarking import models as M
from tformer.nn.model import Encoder

# torch.nn's layer materialises the (H, S, S) scores (its native attention does not use the fused
# kernel): at 16384 tokens that is 4 GiB, twice. Measured only when the machine has room for it.
NN_BYTES_PER_SCORE = 2 * 4


def _status_mib(key: str) -> float:
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith(key):
                return int(line.split()[1]) / 1024
    raise KeyError(key)


def _reset_peak() -> float:
    """Return freed memory to the OS, reset the peak, and return the current RSS (MiB)."""
    gc.collect()
    try:
        ctypes.CDLL("libc.so.6").malloc_trim(0)
    except OSError:
        pass
    with open("/proc/self/clear_refs", "w") as f:
        f.write("5")
    return _status_mib("VmRSS")


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--lengths", type=int, nargs="+", required=True)
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--quick", action="store_true")
    args = p.parse_args()
    torch.set_num_threads(args.threads)
    # One BERT-style layer (so HF can load it), and the same layer in an embeddings-input stack.
    full = Encoder(M.bert_config("small", args.quick).replace(n_layers=1, max_len=max(args.lengths)))
    config = full.config.replace(vocab_size=None, positional="none", type_vocab_size=0,
                                 embedding_norm=False)
    enc = Encoder(config).eval()
    enc.load_state_dict({k: v for k, v in full.state_dict().items() if k.startswith("layers.")})
    layers = {"tformer": lambda x: enc(x).last_hidden_state}
    stack = M.torch_nn_stack(enc).eval()
    layers["torch.nn fast path"] = lambda x: stack(x)
    hf = M.hf_bert_model(full.eval())
    if hf is not None:
        hf_layer = hf.encoder.layer[0].eval()
        layers["HF BertLayer sdpa"] = lambda x: hf_layer(x)
    available = _meminfo_mib("MemAvailable")
    with torch.inference_mode():
        for fn in layers.values():  # first-call costs (kernel JIT, thread pools) are not the layer's
            fn(torch.randn(1, 64, config.d_model))
        for seq in args.lengths:
            for name, fn in layers.items():
                need = config.n_heads * seq * seq * NN_BYTES_PER_SCORE / 2**20
                if name.startswith("torch.nn") and need > available / 2:
                    print(json.dumps({"contender": name, "seq": seq,
                                      "note": f"skipped: would need ~{need / 1024:.0f} GiB"}))
                    continue
                x = torch.randn(1, seq, config.d_model)
                before = _reset_peak()
                start = time.perf_counter()
                y = fn(x)
                seconds = time.perf_counter() - start
                peak = _status_mib("VmHWM") - before
                del y, x
                print(json.dumps({"contender": name, "seq": seq, "peak_mib": round(peak, 1),
                                  "seconds": seconds}), flush=True)


def _meminfo_mib(key: str) -> float:
    with open("/proc/meminfo") as f:
        for line in f:
            if line.startswith(key):
                return int(line.split()[1]) / 1024
    return float("inf")


if __name__ == "__main__":
    main()
