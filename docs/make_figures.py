"""Make the tour's pictures (docs/*.png) from tformer's own runs. Not run by the tests.

    PYTHONPATH=src python docs/make_figures.py [--runs runs/tour] [--only norm,positions,attention,page]

- norm_first.png: a deep post-norm stack trained without warmup next to the same stack in
  pre-norm: training loss and validation exact match.
- positions.png, position_similarity.png: the sinusoidal encoding (Vaswani et al. 2017, §3.5).
- attention_reverse.png, attention_copy.png: cross-attention of trained `reverse`/`copy` runs.
- attention_page.png: a screenshot of `tformer attention RUN --html` (needs Chromium).

Runs are trained with `tformer train` on one thread each, two at a time: the two 8 + 8-layer
norm runs took 24 minutes side by side on 2 busy cores, reverse and copy 2 and 14 minutes
(quiet cores: several times faster). A run directory that already holds a finished run is reused.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

DOCS = Path(__file__).resolve().parent
CLI = [sys.executable, "-c", "import sys; from tformer.commands.cli import main; sys.exit(main(sys.argv[1:]))"]

# The norm experiment: 8 + 8 layers, a high learning rate (3e-3) from step 1 and no gradient
# clipping, then a cosine decay. (With 6 + 6 layers, lr 1e-3 and clipping both train.)
DEEP = (
    "--task reverse --n-layers 8 --steps 800 --schedule cosine --lr 3e-3 --clip-grad 0 "
    "--eval-every 100 --log-every 20 --valid-size 200 --test-size 200"
).split()
NORM_RUNS = {
    "post-norm, no warmup": [*DEEP, "--warmup", "0"],
    "pre-norm, no warmup": [*DEEP, "--warmup", "0", "--norm-first"],
}
TASK_RUNS = {"reverse": ["--task", "reverse"], "copy": ["--task", "copy"]}  # the defaults
EXAMPLE = "3 1 4 1 5 9 2 6"


def train_all(runs: dict[str, list[str]], root: Path, parallel: int = 2) -> dict[str, Path]:
    """Train each run (``tformer train ARGS --out root/NAME``), `parallel` at a time."""
    dirs, pending, active = {}, list(runs.items()), []
    while pending or active:
        while pending and len(active) < parallel:
            name, args = pending.pop(0)
            out = root / name.replace(" ", "_").replace(",", "")
            dirs[name] = out
            if _finished(out):
                continue
            shutil.rmtree(out, ignore_errors=True)
            print(f"training {name}: tformer train {' '.join(args)}", flush=True)
            cmd = [*CLI, "train", *args, "--threads", "1", "--quiet", "--out", str(out)]
            active.append(subprocess.Popen(cmd))
        time.sleep(1)
        for p in [p for p in active if p.poll() is not None]:
            active.remove(p)
            if p.returncode != 0:
                raise SystemExit(f"a training run failed (exit {p.returncode})")
    return dirs


def _finished(run_dir: Path) -> bool:
    metrics = run_dir / "metrics.jsonl"
    return metrics.is_file() and '"split": "test"' in metrics.read_text()


def _metrics(run_dir: Path) -> list[dict]:
    return [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]


def _pyplot():
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def norm_figure(root: Path) -> None:
    dirs = train_all(NORM_RUNS, root)
    plt = _pyplot()
    fig, (loss_ax, acc_ax) = plt.subplots(1, 2, figsize=(11, 4), dpi=100)
    for name, run_dir in dirs.items():
        rows = _metrics(run_dir)
        train = [r for r in rows if r["split"] == "train"]
        valid = [r for r in rows if r["split"] == "validation"]
        loss_ax.plot([r["step"] for r in train], [r["loss"] for r in train], label=name)
        acc_ax.plot([r["step"] for r in valid], [r["exact_match"] for r in valid], marker="o", label=name)
    loss_ax.set(
        xlabel="step",
        ylabel="training loss (label-smoothed)",
        yscale="log",
        title="reverse, 8+8 layers, lr 3e-3, no clipping",
    )
    acc_ax.set(xlabel="step", ylabel="validation exact match", ylim=(-0.02, 1.02), title="what it learned")
    for ax in (loss_ax, acc_ax):
        ax.legend(fontsize=8)
        ax.grid(alpha=0.3)
    fig.tight_layout()
    fig.savefig(DOCS / "norm_first.png")
    plt.close(fig)
    summary = {name: _metrics(d)[-1] for name, d in dirs.items()}
    (DOCS / "norm_first.json").write_text(json.dumps(summary, indent=2) + "\n")
    print(json.dumps(summary, indent=2))


def positions_figures() -> None:
    from tformer.reference.positional import sinusoidal_table
    from tformer.training.viz.plots import plot_positions, save_figure

    save_figure(plot_positions(d_model=128, max_len=100), DOCS / "positions.png")
    table = sinusoidal_table(100, 128)  # (P, D)
    plt = _pyplot()
    fig, ax = plt.subplots(figsize=(5, 4.2), dpi=100)
    im = ax.imshow(table @ table.T, cmap="viridis")  # (P, P): depends on p - q only
    ax.set(xlabel="position q", ylabel="position p", title="PE(p) · PE(q)  (d_model = 128)")
    fig.colorbar(im, ax=ax)
    fig.tight_layout()
    fig.savefig(DOCS / "position_similarity.png")
    plt.close(fig)


def attention_figures(dirs: dict[str, Path]) -> None:
    from tformer.commands._attention_html import run_maps

    plt = _pyplot()
    for name, run_dir in dirs.items():
        enc, _, cross = run_maps(run_dir, EXAMPLE)
        w = cross.weights[-1]  # (H, T, S): the last decoder layer's cross-attention
        fig, axes = plt.subplots(1, w.shape[0], figsize=(3 * w.shape[0], 3.7), dpi=100, squeeze=False)
        for h, ax in enumerate(axes[0]):
            ax.imshow(w[h], cmap="viridis", vmin=0)
            ax.set_title(f"head {h}", fontsize=9)
            ax.set_xticks(range(len(cross.keys)), cross.keys, fontsize=7, rotation=90)
            ax.set_yticks(range(len(cross.queries)), cross.queries if h == 0 else [], fontsize=7)
        axes[0][0].set_ylabel("decoder input (query)", fontsize=8)
        fig.suptitle(
            f"{name}: cross-attention of the last decoder layer on {EXAMPLE!r} "
            "(columns: the source tokens, as keys)"
        )
        fig.tight_layout()
        fig.savefig(DOCS / f"attention_{name}.png")
        plt.close(fig)


def page_screenshot(run_dir: Path) -> None:
    browser = next(
        (p for p in map(shutil.which, ("chromium", "chromium-browser", "google-chrome")) if p), None
    )
    if browser is None:
        print("no Chromium: skipping attention_page.png")
        return
    with tempfile.TemporaryDirectory() as tmp:
        page = Path(tmp) / "reverse.html"
        # Run from the runs' folder, so that the page names the model by its short name.
        subprocess.run(
            [*CLI, "attention", run_dir.name, EXAMPLE, "--html", str(page)],
            check=True,
            cwd=run_dir.parent,
            env={**os.environ, "PYTHONPATH": str(DOCS.parent / "src")},
        )
        subprocess.run(
            [
                browser,
                "--headless",
                "--no-sandbox",
                "--disable-gpu",
                "--no-first-run",
                "--disable-sync",
                "--disable-background-networking",
                f"--user-data-dir={tmp}/profile",
                "--virtual-time-budget=3000",
                "--window-size=1300,900",
                f"--screenshot={DOCS / 'attention_page.png'}",
                page.as_uri() + "#group=2&layer=1&head=0&query=3",
            ],
            check=True,
            capture_output=True,
        )


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--runs", default="runs/tour", help="where the runs go (reused when finished)")
    parser.add_argument("--only", default="norm,positions,attention,page")
    args = parser.parse_args()
    root, only = Path(args.runs), set(args.only.split(","))
    root.mkdir(parents=True, exist_ok=True)
    tasks = TASK_RUNS if only & {"attention", "page"} else {}  # positions need no run
    train_all({**(NORM_RUNS if "norm" in only else {}), **tasks}, root)  # two at a time
    np.set_printoptions(precision=3, suppress=True)
    if "positions" in only:
        positions_figures()
    if "attention" in only:
        attention_figures(train_all(TASK_RUNS, root))
    if "page" in only:
        page_screenshot(train_all(TASK_RUNS, root)["reverse"])
    if "norm" in only:
        norm_figure(root)


if __name__ == "__main__":
    main()
