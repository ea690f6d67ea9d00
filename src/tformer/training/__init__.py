"""Training: config, data, objectives, loop, evaluation, report.

    from tformer.training import resolve_config, train
    record = train(resolve_config({"data": "train.jsonl", "max_minutes": 10}))
"""

from tformer.training.config import (
    OBJECTIVE_PRESETS,
    PRESETS,
    RESUMABLE,
    SCHEDULES,
    TrainConfig,
    load_config_file,
    resolve_config,
    resume_config,
)
from tformer.training.loop import learning_rate, load_run, make_optimizer, make_source, train
from tformer.training.objectives import DataSource, TaskSource, forward_loss

__all__ = [
    "OBJECTIVE_PRESETS", "PRESETS", "RESUMABLE", "SCHEDULES", "DataSource", "TaskSource", "TrainConfig",
    "forward_loss", "learning_rate", "load_config_file", "load_run", "make_optimizer", "make_source",
    "resolve_config", "resume_config", "train",
]
