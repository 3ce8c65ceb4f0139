"""The hand-written case suite (tests/grounded_cases.py) against the committed default artifacts: what
``halluscope detect --lang xx`` loads (compiled/grounded/<lang>/iou, best version), with the sentence encoder
when it is installed (#19)."""

from __future__ import annotations

import pytest

from tests.grounded_cases import CASES
from halluscope.artifacts import load_compiled


def flagged_words(pred, answer: str) -> set[str]:
    """The words of ``answer`` (its units' texts) with at least one character inside a hard label."""
    marked = set()
    for a, b in pred.hard_labels:
        marked.update(range(a, b))
    return {u["text"] for u in pred.units if any(i in marked for i in range(u["start"], u["end"]))}


def case_problems(detector, case) -> list[str]:
    """What ``detector`` gets wrong on ``case`` (empty: it passes)."""
    cid, lang, kind, evidence, question, answer, flag, keep, correct = case
    pred = detector(question=question, answer=answer, context=evidence, lang=lang)
    got = flagged_words(pred, answer)
    problems = [f"{w!r} not flagged" for w in flag if w not in got]
    problems += [f"{w!r} flagged" for w in keep if w in got]
    if correct and got:
        problems.append(f"label should be correct, flagged {sorted(got)}")
    return problems


_DETECTORS: dict = {}


def committed(lang: str):
    if lang not in _DETECTORS:
        _DETECTORS[lang] = load_compiled("grounded", lang=lang, metric="iou").program
    return _DETECTORS[lang]


@pytest.mark.parametrize("case", CASES, ids=[c[0] for c in CASES])
def test_committed_artifact_on_hand_written_case(case):
    assert case_problems(committed(case[1]), case) == []


def test_the_suite_covers_what_issue_19_asks():
    kinds = {c[2] for c in CASES}
    assert {"numbers verbatim", "numbers format-variant", "substituted name", "substituted place",
            "substituted number", "substituted date", "negation flipped", "paraphrased correct sentence",
            "fully correct answer"} <= kinds
    assert len({c[1] for c in CASES}) >= 4
