"""What a run learns: one objective per kind of model, each taking a typed source.

    Seq2Seq          source -> target: the encoder-decoder; exact match (a task), BLEU and chrF
    Classification   text (+ text_pair) -> label: an encoder, pooled, a linear head
    Embedding        anchor -> positive (+ negative): an encoder, pooled, normalised

    objective = make_objective(config, run_dir)   # the config's source, its kind's objective
"""

from __future__ import annotations

from pathlib import Path

from tformer.tasks import get_task
from tformer.training.dataset import TextData
from tformer.training.objectives.base import EVAL_SAMPLE, Objective, evaluating
from tformer.training.objectives.classification import Classification
from tformer.training.objectives.embedding import Embedding, SentenceModel
from tformer.training.objectives.seq2seq import Seq2Seq
from tformer.training.sources import FileSource, TaskSource

OBJECTIVES: dict[str, type[Objective]] = {o.kind: o for o in (Seq2Seq, Classification, Embedding)}


def make_objective(config, run_dir: Path | None = None, write: bool = True,
                   existing: bool = False) -> Objective:
    """The objective a config trains: on a synthetic task's, or on your data (its tokenizer
    trained and written to run_dir; with `existing`, read back from run_dir without the data
    files)."""
    if config.data is None:
        source = TaskSource(get_task(config.task, config.seed, config.valid_size, config.test_size), config)
    elif existing:
        source = FileSource(TextData.from_run(run_dir, config), config)
    else:
        source = FileSource(TextData.build(config, run_dir, write=write), config)
    return OBJECTIVES[source.kind](source)


__all__ = ["EVAL_SAMPLE", "OBJECTIVES", "Classification", "Embedding", "Objective", "Seq2Seq",
           "SentenceModel", "evaluating", "make_objective"]
