"""How a multi-label run should choose its thresholds, measured on finished runs: the test split's
F1 scores when the thresholds are chosen on the validation split in each way.

    python benchmarks/multilabel_thresholds.py RUN [RUN ...]

For each run (a multi-label run of `tformer train`), its weights' probabilities on the validation
sample a run validates on (the split's first 500 records, EVAL_SAMPLE) and on the whole test
split, and the test micro-/macro-F1 at:

  0.5              every label at sigmoid >= 0.5 (transformers' recipe)
  shared           the one threshold best for micro-F1 on validation, for every label
  per-label m=M    each label's F1-best threshold on validation where validation holds at least
                   M records of it, the shared one below (tformer.training.label_sets with
                   min_positives=M; M=1: every label with a positive its own)
"""

from __future__ import annotations

import argparse

import numpy as np


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("runs", nargs="+")
    args = parser.parse_args()

    import tformer
    from tformer.kinds.multilabel import sigmoid
    from tformer.training.label_sets import Counts, best_cut, choose_thresholds
    from tformer.training.objective import validation_sample

    print("| run | validation / test records | 0.5 | shared | m=1 | m=3 | m=5 | m=10 | m=20 |")
    print("|---|---|---|---|---|---|---|---|---|")
    for path in args.runs:
        run = tformer.load_run(path)
        objective = run.objective
        valid = validation_sample("validation", objective.examples("validation"))
        test = objective.examples("test")
        p_valid = sigmoid(np.array(objective.predict(run.model, valid)))
        p_test = sigmoid(np.array(objective.predict(run.model, test)))
        t_valid, t_test = objective.truth(valid), objective.truth(test)

        def scored(thresholds, p_test=p_test, t_test=t_test) -> str:
            m = Counts.of(p_test >= np.asarray(thresholds, dtype=np.float32), t_test).metrics()
            return f"{m['micro_f1']:.4f} / {m['macro_f1']:.4f}"

        shared, _ = best_cut(p_valid.ravel(), t_valid.ravel())
        cells = [scored(np.full(p_test.shape[1], 0.5)), scored(np.full(p_test.shape[1], shared))]
        cells += [scored(choose_thresholds(p_valid, t_valid, m)) for m in (1, 3, 5, 10, 20)]
        print(f"| {path} | {len(valid)} / {len(test)} | " + " | ".join(cells) + " |", flush=True)


if __name__ == "__main__":
    main()
