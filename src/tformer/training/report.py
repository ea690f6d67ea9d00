"""What a run reports: metrics.jsonl lines (and, with --report-to, TensorBoard events and a
CSV), the progress summary, sample tables, curves.png."""

from __future__ import annotations

import csv
import io
import json
import math
import time
from pathlib import Path
from typing import Any

from tformer.errors import require
from tformer.storage.files import write_atomic
from tformer.storage.rundir import read_metrics
from tformer.viz.plots import save_figure, subplots

TENSORBOARD_DIR = "tensorboard"  # RUN/tensorboard/: `tensorboard --logdir RUN` shows the run
CSV_FILE = "metrics.csv"  # RUN/metrics.csv: one row per scalar
CSV_COLUMNS = ("split", "step", "name", "value")


def append_jsonl(path: Path, record: dict[str, Any]) -> None:
    """One JSON line; a number that is not finite is written as null (JSON has no NaN)."""
    clean = {k: None if isinstance(v, float) and not math.isfinite(v) else v for k, v in record.items()}
    with path.open("a") as f:
        f.write(json.dumps(clean, allow_nan=False) + "\n")


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
    if key == "exact_match":
        return (f"test exact_match: {record['exact_match']:.4f} "
                f"(token accuracy {record['accuracy']:.4f}) {done}")
    if "majority_baseline" in record:
        extra = f" macro-F1 {record['macro_f1']:.4f}" if "macro_f1" in record else ""
        return (f"test accuracy: {record['accuracy']:.4f}{extra} "
                f"(majority baseline {record['majority_baseline']:.4f}) {done}")
    if key == "bleu":
        return (f"test BLEU {record['bleu']:.2f} chrF {record['chrf']:.2f} "
                f"exact match {record['exact_match']:.4f} {done}")
    return f"test recall@1 {record['recall_at_1']:.4f} MRR@10 {record['mrr_at_10']:.4f} {done}"


def plot_curves(metrics_path: Path, png_path: Path, key: str) -> None:
    """Training loss and validation metric against steps, side by side."""
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
    ax2.plot([r["step"] for r in train_r], [r["accuracy"] for r in train_r],
             label="train " + ("token accuracy (teacher-forced)" if key in ("exact_match", "bleu")
                               else "accuracy"))
    ax2.plot([r["step"] for r in valid_r], [r[key] / scale for r in valid_r], "o-",
             label=f"validation {key}" + (" / 100" if scale != 1 else ""))
    ax2.set(xlabel="step", ylabel="accuracy", ylim=(0, 1.02), title="accuracy")
    ax2.legend(loc="lower right")
    fig.tight_layout()
    save_figure(fig, png_path)


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
    fig.tight_layout()
    save_figure(fig, path)
