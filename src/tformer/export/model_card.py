"""The README.md every export directory gets: the Hugging Face Hub's YAML header, then what the
model is, what it was trained on, how well it did against its baseline, the `tformer train`
command that made it and how to load it.

    ---
    library_name: transformers
    pipeline_tag: text-classification   (a task the library's pipelines and the Hub both name)
    license: unknown                 (a fine-tune: its base model card's license)
    base_model: org/name             (a fine-tune of a model with a Hub name)
    datasets: [org/name]             (data read from the Hugging Face cache)
    tags: [tformer]
    metrics: [accuracy, f1]
    ---
    <!-- tformer export -->          (export_dir.MARKER: this folder is tformer's to replace)
    # run-name ...

The exporters take a ``Card`` (plain values: the run reads them, ``tformer.kinds``), so this
module knows nothing of run directories. A card is published: it names files by their names
alone (the training data, the base model's folder, the commands' paths), never the folders on
the machine that made it.
"""

from __future__ import annotations

import json
import re
import shlex
from dataclasses import dataclass, field
from pathlib import Path, PurePath
from typing import Any

from tformer import __version__
from tformer.export.export_dir import MARKER
from tformer.training.verdict import CANNOT_TELL, LEARNED, tested_as_it_was, too_few, verdict_of

# tformer's metric names -> the Hub's (the `evaluate` library's metric ids).
HUB_METRICS = {"accuracy": "accuracy", "macro_f1": "f1", "micro_f1": "f1", "f1": "seqeval", "bleu": "bleu",
               "chrf": "chrf", "exact_match": "exact_match", "recall_at_1": "recall", "mrr_at_10": "mrr",
               "ndcg_at_10": "ndcg", "spearman": "spearmanr", "pearson": "pearsonr",
               "perplexity": "perplexity"}
HUB_NAME = re.compile(r"^[A-Za-z0-9][\w.-]*/[\w.-]+$")  # "org/name", as the Hub spells a model
# The options of `tformer train` and `tformer export` whose value is a local path: a card shows
# only its last part (the folders above it are the maker's machine's).
PATH_OPTIONS = {"--data", "--valid", "--test", "--from-pretrained", "--out", "--resume", "--config",
                "--hf", "--onnx"}
# A folder of the Hugging Face cache: .../hub/datasets--org--name/snapshots/<revision>/...
HUB_CACHE = re.compile(r"^(models|datasets)--([A-Za-z0-9][\w.-]*)--([\w.-]+)$")


@dataclass(frozen=True)
class Card:
    """What a model card says. ``metrics``: the run's test record (metrics.jsonl's last line)."""

    name: str  # the run (or model) the export came from
    kind: str  # "classification", "seq2seq", "embedding" or "encoder"
    data: str | None = None  # the training file
    metrics: dict[str, Any] = field(default_factory=dict)
    command: str = ""  # the export command line
    max_length: int | None = None  # tokens per text the run truncated to
    windows: bool = False  # the run read a longer text in windows of max_length (the export cuts it)
    labels: tuple[str, ...] = ()
    train_command: str = ""  # the `tformer train` command that trains the run again
    base_model: str | None = None  # the pretrained model fine-tuned: its folder
    base_model_id: str | None = None  # ... and its Hub name, where its config.json records one
    data_summary: tuple[str, ...] = ()  # lines: records, splits, columns
    main_metric: str | None = None  # what the test line and the baseline are compared by


def baseline_of(metrics: dict[str, Any], key: str | None) -> tuple[float, str, str] | None:
    """(baseline score, what the baseline does, the metric) from a test record: its ``baseline``
    (with ``main_metric`` and ``baseline_by``), else an older run's ``majority_baseline``
    (accuracy of always predicting the most frequent label); None when it has neither."""
    value = metrics.get("baseline")
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        metric = metrics.get("main_metric") or key
        if metric in metrics:
            return float(value), str(metrics.get("baseline_by", "a trivial prediction")), metric
    value = metrics.get("majority_baseline")
    if isinstance(value, (int, float)) and "accuracy" in metrics:
        return float(value), "always predicting the most frequent label", "accuracy"
    return None


def baseline_lines(metrics: dict[str, Any], key: str | None) -> list[str]:
    """The card's word on the baseline: the comparison, and a warning when it was not beaten."""
    found = baseline_of(metrics, key)
    if found is None:
        return ["No baseline recorded for this run."]
    value, by, metric = found
    ours = float(metrics[metric])
    compared = f"test {metric} {ours:.4g}; baseline ({by}): {value:.4g}"
    if too_few(metrics):
        return [f"> **Warning:** the test scored {metrics['examples']} example(s), too few to tell "
                f"whether this model learned ({compared})."]
    verdict = verdict_of(metrics) or (LEARNED if ours > value else None)
    if verdict == LEARNED:
        return [f"The model {'matches' if ours == value else 'beats'} its baseline: {compared}."]
    if verdict == CANNOT_TELL:
        low, high = (metrics.get("gain_interval") or [None, None])[:2]
        within = f" (the gain's 95% interval: {low:+.4g} to {high:+.4g})" if low is not None else ""
        return [f"> **Warning:** the test cannot tell whether this model learned: {compared}{within} is "
                "within the test's noise. Test it on more examples before using it."]
    return [f"> **Warning:** this model did not beat its baseline ({compared}). It has not learned "
            "the task: train longer or on more data before using it."]


def start_lines(metrics: dict[str, Any]) -> list[str]:
    """A fine-tune whose steps all scored below its pretrained model on validation: its weights
    are that model's as it was (tformer.training.loop validates a sentence-embedding fine-tune at
    step 0 and keeps the best)."""
    if not tested_as_it_was(metrics):
        return []
    start, tuned = metrics["pretrained_validation"], metrics.get("tuned_validation")
    best = f"; the best fine-tuned step's: {tuned:.4g}" if isinstance(tuned, (int, float)) else ""
    these = ("the base model's encoder as it was, and a head fitted to its features before fine-tuning"
             if metrics.get("head_probed") else "the base model's weights as they were")
    return ["", f"These are {these}: no fine-tuning step improved on its validation score "
                f"({start:.4g}{best})."]


def local_name(path: str | None) -> str | None:
    """A local path as a card shows it: its last part (``/home/me/data/train.jsonl`` ->
    ``train.jsonl``)."""
    return PurePath(path).name or path if path else path


def without_local_paths(command: str) -> str:
    """A command line with each local path (PATH_OPTIONS' values, the export's RUN) cut to its
    last part."""
    try:
        words = shlex.split(command)
    except ValueError:
        return command
    out = []
    for i, word in enumerate(words):
        after = words[i - 1] if i else ""
        is_path = after in PATH_OPTIONS or (after == "export" and words[:1] == ["tformer"])
        out.append(local_name(word) if is_path else word)
    return shlex.join(out)


def hub_cache_name(path: str | None, kind: str) -> str | None:
    """"org/name" where ``path`` lies in the Hugging Face cache's folder of that ``kind``
    ("models" or "datasets"); else None."""
    for part in PurePath(path).parts if path else ():
        found = HUB_CACHE.match(part)
        if found and found[1] == kind:
            return f"{found[2]}/{found[3]}"
    return None


def base_card_license(directory: str | None) -> str | None:
    """The ``license`` of a base model folder's own card (README.md's YAML header), if any."""
    try:
        text = (Path(directory) / "README.md").read_text(encoding="utf-8") if directory else ""
    except OSError:
        return None
    if not text.startswith("---\n") or "\n---" not in text[3:]:
        return None
    for line in text[4 : text.index("\n---", 3)].splitlines():
        key, _, value = line.partition(":")
        if key == "license" and re.fullmatch(r"[\w.+-]+", value.strip().strip("\"'")):
            return value.strip().strip("\"'")
    return None


def _yaml_list(name: str, items: list[str]) -> list[str]:
    return [f"{name}:", *[f"- {json.dumps(item)}" for item in items]] if items else []


def front_matter(card: Card, library_name: str, pipeline_tag: str | None, tags: tuple[str, ...] = ()
                 ) -> list[str]:
    """The Hub's YAML metadata block (values as JSON strings: valid YAML scalars): the keys of
    its model card spec (hub-docs modelcard.md) tformer knows. ``license``: a fine-tune's is its
    base model card's, else ``unknown`` (the Hub's id for it: the data's owner says);
    ``base_model``: the base model's Hub name (its config.json's, or its cache folder's);
    ``datasets``: the training data's Hub name where it was read from the Hugging Face cache."""
    lines = ["---", f"library_name: {json.dumps(library_name)}"]
    if pipeline_tag:
        lines.append(f"pipeline_tag: {json.dumps(pipeline_tag)}")
    lines.append(f"license: {json.dumps(base_card_license(card.base_model) or 'unknown')}")
    base = card.base_model_id or hub_cache_name(card.base_model, "models")
    if base and HUB_NAME.match(base):
        lines += [f"base_model: {json.dumps(base)}", "base_model_relation: finetune"]
    dataset = hub_cache_name(card.data, "datasets")
    lines += _yaml_list("datasets", [dataset] if dataset else [])
    lines += _yaml_list("tags", ["tformer", *tags])
    metrics = list(dict.fromkeys(HUB_METRICS[k] for k in HUB_METRICS
                                 if isinstance(card.metrics.get(k), (int, float))))
    lines += _yaml_list("metrics", metrics)
    return [*lines, "---"]


def _data_name(data: str) -> str:
    """The training data as the card names it: a synthetic task's words, else the file's name."""
    return data if data.startswith("synthetic task") else local_name(data)


def render(card: Card, fmt: str, usage: str, library_name: str = "transformers",
           pipeline_tag: str | None = None, tags: tuple[str, ...] = ()) -> bytes:
    """The README.md for an export in format ``fmt`` (e.g. "a transformers MarianMTModel
    directory"), with ``usage`` (a short Python snippet) showing how to load it; the header
    names ``library_name`` and ``pipeline_tag`` as the Hub reads them."""
    shown = {k: v for k, v in card.metrics.items() if isinstance(v, (int, float, str)) and k != "split"}
    lines = [
        *front_matter(card, library_name, pipeline_tag, tags),
        MARKER,
        f"# {card.name}",
        "",
        f"A {card.kind} model trained with tformer {__version__} and exported as {fmt}.",
        "",
        "## Training data",
        "",
        f"- data: `{_data_name(card.data)}`" if card.data else "- data: none recorded (a synthetic task)",
        *[f"- {line}" for line in card.data_summary],
    ]
    if card.base_model:
        named = f" ({card.base_model_id})" if card.base_model_id else ""
        lines.append(f"- base model (fine-tuned): `{local_name(card.base_model)}`{named}")
    if card.max_length and card.windows:
        lines.append(f"- inputs of up to {card.max_length} tokens: the run read a longer text in windows of "
                     f"{card.max_length} tokens and averaged them (its test metrics were computed so); this "
                     f"export reads only a text's first {card.max_length} tokens (the exported tokenizer "
                     "truncates), where `tformer predict` and `tformer serve` on the run read it whole")
    elif card.max_length:
        lines.append(f"- inputs truncated to {card.max_length} tokens (the exported tokenizer does the same)")
    if card.labels:
        lines.append(f"- labels ({len(card.labels)}): {', '.join(card.labels)}")
    lines += ["", "## Test metrics", ""]
    if shown:
        lines += [*baseline_lines(card.metrics, card.main_metric), *start_lines(card.metrics), "",
                  f"```json\n{json.dumps(shown, indent=2, sort_keys=True)}\n```"]
    else:
        lines.append("none recorded (the run has no test record)")
    lines += ["", "## How it was made", ""]
    if card.train_command:
        lines += ["Trained with:", "", f"```\n{without_local_paths(card.train_command)}\n```", ""]
    if card.command:
        lines += ["Exported with:", "", f"```\n{without_local_paths(card.command)}\n```", ""]
    lines += [f"tformer version: {__version__}", "", "## Use", "", f"```python\n{usage.strip()}\n```", ""]
    return "\n".join(lines).encode("utf-8")
