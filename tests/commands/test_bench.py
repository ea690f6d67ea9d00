"""`tformer bench --quick`: the CI smoke test. Checks the table and the JSON, never the timings."""

from __future__ import annotations

import json
import os
import signal
import time

import pytest

from tformer.commands.benchmarking import workloads
from tformer.commands.benchmarking.harness import Report, Row
from tformer.commands.cli import main
from tformer.nn.kernels.machine import NO_BF16, cpu_info, has_bf16

PEER_WORKLOADS = ["sentences-minilm", "mixed-base"]

SUBSET = ["dense-small", "padded-small-pre", "train-small", "decode"]


def _run(tmp_path, capsys, *extra):
    out = tmp_path / "bench.json"
    assert main(["bench", "--quick", "--rounds", "1", "--json", str(out), *extra]) == 0
    return capsys.readouterr().out, json.loads(out.read_text())


def test_quick_subset_prints_the_table_and_json(tmp_path, capsys):
    table, data = _run(tmp_path, capsys, "--only", *SUBSET)
    assert set(data) == {"machine", "rows", "targets", "notes", "interrupted"} and data["interrupted"] is None
    assert {"cpu", "isa", "torch", "threads", "onednn_linear"} <= set(data["machine"])
    row_keys = {"workload", "contender", "median_ms", "spread", "tokens_per_s", "vs_tformer", "cores",
                "roofline", "peak_mib", "note"}
    assert all(set(r) == row_keys for r in data["rows"])
    workloads = {r["workload"] for r in data["rows"]}
    assert {"dense-small", "padded-small-pre", "train-small", "decode-small"} <= workloads
    contenders = {r["contender"] for r in data["rows"] if r["workload"] == "dense-small"}
    assert {"tformer", "torch.nn fast path"} <= contenders
    # Every timed contender passed its output check (untimed ones carry a "not timed" note).
    assert not [r for r in data["rows"] if "not timed" in r["note"]]
    # Quick sizes say nothing about speed: no target is judged.
    assert data["targets"] and all(t["met"] is None for t in data["targets"])
    header = "| workload | contender | median ms | spread | tokens/s |"
    assert header in table and "| dense-small | tformer |" in table
    assert "| workload | target | measured | met |" in table


def test_list_and_bad_workload(capsys):
    assert main(["bench", "--list"]) == 0
    names = capsys.readouterr().out.split()
    assert names[0] == "gemm" and "memory" in names and "bf16" in names
    assert {"sentences-minilm", "mixed-base"} <= set(names)
    assert main(["bench", "--only", "nope"]) == 2
    assert "--only: unknown workload(s) nope" in capsys.readouterr().err


def test_full_quick_run(tmp_path, capsys):
    """Every in-process workload at `--quick` sizes (about 11 s): the CI smoke test. The peer
    workloads (a process per contender) have their own tests: tests/benchmarks/test_peers.py and
    the slow test below."""
    in_process = [w for w in workloads.names() if w not in PEER_WORKLOADS]
    _, data = _run(tmp_path, capsys, "--only", *in_process)
    assert {r["workload"] for r in data["rows"]} >= {"dense-base", "bf16-base", "train-base", "memory-512"}
    decoding = {r["contender"]: r["note"] for r in data["rows"] if r["workload"] == "decode-default"}
    assert "time: linears " in decoding["tformer beam 4"]  # where its time goes (breakdown.py)
    assert "time:" not in decoding.get("HF generate beam 4", "")
    if not has_bf16():  # skipped with a note, not a crash
        assert [r["note"] for r in data["rows"] if r["workload"] == "bf16-base"] == [f"skipped: {NO_BF16}"]


@pytest.mark.slow
def test_quick_peer_workloads(tmp_path, capsys):
    """Both peer workloads with every contender this machine has (about a minute: a process each)."""
    table, data = _run(tmp_path, capsys, "--only", *PEER_WORKLOADS)
    rows = {(r["workload"], r["contender"]): r for r in data["rows"]}
    assert ("sentences-minilm", "tformer fp32") in rows and ("mixed-base", "tformer fp32") in rows
    for r in rows.values():
        assert r["median_ms"] is not None or r["note"].startswith("skipped: "), r
    assert "sentences/s" in rows[("sentences-minilm", "tformer fp32")]["note"]
    for (_, contender), r in rows.items():  # where a timed tformer call's time goes; no peer's
        assert ("; time: linears " in r["note"]) == (contender.startswith("tformer") and
                                                     r["median_ms"] is not None), r
    assert data["machine"]["isa"] == cpu_info()[1] and "threads" in table


@pytest.mark.slow  # ~23 s: every contender on a trained model; the quick run stays
def test_model_dir_encodes_with_the_given_model(tmp_path, capsys):
    """--model-dir: sentences-minilm encodes with the user's model (trained weights: the
    low-precision cosines mean something), named in the notes; tformer's own rows only here."""
    from hf_bert_fixtures import st_dir

    model = st_dir("mean", True)
    _, data = _run(tmp_path, capsys, "--only", "sentences-minilm", "--contenders", "tformer",
                   "--model-dir", str(model))
    contenders = {r["contender"] for r in data["rows"]}
    assert {"tformer fp32", "tformer int8"} <= contenders
    assert any(f"{model} (trained weights)" in note for note in data["notes"])
    assert main(["bench", "--only", "sentences-minilm", "--model-dir", str(tmp_path)]) == 2
    assert f"--model-dir {tmp_path}: expected a model directory with a config.json" in capsys.readouterr().err


@pytest.mark.parametrize("stop", ["ctrl-c", "sigterm"])
def test_a_stopped_bench_prints_and_saves_the_workloads_that_finished(tmp_path, capsys, monkeypatch, stop):
    """Minutes of measuring are not lost to Ctrl-C or to `timeout`'s SIGTERM: the finished
    workloads' table and JSON, the one that was running named, exit status 130 (Ctrl-C) or 143
    (SIGTERM: it was 130 too, as if Ctrl-C)."""

    def stopped() -> Report:
        if stop == "sigterm":
            os.kill(os.getpid(), signal.SIGTERM)
            time.sleep(5)  # the handler raises before this ends
        raise KeyboardInterrupt

    never = pytest.fail
    suite = {"first": lambda: Report(rows=[Row("first", "tformer", 1.0)]), "second": stopped, "third": never}
    monkeypatch.setattr(workloads, "suite", lambda s: suite)
    out = tmp_path / "bench.json"
    assert main(["bench", "--quick", "--json", str(out)]) == {"ctrl-c": 130, "sigterm": 143}[stop]
    captured = capsys.readouterr()
    assert "| first | tformer |" in captured.out and "interrupted during second" in captured.out
    said = {"ctrl-c": "interrupted", "sigterm": "terminated"}[stop]
    assert captured.err.rstrip().endswith(f"tformer bench: {said}")
    data = json.loads(out.read_text())
    assert data["interrupted"] == "second" and [r["workload"] for r in data["rows"]] == ["first"]
    assert signal.getsignal(signal.SIGTERM) is signal.SIG_DFL  # restored


def test_json_replaces_its_own_results_and_refuses_any_other_file(tmp_path, capsys, monkeypatch):
    monkeypatch.setattr(workloads, "suite", lambda s: {"first": lambda: Report(rows=[Row("first", "a", 1.0)])})
    out = tmp_path / "bench.json"
    for _ in range(2):  # the second run replaces the first's results
        assert main(["bench", "--quick", "--json", str(out)]) == 0
    capsys.readouterr()
    mine = tmp_path / "notes.json"
    mine.write_text('{"my": "notes"}\n')
    assert main(["bench", "--quick", "--json", str(mine)]) == 2
    err = capsys.readouterr().err.strip()  # refused before any workload ran
    assert err == (f"tformer bench: error: --json {mine}: exists and is not a results file `tformer bench "
                   "--json` wrote; pick another name, or move it away first")
    assert mine.read_text() == '{"my": "notes"}\n'
