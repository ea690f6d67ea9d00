"""--device on every command that runs a model: train, predict, generate, eval, embed, similarity,
search, index build, attention, serve and bench take it; `--device cpu` trains; on a machine
without CUDA, `--device cuda` is one line and a non-zero exit, before anything is loaded."""

import json
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from cli_helpers import assert_one_line_error, run_cli
from hf_bert_fixtures import st_dir

from tformer.commands.cli import main
from tformer.storage.checkpoint import check_run_dir

SRC = str(Path(__file__).resolve().parents[2] / "src")
TINY = ["--d-model", "16", "--n-heads", "2", "--d-ff", "32", "--n-layers", "1", "--batch-size", "8",
        "--valid-size", "16", "--test-size", "16", "--eval-every", "2", "--threads", "1", "--quiet"]
no_cuda_here = pytest.mark.skipif(torch.cuda.is_available(), reason="this machine has a CUDA GPU")

DEVICE_COMMANDS = ["train", "predict", "generate", "eval", "embed", "similarity", "search", "attention",
                   "serve", "bench", "index build"]


@pytest.mark.parametrize("command", DEVICE_COMMANDS)
def test_every_command_that_runs_a_model_takes_device(command, capsys):
    with pytest.raises(SystemExit):
        main([*command.split(), "--help"])
    assert "--device" in capsys.readouterr().out, command


def test_train_on_the_cpu(tmp_path, capsys):
    out = tmp_path / "run"
    rc, outp, err = run_cli(capsys, "train", "--task", "reverse", "--device", "cpu", "--steps", "4",
                            "--out", out, *TINY)
    assert rc == 0, err
    assert "device: cpu (" in outp  # the run says where it trains
    assert json.loads((check_run_dir(out) / "trainer_state.json").read_text())["device"] == "cpu"
    assert json.loads((out / "metrics.jsonl").read_text().splitlines()[-1])["device"] == "cpu"
    rc, outp, err = run_cli(capsys, "generate", out, "3 1 4", "--device", "cpu")
    assert rc == 0 and outp.count("\n") == 1, err  # one line per input (4 steps: maybe empty)


@no_cuda_here
@pytest.mark.parametrize("argv", [
    ["train", "--task", "reverse"],
    ["predict", "RUN", "a text"],
    ["generate", "RUN", "3 1 4"],
    ["eval", "RUN"],
    ["embed", "MODEL", "a text"],
    ["similarity", "MODEL", "a", "b"],
    ["search", "MODEL", "a query", "--corpus", "CORPUS"],
    ["index", "build", "MODEL", "--corpus", "CORPUS", "--out", "INDEX"],
    ["attention", "MODEL", "a text", "--out", "a.png"],
    ["serve", "MODEL"],
    ["bench", "--quick"],
])
def test_cuda_without_a_gpu_is_one_line(argv, capsys, tmp_path):
    corpus = tmp_path / "corpus.txt"
    corpus.write_text("one\ntwo\n")
    names = {"RUN": tmp_path / "no-run", "MODEL": st_dir(), "CORPUS": corpus, "INDEX": tmp_path / "index"}
    rc, out, err = run_cli(capsys, *[names.get(a, a) for a in argv], "--device", "cuda")
    command = argv[0]
    assert_one_line_error(rc, err, command, r"--device: expected a device this machine has \(cpu.*\), "
                                            r"got 'cuda': torch \S+ \(.*\) sees no CUDA GPU$")
    assert not (tmp_path / "index").exists()


@no_cuda_here
def test_cuda_without_a_gpu_in_a_real_process_prints_no_traceback(tmp_path):
    """The process a user starts: exit 2, one line on stderr, nothing on stdout, no run directory."""
    proc = subprocess.run([sys.executable, "-m", "tformer", "train", "--task", "reverse", "--device", "cuda",
                           "--out", str(tmp_path / "run")], capture_output=True, text=True,
                          env={"PYTHONPATH": SRC, "PATH": "/usr/bin:/bin"}, timeout=120)
    assert proc.returncode == 2, proc.stderr
    assert proc.stderr.count("\n") == 1 and "Traceback" not in proc.stderr, proc.stderr
    assert proc.stderr.startswith("tformer train: error: --device: expected a device this machine has"), proc.stderr
    assert not (tmp_path / "run").exists()


def test_a_misspelled_device_is_one_line(capsys):
    rc, _, err = run_cli(capsys, "embed", st_dir(), "a text", "--device", "gpu")
    assert_one_line_error(rc, err, "embed", r"--device: expected auto, cpu, cuda, cuda:N or mps, got 'gpu'$")
    rc, _, err = run_cli(capsys, "train", "--task", "reverse", "--device", "gpu")
    assert_one_line_error(rc, err, "train", r"--device: expected auto, cpu, cuda, cuda:N or mps, got 'gpu'$")


def test_the_numpy_engine_is_cpu_only(capsys):
    rc, _, err = run_cli(capsys, "train", "--engine", "numpy", "--task", "reverse", "--device", "cuda")
    assert_one_line_error(rc, err, "train", r"--device: the numpy engine runs on the CPU; expected auto or cpu, got 'cuda'$")


def test_embed_on_the_device_equals_the_cpu(capsys, tmp_path, device):
    texts = ["a dog runs", "the cat sat on the mat", "one"]
    rc, _, err = run_cli(capsys, "embed", st_dir(), *texts, "--device", device, "--dtype", "fp32",
                         "--out", tmp_path / "d.npy")
    assert rc == 0, err
    rc, _, err = run_cli(capsys, "embed", st_dir(), *texts, "--device", "cpu", "--dtype", "fp32",
                         "--out", tmp_path / "c.npy")
    assert rc == 0, err
    import numpy as np

    assert np.abs(np.load(tmp_path / "d.npy") - np.load(tmp_path / "c.npy")).max() < 1e-4


def test_the_device_workloads_run_on_the_device(tmp_path, capsys, device):
    """The GPU benchmark's two workloads (a training step against HF BertModel sdpa, sentence
    embeddings against sentence-transformers), here at --quick sizes on the suite's device: the
    plumbing and the output checks, never the timings."""
    out = tmp_path / "b.json"
    rc, table, err = run_cli(capsys, "bench", "--quick", "--rounds", "1", "--device", device,
                             "--only", "device-train", "device-sentences", "--json", out)
    assert rc == 0, err
    data = json.loads(out.read_text())
    rows = {(r["workload"], r["contender"]): r for r in data["rows"]}
    assert ("device-train", "tformer, fp32") in rows and ("device-sentences", "tformer fp32") in rows
    assert not [r for r in data["rows"] if "not timed" in r["note"]], data["rows"]
    assert ("device-train", "HF BertModel sdpa, fp32") in rows
    assert ("device-sentences", "sentence-transformers fp32") in rows
    for (workload, contender), row in rows.items():  # each 16-bit row says how close it came
        if workload == "device-sentences" and not contender.endswith("fp32"):
            assert float(row["note"].split("min cosine ")[1]) >= 0.99, row
    assert all(t["met"] is None for t in data["targets"])  # --quick: nothing judged
    assert f"on {device}" in data["machine"]["mode"]
