"""#34: a response head that never reads the question (``head_question=false``) and reads the task instead
(``head_task=true``): the same verdict with or without the question, up to what the question adds as evidence."""

from __future__ import annotations

import json

import numpy as np

from halluscope.programs.grounded.program import STATE_KEY, fit_grounded
from halluscope.programs.grounded.response import (LEGACY_SUMMARY_EVIDENCE_WORDS, QUESTION_COLUMNS,
                                                   SUMMARY_ANSWER_WORDS, SUMMARY_EVIDENCE_WORDS, TASK_COLUMNS,
                                                   answer_task)
from halluscope.programs.registry import get_program as get
from tests.test_grounded_response import FAST, qa_examples

BLIND = {"head_question": False, "head_task": True, "resp_cov": True, **FAST}


def test_the_task_is_the_given_one_else_read_from_the_answers_and_evidences_length():
    long_answer = " ".join(["word"] * SUMMARY_ANSWER_WORDS)
    long_evidence = " ".join(["text"] * SUMMARY_EVIDENCE_WORDS)
    assert answer_task("dialogue", long_answer, long_evidence) == "dialogue"  # a given task always wins
    assert answer_task("SUM", "Paris.", "short") == "summarization"  # its aliases too
    assert answer_task("", long_answer, long_evidence) == "summarization"
    assert answer_task("", long_answer, "a short passage") == "qa"
    assert answer_task("", "Paris.", long_evidence) == "qa"
    assert answer_task("", " ".join(["word"] * (SUMMARY_ANSWER_WORDS - 1)), long_evidence) == "qa"


def test_a_question_blind_head_has_no_question_column_and_the_task_column_last():
    blind = get("grounded").make(units_from="none", **BLIND).response_features
    reads = get("grounded").make(units_from="none", resp_cov=True, **FAST).response_features
    assert set(QUESTION_COLUMNS) <= set(reads)  # the head served before #34 read them
    assert not set(QUESTION_COLUMNS) & set(blind)
    assert blind[-len(TASK_COLUMNS):] == list(TASK_COLUMNS)
    assert [f for f in reads if f not in QUESTION_COLUMNS] == blind[:-len(TASK_COLUMNS)]


def test_the_question_blind_head_gives_the_same_verdict_with_and_without_the_question():
    exs = qa_examples()
    m = get("grounded").make(units_from="none", **BLIND)
    info = fit_grounded(m, exs, "f1")
    assert m.head is not None and m.head.features == m.response_features and info["response"]["held_out"]["auc"] > 0.9
    seen = []
    row = m.response_row
    m.response_row = lambda *a, **k: (seen.append(k.get("task")), row(*a, **k))[1]
    for ex in exs:
        with_q = m(question=ex.question, answer=ex.answer, context=ex.context, task="qa")
        without = m(question="", answer=ex.answer, context=ex.context)
        assert with_q.label == without.label == ex.label, ex.answer
    assert seen[:2] == ["qa", ""]  # the task given to forward reaches the head's row
    del m.response_row
    # the task column: summarization when told, else from the answer's and evidence's shape, never the question
    ex = exs[0]
    feats, probs = m.unit_probs(question=ex.question, answer=ex.answer, context=ex.context, lang="en")
    j = m.response_features.index("t_summary")
    assert m.response_row(ex.answer, feats, probs, question=ex.question, context=ex.context, task="summarization")[j] == 1
    for q in (ex.question, ""):
        assert m.response_row(ex.answer, feats, probs, question=q, context=ex.context)[j] == 0
    state = json.loads(json.dumps(m.dump_state()))  # the options rebuild the same columns from the state
    again = get("grounded").make(units_from="none", **BLIND).load_state(state)
    assert np.isclose(again(question="", answer=ex.answer, context=ex.context).score,
                      m(question="", answer=ex.answer, context=ex.context).score)

    assert m.head.info["summary_evidence_words"] == SUMMARY_EVIDENCE_WORDS == again.summary_words


def test_a_head_keeps_the_summary_bound_it_was_fitted_with():
    """A head fitted by this code records the evidence bound of its task rule; a head that records none (fitted
    before the bound moved from 250 to 225 words) keeps 250 when loaded, so served artifacts keep their verdicts."""
    exs = qa_examples()
    m = get("grounded").make(units_from="none", **BLIND)
    fit_grounded(m, exs, "f1")
    state = json.loads(json.dumps(m.dump_state()))
    between = " ".join(["text"] * (SUMMARY_EVIDENCE_WORDS + 5))  # between the two bounds
    answer = " ".join(["word"] * SUMMARY_ANSWER_WORDS)
    feats, probs = m.unit_probs(question="", answer=answer, context=between, lang="en")
    j = m.response_features.index("t_summary")
    now = get("grounded").make(units_from="none", **BLIND).load_state(state)
    assert now.summary_words == SUMMARY_EVIDENCE_WORDS < LEGACY_SUMMARY_EVIDENCE_WORDS
    assert now.response_row(answer, feats, probs, context=between)[j] == 1
    del state[STATE_KEY]["response"]["info"]["summary_evidence_words"]
    old = get("grounded").make(units_from="none", **BLIND).load_state(state)
    assert old.summary_words == LEGACY_SUMMARY_EVIDENCE_WORDS
    assert old.response_row(answer, feats, probs, context=between)[j] == 0
    assert answer_task("", answer, between, LEGACY_SUMMARY_EVIDENCE_WORDS) == "qa"
    assert answer_task("", answer, between) == "summarization"


# -- German "wurde" / "fertiggestellt": a verbatim word is never "unsupported" (#34) ----------------------------

DE_EV = ("Der Eiffelturm ist ein 330 Meter hoher Eisenfachwerkturm in Paris. Er wurde für die Weltausstellung 1889 "
         "errichtet und am 31. März 1889 fertiggestellt.")


def test_a_flagged_word_that_stands_verbatim_in_the_evidence_is_labelled_verbatim_not_unsupported():
    from halluscope.artifacts.store import best_version, list_versions, load_compiled
    from halluscope.core.contract import display_marks
    from halluscope.programs.grounded.program import VERBATIM_REASON

    # the version served without the optional extras: it flags verbatim words next to wrong ones, which is what
    # the label is for (the encoder's version, served with the extra, leaves them below 0.5 here)
    plain = best_version(list_versions("grounded", "de", "iou"), installed=set()).version
    m = load_compiled("grounded", lang="de", metric="iou", version=plain).program
    answer = "Der Eiffelturm in Berlin wurde 1912 fertiggestellt."
    d = m(question="", answer=answer, context=DE_EV, lang="de").detection
    labels = {u.text: u for u in d.units}
    assert d.label is True and labels["1912"].label == labels["Berlin"].label == "unsupported"
    for word in ("wurde", "fertiggestellt"):  # verbatim in DE_EV; the words around them are wrong
        assert word in DE_EV
        if labels[word].score > 0.5:
            assert labels[word].label == "verbatim" and labels[word].rationale == VERBATIM_REASON
    assert any(labels[w].label == "verbatim" for w in ("wurde", "fertiggestellt"))
    assert not [u for u in d.units if u.label == "unsupported" and u.text in DE_EV.split()]
    # a label, not a probability: the word stays inside the hard span its probability puts it in
    hard = {i for a, b in d.hard_labels for i in range(a, b)}
    for u in d.units:
        assert (u.score > 0.5) == any(i in hard for i in range(u.start, u.end))
    assert all(mk["kind"] == "hallucinated" for mk in display_marks(d) if mk["prob"] > 0.5)


# -- decide_words / decide_p: which flagged words of a one-sentence answer overrule the head (dialogue) ----------

CONTEXT = ("The Golden Gate Bridge is a suspension bridge in San Francisco, California. It opened in 1937, and "
           "its main span is 1,280 metres long.")


def _correct_head(**options):
    from halluscope.programs.grounded.combiner import Combiner
    from halluscope.programs.grounded.response import ResponseHead

    m = get("grounded").make(**FAST, **options)
    feats = m.response_features
    m.head = ResponseHead(Combiner(feats, [-6.0] + [0.0] * len(feats)), threshold=0.5)  # says "correct", always
    return m


def test_with_decide_words_claims_a_flagged_name_or_number_decides_a_one_sentence_answer_a_flagged_word_does_not():
    chatty = "I really love that beautiful bridge, it is wonderful."
    wrong = "The Golden Gate Bridge in Los Angeles opened in 1947."
    default, claims = _correct_head(), _correct_head(decide_words="claims")
    flagged = [u["text"] for u in default(question="", answer=chatty, context=CONTEXT, lang="en").units
               if u["score"] > 0.5]
    assert flagged and not any(w[0].isupper() or w[0].isdigit() for w in flagged)  # common words only
    assert default(question="", answer=chatty, context=CONTEXT, lang="en").label is True  # any flagged word decides
    pred = claims(question="", answer=chatty, context=CONTEXT, lang="en")
    assert pred.label is False and pred.hard_labels == [] and pred.score <= 0.5
    assert {u["text"] for u in pred.units if u["label"] == "doubtful"} == set(flagged)
    assert "decide nothing held at 0.5 (doubtful)" in pred.rationale
    pred = claims(question="", answer=wrong, context=CONTEXT, lang="en")
    assert pred.label is True and pred.hard_labels and "flagged claim(s) decide the label" in pred.rationale
    hard_words = {wrong[a:b] for a, b in pred.hard_labels}
    assert any("Los" in w or "1947" in w for w in hard_words)
    # decide_p: a claim must also clear that probability
    strict = _correct_head(decide_words="claims", decide_p=0.999)
    pred = strict(question="", answer=wrong, context=CONTEXT, lang="en")
    assert pred.label is False and pred.hard_labels == []


def test_decide_and_head_metric_options_are_checked():
    import pytest

    for bad in ({"decide_words": "names"}, {"decide_p": 0.2}, {"decide_p": 1.0}, {"head_metric": "auc"}):
        with pytest.raises(ValueError, match=next(iter(bad))):
            get("grounded").make(**FAST, **bad)
