"""Model cards: the Hub's YAML header first, then the data, the test line against its baseline
(a warning when not beaten), the train command; the folder stays tformer's to replace."""

import yaml

from tformer.export.export_dir import is_ours
from tformer.export.model_card import Card, render


def _card(**changes) -> str:
    base = dict(name="run", kind="classification", data="train.jsonl", main_metric="accuracy",
                metrics={"split": "test", "accuracy": 0.9, "macro_f1": 0.8, "majority_baseline": 0.5},
                train_command="tformer train --data train.jsonl", command="tformer export run --hf out",
                data_summary=("1,000 records in the training file",), labels=("a", "b"))
    return render(Card(**{**base, **changes}), "a transformers directory", "print(1)",
                  pipeline_tag="text-classification").decode()


def _header(card: str) -> dict:
    assert card.startswith("---\n")
    return yaml.safe_load(card[4 : card.index("\n---\n", 4)])


def test_the_card_opens_with_the_hubs_yaml_header():
    card = _card(base_model="models/bert", base_model_id="google-bert/bert-base-uncased")
    header = _header(card)
    assert header == {"library_name": "transformers", "pipeline_tag": "text-classification",
                      "license": "unknown", "base_model": "google-bert/bert-base-uncased", "base_model_relation": "finetune",
                      "tags": ["tformer"], "metrics": ["accuracy", "f1"]}
    assert is_ours(card)  # the marker right after the header: a later export may replace it
    assert "tformer train --data train.jsonl" in card and "1,000 records" in card
    assert "base model (fine-tuned): `bert` (google-bert/bert-base-uncased)" in card
    assert "base_model" not in _header(_card(base_model="models/bert"))  # a folder is no Hub name


def test_the_baseline_is_compared_and_a_run_that_did_not_beat_it_says_so():
    assert "The model beats its baseline: test accuracy 0.9" in _card()
    losing = _card(metrics={"split": "test", "accuracy": 0.4, "majority_baseline": 0.5})
    assert "**Warning:** this model did not beat its baseline (test accuracy 0.4; baseline (always " \
           "predicting the most frequent label): 0.5)" in losing
    # The test line's own baseline (issue 34's keys), for any main metric.
    record = {"split": "test", "bleu": 3.0, "baseline": 5.0, "baseline_by": "copying the source",
              "main_metric": "bleu"}
    card = _card(kind="seq2seq", main_metric="bleu", metrics=record)
    assert "did not beat its baseline (test bleu 3; baseline (copying the source): 5)" in card
    assert "No baseline recorded" in _card(metrics={"split": "test", "recall_at_1": 0.5})


def test_a_fine_tune_that_kept_its_pretrained_weights_says_so():
    """A sentence-embedding fine-tune none of whose steps beat the pretrained model on validation
    tests (and exports) the pretrained weights: tested_step 0; the card says so with both scores."""
    record = {"split": "test", "step": 6, "tested_step": 0, "mrr_at_10": 0.83, "baseline": 0.5,
              "baseline_by": "token overlap", "main_metric": "mrr_at_10", "pretrained_validation": 0.8113,
              "tuned_validation": 0.5569, "tuned_step": 2}
    card = _card(kind="embedding", main_metric="mrr_at_10", metrics=record, base_model="models/bert")
    assert "These are the base model's weights as they were: no fine-tuning step improved on its " \
           "validation score (0.8113; the best fine-tuned step's: 0.5569)." in card
    assert "base model's weights" not in _card(kind="embedding", main_metric="mrr_at_10",
                                               metrics={**record, "tested_step": 2})


def test_the_card_names_no_local_folder():
    """Cards embedded the absolute path of the training data (and the base model's folder, the
    run's and the export's): published on the Hub, they showed the maker's folders."""
    home = "/home/alice/secret project"
    card = _card(data=f"{home}/train.jsonl", base_model=f"{home}/models/bert",
                 train_command=f"tformer train --data '{home}/train.jsonl' --from-pretrained "
                               f"'{home}/models/bert' --valid '{home}/v.csv' --lr 0.001",
                 command=f"tformer export '{home}/runs/r1' --hf '{home}/out dir'")
    assert "/home/alice" not in card and "secret project" not in card
    assert "- data: `train.jsonl`" in card and "base model (fine-tuned): `bert`" in card
    assert "tformer train --data train.jsonl --from-pretrained bert --valid v.csv --lr 0.001" in card
    assert "tformer export r1 --hf 'out dir'" in card
    assert "- data: `synthetic task reverse`" in _card(data="synthetic task reverse")


def test_license_base_model_and_datasets_where_known(tmp_path):
    """A card lacked license, base_model (for a base model read from the Hugging Face cache) and
    datasets. The license is the base model card's (all-MiniLM-L6-v2's: apache-2.0), else
    unknown (the Hub's id for it); the data's Hub name where it was read from the cache."""
    from card_fixtures import check_card

    cache = tmp_path / "hub"
    base = cache / "models--sentence-transformers--all-MiniLM-L6-v2" / "snapshots" / "abc123"
    base.mkdir(parents=True)
    (base / "README.md").write_text("---\nlanguage: en\nlicense: apache-2.0\n---\n# all-MiniLM-L6-v2\n")
    data = cache / "datasets--stanfordnlp--imdb" / "snapshots" / "def456" / "train.jsonl"
    card = _card(base_model=str(base), data=str(data))
    header = _header(card)
    assert header["license"] == "apache-2.0" and header["datasets"] == ["stanfordnlp/imdb"]
    assert header["base_model"] == "sentence-transformers/all-MiniLM-L6-v2"
    assert header["base_model_relation"] == "finetune" and str(tmp_path) not in card
    plain = _header(_card())
    assert plain["license"] == "unknown" and "datasets" not in plain and "base_model" not in plain
    (tmp_path / "README.md").write_text(card)
    check_card(tmp_path / "README.md", private=(str(tmp_path),))


def test_each_kinds_main_metric_is_named_in_the_header_as_the_hub_knows_it():
    """The Hub's metric ids (those of the evaluate library): a tagger's entity F1 is seqeval's, a
    score model's Spearman is spearmanr, a masked LM's perplexity; one id is named once."""
    cases = {"tagging": ({"f1": 0.8, "precision": 0.8, "recall": 0.8}, ["seqeval"]),
             "multilabel": ({"micro_f1": 0.7, "macro_f1": 0.5, "samples_f1": 0.6}, ["f1"]),
             "regression": ({"spearman": 0.6, "pearson": 0.5, "mse": 0.1}, ["spearmanr", "pearsonr"]),
             "reranking": ({"mrr_at_10": 0.6, "ndcg_at_10": 0.5}, ["mrr", "ndcg"]),
             "masked_lm": ({"perplexity": 30.0}, ["perplexity"])}
    for kind, (record, names) in cases.items():
        header = _header(_card(kind=kind, main_metric=next(iter(record)), metrics={"split": "test", **record}))
        assert header["metrics"] == names, (kind, header["metrics"])
