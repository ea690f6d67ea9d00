"""A model card's YAML header checked against the Hub's model card spec and the installed
transformers: what `tformer export` writes must be metadata the Hub and the library both read."""

from __future__ import annotations

import re
from pathlib import Path

import yaml

# The Hub's pipeline types: PIPELINE_DATA's keys in huggingface.js (packages/tasks/src/pipelines.ts),
# which the Hub's model pages, filters and widgets read a card's pipeline_tag against.
HUB_PIPELINE_TAGS = frozenset("""
biology text-classification token-classification table-question-answering question-answering
zero-shot-classification translation summarization feature-extraction text-generation text2text-generation
fill-mask sentence-similarity text-to-speech text-to-audio automatic-speech-recognition audio-to-audio
audio-classification audio-text-to-text voice-activity-detection depth-estimation image-classification
object-detection image-segmentation text-to-image image-to-text image-to-image image-to-video
unconditional-image-generation video-classification reinforcement-learning robotics tabular-classification
tabular-regression tabular-to-text table-to-text multiple-choice text-ranking text-retrieval
time-series-forecasting text-to-video image-text-to-text visual-question-answering document-question-answering
zero-shot-image-classification graph-ml mask-generation zero-shot-object-detection text-to-3d image-to-3d
image-feature-extraction video-text-to-text keypoint-detection visual-document-retrieval any-to-any other
""".split())
# The metadata keys of the Hub's model card spec (hub-docs modelcard.md and its model card guide)
# that tformer writes.
SPEC_KEYS = {"language", "license", "library_name", "tags", "datasets", "metrics", "model-index",
             "pipeline_tag", "base_model", "base_model_relation"}


def card_header(card: str) -> dict:
    assert card.startswith("---\n"), card[:80]
    return yaml.safe_load(card[4 : card.index("\n---\n", 4)])


def check_card(path: Path, private: tuple[str, ...] = ()) -> dict:
    """The header of the card at ``path``, checked: its keys the spec's, its pipeline_tag one the
    Hub lists and (for library_name transformers) one the installed transformers' pipeline()
    takes, its license an id, its base_model and datasets Hub names; and ``private`` (local
    folders) nowhere in the card."""
    from transformers.pipelines import get_supported_tasks

    text = path.read_text(encoding="utf-8")
    header = card_header(text)
    assert set(header) <= SPEC_KEYS, set(header) - SPEC_KEYS
    tag = header.get("pipeline_tag")
    if tag is not None:
        assert tag in HUB_PIPELINE_TAGS, tag
        if header["library_name"] == "transformers":
            assert tag in get_supported_tasks(), f"pipeline_tag {tag!r}: not a task of the installed transformers"
    assert re.fullmatch(r"[a-z0-9][\w.+-]*", header["license"]), header["license"]
    for name in [header.get("base_model"), *header.get("datasets", [])]:
        assert name is None or re.fullmatch(r"[\w.-]+/[\w.-]+", name), name
    for folder in private:
        assert folder not in text, f"{path}: names the local folder {folder}"
    return header
