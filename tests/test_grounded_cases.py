"""The hand-written case suite (tests/grounded_cases.py) against the committed artifacts (#19).

Two views: the newest committed version of each language (what scripts/refit_committed.sh wrote with the #19
signals), and what ``halluscope detect --lang xx`` serves by default. The pre-#19 versions are retired (their
RETIRED file says why), so the served one carries the #19 signals and must pass every case."""

from __future__ import annotations

import pytest

from halluscope.artifacts.store import list_versions, load_compiled, retired_reason
from halluscope.core.contract import display_marks
from tests.grounded_cases import CASES, NO_EVIDENCE_CASES


def flagged_words(pred, answer: str) -> set[str]:
    """The words of ``answer`` (its units' texts) with at least one character inside a hard label."""
    marked = set()
    for a, b in pred.hard_labels:
        marked.update(range(a, b))
    return {u["text"] for u in pred.units if any(i in marked for i in range(u["start"], u["end"]))}


def case_problems(detector, case, question: str | None = None, keep_words: bool = True) -> list[str]:
    """What ``detector`` gets wrong on ``case`` (empty: it passes), asked with the case's question or, given,
    ``question`` ("" = without one); ``keep_words`` False: the words a wrong answer must not flag are not checked
    (without the question a word may lose the support the question gave it: the verdict must hold, not each word)."""
    cid, lang, kind, evidence, q, answer, flag, keep, correct = case
    pred = detector(question=q if question is None else question, answer=answer, context=evidence, lang=lang)
    got = flagged_words(pred, answer)
    problems = [f"{w!r} not flagged" for w in flag if w not in got]
    problems += [f"{w!r} flagged" for w in keep if w in got and (keep_words or correct)]
    if correct and (got or pred.label):
        problems.append(f"label should be correct, flagged {sorted(got)}")
    if not correct and not pred.label:
        problems.append("label should be hallucinated")
    if bool(pred.label) != (pred.score > 0.5) or (pred.hard_labels and not pred.label):
        problems.append(f"verdict disagrees with itself: label {pred.label}, score {pred.score}, {pred.hard_labels}")
    row = pred.detection.to_dict()
    doubted = {answer[m["start"]:m["end"]].strip() for m in display_marks(row)}
    shown = [w for w in keep if any(w in t for t in doubted)]
    if correct and shown:
        problems.append(f"shown as doubtful on a correct answer: {shown}")
    return problems


_DETECTORS: dict = {}


def loaded(lang: str, newest: bool):
    key = (lang, newest)
    if key not in _DETECTORS:
        version = max(v.version for v in list_versions("grounded", lang, "iou")
                      if retired_reason(v.path) is None) if newest else None
        _DETECTORS[key] = load_compiled("grounded", lang=lang, metric="iou", version=version).program
    return _DETECTORS[key]


@pytest.mark.parametrize("case", CASES, ids=[c[0] for c in CASES])
def test_newest_committed_artifact_on_hand_written_case(case):
    assert case_problems(loaded(case[1], newest=True), case) == []


@pytest.mark.parametrize("case", CASES, ids=[c[0] for c in CASES])
def test_served_artifact_on_hand_written_case(case):
    det = loaded(case[1], newest=False)
    assert "al_verb" in det.features, f"the served grounded/{case[1]} artifact has no #19 signals"
    assert case_problems(det, case) == []


@pytest.mark.parametrize("case", CASES, ids=[c[0] for c in CASES])
def test_served_artifact_without_the_question_gives_the_same_verdict(case):
    det = loaded(case[1], newest=False)
    assert case_problems(det, case, question="", keep_words=False) == []
    with_q = det(question=case[4], answer=case[5], context=case[3], lang=case[1]).label
    without = det(question="", answer=case[5], context=case[3], lang=case[1]).label
    assert with_q == without


@pytest.mark.parametrize("case", NO_EVIDENCE_CASES, ids=[c[0] for c in NO_EVIDENCE_CASES])
def test_served_artifact_without_evidence_says_unverifiable_and_paints_nothing(case):
    cid, lang, question, answer = case
    pred = loaded(lang, newest=False)(question=question, answer=answer, context="", lang=lang)
    row = pred.detection.to_dict()
    assert row["verdict"] == "unverifiable" and row["label"] is False and row["hard_labels"] == []
    assert display_marks(row) == [] and "no evidence" in row["verdict_reason"]


def test_the_suite_covers_what_issue_19_asks():
    kinds = {c[2] for c in CASES}
    assert {"numbers verbatim", "numbers format-variant", "substituted name", "substituted place",
            "substituted number", "substituted date", "negation flipped", "paraphrased correct sentence",
            "fully correct answer"} <= kinds
    assert len({c[1] for c in CASES}) >= 4


def test_served_artifacts_give_the_same_verdicts_from_many_threads_at_once():
    """A server answers no-LM requests in parallel threads: the served detector, shared by them, must give each
    request the verdict it gives it alone (a shared sentence splitter once broke FINCH's that way)."""
    import threading
    from concurrent.futures import ThreadPoolExecutor

    cases = [(c[0], c[1], c[3], c[4], c[5]) for c in CASES] + [(c[0], c[1], "", c[2], c[3]) for c in NO_EVIDENCE_CASES]
    detectors = {c[1]: loaded(c[1], False) for c in cases}

    def verdict(case):
        cid, lang, evidence, q, answer = case
        return detectors[lang](question=q, answer=answer, context=evidence, lang=lang).detection.to_dict()

    alone = [verdict(c) for c in cases]
    start = threading.Barrier(8)

    def run(k):
        start.wait(timeout=60)
        return [(i, verdict(cases[i])) for i in range(k % 8, len(cases), 8) for _ in range(2)]

    with ThreadPoolExecutor(8) as pool:
        for rows in pool.map(run, range(8)):
            for i, got in rows:
                assert got == alone[i], cases[i][0]
