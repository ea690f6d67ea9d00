"""What a run reports: metrics.jsonl lines (and, with --report-to, TensorBoard events and a
CSV), the progress summary, sample tables, curves.png."""

from __future__ import annotations

import csv
import io
import json
import math
import sys
import time
import warnings
from pathlib import Path
from typing import Any

from tqdm import tqdm

from tformer.errors import require
from tformer.storage.files import write_atomic
from tformer.storage.rundir import append_jsonl, read_metrics  # (append_jsonl: tformer eval's too)
from tformer.training.verdict import (
    CANNOT_TELL,
    LEARNED,
    LOWER_IS_BETTER,
    MIN_VERDICT_EXAMPLES,
    NOT_LEARNED,
    PERFECT,
    beats_baseline,  # noqa: F401  (the report's verdicts: tests and older callers import it here)
    judge,
    log_gain_se,
    started_from,
    tested_as_it_was,
    too_few,
    verdict_of,
)
from tformer.training.viz.plots import save_figure, subplots, warm

TENSORBOARD_DIR = "tensorboard"  # RUN/tensorboard/: `tensorboard --logdir RUN` shows the run
CSV_FILE = "metrics.csv"  # RUN/metrics.csv: one row per scalar
CSV_COLUMNS = ("split", "step", "name", "value")


def check_reports(config) -> None:
    """Refuse --report-to tensorboard without its optional package, in one line naming the
    extra, before the run directory is made."""
    if "tensorboard" in config.reports():
        require("tensorboard", "tensorboard", "--report-to tensorboard")


class Reporter:
    """Where a run's records go: metrics.jsonl always; with --report-to also TensorBoard event
    files (RUN/tensorboard/, torch.utils.tensorboard's SummaryWriter; tags "train/loss",
    "validation/accuracy", "test/accuracy", ...) and RUN/metrics.csv (split, step, name, value:
    one row per scalar, whatever fields each split has). Numbers only; a number that is not
    finite stays out of both (metrics.jsonl writes it as null).

    Resumed at ``resume_step``: the CSV is rewritten from metrics.jsonl (which keeps the lines
    up to the checkpoint) and TensorBoard hides the events past it (its purge_step)."""

    def __init__(self, run_dir: Path, config, resume_step: int | None = None) -> None:
        reports = config.reports()
        self.jsonl = run_dir / "metrics.jsonl"
        self.csv = run_dir / CSV_FILE if "csv" in reports else None
        self.tensorboard = None
        if self.csv is not None:
            rows = [row for record in read_metrics(self.jsonl) for row in _rows(record)]
            write_atomic(self.csv, _csv_text([CSV_COLUMNS, *rows]).encode())
        if "tensorboard" in reports:
            require("tensorboard", "tensorboard", "--report-to tensorboard")
            from torch.utils.tensorboard import SummaryWriter

            self.tensorboard = SummaryWriter(str(run_dir / TENSORBOARD_DIR), purge_step=resume_step)

    def write(self, record: dict[str, Any]) -> None:
        append_jsonl(self.jsonl, record)
        rows = _rows(record)
        if self.csv is not None and rows:
            with self.csv.open("a", newline="") as f:
                f.write(_csv_text(rows))
        if self.tensorboard is not None:
            for split, step, name, value in rows:
                self.tensorboard.add_scalar(f"{split}/{name}", value, global_step=step)
            self.tensorboard.flush()  # on disk as it happens, as metrics.jsonl is

    def close(self) -> None:
        if self.tensorboard is not None:
            self.tensorboard.close()


def _rows(record: dict[str, Any]) -> list[tuple[str, int, str, float]]:
    """(split, step, name, value) for each finite number of a record (its step aside)."""
    split, step = str(record.get("split", "")), int(record.get("step", 0))
    return [(split, step, name, value) for name, value in record.items()
            if name != "step" and isinstance(value, (int, float)) and not isinstance(value, bool)
            and math.isfinite(value)]


def _csv_text(rows) -> str:
    buffer = io.StringIO()
    csv.writer(buffer, lineterminator="\n").writerows(rows)
    return buffer.getvalue()


class Meter:
    """Averages of the training loss and accuracy, and tokens per second, since the last flush."""

    def __init__(self) -> None:
        self.reset()

    def reset(self) -> None:
        self.loss = self.acc = 0.0
        self.n = self.tokens = 0
        self.t0 = time.perf_counter()

    def add(self, loss: float, acc: float, tokens: int) -> None:
        self.loss, self.acc = self.loss + loss, self.acc + acc
        self.n, self.tokens = self.n + 1, self.tokens + tokens

    def flush(self) -> dict[str, float]:
        seconds = max(time.perf_counter() - self.t0, 1e-9)
        out = {"loss": self.loss / max(self.n, 1), "accuracy": self.acc / max(self.n, 1),
               "tokens_per_second": self.tokens / seconds}
        self.reset()
        return out


class Progress:
    """The progress line of a run, then what runs, example by example (validating 320/500,
    testing 64/1,000): it moves until the command ends. An untimed run's bar counts steps toward
    --steps; a timed run's counts seconds toward its budget's end (tests and saving included),
    the steps made shown beside: its step count is an estimate that moves with the machine's
    pace (706 -> 1622 -> 599 -> 1268 steps made the percentage go backwards), its clock does not.
    Redrawn a few times a second on a terminal; in a log file, every 30 s is plenty."""

    def __init__(self, total: int | None, step: int, disabled: bool, ends_at: float | None = None) -> None:
        self.interval = 0.1 if sys.stderr.isatty() else 30
        self.ends_at = ends_at  # a time.perf_counter() reading: the budget's end, if timed
        self.step = step
        if ends_at is not None:  # the axis is time: from now (the setup's seconds) to the end
            self.t0 = time.perf_counter()
            seconds = max(ends_at - self.t0, 1.0)
            self.bar = tqdm(total=round(seconds), initial=0, unit="s", disable=disabled, dynamic_ncols=True,
                            leave=False, mininterval=self.interval,
                            bar_format="{desc}{percentage:3.0f}%|{bar}| {postfix}")
        else:
            self.bar = tqdm(total=total, initial=step, unit="step", disable=disabled, dynamic_ncols=True,
                            leave=False, mininterval=self.interval,
                            bar_format="{desc}{percentage:3.0f}%|{bar}| {n_fmt}/{total_fmt} steps "
                                       "[{elapsed}<{remaining}{postfix}]")
        self.drawn = time.perf_counter()
        self.shown: dict[str, str] = {}
        self.bar.set_description_str("training ", refresh=False)
        self._postfix()

    def stepped(self, step: int, total: int, **shown: str) -> None:
        """One update done, of `total` planned; `shown`: loss, accuracy... (kept until replaced)."""
        self.shown.update(shown)
        self.step = step
        if self.ends_at is None:
            self.bar.total = max(total, step)
        self._postfix()
        self._advance(step)

    def _advance(self, step: int) -> None:
        """Move the bar to `step` (untimed) or to the seconds since the bar began (timed)."""
        if self.ends_at is None:
            self.bar.update(step - self.bar.n)
            return
        now = min(round(time.perf_counter() - self.t0), self.bar.total)
        if now > self.bar.n:
            self.bar.update(now - self.bar.n)

    def status(self, what: str, done: int | None = None, of: int | None = None) -> None:
        """What runs now ("validating", "testing"), and how far it is (examples done, of)."""
        count = f" {done:,}/{of:,}" if done is not None and of else ""
        self.bar.set_description_str(f"{what}{count} ", refresh=False)
        self._postfix()
        if self.ends_at is not None:
            self._advance(self.step)
        if time.perf_counter() - self.drawn >= self.interval:
            self.bar.refresh()
            self.drawn = time.perf_counter()

    def write(self, line: str) -> None:
        self.bar.write(line)

    def close(self) -> None:
        self.bar.close()

    def _postfix(self) -> None:
        left = ""
        if self.ends_at is not None:
            seconds = max(self.ends_at - time.perf_counter(), 0.0)
            left = f"step {self.step:,}, ends in {int(seconds // 60)}:{int(seconds % 60):02d}"
        shown = [left] + [f"{k} {v}" for k, v in self.shown.items()]
        self.bar.set_postfix_str(", ".join(x for x in shown if x), refresh=False)


def sample_table(rows: list[tuple[str, str, str]], n: int = 6) -> str:
    """input / prediction / target columns, cut to fit, with ok/WRONG marks."""
    table = [("input", "prediction", "target", "")]
    for source, shown, target in rows[:n]:
        table.append((source, shown, target, "ok" if shown == target else "WRONG"))
    widths = [min(max(len(r[i]) for r in table), 48) for i in range(4)]
    cut = [[c if len(c) <= w else c[: w - 3] + "..." for c, w in zip(r, widths, strict=True)]
           for r in table]
    return "\n".join("  ".join(c.ljust(w) for c, w in zip(r, widths, strict=True)).rstrip()
                     for r in cut)


def summary(record: dict[str, Any], key: str) -> str:
    done = f"after {record['step']} steps, {record['wall_seconds']:.1f} s"
    start = from_start(record, key)
    if start:
        done += f"; {start}"
    elif record.get("tested_step", record["step"]) != record["step"]:
        done += f" (the best validated weights tested: step {record['tested_step']})"
    of = record.get("test_examples")
    if of is not None and record.get("examples", of) < of:  # the test's deadline cut it
        done += f"; scored {record['examples']:,} of {of:,} test examples in the time left"
    if key == "exact_match":
        return (f"test exact_match: {record['exact_match']:.4f} "
                f"(token accuracy {record['accuracy']:.4f}) {done}")
    if key == "accuracy":
        extra = f" macro-F1 {record['macro_f1']:.4f}" if "macro_f1" in record else ""
        return f"test accuracy: {record['accuracy']:.4f}{extra} {done}"
    if key == "bleu":
        return (f"test BLEU {record['bleu']:.2f} chrF {record['chrf']:.2f} "
                f"exact match {record['exact_match']:.4f} {done}")
    if key == "perplexity":
        return (f"test perplexity {record['perplexity']:.2f} (masked-token accuracy "
                f"{record['accuracy']:.4f}) {done}")
    if key == "mrr_at_10" and "recall_at_1" in record:
        return f"test recall@1 {record['recall_at_1']:.4f} MRR@10 {record['mrr_at_10']:.4f} {done}"
    # Another kind's main metric, and the F1 scores it reports beside it.
    extra = "".join(f" {k} {v:.4f}" for k, v in record.items() if k.endswith("_f1") and k != key)
    return f"test {NAMES.get(key, key)} {record[key]:.4f}{extra} {done}"


NAMES = {"accuracy": "accuracy", "exact_match": "exact match", "mrr_at_10": "MRR@10", "bleu": "BLEU",
         "f1": "entity F1"}


def from_start(record: dict[str, Any], key: str) -> str | None:
    """How a test record's weights compare on validation to the pretrained model the run started
    from (a run validated at step 0: tformer.training.loop._from_start); None for any other."""
    start = record.get("pretrained_validation")
    if start is None:
        return None
    name = NAMES.get(key, key)
    tuned, step = record.get("tuned_validation"), record.get("tuned_step")
    if tested_as_it_was(record):
        if tuned is None:
            return (f"the weights tested are those it started from, {started_from(record)} (validation "
                    f"{name} {start:.4f}): no fine-tuning step was validated")
        return (f"the weights tested are those it started from, {started_from(record)}: no fine-tuning "
                f"step improved on its validation {name} {start:.4f} (the best, step {step}'s: {tuned:.4f})")
    if tuned is None:
        return None
    tested = record.get("tested_step", record["step"])
    which = f"step {tested}" + ("" if tested == record["step"] else ": the best validated weights, tested")
    return f"validation {name} went from {start:.4f} ({started_from(record)}) to {tuned:.4f} ({which})"


def with_baseline(record: dict[str, Any], key: str, baseline: dict[str, Any]) -> dict[str, Any]:
    """The test record with its baseline (``Objective.baseline``'s), the metric compared and the
    verdict (tformer.training.verdict.judge), as metrics.jsonl keeps them: "verdict" (learned, did not
    learn, cannot tell), "gain_interval" (the gain's 95% interval: the bound's, or the paired
    bootstrap's that the record or ``baseline`` brings as "paired_interval") and "beats_baseline"
    (true, false, or null where it cannot tell: a test too short to judge is unknown, not "no")."""
    examples = int(record.get("examples", MIN_VERDICT_EXAMPLES))
    record, baseline = dict(record), dict(baseline)  # a paired bootstrap's, where the scorer drew one:
    paired = [x.pop("paired_interval", None) for x in (record, baseline)]
    paired = paired[0] or paired[1]
    spread = log_gain_se({**record, **baseline})
    verdict, (low, high) = judge(record[key], baseline["baseline"], key, examples, spread,
                                 None if paired is None else tuple(paired))
    beats = {LEARNED: True, NOT_LEARNED: False}.get(verdict)
    interval = [round(low, 4), round(high, 4)] if math.isfinite(low) and math.isfinite(high) else None
    return {**record, **baseline, "main_metric": key, "verdict": verdict,
            "gain_interval": interval, "beats_baseline": beats}


TRAIN_MORE_EXAMPLES = f"give a --test file of {MIN_VERDICT_EXAMPLES} or more, or more --data"


def baseline_verdict(record: dict[str, Any], more_examples: str = TRAIN_MORE_EXAMPLES,
                     stopped_by: str | None = None) -> str | None:
    """One line on whether a test record beat its baseline: "the model learned: ..." or
    "warning: the model did not learn: ..."; None for a record without a baseline (older runs).
    ``more_examples``: how to score enough examples for a verdict, in the caller's options;
    ``stopped_by``: what ended the run's training (else the record's), for how to train more."""
    key = record.get("main_metric")
    if key is None or record.get("baseline") is None or key not in record:
        return None
    digits = 2 if key == "bleu" else 4
    name = NAMES.get(key, key)
    ours, theirs = f"{record[key]:.{digits}f}", f"{record['baseline']:.{digits}f}"
    by = record.get("baseline_by", "a trivial prediction")
    # What was scored: the test split, the validation split, or a file (`eval --data`).
    test = record.get("data") or record.get("split") or "test"
    if too_few(record):
        return (f"warning: the {test} scored {record['examples']} example(s), too few to tell whether the "
                f"model learned ({test} {name} {ours}; the baseline of {by}: {name} {theirs}); "
                f"{more_examples}")
    if record["baseline"] >= PERFECT.get(key, float("inf")) and record[key] >= record["baseline"]:
        scored = f"{test} split" if test in ("test", "validation") else "file"
        return (f"the model matched a perfect baseline: {test} {name} {ours}, as {by} scores ({name} "
                f"{theirs}); this {scored} is too easy to show what it learned")
    verdict = verdict_of(record)
    if verdict is None:  # (a record with a baseline but no verdict: judged now)
        verdict = judge(record[key], record["baseline"], key, int(record.get("examples", 10**9)),
                        log_gain_se(record))[0]
    beats = verdict == LEARNED
    margin = _margin(record, key, digits)
    if verdict == CANNOT_TELL and not tested_as_it_was(record):
        flag = {"steps": "--steps", "epochs": "--epochs", "patience": "--patience"}.get(
            stopped_by or record.get("stopped_by"))
        train = f"a larger {flag}" if flag else "a longer --max-minutes"
        del more_examples  # (for a test too short to judge at all, above)
        return (f"warning: cannot tell whether the model learned: {test} {name} {ours} against {theirs} for "
                f"{by}{margin}: within the test's noise; {train} trains more, and more test examples "
                "judge more finely")
    if tested_as_it_was(record):  # nothing learned here: no fine-tuning step was kept
        kept = f"{started_from(record)}, as it was (no fine-tuning step improved on it)"
        if beats:
            return f"{kept}: {test} {name} {ours} beats the baseline of {by} ({name} {theirs})"
        return (f"warning: {kept}, does not beat the baseline: {test} {name} {ours} against {theirs} for "
                f"{by}; a lower --lr, or more or cleaner data, may let fine-tuning help")
    if beats:
        return f"the model learned: {test} {name} {ours} beats the baseline of {by} ({name} {theirs}){margin}"
    flag = {"steps": "--steps", "epochs": "--epochs", "patience": "--patience"}.get(
        stopped_by or record.get("stopped_by"))
    more = (f"a larger {flag} trains more" if flag
            else "a longer --max-minutes (or a quieter machine) trains more")
    return (f"warning: the model did not learn: {test} {name} {ours} does not beat the baseline of {by} "
            f"({name} {theirs}){margin}; {more}")


def _margin(record: dict[str, Any], key: str, digits: int) -> str:
    """", gain +0.389 (95% interval +0.33 to +0.45, 264 examples)": the numbers behind a verdict."""
    interval = record.get("gain_interval")
    if not isinstance(interval, list) or len(interval) != 2 or key not in record:
        return ""
    gain = record[key] - record["baseline"]
    low, high = interval
    d, word = max(digits - 1, 2), "change" if key in LOWER_IS_BETTER else "gain"  # (a perplexity: below 0)
    return (f", {word} {gain:+.{d}f} (95% interval {low:+.{d}f} to {high:+.{d}f}, "
            f"{record.get('examples', '?')} examples)")


def plot_curves(metrics_path: Path, png_path: Path, key: str) -> float:
    """Training loss and validation metric against steps, side by side. Returns the seconds the
    drawing took, matplotlib's one-off loading (``plots.warm``) not counted."""
    warm()
    started = time.perf_counter()
    records = [json.loads(line) for line in metrics_path.read_text().splitlines() if line]
    train_r = [r for r in records if r["split"] == "train"]
    valid_r = [r for r in records if r["split"] == "validation"]
    fig, (ax1, ax2) = subplots(1, 2, figsize=(10, 4))
    ax1.plot([r["step"] for r in train_r], [r["loss"] for r in train_r],
             label="train (with label smoothing)")
    ax1.plot([r["step"] for r in valid_r], [r["loss"] for r in valid_r], "o-", label="validation")
    ax1.set(xlabel="step", ylabel="loss", yscale="log", title="loss")
    ax1.legend()
    scale = 100.0 if key in ("bleu", "chrf") else 1.0  # sacrebleu reports 0-100
    if key in LOWER_IS_BETTER:  # (a perplexity: the loss panel shows its log) accuracy here
        key = "accuracy"
    ax2.plot([r["step"] for r in train_r], [r["accuracy"] for r in train_r],
             label="train " + ("token accuracy (teacher-forced)" if key in ("exact_match", "bleu")
                               else "accuracy"))
    ax2.plot([r["step"] for r in valid_r], [r[key] / scale for r in valid_r], "o-",
             label=f"validation {key}" + (" / 100" if scale != 1 else ""))
    ax2.set(xlabel="step", ylabel="accuracy", ylim=(0, 1.02), title="accuracy")
    ax2.legend(loc="lower right")
    fig.tight_layout()
    save_figure(fig, png_path)
    return time.perf_counter() - started


def plot_confusion(matrix: list[list[int]], labels: list[str], path: Path) -> None:
    """The test confusion matrix as a PNG (counts written in the cells up to 20 labels)."""
    n = len(labels)
    size = min(4 + 0.4 * n, 16)
    fig, ax = subplots(figsize=(size, size))
    ax.imshow(matrix, cmap="Blues")
    ax.set(xticks=range(n), yticks=range(n), xlabel="predicted", ylabel="true",
           title="confusion matrix (test)")
    ax.set_xticklabels(labels, rotation=90)
    ax.set_yticklabels(labels)
    if n <= 20:
        for i in range(n):
            for j in range(n):
                ax.text(j, i, str(matrix[i][j]), ha="center", va="center", fontsize=8)
    with warnings.catch_warnings():  # labels in a script the font lacks (好, 坏) draw as boxes, quietly:
        # matplotlib's warning per character named report.py's line to the user, not the label
        warnings.filterwarnings("ignore", message=r"Glyph \d+ .* missing from font", category=UserWarning)
        fig.tight_layout()
        save_figure(fig, path)
