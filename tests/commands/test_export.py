"""`tformer export RUN --hf/--onnx` on every kind of run: the same probabilities, token ids and
embeddings in transformers, sentence-transformers and onnxruntime as in tformer, tokenizers
that truncate as the run did, model cards, and directories published whole."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch
from card_fixtures import check_card
from helpers import tiny_train_argv
from hf_bert_fixtures import bert_dir
from text_fixtures import classification_rows, embedding_rows, seq2seq_rows, write

from tformer.commands.cli import main
from tformer.storage import files

PROB_TOLERANCE = 1e-5  # max abs difference of probabilities, float32 (predict prints 6 decimals)
TINY = ["--d-model", "16", "--n-heads", "2", "--d-ff", "32", "--n-layers", "1", "--vocab-size", "300",
        "--steps", "4", "--eval-every", "2", "--max-tokens", "512", "--max-length", "12", "--threads", "1",
        "--quiet"]
LONG = " ".join(["the big red house by the river"] * 8)  # far past max_length 12


def _run(capsys, *argv):
    """`tformer ARGV`; an export's model card is checked against the Hub's spec and the installed
    transformers, and must name no folder of this machine's (the run's, its data's)."""
    rc = main([str(a) for a in argv])
    out, err = capsys.readouterr()
    if rc == 0 and argv[0] == "export" and (Path(argv[-1]) / "README.md").is_file():
        check_card(Path(argv[-1]) / "README.md", private=(str(Path(argv[1]).resolve().parent),))
    return rc, out, err


def _train(tmp, name, rows, *extra):
    data = write(tmp / f"{name}.jsonl", rows)
    out = tmp / name
    tiny = TINY[10:] if "--from-pretrained" in extra else TINY  # a fine-tune keeps its sizes and tokenizer
    assert main(["train", "--data", str(data), "--out", str(out), *tiny, *extra]) == 0
    return out


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("runs")
    return {
        "scratch": _train(tmp, "scratch", classification_rows(60), "--pooling", "cls"),
        "scratch-mean": _train(tmp, "scratch-mean", classification_rows(60)),
        "finetuned": _train(tmp, "finetuned", classification_rows(60), "--from-pretrained", str(bert_dir()),
                            "--max-length", "16"),
        "seq2seq": _train(tmp, "seq2seq", seq2seq_rows(60)),
        "embedding": _train(tmp, "embedding", embedding_rows(60)),
    }


def _predict(capsys, run, texts, tmp_path) -> np.ndarray:
    path = tmp_path / "texts.txt"
    path.write_text("".join(t + "\n" for t in texts))
    rc, out, _ = _run(capsys, "predict", run, "--file", path, "--format", "jsonl")
    assert rc == 0
    rows = [json.loads(line) for line in out.splitlines()]
    return np.array([list(r["probabilities"].values()) for r in rows])


def _hf_probabilities(directory, texts) -> np.ndarray:
    from transformers import AutoModelForSequenceClassification, AutoTokenizer

    model = AutoModelForSequenceClassification.from_pretrained(str(directory)).eval()
    tokenizer = AutoTokenizer.from_pretrained(str(directory))
    batch = tokenizer(texts, padding=True, truncation=True, return_tensors="pt")
    with torch.no_grad():
        return model(**batch).logits.softmax(-1).numpy()


TEXTS = ["the cat sat on the mat", "a big red house by the river", "dog", LONG]


@pytest.mark.parametrize("kind", ["finetuned", "scratch"])
def test_classifier_runs_load_in_transformers_with_the_runs_probabilities(capsys, tmp_path, runs, kind):
    run = runs[kind]
    config = json.loads(next((run / "checkpoints").glob("step-*/config.json")).read_text())
    out = tmp_path / "hf"
    rc, _, err = _run(capsys, "export", run, "--hf", out)
    assert config["pooler"] and config["pooling"] == "cls"
    assert rc == 0, err
    expected = _predict(capsys, run, TEXTS, tmp_path)
    got = _hf_probabilities(out, TEXTS)
    diff = np.abs(got - expected).max()
    assert diff <= PROB_TOLERANCE, f"max |probability difference| {diff:.2e}"
    tokenizer_config = json.loads((out / "tokenizer_config.json").read_text())
    max_length = 16 if kind == "finetuned" else 12
    assert tokenizer_config["model_max_length"] == max_length
    assert json.loads((out / "tokenizer.json").read_text())["truncation"]["max_length"] == max_length
    card = (out / "README.md").read_text()
    assert "accuracy" in card and f"tformer export {run.name} --hf {out.name}" in card and "animal, place" in card
    header = hub_header(card)
    assert header["library_name"] == "transformers" and header["pipeline_tag"] == "text-classification"
    assert "accuracy" in header["metrics"] and "tformer" in header["tags"]
    if kind == "finetuned":
        assert f"base model (fine-tuned): `{bert_dir().name}`" in card  # its name: no folder of this machine
    else:
        assert "base model" not in card


def test_transformers_pipeline_gives_predicts_probabilities(capsys, tmp_path, runs):
    """pipeline("text-classification", top_k=None), a padded batch, on the BERT (cls) export,
    against `tformer predict`: its pooling reads [CLS], whose attention masks the padding."""
    from transformers import pipeline

    run, out = runs["scratch"], tmp_path / "hf"
    assert _run(capsys, "export", run, "--hf", out)[0] == 0
    classify = pipeline("text-classification", model=str(out), top_k=None, device="cpu")
    # Batched: the shorter texts padded to the longest (LONG: cut at the run's max_length).
    answers = classify(TEXTS, truncation=True, batch_size=len(TEXTS))
    labels = ["animal", "place"]
    got = np.array([[{a["label"]: a["score"] for a in answer}[label] for label in labels] for answer in answers])
    diff = np.abs(got - _predict(capsys, run, TEXTS, tmp_path)).max()
    assert diff <= PROB_TOLERANCE, f"max |probability difference| {diff:.2e}"


def hub_header(card: str) -> dict:
    """The YAML block a model card opens with (the Hub's metadata), parsed."""
    import yaml

    assert card.startswith("---\n"), card[:80]
    return yaml.safe_load(card[4 : card.index("\n---\n", 4)])


def train_command(card: str) -> list[str]:
    """The `tformer train` command a model card says made the run."""
    import shlex

    lines = [line for line in card.splitlines() if line.startswith("tformer train ")]
    assert len(lines) == 1, card
    return shlex.split(lines[0])


@pytest.mark.parametrize("kind", ["scratch", "finetuned", "seq2seq"])
def test_the_card_opens_with_hub_metadata_and_gives_the_train_command_that_made_the_run(capsys, tmp_path, runs,
                                                                                      kind):
    """The command in the card resolves to the run's own TrainConfig (its folder aside; its files
    named by their names alone: the card is published, the folders are this machine's)."""
    import dataclasses

    from tformer.commands.cli import build_parser
    from tformer.kinds import resolve_config
    from tformer.storage.checkpoint import check_run_dir
    from tformer.training.config import MODEL_OPTIONS, TrainConfig, read_train_config

    run, out = runs[kind], tmp_path / "hf"
    assert _run(capsys, "export", run, "--hf", out)[0] == 0
    card = (out / "README.md").read_text()
    assert hub_header(card)["library_name"] == "transformers"
    words = train_command(card)
    assert words[:2] == ["tformer", "train"] and "--data" in words
    saved = read_train_config(check_run_dir(run))
    local = {Path(p).name: p for p in (saved.data, saved.from_pretrained) if p}
    assert not set(words) & set(local.values())  # no local folder in the card
    args = build_parser()[0].parse_args([local.get(w, w) for w in words[1:]])
    names = {f.name for f in dataclasses.fields(TrainConfig)} | set(MODEL_OPTIONS)
    again = resolve_config({k: v for k, v in vars(args).items() if k in names})
    assert again.replace(out=None) == saved.replace(out=None)
    assert "## Training data" in card and "records in the training file" in card


def test_the_card_keeps_the_test_record_after_an_eval_of_another_file(capsys, tmp_path, runs):
    import shutil

    from tformer.kinds import load_run

    run = tmp_path / "run"
    shutil.copytree(runs["finetuned"], run)
    data = write(tmp_path / "more.jsonl", classification_rows(12, seed=3))
    assert _run(capsys, "eval", run, "--data", data)[0] == 0  # appends an "eval" line
    assert json.loads((run / "metrics.jsonl").read_text().splitlines()[-1])["split"] == "eval"
    test = load_run(run).test_record()
    assert test["split"] == "test"
    assert _run(capsys, "export", run, "--hf", tmp_path / "hf")[0] == 0
    card = (tmp_path / "hf" / "README.md").read_text()
    assert "none recorded" not in card and f"{test['accuracy']:.4g}" in card
    with (run / "metrics.jsonl").open("a") as f:  # training went on past the test: not its record
        f.write(json.dumps({"split": "train", "step": 10**6, "loss": 1.0}) + "\n")
    assert load_run(run).test_record() == {}


def test_a_mean_pooled_classifier_exports_as_xlm_and_pipeline_gives_predicts_probabilities(
        capsys, tmp_path, runs):
    """The default from scratch (tests/export/test_hf_xlm.py has the details and the limit)."""
    from transformers import pipeline

    run, out = runs["scratch-mean"], tmp_path / "hf"
    config = json.loads(next((run / "checkpoints").glob("step-*/config.json")).read_text())
    assert config["pooling"] == "mean" and not config["pooler"]  # config.json says what it does
    rc, _, err = _run(capsys, "export", run, "--hf", out)
    assert rc == 0 and "XLMForSequenceClassification" in err and "one text per call" in err
    classify = pipeline("text-classification", model=str(out), top_k=None, device="cpu")
    answers = classify(TEXTS, truncation=True)  # batch_size 1: each text unpadded
    got = np.array([[{a["label"]: a["score"] for a in answer}[label] for label in ("animal", "place")]
                    for answer in answers])
    diff = np.abs(got - _predict(capsys, run, TEXTS, tmp_path)).max()
    assert diff <= PROB_TOLERANCE, f"max |probability difference| {diff:.2e}"


def test_the_exported_tokenizer_truncates_as_the_run_did_even_without_truncation_flag(runs, tmp_path, capsys):
    from tokenizers import Tokenizer

    out = tmp_path / "hf"
    assert _run(capsys, "export", runs["finetuned"], "--hf", out)[0] == 0
    assert len(Tokenizer.from_file(str(out / "tokenizer.json")).encode(LONG).ids) == 16


def test_seq2seq_run_exports_to_transformers_and_generates_the_same_text(capsys, tmp_path, runs):
    from transformers import AutoModelForSeq2SeqLM, AutoTokenizer

    run, out = runs["seq2seq"], tmp_path / "hf"
    rc, _, err = _run(capsys, "export", run, "--hf", out)
    assert rc == 0 and "PegasusForConditionalGeneration" in err  # the data runs' default is pre-norm
    sources = ["the cat sat", "hello world, fine. yes!", LONG]
    path = tmp_path / "sources.txt"
    path.write_text("".join(s + "\n" for s in sources))
    rc, expected, _ = _run(capsys, "generate", run, "--file", path, "--max-len", 12)
    assert rc == 0
    model = AutoModelForSeq2SeqLM.from_pretrained(str(out)).eval()
    tokenizer = AutoTokenizer.from_pretrained(str(out))
    batch = tokenizer(sources, padding=True, truncation=True, return_tensors="pt")
    with torch.no_grad():
        ids = model.generate(**batch)
    got = tokenizer.batch_decode(ids, skip_special_tokens=True)
    assert got == expected.splitlines()
    assert "# seq2seq" in (out / "README.md").read_text() or "seq2seq model" in (out / "README.md").read_text()


def test_embedding_run_onnx_is_a_sentence_transformers_folder_with_the_same_embeddings(capsys, tmp_path, runs):
    import onnxruntime as ort
    from sentence_transformers import SentenceTransformer
    from tokenizers import Tokenizer

    run, out = runs["embedding"], tmp_path / "emb"
    rc, _, err = _run(capsys, "export", run, "--onnx", out)
    assert rc == 0 and "max abs diff" in err
    assert sorted(str(p.relative_to(out)) for p in out.rglob("*") if p.is_file()) == [
        "1_Pooling/config.json", "2_Normalize/config.json", "README.md", "config.json", "model.onnx",
        "modules.json", "sentence_bert_config.json", "tokenizer.json", "tokenizer_config.json"]
    modules = json.loads((out / "modules.json").read_text())
    assert [m["path"] for m in modules] == ["", "1_Pooling", "2_Normalize"]
    assert json.loads((out / "config.json").read_text())["model_type"] == "bert"
    header = hub_header((out / "README.md").read_text())
    assert (header["library_name"], header["pipeline_tag"]) == ("sentence-transformers", "sentence-similarity")
    texts = ["the cat sat", "café naïve Straße 東京", LONG]
    expected = SentenceTransformer(str(run), device="cpu").encode(texts, convert_to_numpy=True)
    tokenizer = Tokenizer.from_file(str(out / "tokenizer.json"))  # the exported files alone
    tokenizer.enable_padding(pad_id=tokenizer.token_to_id("<pad>"))
    batch = tokenizer.encode_batch(texts)
    feed = {"input_ids": [e.ids for e in batch], "attention_mask": [e.attention_mask for e in batch],
            "token_type_ids": [e.type_ids for e in batch]}
    session = ort.InferenceSession(str(out / "model.onnx"), providers=["CPUExecutionProvider"])
    assert [o.name for o in session.get_outputs()] == ["last_hidden_state", "sentence_embedding"]
    _, got = session.run(None, {i.name: np.array(feed[i.name], dtype=np.int64) for i in session.get_inputs()})
    assert np.abs(got - expected).max() <= PROB_TOLERANCE


def test_classifier_run_onnx_is_a_folder_that_reproduces_predict(capsys, tmp_path, runs):
    """model.onnx, tokenizer.json and config.json (id2label): onnxruntime and tokenizers alone
    give `tformer predict`'s probabilities (<= 1e-5); the card's code runs as it is."""
    import onnxruntime as ort
    from tokenizers import Tokenizer

    for kind in ("finetuned", "scratch-mean"):  # scratch-mean: a classifier of the default options
        run, out = runs[kind], tmp_path / kind
        rc, _, err = _run(capsys, "export", run, "--onnx", out)
        assert rc == 0 and "max abs diff" in err, err
        assert sorted(p.name for p in out.iterdir()) == ["README.md", "config.json", "model.onnx",
                                                         "tokenizer.json", "tokenizer_config.json"]
        id2label = json.loads((out / "config.json").read_text())["id2label"]
        assert id2label == {"0": "animal", "1": "place"}
        tokenizer = Tokenizer.from_file(str(out / "tokenizer.json"))
        pad = tokenizer.token_to_id("<pad>")
        tokenizer.enable_padding(pad_id=pad if pad is not None else tokenizer.token_to_id("[PAD]"))
        batch = tokenizer.encode_batch(TEXTS)
        feed = {"input_ids": [e.ids for e in batch], "attention_mask": [e.attention_mask for e in batch],
                "token_type_ids": [e.type_ids for e in batch]}
        session = ort.InferenceSession(str(out / "model.onnx"), providers=["CPUExecutionProvider"])
        inputs = {i.name: np.array(feed[i.name], dtype=np.int64) for i in session.get_inputs()}
        (logits,) = session.run(None, inputs)
        got = torch.tensor(logits).softmax(-1).numpy()
        assert np.abs(got - _predict(capsys, run, TEXTS, tmp_path)).max() <= PROB_TOLERANCE
        header = hub_header((out / "README.md").read_text())
        assert (header["library_name"], header["pipeline_tag"]) == ("onnx", "text-classification")
    assert _card_code(out / "README.md", out).split()[0] in ("animal", "place")


def _card_code(card: Path, directory: Path) -> str:
    """Run the card's Python example (DIR: the export) in a fresh interpreter; its output."""
    text = card.read_text()
    code = text[text.index("```python\n") + len("```python\n"):]
    code = code[: code.index("```")].replace("DIR", str(directory))
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr
    return proc.stdout


def test_seq2seq_run_onnx_is_optimums_layout_and_the_cards_loop_generates_what_tformer_does(capsys, tmp_path,
                                                                                          runs):
    import onnxruntime as ort

    out = tmp_path / "onnx"
    rc, _, err = _run(capsys, "export", runs["seq2seq"], "--onnx", out)
    assert rc == 0 and "max abs diff" in err
    assert sorted(p.name for p in out.iterdir()) == [
        "README.md", "config.json", "decoder_model.onnx", "decoder_with_past_model.onnx", "encoder_model.onnx",
        "generation_config.json", "tokenizer.json", "tokenizer_config.json"]
    assert json.loads((out / "config.json").read_text())["model_type"] == "pegasus"

    def names(name):
        return [i.name for i in ort.InferenceSession(str(out / name)).get_inputs()]

    assert names("encoder_model.onnx") == ["input_ids", "attention_mask"]
    assert names("decoder_model.onnx") == ["input_ids", "encoder_hidden_states", "encoder_attention_mask"]
    assert names("decoder_with_past_model.onnx")[:4] == ["input_ids", "encoder_attention_mask",
                                                         "past_key_values.0.decoder.key",
                                                         "past_key_values.0.decoder.value"]
    assert hub_header((out / "README.md").read_text())["pipeline_tag"] == "text2text-generation"
    rc, expected, _ = _run(capsys, "generate", runs["seq2seq"], "some text")
    assert rc == 0
    assert _card_code(out / "README.md", out) == expected  # the decoding example, run as it is


def test_onnx_never_writes_over_a_users_file(capsys, tmp_path, runs):
    user = tmp_path / "mine.onnx"
    user.write_bytes(b"my own model")
    for model in (runs["finetuned"], bert_dir()):  # a run (a folder), a model directory (a file)
        rc, _, err = _run(capsys, "export", model, "--onnx", user)
        assert rc == 2 and err.count("\n") == 1, err
    assert user.read_bytes() == b"my own model"
    out = tmp_path / "encoder.onnx"
    assert _run(capsys, "export", bert_dir(), "--onnx", out)[0] == 0
    assert _run(capsys, "export", bert_dir(), "--onnx", out)[0] == 0  # its own earlier export: replaced
    rc, _, err = _run(capsys, "export", runs["finetuned"], "--onnx", tmp_path / "new.onnx")
    assert rc == 2 and "a run exports a folder" in err and not (tmp_path / "new.onnx").exists()


def test_a_symlinked_hf_target_is_followed_and_stays_a_link(capsys, tmp_path, runs):
    target = tmp_path / "real"
    link = tmp_path / "link"
    link.symlink_to(target, target_is_directory=True)  # dangling at first: refused, nothing created
    rc, _, err = _run(capsys, "export", runs["finetuned"], "--hf", link)
    assert rc == 2 and err.count("\n") == 1 and f"--hf {link}: a symbolic link to {target}, which does not " \
        "exist" in err, err
    assert not target.exists() and sorted(p.name for p in tmp_path.iterdir()) == ["link"]
    target.mkdir()
    for _ in range(2):  # an empty folder, then a tformer export replaced
        rc, _, err = _run(capsys, "export", runs["finetuned"], "--hf", link)
        assert rc == 0, err
        assert link.is_symlink() and (target / "config.json").is_file()
        assert sorted(p.name for p in tmp_path.iterdir()) == ["link", "real"]  # nothing stray
    user = tmp_path / "theirs"
    user.mkdir()
    (user / "notes.txt").write_text("mine")
    link.unlink()
    link.symlink_to(user, target_is_directory=True)
    rc, _, err = _run(capsys, "export", runs["finetuned"], "--hf", link)
    assert rc == 2 and "notes.txt" in err and sorted(p.name for p in user.iterdir()) == ["notes.txt"]


def test_synthetic_task_runs_refuse_hf_in_one_line(capsys, tmp_path):
    run = tmp_path / "rev"
    assert main(tiny_train_argv(run)) == 0
    rc, _, err = _run(capsys, "export", run, "--hf", tmp_path / "hf")
    assert rc == 2 and err.count("\n") == 1 and "synthetic-task run" in err


# D2: one publisher, foreign files never overwritten, never a mixed directory ------------------
def test_a_folder_of_user_files_is_refused_and_left_unchanged(capsys, tmp_path, runs):
    user = tmp_path / "mine"
    user.mkdir()
    (user / "config.json").write_text('{"mine": 1}')
    (user / "README.md").write_text("my notes")
    for option in ("--hf", "--onnx"):
        run = runs["finetuned"] if option == "--hf" else runs["seq2seq"]
        rc, _, err = _run(capsys, "export", run, option, user)
        assert rc == 2 and err.count("\n") == 1, err
        assert f"{option}: expected a new or empty folder" in err and "config.json" in err
    assert sorted(p.name for p in user.iterdir()) == ["README.md", "config.json"]
    assert (user / "config.json").read_text() == '{"mine": 1}'
    assert (user / "README.md").read_text() == "my notes"


def _tree(directory: Path) -> dict[str, bytes]:
    return {p.relative_to(directory).as_posix(): p.read_bytes()
            for p in sorted(directory.rglob("*")) if p.is_file()}


def test_files_a_user_put_into_an_earlier_export_are_never_deleted(capsys, tmp_path, runs):
    """An export replaces the whole folder, so a later export over an earlier one would delete
    what the user added there: refused in one line naming it; the card lists what tformer wrote."""
    out = tmp_path / "hf"
    assert _run(capsys, "export", runs["finetuned"], "--hf", out)[0] == 0
    card = (out / "README.md").read_text()
    assert '"config.json"' in card and "tformer export files:" in card
    (out / "my_notes.txt").write_text("mine")
    (out / "results").mkdir()
    (out / "results" / "eval.txt").write_text("important")
    before = _tree(out)
    for option, run in (("--hf", runs["finetuned"]), ("--onnx", runs["finetuned"])):
        rc, _, err = _run(capsys, "export", run, option, out)
        assert rc == 2 and err.count("\n") == 1, err
        assert "my_notes.txt" in err and "results/eval.txt" in err and "tformer did not write" in err
    assert _tree(out) == before
    (out / "my_notes.txt").unlink()
    (out / "results" / "eval.txt").unlink()  # the empty folder left holds nothing to lose
    assert _run(capsys, "export", runs["finetuned"], "--onnx", out)[0] == 0  # another format: replaced
    assert (out / "model.onnx").is_file() and not (out / "model.safetensors").exists()


def test_an_export_older_than_the_file_list_is_replaced_only_by_the_same_files(capsys, tmp_path, runs):
    out = tmp_path / "hf"
    assert _run(capsys, "export", runs["finetuned"], "--hf", out)[0] == 0
    card = out / "README.md"
    card.write_text("".join(line for line in card.read_text().splitlines(keepends=True)
                            if "tformer export files:" not in line))  # as older exports wrote it
    assert _run(capsys, "export", runs["finetuned"], "--hf", out)[0] == 0  # the same files
    card.write_text("".join(line for line in card.read_text().splitlines(keepends=True)
                            if "tformer export files:" not in line))
    (out / "extra.txt").write_text("mine")
    rc, _, err = _run(capsys, "export", runs["finetuned"], "--hf", out)
    assert rc == 2 and "extra.txt" in err and "this export does not write" in err
    assert (out / "extra.txt").read_text() == "mine"
    (out / "extra.txt").unlink()
    rc, _, err = _run(capsys, "export", runs["finetuned"], "--onnx", out)  # no list: not known as ours
    assert rc == 2 and "model.safetensors" in err and (out / "model.safetensors").is_file()


@pytest.mark.parametrize("option", ["--hf", "--onnx"])
def test_a_second_export_to_the_same_out_is_refused_while_the_first_runs(capsys, tmp_path, runs,
                                                                        monkeypatch, option):
    """Two exports at once both said "wrote" and one result was silently lost."""
    out, second = tmp_path / "out", []

    def start_another_export(what):  # while the first publishes
        if not second:
            monkeypatch.setattr(files, "fault_hook", None)
            second.append(_run(capsys, "export", runs["scratch"], option, out))

    monkeypatch.setattr(files, "fault_hook", start_another_export)
    rc, _, err = _run(capsys, "export", runs["finetuned"], option, out)
    assert rc == 0, err
    rc2, _, err2 = second[0]
    assert rc2 == 2 and err2.count("\n") == 1, err2
    assert f"{option} {out}: is being written by another tformer process (pid {os.getpid()})" in err2
    assert f"tformer export {runs['finetuned'].name} " in (out / "README.md").read_text()  # the first, whole
    assert sorted(p.name for p in tmp_path.iterdir()) == ["out"]


def _snapshot(directory: Path) -> dict[str, bytes]:
    return {p.name: p.read_bytes() for p in sorted(directory.iterdir())}


@pytest.mark.parametrize("kind", ["finetuned", "seq2seq"])
def test_a_failure_at_every_durable_step_leaves_the_old_export_or_the_new_one(capsys, tmp_path, runs,
                                                                               monkeypatch, kind):
    out = tmp_path / "hf"
    assert _run(capsys, "export", runs[kind], "--hf", out)[0] == 0
    old = _snapshot(out)
    (out / "README.md").write_bytes(old["README.md"] + b"\nold export\n")  # tell old from new apart
    old = _snapshot(out)
    steps = []
    monkeypatch.setattr(files, "fault_hook", steps.append)
    assert _run(capsys, "export", runs[kind], "--hf", out)[0] == 0
    new = _snapshot(out)
    assert len(steps) >= 5 and new != old
    for k in range(1, len(steps) + 1):
        (out / "README.md").write_bytes(old["README.md"])  # back to the old export
        for name in set(new) - set(old):
            (out / name).unlink()
        for name, data in old.items():
            (out / name).write_bytes(data)

        def fail(what, k=k, count=[0]):  # noqa: B006 - a counter per k
            count[0] += 1
            if count[0] == k:
                raise OSError(28, "No space left on device (injected)")

        monkeypatch.setattr(files, "fault_hook", fail)
        rc, _, err = _run(capsys, "export", runs[kind], "--hf", out)
        assert rc != 0 and err.count("\n") == 1, err
        assert _snapshot(out) == old, f"step {k}: a mixed directory"
        assert [p.name for p in tmp_path.iterdir() if p.name.startswith(".")] == []  # no temp left


def test_the_seq2seq_onnx_folder_goes_through_the_same_publisher(capsys, tmp_path, runs, monkeypatch):
    from tformer.export import onnx_seq2seq

    fake = {"encoder_model.onnx": b"enc", "decoder_model.onnx": b"dec"}
    monkeypatch.setattr(onnx_seq2seq, "seq2seq_onnx_files", lambda model, opset=18: (dict(fake), 0.0))
    out = tmp_path / "onnx"
    assert _run(capsys, "export", runs["seq2seq"], "--onnx", out)[0] == 0
    old = _snapshot(out)
    fake.update({"encoder_model.onnx": b"enc2", "decoder_model.onnx": b"dec2"})
    monkeypatch.setattr(files, "fault_hook", lambda what: (_ for _ in ()).throw(OSError(5, "injected"))
                        if "decoder_model.onnx" in what else None)
    assert _run(capsys, "export", runs["seq2seq"], "--onnx", out)[0] != 0
    assert _snapshot(out) == old


def test_a_kill_mid_export_leaves_the_old_export(capsys, tmp_path, runs):
    """A real SIGKILL at the 3rd durable step of a second export over the first."""
    out = tmp_path / "hf"
    assert _run(capsys, "export", runs["finetuned"], "--hf", out)[0] == 0
    old = _snapshot(out)
    env = dict(os.environ, TFORMER_KILL_AT_WRITE="3")
    proc = subprocess.run([sys.executable, "-m", "tformer", "export", str(runs["finetuned"]), "--hf",
                           str(out)], env=env, capture_output=True, text=True)
    assert proc.returncode == -9, proc.stderr
    assert _snapshot(out) == old
    # The killed export's hidden temp folder goes with the next export to the same folder.
    assert _run(capsys, "export", runs["finetuned"], "--hf", out)[0] == 0
    assert sorted(p.name for p in tmp_path.iterdir()) == ["hf"]


def test_exporters_do_not_import_training():
    """The circle hf_classifier -> training.loop -> objectives -> hf_classifier is cut: an exporter
    reads of training only the verdict (arithmetic on a test record, for the card), and training
    imports no exporter (tests/test_layout.py holds every package knot at none)."""
    code = ("import sys, tformer.export.hf_classifier, tformer.export.hf_seq2seq, tformer.export.onnx, "
            "tformer.export.model_card; "
            "print(sorted(m for m in sys.modules if m.startswith('tformer.training')))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "['tformer.training', 'tformer.training.verdict']"


def test_a_checkpoint_or_an_hf_export_given_as_model_dir_is_refused_naming_what_to_export(capsys, tmp_path,
                                                                                           runs):
    run = runs["finetuned"]
    checkpoint = next((run / "checkpoints").glob("step-*"))
    rc, _, err = _run(capsys, "export", checkpoint, "--onnx", tmp_path / "a.onnx")
    assert rc == 2 and err.count("\n") == 1 and f"is one checkpoint of the run {run}" in err
    hf = tmp_path / "hf"
    assert _run(capsys, "export", run, "--hf", hf)[0] == 0
    rc, _, err = _run(capsys, "export", hf, "--onnx", tmp_path / "a.onnx")
    assert rc == 2 and err.count("\n") == 1 and "BertForSequenceClassification directory" in err
    assert "tformer export RUN --onnx" in err and not (tmp_path / "a.onnx").exists()


def test_a_fine_tuned_embedding_runs_onnx_card_pads_with_its_own_token(capsys, tmp_path):
    """A BERT tokenizer pads with [PAD], not <pad>: the card's code runs as it is and gives
    `tformer embed`'s vectors (<= 1e-5) for its two texts."""
    data = write(tmp_path / "pairs.jsonl", embedding_rows(40))
    run = tmp_path / "ft-emb"
    assert main(["train", "--data", str(data), "--out", str(run), "--from-pretrained", str(bert_dir()),
                 "--max-length", "16", *TINY[TINY.index("--steps"):]]) == 0
    out = tmp_path / "onnx"
    rc, _, err = _run(capsys, "export", run, "--onnx", out)
    assert rc == 0, err
    code = (out / "README.md").read_text()
    assert 'token_to_id("[PAD]")' in code
    card = out / "README.md"
    card.write_text(code.replace("L2-normalised\n", "L2-normalised\nprint(sentences.tolist())\n", 1))
    got = np.array(json.loads(_card_code(card, out)))
    rc, expected, _ = _run(capsys, "embed", run, "some text", "another text")
    assert rc == 0
    expected = np.array([json.loads(line)["embedding"] for line in expected.splitlines()])
    assert np.abs(got - expected).max() <= PROB_TOLERANCE


def test_an_onnx_folder_naming_the_current_folder_is_one_line(capsys, classification_run, tmp_path, monkeypatch):
    """`export RUN --onnx .` reached the lock, which raised pathlib's "PosixPath('.') has an empty name"."""
    monkeypatch.chdir(tmp_path)
    rc, _, err = _run(capsys, "export", classification_run, "--onnx", ".")
    assert rc == 2 and err == "tformer export: error: --onnx: expected the name of a file or folder to write, got '.'\n", err
    assert list(tmp_path.iterdir()) == []
