"""tformer.text.lines: one text per line, lines end at \\n only, blank lines are FILE:LINE errors."""

from __future__ import annotations

import os

import pytest
from cli_helpers import NOT_LINE_BREAKS, stdin_bytes

from tformer.text.lines import TextLines


def _lines(tmp_path, data: bytes) -> TextLines:
    path = tmp_path / "t.txt"
    path.write_bytes(data)
    return TextLines(path, "--file")


@pytest.mark.parametrize("char", NOT_LINE_BREAKS)
def test_only_newline_ends_a_line(tmp_path, char):
    lines = _lines(tmp_path, f"a{char}b\nc\n".encode())
    assert list(lines) == [(1, f"a{char}b"), (2, "c")]
    assert lines.count() == 2


def test_crlf_and_a_missing_final_newline(tmp_path):
    assert _lines(tmp_path, b"a\r\nb\r\nc").texts() == ["a", "b", "c"]
    assert _lines(tmp_path, b"\xef\xbb\xbfa \n").texts() == ["a "]  # BOM dropped, text as written
    assert _lines(tmp_path, b"").count() == 0


@pytest.mark.parametrize("data, number", [(b"a\n\nb\n", 2), (b"a\n \t\r\n", 2), (b"\n", 1),
                                          (b"a\nb\n\n", 3)])
def test_a_blank_line_is_an_error_naming_file_and_line(tmp_path, data, number):
    with pytest.raises(ValueError, match=rf"--file .*t\.txt:{number}: expected a text, got a blank"):
        _lines(tmp_path, data).count()


def test_not_utf8_names_the_line(tmp_path):
    with pytest.raises(ValueError, match=r"t\.txt:2: expected UTF-8 text, got byte 0xff at column 2"):
        _lines(tmp_path, b"a\nb\xff\n").texts()


def test_stdin_is_read_once_and_iterated_again(monkeypatch):
    stdin_bytes(monkeypatch, b"x\x0cy\r\nz\n")
    lines = TextLines("-", "--file")
    assert lines.count() == 2 and lines.texts() == ["x\x0cy", "z"]
    with pytest.raises(ValueError, match=r"standard input:2: expected a text"):
        stdin_bytes(monkeypatch, b"x\n\n")
        TextLines("-", "--file").count()


def test_digest_follows_the_bytes(tmp_path):
    assert _lines(tmp_path, b"a\nb\n").digest() == _lines(tmp_path, b"a\nb").digest()
    assert _lines(tmp_path, b"a\nb\n").digest() != _lines(tmp_path, b"a\nc\n").digest()


def test_missing_file_is_named(tmp_path):
    with pytest.raises(FileNotFoundError, match=r"--corpus .*none\.txt: no such file"):
        TextLines(tmp_path / "none.txt", "--corpus")


def test_a_directory_is_named_as_a_directory(tmp_path):
    from tformer.text.lines import TextLines

    with pytest.raises(IsADirectoryError, match=r"--file .*: expected a file of texts, one per line, got a directory"):
        TextLines(tmp_path, "--file")


@pytest.mark.parametrize("chunk", [1, 3, 7, 1 << 20])
@pytest.mark.parametrize("data", [b"", b"a", b"a\n", b"a\r\nbb\n\xef\xbb\xbfc", b"\xef\xbb\xbfab\ncd\n",
                                  b"x" * 20 + b"\n" + b"yz" * 9, b"a\n\n", b"\n"])
def test_stdin_gives_the_lines_a_file_of_the_same_bytes_gives(tmp_path, monkeypatch, chunk, data):
    # Standard input was held in memory, then split again in memory: 146 MB piped to
    # `predict --file -` took 741 MB (238 MB from a file). Now spooled to a temp file and read
    # `chunk` bytes at a time, it must read exactly as the file does, lines across chunks included.
    monkeypatch.setattr("tformer.text.lines.CHUNK", chunk)
    (tmp_path / "f.txt").write_bytes(data)
    stdin_bytes(monkeypatch, data)

    def read(lines):
        try:
            return list(lines), lines.digest()
        except ValueError as e:
            return str(e).split(":")[-2:]  # "LINE: expected a text..." whatever the name

    assert read(TextLines("-", "--file")) == read(TextLines(tmp_path / "f.txt", "--file"))


def test_stdin_is_not_held_in_memory(monkeypatch):
    data = b"some text\n" * 100_000  # 1 MB
    stdin_bytes(monkeypatch, data)
    lines = TextLines("-", "--file")
    held = sum(len(v) for v in vars(lines).values() if isinstance(v, (bytes, bytearray, str, list)))
    assert held < 1000 and lines.count() == 100_000


def test_a_pipe_is_not_said_to_be_missing(tmp_path):
    # `--file <(cmd)` or --file /dev/stdin: "no such file", of a file that is there.
    fifo = tmp_path / "fifo"
    os.mkfifo(fifo)
    with pytest.raises(ValueError, match=r"--file .*fifo: expected a regular file \(read twice\), got a "
                                         r"pipe or device; for a pipe, give '-'"):
        TextLines(fifo, "--file")
