"""`tformer search MODEL_DIR --corpus lines.txt "query" ...`: the corpus lines closest to a query.
`tformer search INDEX "query" ...`: the same over an index built once by `tformer index build`.
`tformer search INDEX --query-vectors Q.npy -k 10 --format jsonl`: vectors in, row ids out.

`tformer search ... --rerank RERANK_RUN`: the top --rerank-top found, reordered by a reranker run.

Queries come from the arguments and/or ``--file`` (one per line). Ranks the corpus's lines
(one document per line, read as tformer.text.lines says) by cosine similarity to each query's embedding and
prints the top ``-k`` with their score and line number. Without an index the corpus is
embedded a chunk at a time and compared at once with a running top-k, so memory does not
grow with its length; with an index nothing is embedded but the queries, and an approximate
index (tformer.embeddings.ann) answers by its parameters unless --exact. With --rerank, each
query's --rerank-top results (20) are scored as (query, text) pairs by a reranker run of
`tformer train` (a cross-encoder) and the best -k of them printed, its score in place of
the cosine (over an exact or an approximate index alike: the index only retrieves).
"""

from __future__ import annotations

import argparse
import sys

from tformer.commands._inputs import check_options, input_texts, located
from tformer.commands._pretrained import (
    add_model_arguments,
    load_sentence_encoder,
    one_line_warnings,
    short,
)

# Without --progress/--no-progress a bar is shown for a corpus of this many bytes or more.
PROGRESS_MIN_BYTES = 1 << 16

HELP = "semantic search: the lines of a corpus file (or an index) closest to a query"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    add_model_arguments(parser, index=True)
    parser.add_argument("queries", nargs="*", metavar="QUERY", help="one or more queries")
    parser.add_argument("--file", default=None,
                        help="read queries from FILE, one per line ('-': standard input)")
    parser.add_argument("--corpus", default=None,
                        help="a text file, one document per line ('-': standard input; "
                             "not with an INDEX)")
    parser.add_argument("--model", default=None,
                        help="with an INDEX: the model directory to embed queries with "
                             "(default: the one that built it; another model is refused)")
    parser.add_argument("--query-vectors", default=None,
                        help="with an INDEX: a .npy file of query vectors (Q, D) instead of texts; "
                             "jsonl prints one line per query: query_index, ids (row numbers from 0), "
                             "scores (and texts, where the index has them)")
    parser.add_argument("--exact", action="store_true",
                        help="with an approximate INDEX: scan every vector instead (the exact answer)")
    parser.add_argument("-k", "--k", "--top-k", dest="top_k", type=int, default=5,
                        help="results per query (5)")
    parser.add_argument("--format", choices=FORMATS, default="text",
                        help="text: a block per query, for reading (default); jsonl: one JSON "
                             "object per result: query_index, query, rank, score, line, text; "
                             "tsv: a header, then one tab-separated row per result with those "
                             "columns (tabs, newlines and backslashes in texts escaped as \\t, "
                             "\\n, \\r, \\\\)")
    parser.add_argument("--rerank", metavar="RERANK_RUN", default=None,
                        help="a reranker run of `tformer train` (query, passage data): reorder each query's "
                             "--rerank-top results by its scores, then print the best -k")
    parser.add_argument("--rerank-top", type=int, default=20,
                        help="with --rerank: results retrieved per query for it to reorder (20; at least -k)")
    parser.add_argument(
        "--progress",
        action=argparse.BooleanOptionalAction,
        default=None,
        help="progress bar while embedding the corpus (default: when large)",
    )


def run(args: argparse.Namespace) -> int:
    from tformer.embeddings.index import Index
    from tformer.embeddings.stream import TopK, embed_chunks, progress_bar
    from tformer.text.lines import TextLines

    check_options(args)
    if args.query_vectors is not None:
        return _search_vectors(args)
    if args.file == "-" and args.corpus == "-":
        raise ValueError("--file, --corpus: expected at most one to read standard input, got both")
    queries_text = input_texts(args, "queries", "QUERY")
    truncation = not args.no_truncate
    reranker = _reranker(args)
    retrieve = max(args.top_k, args.rerank_top) if reranker is not None else args.top_k
    if Index.is_index(args.model_dir):
        if args.corpus is not None:
            raise ValueError("--corpus: not with an INDEX (it holds its corpus); got both")
        index = _open_index(args)
        if reranker is not None and not index.has_texts:
            raise ValueError(f"--rerank: expected an INDEX with texts to rerank, got {args.model_dir}, built "
                             "from vectors without --texts (rebuild it with `index build --vectors V.npy "
                             "--texts T.txt`)")
        model_dir = args.model or index.meta.get("model_dir")
        if model_dir is None:
            raise ValueError(f"INDEX {args.model_dir}: built from vectors, it names no model: give --model "
                             "MODEL_DIR to embed the queries with, or --query-vectors Q.npy")
        index.check_model(model_dir)
        args.model_dir = model_dir
        if args.max_length is None:  # embed the queries as the corpus was
            args.max_length = index.meta.get("max_length")
        if args.dtype == "auto" and index.meta.get("dtype") in ("fp32", "bf16"):
            args.dtype = index.meta["dtype"]  # and in its precision (auto's may differ by machine)
        with one_line_warnings("search"):
            st = load_sentence_encoder(args)
            queries = _embed_queries(st, args, queries_text)
        scores, rows = index.search(queries, retrieve, exact=args.exact)
        found = _texts_of(index, rows)
    else:
        if args.corpus is None:
            raise ValueError(f"--corpus: expected a corpus file with MODEL_DIR {args.model_dir} "
                             "(or give an INDEX from `tformer index build`), got none")
        corpus = TextLines(args.corpus, "--corpus")
        with one_line_warnings("search"):
            st = load_sentence_encoder(args)
            queries = _embed_queries(st, args, queries_text)
            best, first = TopK(queries, retrieve), 0
            found: dict[int, tuple[int, str]] = {}  # row -> (line number, text), the rows in a top-k
            # One pass over the corpus (it was read three times: counted, embedded, then
            # searched for the winners' texts): the bar counts texts without a total.
            bar = progress_bar(None, args.progress if args.progress is not None
                               else corpus.size() >= PROGRESS_MIN_BYTES)
            for numbers, texts, docs in embed_chunks(st, corpus, where=corpus.at,
                                                     batch_size=args.batch_size, show_progress=False,
                                                     truncation=truncation):
                best.add(docs, first)  # (Q, b) similarities at a time, never (Q, N)
                found.update((first + i, item) for i, item in enumerate(zip(numbers, texts, strict=True)))
                wanted = set(best.result()[1].ravel().tolist())
                found = {row: item for row, item in found.items() if row in wanted}  # at most Q x k
                first += len(texts)
                bar.update(len(texts))
            bar.close()
        if first == 0:
            raise ValueError(f"--corpus {args.corpus}: expected at least one line, got none")
        scores, rows = best.result()
    if reranker is not None:
        scores, rows = _reranked(reranker, args, queries_text, rows, found)
    results = ((q, query, rank, float(score), *found[int(row)], int(row))
               for q, query in enumerate(queries_text)
               for rank, (score, row) in enumerate(zip(scores[q], rows[q], strict=True), start=1)
               if row >= 0)  # an approximate search that found fewer than k
    _print_results(args.format, results)
    return 0


def _open_index(args: argparse.Namespace):
    """The INDEX; an approximate one's FAISS gets torch's threads (check_options: the cores other
    processes leave free; OpenMP threads past them spin and wait for each other)."""
    import torch

    from tformer.embeddings.ann import use_threads
    from tformer.embeddings.index import Index

    index = Index(args.model_dir)
    if index.kind != "exact" and not args.exact:
        use_threads(args.threads or torch.get_num_threads())
    return index


def _texts_of(index, rows) -> dict[int, tuple]:
    """{row: (line number, text)} of the rows in a result; (None, None) for an index of vectors
    given without texts."""
    wanted = {int(r) for r in rows.ravel().tolist() if r >= 0}
    if index.has_texts:
        return index.texts(wanted)
    return {r: (None, None) for r in wanted}


def _search_vectors(args: argparse.Namespace) -> int:
    """--query-vectors: each block of queries searched, then printed (memory: a block of queries
    and its results, whatever the number of queries)."""
    import json

    from tformer.embeddings.index import Index
    from tformer.embeddings.vectors import VectorsFile

    for given, option in ((args.queries, "QUERY"), (args.file, "--file"), (args.corpus, "--corpus"),
                          (args.model, "--model"), (args.rerank, "--rerank"),
                          (args.rerank_top != 20, "--rerank-top")):
        if given:
            raise ValueError(f"{option}: not with --query-vectors (the queries are its vectors)")
    if not Index.is_index(args.model_dir):
        raise ValueError(f"--query-vectors: expected an INDEX from `tformer index build` (got "
                         f"{args.model_dir}, which holds no index.json)")
    index = _open_index(args)
    source = VectorsFile(args.query_vectors, "--query-vectors", dim=index.meta["dim"])
    if args.format == "tsv":
        print("\t".join(("query_index", "rank", "score", "id", "line", "text")))
    for first, block in source.blocks():
        scores, rows = index.search(block, args.top_k, exact=args.exact)
        found = _texts_of(index, rows) if index.has_texts else {}
        for i, (s_row, r_row) in enumerate(zip(scores.tolist(), rows.tolist(), strict=True)):
            kept = [(s, r) for s, r in zip(s_row, r_row, strict=True) if r >= 0]
            q = first + i
            if args.format == "jsonl":
                record = {"query_index": q, "ids": [r for _, r in kept], "scores": [s for s, _ in kept]}
                if found:
                    record["texts"] = [found[r][1] for _, r in kept]
                print(json.dumps(record, ensure_ascii=False))
                continue
            for rank, (score, row) in enumerate(kept, start=1):
                line, text = found.get(row, (None, None))
                if args.format == "tsv":
                    print(f"{q}\t{rank}\t{score!r}\t{row}\t{'' if line is None else line}\t"
                          f"{'' if text is None else _tsv(text)}")
                else:
                    if rank == 1:
                        print(f"{chr(10) if q else ''}query {q}:")
                    shown = f": {short(text, 80)}" if text is not None else ""
                    print(f"{rank:>3}. {score:.4f}  row {row}{shown}")
    return 0


FORMATS = ("text", "jsonl", "tsv")
COLUMNS = ("query_index", "query", "rank", "score", "line", "text")  # a result, as jsonl and tsv give it


def _print_results(form: str, results) -> None:
    """(query index, query, rank, score, line number, text, row) per result, in the --format asked;
    jsonl adds the row as "id" (from 0, as --query-vectors prints it); an index of vectors without
    texts has no line or text (None)."""
    import json

    if form == "tsv":
        print("\t".join(COLUMNS))
    for q, query, rank, score, number, text, row in results:
        if form == "jsonl":  # the score in full (repr of the float32's double), not to 4 digits
            record = dict(zip(COLUMNS, (q, query, rank, score, number, text), strict=True))
            print(json.dumps({**record, "id": row}, ensure_ascii=False))
        elif form == "tsv":
            print(f"{q}\t{_tsv(query)}\t{rank}\t{score!r}\t{'' if number is None else number}\t"
                  f"{'' if text is None else _tsv(text)}")
        else:
            if rank == 1:
                if q:
                    print()  # a blank line between queries' blocks
                print(f"query: {short(query)}")
            print(f"{rank:>3}. {score:.4f}  line {number}: {short(text, 80)}" if number is not None
                  else f"{rank:>3}. {score:.4f}  row {row}")


def _tsv(text: str) -> str:
    """A field with no tab or line break in it: backslash escapes, as in PostgreSQL's text COPY."""
    return text.replace("\\", "\\\\").replace("\t", "\\t").replace("\n", "\\n").replace("\r", "\\r")


def _reranker(args: argparse.Namespace):
    """--rerank's run (loaded before anything is embedded: a wrong one is refused at once), or None."""
    if args.rerank is None:
        if args.rerank_top != 20:
            raise ValueError(f"--rerank-top: only with --rerank RERANK_RUN; got {args.rerank_top} without it")
        return None
    if args.rerank_top < 1:
        raise ValueError(f"--rerank-top: expected >= 1, got {args.rerank_top}")
    from tformer.commands._inputs import device_of
    from tformer.kinds import load_run

    return load_run(args.rerank, needs="rerank", device=device_of(args))


def _reranked(reranker, args: argparse.Namespace, queries: list[str], rows, found: dict) -> tuple[list, list]:
    """(scores, rows) of each query's retrieved rows reordered by the reranker, its best -k."""
    scores_out, rows_out = [], []
    for query, retrieved in zip(queries, rows, strict=True):
        candidates = [int(r) for r in retrieved if r >= 0]
        ranked = reranker.rerank(query, [found[r][1] for r in candidates],
                                 batch_size=args.batch_size)[: args.top_k]
        scores_out.append([r["score"] for r in ranked])
        rows_out.append([candidates[r["index"]] for r in ranked])
    return scores_out, rows_out


def _embed_queries(st, args: argparse.Namespace, texts: list[str]):
    """(Q, D) embeddings of the queries; one that is too long is named by its argument or --file
    line (the library's message said 'texts[0]', and its warning did not say which)."""
    from tformer.text.prefix import cut_reason
    from tformer.text.tokenizer import TextTooLong

    long: list[tuple[int, int]] = []  # (index, token count) of the queries cut
    try:
        emb = st.encode(texts, batch_size=args.batch_size, truncation=not args.no_truncate,
                        on_long=lambda indices, counts: long.extend(zip(indices, counts, strict=True)))
    except TextTooLong as e:
        raise ValueError(located(args, "queries", "QUERY", e.index, e.expected())) from None
    if long:
        named = ", ".join(located(args, "queries", "QUERY", i) for i, _ in long[:5])
        why = cut_reason([n for _, n in long], st.tokenizer.max_length)
        print(f"tformer search: warning: {len(long)} of {len(texts)} queries {why}: "
              f"{named}{', ...' if len(long) > 5 else ''} (--no-truncate refuses instead)", file=sys.stderr)
    return emb
