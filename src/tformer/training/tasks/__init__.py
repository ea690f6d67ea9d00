"""Synthetic tasks generated from a seed: no downloads.

    task = get_task("reverse", seed=0)
    batch = task.collate(task.train_batch(step=0, batch_size=32))

seq2seq: copy, reverse, sort, add. classification: listops, brackets.
"""

from __future__ import annotations

from tformer.errors import FieldError
from tformer.text.batches import EncoderBatch, Seq2SeqBatch
from tformer.training.tasks.addition import AddTask
from tformer.training.tasks.base import ClassificationTask, Example, SequenceTask, Task, sequence_metrics
from tformer.training.tasks.brackets import BracketsTask
from tformer.training.tasks.listops import ListOpsTask
from tformer.training.tasks.sequences import CopyTask, ReverseTask, SortTask
from tformer.training.tasks.tokenizer import BOS, EOS, PAD, UNK, Tokenizer

TASKS: dict[str, type[Task]] = {
    t.name: t for t in (CopyTask, ReverseTask, SortTask, AddTask, ListOpsTask, BracketsTask)
}


def get_task(name: str, seed: int = 0, valid_size: int = 500, test_size: int = 1000) -> Task:
    """Build the task called `name` (see TASKS) with splits drawn from `seed`."""
    if name not in TASKS:
        raise FieldError("task", f"expected one of {', '.join(TASKS)}; got {name!r}")
    return TASKS[name](seed=seed, valid_size=valid_size, test_size=test_size)


__all__ = [
    "BOS", "EOS", "PAD", "UNK", "TASKS", "ClassificationTask", "EncoderBatch", "Example", "Seq2SeqBatch",
    "SequenceTask",
    "Task", "Tokenizer", "get_task", "sequence_metrics",
]
