import os

import pytest

from tformer import TransformerConfig
from tformer.storage.files import read_json_object, write_atomic


def test_failed_write_keeps_the_previous_file(tmp_path, monkeypatch):
    path = tmp_path / "model.safetensors"
    write_atomic(path, b"old")

    def boom(src, dst):
        raise OSError("disk full")

    monkeypatch.setattr(os, "replace", boom)
    with pytest.raises(OSError, match="disk full"):
        write_atomic(path, b"new")
    assert path.read_bytes() == b"old" and os.listdir(tmp_path) == ["model.safetensors"]


def test_failed_config_save_keeps_the_previous_config(tmp_path, monkeypatch):
    path = tmp_path / "config.json"
    TransformerConfig(d_model=64, n_heads=4).save(path)
    monkeypatch.setattr(os, "replace", lambda src, dst: (_ for _ in ()).throw(OSError("disk full")))
    with pytest.raises(OSError, match="disk full"):
        TransformerConfig(d_model=128, n_heads=4).save(path)
    assert TransformerConfig.load(path).d_model == 64


def test_a_folder_that_refuses_the_temp_file_is_reported_by_the_path_asked_for(tmp_path):
    # mkstemp's error named ".a.png.x1y2.tmp": on a read-only folder, `attention --out ro/a.png`
    # said "ro/.a.png.oo4huqdy.tmp: Read-only file system", a file the user never named.
    target = tmp_path / "missing" / "a.png"
    with pytest.raises(FileNotFoundError) as caught:
        write_atomic(target, b"x")
    assert caught.value.filename == str(target)


@pytest.mark.parametrize("content, message", [
    (b'{"a": 1', "not valid JSON"), (b"\xff\xfe{}", "not valid JSON"),
    (b"[1, 2]", "expected a JSON object, got list")])
def test_a_damaged_json_file_is_named_in_one_line(tmp_path, content, message):
    path = tmp_path / "state.json"
    path.write_bytes(content)
    with pytest.raises(ValueError, match=f"^{path}: {message}") as caught:
        read_json_object(path)
    assert "\n" not in str(caught.value)
    path.write_text('{"a": 1}')
    assert read_json_object(path) == {"a": 1}
