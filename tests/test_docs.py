"""The tour (docs/tour*.md) runs: every python block executes, and prints what the doc shows."""

from __future__ import annotations

import importlib.util
import re
import sys
from pathlib import Path

import pytest

DOCS = Path(__file__).resolve().parents[1] / "docs"
_spec = importlib.util.spec_from_file_location("tour_runner", DOCS / "tour_runner.py")
tour_runner = importlib.util.module_from_spec(_spec)
sys.modules["tour_runner"] = tour_runner  # its dataclass looks itself up there
_spec.loader.exec_module(tour_runner)


def test_there_is_a_tour():
    assert tour_runner.tour_files(), f"no tour*.md in {DOCS}"


@pytest.mark.parametrize("path", tour_runner.tour_files(), ids=lambda p: p.name)
def test_tour_code_runs_and_prints_what_it_shows(path, tmp_path, monkeypatch, one_thread):
    monkeypatch.chdir(tmp_path)  # a block that writes a file writes it here
    checked = 0
    for block, printed in tour_runner.run(path):
        if block.output is not None:
            assert tour_runner.same(block.output, printed), (
                f"{path.name}:{block.line}: the block printed\n{printed}\nbut the doc shows\n{block.output}\n"
                "(PYTHONPATH=src python docs/tour_runner.py --update rewrites the outputs)"
            )
            checked += 1
    assert checked > 0


def test_tour_pictures_and_links_exist():
    for path in tour_runner.tour_files():
        text = path.read_text()
        for target in re.findall(r"\]\(([^)#\s]+)\)", text):
            if not target.startswith(("http://", "https://")):
                assert (path.parent / target).exists(), f"{path.name}: broken link {target}"
    readme = (DOCS.parent / "README.md").read_text()
    assert "docs/tour.md" in readme


def test_blocks_pairs_code_with_the_output_right_after_it():
    text = "a\n```python\nprint(1)\n```\n\n```text\n1\n```\n```python\nx = 2\n```\ntext\n```text\n2\n```\n"
    first, second = tour_runner.blocks(text)
    assert (first.code, first.line, first.output) == ("print(1)\n", 3, "1\n")
    assert (second.code, second.output) == ("x = 2\n", None)  # prose between: not its output


@pytest.mark.parametrize(("only", "needs"), [("positions", ()), ("norm", ("NORM_RUNS",)),
                                            ("attention", ("TASK_RUNS",))])
def test_make_figures_trains_only_the_runs_its_figures_need(only, needs, tmp_path, monkeypatch):
    """`make_figures.py --only positions` trained reverse and copy (16 minutes) for pictures
    that need no run."""
    spec = importlib.util.spec_from_file_location("make_figures", DOCS / "make_figures.py")
    make_figures = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(make_figures)
    trained = set()
    monkeypatch.setattr(make_figures, "train_all", lambda runs, root: trained.update(runs) or {})
    for figure in ("positions_figures", "attention_figures", "page_screenshot", "norm_figure"):
        monkeypatch.setattr(make_figures, figure, lambda *a: None)
    monkeypatch.setattr(sys, "argv", ["make_figures.py", "--runs", str(tmp_path), "--only", only])
    make_figures.main()
    assert trained == {name for runs in needs for name in getattr(make_figures, runs)}


def test_the_readme_names_every_extra():
    """README's install line listed the extras without `tensorboard` (`--report-to tensorboard`)."""
    import tomllib

    root = DOCS.parent
    extras = tomllib.loads((root / "pyproject.toml").read_text())["project"]["optional-dependencies"]
    (line,) = [x for x in (root / "README.md").read_text().splitlines() if "# extras: " in x]
    named = [n.strip() for n in line.split("# extras: ")[1].split("(")[0].split(",")]
    assert sorted(named) == sorted(extras), line


def test_every_1e5_claim_in_the_readme_says_it_is_fp32():
    """README said exports and checkpoints agree "to 1e-5"; `tformer embed` runs bf16 by default
    where it is faster, 7e-4 from sentence-transformers. Each such claim names fp32, and the
    README says what the default gives and how to get fp32."""
    text = " ".join((DOCS.parent / "README.md").read_text().split())
    claims = [m.start() for m in re.finditer(r"1e-5", text)]
    assert claims
    for at in claims:
        sentence = text[text.rfind(". ", 0, at) + 2 : text.find(". ", at) + 1]
        assert "fp32" in sentence, sentence
    assert "default to `--dtype auto`" in text and "`--dtype fp32` gives the fp32 numbers" in text
