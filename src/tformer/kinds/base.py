"""What one job tformer trains is: a `Kind`, declared once in its own module.

    KIND = Kind(Classification, ClassificationRun)

A kind's module holds everything about the job (transformers adds a task the same way: one
``BertFor...`` class owning its loss and forward, and a line in an Auto mapping):

    objective   a tformer.training.objective.Objective subclass: the record fields that choose
                the kind and how a record is read and checked (``fields``), its defaults on
                your data (``preset``), the options only it reads or it refuses, its loss, its
                one inference forward, its scores and its trivial baseline
    run         a tformer.kinds.run.Run subclass: its verbs, its exports (and the model card's
                pipeline tag) and the server protocols it answers

and one line in tformer.kinds registers it. Nothing outside the module asks which kind a run is.
"""

from __future__ import annotations

from dataclasses import dataclass

from tformer.training.records import Fields


@dataclass(frozen=True)
class Kind:
    """One kind: its objective (the training side: fields, preset, loss, forward, scores and
    baseline, as class attributes and methods) and its run (the verbs, exports and protocols)."""

    objective: type  # an Objective subclass
    run: type  # a Run subclass

    @property
    def name(self) -> str:
        """data.json's "objective", and what reports and errors call the job."""
        return self.objective.kind

    @property
    def fields(self) -> Fields:
        return self.objective.fields

    @property
    def reads(self) -> tuple[str, ...]:
        return self.objective.reads

    @property
    def verb(self) -> str:
        """The command that runs this kind on inputs (predict, generate, embed...)."""
        return self.run.verb
