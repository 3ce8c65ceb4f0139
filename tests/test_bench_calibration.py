"""The fold-demo selection of scripts/bench_calibration.py --cv-demos (#21): demos come only from the training
part of a fold, both answers of a question together, the same for the same seed."""

import importlib
import sys
from pathlib import Path

import dspy
import pytest

from halluscope.optimize.cv import make_folds

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "scripts"))
bench = importlib.import_module("bench_calibration")


def _cases(n_questions=20):
    return [dspy.Example(id=f"{q}-{label}", source_id=q, label=label, question=f"q{q}", answer="a", context="k")
            for q in range(n_questions) for label in (0, 1)]


def test_fold_demos_come_from_the_training_part_in_pairs():
    cases = _cases()
    folds = make_folds(cases, 5, 0, group_by="source_id")
    demos = bench.fold_demos(cases, folds, 4, seed=0)
    assert len(demos) == 5
    for fold, shown in zip(folds, demos):
        held_q = {cases[j].source_id for j in fold}
        assert len(shown) == 4
        assert not {ex.source_id for ex in shown} & held_q
        by_q = {}
        for ex in shown:
            by_q.setdefault(ex.source_id, set()).add(ex.label)
        assert len(by_q) == 2 and all(labels == {0, 1} for labels in by_q.values())


def test_fold_demos_are_deterministic_by_seed_and_differ_across_seeds():
    cases = _cases()
    folds = make_folds(cases, 5, 0, group_by="source_id")
    ids = lambda seed: [[ex.id for ex in d] for d in bench.fold_demos(cases, folds, 4, seed)]  # noqa: E731
    assert ids(0) == ids(0)
    assert ids(0) != ids(1)
    assert len({tuple(d) for d in ids(0)}) > 1  # each fold draws its own questions


def test_fold_demos_refuses_an_odd_count_or_too_few_training_questions():
    cases = _cases(3)
    folds = make_folds(cases, 3, 0, group_by="source_id")
    with pytest.raises(SystemExit, match="even number"):
        bench.fold_demos(cases, folds, 3, seed=0)
    with pytest.raises(SystemExit, match="fewer than"):
        bench.fold_demos(cases, folds, 6, seed=0)
