"""What a tagging run's records hold: tokens and as many tags, checked and read as IOB2
(tformer.kinds.tagging trains on them)."""

from __future__ import annotations

from typing import Any

from tformer.training import entities as ent
from tformer.training.records import Fields, Record, check_encodable


class TagFields(Fields):
    """tokens (a list of strings, or one string split at whitespace) and as many tags (or
    ner_tags): checked (tformer.training.entities.check_tags) and written as IOB2."""

    def chosen_by(self, names: set[str]) -> bool:
        return "tokens" in names and bool(names & {"tags", "ner_tags"})

    def check(self, where: str, record: dict[str, Any]) -> Record:
        if "tags" in record and "ner_tags" in record:
            raise ValueError(f"{where}: expected tags or ner_tags, got both")
        name = "tags" if "tags" in record or "ner_tags" not in record else "ner_tags"
        tokens = self._strings(where, "tokens", record)
        tags = self._strings(where, name, record)
        if len(tags) != len(tokens):
            raise ValueError(f"{where}: {name}: expected one tag per token ({len(tokens)}), got {len(tags)}")
        ent.check_tags(tags, where, name)
        return {"tokens": tokens, "tags": ent.to_iob2(tags)}

    @staticmethod
    def _strings(where: str, name: str, record: dict[str, Any]) -> list[str]:
        if name not in record:
            raise ValueError(f"{where}: missing field {name!r} (the record has {', '.join(sorted(record))})")
        value = record[name]
        if isinstance(value, str):
            value = value.split()
        if not isinstance(value, list):
            raise ValueError(f"{where}: {name}: expected a list of strings, got {type(value).__name__}")
        if not value:
            raise ValueError(f"{where}: {name}: expected at least one, got an empty list")
        for i, item in enumerate(value):
            if not isinstance(item, str):
                hint = (" (class ids: write each tag's name, e.g. B-PER, from the data set's label list)"
                        if isinstance(item, int) and name != "tokens" else "")
                raise ValueError(f"{where}: {name}[{i}]: expected a string, got {item!r}{hint}")
            if not item.strip():
                raise ValueError(f"{where}: {name}[{i}]: expected text, got {item!r}")
            check_encodable(where, f"{name}[{i}]", item)
        return value

    def input_key(self, record: Record) -> str:
        return " ".join(record["tokens"])

    def labels_of(self, record: Record) -> tuple[str, ...]:
        if "tags" not in record:
            return ()
        return tuple(ent.label_names(t for t, _, _ in ent.entities(record["tags"])))

    def texts_of(self, record: Record) -> list[str]:
        return [" ".join(record["tokens"])]
