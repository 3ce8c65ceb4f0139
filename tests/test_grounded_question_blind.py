"""#34: a response head that never reads the question (``head_question=false``) and reads the task instead
(``head_task=true``): the same verdict with or without the question, up to what the question adds as evidence."""

from __future__ import annotations

import json

import numpy as np

from halluscope.programs.grounded.program import fit_grounded
from halluscope.programs.grounded.response import (QUESTION_COLUMNS, SUMMARY_ANSWER_WORDS, SUMMARY_EVIDENCE_WORDS,
                                                   TASK_COLUMNS, answer_task)
from halluscope.programs.registry import get
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
