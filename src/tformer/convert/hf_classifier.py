"""Trained encoders out to the tools users take them to.

- `export_classifier(run_dir, out)`: a fine-tuned classifier as a transformers
  BertForSequenceClassification directory (AutoModelForSequenceClassification loads it):
  the encoder through hf_bert's key table, plus one row for the head.
- `save_sentence_layout(model, run_dir, max_length)`: an embedding model in the
  sentence-transformers layout (modules.json, 0_Transformer/ as a BERT directory,
  1_Pooling/, 2_Normalize/), so `SentenceTransformer(run_dir)` and `tformer embed run_dir`
  both load it.
"""

from __future__ import annotations

import json
from pathlib import Path

from safetensors.torch import save as st_save

from tformer.convert import hf_bert
from tformer.convert.st_layout import _POOLING_KEYS
from tformer.files import write_atomic, write_json_atomic

# (their key, our key): the classification head; the encoder's rows are hf_bert's, under "bert.".
HEAD_ROWS = (("classifier.weight", "head.weight"), ("classifier.bias", "head.bias"))


def classifier_state_to_hf(state: dict, config) -> dict:
    """TextClassifier state dict (encoder.*, head.*) -> BertForSequenceClassification's."""
    encoder = {k[len("encoder."):]: v for k, v in state.items() if k.startswith("encoder.")}
    out = {f"bert.{k}": v for k, v in hf_bert.to_hf(encoder, config).items()}
    for theirs, ours in HEAD_ROWS:
        out[theirs] = state[ours]
    return {k: v.detach().contiguous().clone() for k, v in out.items()}


def export_classifier(run_dir: str | Path, out: str | Path) -> Path:
    """Write `out` as a BertForSequenceClassification directory with the run's tokenizer."""
    from tformer.training.data_objectives import Classification
    from tformer.training.loop import load_run

    run_dir, out = Path(run_dir), Path(out)
    model, source, _ = load_run(run_dir)
    if not isinstance(source, Classification):
        raise ValueError(f"RUN_DIR: {run_dir} is not a classification run on your data; "
                         "--hf exports text+label classifiers")
    config = model.config
    if not config.pooler:
        raise ValueError(
            f"RUN_DIR: {run_dir} pools by mean (its encoder has no BERT pooler), which "
            "BertForSequenceClassification cannot express; fine-tune a checkpoint with a pooler "
            "(BertModel) to export with --hf"
        )
    labels = source.data.labels
    hf_config = hf_bert.config_to_hf(config.replace(n_classes=None))
    hf_config.update({
        "architectures": ["BertForSequenceClassification"],
        "num_labels": len(labels),
        "id2label": {str(i): name for i, name in enumerate(labels)},
        "label2id": {name: i for i, name in enumerate(labels)},
        "problem_type": "single_label_classification",
        "classifier_dropout": None,
    })
    out.mkdir(parents=True, exist_ok=True)
    write_json_atomic(out / "config.json", hf_config)
    state = classifier_state_to_hf(model.state_dict(), config)
    write_atomic(out / hf_bert.WEIGHTS_FILE, st_save(state, metadata={"format": "pt"}))
    write_tokenizer_files(run_dir / "tokenizer.json", out, config.max_len)
    return out


def write_tokenizer_files(tokenizer_json: Path, out: Path, max_length: int) -> None:
    """tokenizer.json plus a tokenizer_config.json naming the special tokens, so that
    transformers' AutoTokenizer builds a PreTrainedTokenizerFast from the file as it is."""
    from tokenizers import Tokenizer

    backend = Tokenizer.from_file(str(tokenizer_json))
    vocab = backend.get_vocab()
    names = {"pad_token": ("<pad>", "[PAD]"), "cls_token": ("<s>", "[CLS]"),
             "sep_token": ("</s>", "[SEP]"), "unk_token": ("<unk>", "[UNK]"),
             "mask_token": ("<mask>", "[MASK]")}
    config = {"tokenizer_class": "PreTrainedTokenizerFast", "model_max_length": max_length}
    for key, candidates in names.items():
        for token in candidates:
            if token in vocab:
                config[key] = token
                break
    out.mkdir(parents=True, exist_ok=True)
    write_atomic(out / "tokenizer.json", tokenizer_json.read_bytes())
    write_json_atomic(out / "tokenizer_config.json", config)


def save_sentence_layout(model, run_dir: Path, max_length: int) -> None:
    """Write the sentence-transformers modules of an embedding run into `run_dir`."""
    from tformer.pretrained import export_hf

    transformer = run_dir / "0_Transformer"
    export_hf(model.encoder, transformer)
    write_tokenizer_files(run_dir / "tokenizer.json", transformer, max_length)
    write_json_atomic(transformer / "sentence_bert_config.json",
                      {"max_seq_length": max_length, "do_lower_case": False})
    pooling = {"word_embedding_dimension": model.config.d_model}
    pooling.update({key: mode in model.pooling for mode, key in _POOLING_KEYS.items()})
    (run_dir / "1_Pooling").mkdir(exist_ok=True)
    write_json_atomic(run_dir / "1_Pooling" / "config.json", pooling)
    (run_dir / "2_Normalize").mkdir(exist_ok=True)
    modules = [
        {"idx": 0, "name": "0", "path": "0_Transformer", "type": "sentence_transformers.models.Transformer"},
        {"idx": 1, "name": "1", "path": "1_Pooling", "type": "sentence_transformers.models.Pooling"},
        {"idx": 2, "name": "2", "path": "2_Normalize", "type": "sentence_transformers.models.Normalize"},
    ]
    write_atomic(run_dir / "modules.json", json.dumps(modules, indent=2).encode())
