"""`tformer info CONFIG.json | RUN_DIR | MODEL_DIR`: parameter count, FLOPs per token and activation
memory; for a training run also what it learned, on what, and its last test result; for a model
directory (BERT-format, sentence-transformers, tformer's own) what it is, its maximum length,
tokenizer and pooling, and the commands that take it."""

from __future__ import annotations

import argparse

HELP = ("describe a config, a run or a model directory: parameter count, FLOPs per token and "
        "activation memory")


def add_arguments(p: argparse.ArgumentParser) -> None:
    from tformer.config.sizes import MODELS  # (arithmetic on a config: no torch)

    p.add_argument("config", help="a tformer config.json, a run directory of `tformer train`, or a "
                   "model directory (BERT-format, sentence-transformers, or tformer's own)")
    p.add_argument("--model", default=None, choices=MODELS,
                   help="which model the config describes (default: a run's own, else encoder)")
    p.add_argument("--seq-len", type=int, default=None, help="sequence length (default: max_len)")
    p.add_argument("--batch", type=int, default=1, help="batch size for the memory estimate")
    p.add_argument("--kernels", action="store_true",
                   help="also list the kernel choices measured on this machine (its cache, not the model's)")


def _human(n: float, unit: str = "") -> str:
    for prefix in ("", "K", "M", "G", "T"):
        if abs(n) < 1000:
            return f"{n:.3g} {prefix}{unit}".strip()
        n /= 1000
    return f"{n:.3g} P{unit}"


def run(args: argparse.Namespace) -> int:
    from pathlib import Path

    from tformer.config import TransformerConfig
    from tformer.config.sizes import activation_bytes, flops_per_token, parameter_count

    path = Path(args.config)
    run_rows, architecture = [], None
    seq_default = None  # the length the estimates use without --seq-len (else the config's max_len)
    if path.is_dir():
        from tformer.storage.checkpoint_names import latest_checkpoint, read_latest
        from tformer.storage.rundir import is_run_dir

        run_dir = path
        if not is_run_dir(run_dir):  # a model directory: read as the commands that take it read it
            run_rows, config, seq_default = _model_rows(run_dir)
        elif latest_checkpoint(run_dir) is None and not (run_dir / "config.json").is_file():
            _print(_unsaved_rows(run_dir))  # started, no checkpoint yet: what it does know
            return 0
        else:  # a run: its newest checkpoint's files (an older run's: its own), read whole again
            # if a live run pruned that checkpoint under us
            run_rows, config, architecture = read_latest(run_dir, lambda saved: (
                _run_rows(run_dir, saved or run_dir),
                TransformerConfig.load((saved or run_dir) / "config.json"),
                _architecture(run_dir, saved or run_dir)))
    else:
        config = TransformerConfig.load(path)
    if args.model is None:
        args.model = architecture or ("classifier" if config.n_classes else "encoder")
    if args.seq_len is not None and args.seq_len <= 0:  # 0 read as "not given" and used max_len
        raise ValueError(f"--seq-len: expected a positive int, got {args.seq_len}")
    if args.batch <= 0:
        raise ValueError(f"--batch: expected a positive int, got {args.batch}")
    seq = args.seq_len or seq_default or config.max_len
    params = parameter_count(config, args.model)
    flops = flops_per_token(config, seq, args.model)
    act = activation_bytes(config, seq, args.batch)
    rows = [
        *run_rows,
        ("model", args.model),
        ("layers x d_model x heads x d_ff",
         f"{config.n_layers} x {config.d_model} x {config.n_heads} x {config.d_ff}"),
        ("dropout", f"{config.dropout:g} (attention weights {config.attention_dropout:g})"),
        ("parameters", f"{params:,} ({_human(params)})"),
        ("parameter memory (fp32)", f"{params * 4 / 2**20:.1f} MiB"),
        (f"forward FLOPs per token (seq {seq})", f"{flops:,} ({_human(flops, 'FLOP')})"),
        ("training FLOPs per token (~3x forward)", _human(3 * flops, "FLOP")),
        (f"activation memory, training (batch {args.batch} x {seq}, fp32)",
         f"{act / 2**20:.1f} MiB (estimate)"),
    ]
    if args.kernels:  # this machine's, not the model's: only on request
        rows += _kernel_rows()
    _print(rows)
    return 0


def _kernel_rows() -> list[tuple[str, str]]:
    """The memory allocator's setting and every kernel choice measured on this machine."""
    from tformer.nn.kernels import autotune
    from tformer.nn.kernels.allocator import keep_freed_memory

    choices = autotune.summary(limit=10**9)
    return [("memory allocator", keep_freed_memory()),
            ("kernel choices measured here", f"{len(autotune.decisions())} in {autotune.cache_path()}"),
            *[("", line) for line in choices]]


def _architecture(run_dir, saved) -> str | None:
    """The model a run's kind trains, as tformer.config.sizes sizes it (None: not a run tformer knows)."""
    from tformer.kinds import kind_of_config
    from tformer.storage.files import read_json_object
    from tformer.training.config import read_train_config

    path = saved / "train_config.json"
    if not path.is_file() or not {"data", "task"} & set(read_json_object(path)):
        return None  # (a config that names neither: its defaults say nothing of this run)
    return kind_of_config(read_train_config(saved), run_dir).objective.model_kind


def _print(rows: list[tuple[str, str]]) -> None:
    width = max(len(k) for k, _ in rows)
    for k, v in rows:
        print(f"{k:<{width}}  {v}")


# What a model directory is, as the layout says (tformer.formats.st_layout, model_dir).
_MODEL_COMMANDS = ("tformer embed | similarity | search | index build | attention | serve DIR; "
                   "tformer train --data FILE --from-pretrained DIR; tformer export DIR --onnx OUT.onnx")


def _model_rows(directory):
    """A model directory's rows, its TransformerConfig and the length its estimates use: read by
    tformer.formats (the layout, config.json) and the tokenizer reader, as embed, serve and
    `train --from-pretrained` read it. Neither a run nor a model: one line naming what it lacks."""
    from tformer.formats.model_dir import read_model_dir
    from tformer.formats.pretrained import pretrained_config
    from tformer.text.tokenizer import load_tokenizer

    if not any((directory / name).is_file() for name in ("config.json", "modules.json")):
        raise ValueError(f"config: {directory}: expected a run directory (checkpoints/), a model directory "
                         "(config.json; sentence-transformers: modules.json) or a config.json file, "
                         "got a directory holding none of them")
    md = read_model_dir(directory)
    config = pretrained_config(md)
    sentence = (directory / "modules.json").is_file()
    arch = ", ".join(md.config_json.get("architectures") or []) or md.config_json.get("model_type")
    what = ("the encoder of an XLM classifier `tformer export --hf` wrote" if md.is_xlm
            else f"a BERT-format encoder ({arch})" if md.is_bert
            else "a tformer encoder (save_pretrained)")
    if sentence:
        what = f"sentence-transformers: {what}"
    if md.model_dir != directory:
        what += f", in {md.model_dir.relative_to(directory)}/"
    rows = [("model directory", what)]
    positions = md.position_limit
    limit = "" if positions is None else f"positions: {positions}"
    try:
        tokenizer = load_tokenizer(md)
    except FileNotFoundError as e:  # the commands need one: say so, the sizes still print
        rows.append(("warning", str(e)))
        tokenizer = None
    if tokenizer is not None and tokenizer.max_length is not None:
        source = " (sentence_bert_config.json)" if md.layout.max_seq_length == tokenizer.max_length else ""
        rows.append(("max length", f"{tokenizer.max_length} tokens{source}"
                                   + (f"; {limit}" if limit and positions != tokenizer.max_length else "")))
    elif limit:
        rows.append(("max length", f"{positions} tokens ({limit})"))
    if tokenizer is not None:
        file = md.find("tokenizer.json") or md.find("vocab.txt")
        lower = ", lowercased" if tokenizer.lowercase else ""
        rows.append(("tokenizer", f"{tokenizer.vocab_size:,} tokens ({file.name}{lower})"))
    pooling = " + ".join(md.layout.pooling) + (", L2-normalized" if md.layout.normalize else "")
    rows.append(("pooling", pooling if sentence else f"{pooling} (no modules.json: as sentence-transformers "
                                                     "pools a plain model)"))
    rows.append(("use with", _MODEL_COMMANDS))
    return rows, config, tokenizer.max_length if tokenizer is not None else None


def _unsaved_rows(run_dir) -> list[tuple[str, str]]:
    """A run directory before its first checkpoint (the model's sizes and options are saved with
    it): whether it trains now, what it learns, and how far its log got."""
    from tformer.storage.rundir import holder, read_metrics

    pid = holder(run_dir)
    state = (f"in progress (pid {pid}): its first checkpoint is saved at its first validation" if pid else
             f"not running (killed or stopped before its first save): start it again with "
             f"`tformer train --out {run_dir}`")
    rows = [("checkpoint", f"none yet; {state}")]
    if (run_dir / "data.json").is_file():  # (a synthetic task's run: its task is saved with the checkpoint)
        rows += _data_rows(run_dir)
    trained = [r for r in read_metrics(run_dir / "metrics.jsonl") if r.get("split") == "train"]
    if trained:
        t = trained[-1]
        rows.append(("trained", f"{t['step']} steps of {t.get('planned_steps', '?')} (loss "
                                f"{t.get('loss', float('nan')):.4f}, {t.get('wall_seconds', 0):.0f} s)"))
    rows.append(("model", "its sizes are saved with its first checkpoint (config.json)"))
    return rows


def _data_rows(run_dir, data_file: str | None = None) -> list[tuple[str, str]]:
    """A data run's objective, data file (`data_file`, else as data.json names it) and tokenizer."""
    from tformer.storage.files import read_json_object

    data = read_json_object(run_dir / "data.json") if (run_dir / "data.json").is_file() else {}
    objective = data.get("objective", "?")
    if data.get("labels"):
        objective += f" ({len(data['labels'])} labels: {', '.join(data['labels'][:8])})"
    data_file = data_file or data.get("identity", {}).get("data", {}).get("path", "?")
    return [("objective", objective), ("data", data_file),
            ("tokenizer", f"{data.get('vocab_size', '?')} tokens (tokenizer.json)")]


def _run_rows(run_dir, saved) -> list[tuple[str, str]]:
    """What a training run learned and how far it got (empty for a plain model directory)."""
    import json

    from tformer.storage.files import read_json_object
    from tformer.training.report import baseline_verdict
    from tformer.training.verdict import tested_as_it_was

    if not (saved / "train_config.json").is_file():
        return []
    train = read_json_object(saved / "train_config.json")
    rows = []
    weights = saved / "model.safetensors"
    try:  # its header only: a file cut short (a copy, a full disk) shows here, not at first use
        from safetensors import safe_open

        with safe_open(str(weights), framework="numpy"):
            pass
    except Exception as e:  # safetensors' own error types vary across versions
        first = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
        rows.append(("warning", f"{weights}: not a readable safetensors file ({first})"))
    if train.get("data"):
        rows += _data_rows(run_dir, train["data"])
        if train.get("from_pretrained"):
            rows.append(("fine-tuned from", train["from_pretrained"]))
    else:
        rows.append(("objective", f"{train.get('task', '?')} (synthetic task)"))
    metrics = run_dir / "metrics.jsonl"
    if metrics.is_file():
        tests, cut = [], 0
        for line in metrics.read_text().splitlines():
            try:
                record = json.loads(line)
            except json.JSONDecodeError:  # a line a crash cut short: `--resume` cuts it back
                cut += 1
                continue
            if isinstance(record, dict) and record.get("split") == "test":
                tests.append(record)
        if cut:
            rows.append(("warning", f"{metrics}: {cut} line(s) cut short (a write a crash interrupted)"))
        if tests:
            t = tests[-1]
            keys = dict.fromkeys((t.get("main_metric"), "bleu", "chrf", "exact_match", "accuracy", "micro_f1",
                                  "macro_f1", "samples_f1", "recall_at_1", "mrr_at_10", "ndcg_at_10",
                                  "spearman", "pearson", "mse"))  # the run's main metric first
            shown = ", ".join(f"{k} {t[k]:.4f}" for k in keys if k in t)
            tested = t.get("tested_step", t["step"])  # the best validated weights, when not the last
            weights = f"; the weights of step {tested} tested" if tested != t["step"] else ""
            if tested_as_it_was(t):  # a fine-tune none of whose steps beat its start on validation
                weights = ("; the pretrained encoder and the head fitted to it, as they started, "
                           "tested" if t.get("head_probed") else "; the pretrained model's weights, as they "
                           "were, tested")
            rows.append(("test", f"{shown} (step {t['step']}, {t['wall_seconds']:.0f} s{weights})"))
            verdict = baseline_verdict(t)
            if verdict:  # a run that did not beat its trivial baseline says so (older runs: none)
                rows.append(("warning" if verdict.startswith("warning") else "baseline",
                             verdict.removeprefix("warning: ")))
    return rows
