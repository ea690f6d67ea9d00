"""Fine-tuning a BERT-format directory, and taking the result to transformers and
sentence-transformers with the same numbers (random-weight tiny BERT: no download)."""

import json

import numpy as np
import pytest
import torch
from hf_bert_fixtures import bert_dir, st_dir
from text_fixtures import classification_rows, embedding_rows, write

from tformer.commands.cli import main
from tformer.storage.checkpoint import check_run_dir

FINETUNE = ["--steps", "30", "--eval-every", "10", "--log-every", "5", "--max-tokens", "512",
            "--lr", "1e-3", "--warmup", "3", "--max-length", "16", "--threads", "1", "--quiet",
            "--patience", "none"]



def _train_losses(out):
    lines = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    return [r["loss"] for r in lines if r["split"] == "train"]


@pytest.fixture(scope="module")
def classifier_run(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("ft")
    data = write(tmp / "train.jsonl", classification_rows(200))
    out = tmp / "run"
    assert main(["train", "--data", str(data), "--from-pretrained", str(bert_dir()), "--out", str(out),
                 *FINETUNE]) == 0
    return out


def test_finetuning_lowers_the_loss(classifier_run):
    losses = _train_losses(classifier_run)
    assert losses[-1] < losses[0] * 0.9, losses
    saved = json.loads((check_run_dir(classifier_run) / "train_config.json").read_text())
    assert saved["schedule"] == "linear"  # the BERT recipe: warmup then linear decay


def test_hf_export_gives_the_same_logits(classifier_run, tmp_path):
    from transformers import AutoModelForSequenceClassification, AutoTokenizer

    from tformer.kinds import load_run

    out = tmp_path / "hf"
    assert main(["export", str(classifier_run), "--hf", str(out)]) == 0
    theirs = AutoModelForSequenceClassification.from_pretrained(str(out)).eval()
    tokenizer = AutoTokenizer.from_pretrained(str(out))
    texts = ["the cat sat on the mat", "a big red house by the river", "one two"]
    batch = tokenizer(texts, padding=True, return_tensors="pt")
    loaded = load_run(classifier_run)
    model, source, _ = loaded.model, loaded.objective, loaded.config
    records = [{"text": t, "label": "animal"} for t in texts]
    ours_batch = source.collate(source.encode(records))
    assert ours_batch.input_ids.tolist() == batch["input_ids"].tolist()  # the same tokens
    with torch.no_grad():
        expected = theirs(**batch).logits
        got = model(ours_batch.input_ids, ours_batch.attention_mask, ours_batch.token_type_ids).logits
    diff = (expected - got).abs().max().item()
    assert diff <= 1e-5, f"max |logits difference| {diff:.2e}"
    assert theirs.config.id2label == {0: "animal", 1: "place"}


def test_finetuned_embeddings_load_in_sentence_transformers(tmp_path):
    from sentence_transformers import SentenceTransformer

    from tformer.embeddings.sentence import SentenceEncoder

    data = write(tmp_path / "pairs.jsonl", embedding_rows(100))
    out = tmp_path / "run"
    assert main(["train", "--data", str(data), "--from-pretrained", str(st_dir()), "--out", str(out),
                 *FINETUNE]) == 0
    # Validation loss: the training batches differ in size, and so in how hard the in-batch task is.
    lines = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    valid = [r["loss"] for r in lines if r["split"] == "validation"]
    assert valid[-1] < valid[0], valid
    texts = ["the cat sat on the mat", "stars in the night sky", "one"]
    theirs = SentenceTransformer(str(out), device="cpu").encode(texts)
    ours = SentenceEncoder.from_pretrained(out).encode(texts)
    assert np.abs(theirs - ours).max() <= 1e-5


def test_export_refuses_a_classifier_without_the_bert_pooler_naming_the_field(tmp_path):
    """BertForSequenceClassification pools with tanh(W h[CLS]); a classifier that pools
    otherwise (config.pooler False) cannot be expressed and nothing is written."""
    from tokenizers import Tokenizer, models

    from tformer.config import TransformerConfig
    from tformer.export.hf_classifier import export_classifier
    from tformer.export.model_card import Card
    from tformer.nn.model import EncoderClassifier

    config = TransformerConfig(d_model=16, n_heads=2, d_ff=32, n_layers=1, vocab_size=20, max_len=16,
                               positional="learned", scale_embeddings=False, type_vocab_size=2,
                               embedding_norm=True, n_classes=2, pooling="mean")
    tokenizer = Tokenizer(models.WordLevel({"<pad>": 0, "<unk>": 1}, unk_token="<unk>"))
    with pytest.raises(ValueError, match=r"^config\.pooler: BertForSequenceClassification pools with the "
                                         r"BERT pooler .*got pooler=False \(pooling 'mean'\)"):
        export_classifier(tmp_path / "hf", EncoderClassifier(config), tokenizer, ["a", "b"], 16,
                          Card(name="x", kind="classification"))
    assert not (tmp_path / "hf").exists()


def test_an_export_transformers_does_not_reproduce_is_not_written(classifier_run, tmp_path, monkeypatch):
    """BertForSequenceClassification is checked in transformers before publishing, as XLM is:
    one weight off, nothing written; else the logits of padded batches agree (<= 1e-4)."""
    from tformer.export import hf_classifier
    from tformer.kinds import load_run

    run = load_run(classifier_run)
    written, diff = hf_classifier.export_classifier(tmp_path / "ok", run.model, run.tokenizer.backend,
                                                    tuple(run.labels), 16, run.card("x"))
    assert written.is_dir() and diff <= hf_classifier.TOLERANCE
    to_hf = hf_classifier.classifier_state_to_hf

    def off(state, config):
        out = to_hf(state, config)
        out["classifier.bias"] = out["classifier.bias"] + 1e-3
        return out

    monkeypatch.setattr(hf_classifier, "classifier_state_to_hf", off)
    with pytest.raises(ValueError, match=r"^--hf: the BertForSequenceClassification export gives logits "
                                         r".* away from tformer's .*expected <= 1e-04; nothing was written$"):
        run.export(hf=tmp_path / "hf")
    assert not (tmp_path / "hf").exists()
