"""The plain functions of scripts/bench_reanchor.py (#21 round four): the decision probability read per case,
the quote labels of the Mu-SHROOM report, the cut point and its cross-validation."""

import importlib
import sys
from pathlib import Path

import numpy as np
import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "scripts"))
bench = importlib.import_module("bench_reanchor")


def test_positive_probability_takes_the_largest_p_hallucinated_over_booleans_and_choices():
    log = [
        (None, "verdict", {"noul": 0.3}),
        (None, "label", {"probabilities": {"correct": 0.2, "hallucinated": 0.7, "unverifiable": 0.1},
                         "confidence": 0.7}),
        (None, "rating", {"probabilities": {"accurate": 0.5, "contradiction": 0.4, "neutral": 0.1},
                          "confidence": 0.5}),
    ]
    assert bench.positive_probability(log) == pytest.approx(0.7)
    assert bench.positive_probability(log[2:]) == pytest.approx(0.4)
    assert bench.positive_probability(log[:1]) == pytest.approx(0.3)


def test_positive_probability_is_none_without_a_decision_it_can_read():
    assert bench.positive_probability([]) is None
    # a Choice without a "hallucinated" label, and evidence that is not a dict, are not read
    assert bench.positive_probability([(None, "x", {"probabilities": {"a": 0.6, "b": 0.4}, "confidence": 0.6}),
                                       (None, "y", 0.9)]) is None


def test_quote_labels_need_half_of_the_quote_inside_gold():
    gold = [[10, 20]]
    spans = [(10, 20, 0.9),   # inside
             (15, 25, 0.1),   # half inside: counts
             (16, 26, 0.5),   # 4 of 10 inside: not
             (0, 5, 0.2),     # outside
             (12, 12, 0.3)]   # empty, at a gold character
    assert bench.quote_labels(spans, gold) == [True, True, False, False, True]
    assert bench.quote_labels(spans, []) == [False] * 5


def test_best_cut_separates_and_prefers_a_cut_near_one_half_on_ties():
    y = np.array([False, False, True, True])
    s = np.array([0.1, 0.2, 0.8, 0.9])
    cut = bench.best_cut(y, s)
    assert 0.2 < cut < 0.8 and cut == pytest.approx(0.5)
    # a constant score cannot separate: the best balanced accuracy is 0.5
    cut = bench.best_cut(y, np.full(4, 0.7))
    assert bench._bacc(y, np.full(4, 0.7) >= cut) == 0.5


def test_cv_cut_fits_on_the_other_folds_and_skips_folds_without_decisions():
    # items 0..3; decisions 0,1 belong to item 0, 2 to item 1, 3 to item 2; item 3 has none
    y = np.array([True, False, True, False])
    s = np.array([0.9, 0.1, 0.8, 0.2])
    items = [0, 0, 1, 2]
    folds = [[0], [1, 2], [3]]
    per = bench.cv_cut(y, s, items, folds)
    assert [k for k, _, _ in per] == [0, 1]  # fold 2 holds no decision
    k0, cut0, held0 = per[0]
    # fold 0 held out: the cut is chosen on decisions 2 and 3 (0.8 hallucinated, 0.2 right) only
    assert 0.2 < cut0 <= 0.8 and held0 == 1.0
    # fold 1 held out: chosen on item 0's decisions, scored on items 1 and 2
    assert per[1][2] == 1.0
    # a held-out score that contradicts the training part scores below chance
    per = bench.cv_cut(np.array([True, False, False, True]), s, items, folds)
    assert per[1][2] == 0.0
