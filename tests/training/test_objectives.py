"""The model a fine-tune builds (tformer.training.objectives): --dropout, where given, is the
probability of every dropout of the model; else the pretrained model's own stand."""

import pytest
from hf_bert_fixtures import make_bert_dir
from text_fixtures import classification_rows, embedding_rows, write
from torch import nn

from tformer.nn.attention import MultiHeadAttention
from tformer.nn.dropout import Dropout
from tformer.training import resolve_config
from tformer.training.objectives import make_objective

# The pretrained model's own, each unlike the other and unlike --dropout's default (0.1).
HIDDEN, ATTENTION = 0.05, 0.15


@pytest.fixture(scope="module")
def pretrained(tmp_path_factory):
    return make_bert_dir(tmp_path_factory.mktemp("bert") / "bert", hidden_dropout_prob=HIDDEN,
                         attention_probs_dropout_prob=ATTENTION)


def dropouts(model: nn.Module) -> dict[str, float]:
    """{module name: its dropout probability}: each dropout module's p (the embeddings', each
    layer's, a classifier head's) and each attention's on its weights."""
    found = {}
    for name, module in model.named_modules():
        if isinstance(module, MultiHeadAttention):
            found[name] = module.dropout
        elif isinstance(module, (Dropout, nn.Dropout)):
            found[name] = module.p
    return found


def fine_tune(tmp_path, pretrained, rows, **options):
    data = write(tmp_path / "train.jsonl", rows(40))
    config = resolve_config({"data": str(data), "from_pretrained": str(pretrained), **options})
    (tmp_path / "run").mkdir()
    return make_objective(config, tmp_path / "run").build_model()


@pytest.mark.parametrize("rows, head", [(classification_rows, 1), (embedding_rows, 0)])
def test_a_fine_tune_given_dropout_has_it_in_every_dropout_of_the_model(tmp_path, pretrained, rows, head):
    model = fine_tune(tmp_path, pretrained, rows, dropout=0.3)
    found = dropouts(model)
    layers = model.config.n_layers  # per layer: the attention weights' and the residual's; the embeddings'
    assert len(found) == 2 * layers + 1 + head, found
    assert set(found.values()) == {0.3}, found
    assert (model.config.dropout, model.config.attention_dropout) == (0.3, 0.3)


@pytest.mark.parametrize("rows", [classification_rows, embedding_rows])
def test_a_fine_tune_without_dropout_keeps_the_pretrained_models_own(tmp_path, pretrained, rows):
    found = dropouts(fine_tune(tmp_path, pretrained, rows))
    attention = {name for name in found if name.endswith("self_attn")}
    assert attention and {found[name] for name in attention} == {ATTENTION}, found
    assert {p for name, p in found.items() if name not in attention} == {HIDDEN}, found


def test_dropout_zero_turns_every_dropout_of_a_fine_tune_off(tmp_path, pretrained):
    found = dropouts(fine_tune(tmp_path, pretrained, classification_rows, dropout=0.0))
    assert found and set(found.values()) == {0.0}, found
