"""Fixtures shared by the training tests."""

import pytest
from hf_bert_fixtures import WORDS, make_bert_dir
from text_fixtures import near_pair_rows, write


@pytest.fixture(scope="session")
def embedding_fine_tune(tmp_path_factory) -> dict[str, str]:
    """The options of a sentence-embedding fine-tune of a tiny random BERT that already ranks its
    pairs well (validation MRR@10 about 0.8 before any update): --from-pretrained, --data, and
    --valid and --test files of 64 pairs each."""
    root = tmp_path_factory.mktemp("embedding-fine-tune")
    words = tuple(WORDS)  # the tiny BERT's own vocabulary: no [UNK]
    return {"from_pretrained": str(make_bert_dir(root / "bert")),
            "data": str(write(root / "train.jsonl", near_pair_rows(200, 0, words))),
            "valid": str(write(root / "valid.jsonl", near_pair_rows(64, 1, words))),
            "test": str(write(root / "test.jsonl", near_pair_rows(64, 2, words)))}
