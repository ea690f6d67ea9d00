"""`tformer train`, `eval` and `generate` end to end, and their one-line errors."""

import json
import re
import shutil
import subprocess
import sys

import pytest

from tformer.commands.cli import main
from tformer.storage.checkpoint import check_run_dir
from tformer.training.config import RESUMABLE

TINY = ["--d-model", "16", "--n-heads", "2", "--d-ff", "32", "--n-layers", "1",
        "--batch-size", "8", "--valid-size", "16", "--test-size", "16", "--eval-every", "2",
        "--threads", "1", "--quiet"]


@pytest.fixture(scope="module")
def run_dir(tmp_path_factory):
    out = tmp_path_factory.mktemp("runs") / "reverse"
    assert main(["train", "--task", "reverse", "--steps", "4", "--out", str(out), *TINY]) == 0
    return out


def test_train_writes_a_run(run_dir):
    last = json.loads((run_dir / "metrics.jsonl").read_text().splitlines()[-1])
    assert last["split"] == "test" and last["step"] == 4 and "exact_match" in last


def test_train_resume_continues(run_dir, tmp_path):
    out = tmp_path / "r"
    assert main(["train", "--steps", "2", "--out", str(out), *TINY]) == 0
    assert main(["train", "--resume", str(out), "--steps", "4", "--quiet"]) == 0
    assert json.loads((check_run_dir(out) / "trainer_state.json").read_text())["step"] == 4
    assert main(["train", "--out", str(out), "--resume", "--steps", "5", "--quiet"]) == 0
    assert json.loads((check_run_dir(out) / "trainer_state.json").read_text())["step"] == 5


def test_train_options_from_a_yaml_file(tmp_path):
    cfg = tmp_path / "c.yaml"
    cfg.write_text("task: brackets\nsteps: 2\nd_model: 16\nn_heads: 2\nd_ff: 16\nlr: 1e-3\n"
                   "valid_size: 8\ntest_size: 8\n")
    out = tmp_path / "run"
    # the command line wins over the file
    assert main(["train", "--config", str(cfg), "--steps", "3", "--out", str(out), "--quiet",
                 "--threads", "1"]) == 0
    saved = json.loads((check_run_dir(out) / "train_config.json").read_text())
    assert saved["task"] == "brackets" and saved["steps"] == 3 and saved["model"]["d_model"] == 16
    assert saved["lr"] == 0.001  # YAML reads 1e-3 as a string; it is still a float here


def test_a_yaml_config_that_does_not_parse_is_one_line_naming_file_and_line(tmp_path, capsys):
    cfg = tmp_path / "bad.yaml"
    cfg.write_text("steps: 2\nmax_minutes: [1,2\n")
    assert main(["train", "--config", str(cfg), "--task", "reverse"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and f"config: {cfg}:3:1: expected valid YAML, got expected ','" in err, err


def test_eval_prints_metrics(run_dir, capsys):
    assert main(["eval", str(run_dir), "--samples", "2"]) == 0
    record = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert record["split"] == "test" and record["examples"] == 16


def test_generate_prints_one_line_per_input(run_dir, capsys):
    assert main(["generate", str(run_dir), "3 1 4 1 5", "271", "--beam-size", "2"]) == 0
    lines = capsys.readouterr().out.strip().splitlines()
    assert len(lines) == 2 and all(set(line) <= set("0123456789 ") for line in lines)


@pytest.mark.parametrize("argv, message", [
    (["train", "--task", "nope"], "task: expected one of copy, reverse"),
    (["train", "--config", "{cfg}"], "config: unknown key(s) bogus"),
    (["eval", "{tmp}"], "is not a checkpoint (missing config.json"),
    (["generate", "{tmp}", "1 2"], "is not a checkpoint"),
    (["generate", "{run}", "3 x 4"], "'x' in '3 x 4' is not in the vocabulary"),
    (["generate", "{run}", "1" * 40], "expected at most 18 tokens with specials"),
    (["train", "--resume", "{run}", "--lr", "0.5"], "lr: cannot change when resuming"),
    (["train", "--resume", "{run}", "--out", "{tmp}/elsewhere"],
     "--out: a resumed run stays in its directory ({run}); expected no --out or that one, got {tmp}/elsewhere"),
    (["eval", "{bad}"], "model.safetensors: not a readable safetensors file"),
])
def test_bad_input_is_one_line_error(argv, message, run_dir, tmp_path, capsys):
    (tmp_path / "c.json").write_text('{"bogus": 1}')
    bad = tmp_path / "bad"  # a run whose weights file is corrupt
    shutil.copytree(run_dir, bad)
    (check_run_dir(bad) / "model.safetensors").write_bytes(b"not safetensors")
    (bad / "best.safetensors").unlink(missing_ok=True)  # so the checkpoint's weights are loaded
    argv = [a.format(cfg=tmp_path / "c.json", tmp=tmp_path, run=run_dir, bad=bad) for a in argv]
    message = message.format(tmp=tmp_path, run=run_dir)
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "Traceback" not in err and message in err


def test_bad_input_from_a_real_process(tmp_path):
    proc = subprocess.run([sys.executable, "-m", "tformer.commands.cli", "eval", str(tmp_path)],
                          capture_output=True, text=True)
    assert proc.returncode == 2 and "Traceback" not in proc.stderr
    assert proc.stderr.strip().count("\n") == 0 and "not a checkpoint" in proc.stderr


def test_train_help_shows_each_objectives_real_defaults(capsys):
    """--help says what a run on your data gets, not only the synthetic tasks' defaults: the
    presets of each kind (tformer.kinds), option by option."""
    from tformer.kinds import KINDS
    from tformer.training.config import DEFAULT_MODEL, FINETUNE_PRESET

    OBJECTIVE_PRESETS = {name: kind.objective.preset for name, kind in KINDS.items()}

    with pytest.raises(SystemExit):
        main(["train", "--help"])
    text = " ".join(capsys.readouterr().out.split())  # argparse wraps lines
    width = OBJECTIVE_PRESETS["classification"]["d_model"]
    assert f"model width (default: {width} on your data; synthetic tasks {DEFAULT_MODEL.d_model}" in text
    lrs = ", ".join(f"{kind} {preset['lr']}" for kind, preset in OBJECTIVE_PRESETS.items())  # every kind's
    assert lrs.startswith("classification ") and f"(default: {lrs}; fine-tuning by the model's width" in text
    assert FINETUNE_PRESET["lr"] is None
    poolings = {kind: p["pooling"] for kind, p in OBJECTIVE_PRESETS.items() if "pooling" in p}
    shown = (f"{poolings['classification']} on your data" if len(set(poolings.values())) == 1 < len(poolings)
             else ", ".join(f"{kind} {v}" for kind, v in poolings.items()))  # one value the kinds share: once
    assert f"pooler: a BertForSequenceClassification) (default: {shown};" in text
    assert (f"the head's) (default: {DEFAULT_MODEL.dropout} on your data; fine-tuning the pretrained model's; "
            f"synthetic tasks {DEFAULT_MODEL.dropout} or per task)") in text
    assert "usage: tformer train (--data FILE | --task NAME) [options]" in text


@pytest.mark.parametrize("argv, message", [
    (["--max-minutes", "-1"], "tformer train: error: --max-minutes: expected a positive number, got -1.0"),
    (["--lr", "inf"], "tformer train: error: --lr: expected a finite number, got inf"),
    (["--vocab-size", "8"], "tformer train: error: --vocab-size: the synthetic task reverse"),
    (["--config", "{cfg}"], "tformer train: error: {cfg}: max_minutes: expected a positive number, got -2"),
    (["--max-minutes", "1", "--out", "{cfg}"], "tformer train: error: --out: {cfg} is a file; expected a new"),
    (["--resume", "{cfg}"], "tformer train: error: --resume: {cfg} is not a directory"),
])
def test_train_errors_name_the_option_as_the_user_wrote_it(tmp_path, capsys, argv, message):
    """The command line's `--max-minutes`, or the config file's key, as the inference commands
    name `--threads` (the library's errors name the field: max_minutes)."""
    cfg = tmp_path / "c.json"
    cfg.write_text('{"max_minutes": -2}')
    argv = [a.format(cfg=cfg) for a in argv]
    assert main(["train", "--task", "reverse", "--out", str(tmp_path / "run"), *argv]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith(message.format(cfg=cfg)), err
    assert not (tmp_path / "run").exists()


def test_sigterm_stops_as_ctrl_c_does_and_the_run_resumes(tmp_path):
    """`kill`, `timeout` and job schedulers stop a run with SIGTERM: the same safe stop and word on
    how to go on as Ctrl-C, exit status 143 (it was the signal's own, with nothing said)."""
    import os
    import signal

    from cli_helpers import forked_main

    def sigterm_in_second_save(what: str) -> None:
        if "step-000004" in what:  # the first checkpoint (step 2) is published
            os.kill(os.getpid(), signal.SIGTERM)

    out, err = tmp_path / "run", tmp_path / "stderr"
    argv = ["train", "--task", "reverse", "--steps", "100", "--out", str(out), *TINY]
    assert forked_main(argv, sigterm_in_second_save, stderr=err) == 143
    assert err.read_text() == (f"tformer train: terminated; {out} keeps its last checkpoint; resume with "
                               f"`tformer train --resume {out}`\n")
    assert json.loads((check_run_dir(out) / "trainer_state.json").read_text())["step"] == 2
    assert main(["train", "--resume", str(out), "--steps", "6", "--quiet"]) == 0
    test = json.loads((out / "metrics.jsonl").read_text().splitlines()[-1])
    assert (test["split"], test["step"]) == ("test", 6)
    assert signal.getsignal(signal.SIGTERM) is signal.SIG_DFL  # the handler was the command's only


# A fine-tune of a tiny BERT whose own dropout is 0.05 (hidden states) and 0.15 (attention weights).
FINE_TUNE = ["--steps", "2", "--eval-every", "2", "--max-length", "16", "--precision", "fp32", "--threads", "1",
             "--quiet"]


@pytest.fixture(scope="module")
def fine_tune_inputs(tmp_path_factory):
    from hf_bert_fixtures import make_bert_dir
    from text_fixtures import classification_rows, write

    root = tmp_path_factory.mktemp("fine-tune")
    bert = make_bert_dir(root / "bert", hidden_dropout_prob=0.05, attention_probs_dropout_prob=0.15)
    return ["--data", str(write(root / "train.jsonl", classification_rows(60))), "--from-pretrained", str(bert)]


def _model_dropout(run) -> tuple[float, float]:
    """(dropout, attention_dropout) of the model the run's newest checkpoint holds."""
    config = json.loads((check_run_dir(run) / "config.json").read_text())
    return config["dropout"], config["attention_dropout"]


def _hf_dropout(run, out) -> tuple[float, float]:
    assert main(["export", str(run), "--hf", str(out)]) == 0
    config = json.loads((out / "config.json").read_text())
    return config["hidden_dropout_prob"], config["attention_probs_dropout_prob"]


def test_a_fine_tunes_dropout_is_the_given_one_through_resume_export_and_info(tmp_path, capsys,
                                                                              fine_tune_inputs):
    out = tmp_path / "run"
    assert main(["train", *fine_tune_inputs, "--dropout", "0.3", "--out", str(out), *FINE_TUNE]) == 0
    assert _model_dropout(out) == (0.3, 0.3)
    saved = json.loads((check_run_dir(out) / "train_config.json").read_text())
    assert (saved["model"]["dropout"], saved["pretrained_dropout"]) == (0.3, False)
    assert main(["train", "--resume", str(out), "--steps", "4", "--quiet"]) == 0
    assert json.loads((check_run_dir(out) / "trainer_state.json").read_text())["step"] == 4
    assert _model_dropout(out) == (0.3, 0.3)  # saved again from the model the resumed run built
    capsys.readouterr()
    assert main(["train", "--resume", str(out), "--steps", "6", "--dropout", "0.2"]) == 2
    err = capsys.readouterr().err
    assert err == "tformer train: error: --dropout: cannot change when resuming (the run has 0.3, got 0.2); " \
                  f"only {', '.join(RESUMABLE)} can\n", err
    assert _hf_dropout(out, tmp_path / "hf") == (0.3, 0.3)
    capsys.readouterr()
    assert main(["info", str(out)]) == 0
    assert re.search(r"^dropout +0\.3 \(attention weights 0\.3\)$", capsys.readouterr().out, re.M)


def test_a_fine_tune_without_dropout_keeps_the_pretrained_models_and_says_so(tmp_path, capsys, fine_tune_inputs):
    out = tmp_path / "run"
    assert main(["train", *fine_tune_inputs, "--out", str(out), *FINE_TUNE]) == 0
    assert "dropout: 0.05 (attention weights 0.15), the pretrained model's own (--dropout sets it)" in \
        capsys.readouterr().out
    assert _model_dropout(out) == (0.05, 0.15)
    assert _hf_dropout(out, tmp_path / "hf") == (0.05, 0.15)
    capsys.readouterr()
    assert main(["train", "--resume", str(out), "--steps", "4", "--dropout", "0.05"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("tformer train: error: --dropout: cannot change when resuming (the run trains with "
                          f"the dropout of {fine_tune_inputs[3]}, got 0.05)") and err.count("\n") == 1, err


@pytest.mark.parametrize("value", ["1", "-0.1"])
def test_a_fine_tunes_dropout_outside_0_1_is_one_line_naming_it(tmp_path, capsys, fine_tune_inputs, value):
    assert main(["train", *fine_tune_inputs, "--dropout", value, "--out", str(tmp_path / "run"), *FINE_TUNE]) == 2
    err = capsys.readouterr().err
    assert err == f"tformer train: error: --dropout: expected a probability in [0, 1), got {float(value)}\n", err
    assert not (tmp_path / "run").exists()


def test_a_run_given_to_from_pretrained_says_what_it_is_and_what_to_do(tmp_path, capsys, classification_run,
                                                                      run_dir):
    """A classification run (or one of its checkpoints) named by --from-pretrained said
    "RUN/config.json: no such file" (the checkpoint: "tokenizer.json: no such file")."""
    from text_fixtures import classification_rows, write

    data = write(tmp_path / "train.jsonl", classification_rows(40))
    todo = (f"write its encoder as one with `tformer export {classification_run} --hf DIR` (pip install "
            "'tformer[hf]'), then give --from-pretrained DIR\n")
    saved = check_run_dir(classification_run)
    for given, what in [(classification_run, f"{classification_run} is a tformer run (classification)"),
                        (saved, f"{saved} is a checkpoint of the tformer run {classification_run} "
                                "(classification)")]:
        assert main(["train", "--data", str(data), "--from-pretrained", str(given), "--out",
                     str(tmp_path / "run"), "--steps", "2", "--quiet"]) == 2
        assert capsys.readouterr().err == (f"tformer train: error: --from-pretrained: {what}, not a model "
                                           f"directory; {todo}")
        assert not (tmp_path / "run").exists()
    assert main(["train", "--data", str(data), "--from-pretrained", str(run_dir), "--out", str(tmp_path / "run"),
                 "--steps", "2", "--quiet"]) == 2
    err = capsys.readouterr().err
    assert err.startswith(f"tformer train: error: --from-pretrained: {run_dir} is a tformer run (a synthetic "
                          "task's), not a model directory; fine-tuning starts from an encoder: ") and \
        err.count("\n") == 1, err
