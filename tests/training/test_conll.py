"""CoNLL files read by tformer.training.records: a sentence per record, numbered by its first
line and read again from its byte offset (a shuffled epoch reads sentences out of order), the
-DOCSTART- lines skipped, errors naming file:line; a .txt file with fmt="conll" (--format)."""

import pytest

from tformer.kinds import kind_of_data
from tformer.training.records import first_record, format_of, indexed_records, read_records, records_at

CONLL = """-DOCSTART- -X- -X- O

EU NNP B-NP B-ORG
rejects VBZ B-VP O
German JJ B-NP B-MISC
call NN I-NP O
. . O O

Peter NNP B-NP B-PER
Blackburn NNP I-NP I-PER
-DOCSTART- -X- -X- O
BRUSSELS\tB-LOC
1996-08-22\tO


"""
SENTENCES = [
    (3, {"tokens": ["EU", "rejects", "German", "call", "."], "tags": ["B-ORG", "O", "B-MISC", "O", "O"]}),
    (9, {"tokens": ["Peter", "Blackburn"], "tags": ["B-PER", "I-PER"]}),
    (12, {"tokens": ["BRUSSELS", "1996-08-22"], "tags": ["B-LOC", "O"]}),
]


def test_sentences_are_records_numbered_by_their_first_line(tmp_path):
    path = tmp_path / "train.conll"
    path.write_text(CONLL)
    assert list(read_records(path)) == SENTENCES
    where, record = first_record(path)
    assert where == f"{path}:3" and list(record) == ["tokens", "tags"]
    assert kind_of_data(path).name == "tagging"


def test_sentences_are_read_again_from_their_offsets_in_any_order(tmp_path):
    path = tmp_path / "train.conll"
    path.write_bytes(("\ufeff" + CONLL).replace("\n", "\r\n").encode())  # a BOM, Windows line ends
    indexed = list(indexed_records(path))
    assert [(line, r) for line, _, r in indexed] == SENTENCES
    places = [(line, offset) for line, offset, _ in indexed][::-1]
    assert list(records_at(path, None, places)) == SENTENCES[::-1]


def test_a_txt_file_is_conll_with_fmt(tmp_path):
    path = tmp_path / "train.txt"
    path.write_text(CONLL)
    assert list(read_records(path, fmt="conll")) == SENTENCES
    assert kind_of_data(path, fmt="conll").name == "tagging"
    # Without --format a .txt file is one text a line (masked-LM pre-training's data).
    assert next(read_records(path)) == (1, {"text": CONLL.splitlines()[0]})
    with pytest.raises(ValueError, match=r"train\.md: expected a \.jsonl, \.csv, \.tsv, \.conll or \.txt file "
                                         r"\(or --format conll for a CoNLL \.txt file\), got '\.md'"):
        next(read_records(path.rename(tmp_path / "train.md")))
    assert format_of(tmp_path / "a.jsonl", "conll") == "jsonl"  # a structured suffix says its own


def test_a_line_without_a_tag_is_refused_naming_it(tmp_path):
    path = tmp_path / "bad.conll"
    path.write_text("EU B-ORG\nrejects\n")
    with pytest.raises(ValueError, match=r"bad\.conll:2: expected a token and its tag \(CoNLL columns "
                                         r"separated by spaces or tabs, the tag last\), got 'rejects'$"):
        list(read_records(path))


def test_a_file_of_docstarts_has_no_records(tmp_path):
    path = tmp_path / "empty.conll"
    path.write_text("-DOCSTART- O\n\n\n")
    assert list(read_records(path)) == []
    with pytest.raises(ValueError, match=r"empty\.conll: expected at least one record, got an empty file"):
        first_record(path)
