"""`tformer search`: queries and corpus read one line per text, options checked first."""

from __future__ import annotations

import pytest
from cli_helpers import assert_one_line_error, run_cli, stdin_bytes
from hf_bert_fixtures import SENTENCES, bert_dir


def _corpus(tmp_path, lines):
    path = tmp_path / "corpus.txt"
    path.write_text("\n".join(lines) + "\n")
    return path


def test_queries_from_a_file_one_result_block_per_line(capsys, tmp_path):
    corpus = _corpus(tmp_path, SENTENCES)
    queries = tmp_path / "q.txt"
    queries.write_text(f"{SENTENCES[1]}\n{SENTENCES[3]}\r\n")
    rc, out, err = run_cli(capsys, "search", bert_dir(), "--corpus", corpus, "--file", queries,
                           "-k", 1)
    assert rc == 0, err
    assert out.split("\n\n") == [f"query: {SENTENCES[1]}\n  1. 1.0000  line 2: {SENTENCES[1]}",
                                 f"query: {SENTENCES[3]}\n  1. 1.0000  line 4: {SENTENCES[3]}\n"]


def test_queries_from_stdin(capsys, tmp_path, monkeypatch):
    stdin_bytes(monkeypatch, f"{SENTENCES[0]}\n".encode())
    rc, out, err = run_cli(capsys, "search", bert_dir(), "--corpus", _corpus(tmp_path, SENTENCES),
                           "--file", "-", "-k", 1)
    assert rc == 0 and f"line 1: {SENTENCES[0]}" in out, err


def test_a_corpus_line_holding_a_lone_cr_or_form_feed_is_one_document(capsys, tmp_path):
    corpus = _corpus(tmp_path, ["a dog\x0cthe\rcat", SENTENCES[3]])
    rc, out, err = run_cli(capsys, "search", bert_dir(), "--corpus", corpus, SENTENCES[3], "-k", 5)
    assert rc == 0, err
    assert f"line 2: {SENTENCES[3]}" in out and out.count("\n") == 3  # 2 documents


@pytest.mark.parametrize("lines, where", [(["a dog", "", "the cat"], "corpus.txt:2"),
                                          (["a dog", "  "], "corpus.txt:2")])
def test_a_blank_corpus_line_is_an_error(capsys, tmp_path, lines, where):
    rc, _, err = run_cli(capsys, "search", bert_dir(), "--corpus", _corpus(tmp_path, lines), "q")
    assert_one_line_error(rc, err, "search", rf"{where}: expected a text, got a blank line")


@pytest.mark.parametrize("argv, pattern", [
    (["-k", 0], "--top-k: expected >= 1, got 0"),
    (["--batch-size", 0], "--batch-size: expected >= 1, got 0"),
    (["--threads", -1], "--threads: expected >= 1, got -1"),
    (["--file", "-", "--corpus", "-"], "at most one to read standard input"),
])
def test_bad_options_are_one_line_errors(capsys, tmp_path, argv, pattern):
    rc, _, err = run_cli(capsys, "search", bert_dir(), "q", "--corpus", _corpus(tmp_path, ["a"]),
                         *argv)
    assert_one_line_error(rc, err, "search", pattern)


def test_no_query_is_a_one_line_error(capsys, tmp_path):
    rc, _, err = run_cli(capsys, "search", bert_dir(), "--corpus", _corpus(tmp_path, ["a"]))
    assert_one_line_error(rc, err, "search", r"QUERY: expected at least 1 text\(s\)")


def test_a_long_query_is_named_by_its_argument_or_line(capsys, tmp_path):
    # --no-truncate said "texts[0]" (the library's list index), and the truncation warning
    # "1 of 2 texts are longer", beside the corpus's own warning, not which query.
    long = " ".join(["cat"] * 100)
    queries = tmp_path / "q.txt"
    queries.write_text(f"a dog\n{long}\n")
    corpus = _corpus(tmp_path, SENTENCES)
    rc, out, err = run_cli(capsys, "search", bert_dir(), long, "--file", queries, "--corpus", corpus)
    assert rc == 0 and out.count("query: ") == 3, err
    assert err.count("\n") == 1, err
    assert err.startswith("tformer search: warning: 2 of 3 queries are longer"), err
    assert err.rstrip().endswith(f"truncated: QUERY 1, --file {queries}:2 (--no-truncate refuses instead)"), err
    rc, _, err = run_cli(capsys, "search", bert_dir(), "a cat", "--file", queries, "--corpus", corpus,
                         "--no-truncate")
    assert_one_line_error(rc, err, "search", rf"error: --file {queries}:2: expected at most \d+ tokens")
    rc, _, err = run_cli(capsys, "index", "build", bert_dir(), "--corpus", corpus, "--out", tmp_path / "idx")
    assert rc == 0, err
    rc, _, err = run_cli(capsys, "search", tmp_path / "idx", long, "--no-truncate")
    assert_one_line_error(rc, err, "search", r"error: QUERY 1: expected at most \d+ tokens")


def test_the_corpus_is_read_once(capsys, tmp_path, monkeypatch):
    """One pass over the corpus (it was read three times: counted, embedded, then again for the
    winners' texts), with the same results as before."""
    from tformer.text.lines import TextLines

    passes = []
    raw = TextLines._raw

    def counted(self):
        passes.append(self.name)
        return raw(self)

    monkeypatch.setattr(TextLines, "_raw", counted)
    corpus = _corpus(tmp_path, SENTENCES * 3)
    rc, out, err = run_cli(capsys, "search", bert_dir(), "--corpus", corpus, SENTENCES[1], SENTENCES[3],
                           "-k", 3)
    assert rc == 0, err
    assert passes == [str(corpus)]
    n = len(SENTENCES)
    assert out.split("\n\n") == [
        f"query: {SENTENCES[1]}\n" + "\n".join(f"{r:>3}. 1.0000  line {line}: {SENTENCES[1]}"
                                               for r, line in enumerate((2, 2 + n, 2 + 2 * n), start=1)),
        f"query: {SENTENCES[3]}\n" + "\n".join(f"{r:>3}. 1.0000  line {line}: {SENTENCES[3]}"
                                               for r, line in enumerate((4, 4 + n, 4 + 2 * n), start=1)) + "\n"]


@pytest.mark.parametrize("form", ["jsonl", "tsv"])
def test_machine_readable_results_parse_to_what_the_text_shows(capsys, tmp_path, form):
    import csv
    import io
    import json

    lines = [*SENTENCES, "a tab\there, a backslash \\ and\ra carriage return"]
    corpus = _corpus(tmp_path, lines)
    queries = [SENTENCES[1], lines[-1]]
    args = ["search", bert_dir(), "--corpus", corpus, *queries, "-k", 3]
    rc, text, err = run_cli(capsys, *args)
    assert rc == 0, err
    rc, out, err = run_cli(capsys, *args, "--format", form)
    assert rc == 0, err
    if form == "jsonl":
        records = [json.loads(line) for line in out.splitlines()]
    else:
        unescape = {"\\t": "\t", "\\n": "\n", "\\r": "\r", "\\\\": "\\"}
        rows = list(csv.reader(io.StringIO(out), delimiter="\t", quoting=csv.QUOTE_NONE))
        assert rows[0] == ["query_index", "query", "rank", "score", "line", "text"]
        import re

        field = lambda s: re.sub(r"\\[tnr\\]", lambda m: unescape[m.group()], s)  # noqa: E731
        records = [{"query_index": int(q), "query": field(query), "rank": int(r), "score": float(s),
                    "line": int(n), "text": field(t)} for q, query, r, s, n, t in rows[1:]]
    assert [(r["query_index"], r["rank"]) for r in records] == [(q, k) for q in range(2) for k in (1, 2, 3)]
    assert [r["query"] for r in records] == [q for q in queries for _ in range(3)]
    assert all(r["text"] == lines[r["line"] - 1] for r in records)  # the line's text, exactly
    assert records[0]["line"] == 2 and records[0]["score"] == pytest.approx(1.0, abs=1e-6)
    assert any(r["line"] == len(lines) for r in records)  # the line with a tab, a backslash and a CR
    shown = [f"{r['rank']:>3}. {r['score']:.4f}  line {r['line']}:" for r in records]
    assert all(s in text for s in shown)  # the same results as the text format prints
