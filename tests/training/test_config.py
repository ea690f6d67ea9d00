"""The training configuration: options a run would not read are refused, not ignored."""

import json

import pytest
from text_fixtures import classification_rows, embedding_rows, seq2seq_rows, write

from tformer.errors import FieldError
from tformer.kinds import resolve_config

FINE_TUNE = "/nonexistent/model"  # never opened: the options are refused before


@pytest.mark.parametrize("rows, options, message", [
    (classification_rows, {"task": "reverse"}, r"task: a run on --data .* expected no --task, got 'reverse'"),
    (classification_rows, {"valid_size": 10}, r"valid_size: .* expected no --valid-size, got 10"),
    (seq2seq_rows, {"pooling": "mean"}, r"pooling: a seq2seq run does not read it \(only a classification or a multilabel run does\); expected no --pooling, got 'mean'"),
    (embedding_rows, {"batch_size": 64},
     r"batch_size: an embedding run's batches hold --max-tokens 4096 tokens .* expected no --batch-size, got 64"),
    (classification_rows, {"from_pretrained": FINE_TUNE, "pooling": "cls"},
     r"pooling: a fine-tune keeps the tokenizer, sizes and pooling of /nonexistent/model; "
     r"expected no --pooling, got 'cls'"),
    (classification_rows, {"from_pretrained": FINE_TUNE, "vocab_size": 300}, r"vocab_size: a fine-tune keeps"),
    (classification_rows, {"from_pretrained": FINE_TUNE, "d_model": 64}, r"d_model: a fine-tune keeps"),
    (classification_rows, {"from_pretrained": FINE_TUNE, "dropout": 0.3, "pretrained_dropout": True},
     r"dropout: --pretrained-dropout keeps the dropout of /nonexistent/model; expected no --dropout, got 0.3"),
    (classification_rows, {"pretrained_dropout": True},
     r"pretrained_dropout: a run from scratch has no pretrained model's dropout to keep .* got True"),
])
def test_a_data_run_refuses_options_it_would_not_read(tmp_path, rows, options, message):
    data = write(tmp_path / "d.jsonl", rows(20))
    with pytest.raises(FieldError, match=message) as refused:  # named by its field, for a caller to rename
        resolve_config({"data": str(data), **options})
    assert refused.value.field == message.split(":")[0]


@pytest.mark.parametrize("options, message", [
    ({"columns": "a=b"}, r"columns: the synthetic task reverse brings its own data, tokenizer and lengths"),
    ({"vocab_size": 9}, r"vocab_size: the synthetic task reverse .* expected no --vocab-size, got 9"),
    ({"max_length": 20}, r"max_length: the synthetic task reverse"),
    ({"task": "sort", "pooling": "mean"}, r"pooling: a seq2seq run does not read it"),
    ({"pretrained_dropout": True}, r"pretrained_dropout: a run from scratch has no pretrained model's dropout"),
])
def test_a_synthetic_task_refuses_the_data_options(options, message):
    with pytest.raises(FieldError, match=message) as refused:
        resolve_config({"task": "reverse"}, options)
    assert refused.value.field == message.split(":")[0]


def test_the_options_a_run_reads_are_taken(tmp_path):
    data = write(tmp_path / "d.jsonl", classification_rows(20))
    assert resolve_config({"data": str(data), "pooling": "cls", "batch_size": 8}).batch_size == 8
    assert resolve_config({"data": str(data), "from_pretrained": FINE_TUNE, "batch_size": 8,
                           "max_length": 32}).max_length == 32
    emb = write(tmp_path / "e.jsonl", embedding_rows(20))
    assert resolve_config({"data": str(emb), "max_tokens": None, "batch_size": 8}).batch_size == 8
    assert resolve_config({"task": "listops", "pooling": "mean", "valid_size": 8}).model.pooling == "mean"
    # Turning off a choice such a run never makes asks for nothing (a saved config holds it so).
    assert resolve_config({"task": "reverse", "d_model": 32, "auto_size": False}).auto_size is False
    assert resolve_config({"data": str(data), "from_pretrained": FINE_TUNE, "auto_length": False}).max_length
    with pytest.raises(ValueError, match=r"auto_size: the synthetic task reverse .* got True"):
        resolve_config({"task": "reverse", "auto_size": True})
    assert resolve_config({"task": "reverse", "pretrained_dropout": False}).pretrained_dropout is False


def test_a_fine_tune_takes_dropout_and_records_that_it_was_given(tmp_path):
    """Given (--dropout, or the model's options as a whole), a fine-tune's dropout is the user's
    (pretrained_dropout off); else the pretrained model's, whatever the option's default; the
    other runs' --dropout is read as before. A probability outside [0, 1) is refused, naming it."""
    data = write(tmp_path / "d.jsonl", classification_rows(20))
    tune = {"data": str(data), "from_pretrained": FINE_TUNE}
    given = resolve_config({**tune, "dropout": 0.3})
    assert (given.model.dropout, given.pretrained_dropout) == (0.3, False)
    assert resolve_config(tune).pretrained_dropout is True
    assert resolve_config({**tune, "model": {"dropout": 0.2}}).pretrained_dropout is False
    assert resolve_config({**tune, "model": {"d_ff": 64}}).pretrained_dropout is True
    assert resolve_config({**tune, "dropout": 0.3, "pretrained_dropout": False}).model.dropout == 0.3
    assert resolve_config({"data": str(data), "dropout": 0.3}).pretrained_dropout is True  # (not read)
    for bad in (1.0, -0.1):
        with pytest.raises(ValueError, match=rf"dropout: expected a probability in \[0, 1\), got {bad}"):
            resolve_config({**tune, "dropout": bad})


def test_a_bpe_vocabulary_below_the_byte_alphabet_is_refused_before_the_data_is_read(tmp_path):
    data = tmp_path / "d.jsonl"
    data.write_text('{"text": "a", "label": "x"}\n')
    with pytest.raises(ValueError, match=r"vocab_size: expected at least 260 for the bpe tokenizer"):
        resolve_config({"data": str(data), "vocab_size": 5})


def test_resuming_with_fewer_steps_than_the_checkpoint_is_refused_and_changes_nothing(tmp_path, monkeypatch,
                                                                                     capsys):
    """A run interrupted at step 2 of 100, resumed with --steps 1: refused in one line (it was tested
    at step 2 and saved again as ended there, its --steps 100 replaced by 1). --steps 2 only tests."""
    from cli_helpers import assert_one_line_error
    from helpers import tiny_train_argv

    from tformer.commands.cli import main
    from tformer.storage import files
    from tformer.storage.checkpoint import check_run_dir

    def ctrl_c(what: str) -> None:
        if "step-000004" in what:
            raise KeyboardInterrupt

    out = tmp_path / "run"
    argv = tiny_train_argv(out, "--eval-every", 2, steps=100)
    with monkeypatch.context() as m:
        m.setattr(files, "fault_hook", ctrl_c)
        assert main(argv) == 130
    before = {p.relative_to(out): p.read_bytes() for p in sorted(out.rglob("*")) if p.is_file()}
    capsys.readouterr()
    rc = main(["train", "--resume", str(out), "--steps", "1", "--quiet"])
    assert_one_line_error(rc, capsys.readouterr().err, "train",
                          r"--steps: expected at least 2, the step of its checkpoint \(the run was on its way to "
                          r"100\), got 1: a run does not train backwards; omit --steps to go on, or score it as "
                          rf"it is with `tformer eval {out}`")
    assert {p.relative_to(out): p.read_bytes() for p in sorted(out.rglob("*")) if p.is_file()} == before
    assert main(["train", "--resume", str(out), "--steps", "2", "--quiet"]) == 0  # its step: tests only
    test = json.loads((out / "metrics.jsonl").read_text().splitlines()[-1])
    assert (test["split"], test["step"]) == ("test", 2)
    assert json.loads((check_run_dir(out) / "trainer_state.json").read_text())["step"] == 2
