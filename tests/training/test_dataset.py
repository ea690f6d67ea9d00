"""A data run's data: the one-pass build, the seeded split, held-out files, the stream."""

import json
import random

import pytest
from helpers import build_data, data_objective
from text_fixtures import classification_rows, embedding_rows, seq2seq_rows, write

from tformer.kinds import kind_of_config, resolve_config
from tformer.kinds.seq2seq import FIELDS as SEQ2SEQ_FIELDS
from tformer.training.dataset import TextData
from tformer.training.examples import Seq2SeqExample
from tformer.training.stream import bucket

input_key = SEQ2SEQ_FIELDS.input_key


def _error(tmp_path, name, text, **config):
    path = tmp_path / name
    path.write_text(text, encoding="utf-8")
    with pytest.raises(ValueError) as e:
        build_data(resolve_config({"data": str(path), **config}), tmp_path / "run", write=False)
        data = build_data(resolve_config({"data": str(path), **config}), None, write=False)
        data.held_out("test")
    message = str(e.value)
    assert "\n" not in message
    return message


@pytest.mark.parametrize("name, text, message", [
    ("bad.jsonl", '{"source": "a", "target": "b"}\n{"source": "a",\n', "bad.jsonl:2: not valid JSON"),
    ("miss.jsonl", '{"source": "a", "target": "b"}\n\n{"source": "c"}\n',
     "miss.jsonl:3: missing field 'target'"),
    ("empty.jsonl", '{"text": "a", "label": "x"}\n{"text": " ", "label": "y"}\n',
     "empty.jsonl:2: text: expected text, got an empty string"),
    ("cols.csv", "source,target\na,b\nc,d,e\n", "cols.csv:3: expected 2 columns"),
    ("none.jsonl", '{"question": "a", "answer": "b"}\n', "none.jsonl:1: expected fields text+label, source+target"),
    ("one.jsonl", '{"text": "a", "label": "x"}\n{"text": "b", "label": "x"}\n',
     "label: expected at least 2 distinct labels"),
    ("type.jsonl", '{"text": ["a"], "label": "x"}\n', "type.jsonl:1: text: expected a string, got list"),
])
def test_bad_input_names_the_file_and_line(tmp_path, name, text, message):
    assert message in _error(tmp_path, name, text)


def test_unknown_label_in_valid_names_its_line(tmp_path):
    train = write(tmp_path / "t.jsonl", classification_rows(20))
    valid = tmp_path / "v.jsonl"
    valid.write_text('{"text": "a cat", "label": "animal"}\n{"text": "x", "label": "plant"}\n')
    with pytest.raises(ValueError, match=r"v.jsonl:2: label 'plant' is not one of the training labels"):
        build_data(resolve_config({"data": str(train), "valid": str(valid)}), None, write=False)


def test_seeded_split_keeps_each_text_in_one_split(tmp_path):
    rows = seq2seq_rows(400)
    rows += rows[:100]  # duplicated sources must still land in a single split
    path = write(tmp_path / "d.jsonl", rows)
    data = build_data(resolve_config({"data": str(path), "vocab_size": 300}), None, write=False)
    keys = {s: {input_key(r) for r in data.held_out(s)} for s in ("validation", "test")}
    keys["train"] = {input_key(r) for pool in data.epoch_pools() for r in pool}
    assert keys["validation"] and keys["test"]
    assert not (keys["train"] & keys["test"] or keys["train"] & keys["validation"]
                or keys["validation"] & keys["test"])
    other = build_data(resolve_config({"data": str(path), "vocab_size": 300, "seed": 1}), None,
                           write=False)
    assert {input_key(r) for r in other.held_out("test")} != keys["test"]  # the seed chooses


def test_given_valid_file_removes_its_texts_from_training(tmp_path):
    rows = seq2seq_rows(50)
    train = write(tmp_path / "t.jsonl", rows)
    valid = write(tmp_path / "v.jsonl", rows[:5])
    data = build_data(resolve_config({"data": str(train), "valid": str(valid), "vocab_size": 300}),
                          None, write=False)
    train_keys = {input_key(r) for pool in data.epoch_pools() for r in pool}
    assert not train_keys & {r["source"] for r in rows[:5]}


def test_batches_respect_the_token_budget_and_bucket_by_length():
    rng = random.Random(0)
    examples = [Seq2SeqExample([1] * rng.randint(1, 60), [2] * rng.randint(1, 60)) for _ in range(500)]
    batches = bucket(examples, 400, random.Random(1))
    assert sum(len(b) for b in batches) == 500
    for b in batches:
        widest = max(e.cost for e in b)
        assert len(b) == 1 or len(b) * widest <= 400
    spread = [max(e.cost for e in b) - min(e.cost for e in b) for b in batches]
    assert sum(spread) / len(spread) < 10  # similar lengths together


def test_train_stream_is_seeded_and_resumable(tmp_path):
    path = write(tmp_path / "d.jsonl", seq2seq_rows(200))
    config = resolve_config({"data": str(path), "vocab_size": 300, "max_tokens": 200})
    data = data_objective(build_data(config, None, write=False), config)
    first = [b.src for _, b in zip(range(30), data.train_batches(0), strict=False)]
    again = [b.src for _, b in zip(range(10), data.train_batches(20), strict=False)]
    assert all(a.equal(b) for a, b in zip(first[20:], again, strict=True))
    rank1 = [b.src for _, b in zip(range(5), data.train_batches(0, rank=1, world=2), strict=False)]
    assert all(a.equal(b) for a, b in zip(first[1::2], rank1, strict=False))


@pytest.mark.parametrize("pool", [4096, 50])  # the whole set in one pool; four pools, new each epoch
def test_each_training_record_is_tokenized_once_and_batched_as_if_tokenized_each_epoch(tmp_path, monkeypatch,
                                                                                       pool):
    """4,800 manual pages, tokenized again each pass, took 4.4 s of a fine-tune's time a pass
    (beside busy processes, 16 s of a 2-minute run's 65 s of updates): each record is tokenized
    once; the batches are those of an encoding made again each epoch, epoch after epoch."""
    from tformer.training import dataset
    from tformer.training import objective as objective_module

    monkeypatch.setattr(dataset, "POOL", pool)
    path = write(tmp_path / "d.jsonl", seq2seq_rows(200))
    config = resolve_config({"data": str(path), "vocab_size": 300, "max_tokens": 200})
    objective = data_objective(build_data(config, None, write=False), config)
    encoded, encode = [], objective.encode

    def counted(records):
        encoded.extend(json.dumps(r, sort_keys=True) for r in records)
        return encode(records)

    objective.encode = counted
    batches = objective.train_batches(0)
    monkeypatch.setattr(objective_module, "remembered", lambda encode: encode)  # tokenized each epoch
    again = data_objective(build_data(config, None, write=False), config).train_batches(0)
    for _ in range(100):
        a, b = next(batches), next(again)
        assert a.src.equal(b.src) and a.tgt_in.equal(b.tgt_in)
    records = [json.dumps(r, sort_keys=True) for p in objective.source.data.epoch_pools(0) for r in p]
    assert batches.epoch >= 3 and set(encoded) == set(records), batches.epoch
    assert len(encoded) <= len(records)  # each once (a duplicate of one made already: not again)


def _objective(tmp_path, rows, **options):
    path = write(tmp_path / "d.jsonl", rows)
    config = resolve_config({"data": str(path), "vocab_size": 300, **options})
    return data_objective(build_data(config, None, write=False), config)


def test_a_text_pair_is_encoded_whatever_its_neighbour_holds(tmp_path):
    objective = _objective(tmp_path, classification_rows(60, pair=True))
    paired = {"text": "a big cat", "text_pair": "the house", "label": "animal"}
    alone = objective.encode([paired])[0]
    after_unpaired = objective.encode([{"text": "a dog", "label": "animal"}, paired])[1]
    assert after_unpaired == alone and 1 in alone.text.type_ids


def test_hard_negatives_are_kept_per_record(tmp_path):
    rows = [{"anchor": f"a{i} cat", "positive": f"A{i} CAT", **({"negative": "dog"} if i % 2 else {})}
            for i in range(200)]
    objective = _objective(tmp_path, rows)
    examples = objective.encode([rows[0], rows[1]])  # the first has no negative
    assert examples[0].negative is None and examples[1].negative is not None
    batch = objective.collate(examples)
    assert batch.negative.input_ids.shape[0] == 1  # one hard negative, never the positive


def test_the_file_is_read_once_to_build_a_run(tmp_path, monkeypatch):
    from tformer.training import dataset

    reads = []
    real = dataset.read_records
    monkeypatch.setattr(dataset, "read_records", lambda *a, **k: reads.append(a[0]) or real(*a, **k))
    path = write(tmp_path / "d.jsonl", seq2seq_rows(200))
    data = build_data(resolve_config({"data": str(path), "vocab_size": 300}), None, write=False)
    assert data.held_out("test") and data.held_out("validation")
    assert len(reads) == 1  # the objective's peek reads one line and stops; no second pass


def test_resume_refuses_a_changed_data_file_and_keeps_the_runs_labels(tmp_path):
    path = write(tmp_path / "d.jsonl", classification_rows(80))
    config = resolve_config({"data": str(path), "vocab_size": 300})
    run = tmp_path / "run"
    run.mkdir()
    build_data(config, run)
    saved = (run / "data.json").read_bytes()
    write(path, classification_rows(80) + [{"text": "zzz", "label": "zzz"}])
    with pytest.raises(ValueError, match=r"data: .*d.jsonl changed since the run started"):
        build_data(config, run)
    assert (run / "data.json").read_bytes() == saved  # never rewritten


def test_a_file_sorted_by_label_trains_on_every_label_in_every_pool(tmp_path, monkeypatch):
    from tformer.training import dataset

    monkeypatch.setattr(dataset, "POOL", 50)
    rows = sorted(classification_rows(400), key=lambda r: r["label"])  # all "animal", then "place"
    config = resolve_config({"data": str(write(tmp_path / "d.jsonl", rows)), "vocab_size": 300})
    data = build_data(config, None, write=False)
    epochs = [list(data.epoch_pools(epoch)) for epoch in (0, 1)]
    held_out = {r["text"] for split in ("validation", "test") for r in data.held_out(split)}
    train = sorted(str(r) for r in rows if r["text"] not in held_out)  # the file minus held-out
    for pools in epochs:
        assert sorted(str(r) for pool in pools for r in pool) == train  # each record once an epoch
        for pool in pools:
            share = sum(r["label"] == "animal" for r in pool) / len(pool)
            assert 0.2 < share < 0.8, share  # file order would give 1.0 or 0.0
    assert epochs[0] != epochs[1]  # a new order every epoch...
    assert list(data.epoch_pools(0)) == epochs[0]  # ...the same one again (resuming)
    assert data._train_places().nbytes == 16 * len(train)  # the memory an epoch keeps


def test_the_tokenizer_learns_from_all_of_a_sorted_file_not_its_first_lines(tmp_path, monkeypatch):
    from text_fixtures import ANIMALS, PLACES

    from tformer.training import splits

    rows = sorted(classification_rows(400), key=lambda r: r["label"])  # all "animal", then "place"
    config = resolve_config({"data": str(write(tmp_path / "d.jsonl", rows)), "vocab_size": 300})
    _, everything = TextData._scan(config, kind_of_config(config).fields)
    monkeypatch.setattr(splits, "TOKENIZER_SAMPLE", 60)
    _, sample = TextData._scan(config, kind_of_config(config).fields)
    assert 40 <= len(sample) <= 60 and set(sample) <= set(everything)  # held-out texts stay out
    words = " ".join(sample).split()
    assert set(ANIMALS) & set(words) and set(PLACES) & set(words)  # the first lines: animals only
    monkeypatch.setattr(splits, "TOKENIZER_CHARS", 500)
    _, sample = TextData._scan(config, kind_of_config(config).fields)
    assert 400 <= sum(map(len, sample)) <= 500


def test_a_small_file_holds_out_at_least_one_record_in_each_split(tmp_path):
    """5% of 40 records is 2 a split on average, and at times none (examples/en_de.jsonl left
    its test split empty): a small file's share grows until each split has one, no more."""
    from pathlib import Path

    from tformer.training.splits import SPLIT_FRACTION, small_file_fraction

    assert small_file_fraction([0.03, 0.07, 0.5], SPLIT_FRACTION, {"test", "validation"}) == SPLIT_FRACTION
    raised = small_file_fraction([0.08, 0.15, 0.5], SPLIT_FRACTION, {"test", "validation"})
    assert 0.08 < raised < 0.0801  # just past the first unit: test {0.08}, validation {0.15}
    assert small_file_fraction([0.08, 0.5], SPLIT_FRACTION, {"test"}) > 0.08  # only test hashed
    assert small_file_fraction([0.9], SPLIT_FRACTION, {"test"}) == SPLIT_FRACTION  # none can: the error
    example = Path(__file__).parents[2] / "examples" / "en_de.jsonl"
    for path in (example, write(tmp_path / "c.jsonl", classification_rows(30))):
        data = build_data(resolve_config({"data": str(path), "vocab_size": 260}), None, write=False)
        test, valid = data.held_out("test"), data.held_out("validation")
        assert test and valid and len(test) + len(valid) <= 0.5 * data.identity["data"]["records"]


@pytest.mark.parametrize("n", [40, 3000])  # a small file (its own held-out share) and a larger one
def test_a_label_whose_records_are_all_held_out_is_named(tmp_path, n):
    """A label whose only texts hash into a held-out split is one the model never trains on: the
    run says so (it was silent), and a label with a training record is not named."""
    from tformer.training.splits import unit_hash

    held = next(t for t in (f"a rare text {i}" for i in range(10_000)) if unit_hash(f"{t}\t", 0) < 0.01)
    rows = classification_rows(n) + [{"text": held, "label": "rare"}, {"text": "a b", "label": "seen"},
                                     {"text": "the mat", "label": "seen"}, {"text": "dog cat", "label": "seen"}]
    path = write(tmp_path / "d.jsonl", rows)
    data = build_data(resolve_config({"data": str(path), "vocab_size": 260}), None, write=False)
    assert data.untrained == {"rare": ["test"]}
    assert "rare" in data.labels and [r["text"] for r in data.held_out("test") if r["label"] == "rare"] == [held]


def test_a_given_held_out_file_without_records_is_named_not_blamed_on_the_split(tmp_path):
    train = write(tmp_path / "train.csv", classification_rows(40))
    (tmp_path / "test.csv").write_text("text,label\n")
    with pytest.raises(ValueError, match=r"test.csv: expected at least one record, got only the header row "
                                         r"\(text, label\)$"):
        build_data(resolve_config({"data": str(train), "test": str(tmp_path / "test.csv")}), None, write=False)


def test_a_training_file_wholly_held_out_by_the_given_files_is_named(tmp_path):
    """--test FILE equal to --data: training skips every record; it said the validation split was empty."""
    train = write(tmp_path / "train.csv", classification_rows(40))
    with pytest.raises(ValueError, match=r"train.csv: expected training records, got none: the input text of "
                                         r"each of its 40 record\(s\) is held out by --test .*train.csv$"):
        build_data(resolve_config({"data": str(train), "test": str(train)}), None, write=False)


def test_a_fine_tunes_max_length_past_its_models_is_refused_not_lowered_unsaid(tmp_path):
    """--max-length 1000 on all-MiniLM-L6-v2 (at most 256) trained at 256 without a word; the
    preset's length (not the user's) is still lowered to the model's quietly."""
    from hf_bert_fixtures import MAX_POSITIONS, bert_dir

    data = write(tmp_path / "d.jsonl", classification_rows(40))
    given = {"data": str(data), "from_pretrained": str(bert_dir())}
    with pytest.raises(ValueError, match=rf"^max_length: expected at most {MAX_POSITIONS} \(the maximum length "
                                         rf"of .*bert\), got {MAX_POSITIONS + 1}$"):
        build_data(resolve_config({**given, "max_length": MAX_POSITIONS + 1}), None, write=False)
    ok = build_data(resolve_config({**given, "max_length": MAX_POSITIONS}), None, write=False)
    assert ok.tokenizer.max_length == MAX_POSITIONS
    pairs = write(tmp_path / "e.jsonl", embedding_rows(40))
    preset = resolve_config({"data": str(pairs), "from_pretrained": str(bert_dir())})
    assert preset.max_length > MAX_POSITIONS  # (else the next line tests nothing)
    assert build_data(preset, None, write=False).tokenizer.max_length == MAX_POSITIONS


def test_remembered_encodings_stop_at_their_memory_bound(monkeypatch):
    from tformer.training import stream

    monkeypatch.setattr(stream, "MEMO_TOKENS", 5)  # ids kept at most (each example here costs 2)
    calls = []

    def encode(records):
        calls.extend(r["text"] for r in records)
        return [Seq2SeqExample([1], [2]) for _ in records]

    encode_once = stream.remembered(encode)
    records = [{"text": str(i)} for i in range(6)]
    assert len(encode_once(records)) == 6 and len(encode_once(records[::-1])) == 6
    assert calls == [*"012345", "5", "4", "3"]  # 0, 1, 2 kept (6 ids: the bound reached), 3-5 made again
