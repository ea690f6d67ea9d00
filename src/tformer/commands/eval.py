"""`tformer eval RUN_DIR`: metrics of a trained run on its test (or validation) split, or,
for a run on your data, on any file with the training file's fields (--data FILE).

A --data file is checked whole first, then read, predicted and scored a window of records at
a time (the metrics are sums of counts: tformer.training.evaluation), so memory does not grow
with it; an embedding run's metrics rank among every record, so it holds their vectors. The
check also counts the records whose input text the run trained or validated on
(tformer.training.overlap): a warning says how many, and the record keeps the counts.

The run's own splits are drawn from its data files, found where they were when it started
(data.json keeps them absolute) and refused, naming what changed, where one is no longer the
file it trained on (tformer.training.data_files)."""

from __future__ import annotations

import argparse
import sys

from tformer.commands._inputs import (
    add_device,
    add_early_stopping,
    add_long,
    add_threads,
    as_flag,
    check_decoding_options,
    check_early_stopping,
    check_options,
    device_of,
    json_line,
)

HELP = "evaluate a trained run on its test or validation split, or on a file (--data)"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("run_dir", metavar="RUN_DIR", help="a directory written by `tformer train`")
    parser.add_argument("--split", choices=("test", "validation"), default=None,
                        help="the run's own held-out split to evaluate (default: test; not with --data)")
    parser.add_argument("--data", metavar="FILE", default=None,
                        help="runs on your data: evaluate on this JSONL/CSV/TSV file instead (a warning "
                             "says how many of its records the run trained on); the result is appended "
                             "to RUN_DIR/metrics.jsonl")
    parser.add_argument("--beam-size", type=int, default=1, help="seq2seq: 1 = greedy (default)")
    add_early_stopping(parser)
    parser.add_argument("--limit", type=int, default=None,
                        help="only the first N examples (a --data file is read no further)")
    parser.add_argument("--samples", type=int, default=6, help="sample rows to print (default 6)")
    add_long(parser)
    add_threads(parser)
    add_device(parser)


def run(args: argparse.Namespace) -> int:
    import contextlib
    from pathlib import Path

    from tformer.kinds import load_run
    from tformer.storage.rundir import RunLock, check_no_links

    check_options(args)
    check_early_stopping(args)
    if args.data is not None and args.split is not None:  # one of the two would be ignored
        raise ValueError(f"--split: --data {args.data} is evaluated whole; expected no --split with "
                         f"--data, got {args.split}")
    run = load_run(args.run_dir, device=device_of(args))
    with as_flag("--long"):
        run.read_long(args.long)  # (only a kind that pools windows reads them)
    check_decoding_options(args, run)
    if args.data is not None and run.config.data is None:
        raise ValueError(f"--data: {args.run_dir} trained on task {run.config.task}, not on files")
    # --data appends to the run's metrics.jsonl: as its one writer (a run training there, a resume
    # cutting the file back to its checkpoint, another eval --data would interleave with it).
    busy = "--data appends to its metrics.jsonl, which that process writes: evaluate when it has finished"
    with RunLock(Path(args.run_dir), "RUN_DIR", busy) if args.data is not None else contextlib.nullcontext():
        if args.data is not None:  # before the scoring: a link planted there is refused, not written through
            check_no_links(Path(args.run_dir), "RUN_DIR")
        return _evaluate(args, run)


def _evaluate(args: argparse.Namespace, run) -> int:
    from pathlib import Path

    from tformer.training.report import append_jsonl, baseline_verdict, sample_table, with_baseline
    from tformer.training.verdict import MIN_VERDICT_EXAMPLES

    overlap: dict = {}
    total = 0  # the examples to score, where known before (a compiled kernel is repaid over them all)
    if args.data is not None:
        # Checked whole first, keeping nothing but a hash of each input (a bad record fails before
        # any decoding), then read again a window at a time as it is scored: memory does not grow
        # with the file. The hashes tell how many records the run trained on.
        total, overlap = _overlap(run, args)
        examples = run.example_stream(data=args.data, limit=args.limit)  # (read no further than --limit)
        split = str(args.data)
    else:
        split = args.split or "test"
        examples = run.example_stream(split, limit=args.limit)
    metrics, baseline, rows = run.score_stream(examples, beam_size=args.beam_size, samples=args.samples,
                                               early_stopping=args.early_stopping, total=total)
    if rows:
        print(sample_table(rows, n=args.samples))
    key = run.main_metric
    record = with_baseline({"split": split, "task": run.config.name, "examples": metrics["examples"],
                            **metrics, **overlap, **_weights_as_they_were(args.run_dir),
                            **({"long": args.long} if args.long else {})}, key, baseline)
    line = json_line(record, f"RUN_DIR {args.run_dir}: metrics {metrics}")
    print(f"{split} {key}: {metrics[key]:.4f}")
    print(line)
    # What beats_baseline means here (too few examples: no verdict, and eval's own way to more).
    more = f"score {MIN_VERDICT_EXAMPLES} or more: a larger --limit or --data file"
    verdict = baseline_verdict(record, more, stopped_by=_stopped_by(args.run_dir))
    if verdict:
        print(f"tformer eval: {verdict}", file=sys.stderr)
    if args.data is not None:
        append_jsonl(Path(args.run_dir) / "metrics.jsonl", {**record, "split": "eval", "data": split})
    return 0


def _overlap(run, args: argparse.Namespace) -> tuple[int, dict[str, int]]:
    """Read --data once (checked, as far as --limit): its records, and {"trained_on": n,
    "in_validation": m}, those whose input text the run trained (or validated) on, said on
    stderr where any are (a score on them says what the model memorised); {} where the run's
    training records cannot be read (said too)."""
    from tformer.training.overlap import Seen

    data = run.objective.source.data  # (a run on files: checked by the caller)
    seen = Seen.of(data, args.data)
    counts = seen.count(run.example_stream(data=args.data, limit=args.limit), data.fields.input_key)
    n = counts.pop("records")
    if not n:
        raise ValueError(f"--data: {args.data} holds no records")
    if seen.why_not is not None:
        print(f"tformer eval: note: cannot tell which records of {args.data} the run trained on: "
              f"{seen.why_not}", file=sys.stderr)
        return n, {}
    trained, validated = counts["trained_on"], counts["in_validation"]
    if trained or validated:
        parts = [f"{trained:,} of the {n:,} records of {args.data} ({trained / n:.1%}) have the input "
                 "text of a record the run trained on"] if trained else []
        if validated:
            parts.append(f"{validated:,}{' more' if trained else f' of the {n:,} records of {args.data}'} "
                         f"({validated / n:.1%}) are in its validation split, which chose its checkpoint")
        print(f"tformer eval: warning: {'; '.join(parts)}: the score on them says what the model has seen, "
              f"not how it does on new text (its own held-out test: tformer eval {args.run_dir})",
              file=sys.stderr)
    return n, counts


def _weights_as_they_were(run_dir: str) -> dict:
    """Where the run's own test found its weights to be its pretrained model's as it was (a
    fine-tune none of whose steps beat its start on validation: tformer.training.verdict), what that
    record says of them, so that eval's verdict says so too instead of "the model learned";
    else {}."""
    from pathlib import Path

    from tformer.storage.rundir import read_metrics
    from tformer.training.verdict import tested_as_it_was

    tests = [r for r in read_metrics(Path(run_dir) / "metrics.jsonl") if r.get("split") == "test"]
    if not tests or not tested_as_it_was(tests[-1]):
        return {}
    keys = ("tested_step", "pretrained_validation", "tuned_validation", "tuned_step", "head_probed")
    return {k: tests[-1][k] for k in keys if k in tests[-1]}


def _stopped_by(run_dir: str) -> str | None:
    """What ended the run's training ("steps", "max_minutes", ...), as its newest checkpoint
    says; None where it does not say."""
    from tformer.storage.checkpoint import check_run_dir
    from tformer.storage.checkpoint_names import read_latest
    from tformer.storage.files import read_json_object

    try:
        return read_latest(run_dir, lambda _: read_json_object(check_run_dir(run_dir) / "trainer_state.json")
                           ).get("stopped_by")
    except (OSError, ValueError):
        return None
