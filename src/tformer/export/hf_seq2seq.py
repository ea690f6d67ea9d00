"""A Seq2SeqTransformer as a transformers encoder-decoder directory (AutoModelForSeq2SeqLM).

Two HF classes together express tformer's encoder-decoder with sinusoidal positions and
the sqrt(D) embedding scale (Vaswani et al. 2017, §3.4-3.5):

    post-norm, no final norm          MarianMTModel     (Junczys-Dowmunt et al. 2018)
    pre-norm, final norm on each stack PegasusForConditionalGeneration (Zhang et al. 2020)

Both compute their sinusoids at load time with the sin features in the first half of D and
the cos features in the second (tformer interleaves them: 2i sin, 2i+1 cos). The network is
the same in any basis of the residual stream, so the export permutes that basis
(``residual_permutation``) in every tensor that reads or writes it; the table says which axis.
Configs neither class can express are refused naming the field (``check_expressible``).

The conversion is a table of (their key, our key, part of a fused tensor, residual axes)
rows, and ``verify`` checks that the key sets match; then the files are loaded in transformers,
which must give tformer's logits on a padded batch (``check_in_transformers``), before anything
is written.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

import torch
from safetensors.torch import save as st_save
from torch import Tensor

from tformer.config import TransformerConfig
from tformer.export.export_dir import publish_export
from tformer.export.hf_check import loaded_in_transformers, max_difference
from tformer.export.hf_classifier import tokenizer_files
from tformer.export.model_card import Card, render
from tformer.formats.hf_bert import TO_HF_ACTIVATION, WEIGHTS_FILE
from tformer.nn.positional import sinusoidal_table
from tformer.storage.files import json_bytes

TOLERANCE = 1e-4  # max abs difference of logits, float32, tformer vs transformers (|logits| ~ 10s)
# (their key, our key, part, residual axes). part: (i, n) takes the i-th of n equal row blocks
# of a fused projection (qkv_proj: q, k, v; kv_proj: k, v); residual axes are permuted.
Row = tuple[str, str, tuple[int, int] | None, tuple[int, ...]]


def _attention(theirs: str, ours: str, fused: str) -> list[Row]:
    names = ("q", "k", "v") if fused == "qkv_proj" else ("k", "v")
    rows: list[Row] = []
    for i, name in enumerate(names):
        rows += [(f"{theirs}.{name}_proj.weight", f"{ours}.{fused}.weight", (i, len(names)), (1,)),
                 (f"{theirs}.{name}_proj.bias", f"{ours}.{fused}.bias", (i, len(names)), ())]
    if fused == "kv_proj":
        rows += [(f"{theirs}.q_proj.weight", f"{ours}.q_proj.weight", None, (1,)),
                 (f"{theirs}.q_proj.bias", f"{ours}.q_proj.bias", None, ())]
    rows += [(f"{theirs}.out_proj.weight", f"{ours}.out_proj.weight", None, (0,)),
             (f"{theirs}.out_proj.bias", f"{ours}.out_proj.bias", None, (0,))]
    return rows


def _norm(theirs: str, ours: str) -> list[Row]:
    return [(f"{theirs}.weight", f"{ours}.weight", None, (0,)),
            (f"{theirs}.bias", f"{ours}.bias", None, (0,))]


def _ffn(theirs: str, ours: str) -> list[Row]:
    return [(f"{theirs}.fc1.weight", f"{ours}.ffn.up.weight", None, (1,)),
            (f"{theirs}.fc1.bias", f"{ours}.ffn.up.bias", None, ()),
            (f"{theirs}.fc2.weight", f"{ours}.ffn.down.weight", None, (0,)),
            (f"{theirs}.fc2.bias", f"{ours}.ffn.down.bias", None, (0,))]


def key_table(config: TransformerConfig) -> list[Row]:
    """Every tensor of the HF model, and where it comes from in tformer's state dict."""
    rows: list[Row] = [(f"model.{name}.weight", "src_emb.weight", None, (1,))
                       for name in ("shared", "encoder.embed_tokens", "decoder.embed_tokens")]
    for i in range(config.n_layers):
        t, o = f"model.encoder.layers.{i}", f"encoder.layers.{i}"
        rows += _attention(f"{t}.self_attn", f"{o}.self_attn", "qkv_proj")
        rows += _norm(f"{t}.self_attn_layer_norm", f"{o}.attn_norm")
        rows += _ffn(t, o) + _norm(f"{t}.final_layer_norm", f"{o}.ffn_norm")
    for i in range(config.decoder_layers):
        t, o = f"model.decoder.layers.{i}", f"decoder.layers.{i}"
        rows += _attention(f"{t}.self_attn", f"{o}.self_attn", "qkv_proj")
        rows += _norm(f"{t}.self_attn_layer_norm", f"{o}.self_attn_norm")
        rows += _attention(f"{t}.encoder_attn", f"{o}.cross_attn", "kv_proj")
        rows += _norm(f"{t}.encoder_attn_layer_norm", f"{o}.cross_attn_norm")
        rows += _ffn(t, o) + _norm(f"{t}.final_layer_norm", f"{o}.ffn_norm")
    if config.final_norm:
        rows += _norm("model.encoder.layer_norm", "encoder.final_norm")
        rows += _norm("model.decoder.layer_norm", "decoder.final_norm")
    rows.append(("lm_head.weight", "src_emb.weight" if config.tie_output else "lm_head.weight", None, (1,)))
    return rows


def architecture(config: TransformerConfig) -> str:
    return "PegasusForConditionalGeneration" if config.norm_first else "MarianMTModel"


def check_expressible(config: TransformerConfig) -> None:
    """Refuse, naming the field, a config that neither Marian nor Pegasus can express."""
    needs = {
        "positional": (config.positional == "sinusoidal", "'sinusoidal'"),
        "final_norm": (config.final_norm == config.norm_first,
                       f"{config.norm_first} with norm_first={config.norm_first} (Marian: post-norm, no "
                       "final norm; Pegasus: pre-norm with one)"),
        "tgt_vocab_size": (config.tgt_vocab_size in (None, config.vocab_size),
                           "None (one shared vocabulary)"),
        "bias": (config.bias, "True"),
        "layer_norm_eps": (config.layer_norm_eps == 1e-5, "1e-05 (transformers' LayerNorm default)"),
        "activation": (config.activation in TO_HF_ACTIVATION, f"one of {', '.join(TO_HF_ACTIVATION)}"),
        "vocab_size": (config.vocab_size is not None, "set (token ids)"),
    }
    for name, (ok, want) in needs.items():
        if not ok:
            raise ValueError(f"config.{name}: a transformers seq2seq export needs {want}, "
                             f"got {getattr(config, name)!r}")


def residual_permutation(d_model: int) -> Tensor:
    """p with hf_vector = tformer_vector[p]: tformer's sin features (even indices) first,
    then its cos features (odd indices), the layout of Marian's and Pegasus' sinusoids."""
    return torch.cat([torch.arange(0, d_model, 2), torch.arange(1, d_model, 2)])


def to_hf(state: Mapping[str, Tensor], config: TransformerConfig) -> dict[str, Tensor]:
    """tformer Seq2SeqTransformer state dict -> the HF model's (see the module doc)."""
    p = residual_permutation(config.d_model)
    out = {}
    for theirs, ours, part, axes in key_table(config):
        t = state[ours]
        if part is not None:
            i, n = part
            t = t.chunk(n, dim=0)[i]
        for axis in axes:
            t = t.index_select(axis, p)
        out[theirs] = t.detach().contiguous().clone()
    out["final_logits_bias"] = torch.zeros(1, config.vocab_size)
    # The sinusoids the HF classes compute at load time, written too so that every key loads.
    table = sinusoidal_table(config.max_len, config.d_model).float()[:, p].contiguous()
    for stack in ("encoder", "decoder"):
        out[f"model.{stack}.embed_positions.weight"] = table.clone()
    return out


def verify(state: Mapping[str, Tensor], config: TransformerConfig) -> None:
    """The table covers tformer's state dict exactly: no tensor left behind, none invented."""
    used = {ours for _, ours, _, _ in key_table(config)}
    if used != set(state):
        raise ValueError(f"state dict: expected keys {sorted(used - set(state))[:3]} and no others, "
                         f"got extra {sorted(set(state) - used)[:3]}")


def config_to_hf(config: TransformerConfig, pad_id: int, bos_id: int, eos_id: int) -> dict[str, Any]:
    check_expressible(config)
    arch = architecture(config)
    return {
        "architectures": [arch],
        "model_type": "pegasus" if config.norm_first else "marian",
        "vocab_size": config.vocab_size,
        "decoder_vocab_size": config.vocab_size,
        "d_model": config.d_model,
        "encoder_layers": config.n_layers,
        "decoder_layers": config.decoder_layers,
        "encoder_attention_heads": config.n_heads,
        "decoder_attention_heads": config.n_heads,
        "encoder_ffn_dim": config.d_ff,
        "decoder_ffn_dim": config.d_ff,
        "activation_function": TO_HF_ACTIVATION[config.activation],
        "dropout": config.dropout,
        "attention_dropout": config.attention_dropout,
        "activation_dropout": 0.0,
        "max_position_embeddings": config.max_len,
        "scale_embedding": config.scale_embeddings,
        "share_encoder_decoder_embeddings": True,
        "tie_word_embeddings": config.tie_output,
        "pad_token_id": pad_id,
        "bos_token_id": bos_id,
        "eos_token_id": eos_id,
        "decoder_start_token_id": bos_id,  # tformer's decoder starts from <s>
        "forced_eos_token_id": None,
        "is_encoder_decoder": True,
        "torch_dtype": "float32",
    }


def generation_config(pad_id: int, bos_id: int, eos_id: int, max_new_tokens: int) -> dict[str, Any]:
    """Greedy decoding as tformer's: start at <s>, stop at </s> or after max_new_tokens."""
    return {"decoder_start_token_id": bos_id, "bos_token_id": bos_id, "eos_token_id": eos_id,
            "pad_token_id": pad_id, "forced_eos_token_id": None, "num_beams": 1, "do_sample": False,
            "max_length": max_new_tokens + 1}  # + the start token, which HF counts


USAGE = """
from transformers import AutoModelForSeq2SeqLM, AutoTokenizer
tokenizer = AutoTokenizer.from_pretrained("DIR")
model = AutoModelForSeq2SeqLM.from_pretrained("DIR")
ids = model.generate(**tokenizer(["some text"], truncation=True, return_tensors="pt"))
print(tokenizer.batch_decode(ids, skip_special_tokens=True))
"""


def seq2seq_files(model, tokenizer, max_length: int, card: Card) -> dict[str, bytes]:
    """The files of the HF directory for ``model`` (a Seq2SeqTransformer) and the run's
    ``tokenizer`` backend (sources are encoded as "$A </s>", cut to max_length)."""
    config = model.config
    ids = {name: tokenizer.token_to_id(token)
           for name, token in (("pad_id", "<pad>"), ("bos_id", "<s>"), ("eos_id", "</s>"))}
    missing = [name for name, i in ids.items() if i is None]
    if missing:
        raise ValueError(f"tokenizer: expected the tokens <pad>, <s> and </s>, got none for {missing}")
    hf_config = config_to_hf(config, **ids)
    state = model.state_dict()
    verify(state, config)
    files = {
        "config.json": json_bytes(hf_config),
        "generation_config.json": json_bytes(generation_config(**ids, max_new_tokens=max_length)),
        WEIGHTS_FILE: st_save(to_hf(state, config), metadata={"format": "pt"}),
    }
    files.update(tokenizer_files(tokenizer, max_length, template="$A </s>"))
    # No pipeline_tag: transformers 5 has no pipeline for an encoder-decoder's text (text2text-generation,
    # translation and summarization are gone from its tasks; the Hub still lists them): the card
    # shows generate() instead, which every version runs.
    files["README.md"] = render(card, f"a transformers {architecture(config)} directory", USAGE,
                                library_name="transformers")
    return files


def check_in_transformers(files: Mapping[str, bytes], model, pad_id: int, bos_id: int, eos_id: int) -> float:
    """The max abs difference of logits between ``files`` loaded by transformers and ``model``
    (teacher-forced, on a padded batch of sources); raises above TOLERANCE."""
    c, name = model.config, architecture(model.config)
    g = torch.Generator().manual_seed(0)
    b, s, t = 3, min(11, c.max_len), min(6, c.max_len)
    src = torch.randint(0, c.vocab_size, (b, s), generator=g)  # (B, S): tokens, </s>, padding
    lengths = torch.clamp(s - 4 * torch.arange(b), min=1)  # ragged padding
    mask = (torch.arange(s)[None, :] < lengths[:, None]).long()  # (B, S)
    src = src.masked_fill(mask == 0, pad_id)
    src[torch.arange(b), lengths - 1] = eos_id
    tgt = torch.randint(0, c.target_vocab_size, (b, t), generator=g)  # (B, T)
    tgt[:, 0] = bos_id
    training = model.training
    model.eval()
    try:
        with loaded_in_transformers(files, "AutoModelForSeq2SeqLM", name) as (theirs, _), torch.no_grad():
            got = theirs(input_ids=src, attention_mask=mask, decoder_input_ids=tgt).logits  # (B, T, V)
            ours = model(src, tgt, mask).logits
    finally:
        model.train(training)
    return max_difference(got, ours, "logits", name, TOLERANCE)


def export_seq2seq(out: str | Path, model, tokenizer, max_length: int, card: Card) -> tuple[Path, float]:
    """Publish ``out`` as an AutoModelForSeq2SeqLM directory (see seq2seq_files) once transformers
    gives tformer's logits; returns (out, max abs diff)."""
    files = seq2seq_files(model, tokenizer, max_length, card)
    ids = [tokenizer.token_to_id(token) for token in ("<pad>", "<s>", "</s>")]
    diff = check_in_transformers(files, model, *ids)
    return publish_export(out, files, "--hf"), diff
