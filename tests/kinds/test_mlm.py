"""Masked-LM pre-training (tformer.kinds.masked_lm): a file of texts alone, BERT's masking, the
perplexity and its unigram baseline, fill-mask through the CLI, the Python run, transformers'
pipeline and huggingface_hub's client, and the finished run fine-tuned into another kind."""

from __future__ import annotations

import json
import math
import random
from collections import Counter
from pathlib import Path

import numpy as np
import pytest
import torch
from cli_helpers import assert_one_line_error, run_cli
from hf_bert_fixtures import WORDS, bert_dir, make_bert_dir, mlm_dir
from safetensors.torch import load_file
from text_fixtures import write

from tformer.commands.cli import main
from tformer.errors import BadInput
from tformer.kinds import kind_of_data, load_run, make_objective
from tformer.storage.checkpoint import check_run_dir
from tformer.training.config import read_train_config
from tformer.training.masking import IGNORE, Masker, batch_rng, text_rng
from tformer.training.records import indexed_records, records_at
from tformer.training.verdict import CANNOT_TELL, LEARNED, NOT_LEARNED, Z, beats_baseline, judge, log_gain_se

TINY = ["--d-model", "32", "--n-heads", "2", "--d-ff", "64", "--n-layers", "1", "--vocab-size", "400",
        "--threads", "1", "--quiet", "--precision", "fp32"]
FINE_TUNE = ["--threads", "1", "--quiet", "--precision", "fp32"]
TOL = 1e-5  # fp32: tformer against transformers


def _texts(n: int, seed: int, words=tuple(WORDS)) -> list[str]:
    rng = random.Random(seed)
    return [" ".join(rng.choice(words) for _ in range(rng.randint(4, 12))) for _ in range(n)]


@pytest.fixture(scope="module")
def scratch_run(tmp_path_factory) -> Path:
    """From scratch on a .txt file (a blank line and Windows line ends in it)."""
    root = tmp_path_factory.mktemp("mlm-scratch")
    lines = _texts(160, 0)
    (root / "texts.txt").write_bytes(("\r\n".join(lines[:80]) + "\r\n\r\n" + "\n".join(lines[80:]) + "\n").encode())
    assert main(["train", "--data", str(root / "texts.txt"), "--out", str(root / "run"), "--steps", "6",
                 "--eval-every", "3", *TINY]) == 0
    return root / "run"


@pytest.fixture(scope="module")
def tuned_run(tmp_path_factory) -> Path:
    """Continued from the tiny BertForMaskedLM (its head loaded) on {"text"} records."""
    root = tmp_path_factory.mktemp("mlm-tuned")
    data = write(root / "train.jsonl", [{"text": t} for t in _texts(120, 1)])
    assert main(["train", "--data", str(data), "--from-pretrained", str(mlm_dir()), "--out", str(root / "run"),
                 "--steps", "2", "--eval-every", "2", *FINE_TUNE]) == 0
    return root / "run"


# The data ---------------------------------------------------------------------------------------
def test_text_alone_chooses_masked_lm_and_text_with_a_label_classification(tmp_path):
    assert kind_of_data(write(tmp_path / "a.jsonl", [{"text": "a b"}])).name == "masked_lm"
    assert kind_of_data(write(tmp_path / "b.csv", [{"text": "a b", "id": "1"}])).name == "masked_lm"
    assert kind_of_data(write(tmp_path / "c.jsonl", [{"text": "a", "label": "x"}])).name == "classification"
    assert kind_of_data(write(tmp_path / "d.jsonl", [{"anchor": "a", "positive": "b", "text": "c"}])
                        ).name == "embedding"  # the kind that reads more of the record
    (tmp_path / "e.txt").write_text("one text\n")
    assert kind_of_data(tmp_path / "e.txt").name == "masked_lm"


def test_a_txt_file_is_one_text_per_line_read_a_line_at_a_time(tmp_path):
    path = tmp_path / "t.txt"
    path.write_bytes("\ufeffcafé au lait\r\n\n   \nsecond\tline with a tab\nlast, no line end".encode())
    found = list(indexed_records(path))
    assert [(n, r) for n, _, r in found] == [(1, {"text": "café au lait"}), (4, {"text": "second\tline with a tab"}),
                                             (5, {"text": "last, no line end"})]
    assert list(records_at(path, None, [(n, o) for n, o, _ in reversed(found)])) == \
        [(n, r) for n, _, r in reversed(found)]  # read again from their byte offsets
    (tmp_path / "bad.txt").write_bytes(b"fine\nnot \xff utf-8\n")
    with pytest.raises(ValueError, match=r"bad.txt:2: not UTF-8 text"):
        list(indexed_records(tmp_path / "bad.txt"))


def test_bert_masking_15_percent_80_10_10_never_a_special_token():
    specials, vocab = [0, 1, 2, 3], 1000
    masker = Masker(4, specials, vocab)
    rng = np.random.default_rng(0)
    chosen = masked = random_ = kept = 0
    for _ in range(2000):
        ids = [1, *rng.integers(5, vocab, 40).tolist(), 2, 0, 0]
        out, labels = masker.mask(ids, rng)
        picked = [j for j, label in enumerate(labels) if label != IGNORE]
        assert len(picked) == 6  # round(0.15 * 40)
        assert all(ids[j] not in (*specials, 4) for j in picked) and all(labels[j] == ids[j] for j in picked)
        assert all(out[j] == ids[j] for j in range(len(ids)) if j not in picked)
        chosen += len(picked)
        masked += sum(out[j] == 4 for j in picked)
        kept += sum(out[j] == ids[j] for j in picked)
        random_ += sum(out[j] not in (4, ids[j]) for j in picked)
        assert all(out[j] not in specials for j in picked)  # a random token is an ordinary one
    assert abs(masked / chosen - 0.8) < 0.01 and abs(kept / chosen - 0.1) < 0.01
    assert abs(random_ / chosen - 0.1) < 0.01
    assert masker.mask([1, 3, 2], rng) == ([1, 3, 2], [IGNORE] * 3)  # specials only: nothing chosen
    assert sum(label != IGNORE for label in masker.mask([1, 7, 2], rng)[1]) == 1  # at least one
    # The draws are a function of (seed, batch index) and of (seed, text) alone.
    ids = list(range(5, 45))
    assert masker.mask(ids, batch_rng(3, 7)) == masker.mask(ids, batch_rng(3, 7))
    assert masker.mask(ids, batch_rng(3, 7)) != masker.mask(ids, batch_rng(3, 8))
    assert masker.mask(ids, text_rng(3, "a")) == masker.mask(ids, text_rng(3, "a"))


def test_held_out_texts_are_masked_once_whatever_else_is_scored(scratch_run):
    objective = make_objective(read_train_config(check_run_dir(scratch_run)), scratch_run, existing=True)
    held = objective.examples("validation")
    alone = [objective.encode([r])[0] for r in held]
    together = objective.encode(list(reversed(held)))[::-1]
    assert [(e.ids, e.labels) for e in alone] == [(e.ids, e.labels) for e in together]
    assert all(any(label != IGNORE for label in e.labels) for e in alone)


def test_a_resumed_run_is_bit_for_bit_the_run_never_stopped(tmp_path):
    data = tmp_path / "texts.txt"
    data.write_text("\n".join(_texts(80, 2)) + "\n")
    common = ["--data", str(data), "--eval-every", "2", "--schedule", "inverse_sqrt", "--dropout", "0.1", *TINY]
    assert main(["train", *common, "--steps", "4", "--out", str(tmp_path / "straight")]) == 0
    assert main(["train", *common, "--steps", "2", "--out", str(tmp_path / "resumed")]) == 0
    assert main(["train", "--resume", str(tmp_path / "resumed"), "--steps", "4", "--quiet"]) == 0
    a = load_file(str(check_run_dir(tmp_path / "straight") / "model.safetensors"))
    b = load_file(str(check_run_dir(tmp_path / "resumed") / "model.safetensors"))
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)


# The run ----------------------------------------------------------------------------------------
def test_the_finished_run_is_a_bert_masked_lm_that_fill_mask_loads(scratch_run, capsys):
    """pipeline("fill-mask", model=RUN) gives the run's own candidates, scores to 1e-5."""
    from transformers import pipeline

    run = load_run(scratch_run)
    assert run.mask_token == "<mask>" and json.loads((scratch_run / "config.json").read_text())[
        "architectures"] == ["BertForMaskedLM"]
    fill = pipeline("fill-mask", model=str(scratch_run))
    for text in ("the cat <mask> on the mat", "a <mask> dog and a <mask> cat"):
        ours, theirs = run.predict(text, top_k=4), fill(text, top_k=4)
        _same_answer(ours, theirs)
    targets = ["cat", " dog", "mat"]
    _same_answer(run.predict("the <mask> sat", targets=targets), fill("the <mask> sat", targets=targets))
    line = run_cli(capsys, "predict", scratch_run, "the <mask> sat")[1].strip()
    assert line == ", ".join(f"{c['token_str'].strip()} {c['score']:.4f}" for c in run.predict("the <mask> sat"))
    rc, out, _ = run_cli(capsys, "predict", scratch_run, "a <mask> b <mask>", "--format", "jsonl")
    assert rc == 0 and json.loads(out)["fills"] == json.loads(json.dumps(run.predict("a <mask> b <mask>")))


def _same_answer(ours, theirs):
    if ours and isinstance(ours[0], list):
        assert len(ours) == len(theirs)
        for a, b in zip(ours, theirs, strict=True):
            _same_answer(a, b)
        return
    assert [(c["token"], c["token_str"], c["sequence"]) for c in ours] == \
        [(c["token"], c["token_str"], c["sequence"]) for c in theirs]
    assert max(abs(a["score"] - b["score"]) for a, b in zip(ours, theirs, strict=True)) <= TOL


def test_perplexity_and_the_unigram_baseline_are_the_independent_computations(scratch_run):
    """The run's test perplexity is transformers' BertForMaskedLM cross-entropy on the same masked
    texts; its baseline a unigram model counted here with collections.Counter, add-one smoothed."""
    from transformers import BertForMaskedLM

    run = load_run(scratch_run)
    objective, examples = run.objective, run.examples("test")
    metrics = run.evaluate()
    encoded = objective.encode(examples)
    hf = BertForMaskedLM.from_pretrained(str(scratch_run)).eval()
    losses = []  # the model's loss at each predicted token
    for e in encoded:
        with torch.no_grad():
            logits = hf(input_ids=torch.tensor([e.ids]), token_type_ids=torch.tensor([e.type_ids])).logits[0]
        labels = torch.tensor(e.labels)
        token_nll = torch.nn.functional.cross_entropy(logits, labels, ignore_index=IGNORE, reduction="none")
        losses += token_nll[labels != IGNORE].tolist()
    nll, n = sum(losses), len(losses)
    assert metrics["masked_tokens"] == n and abs(metrics["loss"] - nll / n) <= 1e-5
    assert metrics["perplexity"] == pytest.approx(math.exp(nll / n), rel=1e-5)
    assert metrics["loss_sd"] == pytest.approx(float(np.std(losses)), rel=1e-4)
    tok = run.tokenizer
    texts = [r["text"] for r in objective.source.data.epoch_pools(0).__next__()]
    specials = set(np.flatnonzero(objective.masker.special).tolist())
    counts = Counter(i for t in texts for i in tok.encode([t])[0].ids if i not in specials)
    ordinary, total = tok.vocab_size - len(specials), sum(counts.values())
    targets = [label for e in encoded for label in e.labels if label != IGNORE]
    unigram = [-math.log((counts[t] + 1) / (total + ordinary)) for t in targets]  # its loss per token
    expected = math.exp(sum(unigram) / len(targets))
    baseline = run.baseline(examples)
    assert baseline["baseline"] == pytest.approx(expected, rel=1e-9)
    assert baseline["baseline_loss_sd"] == pytest.approx(float(np.std(unigram)), rel=1e-9)
    # The verdict's margin bounds the log gain's standard error computed from the paired losses.
    se = log_gain_se({**metrics, **baseline})
    assert se >= float(np.std(np.subtract(unigram, losses))) / math.sqrt(n) * (1 - 1e-6)
    record = json.loads((scratch_run / "metrics.jsonl").read_text().splitlines()[-1])
    assert record["main_metric"] == "perplexity" and {"loss_sd", "baseline_loss_sd"} <= set(record)
    verdict, interval = judge(record["perplexity"], record["baseline"], "perplexity", record["examples"],
                              log_gain_se(record))
    assert record["verdict"] == verdict and record["gain_interval"] == pytest.approx(list(interval), abs=1e-4)
    assert record["beats_baseline"] == {LEARNED: True, NOT_LEARNED: False}.get(verdict)


def test_a_fine_tune_loads_the_base_models_head_and_starts_as_transformers(tuned_run, tmp_path):
    """The tiny BertForMaskedLM's own head: tformer's model before any update gives its logits,
    and the run validates it at step 0."""
    from transformers import BertForMaskedLM

    config = read_train_config(check_run_dir(tuned_run)).replace(out=str(tmp_path / "x"))
    objective = make_objective(config, tmp_path / "x", write=False)
    assert objective.starts_complete and objective.mask_token == "[MASK]"
    ours = objective.build_model().eval()
    theirs = BertForMaskedLM.from_pretrained(str(mlm_dir())).eval()
    ids = torch.randint(0, 100, (2, 9))
    mask = torch.ones_like(ids)
    mask[1, 6:] = 0
    with torch.no_grad():
        expected = theirs(input_ids=ids, attention_mask=mask).logits
        got = ours(ids, mask, torch.zeros_like(ids))
    assert (got[mask.bool()] - expected[mask.bool()]).abs().max() <= TOL
    record = json.loads((tuned_run / "metrics.jsonl").read_text().splitlines()[-1])
    assert "pretrained_validation" in record


def test_a_base_without_a_head_starts_bert_s_own_and_one_without_a_mask_token_is_refused(tmp_path):
    data = write(tmp_path / "d.jsonl", [{"text": t} for t in _texts(40, 3)])
    config = {"data": str(data), "from_pretrained": str(bert_dir()), "out": str(tmp_path / "r")}
    from tformer.kinds import resolve_config

    objective = make_objective(resolve_config(config), tmp_path / "r", write=False)
    assert not objective.starts_complete
    head = objective.build_model().head
    assert abs(head.dense.weight.std().item() - 0.02) < 0.005 and not head.bias.any() and not head.dense.bias.any()
    no_mask = make_bert_dir(tmp_path / "no-mask")
    vocab = (no_mask / "vocab.txt").read_text().replace("[MASK]\n", "[MASX]\n")
    (no_mask / "vocab.txt").write_text(vocab)
    (no_mask / "tokenizer.json").unlink()
    rc = main(["train", "--data", str(data), "--from-pretrained", str(no_mask), "--out", str(tmp_path / "n"),
               *FINE_TUNE])
    assert rc == 2 and not (tmp_path / "n").exists()


def test_export_hf_is_checked_and_loaded_by_the_fill_mask_pipeline(tuned_run, tmp_path):
    from transformers import pipeline

    run = load_run(tuned_run)
    out = run.export(hf=tmp_path / "hf")
    assert "pipeline_tag: \"fill-mask\"" in (out / "README.md").read_text()
    fill = pipeline("fill-mask", model=str(out))
    for text in ("the [MASK] sat on the mat", "[MASK] dog [MASK]"):
        _same_answer(run.predict(text, top_k=5), fill(text))
    with pytest.raises(ValueError, match="--onnx: .* exports to transformers"):
        run.export(onnx=tmp_path / "onnx")


def test_the_run_fine_tunes_a_classifier_and_an_embedding_model(tuned_run, tmp_path):
    rows = [{"text": t, "label": "ab"[i % 2]} for i, t in enumerate(_texts(60, 4))]
    data = write(tmp_path / "cls.jsonl", rows)
    assert main(["train", "--data", str(data), "--from-pretrained", str(tuned_run), "--out", str(tmp_path / "c"),
                 "--steps", "2", "--eval-every", "2", *FINE_TUNE]) == 0
    classifier, mlm = load_run(tmp_path / "c"), load_run(tuned_run)
    # It started from the masked-LM run's encoder: the weights it trained from are the run's.
    start = load_file(str(tuned_run / "model.safetensors"))
    assert torch.equal(start["bert.embeddings.position_embeddings.weight"],
                       mlm.model.encoder.pos_emb.weight.detach())
    assert classifier.predict("the cat")[0]["label"] in ("a", "b")
    pairs = write(tmp_path / "emb.jsonl", [{"anchor": t, "positive": t} for t in _texts(40, 5)])
    assert main(["train", "--data", str(pairs), "--from-pretrained", str(tuned_run), "--out", str(tmp_path / "e"),
                 "--steps", "2", "--eval-every", "2", *FINE_TUNE]) == 0


def test_bad_inputs_are_one_line_errors(scratch_run, tmp_path, capsys):
    run = load_run(scratch_run)
    with pytest.raises(BadInput, match=r"inputs\[1\]: expected the mask token <mask> \(this run's\)"):
        run.predict(["a <mask>", "no mask"])
    with pytest.raises(BadInput, match="within the first 64 tokens"):
        run.predict(" ".join(["cat"] * 100) + " <mask>")
    with pytest.raises(ValueError, match="top_k: expected a positive int, got 0"):
        run.predict("a <mask>", top_k=0)
    rc, _, err = run_cli(capsys, "predict", scratch_run, "no mask here")
    assert_one_line_error(rc, err, "predict", r"TEXT 1: expected the mask token <mask>")
    data = tmp_path / "d.jsonl"
    data.write_text('{"text": "fine"}\n{"text": ""}\n')
    rc, _, err = run_cli(capsys, "train", "--data", data, "--out", tmp_path / "r", *TINY)
    assert_one_line_error(rc, err, "train", r"d.jsonl:2: text: expected text, got an empty string")
    rc, _, err = run_cli(capsys, "train", "--data", data, "--norm-first", "--out", tmp_path / "r", *TINY)
    assert_one_line_error(rc, err, "train", r"--norm-first: a masked-LM run is a BERT-format directory")


def test_perplexity_is_better_lower():
    assert beats_baseline(10.0, 12.0, "perplexity") and not beats_baseline(12.0, 10.0, "perplexity")
    assert beats_baseline(0.9, 0.8, "accuracy") and not beats_baseline(0.8, 0.9, "accuracy")


def test_the_perplexity_verdict_has_a_margin():
    """Learned only when the interval of (perplexity - baseline) is below 0; did not learn only
    when it rules out a 2% reduction; the interval is exp of the log gain's (float64 NumPy here)."""
    rng = np.random.default_rng(0)
    b = rng.exponential(3.0, 4000)  # per-token losses: the baseline's, the model's (slightly lower)
    a = b - 0.5 + rng.normal(0, 1.0, b.size)
    value, base = math.exp(a.mean()), math.exp(b.mean())
    se = (a.std() + b.std()) / math.sqrt(b.size)
    verdict, (low, high) = judge(value, base, "perplexity", 500, se)
    d = b.mean() - a.mean()
    assert verdict == LEARNED and high < 0
    assert (low, high) == pytest.approx((base * (math.exp(-d - Z * se) - 1), base * (math.exp(-d + Z * se) - 1)))
    assert judge(base, base, "perplexity", 500, 1e-4)[0] == NOT_LEARNED  # no gain, measured finely
    assert judge(value, base, "perplexity", 500, 1.0)[0] == CANNOT_TELL  # within the noise
    assert judge(value, base, "perplexity", 5, se)[0] == CANNOT_TELL  # too few texts
    assert judge(value, base, "perplexity", 500, None) == (CANNOT_TELL, (-math.inf, math.inf))


def test_served_fill_mask_answers_huggingface_hub_as_the_run_does(scratch_run):
    hub = pytest.importorskip("huggingface_hub")
    pytest.importorskip("uvicorn")
    from serve_fixtures import serve

    run = load_run(scratch_run)
    live = serve(scratch_run)
    try:
        client = hub.InferenceClient(model=live.url, timeout=30)
        answer = client.fill_mask("the cat <mask> on the mat")
        expected = run.predict("the cat <mask> on the mat")
        assert [(e.token, e.token_str, e.sequence) for e in answer] == \
            [(c["token"], c["token_str"], c["sequence"]) for c in expected]
        assert max(abs(e.score - c["score"]) for e, c in zip(answer, expected, strict=True)) <= TOL
        assert len(client.fill_mask("a <mask> b", top_k=2)) == 2
        status, _, body = live.post("/", {"inputs": ["a <mask>", "a <mask> b <mask>"]})
        assert status == 200 and len(body) == 2 and len(body[1]) == 2  # one answer per text, per mask
        status, _, body = live.post("/", {"inputs": "no mask"})
        assert status == 422 and "expected the mask token <mask>" in body["error"]["message"]
        status, _, body = live.post("/embed", {"inputs": "a <mask>"})
        assert status == 404
    finally:
        live.close()
