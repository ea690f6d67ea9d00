"""The contenders of the peer workloads: tformer and the runtimes people deploy encoders with.

Every contender is built from one random-weight BERT directory (a sentence-transformers layout,
see corpus.py): converted by the benchmark itself, never downloaded. Each is loaded in its own
process (worker.py) and returns a Runner:

- ``forward(ids, mask, types)``: int64 (B, S) arrays -> last hidden state, float32 (B, S, D);
- ``encode(texts)`` (optional): -> L2-normalised mean-pooled embeddings, float32 (N, D). Without
  it the worker encodes as ``SentenceEncoder.encode`` does (``encode_with``).

Each loader imports its runtime itself, so a contender's process loads that runtime alone (torch
stays out of ONNX Runtime's, CTranslate2's and OpenVINO's). Adding a contender is one line in
CONTENDERS. Each sets the thread count its own way
(``threads``); the worker also exports OMP_NUM_THREADS.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from tformer.commands.benchmarking.corpus import quiet_transformers

BATCH_SIZE = 32  # sentence encoding: SentenceEncoder.encode's and sentence-transformers' default
# CTranslate2 uses Intel MKL on Intel CPUs only, unless CT2_USE_MKL=1; packed GEMM is MKL's fast
# path for fixed weights. Set unless the caller's environment says otherwise.
CT2_ENV = {"CT2_USE_MKL": "1", "CT2_USE_EXPERIMENTAL_PACKED_GEMM": "1"}


@dataclass
class Runner:
    forward: Callable[[np.ndarray, np.ndarray, np.ndarray], np.ndarray]
    encode: Callable[[list[str]], np.ndarray] | None = None
    note: str = ""  # what the table should say about how it ran (precision chosen, backend)


@dataclass(frozen=True)
class Paths:
    model: Path  # the BERT directory (sentence-transformers layout)
    onnx: Path  # torch.onnx.export of transformers' BertModel from that directory
    work: Path  # a scratch directory for converted models


@dataclass(frozen=True)
class Contender:
    name: str
    load: Callable[[Paths, int], Runner]
    package: str | None = None  # the module that must be importable (None: torch only)
    precision: str = "fp32"  # fp32: checked by max abs difference; bf16/int8: by cosine only
    tasks: tuple[str, ...] = ("sentences", "batch")
    env: dict[str, str] = field(default_factory=dict)


# tformer and torch ------------------------------------------------------------------------------
def _tformer(dtype: str | None, skip_padding: bool | None = None) -> Callable[[Paths, int], Runner]:
    """tformer's SentenceEncoder (``dtype`` as SentenceEncoder.from_pretrained takes it; None = fp32):
    encode() is the product path; forward() is the Encoder's DEFAULT forward unless skip_padding."""

    def load(paths: Paths, threads: int) -> Runner:
        # each loader imports its own runtime: a contender's process loads no other (module doc)
        import torch

        from tformer.commands.benchmarking import models as M
        from tformer.embeddings.sentence import SentenceEncoder

        torch.set_num_threads(threads)
        # The CPU suite: on a machine with a GPU, "auto" would time the GPU against CPU peers.
        kwargs = {"device": "cpu"} if dtype is None else {"dtype": dtype, "device": "cpu"}
        try:
            st = SentenceEncoder.from_pretrained(paths.model, **kwargs)
        except (TypeError, ValueError, RuntimeError, AttributeError) as e:
            # a dtype this tformer does not know (an older checkout): say why, skip the row
            reason = f"{type(e).__name__}: {str(e).splitlines()[0][:80]}" if str(e) else type(e).__name__
            raise Unavailable(f"tformer has no dtype={dtype!r} mode yet ({reason})") from e
        run = M.tformer_padded(st.model, skip_padding)

        def forward(ids, mask, types):
            with torch.inference_mode():
                t = [torch.from_numpy(a) for a in (ids, mask, types)]
                return run(t[0], t[1].bool(), t[2]).float().numpy()

        return Runner(forward, lambda texts: st.encode(texts, batch_size=BATCH_SIZE, show_progress=False))

    return load


def _torch_nn(paths: Paths, threads: int) -> Runner:
    # its own runtime only, in its own process (module docstring)
    import torch

    from tformer.commands.benchmarking import models as M
    from tformer.nn.model import from_pretrained

    torch.set_num_threads(threads)
    enc = from_pretrained(paths.model)
    run = M.torch_nn(enc, M.torch_nn_stack(enc))

    def forward(ids, mask, types):
        with torch.inference_mode():
            return run(torch.from_numpy(ids), torch.from_numpy(mask).bool()).numpy()

    return Runner(forward)


def _hf_bert(paths: Paths, threads: int) -> Runner:
    # transformers is optional (tformer[bench]); torch only in the processes that use it
    import torch
    from transformers import BertModel

    torch.set_num_threads(threads)
    model = BertModel.from_pretrained(str(paths.model), attn_implementation="sdpa").eval()

    def forward(ids, mask, types):
        with torch.inference_mode():
            t = [torch.from_numpy(a) for a in (ids, mask, types)]
            return model(input_ids=t[0], attention_mask=t[1], token_type_ids=t[2]).last_hidden_state.numpy()

    return Runner(forward)


def _sentence_transformers(paths: Paths, threads: int) -> Runner:
    # sentence-transformers is optional (tformer[bench]); torch only where it is used
    import torch
    from sentence_transformers import SentenceTransformer

    torch.set_num_threads(threads)
    model = SentenceTransformer(str(paths.model), device="cpu")

    def encode(texts):
        return model.encode(texts, batch_size=BATCH_SIZE, show_progress_bar=False, convert_to_numpy=True)

    return Runner(_no_forward, encode)


def _no_forward(ids, mask, types):
    raise NotImplementedError


# ONNX Runtime -------------------------------------------------------------------------------------
def _ort(variant: str) -> Callable[[Paths, int], Runner]:
    """plain: the export as is; optimized: onnxruntime.transformers.optimizer's BERT fusions
    (attention, embedding + LayerNorm, skip + LayerNorm, bias + GELU); int8: quantize_dynamic with
    per-channel int8 weights (per-tensor is far worse on small BERTs) of the plain export (the
    quantizer cannot type the fused graph's ops)."""

    def load(paths: Paths, threads: int) -> Runner:
        import onnxruntime as ort  # optional (tformer[bench])

        path = paths.onnx
        if variant == "optimized":
            import json

            from onnxruntime.transformers import optimizer

            config = json.loads((paths.model / "config.json").read_text())
            model = optimizer.optimize_model(str(path), model_type="bert",
                                             num_heads=config["num_attention_heads"],
                                             hidden_size=config["hidden_size"])
            path = paths.work / "ort-optimized.onnx"
            model.save_model_to_file(str(path))
        elif variant == "int8":
            from onnxruntime.quantization import QuantType, quantize_dynamic

            path = paths.work / "ort-int8.onnx"
            quantize_dynamic(str(paths.onnx), str(path), per_channel=True, weight_type=QuantType.QInt8)
        options = ort.SessionOptions()
        options.intra_op_num_threads, options.inter_op_num_threads = threads, 1
        session = ort.InferenceSession(str(path), options, providers=["CPUExecutionProvider"])

        def forward(ids, mask, types):
            feed = {"input_ids": ids, "attention_mask": mask, "token_type_ids": types}
            return session.run(None, feed)[0]

        return Runner(forward)

    return load


# CTranslate2 --------------------------------------------------------------------------------------
def _ct2(compute_type: str) -> Callable[[Paths, int], Runner]:
    """ctranslate2.Encoder from TransformersConverter's conversion (quantized at conversion for
    int8); it takes unpadded token lists and skips padding itself."""

    def load(paths: Paths, threads: int) -> Runner:
        import ctranslate2  # optional (tformer[bench])

        out = paths.work / f"ct2-{compute_type}"
        quantization = None if compute_type == "float32" else compute_type
        ctranslate2.converters.TransformersConverter(str(paths.model)).convert(
            str(out), quantization=quantization, force=True)
        encoder = ctranslate2.Encoder(str(out), device="cpu", compute_type=compute_type,
                                      intra_threads=threads, inter_threads=1)

        def forward(ids, mask, types):
            lengths = mask.sum(axis=1)
            tokens = [row[:n].tolist() for row, n in zip(ids, lengths, strict=True)]
            type_ids = [row[:n].tolist() for row, n in zip(types, lengths, strict=True)]
            h = np.asarray(encoder.forward_batch(tokens, token_type_ids=type_ids).last_hidden_state)
            out = np.zeros((*ids.shape, h.shape[-1]), dtype=np.float32)  # back to (B, S, D)
            out[:, : h.shape[1]] = h
            return out

        return Runner(forward)

    return load


# OpenVINO -----------------------------------------------------------------------------------------
def _openvino(precision: str | None) -> Callable[[Paths, int], Runner]:
    """OpenVINO's CPU plugin on the ONNX export. It silently runs bf16 where the CPU has bf16
    instructions, so f32 is asked for explicitly; None = its default (bf16 or f32, reported)."""

    def load(paths: Paths, threads: int) -> Runner:
        import openvino as ov  # optional (tformer[bench])

        core = ov.Core()
        config = {"INFERENCE_NUM_THREADS": threads, "NUM_STREAMS": 1}
        if precision:
            config["INFERENCE_PRECISION_HINT"] = precision
        compiled = core.compile_model(core.read_model(str(paths.onnx)), "CPU", config)
        chosen = compiled.get_property("INFERENCE_PRECISION_HINT").to_string()  # "f32", "bf16"
        if precision is None and chosen == "f32":
            raise Unavailable("OpenVINO's default is f32 on this CPU (no bf16 instructions): "
                              "the same as the OpenVINO f32 row")
        request = compiled.create_infer_request()

        def forward(ids, mask, types):
            feed = {"input_ids": ids, "attention_mask": mask, "token_type_ids": types}
            return request.infer(feed)[0].copy()

        return Runner(forward, note=f"runs {chosen}")

    return load


class Unavailable(Exception):
    """The contender cannot run here (missing mode, or it would duplicate another row)."""


# The contenders, in table order; the first is the reference the others are checked against.
CONTENDERS = [
    Contender("tformer fp32", _tformer(None)),
    Contender("tformer fp32 (padded: skip_padding=False)", _tformer(None, skip_padding=False),
              tasks=("batch",)),
    Contender("tformer bf16", _tformer("bf16"), precision="bf16"),
    # the same with its compiled kernels measured (tformer.nn.kernels.compiling; a job this short
    # would not repay the compilation by default): the first call, timed apart, compiles
    Contender("tformer bf16, compiled kernels", _tformer("bf16"), precision="bf16",
              env={"TFORMER_COMPILE": "1"}),
    Contender("tformer int8", _tformer("int8"), precision="int8"),
    Contender("torch.nn fast path (nested)", _torch_nn, tasks=("batch",)),
    Contender("HF BertModel sdpa", _hf_bert, "transformers", tasks=("batch",)),
    Contender("sentence-transformers", _sentence_transformers, "sentence_transformers", tasks=("sentences",)),
    Contender("ONNX Runtime", _ort("plain"), "onnxruntime"),
    Contender("ONNX Runtime + transformers optimizer", _ort("optimized"), "onnxruntime"),
    Contender("ONNX Runtime int8 (per-channel)", _ort("int8"), "onnxruntime", precision="int8"),
    Contender("CTranslate2 fp32", _ct2("float32"), "ctranslate2", env=CT2_ENV),
    Contender("CTranslate2 int8", _ct2("int8"), "ctranslate2", precision="int8", env=CT2_ENV),
    Contender("OpenVINO f32", _openvino("f32"), "openvino"),
    Contender("OpenVINO default precision", _openvino(None), "openvino", precision="bf16"),
]
BY_NAME = {c.name: c for c in CONTENDERS}


def encode_with(forward: Callable, tokenizer, texts: list[str]) -> np.ndarray:
    """What SentenceEncoder.encode does, around any forward: longest texts first, batches of 32
    padded to their longest, mean pooling over real tokens, L2 normalisation; input order out."""
    lengths = tokenizer.lengths(texts)
    order = np.argsort([-n for n in lengths], kind="stable")
    out = None
    for start in range(0, len(texts), BATCH_SIZE):
        idx = order[start : start + BATCH_SIZE]
        batch = tokenizer([texts[i] for i in idx], return_tensors="np")
        mask = batch["attention_mask"]
        h = forward(batch["input_ids"], mask, batch["token_type_ids"])  # (b, S, D)
        real = mask[:, :, None].astype(np.float32)  # (b, S, 1)
        emb = (h * real).sum(axis=1) / np.maximum(real.sum(axis=1), 1e-9)  # (b, D)
        emb /= np.maximum(np.linalg.norm(emb, axis=-1, keepdims=True), 1e-12)
        if out is None:
            out = np.empty((len(texts), emb.shape[-1]), dtype=np.float32)
        out[idx] = emb
    return out


def onnx_export(model_dir: Path, out: Path) -> Path:
    """transformers' BertModel (eager attention: the exporter traces it cleanly) to ONNX with
    dynamic batch and sequence axes; inputs input_ids, attention_mask, token_type_ids."""
    # transformers is optional (tformer[bench]); torch only in the process that exports
    import warnings

    import torch
    from transformers import BertModel

    class LastHidden(torch.nn.Module):
        def __init__(self, bert):
            super().__init__()
            self.bert = bert

        def forward(self, input_ids, attention_mask, token_type_ids):
            return self.bert(input_ids=input_ids, attention_mask=attention_mask,
                             token_type_ids=token_type_ids).last_hidden_state

    quiet_transformers()
    bert = BertModel.from_pretrained(str(model_dir), attn_implementation="eager").eval()
    ids = torch.ones(2, 8, dtype=torch.long)
    mask = torch.ones(2, 8, dtype=torch.long)
    mask[1, 5:] = 0  # a padded row, so the mask is not folded away
    names = ["input_ids", "attention_mask", "token_type_ids"]
    axes = {n: {0: "batch", 1: "seq"} for n in [*names, "last_hidden_state"]}
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        torch.onnx.export(LastHidden(bert), (ids, mask, torch.zeros_like(ids)), str(out),
                          input_names=names, output_names=["last_hidden_state"], dynamic_axes=axes,
                          opset_version=17, dynamo=False)
    return out
