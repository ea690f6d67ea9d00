"""A fine-tune's new head fitted to the pretrained features before its first update
(tformer.training.probe): the logistic regression against scikit-learn's, the head folded back
to the raw features, the sample the plan pays for, and a fine-tune that starts from the probe."""

import math

import pytest
import torch
from hf_bert_fixtures import make_bert_dir
from text_fixtures import classification_rows, write

from tformer.kinds import make_objective, resolve_config, train
from tformer.storage.rundir import read_metrics
from tformer.training import probe
from tformer.training.sizing import PROBE_MAX, PROBE_MIN, PROBE_SHARE, probe_plan


def _blobs(n: int, classes: int, width: int, seed: int = 0, spread: float = 1.0):
    """(features (n, width) float64, labels (n,)): one Gaussian blob a class, at an offset and a
    scale unlike a standardized feature's (the head is folded back to these raw features)."""
    g = torch.Generator().manual_seed(seed)
    centres = 3 * torch.randn(classes, width, generator=g, dtype=torch.float64)
    labels = torch.arange(n) % classes
    x = centres[labels] + spread * torch.randn(n, width, generator=g, dtype=torch.float64)
    return 5.0 + 0.2 * x, labels


def test_the_logistic_regression_is_scikit_learns():
    sklearn = pytest.importorskip("sklearn.linear_model")
    x, y = _blobs(120, 3, 6, spread=4.0)  # overlapping: a finite optimum
    x = (x - x.mean(0)) / x.std(0)  # (standardized, as softmax_head fits)
    l2 = 0.01
    w, b = probe.logistic(x, y, 3, l2)
    theirs = sklearn.LogisticRegression(C=1 / (2 * l2 * len(x)), tol=1e-10, max_iter=10_000).fit(x.numpy(), y.numpy())
    # (softmax logits are defined up to a constant per example: both centre them over the classes)
    ours = x @ w.T + b
    reference = torch.from_numpy(theirs.decision_function(x.numpy()))
    assert torch.allclose(ours - ours.mean(1, keepdim=True), reference - reference.mean(1, keepdim=True), atol=2e-5)


def test_the_fit_reaches_its_optimum():
    x, y = _blobs(512, 6, 384, spread=6.0)  # the probe's largest sample, at MiniLM's width
    z = (x - x.mean(0)) / x.std(0)
    w, b = probe.logistic(z, y, 6, probe.L2_GRID[0])
    w, b = w.requires_grad_(), b.requires_grad_()
    loss = torch.nn.functional.cross_entropy(z @ w.T + b, y) + probe.L2_GRID[0] * w.square().sum()
    loss.backward()
    assert w.grad.abs().max() < 1e-5 and b.grad.abs().max() < 1e-5


def test_the_head_reads_the_raw_features_as_the_fit_read_them_standardized():
    x, y = _blobs(200, 4, 8, spread=3.0)
    weight, bias, what = probe.softmax_head(x, y, 4)
    assert weight.shape == (4, 8) and bias.shape == (4,)
    assert "linear probe" in what and "held out" in what
    l2 = float(what.split("L2 ")[1].split(",")[0])
    z = (x - x.mean(0)) / x.std(0)
    w, b = probe.logistic(z, y, 4, l2)
    assert torch.allclose(x.float() @ weight.T + bias, (z @ w.T + b).float(), atol=1e-3)
    assert (x.float() @ weight.T + bias).argmax(1).eq(y).double().mean() > 0.9


def test_the_penalty_is_chosen_on_the_held_out_fifth():
    # Few examples, many noise features: the weakest penalty overfits, a stronger one is chosen.
    g = torch.Generator().manual_seed(3)
    y = torch.arange(60) % 2
    x = torch.cat([y[:, None].double() + 0.5 * torch.randn(60, 1, generator=g, dtype=torch.float64),
                   torch.randn(60, 200, generator=g, dtype=torch.float64)], 1)
    _, _, what = probe.softmax_head(x, y, 2)
    assert float(what.split("L2 ")[1].split(",")[0]) > probe.L2_GRID[0], what


def test_the_logistic_regressions_per_label_are_scikit_learns_with_the_positives_weighted():
    sklearn = pytest.importorskip("sklearn.linear_model")
    x, _ = _blobs(150, 3, 5, spread=4.0)
    x = (x - x.mean(0)) / x.std(0)
    g = torch.Generator().manual_seed(1)
    targets = (x[:, :3] + torch.randn(150, 3, generator=g, dtype=torch.float64) > 0.6).double()  # (N, 3)
    pos_weight, l2 = torch.tensor([1.0, 2.5, 4.0], dtype=torch.float64), 0.01
    w, b = probe.logistic(x, targets, 3, l2, pos_weight)
    # Its loss is the mean over N x C decisions: label c's share is mean_N(BCE_c) / C + l2 |w_c|^2,
    # scikit-learn's with C = 1 / (2 C l2 N) and the positives weighted by class_weight.
    for c in range(3):
        theirs = sklearn.LogisticRegression(C=1 / (2 * 3 * l2 * len(x)), tol=1e-10, max_iter=10_000,
                                            class_weight={0: 1.0, 1: float(pos_weight[c])})
        theirs.fit(x.numpy(), targets[:, c].numpy())
        reference = torch.from_numpy(theirs.decision_function(x.numpy()))
        assert torch.allclose(x @ w[c] + b[c], reference, atol=2e-5), c


def test_a_multi_label_head_is_chosen_by_its_held_out_loss():
    x, _ = _blobs(200, 2, 6, spread=2.0)
    targets = torch.stack([x[:, 0] > x[:, 0].median(), x[:, 1] > x[:, 1].median()], 1).double()
    weight, bias, what = probe.sigmoid_head(x, targets)
    assert weight.shape == (2, 6) and "a logistic regression per label" in what and "loss" in what
    chosen = (x.float() @ weight.T + bias) > 0
    assert chosen.eq(targets.bool()).double().mean() > 0.9


def test_an_output_the_sample_never_shows_keeps_its_start():
    """An unpenalised bias of a class absent from the sample (or a label never held) only grows
    with the fit's iterations: that output keeps the head's start; one class alone fits nothing."""
    x, y = _blobs(90, 3, 5)
    head = torch.nn.Linear(5, 4)  # class 3: in no example
    start = (head.weight.detach().clone(), head.bias.detach().clone())
    assert probe.fit_softmax(head, x, y).startswith("a linear probe")
    assert torch.equal(head.weight[3], start[0][3]) and torch.equal(head.bias[3], start[1][3])
    weight, bias, _ = probe.softmax_head(x, y, 4)
    assert torch.equal(head.weight[:3], weight[:3]) and torch.equal(head.bias[:3], bias[:3])
    assert probe.fit_softmax(torch.nn.Linear(5, 4), x, torch.zeros(90, dtype=torch.long)) is None
    targets = torch.stack([y == 0, y == 1, torch.zeros(90, dtype=torch.bool), torch.ones(90, dtype=torch.bool)], 1)
    head = torch.nn.Linear(5, 4)
    start = (head.weight.detach().clone(), head.bias.detach().clone())
    assert "per label" in probe.fit_sigmoid(head, x, targets.double(), None)
    assert torch.equal(head.bias[2:], start[1][2:]) and not torch.equal(head.bias[:2], start[1][:2])
    assert probe.fit_sigmoid(head, x, targets[:, 2:].double().repeat(1, 2), None) is None


def test_a_constant_feature_is_not_divided_by_zero():
    x, y = _blobs(50, 2, 4)
    x[:, 2] = 7.0
    weight, bias, _ = probe.softmax_head(x, y, 2)
    assert torch.isfinite(weight).all() and torch.isfinite(bias).all()


def test_the_plan_pays_for_the_sample_it_takes():
    assert probe_plan(math.inf, None, 10_000)[0] == PROBE_MAX  # untimed: the most
    assert probe_plan(math.inf, None, 40)[0] == 40  # a small file: all of it
    n, why = probe_plan(100.0, 0.02, 10_000)  # 5 s pay for 250 examples
    assert n == int(PROBE_SHARE * 100 / 0.02) and f"{n:,} training examples" in why
    n, why = probe_plan(10.0, 0.02, 10_000)  # 0.5 s pay for 25: fewer than PROBE_MIN
    assert 25 < PROBE_MIN and n == 0 and why.startswith("random"), why


@pytest.fixture(scope="module")
def pretrained(tmp_path_factory):
    return make_bert_dir(tmp_path_factory.mktemp("bert") / "bert")


def _fine_tune(tmp_path, pretrained, **options):
    data = write(tmp_path / "train.jsonl", classification_rows(120))
    config = resolve_config({"data": str(data), "from_pretrained": str(pretrained), "out": str(tmp_path / "run"),
                             "steps": 4, "eval_every": 2, "threads": 1, **options})
    said: list[str] = []
    record = train(config, progress=False, log=said.append)
    return record, said, read_metrics(tmp_path / "run" / "metrics.jsonl")


def test_a_classification_fine_tune_starts_from_its_probe_and_validates_it(tmp_path, pretrained):
    record, said, metrics = _fine_tune(tmp_path, pretrained)
    assert any(line.startswith("head: fitted to the pretrained features of ") for line in said), said
    assert any(line.startswith("head: a linear probe (L2 ") for line in said), said
    first = [m for m in metrics if m.get("split") == "validation"][0]
    assert first["step"] == 0  # the probe is a model of its own: validated, kept if no step beats it
    assert record["head_probed"] is True and "pretrained_validation" in record


def test_the_probe_sets_the_head_and_leaves_the_random_draws_as_they_were(tmp_path, pretrained):
    data = write(tmp_path / "train.jsonl", classification_rows(120))
    config = resolve_config({"data": str(data), "from_pretrained": str(pretrained), "threads": 1,
                             "max_tokens": 2048})  # (the plan's batch)
    (tmp_path / "run").mkdir()
    objective = make_objective(config, tmp_path / "run")
    model = objective.build_model()
    torch.manual_seed(5)
    state = torch.get_rng_state()
    said: list[str] = []
    assert probe.fit_head(objective, model, 64, torch.device("cpu"), False, said.append)
    assert torch.equal(torch.get_rng_state(), state)
    features, labels, seen = probe.training_features(objective, model, 64, torch.device("cpu"), False)
    assert seen == len(features) >= 64  # (the first batch, whole)
    weight, bias, _ = probe.softmax_head(features, labels, len(objective.labels))
    assert torch.equal(model.head.weight, weight) and torch.equal(model.head.bias, bias)
    with torch.no_grad():  # the head's logits are the model's own, dropout aside
        first = next(objective.train_batches(0))
        logits = model.eval()(first.input_ids, first.attention_mask, first.token_type_ids).logits
    assert torch.allclose(logits, features[: len(logits)].float() @ weight.T + bias, atol=1e-4)


def test_head_init_random_starts_the_head_as_transformers_does(tmp_path, pretrained):
    _, said, metrics = _fine_tune(tmp_path, pretrained, head_init="random")
    assert not any(line.startswith("head:") for line in said), said
    assert all(m["step"] > 0 for m in metrics if m.get("split") == "validation")


def test_no_probe_where_its_share_of_the_budget_pays_for_too_few(tmp_path, pretrained, monkeypatch):
    import tformer.training.sizing as sizing

    monkeypatch.setattr(sizing, "PROBE_SHARE", 1e-9)
    _, said, _ = _fine_tune(tmp_path, pretrained, max_minutes=1.0, steps=2)
    assert any(line.startswith("head: random (fitting it to 64 examples' features") for line in said), said
