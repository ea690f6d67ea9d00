"""Reading your files: formats, columns, errors with file and line, streaming."""

import json
import tracemalloc

import pytest
from text_fixtures import classification_rows, embedding_rows, write

from tformer.kinds import kind_of_data
from tformer.training.records import indexed_records, read_records, records_at


@pytest.mark.parametrize("suffix", [".jsonl", ".csv", ".tsv"])
def test_formats_read_the_same_records(tmp_path, suffix):
    rows = classification_rows(5)
    path = write(tmp_path / f"d{suffix}", rows)
    assert [r for _, r in read_records(path)] == rows


def test_columns_rename_and_fields_choose_the_objective(tmp_path):
    path = write(tmp_path / "d.csv", [{"en": "a", "fr": "b"}])
    assert [r for _, r in read_records(path, "en=source,fr=target")] == [{"source": "a", "target": "b"}]
    assert kind_of_data(path, "en=source,fr=target").name == "seq2seq"
    assert kind_of_data(write(tmp_path / "c.jsonl", classification_rows(1))).name == "classification"
    assert kind_of_data(write(tmp_path / "e.tsv", embedding_rows(1))).name == "embedding"


def test_reading_streams_the_file(tmp_path):
    path = tmp_path / "big.jsonl"
    line = json.dumps({"source": "x" * 200, "target": "y" * 200}) + "\n"
    path.write_text(line * 20000 + "not json\n")  # 8 MB, broken at the very end
    records = read_records(path)
    assert next(records)[0] == 1  # the first record comes before the bad last line is read
    tracemalloc.start()
    with pytest.raises(ValueError, match="big.jsonl:20001: not valid JSON"):
        for _ in records:
            pass
    peak = tracemalloc.get_traced_memory()[1]
    tracemalloc.stop()
    assert peak < 1_000_000, peak  # far below the file's 8 MB


@pytest.mark.parametrize("spec, message", [
    ("en:source", r"columns: expected 'theirs=ours,...', got 'en:source'"),
    ("en=", r"columns: expected 'theirs=ours,...', got 'en='"),
])
def test_bad_columns_spec(tmp_path, spec, message):
    path = write(tmp_path / "d.csv", [{"en": "a", "fr": "b"}])
    with pytest.raises(ValueError, match=message):
        next(read_records(path, spec))


def test_unknown_file_type_and_missing_file(tmp_path):
    (tmp_path / "d.md").write_text("a\n")
    with pytest.raises(ValueError, match=r"d.md: expected a .jsonl, .csv, .tsv, .conll or .txt file \(or "
                                         r"--format conll for a CoNLL .txt file\), got '.md'"):
        next(read_records(tmp_path / "d.md"))
    with pytest.raises(FileNotFoundError, match="nope.jsonl: no such file"):
        next(read_records(tmp_path / "nope.jsonl"))


def test_tsv_field_starting_with_a_quote_stays_on_its_line(tmp_path):
    path = tmp_path / "d.tsv"
    path.write_text('text\tlabel\n"quoted start\ta\nplain\tb\nmore "inner" quotes\ta\nlast\tb\n')
    assert [r["text"] for _, r in read_records(path)] == [
        '"quoted start', "plain", 'more "inner" quotes', "last"]


def test_csv_field_longer_than_the_csv_modules_default_limit(tmp_path):
    long = "word " * 40_000  # 200,000 characters > csv's 131,072
    path = write(tmp_path / "d.csv", [{"text": long, "label": "a"}, {"text": "b", "label": "b"}])
    assert [len(r["text"]) for _, r in read_records(path)] == [len(long), 1]


def test_a_utf8_byte_order_mark_is_dropped(tmp_path):
    path = tmp_path / "excel.csv"
    path.write_bytes("\ufefftext,label\nhello,a\n".encode())
    assert [r for _, r in read_records(path)] == [{"text": "hello", "label": "a"}]


def test_columns_naming_an_unknown_column_or_one_field_twice_are_refused(tmp_path):
    path = write(tmp_path / "d.csv", [{"en": "a", "fr": "b"}])
    with pytest.raises(ValueError, match=r"d.csv:2: columns: expected columns de to rename, got en, fr"):
        next(read_records(path, "de=source,fr=target"))
    with pytest.raises(ValueError, match=r"columns: expected one column per field, got two for 'target'"):
        next(read_records(path, "en=target,fr=target"))


@pytest.mark.parametrize("suffix", [".jsonl", ".csv", ".tsv"])
def test_records_are_read_back_from_their_places_in_any_order(tmp_path, suffix):
    rows = classification_rows(7)
    path = write(tmp_path / f"d{suffix}", rows)
    indexed = list(indexed_records(path))
    assert [r for _, _, r in indexed] == rows
    places = [(line, offset) for line, offset, _ in indexed][::-1]
    assert list(records_at(path, None, places)) == [(line, r) for line, _, r in indexed][::-1]


def test_places_hold_for_crlf_a_byte_order_mark_and_a_field_over_two_lines(tmp_path):
    path = tmp_path / "d.csv"
    text = 'text,label\r\n"first line\r\nsecond line",a\r\nplain,b\r\n\r\n"x, y",a\r\n'
    path.write_bytes("\ufeff".encode() + text.encode())
    indexed = list(indexed_records(path, "text=text"))
    assert [(line, r["text"]) for line, _, r in indexed] == [
        (2, "first line\r\nsecond line"), (4, "plain"), (6, "x, y")]
    places = [(line, offset) for line, offset, _ in indexed]
    assert [r for _, r in records_at(path, "text=text", places[::-1])] == [r for *_, r in indexed][::-1]


def test_a_bad_byte_names_its_line_and_byte(tmp_path):
    path = tmp_path / "d.jsonl"
    path.write_bytes(b'{"text": "a", "label": "x"}\n{"text": "\xff", "label": "y"}\n')
    with pytest.raises(ValueError, match=r"d.jsonl:2: not UTF-8 text \(invalid start byte at byte 38\)"):
        list(read_records(path))


def test_a_file_cut_short_during_a_run_is_an_error_not_a_smaller_epoch(tmp_path):
    path = write(tmp_path / "d.jsonl", classification_rows(6))
    places = [(line, offset) for line, offset, _ in indexed_records(path)]
    path.write_bytes(path.read_bytes()[: places[3][1]])  # the last three records are gone
    with pytest.raises(ValueError, match=r"d.jsonl:4: no record at byte \d+ any more"):
        list(records_at(path, None, places))


@pytest.mark.parametrize("value, name", [("1", "1"), (1, "1"), (1.0, "1"), (-2, "-2"), (True, "true"),
                                         (False, "false"), ("1.0", "1.0"), ("x", "x")])
def test_a_label_is_a_class_name_by_one_rule(value, name):
    from tformer.training.records import label_name

    assert label_name(value, "f:1") == name


@pytest.mark.parametrize("value", [2.5, float("nan"), float("inf"), [1], {"a": 1}])
def test_labels_that_are_not_class_names_are_refused_naming_the_line(value):
    from tformer.kinds.classification import FIELDS

    with pytest.raises(ValueError, match=r"f\.jsonl:3: label: expected a class name"):
        FIELDS.check("f.jsonl:3", {"text": "a", "label": value})


@pytest.mark.parametrize("suffix, header", [(".csv", "text,label,text"), (".tsv", "text\tlabel\ttext")])
def test_a_column_named_twice_in_the_header_is_refused(tmp_path, suffix, header):
    """csv gave each row the last column of the name: a run trained on the wrong column, silently."""
    sep = "\t" if suffix == ".tsv" else ","
    path = tmp_path / f"d{suffix}"
    path.write_text(header + "\n" + sep.join(["a cat", "animal", "ZZZ1"]) + "\n")
    with pytest.raises(ValueError, match=r"d\.(csv|tsv):1: expected each column name once, got 'text' more"):
        next(read_records(path))
    with pytest.raises(ValueError, match=r":1: expected each column name once"):
        kind_of_data(path)


def test_a_null_field_is_named_as_null_not_as_missing():
    from tformer.kinds.classification import FIELDS

    with pytest.raises(ValueError, match=r"^f\.jsonl:3: label: expected a value, got null$"):
        FIELDS.check("f.jsonl:3", {"text": "a", "label": None})
    with pytest.raises(ValueError, match=r"^f\.jsonl:3: missing field 'label' \(the record has text\)$"):
        FIELDS.check("f.jsonl:3", {"text": "a"})


@pytest.mark.parametrize("seed", [-1, 2**63])
def test_a_seed_out_of_range_is_named(seed):
    from tformer.training.config import TrainConfig

    with pytest.raises(ValueError, match=rf"^seed: expected 0\.\.{2**63 - 1}, got {seed}$"):
        TrainConfig(task="reverse", seed=seed)


@pytest.mark.parametrize("name, text", [("h.csv", "text,label\n"), ("h.tsv", "text\tlabel\r\n\r\n")])
def test_a_header_row_alone_is_named_as_such_not_as_an_empty_file(tmp_path, name, text):
    path = tmp_path / name
    path.write_text(text)
    with pytest.raises(ValueError, match=r"expected at least one record, got only the header row \(text, label\)"):
        kind_of_data(path)


@pytest.mark.parametrize("text, message", [
    # A quote never closed: lenient csv ran to the end of the file, one field of every line after.
    ('text,label\n"first,a\nsecond,b\nthird,a\n',
     r"d.csv:2: expected a closing '\"' for the quoted field opened in this row, got the end of the file "
     r"\(line 4\)"),
    ('text,label\nfirst,a\nsecond,"b\nthird,a\n', r"d.csv:3: expected a closing '\"'"),
    # Closed by a later line's quote: lenient csv merged three rows into a well-formed-looking one.
    ('text,label\nfirst,a\n"second,b\nthird,a\n"fourth",b\n',
     r"d.csv:5: not valid CSV \(',' expected after '\"'\) \(in the row starting on line 3\)"),
])
def test_a_csv_quote_left_open_is_named_not_read_as_other_rows(tmp_path, text, message):
    path = tmp_path / "d.csv"
    path.write_text(text)
    with pytest.raises(ValueError, match=message):
        list(read_records(path))


def test_a_json_escape_of_half_a_surrogate_pair_is_named_with_its_line(tmp_path):
    """'\\ud800' is valid JSON but no UTF-8 text: training failed at hashing the record, with
    only "'utf-8' codec can't encode character '\\ud800' ...": no file, line or field."""
    from tformer.kinds.classification import FIELDS

    with pytest.raises(ValueError, match=r"^f\.jsonl:3: text: expected text UTF-8 can encode, got a lone "
                                         r"surrogate '\\ud800' at character 3$"):
        FIELDS.check("f.jsonl:3", json.loads('{"text": "ab\\ud800c", "label": "x"}'))
    assert FIELDS.check("f", json.loads('{"text": "\\ud83d\\ude00", "label": "x"}')) == {
        "text": "\U0001f600", "label": "x"}  # a whole pair is one character


def test_a_rename_onto_a_column_the_file_has_is_refused_not_one_silently_dropped(tmp_path):
    """`--columns summary=text` on a file that has a text column too kept the file's text and
    dropped the summary without a word (the rename did nothing)."""
    path = write(tmp_path / "d.csv", [{"summary": "s", "text": "t", "label": "l"}])
    with pytest.raises(ValueError, match=r"d\.csv:2: columns: expected summary=text to name a new column, got "
                                         r"'text' in the file too \(rename that one as well, e\.g\. text=old_text\)$"):
        next(read_records(path, "summary=text"))
    assert [r for _, r in read_records(path, "summary=text,text=old")] == [
        {"text": "s", "old": "t", "label": "l"}]
    assert [r for _, r in read_records(path, "summary=label,label=text,text=summary")] == [
        {"label": "s", "summary": "t", "text": "l"}]  # a rotation loses nothing


def test_a_column_renamed_twice_is_refused():
    """'Text=text,Text=label' kept the second silently; the error then named fields the user
    never wrote (got Label, label)."""
    from tformer.training.records import parse_columns

    with pytest.raises(ValueError, match=r"^columns: expected each column renamed once, got 'Text' twice in "
                                         r"'Text=text,Text=label'$"):
        parse_columns("Text=text,Text=label")
