"""A Seq2SeqTransformer exported to transformers (Marian for post-norm, Pegasus for pre-norm)
gives the same logits and generates the same token ids greedily (random tiny weights)."""

import pytest
import torch
from tokenizers import Tokenizer, models, pre_tokenizers

from tformer.config import TransformerConfig
from tformer.export import hf_seq2seq
from tformer.export.model_card import Card
from tformer.nn.generate import generate
from tformer.nn.model import Seq2SeqTransformer

TOLERANCE = 1e-4  # max abs difference of logits (|logits| up to ~30), float32
PAD, BOS, EOS = 0, 1, 2


def tiny_tokenizer(vocab_size: int = 24) -> Tokenizer:
    vocab = {"<pad>": PAD, "<s>": BOS, "</s>": EOS, "<unk>": 3}
    vocab.update({f"w{i}": i for i in range(4, vocab_size)})
    tok = Tokenizer(models.WordLevel(vocab, unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    return tok


def seq2seq(**changes) -> Seq2SeqTransformer:
    torch.manual_seed(0)
    config = TransformerConfig(d_model=16, n_heads=2, d_ff=32, n_layers=2, n_decoder_layers=1,
                               vocab_size=24, max_len=20, dropout=0.0, **changes)
    model = Seq2SeqTransformer(config).eval()
    with torch.no_grad():  # varied, decisive greedy choices: no near-ties, not one token repeated
        for p in model.parameters():
            if p.dim() == 2:
                p.normal_(0.0, 0.5)
    return model


def export(model, path):
    card = Card(name="tiny", kind="seq2seq", max_length=12)
    return hf_seq2seq.export_seq2seq(path, model, tiny_tokenizer(), 12, card)[0]


@pytest.mark.parametrize("changes", [
    {},  # post-norm: MarianMTModel
    {"norm_first": True, "final_norm": True},  # pre-norm (the data runs' default): Pegasus
    {"norm_first": True, "final_norm": True, "tie_output": False, "activation": "gelu"},
    {"scale_embeddings": False},
], ids=["marian", "pegasus", "pegasus-untied-gelu", "marian-unscaled"])
def test_transformers_generates_the_same_token_ids(tmp_path, changes):
    from transformers import AutoModelForSeq2SeqLM, AutoTokenizer

    ours = seq2seq(**changes)
    out = export(ours, tmp_path / "hf")
    theirs = AutoModelForSeq2SeqLM.from_pretrained(str(out)).eval()
    expected_class = "PegasusForConditionalGeneration" if ours.config.norm_first else "MarianMTModel"
    assert type(theirs).__name__ == expected_class
    tokenizer = AutoTokenizer.from_pretrained(str(out))
    texts = ["w4 w5 w6 w7", "w9 w10", "w11 w12 w13 w14 w15 w16 w17 w18 w19 w20 w21 w22 w23 w4 w5"]
    batch = tokenizer(texts, padding=True, truncation=True, return_tensors="pt")
    src, mask = batch["input_ids"], batch["attention_mask"]
    assert src[2].tolist()[-1] == EOS and int(mask[2].sum()) == 12  # cut to max_length with </s>
    tgt = torch.tensor([[BOS, 5, 6, 7], [BOS, 8, 9, 10], [BOS, 11, 4, 4]])
    with torch.no_grad():
        got = theirs(input_ids=src, attention_mask=mask, decoder_input_ids=tgt).logits
        expected = ours(src, tgt, mask).logits
        diff = (got - expected).abs().max().item()
        assert diff <= TOLERANCE, f"max |logits difference| {diff:.2e}"
        g = torch.Generator().manual_seed(3)  # and 16 more sources, 6 of them padded
        width = src.size(1)
        more = torch.cat([torch.randint(4, 24, (16, width - 1), generator=g), torch.full((16, 1), EOS)], 1)
        more_mask = torch.ones_like(more)
        more_mask[::3, 6:] = 0
        src, mask = torch.cat([src, more]), torch.cat([mask, more_mask])
        hf_ids = theirs.generate(input_ids=src, attention_mask=mask)
        our_ids = generate(ours, src, mask, max_len=12, bos_id=BOS, eos_id=EOS, pad_id=PAD)
    hf_rows = [[i for i in row[1:] if i != PAD] for row in hf_ids.tolist()]  # drop the start token
    assert hf_rows == our_ids.tolist()
    assert len({i for row in hf_rows for i in row}) >= 2  # not one token repeated everywhere


@pytest.mark.parametrize("field, changes", [
    ("positional", {"positional": "learned"}),
    ("final_norm", {"norm_first": True}),
    ("final_norm", {"final_norm": True}),
    ("tgt_vocab_size", {"tgt_vocab_size": 30}),
    ("bias", {"bias": False}),
    ("layer_norm_eps", {"layer_norm_eps": 1e-12}),
])
def test_configs_transformers_cannot_express_are_refused_naming_the_field(tmp_path, field, changes):
    with pytest.raises(ValueError, match=rf"^config\.{field}: a transformers seq2seq export needs"):
        export(seq2seq(**changes), tmp_path / "hf")
    assert not (tmp_path / "hf").exists()


def test_the_key_table_covers_the_state_dict_exactly():
    for changes in ({}, {"norm_first": True, "final_norm": True, "tie_output": False}):
        model = seq2seq(**changes)
        hf_seq2seq.verify(model.state_dict(), model.config)


def test_an_export_transformers_does_not_reproduce_is_not_written(tmp_path, monkeypatch):
    """The files are loaded in transformers before publishing: one weight off, nothing written."""
    to_hf = hf_seq2seq.to_hf

    def off(state, config):
        out = to_hf(state, config)
        key = next(k for k in out if k.endswith("fc2.bias"))
        out[key] = out[key].clone()
        out[key][0] += 1e-2  # one unit: a shift of them all is what a LayerNorm takes out
        return out

    monkeypatch.setattr(hf_seq2seq, "to_hf", off)
    with pytest.raises(ValueError, match=r"^--hf: the MarianMTModel export gives logits .* away from "
                                         r"tformer's .*expected <= 1e-04; nothing was written$"):
        export(seq2seq(), tmp_path / "hf")
    assert not (tmp_path / "hf").exists()
