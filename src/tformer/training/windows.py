"""Long texts in training, evaluation and prediction: read in windows, not cut (--long).

A kind opts in with its objective's ``pools`` (how its outputs of a text's windows pool: the
mean of a classifier's logits, of an embedding's vectors) and by pooling its forward's rows
(``batch.pooled(values, self.pools)``, tformer.text.batches.EncoderBatch); the tokenizer reads
a long text in windows (tformer.text.windows) once the run has settled on them:

    objective, line = settle(objective, plan, run_dir)   # where the plan ends: windows or cut
    encode = training(objective.encode, seed)            # training's examples: a text's windows

Training reads each window of a long text as an example of its own, with the text's label
(``per_window``); evaluation, prediction and the server read all of a text's windows and pool
their outputs (benchmarks/long_documents.py compares this with other treatments and with
cutting).

``settle`` decides --long auto (``choose``), records the choice in the run's data.json (what
`predict`, `eval`, `embed` and `serve` read it in) and says how many texts are read in how
many windows.
"""

from __future__ import annotations

import dataclasses
import itertools
import math
from collections.abc import Callable
from pathlib import Path
from typing import Any

from tformer.storage.files import write_json_atomic
from tformer.text.batches import EncodedText
from tformer.text.windows import MAX_WINDOWS, STRIDE_SHARE
from tformer.training.sizing import FINETUNE_PASSES, MIN_PASSES, truncated

SAMPLE = 1000  # training records a settled run counts the windows of (the plan line's sample)
AUTO_CUT = 0.01  # --long auto reads in windows once the max length cuts this share of texts ...
# ... and, in a timed run, once the budget pays for WINDOW_PASSES times the passes a length needs
# (tformer.training.sizing: MIN_PASSES, FINETUNE_PASSES) over the windows. A text's windows are
# more examples with its label, and more data pays only once the budget would otherwise go round
# the cut texts again and again (as a longer length does). Measured (benchmarks/README.md, "Long
# documents"): at 1 and 3 minutes, man pages' DESCRIPTIONs from scratch and fine-tuning
# all-MiniLM-L6-v2, and whole man pages from scratch, cut won in all six (test accuracy 0.842
# against 0.782, 0.855 against 0.791, 0.950 against 0.662 at 3 minutes), where their windowed
# runs had been planned at about 2.1, 0.3 and 0.6 passes over their windows (the first over the
# 2 a length needs from scratch: WINDOW_PASSES 1 would have read it in windows, and lost).
WINDOW_PASSES = 2.0


def texts_of(example: Any) -> list[EncodedText]:
    """The encoded texts of a kind's typed example (tformer.training.examples): its fields that
    hold one."""
    return [v for v in (getattr(example, f.name) for f in dataclasses.fields(example))
            if isinstance(v, EncodedText)]


def windows_of(example: Any) -> int:
    """The windows an example is read in: its most windowed text's."""
    return max([1 + len(t.rest) for t in texts_of(example)], default=1)


def per_window(example: Any) -> list:
    """The example as one example per window of its long text, each with the example's other
    fields (its label): what training reads. An example class that must cut more than its text
    (token labels aligned to it) says how with its own ``per_window()``. One whose several texts
    are long is read in their first windows (their cut): windows of two texts do not pair up."""
    own = getattr(example, "per_window", None)
    if own is not None:
        return own()
    long = [f.name for f in dataclasses.fields(example)
            if isinstance(getattr(example, f.name), EncodedText) and getattr(example, f.name).rest]
    if len(long) == 1:
        return [dataclasses.replace(example, **{long[0]: w}) for w in getattr(example, long[0]).windows]
    return [dataclasses.replace(example, **{name: getattr(example, name).windows[0] for name in long})]


def training(encode: Callable[[list], list]) -> Callable[[list], list]:
    """A kind's encode for training batches: each long text's windows, an example each."""
    def windowed(records: list) -> list:
        return list(itertools.chain.from_iterable(per_window(ex) for ex in encode(records)))

    return windowed


def choose(long: str, cut_share: float, passes: float | None = None, needed: float = 0.0) -> tuple[str, str]:
    """(windows or cut, why) for --long `long` where the max length cuts `cut_share` of the
    training texts and a timed run's budget pays for `passes` over the windows (None: untimed,
    or not estimated) where a length needs `needed` (WINDOW_PASSES x that are wanted)."""
    if long != "auto":
        return long, f"--long {long}"
    if cut_share < AUTO_CUT:
        return "cut", f"--long auto: under {AUTO_CUT:.0%} of them; --long windows reads them whole"
    if passes is not None and passes < WINDOW_PASSES * needed:
        return "cut", (f"--long auto: the budget pays for about {passes:.1f} passes over their windows, "
                       f"fewer than {WINDOW_PASSES * needed:g}; --long windows reads them whole")
    return "windows", f"--long auto: {AUTO_CUT:.0%} of them or more; --long cut reads their first tokens only"


def window_passes(plan, data, windows_per_example: float) -> tuple[float | None, float]:
    """(passes over the training examples read in windows that a timed plan's budget pays for,
    or None; the passes a length needs): its updates x its batch's examples / (the training
    examples x their mean windows), as tformer.training.sizing.choose_length counts passes."""
    needed = FINETUNE_PASSES if data.pretrained else MIN_PASSES
    seconds = plan.extra.get("seconds")
    if not plan.step_seconds or seconds is None or not math.isfinite(seconds) or not data.train_examples:
        return None, needed
    steps = seconds / plan.step_seconds
    return steps * plan.config.batch_size / (data.train_examples * max(windows_per_example, 1.0)), needed


def settle(objective, plan, data, run_dir: Path | None):
    """(the objective reading long texts as the run settles, the line that says so, or None):
    for a kind that reads windows (its ``pools``), --long decided on a sample of the training
    texts at the plan's max length and recorded in data.json; for one that does not, the
    share of the plan's sample (`data`, a DataSummary) the max length cuts."""
    config = plan.config
    if not objective.pools:
        return objective, truncated([max(t) for t in data.texts], config.max_length)
    source = objective.source
    sample = list(itertools.islice(next(source.data.epoch_pools()), SAMPLE))
    source.data.long = "windows"  # (counted as windows would read them)
    counts = [windows_of(ex) for ex in objective.with_config(config).encode(sample)]
    long_texts = sum(n > 1 for n in counts)
    passes, needed = window_passes(plan, data, sum(counts) / max(len(counts), 1))
    mode, why = choose(config.long, long_texts / max(len(counts), 1), passes, needed)
    source.data.long = mode
    if run_dir is not None:
        write_json_atomic(run_dir / "data.json", source.data.describe())  # what the run is read in
    settled = objective.with_config(config)
    if not long_texts:
        return settled, None
    share = f"{long_texts:,} of {len(counts):,} training texts ({long_texts / len(counts):.0%}, a sample)"
    if mode == "cut":
        return settled, f"long texts: {share} are longer than {config.max_length} tokens: cut there ({why})"
    windows = sum(n for n in counts if n > 1)
    return settled, (f"long texts: {share} are longer than {config.max_length} tokens: read in {windows:,} "
                     f"windows ({windows / long_texts:.1f} each, a new one every {STRIDE_SHARE:.0%} of a "
                     f"window, at most {MAX_WINDOWS}; {why})")
