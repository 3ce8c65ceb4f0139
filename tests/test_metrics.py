"""Tests for the metrics package. Expected values are hand-computed; the arithmetic is in comments."""

from __future__ import annotations

import json
import math
import random

import dspy
import pytest
from scipy.stats import spearmanr

from halluscope.core.contract import Detection, Span, hard_labels_from_soft, to_prediction
from halluscope.metrics import (
    METRIC_LEVEL,
    METRICS,
    accuracy,
    aggregate,
    balanced_accuracy,
    classification_report,
    confusion,
    f1,
    get_metric,
    hard_from_soft,
    iou,
    load_jsonl,
    max_iou,
    mcnemar,
    precision,
    recall,
    score_corpus,
    score_files,
    score_item,
    soft_from_hard,
    spearman,
)

# ==================================================================================================
# IoU
# ==================================================================================================


def test_iou_both_empty_is_one():
    assert iou([], []) == 1.0
    assert iou([], [], text_len=10) == 1.0


def test_iou_one_side_empty_is_zero():
    assert iou([[0, 3]], []) == 0.0
    assert iou([], [[0, 3]]) == 0.0


def test_iou_disjoint_and_touching():
    # gold {0..4}, pred {5..9}: intersection 0 -> 0.0 (touching spans share no character)
    assert iou([[0, 5]], [[5, 10]]) == 0.0


def test_iou_partial_overlap():
    # gold {0..9}, pred {5..14}: |G & P| = |{5..9}| = 5, |G | P| = |{0..14}| = 15 -> 5/15
    assert iou([[0, 10]], [[5, 15]]) == pytest.approx(5 / 15)


def test_iou_identical_and_multiple_spans():
    assert iou([[2, 4], [6, 9]], [[2, 4], [6, 9]]) == 1.0
    # gold {2,3} u {6,7,8} (5 chars), pred {3..7} (5 chars): inter {3,6,7} = 3, union {2..8} = 7
    assert iou([[2, 4], [6, 9]], [[3, 8]]) == pytest.approx(3 / 7)


def test_iou_overlapping_predicted_spans_count_each_character_once():
    # pred [0,6) u [4,8) = {0..7} = 8 chars (not 6 + 4 = 10); gold {0..9}
    # inter 8, union 10 -> 0.8
    assert iou([[0, 10]], [[0, 6], [4, 8]]) == pytest.approx(0.8)
    # duplicated predicted span: still {0..4}; gold {0..9} -> 5/10
    assert iou([[0, 10]], [[0, 5], [0, 5]]) == pytest.approx(0.5)
    # one shared character: [0,5) u [4,8) = {0..7} = 8 chars (not 5 + 4 = 9) -> 8/10
    assert iou([[0, 10]], [[0, 5], [4, 8]]) == pytest.approx(0.8)
    assert iou([[0, 5], [4, 8]], [[0, 8]]) == 1.0


def test_iou_empty_and_reversed_spans_cover_nothing():
    # [3, 3) and [5, 2) are empty ranges, exactly as range(*span) in the official scorer
    assert iou([[0, 2]], [[0, 2], [3, 3], [5, 2]]) == 1.0
    assert iou([[69, 69]], []) == 1.0


def test_iou_out_of_range_predictions_clipped_with_text_len():
    # text_len 6, gold {0..3}; pred [2, 10) clipped to {2..5} (4 chars)
    # inter {2,3} = 2, union {0..5} = 6 -> 1/3
    assert iou([[0, 4]], [[2, 10]], text_len=6) == pytest.approx(1 / 3)
    # without text_len the official set arithmetic applies: pred {2..9} (8 chars)
    # inter 2, union {0..9} = 10 -> 0.2
    assert iou([[0, 4]], [[2, 10]]) == pytest.approx(0.2)
    # negative start: [-3, 2) clipped to {0, 1}; gold {0..3}: inter 2, union 4 -> 0.5
    assert iou([[0, 4]], [[-3, 2]], text_len=6) == pytest.approx(0.5)
    # entirely outside the text: clipped to nothing; gold non-empty -> 0.0; gold empty -> 1.0
    assert iou([[0, 4]], [[7, 9]], text_len=6) == 0.0
    assert iou([], [[7, 9]], text_len=6) == 1.0


def test_iou_non_latin_offsets_are_code_points():
    text = "北京是法国的首都。"  # 9 code points, 27 UTF-8 bytes
    start = text.index("法国")  # 3
    assert (start, len(text)) == (3, 9)
    gold = [[start, start + 2]]  # {3, 4}
    # pred {3, 4, 5}: inter 2, union 3 -> 2/3
    assert iou(gold, [[3, 6]], text_len=len(text)) == pytest.approx(2 / 3)
    # pred [3, 20) clipped to {3..8} (6 chars) by the 9-code-point length: 2/6.
    # (a byte length of 27 would keep {3..19}: 2/17)
    assert iou(gold, [[3, 20]], text_len=len(text)) == pytest.approx(2 / 6)


# ==================================================================================================
# Spearman
# ==================================================================================================


def test_spearman_both_constant_is_one():
    assert spearman([], [], 10) == 1.0
    # gold all 1.0 (one value), pred all 0.0 (one value): both constant -> 1.0 (official rule)
    assert spearman([{"start": 0, "end": 10, "prob": 1.0}], [], 10) == 1.0


def test_spearman_one_constant_is_zero():
    # gold all 0 (1 distinct value), pred {0, 0.8} (2 distinct values) -> 0.0
    assert spearman([], [{"start": 0, "end": 2, "prob": 0.8}], 10) == 0.0
    assert spearman([{"start": 0, "end": 2, "prob": 0.8}], [], 10) == 0.0


def test_spearman_constant_rule_rounds_to_8_decimals():
    # pred writes 1e-9 on two characters: round(1e-9, 8) == 0.0, so pred counts as constant.
    # gold is constant too -> 1.0 (without the rounding it would be 0.0)
    assert spearman([], [{"start": 0, "end": 2, "prob": 1e-9}], 5) == 1.0


def test_spearman_hand_checked_non_constant():
    gold = [{"start": 0, "end": 2, "prob": 1.0}, {"start": 2, "end": 3, "prob": 0.5}]
    pred = [{"start": 1, "end": 4, "prob": 0.7}]
    ref_vec = [1.0, 1.0, 0.5, 0.0, 0.0, 0.0]
    pred_vec = [0.0, 0.7, 0.7, 0.7, 0.0, 0.0]
    # average ranks: ref [5.5, 5.5, 4, 2, 2, 2], pred [2, 5, 5, 5, 2, 2]; both means 3.5
    # deviations: ref [2, 2, .5, -1.5, -1.5, -1.5], pred [-1.5, 1.5, 1.5, 1.5, -1.5, -1.5]
    # cov = -3 + 3 + .75 - 2.25 + 2.25 + 2.25 = 3; ss_ref = 15; ss_pred = 13.5
    # rho = 3 / sqrt(15 * 13.5) = 3 / sqrt(202.5)
    expected = 3 / math.sqrt(202.5)
    assert spearman(gold, pred, 6) == pytest.approx(expected, abs=1e-12)
    assert spearman(gold, pred, 6) == pytest.approx(spearmanr(ref_vec, pred_vec).correlation, abs=1e-12)


def test_spearman_perfect_and_inverse():
    gold = [{"start": 0, "end": 2, "prob": 0.9}, {"start": 2, "end": 4, "prob": 0.4}]
    # same ranking with different values -> 1.0
    pred = [{"start": 0, "end": 2, "prob": 0.6}, {"start": 2, "end": 4, "prob": 0.2}]
    assert spearman(gold, pred, 6) == pytest.approx(1.0)
    # ranking reversed on the same 3 value levels: ref [.9,.9,.4,.4,0,0], pred [0,0,.4,.4,.9,.9] -> -1.0
    rev = [{"start": 4, "end": 6, "prob": 0.9}, {"start": 2, "end": 4, "prob": 0.4}]
    assert spearman(gold, rev, 6) == pytest.approx(-1.0)


def test_spearman_later_soft_label_overwrites_earlier():
    # like the official loop: [0,4) = .9, then [2,3) = .1 -> [.9, .9, .1, .9, 0, 0]
    pred = [{"start": 0, "end": 4, "prob": 0.9}, {"start": 2, "end": 3, "prob": 0.1}]
    gold = [{"start": 0, "end": 1, "prob": 1.0}, {"start": 4, "end": 5, "prob": 0.3}]
    ref_vec = [1.0, 0.0, 0.0, 0.0, 0.3, 0.0]
    pred_vec = [0.9, 0.9, 0.1, 0.9, 0.0, 0.0]
    assert spearman(gold, pred, 6) == pytest.approx(spearmanr(ref_vec, pred_vec).correlation, abs=1e-12)


def test_spearman_out_of_range_predictions_are_ignored():
    gold = [{"start": 3, "end": 6, "prob": 1.0}]
    pred = [{"start": 4, "end": 10, "prob": 0.9}, {"start": 50, "end": 60, "prob": 0.2}]
    # only [4, 6) is inside the text: pred vector [0, 0, 0, 0, .9, .9]
    ref_vec = [0.0, 0.0, 0.0, 1.0, 1.0, 1.0]
    pred_vec = [0.0, 0.0, 0.0, 0.0, 0.9, 0.9]
    # ranks ref [2,2,2,5,5,5], pred [2.5]*4 + [5.5]*2; devs ref [-1.5]*3+[1.5]*3, pred [-1]*4+[2]*2
    # cov = (-1.5)(-1)*3 + (1.5)(-1) + (1.5)(2)*2 = 4.5 - 1.5 + 6 = 9
    # ss_ref = 6 * 2.25 = 13.5, ss_pred = 4 + 8 = 12; rho = 9 / sqrt(162)
    assert spearman(gold, pred, 6) == pytest.approx(9 / math.sqrt(162), abs=1e-12)
    assert spearman(gold, pred, 6) == pytest.approx(spearmanr(ref_vec, pred_vec).correlation, abs=1e-12)
    # a negative start is clipped to 0 (not wrapped around like a Python index):
    # [-3, 2) -> characters {0, 1}: pred [.9, .9, 0, 0, 0, 0], ref [0, 0, 0, 1, 1, 1]
    neg = [{"start": -3, "end": 2, "prob": 0.9}]
    expected = spearmanr(ref_vec, [0.9, 0.9, 0.0, 0.0, 0.0, 0.0]).correlation
    assert spearman(gold, neg, 6) == pytest.approx(expected, abs=1e-12)


def test_spearman_non_latin_arabic():
    text = "عاصمة فرنسا هي برلين"  # 20 code points, 37 UTF-8 bytes
    s = text.index("برلين")
    assert (s, len(text)) == (15, 20)
    gold = [{"start": s, "end": s + 5, "prob": 1.0}]
    # a prediction running past the end of the text (as if offsets were bytes) must not crash
    pred = [{"start": s, "end": 37, "prob": 0.8}, {"start": 0, "end": 5, "prob": 0.2}]
    ref_vec = [0.0] * 15 + [1.0] * 5
    pred_vec = [0.2] * 5 + [0.0] * 10 + [0.8] * 5
    got = spearman(gold, pred, len(text))
    assert got == pytest.approx(spearmanr(ref_vec, pred_vec).correlation, abs=1e-12)


def test_spearman_never_nan():
    assert spearman([], [], 0) == 1.0
    gold = [{"start": 0, "end": 2, "prob": 1.0}]
    got = spearman(gold, [{"start": 0, "end": 3, "prob": float("nan")}, {"start": 3, "end": 4, "prob": 0.5}], 5)
    assert not math.isnan(got)


# ==================================================================================================
# max IoU
# ==================================================================================================


def test_max_iou_three_annotators():
    pred = [[0, 10]]
    annotations = {
        "a1": [[0, 4]],  # inter 4, union 10 -> 0.4
        "a2": [[5, 15]],  # inter 5, union 15 -> 1/3
        "a3": [[0, 8]],  # inter 8, union 10 -> 0.8  <- best
    }
    assert max_iou(annotations, pred) == pytest.approx(0.8)
    assert max_iou(list(annotations.values()), pred) == pytest.approx(0.8)


def test_max_iou_annotator_with_no_spans_and_clipping():
    # an annotator who marked nothing agrees perfectly with an empty prediction
    assert max_iou({"a": [[0, 3]], "b": []}, []) == 1.0
    # pred [2, 10) clipped to {2..5} with text_len 6; annotator {2..5} -> 1.0 ({2..9} -> 0.5 unclipped)
    assert max_iou([[[2, 6]]], [[2, 10]], text_len=6) == 1.0
    assert max_iou([[[2, 6]]], [[2, 10]]) == pytest.approx(0.5)


@pytest.mark.parametrize("empty", [None, {}, []])
def test_max_iou_without_annotations_raises(empty):
    with pytest.raises(ValueError, match="annotat"):
        max_iou(empty, [[0, 1]])


# ==================================================================================================
# label conversions
# ==================================================================================================


def test_hard_from_soft_strict_threshold_and_merging():
    soft = [
        {"start": 3, "end": 5, "prob": 0.9},  # listed out of order on purpose
        {"start": 0, "end": 3, "prob": 0.6},  # > .5; adjacent to [3,5) -> merged into [0,5)
        {"start": 5, "end": 7, "prob": 0.5},  # exactly .5: NOT > .5 -> dropped
        {"start": 7, "end": 9, "prob": 0.51},  # kept; not adjacent to [0,5) because [5,7) dropped
        {"start": 10, "end": 12, "prob": 1.0},  # gap at 9 -> separate span
    ]
    assert hard_from_soft(soft) == [[0, 5], [7, 9], [10, 12]]
    assert hard_from_soft(soft) == hard_labels_from_soft(soft)  # it is the contract's rule
    assert hard_from_soft(soft, threshold=0.8) == [[3, 5], [10, 12]]
    assert hard_from_soft([]) == []


def test_soft_from_hard():
    assert soft_from_hard([[5, 7], [0, 2], [3, 3]]) == [
        {"start": 0, "end": 2, "prob": 1.0},
        {"start": 5, "end": 7, "prob": 1.0},
    ]
    assert soft_from_hard([]) == []


# ==================================================================================================
# items, corpora, files
# ==================================================================================================

GOLD_A = {
    "id": "a",
    "text": "0123456789",  # text_len 10
    "hard_labels": [[0, 4]],
    "soft_labels": [{"start": 0, "end": 4, "prob": 0.8}, {"start": 4, "end": 6, "prob": 0.4}],
    "annotations": {"x": [[0, 4]], "y": [[0, 6]]},
}
GOLD_B = {
    "id": "b",
    "text_len": 8,
    "hard_labels": [],
    "soft_labels": [],
}


def test_score_item_pred_with_only_soft_labels():
    # hard derived from soft: [0,6) at .9 -> [[0, 6]]
    pred = {"soft_labels": [{"start": 0, "end": 6, "prob": 0.9}]}
    s = score_item(GOLD_A, pred)
    # iou: gold {0..3}, pred {0..5}: 4/6
    assert s["iou"] == pytest.approx(4 / 6)
    # maxiou: annotator y {0..5} -> 1.0
    assert s["maxiou"] == 1.0
    ref_vec = [0.8] * 4 + [0.4] * 2 + [0.0] * 4
    pred_vec = [0.9] * 6 + [0.0] * 4
    assert s["corr"] == pytest.approx(spearmanr(ref_vec, pred_vec).correlation, abs=1e-12)


def test_score_item_pred_with_only_hard_labels():
    # soft derived from hard with prob 1.0: pred vector [1]*4 + [0]*6
    s = score_item(GOLD_A, {"hard_labels": [[0, 4]]})
    assert s["iou"] == 1.0
    assert s["maxiou"] == 1.0  # annotator x matches exactly
    ref_vec = [0.8] * 4 + [0.4] * 2 + [0.0] * 4
    pred_vec = [1.0] * 4 + [0.0] * 6
    assert s["corr"] == pytest.approx(spearmanr(ref_vec, pred_vec).correlation, abs=1e-12)


def test_score_item_without_annotations_maxiou_equals_iou():
    s = score_item(GOLD_B, {"hard_labels": [[0, 2]]})
    # gold empty, pred non-empty: iou 0; soft: gold constant, pred two values -> corr 0
    assert s == {"iou": 0.0, "corr": 0.0, "maxiou": 0.0}
    s = score_item(GOLD_B, {"hard_labels": [], "soft_labels": []})
    assert s == {"iou": 1.0, "corr": 1.0, "maxiou": 1.0}
    # a prediction with neither field predicts nothing
    assert score_item(GOLD_B, {}) == {"iou": 1.0, "corr": 1.0, "maxiou": 1.0}


def test_score_item_clip_flag():
    # text_len 8, gold empty, pred [6, 12): clipped {6, 7} vs unclipped {6..11}; both give iou 0.
    # Use a gold span to see the difference: gold {6, 7}
    gold = {"text_len": 8, "hard_labels": [[6, 8]], "soft_labels": [{"start": 6, "end": 8, "prob": 1.0}]}
    pred = {"hard_labels": [[6, 12]]}
    assert score_item(gold, pred)["iou"] == 1.0  # clipped to {6, 7}
    assert score_item(gold, pred, clip=False)["iou"] == pytest.approx(2 / 6)  # official: {6..11}


def test_score_item_needs_text_len():
    with pytest.raises(ValueError, match="text_len"):
        score_item({"hard_labels": [], "soft_labels": []}, {})


def test_score_corpus_matches_by_id_and_averages():
    pred_a = {"id": "a", "hard_labels": [[0, 2]]}  # iou 2/4 = .5; maxiou max(2/4, 2/6) = .5
    pred_b = {"id": "b", "hard_labels": [], "soft_labels": []}  # iou 1, corr 1, maxiou 1
    # predictions in the other order: matched by id
    res = score_corpus([GOLD_A, GOLD_B], [pred_b, pred_a])
    corr_a = score_item(GOLD_A, pred_a)["corr"]
    assert res["n"] == 2
    assert res["iou"] == pytest.approx((0.5 + 1.0) / 2)
    assert res["maxiou"] == pytest.approx((0.5 + 1.0) / 2)
    assert res["corr"] == pytest.approx((corr_a + 1.0) / 2)


def test_score_corpus_missing_and_extra_ids_are_named():
    with pytest.raises(ValueError, match=r"no prediction: b"):
        score_corpus([GOLD_A, GOLD_B], [{"id": "a", "hard_labels": []}])
    with pytest.raises(ValueError, match=r"not in the gold data: zzz"):
        score_corpus([GOLD_A], [{"id": "a", "hard_labels": []}, {"id": "zzz", "hard_labels": []}])
    with pytest.raises(ValueError, match="duplicate"):
        score_corpus([GOLD_A], [{"id": "a", "hard_labels": []}, {"id": "a", "hard_labels": []}])


def test_score_corpus_by_position():
    golds = [{k: v for k, v in g.items() if k != "id"} for g in (GOLD_A, GOLD_B)]
    preds = [{"hard_labels": [[0, 4]]}, {"hard_labels": []}]
    res = score_corpus(golds, preds)
    assert res["iou"] == 1.0 and res["n"] == 2
    with pytest.raises(ValueError, match=r"2 gold items and 1 predictions"):
        score_corpus(golds, preds[:1])
    with pytest.raises(ValueError, match="empty"):
        score_corpus([], [])


def test_score_files_and_load_jsonl(tmp_path):
    gold = [
        {
            "id": "val-zh-1",
            "model_output_text": "北京是法国的首都。",
            "hard_labels": [[3, 5]],
            "soft_labels": [{"start": 3, "end": 5, "prob": 1.0}],
            "annotations": {"p": [[3, 5]], "q": [[3, 6]]},
        },
        {"id": "val-zh-2", "model_output_text": "对", "hard_labels": [], "soft_labels": []},
    ]
    preds = [
        {"id": "val-zh-2", "soft_labels": []},
        {"id": "val-zh-1", "soft_labels": [{"start": 3, "end": 6, "prob": 0.7}]},  # hard [[3, 6]]
    ]
    gp, pp = tmp_path / "gold.jsonl", tmp_path / "pred.jsonl"
    gp.write_text("\n".join(json.dumps(r, ensure_ascii=False) for r in gold) + "\n\n", encoding="utf-8")
    pp.write_text("\n".join(json.dumps(r, ensure_ascii=False) for r in preds), encoding="utf-8")
    assert load_jsonl(gp) == gold
    res = score_files(gp, pp)
    # item 1: iou {3,4} vs {3,4,5} = 2/3; maxiou 1.0 (annotator q); corr: ref [0,0,0,1,1,0,0,0,0],
    # pred [0,0,0,.7,.7,.7,0,0,0]. item 2: all 1.0
    corr1 = spearmanr([0, 0, 0, 1, 1, 0, 0, 0, 0], [0, 0, 0, 0.7, 0.7, 0.7, 0, 0, 0]).correlation
    assert res["iou"] == pytest.approx((2 / 3 + 1) / 2)
    assert res["maxiou"] == pytest.approx(1.0)
    assert res["corr"] == pytest.approx((corr1 + 1) / 2)
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"id": 1}\n{oops\n', encoding="utf-8")
    with pytest.raises(ValueError, match=r"bad.jsonl: line 2"):
        load_jsonl(bad)


# --- cross-check against a literal transcription of the official scorer --------------------------


def _official_iou(ref_dict, pred_dict):
    ref_indices = {idx for span in ref_dict["hard_labels"] for idx in range(*span)}
    pred_indices = {idx for span in pred_dict["hard_labels"] for idx in range(*span)}
    if not pred_indices and not ref_indices:
        return 1.0
    return len(ref_indices & pred_indices) / len(ref_indices | pred_indices)


def _official_cor(ref_dict, pred_dict):
    ref_vec = [0.0] * ref_dict["text_len"]
    pred_vec = [0.0] * ref_dict["text_len"]
    for span in ref_dict["soft_labels"]:
        for idx in range(span["start"], span["end"]):
            ref_vec[idx] = span["prob"]
    for span in pred_dict["soft_labels"]:
        for idx in range(span["start"], span["end"]):
            pred_vec[idx] = span["prob"]
    if len({round(flt, 8) for flt in pred_vec}) == 1 or len({round(flt, 8) for flt in ref_vec}) == 1:
        return float(len({round(flt, 8) for flt in ref_vec}) == len({round(flt, 8) for flt in pred_vec}))
    return spearmanr(ref_vec, pred_vec).correlation


def _random_soft(rng, n):
    out, i = [], 0
    while i < n:
        j = min(n, i + rng.randint(1, 6))
        if rng.random() < 0.5:
            out.append({"start": i, "end": j, "prob": rng.choice([0.1, 0.25, 1 / 3, 0.5, 0.6, 0.9, 1.0])})
        i = j
    return out


def test_matches_official_scorer_on_random_inputs():
    rng = random.Random(1234)
    for _ in range(300):
        n = rng.randint(1, 40)
        g_soft, p_soft = _random_soft(rng, n), _random_soft(rng, n)
        gold = {"text_len": n, "soft_labels": g_soft, "hard_labels": hard_from_soft(g_soft)}
        pred = {"soft_labels": p_soft, "hard_labels": hard_from_soft(p_soft)}
        got = score_item(gold, pred)
        assert got["iou"] == pytest.approx(_official_iou(gold, pred), abs=1e-12)
        assert got["corr"] == pytest.approx(_official_cor(gold, pred), abs=1e-12)


# ==================================================================================================
# classification
# ==================================================================================================

# index:   0  1  2  3  4  5  6  7
Y_TRUE = [1, 1, 1, 0, 0, 0, 0, 1]
Y_PRED = [1, 0, 1, 1, 0, 0, 0, 0]
# tp = {0, 2} = 2, fn = {1, 7} = 2, fp = {3} = 1, tn = {4, 5, 6} = 3


def test_confusion_and_scores_hand_computed():
    assert confusion(Y_TRUE, Y_PRED) == {"tp": 2, "fp": 1, "tn": 3, "fn": 2}
    assert accuracy(Y_TRUE, Y_PRED) == pytest.approx(5 / 8)  # (2 + 3) / 8
    assert precision(Y_TRUE, Y_PRED) == pytest.approx(2 / 3)  # 2 / (2 + 1)
    assert recall(Y_TRUE, Y_PRED) == pytest.approx(2 / 4)  # 2 / (2 + 2)
    assert f1(Y_TRUE, Y_PRED) == pytest.approx(4 / 7)  # 2*2 / (2*2 + 1 + 2)
    # balanced: (TPR + TNR) / 2 = (2/4 + 3/4) / 2 = 0.625
    assert balanced_accuracy(Y_TRUE, Y_PRED) == pytest.approx(0.625)
    rep = classification_report([bool(x) for x in Y_TRUE], [bool(x) for x in Y_PRED])
    assert rep == {
        "tp": 2, "fp": 1, "tn": 3, "fn": 2, "n": 8,
        "accuracy": pytest.approx(5 / 8), "precision": pytest.approx(2 / 3),
        "recall": pytest.approx(0.5), "f1": pytest.approx(4 / 7),
        "balanced_accuracy": pytest.approx(0.625),
    }  # fmt: skip


def test_zero_division_returns_zero():
    # nothing predicted positive: precision 0/0 -> 0.0; recall 0/2 = 0; f1 0/(0+0+2) = 0
    assert precision([1, 1, 0], [0, 0, 0]) == 0.0
    assert f1([1, 1, 0], [0, 0, 0]) == 0.0
    # no positives at all: recall 0/0 -> 0.0; f1 0/(0+0+0) -> 0.0; accuracy 3/3 = 1
    assert recall([0, 0, 0], [0, 0, 0]) == 0.0
    assert f1([0, 0, 0], [0, 0, 0]) == 0.0
    assert accuracy([0, 0, 0], [0, 0, 0]) == 1.0
    # balanced accuracy over classes present in y_true (sklearn): only negatives -> TNR = 2/3
    assert balanced_accuracy([0, 0, 0], [0, 1, 0]) == pytest.approx(2 / 3)
    # empty input
    assert accuracy([], []) == 0.0
    assert balanced_accuracy([], []) == 0.0
    assert classification_report([], [])["n"] == 0


def test_classification_input_validation():
    with pytest.raises(ValueError, match=r"3 items.*2"):
        accuracy([1, 0, 1], [1, 0])
    with pytest.raises(ValueError, match="bool or 0/1"):
        accuracy([1, 2], [1, 0])
    with pytest.raises(ValueError, match="bool or 0/1"):
        f1(["yes", "no"], [1, 0])


def _correctness(b, c, both=0, neither=0):
    """correct_a / correct_b with b items (A right, B wrong), c items (A wrong, B right) and concordant ones."""
    a = [True] * b + [False] * c + [True] * both + [False] * neither
    bb = [False] * b + [True] * c + [True] * both + [False] * neither
    return a, bb


def test_mcnemar_exact_branch():
    a, b = _correctness(1, 6, both=10, neither=3)
    res = mcnemar(a, b)
    # b + c = 7 < 25 -> exact. two-sided p = 2 * P(X <= 1 | n=7, p=.5) = 2 * (1 + 7) / 128 = 0.125
    assert (res["b"], res["c"], res["method"]) == (1, 6, "exact")
    assert res["pvalue"] == pytest.approx(0.125)
    assert res["statistic"] == 1.0  # min(b, c)


def test_mcnemar_chi2_branch():
    a, b = _correctness(20, 10, both=5)
    res = mcnemar(a, b)
    # b + c = 30 >= 25 -> chi2 = (|20 - 10| - 1)^2 / 30 = 81 / 30 = 2.7
    # chi2 survival with 1 df: P(Z^2 > x) = erfc(sqrt(x / 2))
    assert res["method"] == "chi2"
    assert res["statistic"] == pytest.approx(2.7)
    assert res["pvalue"] == pytest.approx(math.erfc(math.sqrt(2.7 / 2)))


def test_mcnemar_forced_branches_and_no_discordance():
    a, b = _correctness(20, 10)
    res = mcnemar(a, b, exact=True)
    # exact two-sided: 2 * sum_{k<=10} C(30, k) / 2^30
    expected = 2 * sum(math.comb(30, k) for k in range(11)) / 2**30
    assert res["method"] == "exact"
    assert res["pvalue"] == pytest.approx(expected)
    a, b = _correctness(3, 1)
    res = mcnemar(a, b, exact=False)
    # (|3 - 1| - 1)^2 / 4 = 0.25
    assert res["method"] == "chi2" and res["statistic"] == pytest.approx(0.25)
    assert res["pvalue"] == pytest.approx(math.erfc(math.sqrt(0.25 / 2)))
    res = mcnemar([True, False, True], [True, False, True])
    assert (res["b"], res["c"], res["statistic"], res["pvalue"]) == (0, 0, 0.0, 1.0)
    with pytest.raises(ValueError, match=r"3 items.*2"):
        mcnemar([1, 0, 1], [1, 0])


# ==================================================================================================
# DSPy adapters
# ==================================================================================================

ANSWER = "Paris is the capital of Germany."
_G = ANSWER.index("Germany")  # 24; "Germany" is [24, 31)


def _span_example(**extra):
    return dspy.Example(
        question="What is Paris the capital of?",
        answer=ANSWER,
        hard_labels=[[_G, _G + 7]],
        soft_labels=[{"start": _G, "end": _G + 7, "prob": 1.0}],
        **extra,
    ).with_inputs("question", "answer")


def test_adapters_span_metrics_on_dspy_objects():
    ex = _span_example()
    # detector flags "Germany." ([24, 32)) at 0.9: hard [[24, 32]]
    pred = to_prediction(Detection(answer=ANSWER, spans=[Span(_G, _G + 8, 0.9)], label=True, score=0.9))
    # iou: gold 7 chars, pred 8 chars, inter 7 -> 7/8
    assert METRICS["iou"](ex, pred) == pytest.approx(7 / 8)
    ref_vec = [0.0] * _G + [1.0] * 7 + [0.0]
    pred_vec = [0.0] * _G + [0.9] * 8
    corr = spearmanr(ref_vec, pred_vec).correlation
    assert METRICS["corr"](ex, pred) == pytest.approx(corr, abs=1e-12)
    assert METRICS["iou+corr"](ex, pred) == pytest.approx((7 / 8 + corr) / 2, abs=1e-12)
    # no annotations -> maxiou == iou
    assert METRICS["maxiou"](ex, pred) == pytest.approx(7 / 8)
    ex_ann = _span_example(annotations={"a": [[_G, _G + 8]], "b": [[0, 5]]})
    assert METRICS["maxiou"](ex_ann, pred, trace=None) == 1.0


def test_adapters_failed_predictions_score_zero():
    ex = _span_example()
    for name in ("iou", "corr", "maxiou", "iou+corr"):
        assert METRICS[name](ex, None) == 0.0
        assert METRICS[name](ex, dspy.Prediction(rationale="model output unparsable")) == 0.0
        assert METRICS[name](ex, dspy.Prediction(hard_labels="oops", soft_labels=None)) == 0.0
    # an empty (but present) prediction is a real prediction: gold non-empty -> iou 0, corr 0
    empty = dspy.Prediction(hard_labels=[], soft_labels=[])
    assert METRICS["iou"](ex, empty) == 0.0
    # a prediction with only hard labels is completed (soft with prob 1.0) -> perfect
    only_hard = dspy.Prediction(hard_labels=[[_G, _G + 7]])
    assert METRICS["iou"](ex, only_hard) == 1.0
    assert METRICS["corr"](ex, only_hard) == pytest.approx(1.0)
    # gold with no hallucination: an empty prediction is perfect, a failed one still scores 0.0
    ex_clean = dspy.Example(answer=ANSWER, hard_labels=[], soft_labels=[])
    for name in ("iou", "corr", "maxiou", "iou+corr"):
        assert METRICS[name](ex_clean, empty) == 1.0
        assert METRICS[name](ex_clean, dspy.Prediction(rationale="failed")) == 0.0
        assert METRICS[name](ex_clean, None) == 0.0
    ex_resp = dspy.Example(answer="x", label=True)
    assert METRICS["accuracy"](ex_resp, None) == 0.0
    assert METRICS["f1"](ex_resp, dspy.Prediction(score=0.3)) == 0.0
    assert METRICS["accuracy"](ex_resp, dspy.Prediction(label="True")) == 0.0


def test_adapters_response_metrics():
    ex_pos = dspy.Example(answer="x", label=True)
    ex_neg = dspy.Example(answer="y", label=False)
    yes = to_prediction(Detection(answer="x", label=True, score=0.8))
    no = to_prediction(Detection(answer="x", label=False, score=0.1))
    assert METRICS["accuracy"](ex_pos, yes) == 1.0
    assert METRICS["accuracy"](ex_pos, no) == 0.0
    assert METRICS["accuracy"](ex_neg, no) == 1.0
    # per item, f1 is the correctness
    assert METRICS["f1"](ex_neg, yes) == 0.0
    assert METRICS["f1"](ex_pos, yes) == 1.0


def test_aggregate_true_f1_and_means():
    ex_pos = dspy.Example(answer="x", label=True)
    ex_neg = dspy.Example(answer="y", label=False)
    yes = dspy.Prediction(label=True, score=0.9)
    no = dspy.Prediction(label=False, score=0.1)
    examples = [ex_pos, ex_pos, ex_pos, ex_neg, ex_neg]
    preds = [yes, no, None, yes, no]
    # y_true [1,1,1,0,0]; y_pred [1,0,(failed -> 0, the opposite of 1),1,0]
    # tp 1, fn 2, fp 1, tn 1 -> f1 = 2 / (2 + 1 + 2) = 0.4 (mean per-item correctness would be 2/5 too,
    # so also check a case where they differ below)
    assert aggregate("f1", examples, preds) == pytest.approx(0.4)
    assert aggregate("accuracy", examples, preds) == pytest.approx(2 / 5)
    # all negatives predicted correctly: accuracy 1.0 but F1 0/0 -> 0.0
    assert aggregate("accuracy", [ex_neg, ex_neg], [no, no]) == 1.0
    assert aggregate("f1", [ex_neg, ex_neg], [no, no]) == 0.0
    # a failed prediction on a negative item counts as a false positive: tp 1, fp 1 -> f1 = 2/3
    assert aggregate("f1", [ex_pos, ex_neg], [yes, None]) == pytest.approx(2 / 3)
    # span metric: mean of per-item values (7/8 and 0.0 for the failed one)
    ex = _span_example()
    pred = dspy.Prediction(hard_labels=[[_G, _G + 8]], soft_labels=[{"start": _G, "end": _G + 8, "prob": 0.9}])
    assert aggregate("iou", [ex, ex], [pred, None]) == pytest.approx(7 / 16)
    with pytest.raises(ValueError, match=r"2 examples but 1 predictions"):
        aggregate("iou", [ex, ex], [pred])
    with pytest.raises(ValueError, match="empty"):
        aggregate("iou", [], [])


def test_get_metric_and_levels():
    assert get_metric("iou+corr") is METRICS["iou+corr"]
    with pytest.raises(ValueError, match=r"unknown metric 'bleu'.*iou, corr, maxiou, iou\+corr, accuracy, f1"):
        get_metric("bleu")
    assert set(METRIC_LEVEL) == set(METRICS)
    assert {k for k, v in METRIC_LEVEL.items() if v == "response"} == {"accuracy", "f1"}
    assert {k for k, v in METRIC_LEVEL.items() if v == "span"} == {"iou", "corr", "maxiou", "iou+corr"}


def test_adapters_raise_on_misconfigured_gold():
    # a span metric on response-level data is a configuration error, not a failed prediction
    pred = dspy.Prediction(hard_labels=[], soft_labels=[], label=True)
    with pytest.raises(ValueError, match="METRIC_LEVEL"):
        METRICS["iou"](dspy.Example(answer="x", label=True), pred)
    with pytest.raises(ValueError, match="METRIC_LEVEL"):
        METRICS["accuracy"](_span_example(), pred)
