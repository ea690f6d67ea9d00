"""`torchrun --nproc_per_node 2 -m tformer train` equals one process at the same global batch,
resume included.

Two ranks with --accumulate 1 read batches 0, 1 (then 2, 3, ...) between them; one process
with --accumulate 2 reads the same pairs. Gradients are averaged in a different order
(all-reduce vs. accumulation), so values agree to float32 rounding: every logged loss within
1e-5 relative, the final weights within 1e-5 absolute.
"""

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from safetensors.torch import load_file
from text_fixtures import seq2seq_rows, write

from tformer.storage.checkpoint import check_run_dir

SRC = str(Path(__file__).resolve().parents[2] / "src")
ARGS = ["--d-model", "32", "--n-heads", "2", "--d-ff", "64", "--n-layers", "1", "--vocab-size", "300",
        "--max-tokens", "256", "--schedule", "inverse_sqrt", "--steps", "6", "--eval-every", "3", "--log-every", "1", "--dropout", "0",
        "--threads", "1", "--quiet", "--patience", "none", "--precision", "fp32"]  # (a lone run may try bf16)


def _run(cmd, tmp_path):
    env = {**os.environ, "PYTHONPATH": SRC, "OMP_NUM_THREADS": "1"}
    proc = subprocess.run(cmd, capture_output=True, text=True, env=env, cwd=tmp_path, timeout=300)
    assert proc.returncode == 0, proc.stderr[-2000:]


def _losses(run):
    lines = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    return [r["loss"] for r in lines if r["split"] == "train"]


@pytest.mark.skipif(shutil.which("torchrun", path=str(Path(sys.executable).parent)) is None,
                    reason="torchrun not installed")
def test_two_processes_equal_one(tmp_path):
    data = write(tmp_path / "d.jsonl", seq2seq_rows(200))
    torchrun = str(Path(sys.executable).parent / "torchrun")
    two_ranks = [torchrun, "--standalone", "--nproc_per_node", "2", "-m", "tformer", "train"]
    # Half the steps, then a resume under torchrun: both must match the straight run.
    _run([*two_ranks, "--data", str(data), "--out", str(tmp_path / "two"), "--accumulate", "1", *ARGS,
          "--steps", "3"], tmp_path)
    _run([*two_ranks, "--resume", str(tmp_path / "two"), "--steps", "6", "--quiet"], tmp_path)
    _run([sys.executable, "-m", "tformer", "train", "--data", str(data), "--out", str(tmp_path / "one"),
          "--accumulate", "2", *ARGS], tmp_path)
    one, two = _losses(tmp_path / "one"), _losses(tmp_path / "two")
    assert len(one) == len(two) == 6
    assert one == pytest.approx(two, rel=1e-5)
    a = load_file(str(check_run_dir(tmp_path / "one") / "model.safetensors"))
    b = load_file(str(check_run_dir(tmp_path / "two") / "model.safetensors"))
    assert a.keys() == b.keys()
    diff = max((a[k] - b[k]).abs().max().item() for k in a)
    assert diff <= 1e-5, f"max |weight difference| {diff:.2e}"


@pytest.mark.skipif(shutil.which("torchrun", path=str(Path(sys.executable).parent)) is None,
                    reason="torchrun not installed")
def test_a_timed_run_on_two_ranks_stops_every_rank_at_one_step(tmp_path):
    """The clock decides each rank's last step; they must agree (a rank that stopped alone would
    leave the other waiting in the next step's all-reduce until the timeout)."""
    data = write(tmp_path / "d.jsonl", seq2seq_rows(200))
    torchrun = str(Path(sys.executable).parent / "torchrun")
    args = list(ARGS)
    for option in ("--steps", "--eval-every"):  # the clock schedules both here
        i = args.index(option)
        del args[i : i + 2]
    _run([torchrun, "--standalone", "--nproc_per_node", "2", "-m", "tformer", "train", "--data", str(data),
          "--out", str(tmp_path / "timed"), "--max-minutes", "0.25", "--steps", "100000", *args], tmp_path)
    lines = [json.loads(line) for line in (tmp_path / "timed" / "metrics.jsonl").read_text().splitlines()]
    assert lines[-1]["split"] == "test" and lines[-1]["stopped_by"] == "max_minutes"
