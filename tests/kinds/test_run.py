"""tformer.kinds.run: what every kind of run shares (inputs as the command line takes them, the
base model a card names)."""

import json

import pytest

from tformer.kinds.run import hub_name, texts_of


def test_a_str_is_one_text_and_blank_or_missing_texts_are_refused():
    assert texts_of("apple dog") == ["apple dog"]  # one input, not 9 characters
    assert texts_of(t for t in ("a", "b")) == ["a", "b"]
    assert texts_of("x", "inputs") == ["x"]
    for bad, error, message in (
        ("", ValueError, r"^texts: expected a non-empty text, got ''"),
        (["a", " \t"], ValueError, r"^texts\[1\]: expected a non-empty text"),
        ([], ValueError, r"^texts: expected at least one text, got none"),
        (["a", 3], TypeError, r"^texts\[1\]: expected a str, got int"),
        (b"ab", TypeError, r"^texts: expected a str or an iterable of str, got bytes"),
        (5, TypeError, r"^texts: expected a str or an iterable of str, got int"),
    ):
        with pytest.raises(error, match=message):
            texts_of(bad)


def test_a_base_models_hub_name_comes_from_its_config_never_from_a_local_path(tmp_path):
    assert hub_name(None) is None and hub_name(str(tmp_path / "missing")) is None
    (tmp_path / "config.json").write_text(json.dumps({"_name_or_path": "google-bert/bert-base-uncased"}))
    assert hub_name(str(tmp_path)) == "google-bert/bert-base-uncased"
    (tmp_path / "config.json").write_text(json.dumps({"_name_or_path": str(tmp_path)}))
    assert hub_name(str(tmp_path)) is None
