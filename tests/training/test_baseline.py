"""Every test line carries its trivial baseline on the main metric, a run that does not beat it
says so (and `tformer info` and the model card say it again), and the
progress line shows what runs until the command ends."""

import json

import pytest
from text_fixtures import classification_rows, embedding_rows, seq2seq_rows, write

from tformer.commands.cli import main
from tformer.kinds import resolve_config, train
from tformer.training.report import Progress, baseline_verdict, beats_baseline
from tformer.training.verdict import judge

TINY = {"d_model": 32, "n_heads": 2, "d_ff": 64, "n_layers": 1, "vocab_size": 300, "max_tokens": 256,
        "threads": 1, "precision": "fp32", "eval_every": 1000}
BY = {"seq2seq": ("bleu", "copying the source"), "classification": ("accuracy", "the majority class"),
      "embedding": ("mrr_at_10", "token overlap")}


@pytest.mark.parametrize("kind, rows", [("seq2seq", seq2seq_rows(300)),
                                        ("classification", classification_rows(300)),
                                        ("embedding", embedding_rows(300))])
def test_every_test_line_records_its_baseline_and_whether_the_model_beat_it(tmp_path, kind, rows):
    data = write(tmp_path / "d.jsonl", rows)
    logged = []
    record = train(resolve_config({"data": str(data), **TINY, "steps": 2, "out": str(tmp_path / "run")}),
                   progress=False, log=logged.append)
    last = json.loads((tmp_path / "run" / "metrics.jsonl").read_text().splitlines()[-1])
    key, by = BY[kind]
    assert last["split"] == "test" and last == json.loads(json.dumps(record))
    assert last["main_metric"] == key and last["baseline_by"] == by and 0 <= last["baseline"]
    verdict, interval = judge(last[key], last["baseline"], key, last["examples"])
    assert last["verdict"] == verdict and last["gain_interval"] == pytest.approx(list(interval), abs=1e-4)
    assert last["beats_baseline"] == {"learned": True, "did not learn": False}.get(verdict)
    assert baseline_verdict(last) in logged


def test_the_baselines_are_what_they_say(tmp_path):
    """Copying the source scores the copy task perfectly; the majority class scores its share;
    token overlap ranks identical texts first."""
    from tformer.kinds import make_objective

    copy = make_objective(resolve_config({"task": "copy"}))
    test = copy.examples("test")
    assert copy.baseline(test) == {"baseline": 1.0, "baseline_by": "copying the source"}
    reverse = make_objective(resolve_config({"task": "reverse"}))
    assert reverse.baseline(reverse.examples("test"))["baseline"] < 0.5
    data = write(tmp_path / "c.jsonl", classification_rows(300))
    cls = make_objective(resolve_config({"data": str(data), **TINY}))
    records = cls.examples("test")
    share = max(sum(r["label"] == label for r in records) for label in ("animal", "place")) / len(records)
    assert cls.baseline(records)["baseline"] == pytest.approx(share)
    data = write(tmp_path / "e.jsonl", [{"anchor": f"word{i} other{i}", "positive": f"word{i} other{i}"}
                                        for i in range(300)])
    emb = make_objective(resolve_config({"data": str(data), **TINY}))
    assert emb.baseline(emb.examples("test"))["baseline"] == pytest.approx(1.0)


def test_a_run_that_does_not_beat_its_baseline_warns_in_the_run_in_info_and_in_the_model_card(
        tmp_path, monkeypatch, capsys):
    from tformer.kinds import load_run
    from tformer.kinds.classification import Classification

    monkeypatch.setattr(Classification, "_baseline", lambda self, examples: (1.0, "the majority class"))
    data = write(tmp_path / "d.jsonl", classification_rows(200))
    out = tmp_path / "run"
    assert main(["train", "--data", str(data), "--out", str(out), "--steps", "2", "--quiet",
                 *[f"--{k.replace('_', '-')}={v}" for k, v in TINY.items()]]) == 0
    printed = capsys.readouterr().out
    warning = [line for line in printed.splitlines() if line.startswith("warning: the model did not learn")]
    assert len(warning) == 1 and "does not beat the baseline of the majority class (accuracy 1.0000)" in warning[0]
    # How to train more follows what stopped it, --steps here (it said "a longer --max-minutes").
    assert warning[0].endswith("; a larger --steps trains more")
    assert main(["eval", str(out)]) == 0
    assert "; a larger --steps trains more" in capsys.readouterr().err
    assert main(["info", str(out)]) == 0
    info = capsys.readouterr().out
    assert any(line.startswith("warning") and "does not beat the baseline of the majority class" in line
               for line in info.splitlines()), info
    card = load_run(out).card("tformer export ...")
    from tformer.export.model_card import render

    shown = render(card, "x", "pass").decode()
    assert "**Warning:** this model did not beat its baseline (test accuracy" in shown
    assert "baseline (the majority class): 1" in shown


def test_the_copy_tasks_perfect_baseline_is_matched_by_a_perfect_score():
    assert beats_baseline(1.0, 1.0, "exact_match") and not beats_baseline(0.9, 1.0, "exact_match")
    assert not beats_baseline(0.3, 0.3, "accuracy") and beats_baseline(0.31, 0.3, "accuracy")
    record = {"main_metric": "bleu", "bleu": 21.94, "baseline": 3.1, "baseline_by": "copying the source"}
    assert baseline_verdict(record) == ("the model learned: test BLEU 21.94 beats the baseline of copying "
                                        "the source (BLEU 3.10)")
    assert baseline_verdict({"split": "test", "accuracy": 0.5}) is None  # written before baselines
    tie = {"main_metric": "mrr_at_10", "mrr_at_10": 1.0, "baseline": 1.0, "baseline_by": "token overlap",
           "beats_baseline": True}
    assert baseline_verdict(tie).startswith("the model matched a perfect baseline: test MRR@10 1.0000, "
                                            "as token overlap scores (MRR@10 1.0000); this test split is")


def test_the_progress_line_counts_steps_then_says_what_runs(capsys):
    bar = Progress(total=100, step=0, disabled=False, ends_at=None)
    bar.interval = 0  # draw every change
    bar.stepped(10, 80, loss="1.234")
    assert bar.bar.n == 10 and bar.bar.total == 80
    bar.status("testing", 64, 1000)
    shown = str(bar.bar)
    assert "testing 64/1,000" in shown and "10/80 steps" in shown and "loss 1.234" in shown
    bar.close()


def test_a_timed_runs_progress_bar_runs_on_time_and_its_total_never_moves(tmp_path, capsys, monkeypatch):
    """A timed run's step count is an estimate that moves with the pace (706 -> 1622 -> 599 ->
    1268 steps: its percentage went backwards); its bar's axis is the budget's seconds, which
    do not, and the steps made are shown beside. (It said 0/1000000000 steps once, then 0/?.)"""
    from tformer.training import report

    totals = []
    real = report.Progress.stepped

    def recording(self, step, total, **shown):
        real(self, step, total, **shown)
        totals.append((self.bar.total, self.bar.n))

    monkeypatch.setattr(report.Progress, "stepped", recording)
    data = write(tmp_path / "d.jsonl", seq2seq_rows(300))
    config = resolve_config({"data": str(data), **TINY, "max_minutes": 0.15, "out": str(tmp_path / "run")})
    train(config, progress=True, log=lambda line: None)
    err = capsys.readouterr().err
    assert len({total for total, _ in totals}) == 1 and totals[0][0] <= 9, totals  # seconds, fixed
    done = [n for _, n in totals]
    assert done == sorted(done), done  # never backwards
    assert "1000000000" not in err and "/? steps" not in err and ", ends in 0:" in err


def test_evaluation_reports_its_progress_batch_by_batch(tmp_path):
    """What the progress line shows while a test or a validation runs: every batch."""
    from tformer.kinds import make_objective

    data = write(tmp_path / "d.jsonl", seq2seq_rows(3000))
    objective = make_objective(resolve_config({"data": str(data), **TINY}))
    model = objective.build_model()
    examples = objective.examples("test")[:150]
    seen = []
    metrics, _ = objective.evaluate(model, "test", examples=examples, progress=lambda d, n: seen.append((d, n)))
    assert seen == [(64, 150), (128, 150), (150, 150)] and metrics["examples"] == 150


def test_generation_in_evaluation_is_bounded_by_the_source_length(tmp_path):
    """An untrained model decodes up to 2 x its source + 10 tokens, not the run's max length."""
    import torch

    from tformer.kinds import make_objective
    from tformer.kinds.seq2seq import generation_limit

    assert generation_limit(5, 128) == 20 and generation_limit(100, 128) == 128
    data = write(tmp_path / "d.jsonl", seq2seq_rows(300))
    objective = make_objective(resolve_config({"data": str(data), **TINY, "max_length": 128}))
    torch.manual_seed(0)
    model = objective.build_model()
    examples = objective.examples("test")
    batch = objective.collate(objective.encode(examples))
    longest = int(batch.src_mask.sum(dim=1).max())
    out = objective.predict(model, examples)  # an untrained model: EOS is rare
    assert max(len(ids) for ids in out) == generation_limit(longest, 128) < 128


def test_a_test_of_too_few_examples_draws_no_verdict():
    from tformer.export.model_card import baseline_lines
    from tformer.training.report import with_baseline

    record = with_baseline({"split": "test", "bleu": 2.02, "examples": 1}, "bleu",
                           {"baseline": 0.0, "baseline_by": "copying the source"})
    assert record["beats_baseline"] is None and record["verdict"] == "cannot tell"  # unknown, not "no"
    assert baseline_verdict(record).startswith("warning: the test scored 1 example(s), too few to tell "
                                               "whether the model learned (test BLEU 2.02;")
    assert "too few to tell" in baseline_lines(record, "bleu")[0]
    enough = with_baseline({"split": "test", "bleu": 25.0, "examples": 100}, "bleu",
                           {"baseline": 3.0, "baseline_by": "copying the source"})
    assert enough["beats_baseline"] and baseline_verdict(enough).startswith("the model learned")


def test_the_summary_names_the_step_whose_weights_were_tested():
    from tformer.training.report import summary

    record = {"step": 1077, "tested_step": 217, "wall_seconds": 88.0, "accuracy": 0.68, "macro_f1": 0.5}
    assert "after 1077 steps, 88.0 s (the best validated weights tested: step 217)" in summary(record, "accuracy")
    assert "tested" not in summary({**record, "tested_step": 1077}, "accuracy")
