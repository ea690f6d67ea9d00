import subprocess
import sys

from tformer import TransformerConfig
from tformer.commands.cli import main


def test_info_prints_sizes(tmp_path, capsys):
    TransformerConfig(d_model=512, n_heads=8, d_ff=2048, n_layers=6).save(tmp_path / "c.json")
    assert main(["info", str(tmp_path / "c.json"), "--seq-len", "128"]) == 0
    out = capsys.readouterr().out
    assert "18,914,304" in out and "FLOPs per token" in out and "activation memory" in out
    for option in ("--seq-len", "--batch"):  # --seq-len 0 was read as "not given"
        assert main(["info", str(tmp_path / "c.json"), option, "0"]) == 2
        assert capsys.readouterr().err.strip() == f"tformer info: error: {option}: expected a positive int, got 0"


def test_bad_config_is_one_line_error(tmp_path):
    (tmp_path / "c.json").write_text('{"d_model": 30, "n_heads": 4}')
    proc = subprocess.run([sys.executable, "-m", "tformer.commands.cli", "info", str(tmp_path / "c.json")],
                          capture_output=True, text=True)
    assert proc.returncode == 2
    assert proc.stderr.strip().count("\n") == 0 and "Traceback" not in proc.stderr
    assert "d_model: expected a multiple of n_heads (4), got 30" in proc.stderr


def test_info_does_not_allocate_a_huge_model(tmp_path, capsys):
    import time

    TransformerConfig(d_model=64, n_heads=4, n_layers=10**9).save(tmp_path / "c.json")
    start = time.process_time()
    assert main(["info", str(tmp_path / "c.json")]) == 0
    assert time.process_time() - start < 5  # not minutes: nothing is built per layer
    assert "281,152,000,000,000" in capsys.readouterr().out


def test_sizes_past_what_torch_can_represent_are_one_line(tmp_path, capsys):
    TransformerConfig(d_model=10**12, n_heads=4, d_ff=4, n_layers=2).save(tmp_path / "c.json")
    assert main(["info", str(tmp_path / "c.json")]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "would exceed 2**63 bytes" in err


def test_a_metrics_line_cut_short_is_a_warning_not_an_error(tmp_path, capsys, classification_run):
    import shutil

    run = tmp_path / "run"
    shutil.copytree(classification_run, run)
    metrics = run / "metrics.jsonl"
    text = metrics.read_text()
    metrics.write_text(text + text.splitlines()[0][:20])  # a write a crash cut short
    assert main(["info", str(run)]) == 0
    out = capsys.readouterr().out
    assert "1 line(s) cut short" in out and "test" in out


def test_a_weights_file_cut_short_is_a_warning(tmp_path, capsys, classification_run):
    import shutil

    from tformer.storage.checkpoint import check_run_dir

    run = tmp_path / "run"
    shutil.copytree(classification_run, run)
    weights = check_run_dir(run) / "model.safetensors"
    weights.write_bytes(weights.read_bytes()[:-5])
    assert main(["info", str(run)]) == 0
    out = capsys.readouterr().out
    assert f"{weights}: not a readable safetensors file" in out


def test_info_says_which_steps_weights_were_tested(tmp_path, capsys, classification_run):
    """A run tests its best validated weights: info showed "(step 1630, 57 s)" and not that the
    weights of step 490 were the ones tested."""
    import json
    import shutil

    run = tmp_path / "run"
    shutil.copytree(classification_run, run)
    metrics = run / "metrics.jsonl"
    lines = metrics.read_text().splitlines()
    test = json.loads(lines[-1])
    assert test["split"] == "test"
    for tested, said in ((test["step"], ""), (1, "; the weights of step 1 tested")):
        metrics.write_text("\n".join(lines[:-1] + [json.dumps({**test, "tested_step": tested})]) + "\n")
        assert main(["info", str(run)]) == 0
        assert f"(step {test['step']}, {test['wall_seconds']:.0f} s{said})" in capsys.readouterr().out


def test_a_run_with_a_damaged_train_config_or_data_json_is_named_in_one_line(tmp_path, capsys):
    ckpt = tmp_path / "run" / "checkpoints" / "step-000001"
    ckpt.mkdir(parents=True)
    TransformerConfig(d_model=32, n_heads=2).save(ckpt / "config.json")
    for path, text in [(ckpt / "train_config.json", '{"data": "x.csv", "lr'),
                       (tmp_path / "run" / "data.json", '{"objective": "classif')]:
        (ckpt / "train_config.json").write_text('{"data": "x.csv"}')
        path.write_text(text)
        assert main(["info", str(tmp_path / "run")]) == 2
        assert capsys.readouterr().err.startswith(f"tformer info: error: {path}: not valid JSON (")
    (ckpt / "train_config.json").write_text('{"lr": 0.1}')  # neither data nor task: no KeyError
    assert main(["info", str(tmp_path / "run")]) == 0


def test_a_run_before_its_first_checkpoint_says_so_and_what_it_knows(tmp_path, monkeypatch, capsys):
    """Killed in its first save (or still training towards it): no config.json yet, and info says
    that, whether it trains now, and what its data.json and metrics.jsonl know (it said: no such
    config file)."""
    import os

    from text_fixtures import classification_rows, write

    from tformer.storage import files
    from tformer.storage.rundir import RunLock

    def ctrl_c(what: str) -> None:
        if "step-000004" in what:
            raise KeyboardInterrupt

    data = write(tmp_path / "train.jsonl", classification_rows(80))
    out = tmp_path / "run"
    with monkeypatch.context() as m:
        m.setattr(files, "fault_hook", ctrl_c)
        assert main(["train", "--data", str(data), "--out", str(out), "--steps", "100", "--d-model", "16",
                     "--n-heads", "2", "--d-ff", "32", "--n-layers", "1", "--vocab-size", "260", "--max-tokens",
                     "256", "--eval-every", "4", "--log-every", "2", "--threads", "1", "--quiet"]) == 130
    capsys.readouterr()
    assert main(["info", str(out)]) == 0
    rows = dict(line.split(None, 1) for line in capsys.readouterr().out.splitlines())
    assert rows == {
        "checkpoint": "none yet; not running (killed or stopped before its first save): start it again "
                      f"with `tformer train --out {out}`",
        "objective": "classification (2 labels: animal, place)", "data": str(data),
        "tokenizer": "260 tokens (tokenizer.json)",
        "trained": rows["trained"], "model": "its sizes are saved with its first checkpoint (config.json)"}
    assert rows["trained"].startswith("4 steps of 100 (loss ")
    with RunLock(out):  # as a run training there holds it
        assert main(["info", str(out)]) == 0
    assert capsys.readouterr().out.startswith(
        f"checkpoint  none yet; in progress (pid {os.getpid()}): its first checkpoint is saved at its first "
        "validation\n")


def test_info_reads_the_newer_checkpoint_when_a_live_run_prunes_the_one_it_found(tmp_path, monkeypatch, capsys,
                                                                                  classification_run):
    """A run training now publishes a checkpoint and prunes the one before, which info had just
    found through checkpoints/latest (1 read in 14 failed with 'no such file'): info reads again."""
    import shutil

    from helpers import prune_at_first_read

    run = tmp_path / "run"
    shutil.copytree(classification_run, run)
    assert main(["info", str(run)]) == 0
    expected = capsys.readouterr().out
    pruned = prune_at_first_read(monkeypatch)
    assert main(["info", str(run)]) == 0, capsys.readouterr().err
    assert len(pruned) == 1 and not pruned[0].exists()
    assert capsys.readouterr().out == expected


def _rows(out: str) -> dict[str, str]:
    return dict(line.split("  ", 1) for line in out.splitlines() if line.strip() and not line.startswith(" "))


def test_info_describes_a_sentence_transformers_directory(capsys):
    """The model a user is about to fine-tune or embed with: info said "config: unknown key(s)
    _name_or_path, architectures, ..." of its BERT config.json."""
    from hf_bert_fixtures import ST_MAX_SEQ_LENGTH, VOCAB, st_dir

    assert main(["info", str(st_dir())]) == 0
    rows = {k.strip(): v.strip() for k, v in _rows(capsys.readouterr().out).items()}
    assert rows["model directory"] == "sentence-transformers: a BERT-format encoder (BertModel)"
    assert rows["max length"] == f"{ST_MAX_SEQ_LENGTH} tokens (sentence_bert_config.json); positions: 64"
    assert rows["tokenizer"] == f"{len(VOCAB)} tokens (tokenizer.json)"
    assert rows["pooling"] == "mean, L2-normalized"
    assert "--from-pretrained DIR" in rows["use with"] and "embed" in rows["use with"]
    assert rows["layers x d_model x heads x d_ff"] == "2 x 32 x 4 x 64"
    assert rows[f"forward FLOPs per token (seq {ST_MAX_SEQ_LENGTH})"]  # the length it runs at


def test_info_describes_a_bert_directory_and_one_without_a_tokenizer(tmp_path, capsys):
    from hf_bert_fixtures import bert_dir, copy_dir

    assert main(["info", str(bert_dir())]) == 0
    rows = {k.strip(): v.strip() for k, v in _rows(capsys.readouterr().out).items()}
    assert rows["model directory"] == "a BERT-format encoder (BertModel)"
    assert rows["max length"] == "64 tokens"
    assert rows["pooling"].startswith("mean (no modules.json")
    bare = copy_dir(bert_dir(), tmp_path / "bare")
    for name in ("tokenizer.json", "vocab.txt"):
        (bare / name).unlink()
    assert main(["info", str(bare)]) == 0  # its sizes still, and what the commands will miss
    rows = {k.strip(): v.strip() for k, v in _rows(capsys.readouterr().out).items()}
    assert "no such file (nor vocab.txt)" in rows["warning"] and rows["max length"] == "64 tokens (positions: 64)"


def test_a_directory_neither_run_nor_model_is_one_line(tmp_path, capsys):
    (tmp_path / "notes.txt").write_text("x")
    assert main(["info", str(tmp_path)]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith(f"tformer info: error: config: {tmp_path}: expected a run "
                                                   "directory (checkpoints/), a model directory")
    assert err.strip().endswith("got a directory holding none of them")


def test_a_run_is_described_without_the_machines_kernel_cache_unless_asked(classification_run, capsys):
    """`tformer info RUN` printed this machine's kernel cache (its path and four of its choices)
    amid what the run is; it is the machine's, not the run's: --kernels lists it whole."""
    from tformer.nn.kernels import autotune

    autotune.choose("info-test", "shape", {"a": lambda: None, "b": lambda: None})
    assert main(["info", str(classification_run)]) == 0
    out = capsys.readouterr().out
    assert "objective" in out and "kernel" not in out and str(autotune.cache_path()) not in out
    assert main(["info", str(classification_run), "--kernels"]) == 0
    out = capsys.readouterr().out
    assert "kernel choices measured here" in out and "info-test | " in out and str(autotune.cache_path()) in out
