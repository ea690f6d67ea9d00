"""Where a run's examples come from (tformer.training.sources): a data encoder's layout is
BERT's, with the layers the options ask for (--norm-first, --activation) honoured, not dropped."""

import json

import pytest
from cli_helpers import assert_one_line_error, run_cli
from text_fixtures import classification_rows, embedding_rows, write

import tformer
from tformer.config import TransformerConfig
from tformer.kinds import resolve_config, train
from tformer.storage.checkpoint import check_run_dir
from tformer.training import resume_config

TINY = {"steps": 2, "d_model": 16, "n_heads": 2, "d_ff": 32, "n_layers": 1, "vocab_size": 260,
        "max_tokens": 256, "eval_every": 2, "threads": 1}


def _train(tmp_path, name: str, rows, **options) -> tuple[tformer.Run, list[str]]:
    logged: list[str] = []
    data = write(tmp_path / f"{name}.jsonl", rows)
    run = tformer.train(data=str(data), out=str(tmp_path / name), progress=False, log=logged.append,
                        **{**TINY, **options})
    return run, logged


def _saved(run_dir) -> TransformerConfig:
    return TransformerConfig.load(check_run_dir(run_dir) / "config.json")


def test_a_classifier_on_your_data_is_bert_shaped_unless_asked_otherwise(tmp_path):
    _train(tmp_path, "bert", classification_rows(80))
    bert = _saved(tmp_path / "bert")
    assert (bert.norm_first, bert.final_norm, bert.activation) == (False, False, "gelu")
    _train(tmp_path, "asked", classification_rows(80), norm_first=True, activation="relu")
    asked = _saved(tmp_path / "asked")
    assert (asked.norm_first, asked.final_norm, asked.activation) == (True, True, "relu")
    assert (asked.embedding_norm, asked.positional, asked.type_vocab_size) == (True, "learned", 2)  # BERT's inputs


def test_an_embedding_run_honours_activation_and_refuses_pre_norm_up_front(tmp_path, capsys):
    _train(tmp_path, "relu", embedding_rows(80), activation="relu")
    assert _saved(tmp_path / "relu").activation == "relu"
    assert json.loads((tmp_path / "relu" / "0_Transformer" / "config.json").read_text())["hidden_act"] == "relu"
    data = write(tmp_path / "e.jsonl", embedding_rows(80))
    rc, _, err = run_cli(capsys, "train", "--data", data, "--out", tmp_path / "pre", "--norm-first", "--quiet")
    assert_one_line_error(rc, err, "train", r"--norm-first: .*sentence-transformers.*expected False, got True")
    assert not (tmp_path / "pre").exists()


@pytest.mark.parametrize("name, value", [("norm_first", True), ("activation", "relu")])
def test_a_fine_tune_refuses_layer_options_it_cannot_honour(tmp_path, name, value):
    data = write(tmp_path / "c.jsonl", classification_rows(8))
    with pytest.raises(ValueError, match=rf"^{name}: a fine-tune keeps the layers of bert-dir; .*got {value!r}$"):
        resolve_config({"data": str(data), "from_pretrained": "bert-dir", name: value})


def test_a_pre_norm_classifier_says_and_its_hf_export_refuses_naming_the_field(tmp_path, capsys):
    for pooling in ("mean", "cls"):
        run, logged = _train(tmp_path, pooling, classification_rows(80), norm_first=True, pooling=pooling)
        assert any("`export --hf`" in line and "norm_first" in line for line in logged), logged
        assert all(p["label"] in ("animal", "place") for p in run.predict(["a big cat"]))  # it runs
        rc, _, err = run_cli(capsys, "export", tmp_path / pooling, "--hf", tmp_path / f"{pooling}-hf")
        assert_one_line_error(rc, err, "export", r"--norm-first: .*needs False.*got True")
        assert not (tmp_path / f"{pooling}-hf").exists()


def test_a_run_resumes_the_model_its_checkpoint_holds(tmp_path):
    # Before --activation, a data encoder's train_config.json said relu (the default) for the
    # GELU model it built: resuming such a run must go on with GELU.
    _train(tmp_path, "old", classification_rows(80))
    path = check_run_dir(tmp_path / "old") / "train_config.json"
    saved = json.loads(path.read_text())
    saved["model"]["activation"] = "relu"
    path.write_text(json.dumps(saved))
    train(resume_config(tmp_path / "old", {"steps": 4}), resume=True, progress=False, log=lambda *a: None)
    state = json.loads((check_run_dir(tmp_path / "old") / "trainer_state.json").read_text())
    assert state["step"] == 4 and _saved(tmp_path / "old").activation == "gelu"
