"""Correct long answers (the response head's length shortcut): the framed answers of programs/grounded/frames.py,
the head fitted with them (``-O head_frames=true``), the length-free head columns, the CV helpers' masks and
weights, and the served default on hand-written long answers (tests/length_cases.py)."""

from __future__ import annotations

import json

import numpy as np
import pytest

from halluscope.programs.grounded.frames import (CHECK_FRAMES, FRAMES, TRAIN_FRAMES, frame_answer, framed_examples,
                                                 wrong_answers)
from halluscope.programs.grounded.program import _pair_key, fit_grounded, response_rows
from halluscope.programs.grounded.response import (FRAMING_WORDS, RESPONSE_BASE, SHAPE_FEATURES, content_mask,
                                                   cv_head, fit_head, response_feature_names, response_features)
from halluscope.programs.grounded.units import units_of
from halluscope.programs.registry import get_program
from tests.length_cases import LONG_CASES
from tests.test_grounded_response import CITIES, FAST, qa_examples

Q = "What is the capital of Chile?"
CTX = "Chile is a country in South America. Its capital is Santiago, founded in 1541."


# -- frames (pure functions) ---------------------------------------------------------------------------------

def test_template_frames_put_the_answer_and_question_into_fixed_sentences():
    assert frame_answer("answer_is", Q, "Santiago.") == "The answer is Santiago."
    assert frame_answer("is_the_answer", Q, " Santiago ") == "Santiago is the answer to this question."
    assert frame_answer("restates_question", Q + "  ", "Santiago") == \
        'The answer to the question "What is the capital of Chile?" is Santiago.'
    assert frame_answer("asks_it_is", "capital of Chile", "Santiago") == \
        "The question asks: capital of Chile? It is Santiago."
    assert frame_answer("answer_is", Q, "Santiago", substitute="Lima") == "The answer is Lima."
    assert frame_answer("answer_is", Q, "  ") is None


def test_evidence_sentence_frame_and_its_substitution():
    assert frame_answer("evidence_sentence", Q, "santiago", CTX) == "Its capital is Santiago, founded in 1541."
    assert frame_answer("evidence_sentence", Q, "Santiago", CTX, substitute="Lima") == \
        "Its capital is Lima, founded in 1541."
    assert frame_answer("evidence_sentence", Q, "Valparaiso", CTX) is None  # no sentence holds it
    with pytest.raises(ValueError, match="unknown frame"):
        frame_answer("nope", Q, "Santiago")


def test_check_and_train_frames_are_disjoint_and_known():
    assert set(CHECK_FRAMES).isdisjoint(TRAIN_FRAMES)
    assert set(CHECK_FRAMES) | set(TRAIN_FRAMES) == set(FRAMES)


def test_wrong_answer_is_another_items_answer_the_evidence_lacks():
    items = [{"question": "q1", "context": "Paris is in France.", "answer": "Paris"},
             {"question": "q2", "context": "Berlin and Paris are capitals.", "answer": "Berlin"},
             {"question": "q3", "context": "Rome.", "answer": "Rome"}]
    # item 0: the next is Berlin (not in its evidence); item 1: Rome (Paris is in its evidence, skipped if next)
    assert wrong_answers(items) == ["Berlin", "Rome", "Paris"]
    items[0]["context"] = "Paris, Berlin and Rome."
    assert wrong_answers(items)[0] is None  # every other answer is in its evidence
    assert wrong_answers([{"question": "q", "context": "c", "answer": "x"}]) == [None]


def test_framed_examples_label_the_right_answer_correct_and_its_twin_hallucinated():
    exs = qa_examples()
    framed = framed_examples(exs, TRAIN_FRAMES)
    n_items = len(CITIES)
    rights = [f for f in framed if not f["label"]]
    assert len(rights) == n_items * len(TRAIN_FRAMES)  # every right answer is in its evidence sentence
    assert len(framed) == 2 * len(rights)
    by_id = {f["id"]: f for f in framed}
    one = by_id["0-frame-passage_says-right"]
    assert one["answer"] == f"According to the passage, the answer is {CITIES[0][1]}." and one["task"] == "qa"
    twin = by_id["0-frame-passage_says-wrong"]
    assert twin["label"] is True and CITIES[0][1] not in twin["answer"]
    # same question and evidence as the item: the same group key, so CV holds them out together
    item = next(ex for ex in exs if ex.id == "0")
    assert {_pair_key(f) for f in framed if f["id"].startswith("0-")} == {_pair_key(item)}
    assert framed_examples(exs, TRAIN_FRAMES, task="dialogue") == []


# -- head columns ----------------------------------------------------------------------------------------------

def test_framing_words_are_not_content_when_excluded():
    units = units_of("The answer is Santiago.")
    idf = [0.0, 0.9, 0.0, 0.9]
    assert content_mask(units, idf).tolist() == [False, True, False, True]
    assert content_mask(units, idf, FRAMING_WORDS).tolist() == [False, False, False, True]


def test_length_free_columns_have_no_counts_and_no_shape():
    unit_features = ["is_num", "log_len", "q_exact", "unsup", "al_lex"]
    names = response_feature_names(unit_features, mode="content")
    assert not {"log_units", "content_unsup_log", "unsup_run", "content_share", "p_mean"} & set(names)
    assert names[-4:] == ["cmean_unsup", "cmean_al_lex", "cmax_unsup", "cmax_al_lex"]
    assert not any(n.endswith(tuple(SHAPE_FEATURES)) for n in names if n.startswith("cm"))
    with pytest.raises(ValueError, match="head_features"):
        response_feature_names(unit_features, mode="bogus")
    # the same content said with more function words gives the same length-free row
    X1 = np.array([[0, 1.0, 0, 0.0, 1.0], [0, 1.2, 0, 1.0, 0.0]])
    X2 = np.array([[0, 0.5, 0, 0.0, 1.0], [0, 1.0, 0, 0.0, 1.0], [0, 1.2, 0, 1.0, 0.0], [0, 0.4, 0, 0.0, 1.0]])
    c1, c2 = np.array([True, True]), np.array([False, True, True, False])
    r1 = response_features("a b", units_of("a b"), X1, unit_features, [0.1, 0.9], 0.5, c1, mode="content")
    r2 = response_features("x a b y", units_of("x a b y"), X2, unit_features, [0.0, 0.1, 0.9, 0.0], 0.5, c2,
                           mode="content")
    assert r1.tolist() == r2.tolist()
    full = response_features("x a b y", units_of("x a b y"), X2, unit_features, [0.0, 0.1, 0.9, 0.0], 0.5, c2)
    assert len(full) == len(response_feature_names(unit_features)) and full[list(RESPONSE_BASE).index("log_units")] > 0


# -- the CV helpers' masks and weights -------------------------------------------------------------------------

def _toy(n=40, seed=0):
    rng = np.random.default_rng(seed)
    y = np.arange(n) % 2 == 1
    X = rng.normal(size=(n, 3)) + y[:, None] * 1.5
    groups = [f"g{i // 2}" for i in range(n)]
    return X, y, groups


def test_cv_head_never_fits_on_rows_outside_fit_rows():
    X, y, g = _toy()
    extra_X = np.random.default_rng(1).normal(size=(10, 3))
    extra_g = [f"g{i}" for i in range(10)]
    feats = ["a", "b", "c"]
    base, _ = cv_head(X, y, g, feats, metric="balanced_accuracy")
    for labels in (np.zeros(10, dtype=bool), np.ones(10, dtype=bool)):  # whatever the check rows' labels
        p, _ = cv_head(np.vstack([X, extra_X]), np.concatenate([y, labels]), g + extra_g, feats,
                       metric="balanced_accuracy", fit_rows=np.arange(50) < 40)
        assert np.allclose(p[:40], base)  # the originals are scored exactly as without the check rows
        assert (p[40:] > 0).all()  # the check rows are scored, by their item's fold


def test_fit_head_weights_and_scored_rows():
    X, y, g = _toy()
    feats = ["a", "b", "c"]
    plain, cv = fit_head(X, y, g, feats)
    # six extra rows far on the hallucinated side, labelled correct (as a framed right answer would be)
    extra = np.full((6, 3), 3.0)
    Xa, ya, ga = np.vstack([X, extra]), np.concatenate([y, np.zeros(6, dtype=bool)]), g + ["g0"] * 6
    sc = np.arange(46) < 40
    light, cv_light = fit_head(Xa, ya, ga, feats, weights=np.r_[np.ones(40), np.full(6, 0.01)], scored=sc)
    heavy, cv_heavy = fit_head(Xa, ya, ga, feats, weights=np.ones(46), scored=sc)
    point = extra[:1]
    assert heavy.predict(point)[0] < light.predict(point)[0] < plain.predict(point)[0]
    # the threshold and the held-out check only read the scored rows
    assert cv_light["n"] == cv_heavy["n"] == 40 and cv_heavy["n_fit_only"] == 6 and heavy.info["n_fit_only"] == 6
    assert "n_fit_only" not in cv


# -- the head refit path (-O head_frames=true) -------------------------------------------------------------

def test_head_frames_fits_on_framed_answers_saves_and_reloads():
    exs = qa_examples()
    m = get_program("grounded").make(units_from="none", head_frames=True, **FAST)
    info = fit_grounded(m, exs, "f1")["response"]
    framed = info["framed"]
    assert framed["frames"] == list(TRAIN_FRAMES) and framed["weight"] == m.head_frame_weight == 0.15
    assert framed["n"] == 2 * len(CITIES) * len(TRAIN_FRAMES) and framed["n_wrong"] == framed["n"] // 2
    # the threshold and the held-out check are on the original answers only
    assert info["n"] == len(exs) and info["held_out"]["n"] == len(exs)
    assert info["held_out"]["n_fit_only"] == framed["n"]
    state = json.loads(json.dumps(m.dump_state()))
    again = get_program("grounded").make(units_from="none", head_frames=True, **FAST).load_state(state)
    a = dict(question=Q, answer="The capital of Chile is Santiago, founded in 1541.", context=CTX)
    assert again(**a).score == m(**a).score
    with pytest.raises(ValueError, match="head_frame_weight"):
        get_program("grounded").make(head_frame_weight=0)
    with pytest.raises(ValueError, match="head_features"):
        get_program("grounded").make(head_features="length")


def test_head_frames_changes_only_the_response_level():
    exs = qa_examples()
    a = get_program("grounded").make(units_from="none", **FAST)
    b = get_program("grounded").make(units_from="none", head_frames=True, **FAST)
    fit_grounded(a, exs, "f1")
    fit_grounded(b, exs, "f1")
    pa = a(question=Q, answer="The answer is Santiago.", context=CTX)
    pb = b(question=Q, answer="The answer is Santiago.", context=CTX)
    assert pa.soft_labels == pb.soft_labels and pa.hard_labels == pb.hard_labels  # unit scores as before
    X, y, groups, _ = response_rows(b, framed_examples(exs, CHECK_FRAMES))
    assert X.shape[0] == len(y) and set(groups) <= {_pair_key(ex) for ex in exs}


# -- the served default on hand-written long answers ----------------------------------------------------------

def test_served_default_labels_the_long_eiffel_answers_right():
    """``detect --lang en`` (no task) and ``detect --task qa``: the artifacts served by default, no LM call."""
    from halluscope.artifacts.store import load_compiled

    case = LONG_CASES[0]
    for lang, metric in (("en", "iou"), ("qa", "f1")):
        det = load_compiled("grounded", lang=lang, metric=metric)
        m = det.program
        assert m.head is not None and m.head_frames, f"grounded/{lang} v{det.version} has no framed head"
        right = m(question=case["question"], answer=case["correct"], context=case["context"], lang="en")
        wrong = m(question=case["question"], answer=case["wrong"], context=case["context"], lang="en")
        assert right.label is False, (lang, right.rationale)
        assert wrong.label is True and wrong.score > right.score, (lang, wrong.rationale)


def test_served_default_on_the_hand_written_long_answers():
    """The sanity set: every long wrong answer caught; at most a few correct ones flagged (paraphrases the
    evidence words do not support lexically: "lies" for "located", "rises" for a height)."""
    from halluscope.artifacts.store import load_compiled

    m = load_compiled("grounded", lang="en", metric="iou").program
    correct = [m(question=c["question"], answer=c["correct"], context=c["context"], lang="en").label
               for c in LONG_CASES]
    wrong = [m(question=c["question"], answer=c["wrong"], context=c["context"], lang="en").label for c in LONG_CASES]
    assert all(wrong)
    # the question-blind head (en v0007 and v0008, #34) flags 5 of the 8 correct ones, with or without their question (en
    # v0006, which read the question's columns: 3 with it, 2 without); BENCHMARKS.md "The consistent verdict"
    assert sum(correct) <= 5
