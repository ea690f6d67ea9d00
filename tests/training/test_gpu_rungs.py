"""The sizing ladder's rungs above d_model 384 on a GPU (issue 55): a CUDA device may take
d_model 512 and BERT-base's and BERT-large's shapes when its measured steps leave enough
updates; a CPU never."""

import torch

from tformer.training import sizing
from tformer.training.config import resolve_config


def test_only_a_cuda_device_gets_the_rungs_above_the_ladder():
    assert sizing.rungs_for(torch.device("cpu")) == ()
    assert sizing.rungs_for(torch.device("mps")) == ()
    rungs = sizing.rungs_for(torch.device("cuda", 0))  # a device object: no GPU needed to ask
    assert [r["d_model"] for r in rungs] == [512, 768, 1024]
    assert all(r["d_model"] > sizing.LADDER[-1]["d_model"] and r["d_model"] % r["n_heads"] == 0
               for r in rungs)


def test_extra_rungs_are_timed_and_taken_while_they_get_enough_updates():
    """With steps measured fast (a GPU's), the largest extra rung that still gets MIN_STEPS wins;
    each rung on the way is asked for its step time."""
    config = resolve_config({"data": None, "task": "reverse", "max_minutes": 1.5})
    timed = []

    def seconds_per_step(candidate):
        d = candidate.model.d_model
        timed.append(d)
        return 0.012 if d < 1024 else 1.0  # BERT-large's step too slow for 600 updates in 81 s

    chosen, why = sizing.choose_size(config, 81.0, seconds_per_step, extra_rungs=sizing.GPU_RUNGS)
    assert timed == [r["d_model"] for r in (*sizing.LADDER, *sizing.GPU_RUNGS)]
    assert chosen.model.d_model == 768 and chosen.model.n_layers == 12, why
    assert "12 ms a step" in why, why
    plain, _ = sizing.choose_size(config, 81.0, seconds_per_step)  # no extra rungs: the ladder's top
    assert plain.model.d_model == sizing.LADDER[-1]["d_model"]


def test_the_plan_offers_the_devices_rungs_and_a_re_plan_keeps_them(tmp_path, monkeypatch):
    """make_plan takes the rungs it is given (planning passes rungs_for(device)); a re-plan at a
    pace faster than planned may climb onto them too."""
    from tformer.config import TransformerConfig
    from tformer.kinds.classification import Classification
    from tformer.training import config as training_config
    from tformer.training.plan import DataSummary, make_plan, replan

    monkeypatch.chdir(tmp_path)
    (tmp_path / "d.jsonl").write_text("".join(f'{{"text": "t {i}", "label": "{i % 2}"}}\n' for i in range(40)))
    config = training_config.resolve_config({"data": "d.jsonl", "max_minutes": 3, "max_length": 64},
                                            objective=Classification)
    model = TransformerConfig(d_model=128, n_heads=4, d_ff=512, n_layers=2, vocab_size=4000, n_classes=2,
                              max_len=512)
    data = DataSummary("classifier", model, tuple((20,) for _ in range(100)), 4000, 250, 260, False)

    class Speeds:  # a step 12 ms (bound by kernel launches) up to BERT-base, 0.25 s for BERT-large
        def step_seconds(self, config, model, kind, tokens, length, precision):
            return 0.25 if model.d_model >= 1024 else 0.012

        def precision(self, config, model, kind):
            return "bf16", "made up", False

    assert make_plan(config, data, Speeds(), 180.0).config.model.d_model == sizing.LADDER[-1]["d_model"]
    plan = make_plan(config, data, Speeds(), 180.0, rungs=sizing.GPU_RUNGS)
    assert plan.config.model.d_model == 768 and plan.config.model.n_layers == 12, plan.why("model size")
    # The real steps run 3x faster than planned: BERT-large's then gets ~680 updates in its 146 s
    # of training, less the ~89 s its 306 M parameters take to build and save.
    again = replan(plan, data, Speeds(), 0.004, 162.0)
    assert again is not None and again.config.model.d_model == 1024, again


def test_a_rung_pays_for_building_and_saving_its_model_out_of_the_training_time():
    """On an H200 a 1-minute run from scratch took BERT-base's shape in an encoder-decoder (199 M
    parameters, 55 ms a step: ~900 updates in 48 s) and was then refused: writing its checkpoints
    alone takes ~48 s. A rung is taken only when its updates fit beside what its model costs to
    build and save (sizing.fixed_seconds)."""
    config = resolve_config({"data": None, "task": "reverse", "max_minutes": 1.5})
    parameters = {128: 1e6, 256: 4e6, 384: 1e7, 512: 3e7, 768: 2e8, 1024: 6e8}

    def fixed(candidate):
        return sum(sizing.fixed_seconds(parameters[candidate.model.d_model]))

    build, save = sizing.fixed_seconds(2e8)
    assert (build, save) == (10.0, 48.0)  # 5e-8 s a parameter; 2 x (weights + 2 moments) at 100 MB/s
    chosen, why = sizing.choose_size(config, 81.0, lambda c: 0.012, extra_rungs=sizing.GPU_RUNGS)
    assert chosen.model.d_model == 1024  # (no costs besides the updates: the top)
    chosen, why = sizing.choose_size(config, 81.0, lambda c: 0.012, extra_rungs=sizing.GPU_RUNGS, fixed=fixed)
    # 512: (81 - 0.6 - 7.2) / 0.012 = 6,100 updates; 768: (81 - 58) / 0.012 = 1,917; 1024: none
    assert chosen.model.d_model == 768 and "about 1,917" in why, why
    chosen, why = sizing.choose_size(config, 60.0, lambda c: 0.012, extra_rungs=sizing.GPU_RUNGS, fixed=fixed)
    assert chosen.model.d_model == 512, why  # 768: (60 - 58) / 0.012 = 167 updates, short of 600


def test_an_encoder_decoder_takes_the_largest_rung_that_gets_twice_the_updates(tmp_path, monkeypatch):
    """A seq2seq model needs Seq2Seq.steps_factor = 2 x MIN_STEPS updates (at 3 minutes
    an English -> German d_model 128 model's 1,769 updates tested BLEU 17.6, the 256 x 3 model
    that 600 allowed 11.2 in 834): where a rung's updates fall between the two, a classifier
    takes it and an encoder-decoder does not."""
    from tformer.config import TransformerConfig
    from tformer.kinds.classification import Classification
    from tformer.kinds.seq2seq import Seq2Seq
    from tformer.training import config as training_config
    from tformer.training.plan import DataSummary, make_plan

    assert Seq2Seq.steps_factor == 2 and Classification.steps_factor == 1
    monkeypatch.chdir(tmp_path)
    (tmp_path / "d.jsonl").write_text("".join(f'{{"text": "t {i}", "label": "{i % 2}"}}\n' for i in range(40)))
    config = training_config.resolve_config({"data": "d.jsonl", "max_minutes": 3, "max_length": 64},
                                            objective=Classification)
    chosen = {}
    for kind in ("classifier", "seq2seq"):
        model = TransformerConfig(d_model=128, n_heads=4, d_ff=512, n_layers=2, vocab_size=4000, n_classes=2,
                                  max_len=512)
        factor = Seq2Seq.steps_factor if kind == "seq2seq" else Classification.steps_factor
        data = DataSummary(kind, model, tuple((20,) for _ in range(100)), 4000, 250, 260, False,
                           steps_factor=factor)

        class Speeds:  # 256 x 3: ~900 updates in the 162 s of training; 384 x 4: ~400
            def step_seconds(self, config, model, kind, tokens, length, precision):
                return {128: 0.05, 256: 0.18, 384: 0.4}[model.d_model]

            def precision(self, config, model, kind):
                return "fp32", "made up", False

        plan = make_plan(config, data, Speeds(), 180.0)
        chosen[kind] = plan.config.model.d_model, plan.why("model size")
    assert chosen["classifier"][0] == 256 and ">= 600 updates" in chosen["classifier"][1], chosen
    assert chosen["seq2seq"][0] == 128 and ">= 1,200 updates" in chosen["seq2seq"][1], chosen
