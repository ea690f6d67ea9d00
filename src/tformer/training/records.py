"""Reading your files: JSONL, CSV, TSV, CoNLL and plain-text records, and their fields.

    for line_no, record in read_records("train.csv", columns="en=source,fr=target"): ...
    where, record = first_record("train.csv")     # what chooses the kind (tformer.kinds)

Files are read one line at a time (a file larger than memory works). Every error names the
file and line. JSONL: one object per line, blank lines skipped. CSV: RFC 4180 quoting, a
header row. TSV: a header row, fields separated by tabs and never quoted (a `"` is a
character like any other, so a field that starts with one cannot swallow the next lines).
.txt: one text per line, the record {"text": line} (blank lines skipped): masked-LM pre-training.
CoNLL (.conll, or a .txt file with fmt="conll": `--format conll`): one token per line, its tag in
the last column (columns separated by spaces or tabs), a blank line between sentences,
-DOCSTART- lines skipped; each sentence is one record {"tokens": [...], "tags": [...]}, numbered
by its first line (its i-th token is on that line + i). A UTF-8 byte-order mark (Excel's "CSV
UTF-8") is dropped.

The split of the records is tformer.training.splits'.
"""

from __future__ import annotations

import csv
import json
import sys
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from tformer.errors import FieldError
from tformer.training.conll import conll_sentences

FORMATS = {".jsonl": "jsonl", ".json": "jsonl", ".csv": "csv", ".tsv": "tsv", ".conll": "conll",
           ".txt": "lines"}
# What a file's format may be given as where its suffix does not say it (`--format`: a .txt file).
FORMAT_NAMES = ("jsonl", "csv", "tsv", "conll", "lines")

Record = dict[str, str]  # an objective's fields as non-empty strings (+ "line" when held out)


@dataclass(frozen=True)
class Fields:
    """The fields of one kind of record (each kind declares its own, tformer.kinds): required,
    optional, those whose text decides the split (the model's input: no input text may be in
    two splits), and the one holding a class label, if any. A kind whose records hold more than
    strings (lists, numbers) subclasses it and reads them in ``check``."""

    objective: str  # the kind's name, as data.json records it
    required: tuple[str, ...]
    optional: tuple[str, ...] = ()
    input_fields: tuple[str, ...] = ()
    label: str | None = None  # the field naming a class (read by ``label_name``'s rule)
    min_labels: int = 0  # distinct labels a training file must have
    specials: tuple[str, ...] = ()  # special tokens a tokenizer trained for the kind adds (<mask>)

    def chosen_by(self, names: set[str]) -> bool:
        """Whether a record with these field names is of this kind: it has the required ones."""
        return set(self.required) <= names

    def claims(self, record: Mapping[str, Any], options: Mapping[str, Any]) -> bool:
        """Whether a file whose first record is ``record`` holds this kind's data under the run's
        ``options`` (flat names): its field names (chosen_by; a kind told apart by a value says
        so itself)."""
        return self.chosen_by(set(record))

    def configured(self, config) -> Fields:
        """These fields as a run reads them under its TrainConfig (a kind whose records depend on
        an option returns a copy that holds it)."""
        return self

    def input_key(self, record: Record) -> str:
        return "\t".join(record.get(name, "") for name in self.input_fields)

    def labels_of(self, record: Record) -> tuple[str, ...]:
        """The class names a record holds (its label's, for the run's label list)."""
        return (record[self.label],) if self.label is not None and self.label in record else ()

    def texts_of(self, record: Record) -> list[str]:
        """The texts of a record a tokenizer learns from (all but its label)."""
        return [v for k, v in record.items() if k != self.label and k != "line" and isinstance(v, str)]

    def tally(self, counts: dict[str, Any], record: Record) -> None:
        """Add what a training record says beyond its labels to ``counts`` (data.json's "tally",
        kept with the run from its start): nothing, unless a kind needs more of its training data
        (a score's count, sum and range: the train mean, and whether scores lie in [0, 1])."""

    def check(self, where: str, record: dict[str, Any]) -> Record:
        """The record's fields as non-empty strings (a label by ``label_name``'s rule); errors
        start with `where` ("file:line")."""
        out: Record = {}
        for name in self.required + self.optional:
            value = record.get(name)
            if value is None:
                if name in self.optional:
                    continue
                if name in record:  # present, as JSON's null
                    raise ValueError(f"{where}: {name}: expected a value, got null")
                raise ValueError(f"{where}: missing field {name!r} (the record has "
                                 f"{', '.join(sorted(record)) or 'none'})")
            if name == self.label:
                value = label_name(value, where)
            if not isinstance(value, str):
                raise ValueError(f"{where}: {name}: expected a string, got {type(value).__name__}")
            if not value.strip():
                raise ValueError(f"{where}: {name}: expected text, got an empty string")
            check_encodable(where, name, value)
            out[name] = value
        return out


def check_encodable(where: str, name: str, value: str) -> None:
    """Refuse a string UTF-8 cannot hold: JSON's \\ud800-style escapes can spell half of a UTF-16
    pair (a lone surrogate), which no tokenizer, hash or output file can encode."""
    try:
        value.encode("utf-8")
    except UnicodeEncodeError as e:
        raise ValueError(f"{where}: {name}: expected text UTF-8 can encode, got a lone surrogate "
                         f"{value[e.start]!r} at character {e.start + 1}") from None


def label_name(value: Any, where: str) -> Any:
    """A label is a class name, compared as text, one rule for every format: a string as written;
    a whole number (1, 1.0, -2: a JSON number, or a Python int or float) as its integer text
    ("1", "-2"), so 1, 1.0 and "1" are one label, as they are in a CSV file; true/false as
    "true"/"false". Anything else (2.5, NaN, a list, an object) is refused, naming ``where``.
    Null and non-label values are returned as they are, for the caller's own errors."""
    if value is None or isinstance(value, str):
        return value
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int):
        return str(value)
    if isinstance(value, float) and value.is_integer():
        return str(int(value))
    raise ValueError(f"{where}: label: expected a class name (a string, a whole number such as 1 or 1.0, "
                     f"or true/false), got {value!r}")


def parse_columns(spec: str | None) -> dict[str, str]:
    """'en=source,fr=target' -> {'en': 'source', 'fr': 'target'} (their name -> ours)."""
    out: dict[str, str] = {}
    for part in (spec or "").split(","):
        if not part.strip():
            continue
        if part.count("=") != 1 or not all(s.strip() for s in part.split("=")):
            raise FieldError("columns", f"expected 'theirs=ours,...', got {spec!r}")
        theirs, ours = (s.strip() for s in part.split("="))
        if theirs in out:
            raise FieldError("columns", f"expected each column renamed once, got {theirs!r} twice in "
                                        f"{spec!r}")
        if ours in out.values():
            raise FieldError("columns", f"expected one column per field, got two for {ours!r} in {spec!r}")
        out[theirs] = ours
    return out


def read_records(path: str | Path, columns: str | None = None, fmt: str | None = None
                 ) -> Iterator[tuple[int, dict[str, Any]]]:
    """(line number, record) for each record of a JSONL/CSV/TSV/CoNLL file, one line at a time
    (``fmt``: the format of a file whose suffix does not say it, ``format_of``)."""
    for line_no, _, record in indexed_records(path, columns, fmt):
        yield line_no, record


def indexed_records(path: str | Path, columns: str | None = None, fmt: str | None = None
                    ) -> Iterator[tuple[int, int, dict[str, Any]]]:
    """(line number, byte offset, record) for each record, in file order: the offset is where
    the record's first line starts, for ``records_at`` to read it again."""
    path, fmt, rename = _opened(path, columns, fmt)
    with path.open("rb") as f:
        header = _header(path, f, fmt)
        first = True
        for line_no, offset, record in _records(path, f, fmt, header, 0, 1):
            if first and rename:
                _check_renamed(path, line_no, rename, record)
                first = False
            yield line_no, offset, _renamed(path, line_no, rename, record)


def records_at(path: str | Path, columns: str | None, places, fmt: str | None = None
               ) -> Iterator[tuple[int, dict[str, Any]]]:
    """(line number, record) for each (line number, byte offset) of ``places`` (as
    ``indexed_records`` gave them), read in the order given: a shuffled epoch without
    holding the file in memory."""
    path, fmt, rename = _opened(path, columns, fmt)
    with path.open("rb") as f:
        header = _header(path, f, fmt)
        for line_no, offset in places:
            for found, _, record in _records(path, f, fmt, header, int(offset), int(line_no)):
                yield found, _renamed(path, found, rename, record)
                break
            else:
                raise ValueError(f"{path}:{line_no}: no record at byte {offset} any more (the file "
                                 "changed during the run; train on a copy that stays put)")


def format_of(path: str | Path, fmt: str | None = None) -> str:
    """A file's format: its suffix's (.jsonl/.json, .csv, .tsv, .conll; .txt: text lines), or
    ``fmt`` (`--format`) for a .txt file or one of no known suffix (a .txt file of CoNLL columns:
    "conll"); a structured suffix always says its own."""
    path = Path(path)
    if fmt is not None and fmt not in FORMAT_NAMES:
        raise FieldError("format", f"expected one of {', '.join(FORMAT_NAMES)}, got {fmt!r}")
    own = FORMATS.get(path.suffix.lower())
    if own is not None and (own != "lines" or fmt is None):
        return own
    if fmt is None:
        raise ValueError(f"{path}: expected a .jsonl, .csv, .tsv, .conll or .txt file (or --format conll "
                         f"for a CoNLL .txt file), got {path.suffix or 'no suffix'!r}")
    return fmt


def _opened(path: str | Path, columns: str | None, fmt: str | None = None
            ) -> tuple[Path, str, dict[str, str]]:
    path = Path(path)
    fmt = format_of(path, fmt)
    if not path.is_file():
        raise FileNotFoundError(f"{path}: no such file")
    return path, fmt, parse_columns(columns)


def _lines(path: Path, f, offset: int, line_no: int) -> Iterator[tuple[int, int, str]]:
    """(line number, byte offset, text) from ``offset`` on. Lines end at \\n (\\r\\n is kept in
    the text: JSON and csv read it as the line's end); a UTF-8 byte-order mark is dropped."""
    f.seek(offset)
    for raw in f:
        try:
            text = raw.decode("utf-8")
        except UnicodeDecodeError as e:
            raise ValueError(f"{path}:{line_no}: not UTF-8 text ({e.reason} at byte {offset + e.start})"
                             ) from None
        if offset == 0 and text.startswith("\ufeff"):
            text = text[1:]
        yield line_no, offset, text
        offset += len(raw)
        line_no += 1


def _header(path: Path, f, fmt: str) -> list[str] | None:
    """A CSV/TSV file's column names (its first row); None for JSONL, CoNLL and text lines."""
    if fmt not in ("csv", "tsv"):
        return None
    _configure_csv(path)
    try:
        header = next(_reader((text for _, _, text in _lines(path, f, 0, 1)), fmt), None)
    except csv.Error as e:
        raise ValueError(f"{path}:1: not valid {fmt.upper()} ({e})") from None
    if not header:
        raise ValueError(f"{path}:1: expected a header row, got an empty file")
    names = [h.strip() for h in header]
    twice = sorted({n for n in names if names.count(n) > 1})
    if twice:  # a row would keep only the last column of the name, silently
        raise ValueError(f"{path}:1: expected each column name once, got {', '.join(map(repr, twice))} "
                         "more than once")
    return names


def _records(path: Path, f, fmt: str, header: list[str] | None, offset: int, line_no: int
             ) -> Iterator[tuple[int, int, dict[str, Any]]]:
    """(line number, offset, record) from the record starting at ``offset`` on; a CSV/TSV
    file's header row is skipped (offset 0 is its place)."""
    lines = _lines(path, f, offset, line_no)
    if fmt in ("jsonl", "conll", "lines"):
        yield from {"jsonl": _jsonl, "conll": conll_sentences, "lines": _text_lines}[fmt](path, lines)
        return
    tracked = _Tracked(lines)
    reader = _reader(tracked, fmt)
    try:
        for row in reader:
            start_line, start = tracked.start
            tracked.start = None
            if start == 0:
                continue  # the header row
            if not any(c.strip() for c in row):
                continue
            if len(row) != len(header):
                spans = (f" (the row runs to line {tracked.line}: a quoted field holds the line "
                         "breaks between)" if tracked.line > start_line else "")
                raise ValueError(f"{path}:{start_line}: expected {len(header)} "
                                 f"columns ({', '.join(header)}), got {len(row)}{spans}")
            yield start_line, start, dict(zip(header, row, strict=True))
    except csv.Error as e:
        start_line = tracked.start[0] if tracked.start else tracked.line
        if tracked.ended:  # the file ended inside a quoted field: its quote never closed
            raise ValueError(f"{path}:{start_line}: expected a closing '\"' for the quoted field "
                             f"opened in this row, got the end of the file (line {tracked.line})") from None
        where = f" (in the row starting on line {start_line})" if start_line < tracked.line else ""
        raise ValueError(f"{path}:{tracked.line}: not valid {fmt.upper()} ({e}){where}") from None


class _Tracked:
    """Feeds csv.reader lines, remembering where the row being read began (a quoted CSV field
    may span lines) and the last line read (for errors)."""

    def __init__(self, lines: Iterator[tuple[int, int, str]]) -> None:
        self.lines = lines
        self.start: tuple[int, int] | None = None  # (line number, offset) of the row's first line
        self.line = 0
        # Whether csv asked for a line past the file's end inside a row: it only does inside a
        # quoted field (a row ends with its line otherwise).
        self.ended = False

    def __iter__(self) -> _Tracked:
        return self

    def __next__(self) -> str:
        try:
            line_no, offset, text = next(self.lines)
        except StopIteration:
            self.ended = self.start is not None
            raise
        if self.start is None:
            self.start = (line_no, offset)
        self.line = line_no
        return text


def _reader(lines, fmt: str):
    if fmt == "csv":
        # strict: RFC 4180's quoting, or an error naming the line. Lenient csv reads a quote that
        # is never closed, or closed mid-field (`"a,b\nc"d`), as text running across line breaks,
        # silently merging rows into one field.
        return csv.reader(lines, strict=True)
    return csv.reader(lines, delimiter="\t", quoting=csv.QUOTE_NONE)


def _configure_csv(path: Path) -> None:
    # A field may be as long as the file (csv's default limit, 131,072 characters, would
    # stop a long document with an internal error).
    csv.field_size_limit(min(sys.maxsize, max(csv.field_size_limit(), path.stat().st_size + 1)))


def _check_renamed(path: Path, line_no: int, rename: dict[str, str], record: dict[str, Any]) -> None:
    missing = sorted(set(rename) - set(record))
    if missing:
        raise ValueError(f"{path}:{line_no}: columns: expected columns {', '.join(missing)} to rename, "
                         f"got {', '.join(sorted(record)) or 'none'}")


def _renamed(path: Path, line_no: int, rename: dict[str, str], record: dict[str, Any]) -> dict[str, Any]:
    """The record under the names --columns gives; a new name that the record holds as a column
    of its own (not renamed away) is refused, never one of the two values silently dropped."""
    out = {rename.get(k, k): v for k, v in record.items()}
    if len(out) < len(record):
        theirs, ours = next((t, o) for t, o in rename.items()
                            if t in record and o in record and o not in rename)
        raise ValueError(f"{path}:{line_no}: columns: expected {theirs}={ours} to name a new column, got "
                         f"{ours!r} in the file too (rename that one as well, e.g. {ours}=old_{ours})")
    return out


def _jsonl(path: Path, lines) -> Iterator[tuple[int, int, dict[str, Any]]]:
    for line_no, offset, line in lines:
        if not line.strip():
            continue
        try:
            record = json.loads(line)
        except json.JSONDecodeError as e:
            raise ValueError(f"{path}:{line_no}: not valid JSON ({e.msg})") from None
        if not isinstance(record, dict):
            raise ValueError(f"{path}:{line_no}: expected a JSON object, got {type(record).__name__}")
        yield line_no, offset, record


def _text_lines(path: Path, lines) -> Iterator[tuple[int, int, dict[str, Any]]]:
    """A .txt file's records: each line's text, without its line break; blank lines skipped."""
    yield from ((n, offset, {"text": line.rstrip("\r\n")}) for n, offset, line in lines if line.strip())


def first_record(path: str | Path, columns: str | None = None, fmt: str | None = None
                 ) -> tuple[str, dict[str, Any]]:
    """("file:line", record) of a file's first record: what chooses its kind (tformer.kinds)."""
    for line_no, record in read_records(path, columns, fmt):
        return f"{path}:{line_no}", record
    raise ValueError(f"{path}: expected at least one record, got {no_records(path, fmt)}")


def no_records(path: str | Path, fmt: str | None = None) -> str:
    """What a file without a record holds, for "expected at least one record, got ...": a CSV/TSV
    file's header row alone, or nothing (blank lines, or -DOCSTART- lines, at most)."""
    path = Path(path)
    fmt = format_of(path, fmt)
    if fmt in ("csv", "tsv"):
        with path.open("rb") as f:
            header = _header(path, f, fmt)
        return f"only the header row ({', '.join(header)})"
    return "an empty file"
