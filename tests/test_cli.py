"""The CLI's error contract: user mistakes are one line and exit 2; bugs keep their traceback."""

from __future__ import annotations

import pytest

from tformer.commands import cli


def _command_raising(monkeypatch, error):
    parser, commands = cli.build_parser()

    def boom(args):
        raise error

    monkeypatch.setattr(cli, "build_parser", lambda: (parser, commands))
    commands["info"].set_defaults(_run=boom)


@pytest.mark.parametrize("error", [ValueError("x: expected 1, got 2"), FileNotFoundError("nope: no such file")])
def test_user_errors_are_one_line(monkeypatch, capsys, error):
    _command_raising(monkeypatch, error)
    assert cli.main(["info", "whatever.json"]) == 2
    err = capsys.readouterr().err
    assert err == f"tformer info: error: {error}\n"


@pytest.mark.parametrize("below", ["", "sub/"])
def test_a_file_where_an_output_folder_is_needed_is_named(tmp_path, capsys, below):
    """`embed --out afile/e.npy` with afile a file said "[Errno 17] File exists: 'afile'"."""
    (tmp_path / "afile").write_text("mine")
    (tmp_path / "t.txt").write_text("a text\n")
    out = tmp_path / "afile" / f"{below}e.jsonl"
    from hf_bert_fixtures import st_dir

    assert cli.main(["embed", str(st_dir()), "--file", str(tmp_path / "t.txt"), "--out", str(out)]) == 2
    wanted = f" (for {out.parent})" if below else ""
    assert capsys.readouterr().err == (f"tformer embed: error: {tmp_path / 'afile'}: is a file, where a "
                                       f"folder is needed{wanted}\n")
    assert (tmp_path / "afile").read_text() == "mine"


@pytest.mark.parametrize("error", [TypeError("unsupported operand"), KeyError("step"), AttributeError("x")])
def test_programming_errors_keep_their_traceback(monkeypatch, error):
    _command_raising(monkeypatch, error)
    with pytest.raises(type(error)):
        cli.main(["info", "whatever.json"])


def test_version_prints_the_package_version(capsys):
    import tformer

    with pytest.raises(SystemExit) as exit_:
        cli.main(["--version"])
    assert exit_.value.code == 0 and capsys.readouterr().out == f"tformer {tformer.__version__}\n"


def test_a_closed_pipe_ends_quietly(tmp_path):
    """`tformer info CONFIG | head -0`: the reader is gone before we write; no error line."""
    import subprocess
    import sys

    from tformer import TransformerConfig

    TransformerConfig(d_model=32, n_heads=4, d_ff=64, n_layers=2, vocab_size=50).save(
        tmp_path / "c.json")
    proc = subprocess.Popen([sys.executable, "-m", "tformer.commands.cli", "info", str(tmp_path / "c.json")],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    proc.stdout.close()  # like `head` exiting before the first line
    err = proc.stderr.read().decode()
    assert proc.wait() == 1 and err == ""


def test_the_command_ends_its_process_without_tearing_the_interpreter_down(tmp_path):
    """`tformer ...` exits itself (cli.exit_now): its status, the atexit functions and every byte
    of its output as before, but no module teardown and garbage collection (6 s after a 60 s
    training run on a busy machine, past its budget)."""
    import subprocess
    import sys
    import textwrap

    from tformer import TransformerConfig

    TransformerConfig(d_model=32, n_heads=4, d_ff=64, n_layers=2, vocab_size=50).save(tmp_path / "c.json")
    script = tmp_path / "command.py"
    script.write_text(textwrap.dedent("""
        import atexit, sys
        from tformer.commands import cli

        class Kept:
            def __del__(self):
                sys.stderr.write("torn down\\n")

        kept = Kept()  # the interpreter's teardown would delete it
        atexit.register(lambda: sys.stdout.write("atexit ran"))
        sys.stdout.write("unflushed, ")
        sys.argv = ["tformer", *sys.argv[1:]]
        cli.main()
        sys.stderr.write("main returned\\n")
    """))
    ok = subprocess.run([sys.executable, str(script), "info", str(tmp_path / "c.json")],
                        capture_output=True, text=True)
    assert ok.returncode == 0 and ok.stderr == ""
    assert ok.stdout.startswith("unflushed, ") and "d_model" in ok.stdout
    assert ok.stdout.endswith("atexit ran")
    bad = subprocess.run([sys.executable, str(script), "info", str(tmp_path / "missing.json")],
                         capture_output=True, text=True)
    assert bad.returncode == 2 and bad.stderr.startswith("tformer info: error:")
    assert "torn down" not in bad.stderr and bad.stdout.endswith("atexit ran")


@pytest.mark.parametrize(("argv", "named"), [
    (["embed", "", "a text"], "MODEL_DIR"),  # said "config.json: no such file"
    (["search", "/nowhere", "--model", "", "q"], "--model"),  # took the index's own model
    (["train", "--data", ""], "--data"),  # named a file '.'
    (["train", "--data", "d.jsonl", "--out", ""], "--out"),
    (["predict", "", "x"], "RUN_DIR"),
    (["index", "build", "m", "--corpus", "c.txt", "--out", ""], "--out"),  # a sub-command's too
    (["export", "m", "--onnx", ""], "--onnx"),
])
def test_an_empty_path_argument_is_refused_naming_it(tmp_path, monkeypatch, capsys, argv, named):
    """"" (an unset shell variable) is not the current folder: refused before anything runs,
    naming the argument, whatever the command."""
    monkeypatch.chdir(tmp_path)
    assert cli.main(argv) == 2
    err = capsys.readouterr().err.strip()
    assert err == (f"tformer {argv[0]}: error: {named}: expected a path, got '' (an unset shell "
                   "variable?); '.' names the current folder")
    assert list(tmp_path.iterdir()) == []  # nothing written
