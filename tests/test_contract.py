"""Tests for halluscope.core.contract: the span/label conventions every detector relies on.

Expected values are hand-computed; offsets come from ``str.index`` wherever a string can tell them, and
the reasoning is in comments.
"""

from __future__ import annotations

import json

import dspy
import pytest

from halluscope.core.contract import (
    Detection,
    Evidence,
    Span,
    Unit,
    char_probs,
    clamp01,
    hard_labels_from_soft,
    normalize_spans,
    soft_labels_from_spans,
    to_prediction,
)

# ==================================================================================================
# clamp01
# ==================================================================================================


@pytest.mark.parametrize(
    "value, expected",
    [
        (0.3, 0.3),
        (1.7, 1.0),  # above 1 -> 1
        (-0.2, 0.0),  # below 0 -> 0
        ("0.25", 0.25),  # numeric strings parse
        (True, 1.0),  # bool is a number (float(True) == 1.0)
        (0, 0.0),
        (1, 1.0),
    ],
)
def test_clamp01_numbers(value, expected):
    assert clamp01(value) == expected


@pytest.mark.parametrize("value", [float("nan"), "abc", None, [1], object()])
def test_clamp01_non_numbers_take_default(value):
    assert clamp01(value) == 0.0
    assert clamp01(value, default=1.0) == 1.0


def test_clamp01_infinities_are_clamped_not_defaulted():
    assert clamp01(float("inf")) == 1.0
    assert clamp01(float("-inf"), default=0.7) == 0.0


# ==================================================================================================
# normalize_spans
# ==================================================================================================


def test_normalize_spans_keeps_valid_span_unchanged():
    assert normalize_spans([Span(2, 5, 0.4)], 10) == [Span(2, 5, 0.4)]


def test_normalize_spans_clips_to_text():
    # start -3 -> 0; end 99 -> text_len 6.
    assert normalize_spans([Span(-3, 2, 0.4)], 6) == [Span(0, 2, 0.4)]
    assert normalize_spans([Span(4, 99, 0.9)], 6) == [Span(4, 6, 0.9)]
    assert normalize_spans([Span(-5, 50, 1.0)], 6) == [Span(0, 6, 1.0)]


def test_normalize_spans_span_entirely_outside_text_is_dropped():
    # [7, 9) clipped to [7, 6) -> empty; [-4, -1) clipped to [0, -1) -> empty.
    assert normalize_spans([Span(7, 9, 1.0), Span(-4, -1, 1.0)], 6) == []


@pytest.mark.parametrize(
    "prob, expected",
    [
        (1.7, 1.0),
        (2, 1.0),
        (0.25, 0.25),
        ("0.7", 0.7),
        (1, 1.0),
    ],
)
def test_normalize_spans_clamps_probabilities(prob, expected):
    (s,) = normalize_spans([Span(0, 3, prob)], 5)
    assert (s.start, s.end) == (0, 3)
    assert s.prob == expected
    assert isinstance(s.prob, float)


@pytest.mark.parametrize("prob", [float("nan"), "abc", None, -0.5, 0.0, 0, -1e-9])
def test_normalize_spans_drops_zero_negative_nan_and_non_numeric_probs(prob):
    # NaN and non-numbers clamp to the default 0.0, negatives to 0.0: all are then dropped.
    assert normalize_spans([Span(0, 3, prob)], 5) == []


def test_normalize_spans_drops_empty_and_inverted_spans():
    assert normalize_spans([Span(3, 3, 1.0), Span(4, 2, 1.0)], 10) == []


def test_normalize_spans_accepts_tuples_and_lists():
    # A 2-element sequence gets prob 1.0; a 3-element one carries its prob.
    out = normalize_spans([(0, 2), [3, 5, 0.3], (6, 8, "0.9")], 10)
    assert out == [Span(0, 2, 1.0), Span(3, 5, 0.3), Span(6, 8, 0.9)]
    assert all(isinstance(s, Span) for s in out)


def test_normalize_spans_truncates_float_offsets_with_int():
    # int(1.9) == 1, int(3.2) == 3
    assert normalize_spans([(1.9, 3.2, 0.5)], 10) == [Span(1, 3, 0.5)]


def test_normalize_spans_sorts_by_start_then_end_then_prob_descending():
    spans = [Span(4, 6, 1.0), Span(0, 3, 0.2), Span(0, 3, 0.7), Span(0, 2, 0.4), Span(2, 5, 1.0)]
    assert normalize_spans(spans, 10) == [
        Span(0, 2, 0.4),
        Span(0, 3, 0.7),  # same (start, end): higher prob first
        Span(0, 3, 0.2),
        Span(2, 5, 1.0),
        Span(4, 6, 1.0),
    ]


def test_normalize_spans_mixed_input_all_rules_at_once():
    out = normalize_spans(
        [
            (0, 3, "0.7"),  # kept, prob 0.7
            [2, 5],  # kept, prob 1.0
            (1, 4, "abc"),  # dropped (non-number -> 0)
            (5, 5, 1),  # dropped (empty)
            (-3, 2, 0.4),  # clipped to [0, 2)
            (4, 99, 2.0),  # clipped to [4, 6), prob 1.0
            (1, 3, float("nan")),  # dropped
            Span(1, 2, None),  # dropped
        ],
        6,
    )
    assert out == [Span(0, 2, 0.4), Span(0, 3, 0.7), Span(2, 5, 1.0), Span(4, 6, 1.0)]


def test_normalize_spans_zero_length_text_drops_everything():
    assert normalize_spans([Span(0, 3, 1.0)], 0) == []


# ==================================================================================================
# char_probs
# ==================================================================================================


def test_char_probs_no_spans_all_zero():
    assert char_probs([], 4) == [0.0, 0.0, 0.0, 0.0]


def test_char_probs_single_span():
    assert char_probs([Span(1, 3, 0.6)], 5) == [0.0, 0.6, 0.6, 0.0, 0.0]


def test_char_probs_overlap_takes_maximum_in_either_order():
    # [0,4) at 0.3 and [2,6) at 0.8 -> chars 0,1: 0.3; chars 2..5: max(0.3, 0.8) = 0.8 / 0.8; char 6: 0.
    expected = [0.3, 0.3, 0.8, 0.8, 0.8, 0.8, 0.0]
    assert char_probs([Span(0, 4, 0.3), Span(2, 6, 0.8)], 7) == expected
    assert char_probs([Span(2, 6, 0.8), Span(0, 4, 0.3)], 7) == expected


def test_char_probs_contained_lower_span_does_not_lower_outer():
    # outer [0,6) 0.9, inner [2,4) 0.2 -> max is 0.9 everywhere in [0,6)
    assert char_probs([Span(2, 4, 0.2), Span(0, 6, 0.9)], 6) == [0.9] * 6


def test_char_probs_normalizes_its_input():
    # (-2, 2, 5.0) -> [0, 2) prob 1.0; (3, 10, 0.5) -> [3, 4) prob 0.5; the NaN span is dropped.
    assert char_probs([(-2, 2, 5.0), (3, 10, 0.5), (0, 4, float("nan"))], 4) == [1.0, 1.0, 0.0, 0.5]


# ==================================================================================================
# soft_labels_from_spans
# ==================================================================================================


def test_soft_labels_empty():
    assert soft_labels_from_spans([], 10) == []
    assert soft_labels_from_spans([Span(0, 3, 1.0)], 0) == []


def test_soft_labels_single_span():
    assert soft_labels_from_spans([Span(2, 5, 0.4)], 8) == [{"start": 2, "end": 5, "prob": 0.4}]


def test_soft_labels_adjacent_equal_probs_merge_into_one_run():
    # [0,2) and [2,4) both 0.6 -> one run [0,4); [4,6) at 0.7 differs -> own run; gap at 6; [7,9) 0.6.
    out = soft_labels_from_spans([(0, 2, 0.6), (2, 4, 0.6), (4, 6, 0.7), (7, 9, 0.6)], 10)
    assert out == [
        {"start": 0, "end": 4, "prob": 0.6},
        {"start": 4, "end": 6, "prob": 0.7},
        {"start": 7, "end": 9, "prob": 0.6},
    ]


def test_soft_labels_different_probs_split_on_overlap():
    # [0,6) 0.3 with [2,4) 0.9 on top -> 0.3 | 0.9 | 0.3
    out = soft_labels_from_spans([Span(0, 6, 0.3), Span(2, 4, 0.9)], 8)
    assert out == [
        {"start": 0, "end": 2, "prob": 0.3},
        {"start": 2, "end": 4, "prob": 0.9},
        {"start": 4, "end": 6, "prob": 0.3},
    ]


def test_soft_labels_overlapping_equal_probs_are_one_run():
    assert soft_labels_from_spans([Span(0, 4, 0.5), Span(2, 7, 0.5)], 9) == [{"start": 0, "end": 7, "prob": 0.5}]


def test_soft_labels_run_reaching_end_of_text():
    text = "abc def"
    s = text.index("def")
    assert soft_labels_from_spans([Span(s, len(text), 1.0)], len(text)) == [{"start": s, "end": len(text), "prob": 1.0}]


def test_soft_labels_gap_between_equal_spans_is_not_merged():
    out = soft_labels_from_spans([Span(0, 2, 1.0), Span(3, 5, 1.0)], 5)
    assert out == [{"start": 0, "end": 2, "prob": 1.0}, {"start": 3, "end": 5, "prob": 1.0}]


# ==================================================================================================
# hard_labels_from_soft
# ==================================================================================================


def test_hard_labels_strictly_above_half():
    soft = [
        {"start": 0, "end": 3, "prob": 0.9},
        {"start": 4, "end": 6, "prob": 0.5},  # exactly 0.5: excluded
        {"start": 7, "end": 9, "prob": 0.51},
        {"start": 10, "end": 12, "prob": 0.2},
    ]
    assert hard_labels_from_soft(soft) == [[0, 3], [7, 9]]


def test_hard_labels_exactly_half_only_gives_nothing():
    assert hard_labels_from_soft([{"start": 0, "end": 5, "prob": 0.5}]) == []


def test_hard_labels_adjacent_runs_merge():
    # [0,3) 0.9 and [3,5) 0.6 touch -> [0,5); [5,8) 0.5 is not > 0.5; [8,9) 0.51 does not touch 5.
    soft = [
        {"start": 0, "end": 3, "prob": 0.9},
        {"start": 3, "end": 5, "prob": 0.6},
        {"start": 5, "end": 8, "prob": 0.5},
        {"start": 8, "end": 9, "prob": 0.51},
    ]
    assert hard_labels_from_soft(soft) == [[0, 5], [8, 9]]


def test_hard_labels_low_run_between_high_runs_keeps_them_apart():
    soft = [
        {"start": 0, "end": 3, "prob": 0.9},
        {"start": 3, "end": 5, "prob": 0.2},
        {"start": 5, "end": 8, "prob": 0.9},
    ]
    assert hard_labels_from_soft(soft) == [[0, 3], [5, 8]]


def test_hard_labels_unsorted_and_overlapping_input():
    soft = [
        {"start": 6, "end": 9, "prob": 0.8},
        {"start": 0, "end": 4, "prob": 0.7},
        {"start": 2, "end": 7, "prob": 0.6},  # overlaps both: all three merge into [0, 9)
    ]
    assert hard_labels_from_soft(soft) == [[0, 9]]


def test_hard_labels_contained_run_does_not_shrink_merge():
    soft = [{"start": 0, "end": 10, "prob": 0.9}, {"start": 2, "end": 4, "prob": 0.95}]
    assert hard_labels_from_soft(soft) == [[0, 10]]


def test_hard_labels_custom_threshold():
    soft = [{"start": 0, "end": 2, "prob": 0.3}, {"start": 4, "end": 6, "prob": 0.8}]
    assert hard_labels_from_soft(soft, threshold=0.2) == [[0, 2], [4, 6]]
    assert hard_labels_from_soft(soft, threshold=0.8) == []  # strict >


def test_hard_labels_empty():
    assert hard_labels_from_soft([]) == []


def test_hard_labels_from_equal_prob_soft_runs_of_spans():
    # Spans [0,2) 0.6 and [2,4) 0.7 are different soft runs but adjacent hard labels -> one [0,4).
    soft = soft_labels_from_spans([Span(0, 2, 0.6), Span(2, 4, 0.7)], 6)
    assert len(soft) == 2
    assert hard_labels_from_soft(soft) == [[0, 4]]


# ==================================================================================================
# Detection
# ==================================================================================================

ANSWER = "The capital of Spain is Barcelona, founded in 1492."


def _span(word: str, prob: float = 1.0, text: str = ANSWER) -> Span:
    i = text.index(word)
    return Span(i, i + len(word), prob)


def test_detection_defaults():
    d = Detection(answer="abc")
    assert d.spans == [] and d.units == [] and d.failures == {}
    assert d.label is False and d.score == 0.0 and d.rationale == "" and d.revision is None
    assert d.soft_labels == [] and d.hard_labels == []


@pytest.mark.parametrize("score, expected", [(1.5, 1.0), (-0.3, 0.0), (float("nan"), 0.0), ("x", 0.0), ("0.4", 0.4), (0.8, 0.8)])
def test_detection_score_is_clamped(score, expected):
    assert Detection(answer="abc", score=score).score == expected


def test_detection_normalizes_spans_on_construction():
    d = Detection(answer="abcdef", spans=[(4, 99, 2.0), (-1, 2), (3, 3, 1.0), (2, 4, 0.0)])
    assert d.spans == [Span(0, 2, 1.0), Span(4, 6, 1.0)]


def test_detection_soft_and_hard_labels_derived():
    b = ANSWER.index("Barcelona")
    y = ANSWER.index("1492")
    d = Detection(answer=ANSWER, spans=[_span("1492", 0.4), _span("Barcelona", 0.9)], label=True, score=0.9)
    # spans are sorted by start
    assert d.spans == [Span(b, b + 9, 0.9), Span(y, y + 4, 0.4)]
    assert d.soft_labels == [{"start": b, "end": b + 9, "prob": 0.9}, {"start": y, "end": y + 4, "prob": 0.4}]
    # only Barcelona is > 0.5
    assert d.hard_labels == [[b, b + 9]]
    assert ANSWER[d.hard_labels[0][0]:d.hard_labels[0][1]] == "Barcelona"


def test_detection_overlapping_spans_labels():
    # "Spain is Barcelona" at 0.6 and "Barcelona" at 0.9 -> soft: "Spain is " 0.6, "Barcelona" 0.9;
    # hard: one merged [start of Spain, end of Barcelona).
    s = ANSWER.index("Spain")
    b = ANSWER.index("Barcelona")
    e = b + len("Barcelona")
    d = Detection(answer=ANSWER, spans=[Span(s, e, 0.6), Span(b, e, 0.9)])
    assert d.soft_labels == [{"start": s, "end": b, "prob": 0.6}, {"start": b, "end": e, "prob": 0.9}]
    assert d.hard_labels == [[s, e]]


def test_detection_to_dict_contents():
    u = Unit(kind="sentence", start=0, end=len(ANSWER), text=ANSWER, label="contradiction", score=0.9, rationale="r")
    ev = Evidence(text="Madrid is the capital of Spain.", source="kb", id="wiki/Madrid#0", score=3.5)
    d = Detection(answer=ANSWER, spans=[_span("Barcelona", 0.9)], label=True, score=0.9, units=[u],
                  rationale="wrong city", revision="The capital of Spain is Madrid.", failures={"x": 2},
                  evidence=[ev], notes={"no_logits": 1})
    b = ANSWER.index("Barcelona")
    assert d.to_dict() == {
        "answer": ANSWER,
        "spans": [{"start": b, "end": b + 9, "prob": 0.9}],
        "soft_labels": [{"start": b, "end": b + 9, "prob": 0.9}],
        "hard_labels": [[b, b + 9]],
        "label": True,
        "score": 0.9,
        "verdict": "hallucinated",
        "verdict_reason": "1 span the detector stands behind (p > 0.5)",
        "units": [{"kind": "sentence", "start": 0, "end": len(ANSWER), "text": ANSWER, "label": "contradiction",
                   "score": 0.9, "rationale": "r"}],
        "rationale": "wrong city",
        "revision": "The capital of Spain is Madrid.",
        "failures": {"x": 2},
        "notes": {"no_logits": 1},
        "evidence": [{"text": "Madrid is the capital of Spain.", "source": "kb", "id": "wiki/Madrid#0", "score": 3.5}],
    }
    assert Detection.from_dict(d.to_dict()) == d


def test_counts_label_hard_and_soft_spans_and_flagged_units():
    from halluscope.core.contract import counts, describe_counts

    units = [Unit(kind="word", start=0, end=3, text="The", label="ok", score=0.2),
             Unit(kind="word", start=24, end=33, text="Barcelona", label="bad", score=0.9)]
    d = Detection(answer=ANSWER, spans=[_span("1492", 0.4), _span("Barcelona", 0.9)], units=units)
    c = counts(d)
    assert c == {"hard_spans": 1, "soft_spans": 2, "units": 2, "units_flagged": 1}
    assert counts(d.to_dict()) == c
    assert describe_counts(c) == ("1 hallucinated span (p > 0.5) · 2 marked spans (p > 0) · "
                                  "1 of 2 units flagged (p > 0.5)")
    assert describe_counts(counts(Detection(answer="x"))) == "0 hallucinated spans (p > 0.5) · 0 marked spans (p > 0)"


def test_detection_to_dict_failures_is_a_copy():
    d = Detection(answer="abc", failures={"a": 1})
    out = d.to_dict()
    out["failures"]["a"] = 99
    assert d.failures == {"a": 1}


def test_detection_round_trip_through_dict_and_json():
    u = Unit(kind="claim", start=0, end=5, text="The c", label="neutral", score=0.3)
    d = Detection(answer=ANSWER, spans=[_span("Barcelona", 0.9), _span("1492", 0.3)], label=True, score=0.9,
                  units=[u], rationale="why", revision=None, failures={"parse": 1})
    d2 = Detection.from_dict(d.to_dict())
    assert d2 == d
    assert d2.to_dict() == d.to_dict()
    d3 = Detection.from_dict(json.loads(d.to_json()))
    assert d3 == d
    assert d3.units == [u]


def test_detection_from_dict_minimal_and_defaults():
    d = Detection.from_dict({"answer": "hello", "spans": [{"start": 1, "end": 3}]})
    assert d.spans == [Span(1, 3, 1.0)]  # missing prob -> 1.0
    assert d.label is True and d.score == 1.0  # a hard span settles the verdict (one verdict per output)
    d = Detection.from_dict({"answer": "hello", "spans": [{"start": 1, "end": 3, "prob": 0.4}]})
    assert d.label is False and d.score == 0.0 and d.units == [] and d.failures == {}
    assert d.revision is None and d.rationale == ""
    # label coerced to bool, score clamped
    d = Detection.from_dict({"answer": "hello", "label": 1, "score": 3})
    assert d.label is True and d.score == 1.0


def test_detection_to_json_is_valid_json_with_non_ascii_kept():
    answer = "Die Provinz heißt Álava — 北京."
    i = answer.index("Álava")
    d = Detection(answer=answer, spans=[Span(i, i + 5, 0.8)], rationale="ß≠ss")
    s = d.to_json()
    assert "Álava" in s and "北京" in s and "ß≠ss" in s
    assert "\\u" not in s  # ensure_ascii=False: no escapes
    parsed = json.loads(s)
    assert parsed == d.to_dict()
    assert parsed["answer"][parsed["spans"][0]["start"]:parsed["spans"][0]["end"]] == "Álava"


# ==================================================================================================
# to_prediction
# ==================================================================================================


def test_to_prediction_fields_equal_detection_values():
    u = Unit(kind="sentence", start=0, end=10, text=ANSWER[:10], label="accurate", score=0.1)
    d = Detection(answer=ANSWER, spans=[_span("Barcelona", 0.9), _span("1492", 0.3)], label=True, score=0.9,
                  units=[u], rationale="r", revision="rev", failures={"f": 1})
    p = to_prediction(d)
    assert isinstance(p, dspy.Prediction)
    assert p.detection is d
    assert p.spans == [s.to_dict() for s in d.spans]
    b = ANSWER.index("Barcelona")
    assert p.spans[0] == {"start": b, "end": b + 9, "prob": 0.9}
    assert p.soft_labels == d.soft_labels
    assert p.hard_labels == d.hard_labels == [[b, b + 9]]
    assert p.label is True
    assert p.score == 0.9
    assert p.rationale == "r"
    assert p.revision == "rev"
    assert p.units == [u.to_dict()]
    assert p.failures == {"f": 1}


def test_to_prediction_extra_kwargs_kept():
    d = Detection(answer="abc")
    p = to_prediction(d, raw_output="the model said X", n_calls=3)
    assert p.raw_output == "the model said X"
    assert p.n_calls == 3
    assert p.spans == [] and p.hard_labels == [] and p.soft_labels == []
    assert p.label is False and p.score == 0.0 and p.revision is None


def test_to_prediction_failures_is_a_copy():
    d = Detection(answer="abc", failures={"a": 1})
    p = to_prediction(d)
    p.failures["a"] = 5
    assert d.failures == {"a": 1}


def test_span_and_unit_to_dict():
    assert Span(1, 2, 0.5).to_dict() == {"start": 1, "end": 2, "prob": 0.5}
    assert Span(1, 2).prob == 1.0
    u = Unit("block", 0, 3, "abc", "hallucinated", 0.7)
    assert u.to_dict() == {"kind": "block", "start": 0, "end": 3, "text": "abc", "label": "hallucinated",
                           "score": 0.7, "rationale": ""}



def test_to_dict_carries_every_field_of_units_and_evidence():
    """The hand-written ``to_dict`` (asdict's deep copy was a third of a no-LM detector's time) must not drift
    from the dataclass fields."""
    from dataclasses import asdict

    u = Unit(kind="sentence", start=3, end=9, text="Paris.", label="hallucinated", score=0.75, rationale="why")
    e = Evidence(text="Paris is in France.", source="kb", id="doc-1", score=2.5)
    assert u.to_dict() == asdict(u) and list(u.to_dict()) == list(asdict(u))
    assert e.to_dict() == asdict(e) and list(e.to_dict()) == list(asdict(e))


# -- one verdict per output (#34) ----------------------------------------------------------------------------

def test_a_hard_span_makes_the_label_hallucinated_and_lifts_the_score():
    d = Detection(answer=ANSWER, spans=[_span("Barcelona", 0.8)], label=False, score=0.2)
    assert d.label is True and d.score == 0.8 and d.verdict == "hallucinated"
    assert "1 span" in d.verdict_reason


def test_a_hallucinated_label_without_a_flagged_unit_says_it_was_judged_on_the_whole_answer():
    # a response head may call an answer hallucinated while no word stands out: the reason says so, not "spans"
    units = [Unit("word", 24, 33, "Barcelona", "supported", 0.4), Unit("num", 37, 41, "1492", "supported", 0.2)]
    d = Detection(answer=ANSWER, spans=[_span("Barcelona", 0.4)], label=True, score=0.9, units=units)
    assert d.verdict == "hallucinated" and d.hard_labels == []
    assert d.verdict_reason == ("the response score 0.90 is above 0.5, judged on the answer as a whole: none of its "
                                "2 units is flagged on its own")
    assert Detection(answer=ANSWER, label=True, score=0.9).verdict_reason == "the response score 0.90 is above 0.5"


def test_soft_spans_leave_the_label_as_the_program_decided():
    d = Detection(answer=ANSWER, spans=[_span("Barcelona", 0.5)], label=False, score=0.3)
    assert d.label is False and d.score == 0.3 and d.hard_labels == []
    d = Detection(answer=ANSWER, label=True, score=0.9)
    assert d.label is True and d.score == 0.9


def test_no_evidence_and_no_label_is_unverifiable():
    d = Detection(answer=ANSWER, notes={"no_evidence": 1})
    assert d.verdict == "unverifiable" and "no evidence" in d.verdict_reason
    assert d.to_dict()["verdict"] == "unverifiable"
    # with a passage it is a checked verdict; labelled, it is hallucinated whatever the evidence
    assert Detection(answer=ANSWER, notes={"no_evidence": 1}, evidence=[Evidence("x")]).verdict == "correct"
    assert Detection(answer=ANSWER, label=True, score=0.9, notes={"no_evidence": 1}).verdict == "hallucinated"


def test_display_marks_never_show_a_supported_unit_as_doubtful():
    from halluscope.core.contract import display_marks

    a = "Built in 1937 in Rome."
    i, r = a.index("1937"), a.index("Rome")
    d = Detection(answer=a, spans=[Span(i, i + 4, 0.45), Span(r, r + 4, 0.9), Span(0, 5, 0.3)],
                  units=[Unit("word", 0, 5, "Built", "neutral", 0.3), Unit("num", i, i + 4, "1937", "supported", 0.45),
                         Unit("word", r, r + 4, "Rome", "unsupported", 0.9)])
    marks = display_marks(d)
    assert {(m["start"], m["end"], m["kind"]) for m in marks} == {(r, r + 4, "hallucinated"), (0, 5, "possibly")}
    # a space between units with a probability of its own is not shown either
    d = Detection(answer=a, spans=[Span(5, 6, 0.4)], units=[Unit("word", 0, 5, "Built", "supported", 0.1)])
    assert display_marks(d) == []
    # without units, the soft runs are what there is to show
    assert [m["kind"] for m in display_marks(Detection(answer=a, spans=[Span(0, 5, 0.3)]))] == ["possibly"]
    unverifiable = Detection(answer=a, spans=[Span(0, 5, 0.3)], notes={"no_evidence": 1}).to_dict()
    assert display_marks(unverifiable) == []
