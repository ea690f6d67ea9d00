"""Each objective trains end to end from your files, from the command line, and its run
directory works with generate / predict / eval / embed / info; resume is exact."""

import json

import numpy as np
import pytest
import torch
from helpers import tiny_train_argv
from safetensors.torch import load_file
from text_fixtures import classification_rows, embedding_rows, seq2seq_rows, write

from tformer.commands.cli import main
from tformer.kinds import resolve_config, train
from tformer.storage.checkpoint import check_run_dir
from tformer.training import resume_config
from tformer.training.precision import bf16_supported

TINY = ["--d-model", "32", "--n-heads", "2", "--d-ff", "64", "--n-layers", "1", "--vocab-size", "300",
        "--max-tokens", "512", "--eval-every", "4", "--log-every", "2", "--threads", "1", "--quiet"]
QUIET = dict(progress=False, log=lambda *a: None)



def _train(tmp_path, rows, suffix, *extra):
    data = write(tmp_path / f"train{suffix}", rows)
    out = tmp_path / "run"
    assert main(["train", "--data", str(data), "--out", str(out), "--steps", "8", *TINY, *extra]) == 0
    lines = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    return out, lines


@pytest.mark.parametrize("suffix", [".jsonl", ".csv", ".tsv"])
def test_seq2seq_trains_and_generates(tmp_path, suffix, capsys):
    out, lines = _train(tmp_path, seq2seq_rows(), suffix)
    test = lines[-1]
    assert test["split"] == "test" and {"bleu", "chrf", "exact_match"} <= set(test)
    assert lines[0]["loss"] > [r for r in lines if r["split"] == "train"][-1]["loss"]
    for name in ("tokenizer.json", "data.json", "best.safetensors", "curves.png"):
        assert (out / name).is_file(), name
    inputs = tmp_path / "in.txt"
    inputs.write_text("the cat sat\n東京 %s café\n", encoding="utf-8")
    capsys.readouterr()
    assert main(["generate", str(out), "--file", str(inputs), "--beam-size", "2"]) == 0
    assert len(capsys.readouterr().out.splitlines()) == 2


@pytest.mark.parametrize("suffix, pair", [(".jsonl", False), (".csv", True), (".tsv", False)])
def test_classification_trains_predicts_and_evals(tmp_path, suffix, pair, capsys):
    out, lines = _train(tmp_path, classification_rows(pair=pair), suffix)
    test = lines[-1]
    assert {"accuracy", "macro_f1", "baseline", "beats_baseline"} <= set(test)
    assert (out / "confusion.png").is_file()
    texts = tmp_path / "t.txt"
    texts.write_text("the cat dog\nriver road\n")
    capsys.readouterr()
    assert main(["predict", str(out), "--file", str(texts), "--format", "jsonl"]) == 0
    rows = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
    assert [r["text"] for r in rows] == ["the cat dog", "river road"]
    assert all(r["label"] in ("animal", "place") and abs(sum(r["probabilities"].values()) - 1) < 1e-4
               for r in rows)
    test_file = write(tmp_path / f"more{suffix}", classification_rows(10, seed=5, pair=pair))
    assert main(["eval", str(out), "--data", str(test_file), "--samples", "0"]) == 0
    last = json.loads((out / "metrics.jsonl").read_text().splitlines()[-1])
    assert last["split"] == "eval" and last["examples"] == 10


def test_embedding_trains_and_loads_in_sentence_transformers(tmp_path, capfd):
    out, lines = _train(tmp_path, embedding_rows(), ".jsonl")
    assert {"recall_at_1", "mrr_at_10"} <= set(lines[-1])
    from sentence_transformers import SentenceTransformer

    from tformer.embeddings.sentence import SentenceEncoder

    texts = ["the cat sat", "東京 %s café", "Hello, World!"]
    capfd.readouterr()
    theirs = SentenceTransformer(str(out), device="cpu").encode(texts)
    loading = "".join(capfd.readouterr())
    # Every weight loads: no LOAD REPORT of a BERT pooler "newly initialized" (the run has none).
    assert "MISSING" not in loading and "newly initialized" not in loading, loading
    ours = SentenceEncoder.from_pretrained(out).encode(texts)
    assert np.abs(theirs - ours).max() <= 1e-5
    assert main(["embed", str(out), "the cat"]) == 0  # an embedding run is a model directory


def test_info_reports_a_data_run(tmp_path, capsys):
    out, _ = _train(tmp_path, classification_rows(), ".jsonl")
    capsys.readouterr()
    assert main(["info", str(out)]) == 0
    shown = capsys.readouterr().out
    assert "classification" in shown and "parameters" in shown and "test" in shown and "accuracy" in shown


def test_data_run_resume_is_bit_for_bit(tmp_path):
    data = write(tmp_path / "d.jsonl", seq2seq_rows())
    base = resolve_config({"data": str(data), "d_model": 32, "n_heads": 2, "d_ff": 64, "n_layers": 1,
                           "vocab_size": 300, "max_tokens": 256, "eval_every": 4, "threads": 1,
                           "dropout": 0.3, "accumulate": 2, "patience": None,
                           "schedule": "inverse_sqrt",  # a schedule that does not depend on --steps
                           "precision": "fp32"})  # (auto's first updates are timed: machine-dependent)
    train(base.replace(steps=8, out=str(tmp_path / "straight")), **QUIET)
    train(base.replace(steps=4, out=str(tmp_path / "resumed")), **QUIET)
    train(resume_config(tmp_path / "resumed", {"steps": 8}), resume=True, **QUIET)
    a = load_file(str(check_run_dir(tmp_path / "straight") / "model.safetensors"))
    b = load_file(str(check_run_dir(tmp_path / "resumed") / "model.safetensors"))
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)


@pytest.mark.skipif(not bf16_supported(), reason="no bfloat16 CPU kernel on this machine")
@pytest.mark.parametrize("precision", ["bf16", "fp32"])
def test_validations_and_the_test_run_in_the_precision_the_updates_take(tmp_path, monkeypatch, precision):
    """Scored in fp32 beside bf16 updates, a fine-tune's validation ran 2x slower an example
    than in bf16 (the same accuracy), and its probe sized the sample at a fifth of the plan's."""
    from tformer.training.objective import Objective

    evaluate, seen = Objective.evaluate, []

    def recording(self, model, split, *args, **kwargs):
        seen.append((split, torch.is_autocast_enabled("cpu") and torch.get_autocast_dtype("cpu")))
        return evaluate(self, model, split, *args, **kwargs)

    monkeypatch.setattr(Objective, "evaluate", recording)
    _, lines = _train(tmp_path, classification_rows(), ".jsonl", "--precision", precision)
    assert np.isfinite(lines[-1]["loss"])
    half = torch.bfloat16 if precision == "bf16" else False
    assert {split for split, _ in seen} == {"validation", "test"}
    assert all(dtype == half for _, dtype in seen), seen


@pytest.mark.parametrize("bf16_seconds, expected", [(0.5, "bf16"), (1.2, "fp32")])
def test_auto_precision_keeps_bf16_only_where_this_model_trains_faster_in_it(
        tmp_path, monkeypatch, bf16_seconds, expected):
    """auto predicts bf16 from a generic product, then the run's first updates alternate bf16 and
    fp32 (each a real update) and keep the faster: a model too small to gain goes on in fp32; a
    resumed run keeps what it chose; a new run of the same model on this machine alternates its
    first updates the same way (its numbers do not depend on what the machine remembers), then
    takes the remembered choice (tformer.nn.kernels.autotune) without a new line."""
    import tformer.training.precision as training_precision
    from tformer.nn.kernels import autotune
    from tformer.training import first_steps

    monkeypatch.setenv("TFORMER_CACHE_DIR", str(tmp_path / "cache"))  # a cache of its own
    monkeypatch.setattr(autotune, "_memory", {})
    monkeypatch.setattr(training_precision, "has_bf16", lambda: True)
    monkeypatch.setattr(training_precision, "bf16_speedup", lambda **_: 2.0)
    monkeypatch.setattr(training_precision, "bf16_supported", lambda: True)
    from tformer.training import steps

    used, warmed = [], []
    real, warm_pass = first_steps.FirstSteps.stepped, steps.warm_pass

    def timed(self, bf16, seconds, tokens, left, update, warm):  # 1 s per fp32 update, bf16_seconds per bf16
        used.append(bf16)
        return real(self, bf16, bf16_seconds if bf16 else 1.0, tokens, left, update, warm)

    monkeypatch.setattr(first_steps.FirstSteps, "stepped", timed)
    monkeypatch.setattr(steps, "warm_pass", lambda *a: warmed.append(a[-1]) or warm_pass(*a))
    data = write(tmp_path / "d.jsonl", classification_rows())
    logged = []
    rounds = 2 * first_steps.CONFIRM_ROUNDS
    config = resolve_config({"data": str(data), "d_model": 32, "n_heads": 2, "d_ff": 64, "n_layers": 1,
                             "vocab_size": 300, "max_tokens": 512, "steps": rounds + 2, "threads": 1,
                             "out": str(tmp_path / "run")})
    train(config, progress=False, log=logged.append)
    assert used[:rounds] == [True, False] * (rounds // 2) and set(used[rounds:]) == {expected == "bf16"}
    assert warmed == used[:rounds]  # each timed update passed its batch once untimed first, no other
    kept = [line for line in logged if line.startswith(f"precision: {expected} from here on, timed on the")]
    assert len(kept) == 1 and "training step of this model" in kept[0], logged
    state = json.loads((check_run_dir(tmp_path / "run") / "trainer_state.json").read_text())
    assert state["precision"] == expected
    logged.clear()
    used.clear()
    train(resume_config(tmp_path / "run", {"steps": rounds + 4}), resume=True, progress=False, log=logged.append)
    assert [line for line in logged if line.startswith("precision: ")] == [
        f"precision: {expected} (as the run chose when it started)"]
    assert set(used) == {expected == "bf16"} and len(warmed) == rounds  # nothing alternated (or warmed) again
    monkeypatch.setattr(autotune, "_memory", {})  # a new process: the choice comes from the file
    logged.clear()
    used.clear()
    train(config.replace(out=str(tmp_path / "run2")), progress=False, log=logged.append)
    assert used[:rounds] == [True, False] * (rounds // 2) and set(used[rounds:]) == {expected == "bf16"}
    chosen = [line for line in logged if line.startswith("precision: ")]
    assert len(chosen) == 1 and chosen[0].startswith(f"precision: {expected} ("), chosen
    assert any("train-precision | classifier d32 h2 ff64 L1 vocab " in key
               and key.endswith(" batch 512 tokens") for key in autotune.decisions())


def test_data_errors_are_one_line(tmp_path, capsys):
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"source": "a", "target": "b"}\n{"source": "c", "target": ""}\n')
    assert main(["train", "--data", str(bad), "--out", str(tmp_path / "r"), *TINY]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "bad.jsonl:2: target: expected text" in err


def test_classifier_from_scratch_learns(tmp_path):
    """An easy task (animal words vs place words) is learnt in a few dozen steps; this caught
    a token-type table initialised N(0, 1), which drowned the tokens."""
    data = write(tmp_path / "d.jsonl", classification_rows(400))
    record = train(resolve_config({"data": str(data), "d_model": 32, "n_heads": 2, "d_ff": 64,
                                   "n_layers": 1, "vocab_size": 300, "max_tokens": 512, "steps": 60,
                                   "lr": 1e-3, "warmup": 10, "eval_every": 30, "threads": 1,
                                   "out": str(tmp_path / "run")}), **QUIET)
    assert record["accuracy"] >= 0.9, record


def test_a_bad_data_file_leaves_no_run_directory(tmp_path):
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"source": "a", "target": "b"}\n{"source": "c"}\n')
    assert main(["train", "--data", str(bad), "--out", str(tmp_path / "r"), *TINY]) == 2
    assert not (tmp_path / "r").exists()


def test_out_refuses_a_finished_run_whose_checkpoints_were_removed(tmp_path, capsys):
    import shutil

    out, _ = _train(tmp_path, classification_rows(), ".jsonl")
    shutil.rmtree(out / "checkpoints")
    before = {p.name: p.read_bytes() for p in out.iterdir() if p.is_file()}
    data = tmp_path / "train.jsonl"
    assert main(["train", "--data", str(data), "--out", str(out), "--steps", "8", *TINY]) == 2
    assert "holds results of an earlier run" in capsys.readouterr().err
    assert {p.name: p.read_bytes() for p in out.iterdir() if p.is_file()} == before


def test_a_non_finite_validation_is_never_kept_as_a_good_checkpoint(tmp_path, monkeypatch):
    from tformer.kinds.classification import Classification

    data = write(tmp_path / "d.jsonl", classification_rows())
    config = resolve_config({"data": str(data), "d_model": 32, "n_heads": 2, "d_ff": 64, "n_layers": 1,
                             "vocab_size": 300, "max_tokens": 512, "eval_every": 4, "steps": 8,
                             "log_every": 2, "threads": 1, "out": str(tmp_path / "run")})
    monkeypatch.setattr(Classification, "score",
                        lambda self, records, preds: ({"accuracy": float("nan"), "macro_f1": 0.0}, []))
    with pytest.raises(ValueError, match="validation: expected finite outputs"):
        train(config, **QUIET)
    assert not (tmp_path / "run" / "best.safetensors").exists()
    lines = (tmp_path / "run" / "metrics.jsonl").read_text()
    assert "NaN" not in lines


def test_vocab_size_and_max_length_are_bounded_before_anything_is_built(tmp_path, capsys):
    data = write(tmp_path / "d.jsonl", seq2seq_rows())
    for flag, value, limit in (("--vocab-size", "1000000000", "1048576"), ("--max-length", "10000000", "8192")):
        assert main(["train", "--data", str(data), "--out", str(tmp_path / "r"), flag, value]) == 2
        assert f"expected at most {limit}" in capsys.readouterr().err
        assert not (tmp_path / "r").exists()


def test_best_weights_of_a_seq2seq_run_follow_the_validation_loss_not_bleu():
    """The validation sample's BLEU moves by a point between neighbouring validations; the
    teacher-forced loss decides which weights are kept for sequence-to-sequence runs, the
    main metric for the others (accuracy keeps rising while an overfitting loss turns)."""
    from tformer.kinds.classification import Classification
    from tformer.kinds.seq2seq import Seq2Seq
    from tformer.training.validation import selection as _selection
    from tformer.training.validation import track_best as _track_best

    state = {"step": 1222}
    seq2seq = Seq2Seq.__new__(Seq2Seq)  # _selection reads class attributes only
    seq2seq.source = type("Files", (), {"sequence_metric": "bleu"})()
    assert _track_best(state, *_selection(seq2seq, {"bleu": 26.9, "loss": 2.782}))
    state["step"] = 1533
    assert _track_best(state, *_selection(seq2seq, {"bleu": 25.9, "loss": 2.612}))  # BLEU fell
    assert state["best_step"] == 1533 and state["best_by"] == "loss"

    classifier = Classification.__new__(Classification)
    # A run saved before best_by: the loop takes its main metric as what picked its best.
    old = {"step": 900, "best": 0.85, "best_step": 800, "since_best": 0}
    old.setdefault("best_by", classifier.main_metric)
    assert not _track_best(old, *_selection(classifier, {"accuracy": 0.80, "loss": 0.5}))
    assert old["best_step"] == 800

    state["step"] = 1636  # a run resumed under another rule starts its selection over
    assert _track_best(state, *_selection(classifier, {"accuracy": 0.845, "loss": 0.582}))
    state["step"] = 2000
    assert not _track_best(state, *_selection(classifier, {"accuracy": 0.84, "loss": 0.5}))
    assert state["best_step"] == 1636 and state["since_best"] == 1


def test_a_timed_run_says_its_pace_early_and_when_it_buys_few_updates():
    """A 1.5-minute fine-tune of a 22 M-parameter model on one busy core got 21 updates and
    learned nothing, with no word of it until the end: the pace is said after 3 steps."""
    from types import SimpleNamespace

    from tformer.training.budget import Budget, pace

    def budget(per: float, left: float):
        b = Budget(SimpleNamespace(steps=10**6, epochs=None, max_minutes=1), 0.0)
        b.last_step_seconds, b.train_deadline, b.now = per, lambda: left, lambda: 0.0
        return b

    assert pace(budget(0.004, 8.0), 3) == "pace: 4 ms a step, about 2,003 updates in the budget"
    few = pace(budget(3.2, 60.0), 3)
    assert few.startswith("pace: 3,200 ms a step, about 21 updates in the budget; few to learn from")


def test_the_curves_are_drawn_before_the_final_test(tmp_path, monkeypatch):
    """curves.png shows training and validation only: drawn before the test, whose deadline then
    counts its time, so a timed run's end keeps back only what follows the test."""
    from tformer.training import loop
    from tformer.training.objective import Objective

    order = []
    plot, evaluate = loop.plot_curves, Objective.evaluate
    monkeypatch.setattr(loop, "plot_curves", lambda *a: (order.append("curves"), plot(*a))[1])
    monkeypatch.setattr(Objective, "evaluate",
                        lambda self, model, split, *a, **k: (order.append(split),
                                                             evaluate(self, model, split, *a, **k))[1])
    out, _ = _train(tmp_path, classification_rows(), ".jsonl")
    assert order[-2:] == ["curves", "test"] and (out / "curves.png").is_file()


def test_best_weights_killed_between_their_write_and_the_checkpoint_match_the_resumed_state(tmp_path):
    """best.safetensors and the checkpoint that records its step are written one after the other:
    a kill between the two must not leave best weights of a step the resumed run never saw."""
    from cli_helpers import killed_at

    from tformer.storage import files

    def argv(out):
        return tiny_train_argv(out, "--keep", 9, "--eval-every", 1, steps=3)

    seen: list[str] = []
    files.fault_hook = seen.append
    try:
        assert main(argv(tmp_path / "run")) == 0  # learns where the third validation's writes come
    finally:
        files.fault_hook = None
    third = [i for i, what in enumerate(seen, 1) if "step-000003" in what][0]
    best_after = [i for i, what in enumerate(seen, 1) if i > third and "best.safetensors" in what]
    for k in [third, *best_after[:1]]:  # at checkpoint 3's first write, and at best's after it
        run = tmp_path / f"k{k}"
        assert killed_at(k, argv(run)), k
        resumed_at = json.loads((check_run_dir(run) / "trainer_state.json").read_text())["step"]
        # resumed without a step more: the test scores best.safetensors as the state's best step
        assert main(["train", "--resume", str(run), "--steps", str(resumed_at), "--quiet"]) == 0
        test = json.loads((run / "metrics.jsonl").read_text().splitlines()[-1])
        best = load_file(str(run / "best.safetensors"))
        kept = load_file(str(run / "checkpoints" / f"step-{test['tested_step']:06d}" / "model.safetensors"))
        assert all(torch.equal(best[key], kept[key]) for key in kept), (k, test["tested_step"])


def test_ctrl_c_says_how_to_resume_the_run(tmp_path, monkeypatch, capsys):
    import tformer.training.validation as loop  # (where the loop's checkpoints are written)

    saves = []

    def save_then_ctrl_c(*args, **kwargs):
        saves.append(1)
        if len(saves) == 2:  # Ctrl-C during the second save: the first is kept
            raise KeyboardInterrupt
        return save(*args, **kwargs)

    save = loop.save_checkpoint
    monkeypatch.setattr(loop, "save_checkpoint", save_then_ctrl_c)
    out = tmp_path / "run"
    argv = ["train", "--task", "reverse", "--steps", "4", "--eval-every", "2", "--out", str(out), "--d-model",
            "16", "--n-heads", "2", "--d-ff", "32", "--n-layers", "1", "--batch-size", "8", "--valid-size", "8",
            "--test-size", "8", "--threads", "1", "--quiet"]
    assert main(argv) == 130
    err = capsys.readouterr().err
    assert err == f"tformer train: interrupted; {out} keeps its last checkpoint; resume with " \
                  f"`tformer train --resume {out}`\n"
    monkeypatch.setattr(loop, "save_checkpoint", save)
    assert main(["train", "--resume", str(out), "--quiet"]) == 0
    assert json.loads((out / "metrics.jsonl").read_text().splitlines()[-1])["step"] == 4


def test_a_run_that_had_ended_and_was_interrupted_in_its_test_only_tests_when_resumed(
        tmp_path, monkeypatch, capsys):
    """Its last checkpoint says what stopped it (here --patience: a learning rate too small to
    move the weights improves nothing; a timed run's clock too, whose resume was refused as out
    of time): the resume trains no step more, it tests."""
    import tformer.training.loop as loop

    def ctrl_c(*args, **kwargs):
        raise KeyboardInterrupt

    out = tmp_path / "run"
    argv = tiny_train_argv(out, "--eval-every", 1, "--patience", 1, "--lr", "1e-30", steps=20)
    with monkeypatch.context() as m:
        m.setattr(loop, "with_baseline", ctrl_c)  # after the test is scored, before it is written
        assert main(argv) == 130
    assert json.loads((check_run_dir(out) / "trainer_state.json").read_text())["stopped_by"] == "patience"
    assert main(["train", "--resume", str(out), "--quiet"]) == 0
    test = json.loads((out / "metrics.jsonl").read_text().splitlines()[-1])
    assert (test["split"], test["step"], test["stopped_by"]) == ("test", 2, "patience")


@pytest.mark.parametrize("full_at", [2, 4])
def test_a_full_disk_in_a_save_says_which_checkpoint_is_kept_and_how_to_go_on(tmp_path, monkeypatch, capsys,
                                                                              full_at):
    """The save of step `full_at` meets a full disk (its first write fails with ENOSPC, as a
    plain write does: no file named): the line says what is left (the checkpoint of step 2, or
    none yet) and the command that goes on from it, which then does."""
    import errno
    import os

    from tformer.storage import files

    def full_disk(what: str) -> None:
        if f"step-{full_at:06d}" in what:
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

    out = tmp_path / "run"
    argv = tiny_train_argv(out, "--eval-every", 2, steps=6)
    with monkeypatch.context() as m:
        m.setattr(files, "fault_hook", full_disk)
        assert main(argv) == 1
    err = capsys.readouterr().err
    written = f"write {out}/checkpoints/step-{full_at:06d}/config.json"
    if full_at == 2:
        assert err == (f"tformer train: error: No space left on device ({written}); {out} has no checkpoint "
                       "yet (none was saved whole): free some space, then start it again with the same "
                       "command\n")
        assert main(argv) == 0
    else:
        assert err == (f"tformer train: error: No space left on device ({written}); {out} keeps its last "
                       f"good checkpoint, of step 2: free some space, then resume with `tformer train "
                       f"--resume {out}`\n")
        assert main(["train", "--resume", str(out), "--quiet"]) == 0
    assert json.loads((out / "metrics.jsonl").read_text().splitlines()[-1])["step"] == 6


# A fine-tune whose model is whole from the start (Objective.starts_complete) --------------------
START = {"steps": 4, "eval_every": 2, "log_every": 2, "max_length": 16, "threads": 1, "precision": "fp32"}


def _fine_tune_argv(options: dict[str, str], out, *extra) -> list[str]:
    given = [x for name, value in options.items() for x in (f"--{name.replace('_', '-')}", value)]
    return ["train", *given, "--out", str(out), "--max-length", "16", "--threads", "1", "--precision", "fp32",
            "--quiet", *(str(x) for x in extra)]


def _validated_steps(run) -> list[int]:
    lines = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    return [r["step"] for r in lines if r["split"] == "validation"]


@pytest.mark.parametrize("run, validated", [("embedding fine-tune", True), ("classification fine-tune", True),
                                            ("classification fine-tune, random head", False),
                                            ("embedding from scratch", False)])
def test_only_a_fine_tune_whose_model_is_whole_is_validated_before_its_first_update(
        tmp_path, embedding_fine_tune, run, validated):
    """A sentence-embedding fine-tune adds no parameter to its pretrained encoder, and a
    classification fine-tune's new head is fitted to its features first (tformer.training.probe):
    both are validated at step 0. A random head (--head-init random), and a model from scratch,
    start random."""
    options = {**embedding_fine_tune, **START, "out": str(tmp_path / "run")}
    if run.startswith("classification fine-tune"):
        options |= {"data": str(write(tmp_path / "c.jsonl", classification_rows())), "valid": None, "test": None,
                    "head_init": "random" if run.endswith("random head") else "auto"}
    elif run == "embedding from scratch":
        options |= {"from_pretrained": None, "d_model": 32, "n_heads": 2, "d_ff": 64, "n_layers": 1,
                    "vocab_size": 300, "max_tokens": 512}
    logged = []
    record = train(resolve_config(options), progress=False, log=logged.append)
    steps = _validated_steps(tmp_path / "run")
    assert steps == ([0, 2, 4] if validated else [2, 4]), steps
    assert ("pretrained_validation" in record) == validated, record
    assert record.get("head_probed", False) == (run == "classification fine-tune"), record
    if run == "embedding fine-tune":  # the test record says how the weights tested compare to the start
        lines = [json.loads(line) for line in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
        start = next(r for r in lines if r["split"] == "validation" and r["step"] == 0)
        assert record["pretrained_validation"] == start["mrr_at_10"]
        tested = record["tested_step"]
        said = [line for line in logged if line.startswith("test recall@1")]
        if tested:
            assert f"validation MRR@10 went from {start['mrr_at_10']:.4f} (the pretrained model) to " \
                   f"{record['tuned_validation']:.4f} (step {tested}" in said[0], said
        else:
            assert "the weights tested are those it started from, the pretrained model:" in said[0], said


def test_a_fine_tune_that_only_hurts_tests_the_pretrained_weights_and_says_so(tmp_path, embedding_fine_tune,
                                                                             capsys):
    """--lr 1.0 wrecks the encoder at its first update (every text one vector): no later step beats
    the pretrained model's validation, so its weights, as they were, are the ones tested, kept
    and evaluated, and the summary and the verdict say so, with both scores."""
    from tformer.kinds import load_run
    from tformer.nn.model import from_pretrained

    out = tmp_path / "run"
    assert main(_fine_tune_argv(embedding_fine_tune, out, "--lr", "1.0", "--steps", 6, "--eval-every", 2)) == 0
    shown = capsys.readouterr().out
    lines = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    valid = {r["step"]: r["mrr_at_10"] for r in lines if r["split"] == "validation"}
    test = lines[-1]
    assert test["tested_step"] == 0 and test["step"] == 6, test
    assert max(valid[s] for s in (2, 4, 6)) < valid[0], valid  # every fine-tuned step is worse
    best_step = max((2, 4, 6), key=lambda s: (valid[s], -s))
    assert (test["pretrained_validation"], test["tuned_validation"], test["tuned_step"]) == \
        (valid[0], valid[best_step], best_step)
    assert (f"after 6 steps, {test['wall_seconds']:.1f} s; the weights tested are those it started from, the "
            f"pretrained model: no fine-tuning step improved on its validation MRR@10 {valid[0]:.4f} (the best, "
            f"step {best_step}'s: {valid[best_step]:.4f})") in shown, shown
    assert "the pretrained model, as it was (no fine-tuning step improved on it)" in shown, shown  # the verdict
    pretrained = from_pretrained(embedding_fine_tune["from_pretrained"]).state_dict()
    best = load_file(str(out / "best.safetensors"))
    assert best.keys() == {f"encoder.{k}" for k in pretrained}
    assert all(torch.equal(best[f"encoder.{k}"], v) for k, v in pretrained.items())
    run = load_run(out)  # what eval, embed and export read: the same weights
    assert all(torch.equal(run.model.encoder.state_dict()[k], v) for k, v in pretrained.items())
    assert main(["eval", str(out)]) == 0
    evaluated = capsys.readouterr()
    assert evaluated.out.startswith(f"test mrr_at_10: {test['mrr_at_10']:.4f}\n")
    assert "the pretrained model, as it was (no fine-tuning step improved on it)" in evaluated.err  # not "learned"
    assert main(["info", str(out)]) == 0
    assert "the pretrained model's weights, as they were, tested" in capsys.readouterr().out


def test_a_fine_tune_killed_after_its_step_0_checkpoint_resumes_without_validating_step_0_again(
        tmp_path, embedding_fine_tune):
    """A real kill right after step 0's checkpoint and best weights are written: the resumed run
    trains on from step 0 (bit for bit as a run never killed) and validates steps 2 and 4 only."""
    from cli_helpers import killed_at

    from tformer.storage import files

    def argv(out):
        return _fine_tune_argv(embedding_fine_tune, out, "--steps", 4, "--eval-every", 2, "--keep", 9)

    seen: list[str] = []
    files.fault_hook = seen.append
    try:
        assert main(argv(tmp_path / "straight")) == 0
    finally:
        files.fault_hook = None
    first_best = next(i for i, what in enumerate(seen, 1) if "best.safetensors" in what)
    after = next(i for i, what in enumerate(seen, 1) if i > first_best and "best.safetensors" not in what)
    run = tmp_path / "killed"
    assert killed_at(after, argv(run))
    state = json.loads((check_run_dir(run) / "trainer_state.json").read_text())
    assert (state["step"], state["best_step"]) == (0, 0), state  # (metrics.jsonl may be ahead of it)
    assert main(["train", "--resume", str(run), "--quiet"]) == 0
    assert _validated_steps(run) == _validated_steps(tmp_path / "straight") == [0, 2, 4]
    a = load_file(str(check_run_dir(tmp_path / "straight") / "model.safetensors"))
    b = load_file(str(check_run_dir(run) / "model.safetensors"))
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)
