"""train_command (tformer.training.command): the command a model card gives resolves to the run's
own TrainConfig, a fine-tune's dropout (given or its pretrained model's) included."""

import dataclasses

import pytest
from text_fixtures import classification_rows, write

from tformer.commands.cli import build_parser
from tformer.kinds import resolve_config
from tformer.kinds.classification import Classification
from tformer.training.command import train_command
from tformer.training.config import MODEL_OPTIONS, TrainConfig


@pytest.mark.parametrize("options", [{}, {"dropout": 0.3}, {"dropout": 0.0, "lr": 2e-5}])
def test_a_fine_tunes_command_resolves_to_its_config(tmp_path, options):
    data = write(tmp_path / "d.jsonl", classification_rows(20))
    config = resolve_config({"data": str(data), "from_pretrained": "/nonexistent/model", **options})
    words = train_command(config, Classification).split()
    assert ("--dropout" in words) == ("dropout" in options), words
    args = build_parser()[0].parse_args(words[1:])
    names = {f.name for f in dataclasses.fields(TrainConfig)} | set(MODEL_OPTIONS)
    assert resolve_config({k: v for k, v in vars(args).items() if k in names}) == config
