"""`tformer export --onnx`: onnxruntime against tformer at three shapes (max abs <= 1e-4, float32)."""

from __future__ import annotations

import os
import stat
import sys

import numpy as np
import pytest
import torch
from hf_bert_fixtures import bert_dir, st_dir

from tformer.commands.cli import main
from tformer.export.onnx import TOLERANCE, example_inputs, graph_for

ort = pytest.importorskip("onnxruntime", reason="the onnx extra is not installed")


def _export(tmp_path, directory, capsys):
    out = tmp_path / "model.onnx"
    assert main(["export", str(directory), "--onnx", str(out)]) == 0
    assert "max abs diff" in capsys.readouterr().err
    return out


@pytest.mark.parametrize("kind", ["bert", "sentence-transformers"])
def test_onnx_export_matches_tformer_at_three_shapes(tmp_path, capsys, kind):
    directory = bert_dir() if kind == "bert" else st_dir("mean", True)
    out = _export(tmp_path, directory, capsys)
    assert stat.S_IMODE(os.stat(out).st_mode) == 0o666 & ~_umask()  # follows the umask
    graph = graph_for(directory)
    session = ort.InferenceSession(str(out), providers=["CPUExecutionProvider"])
    assert [i.name for i in session.get_inputs()] == graph.input_names
    assert session.get_outputs()[0].name == graph.output_name
    for b, s in [(1, 3), (4, 11), (7, 30)]:
        inputs = example_inputs(graph, b, s, seed=s)
        with torch.no_grad():
            expected = graph(**inputs).numpy()
        (got,) = session.run(None, {k: v.numpy() for k, v in inputs.items()})
        assert got.shape == expected.shape
        diff = float(np.abs(got - expected).max())
        assert diff <= TOLERANCE, f"({b}, {s}): max abs diff {diff:.3e} > {TOLERANCE}"
    if kind == "sentence-transformers":
        assert got.shape == (7, graph.encoder.config.d_model)
        np.testing.assert_allclose(np.linalg.norm(got, axis=1), 1.0, atol=1e-5)


def test_onnx_export_errors_are_one_line(tmp_path, capsys):
    rc = main(["export", str(bert_dir()), "--onnx", str(tmp_path / "missing" / "m.onnx")])
    err = capsys.readouterr().err
    assert rc == 2 and err.count("\n") == 1 and "does not exist" in err
    rc = main(["export", str(tmp_path / "nope"), "--onnx", str(tmp_path / "m.onnx")])
    assert rc == 2 and "no such model directory" in capsys.readouterr().err


def test_a_folder_name_is_refused_not_written_as_a_file(tmp_path, capsys):
    """`--onnx out/` names a folder: pathlib dropped the slash, so a file `out` was written and the
    line said "wrote out/"."""
    out = str(tmp_path / "out") + os.sep
    rc = main(["export", str(bert_dir()), "--onnx", out])
    err = capsys.readouterr().err
    assert rc == 2 and err == (f"tformer export: error: --onnx: expected a file path like model.onnx (a model "
                               f"directory exports one file), got the folder name {out!r}\n"), err
    assert list(tmp_path.iterdir()) == []


def test_missing_extra_names_it(monkeypatch, tmp_path, capsys):
    monkeypatch.setitem(sys.modules, "onnxscript", None)  # import onnxscript now fails
    rc = main(["export", str(bert_dir()), "--onnx", str(tmp_path / "m.onnx")])
    err = capsys.readouterr().err
    assert rc == 2 and "pip install 'tformer[onnx]'" in err and err.count("\n") == 1
    assert not (tmp_path / "m.onnx").exists()


def _umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask


def test_an_export_says_one_line(tmp_path, capfd):
    """torch.onnx's talk about its own workings (skipped torchvision ops, renamed dynamic axes,
    deprecated pytree classes) is not the user's business: the export prints its one line."""
    import warnings

    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        assert main(["export", str(st_dir("mean", True)), "--onnx", str(tmp_path / "m.onnx")]) == 0
    err = capfd.readouterr().err
    assert err.count("\n") == 1 and err.startswith("wrote "), err
    assert not [str(w.message) for w in caught]


def test_a_killed_export_leaves_the_old_file_and_the_next_one_its_temp_file(tmp_path, capsys):
    """A real SIGKILL just before the rename: the earlier export stays whole, and the hidden temp
    file (as large as the model) is removed by the next export to that name."""
    import subprocess

    out = _export(tmp_path, bert_dir(), capsys)
    old = out.read_bytes()
    env = dict(os.environ, TFORMER_KILL_AT_WRITE="1")
    proc = subprocess.run([sys.executable, "-m", "tformer", "export", str(bert_dir()), "--onnx", str(out)],
                          env=env, capture_output=True, text=True)
    assert proc.returncode == -9, proc.stderr
    assert out.read_bytes() == old
    assert [p.name for p in tmp_path.iterdir() if p.name.endswith(".tmp")]  # what the kill left
    _export(tmp_path, bert_dir(), capsys)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["model.onnx"]


def test_a_symlinked_onnx_file_is_followed_and_stays_a_link(tmp_path, capsys):
    """As a linked folder is: the export the link names is replaced, the link stays a link; a
    link to nothing is refused (it created the file it named), and so is a link to a user's file."""
    target = _export(tmp_path, bert_dir(), capsys)
    link = tmp_path / "link.onnx"
    link.symlink_to(target.name)
    os.utime(target, (0, 0))
    assert main(["export", str(st_dir("mean", True)), "--onnx", str(link)]) == 0
    assert link.is_symlink() and target.stat().st_mtime > 0  # the target was written anew
    assert "sentence_embedding" in [o.name for o in ort.InferenceSession(str(link)).get_outputs()]
    dangling = tmp_path / "dangling.onnx"
    dangling.symlink_to(tmp_path / "nowhere" / "m.onnx")
    assert main(["export", str(bert_dir()), "--onnx", str(dangling)]) == 2
    assert "a symbolic link to " in capsys.readouterr().err and dangling.is_symlink()
    dangling.unlink()  # a link to nothing in a folder that is there: refused too, nothing created
    dangling.symlink_to(tmp_path / "new.onnx")
    assert main(["export", str(bert_dir()), "--onnx", str(dangling)]) == 2
    assert "new.onnx, which does not exist" in capsys.readouterr().err and not (tmp_path / "new.onnx").exists()
    (tmp_path / "mine.txt").write_text("a user's file")
    mine = tmp_path / "mine.onnx"
    mine.symlink_to("mine.txt")
    assert main(["export", str(bert_dir()), "--onnx", str(mine)]) == 2
    assert mine.is_symlink() and (tmp_path / "mine.txt").read_text() == "a user's file"


@pytest.mark.parametrize("opset", [17, 13])
def test_an_opset_the_exporter_cannot_write_is_refused_not_silently_raised(tmp_path, capfd, opset):
    # torch.onnx writes opset 18 when it cannot convert down to the one asked for; the export
    # said "wrote" over a file of another opset than --opset named.
    out = tmp_path / "m.onnx"
    rc = main(["export", str(bert_dir()), "--onnx", str(out), "--opset", str(opset)])
    err = capfd.readouterr().err
    assert rc == 2 and not out.exists()
    assert err.count("\n") == 1 and "--opset: expected" in err and f"got {opset}" in err, err


@pytest.mark.parametrize("opset", ["0", "-1", "1000"])
def test_an_opset_out_of_range_is_refused_before_tracing(tmp_path, capfd, opset):
    out = tmp_path / "m.onnx"
    rc = main(["export", str(bert_dir()), "--onnx", str(out), "--opset", opset])
    err = capfd.readouterr().err
    assert rc == 2 and not out.exists()
    assert err.count("\n") == 1 and err.startswith("tformer export: error: --opset: expected") and opset in err, err


@pytest.mark.parametrize("opset", [23, 99, 17])
def test_an_opset_outside_what_the_exporter_and_onnxruntime_support_is_refused_before_tracing(
        tmp_path, capfd, monkeypatch, opset):
    # 23 went through tformer's check (1..28, the onnx package's newest) and torch.onnx, then
    # failed inside onnxruntime with its own multi-line error; 17 was traced and then found at 18.
    from tformer.export import onnx as tonnx
    from tformer.export.opsets import supported_opsets

    if opset in supported_opsets():
        pytest.skip(f"opset {opset} exports and runs with the packages installed here")
    monkeypatch.setattr(tonnx, "_trace", lambda *a, **k: pytest.fail("traced"))
    out = tmp_path / "m.onnx"
    rc = main(["export", str(bert_dir()), "--onnx", str(out), "--opset", str(opset)])
    err = capfd.readouterr().err
    assert rc == 2 and not out.exists()
    assert err.count("\n") == 1 and err.startswith("tformer export: error: --opset: expected an ONNX opset in 18.."), err
    assert err.rstrip().endswith(f"got {opset}"), err


@pytest.mark.parametrize("opset", [pytest.param(22, marks=pytest.mark.slow), 23, 25])  # (22: 7 s)
def test_the_supported_opsets_are_those_that_export_and_check(opset):
    """supported_opsets probes onnxruntime's Attention without torch: a real export at the
    opsets around the ones it leaves out says whether the probe was right."""
    from tformer.export import onnx as tonnx
    from tformer.export.opsets import supported_opsets

    graph = graph_for(bert_dir())
    if opset in supported_opsets():
        _, diff = tonnx.onnx_bytes(graph, opset)
        assert diff <= TOLERANCE
    else:
        with pytest.raises(Exception):  # noqa: B017 (onnxruntime's own error class, or check_opset_written)
            tonnx.onnx_bytes(graph, opset)
