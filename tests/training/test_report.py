"""--report-to tensorboard,csv: the run's scalars as TensorBoard event files and a CSV in the
run directory, the same numbers as metrics.jsonl; tensorboard stays an optional extra."""

import csv
import json
import sys

import pytest
from cli_helpers import assert_one_line_error, run_cli
from text_fixtures import classification_rows, write

from tformer.kinds import resolve_config

TINY = ["--d-model", "16", "--n-heads", "2", "--d-ff", "32", "--n-layers", "1", "--vocab-size", "260",
        "--max-tokens", "256", "--eval-every", "4", "--log-every", "2", "--threads", "1", "--quiet"]


def _events(run) -> dict[str, list[tuple[int, float]]]:
    """{tag: [(step, value), ...]} read back from the run's TensorBoard event files."""
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    acc = EventAccumulator(str(run / "tensorboard"))
    acc.Reload()
    return {tag: [(e.step, e.value) for e in acc.Scalars(tag)] for tag in acc.Tags()["scalars"]}


def test_report_to_tensorboard_and_csv_write_the_runs_scalars(capsys, tmp_path):
    pytest.importorskip("tensorboard")
    data = write(tmp_path / "train.jsonl", classification_rows(80))
    run = tmp_path / "run"
    rc, _, err = run_cli(capsys, "train", "--data", data, "--out", run, "--steps", 8,
                         "--report-to", "tensorboard,csv", *TINY)
    assert rc == 0, err
    records = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    events = _events(run)
    train = [(r["step"], r["loss"]) for r in records if r["split"] == "train"]
    assert [s for s, _ in events["train/loss"]] == [s for s, _ in train] == [2, 4, 6, 8]
    assert all(abs(v - loss) < 1e-6 for (_, v), (_, loss) in zip(events["train/loss"], train, strict=True))
    assert {"validation/accuracy", "validation/loss", "test/accuracy", "train/lr"} <= set(events)
    rows = list(csv.DictReader((run / "metrics.csv").open()))
    assert list(rows[0]) == ["split", "step", "name", "value"]
    scalars = {(r["split"], int(r["step"]), r["name"]): float(r["value"]) for r in rows}
    for record in records:
        for name, value in record.items():
            if isinstance(value, (int, float)) and not isinstance(value, bool) and name != "step":
                assert scalars[(record["split"], record["step"], name)] == pytest.approx(value, abs=1e-9)
    # Resumed to more steps: the CSV keeps what metrics.jsonl keeps, and goes on.
    rc, _, err = run_cli(capsys, "train", "--resume", run, "--steps", 12, "--report-to", "tensorboard,csv",
                         "--quiet")
    assert rc == 0, err
    records = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    rows = list(csv.DictReader((run / "metrics.csv").open()))
    assert sorted({(r["split"], int(r["step"])) for r in rows}) == sorted({(r["split"], r["step"]) for r in records})
    assert [s for s, _ in _events(run)["train/loss"]][-1] == 12


def test_report_to_names_what_it_takes_and_a_missing_tensorboard_names_its_extra(capsys, tmp_path,
                                                                               monkeypatch):
    with pytest.raises(ValueError, match=r"report_to: expected none or some of tensorboard, csv"):
        resolve_config({"task": "reverse", "report_to": "wandb"})
    assert resolve_config({"task": "reverse", "report_to": "none"}).reports() == ()
    monkeypatch.setitem(sys.modules, "tensorboard", None)  # import tensorboard now fails
    run = tmp_path / "run"
    rc, _, err = run_cli(capsys, "train", "--task", "reverse", "--steps", 2, "--out", run,
                         "--report-to", "tensorboard", "--d-model", 16, "--n-heads", 2, "--d-ff", 32,
                         "--n-layers", 1, "--quiet")
    assert_one_line_error(rc, err, "train", r"pip install 'tformer\[tensorboard\]'")
    assert not run.exists()


def test_a_confusion_matrix_of_labels_the_font_lacks_draws_without_warnings(tmp_path):
    """Labels such as 好/坏 printed one matplotlib UserWarning per missing glyph at the end of a run."""
    import warnings

    from tformer.training.report import plot_confusion

    with warnings.catch_warnings():
        warnings.simplefilter("error")
        plot_confusion([[3, 1], [0, 4]], ["好", "坏"], tmp_path / "confusion.png")
    assert (tmp_path / "confusion.png").stat().st_size > 0


def test_a_line_appended_after_one_a_crash_cut_short_is_kept_whole(tmp_path):
    from tformer.storage.rundir import read_metrics
    from tformer.training.report import append_jsonl

    path = tmp_path / "metrics.jsonl"
    append_jsonl(path, {"split": "train", "step": 1})
    with path.open("a") as f:
        f.write('{"split": "train", "st')  # killed, or the disk full, mid-line
    append_jsonl(path, {"split": "eval", "step": 2})  # tformer eval --data, say
    assert read_metrics(path) == [{"split": "train", "step": 1}, {"split": "eval", "step": 2}]
