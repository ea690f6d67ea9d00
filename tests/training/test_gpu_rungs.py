"""The sizing ladder's rungs above d_model 512 on a GPU (issue 55): a CUDA device may take
BERT-base's and BERT-large's shapes when its measured steps leave enough updates; a CPU never."""

from types import SimpleNamespace

import torch

from tformer.training import sizing
from tformer.training.config import resolve_config


def _stand_in(config):
    model = config.model.replace(vocab_size=1000)
    return SimpleNamespace(config=config, model_kind="seq2seq", model_config=lambda: model)


def test_only_a_cuda_device_gets_the_rungs_above_the_ladder():
    assert sizing.rungs_for(torch.device("cpu")) == ()
    assert sizing.rungs_for(torch.device("mps")) == ()
    rungs = sizing.rungs_for(torch.device("cuda", 0))  # a device object: no GPU needed to ask
    assert [r["d_model"] for r in rungs] == [768, 1024]
    assert all(r["d_model"] > sizing.LADDER[-1]["d_model"] and r["d_model"] % r["n_heads"] == 0
               for r in rungs)


def test_extra_rungs_are_timed_and_taken_while_they_get_enough_updates():
    """With steps measured fast (a GPU's), the largest extra rung that still gets MIN_STEPS wins;
    each rung on the way is timed."""
    config = resolve_config({"data": None, "task": "reverse", "max_minutes": 1.5})
    timed = []

    def seconds_per_step(objective):
        d = objective.config.model.d_model
        timed.append(d)
        return 0.012 if d < 1024 else 1.0  # BERT-large's step too slow for 600 updates in 81 s

    chosen, why = sizing.choose_size(config, _stand_in, 81.0, seconds_per_step, measure_rungs=True,
                                     extra_rungs=sizing.GPU_RUNGS)
    assert timed == [r["d_model"] for r in (*sizing.LADDER, *sizing.GPU_RUNGS)]
    assert chosen.model.d_model == 768 and chosen.model.n_layers == 12, why
    assert "this rung measured 12 ms a step" in why, why
