"""The attention maps `tformer attention` draws (PNG with --out, the page with --html).

MODEL_DIR is a BERT-format or sentence-transformers directory (one group: the encoder's
self-attention) or a run directory of `tformer train`, of any kind:

- classification and embedding runs (your data or a synthetic task): the encoder's
  self-attention over the text as the run tokenizes it;
- seq2seq runs: the text is encoded, the output generated greedily, then the decoder run
  teacher-forced on it: three groups, encoder self-attention, decoder self-attention and
  decoder cross-attention (decoder rows are the decoder's inputs, <bos> then the output:
  row t predicts token t + 1).

The page's size is estimated from the token counts and refused in one line before anything
is built (``tformer.training.viz.html.check_page_size``). A run gives its text as its model reads it
(``Run.attention_input``: tformer.kinds); this module draws from those plain values.
"""

from __future__ import annotations

import argparse

import torch

from tformer.commands._inputs import device_of
from tformer.commands._pretrained import max_length_option, one_line_warnings
from tformer.kinds.run import AttentionInput
from tformer.nn.devices import model_device
from tformer.nn.generate import generate
from tformer.nn.model import from_pretrained
from tformer.text.tokenizer import load_tokenizer
from tformer.training.viz.html import AttentionMaps, check_page_size, write_attention_page


def _encoder_page_weights(config, n_tokens: int) -> int:
    return config.n_layers * config.n_heads * n_tokens * n_tokens


def bert_maps(args: argparse.Namespace) -> list[AttentionMaps]:
    """The encoder self-attention of a BERT-format MODEL_DIR on the text."""
    with one_line_warnings("attention"):
        device = device_of(args)
        model = from_pretrained(args.model_dir, allow_pickle=args.allow_pickle).to(device)
        with max_length_option():
            tok = load_tokenizer(args.model_dir, max_length=args.max_length)
        batch = {k: v.to(device) for k, v in tok([args.text], truncation=not args.no_truncate).items()}
    tokens = [tok.token_text(i) for i in batch["input_ids"][0].tolist()]
    check_page_size(_encoder_page_weights(model.config, len(tokens)))
    with torch.inference_mode():
        out = model(batch["input_ids"], attention_mask=batch["attention_mask"],
                    token_type_ids=batch["token_type_ids"], output_attentions=True)
    return [AttentionMaps("encoder self-attention", tokens, tokens, _stack(out.attentions))]


def run_maps(run: AttentionInput) -> list[AttentionMaps]:
    """The attention of a trained run on one input (see the module doc)."""
    model, src = run.model, run.ids
    names = [run.token_name(i) for i in src]
    device = model_device(model)
    src_t = torch.tensor([src], device=device)  # (1, S)
    c = model.config
    if len(src) > c.max_len:
        raise ValueError(f"TEXT: expected at most {c.max_len} tokens with specials, got {len(src)}")
    if not run.seq2seq:
        check_page_size(_encoder_page_weights(c, len(src)))
        typed = run.type_ids is not None and c.type_vocab_size
        types = torch.tensor([run.type_ids], device=device) if typed else None
        with torch.inference_mode():
            out = model.encoder(src_t, token_type_ids=types, output_attentions=True)
        return [AttentionMaps("encoder self-attention", names, names, _stack(out.attentions))]
    with torch.inference_mode():
        generated = generate(model, src_t, max_len=run.max_new_tokens, bos_id=run.bos_id, eos_id=run.eos_id,
                             pad_id=run.pad_id).tolist()[0]
        tgt_in = [run.bos_id] + [i for i in generated if i != run.eos_id]  # (T,): <bos> + the output
        t, s = len(tgt_in), len(src)
        check_page_size(c.n_layers * c.n_heads * s * s + c.decoder_layers * c.n_heads * (t * t + t * s))
        enc = model.encode(src_t, output_attentions=True)
        tgt_t = torch.tensor([tgt_in], device=device)  # (1, T)
        dec = model.decode(tgt_t, enc.last_hidden_state, output_attentions=True)
    tgt_names = [run.token_name(i) for i in tgt_in]
    rows = "Rows are the decoder's inputs: <bos>, then the greedy output; row t predicts token t + 1."
    return [
        AttentionMaps("encoder self-attention", names, names, _stack(enc.attentions)),
        AttentionMaps("decoder self-attention", tgt_names, tgt_names, _stack(dec.decoder_attentions),
                      rows + " Causal."),
        AttentionMaps("decoder cross-attention", tgt_names, names, _stack(dec.cross_attentions),
                      rows + " Keys: the source."),
    ]


def check_options(maps: list[AttentionMaps], layer: int | None, head: int | None) -> None:
    n_layers, n_heads = maps[0].weights.shape[:2]
    for option, value, n in (("--layer", layer, n_layers), ("--head", head, n_heads)):
        if value is not None and not 0 <= value < n:
            raise ValueError(f"{option}: expected 0..{n - 1}, got {value}")


def write_html(args: argparse.Namespace, maps: list[AttentionMaps]) -> str:
    """Write the page for ``args``; returns a one-line summary."""
    n_layers, n_heads = maps[0].weights.shape[:2]
    path = write_attention_page(args.html, maps, args.model_dir, args.text, args.layer or 0, args.head or 0)
    return (
        f"wrote {path} ({len(maps)} kind{'s' if len(maps) > 1 else ''} of attention, "
        f"{n_layers} layers x {n_heads} heads, {len(maps[0].queries)} tokens)"
    )


def _stack(attentions) -> torch.Tensor:
    """n_layers x (1, H, Tq, Tk) -> (L, H, Tq, Tk)."""
    return torch.stack([a[0] for a in attentions])
