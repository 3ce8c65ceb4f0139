"""Contextual calibration of Choice decisions (#21): JointCQ's verifier label and FINCH-ZK's judge rating divided by
a content-free request's probabilities (``-O calibrate=content_free`` / ``no_evidence``), on scripted LMs."""

from __future__ import annotations

import dspy
import pytest

from halluscope.core.decisions import contextual_choice, decision_evidence, with_logprob_decisions
from halluscope.lm.scripted import scripted_lm
from halluscope.programs.registry import get_program

# The verifier always leans "correct"; it leans a little less when the claim says Berlin (the context says Paris),
# and most when it has no claim at all: dividing by the content-free prior turns the Berlin claim "hallucinated".
PRIOR = {"correct": 0.8, "hallucinated": 0.1, "unverifiable": 0.1}
BERLIN = {"correct": 0.6, "hallucinated": 0.3, "unverifiable": 0.1}
PARIS = {"correct": 0.85, "hallucinated": 0.05, "unverifiable": 0.1}
NO_EVIDENCE = {"correct": 0.5, "hallucinated": 0.4, "unverifiable": 0.1}


def _example(city: str) -> dspy.Example:
    return dspy.Example(question="Where is the tower?", answer=f"The tower is in {city}.",
                        context="The tower is in Paris. It is old.", task="qa",
                        label=city != "Paris").with_inputs("question", "answer", "context", "task")


def _verifier_dist(call) -> dict:
    if not call.inputs.get("claim"):
        return {"label": PRIOR}
    if not call.inputs.get("snippets"):
        return {"label": NO_EVIDENCE}
    return {"label": BERLIN if "Berlin" in call.inputs["claim"] else PARIS}


def _jointcq_lm(parse_content_free: bool = True):
    def respond(call):
        if "pairs" in call.outputs:
            return {"pairs": [{"claim": call.inputs["answer"].rstrip("."), "query": "tower"}]}
        if not call.inputs.get("claim") and not parse_content_free:
            return "not json at all"
        return {"label": "correct", "rationale": "see [1]"}

    return scripted_lm(respond, logprobs=_verifier_dist)


def _run(program, lm, example):
    with dspy.context(lm=lm, adapter=with_logprob_decisions(dspy.JSONAdapter())):
        with decision_evidence() as log:
            pred = program(**example.inputs())
    return pred, log


def _verify_calls(lm) -> list:
    return [c for c in lm.engine.calls if "label" in c.outputs]


@pytest.mark.parametrize("city, uncalibrated, calibrated", [("Berlin", "correct", "hallucinated"),
                                                             ("Paris", "correct", "correct")])
def test_jointcq_content_free_divides_the_label_probabilities_by_the_empty_claims(city, uncalibrated, calibrated):
    plain, _ = _run(get_program("jointcq").make(decisions=True), _jointcq_lm(), _example(city))
    lm = _jointcq_lm()
    program = get_program("jointcq").make(calibrate="content_free")
    pred, log = _run(program, lm, _example(city))
    assert [c["label"] for c in plain.claims] == [uncalibrated]
    assert [c["label"] for c in pred.claims] == [calibrated] and pred.label is (calibrated == "hallucinated")
    want = contextual_choice(BERLIN if city == "Berlin" else PARIS, PRIOR)
    assert pred.claims[0]["probabilities"] == pytest.approx(want)
    # one content-free request per claim (the claim emptied, the same snippets), then the verification itself
    calls = _verify_calls(lm)
    assert [bool(c.inputs["claim"]) for c in calls] == [False, True]
    assert calls[0].inputs["snippets"] == calls[1].inputs["snippets"] != ""
    assert pred.calls == {"generate": 1, "verify": 1, "content_free": 1}
    # an enclosing collector (ReAnchor's) sees only the calibrated decision, not the content-free request
    assert [ev["probabilities"] for _, _, ev in log] == [pytest.approx(want)]
    assert program.verify.fields == {"label": {"weights": {"correct": 1.0, "hallucinated": 1.0,
                                                           "unverifiable": 1.0}}}


def test_jointcq_no_evidence_empties_the_snippets_instead():
    lm = _jointcq_lm()
    pred, _ = _run(get_program("jointcq").make(calibrate="no_evidence"), lm, _example("Berlin"))
    calls = _verify_calls(lm)
    assert [c.inputs["snippets"] for c in calls][0] == "" and calls[1].inputs["snippets"]
    assert calls[0].inputs["claim"] == calls[1].inputs["claim"] == "The tower is in Berlin"
    assert pred.claims[0]["probabilities"] == pytest.approx(contextual_choice(BERLIN, NO_EVIDENCE))
    assert pred.claims[0]["label"] == "correct"  # 1.2 vs 0.75 vs 1.0: the snippets do not move it enough


def test_jointcq_failed_content_free_request_is_counted_and_the_claim_is_read_uncalibrated():
    pred, _ = _run(get_program("jointcq").make(calibrate="content_free"), _jointcq_lm(parse_content_free=False),
                   _example("Berlin"))
    assert pred.failures.get("content_free") == 1
    assert pred.claims[0]["label"] == "correct"
    assert pred.claims[0]["probabilities"] == pytest.approx(BERLIN)


def test_calibrate_refuses_an_unknown_value_and_the_batched_verifier_in_one_line():
    from halluscope.programs.finch.program import FinchZK
    from halluscope.programs.jointcq.program import JointCQ

    with pytest.raises(ValueError, match="option 'calibrate' of program 'jointcq': expected one of 'content_free', "
                                         "'no_evidence' or null, got 'prior'"):
        get_program("jointcq").make(calibrate="prior")
    with pytest.raises(ValueError, match="jointcq: calibrate must be one of content_free, no_evidence or null"):
        JointCQ(calibrate="prior")
    with pytest.raises(ValueError, match="decisions needs batch_verify=false"):
        get_program("jointcq").make(calibrate="content_free", batch_verify=True)
    with pytest.raises(ValueError, match="option 'calibrate' of program 'finch'"):
        get_program("finch").make(calibrate="prior")
    with pytest.raises(ValueError, match="finch: calibrate must be one of content_free, no_evidence or null"):
        FinchZK(calibrate="prior")


# -- FINCH-ZK -------------------------------------------------------------------------------------------------

JUDGE_PRIOR = {"accurate": 0.9, "contradiction": 0.05, "neutral": 0.05}
JUDGE_BERLIN = {"accurate": 0.7, "contradiction": 0.2, "neutral": 0.1}
JUDGE_PARIS = {"accurate": 0.95, "contradiction": 0.02, "neutral": 0.03}
JUDGE_NO_SAMPLE = {"accurate": 0.6, "contradiction": 0.3, "neutral": 0.1}


def _judge_dist(call) -> dict:
    if "rating" not in call.outputs:
        return {}
    if not call.inputs.get("block"):
        return {"rating": JUDGE_PRIOR}
    if not call.inputs.get("sample"):
        return {"rating": JUDGE_NO_SAMPLE}
    return {"rating": JUDGE_BERLIN if "Berlin" in call.inputs["block"] else JUDGE_PARIS}


def _finch_lm():
    from tests.test_reanchor_gepa import _finch_lm as scripted_finch  # samples "Item holds are in Paris."

    return scripted_finch(logprobs=_judge_dist)


def _judge_calls(lm) -> list:
    return [c for c in lm.engine.calls if "rating" in c.outputs]


@pytest.mark.parametrize("city, rating", [("Berlin", "contradiction"), ("Paris", "accurate")])
def test_finch_content_free_asks_once_per_sample_with_the_block_and_answer_emptied(city, rating):
    from halluscope.programs.finch.program import FinchZK

    plain, _ = _run(FinchZK(n_samples=2, correct=False, decisions=True), _finch_lm(), _example(city))
    lm = _finch_lm()
    program = FinchZK(n_samples=2, correct=False, calibrate="content_free")
    assert program.decisions and not program.batch_judge
    pred, log = _run(program, lm, _example(city))
    assert [u["label"] for u in plain.units] == ["accurate"]
    assert [v["rating"] for v in pred.ratings[0]] == [rating, rating]
    assert pred.label is (rating == "contradiction")
    calls = _judge_calls(lm)
    empty = [c for c in calls if not c.inputs["block"]]
    assert len(empty) == 2 and all(c.inputs["answer"] == "" and c.inputs["sample"] for c in empty)
    assert pred.calls["content_free"] == 2 and pred.calls["judge"] == 2
    want = contextual_choice(JUDGE_BERLIN if city == "Berlin" else JUDGE_PARIS, JUDGE_PRIOR)
    judged = [ev["probabilities"] for _, name, ev in log if name == "rating"]
    assert judged == [pytest.approx(want)] * 2  # the content-free requests are not among the decisions


def test_finch_no_evidence_asks_once_per_block_with_the_sample_emptied():
    from halluscope.programs.finch.program import FinchZK

    lm = _finch_lm()
    pred, log = _run(FinchZK(n_samples=2, correct=False, calibrate="no_evidence"), lm, _example("Berlin"))
    empty = [c for c in _judge_calls(lm) if not c.inputs["sample"]]
    assert len(empty) == 1 and empty[0].inputs["block"] == "The tower is in Berlin."
    want = contextual_choice(JUDGE_BERLIN, JUDGE_NO_SAMPLE)
    assert [ev["probabilities"] for _, name, ev in log if name == "rating"] == [pytest.approx(want)] * 2
    assert [v["rating"] for v in pred.ratings[0]] == ["accurate", "accurate"]  # 1.17 vs 0.67 vs 1.0


# -- MEDICO (a Boolean verdict: the same calibration as ``direct``) ---------------------------------------------


def _medico_lm(parse_content_free: bool = True):
    def p_true(call) -> float:
        answer = call.inputs.get("answer", "")
        return 0.87 if not answer else 0.93 if "Berlin" in answer else 0.81

    def respond(call):
        if "verdict" not in call.outputs:
            return {k: "x" for k in call.outputs}
        if not call.inputs.get("answer") and not parse_content_free:
            return "not json at all"
        return {"verdict": "Yes", "rationale": 'see "Berlin"'}  # says hallucinated to everything

    return scripted_lm(respond, logprobs=lambda call: {k: {"Yes": p_true(call), "No": 1 - p_true(call)}
                                                       for k in call.outputs if k == "verdict"})


def test_medico_content_free_calibrates_the_verdict_so_it_stops_flagging_everything():
    from halluscope.core.decisions import contextual_probability
    from halluscope.programs.medico.program import Medico

    lm = _medico_lm()
    program = Medico(correct=False, calibrate="content_free")
    assert program.detect.fields == {"verdict": {"threshold": 0.5}}
    wrong, _ = _run(program, lm, _example("Berlin"))
    right, _ = _run(program, lm, _example("Paris"))
    assert (wrong.label, right.label) == (True, False)
    assert wrong.score == pytest.approx(contextual_probability(0.93, 0.87))
    assert right.score == pytest.approx(contextual_probability(0.81, 0.87))
    detect = [c for c in lm.engine.calls if "verdict" in c.outputs]
    assert [c.inputs["answer"] for c in detect] == ["", "The tower is in Berlin.", "", "The tower is in Paris."]
    assert detect[0].inputs["evidence"] == detect[1].inputs["evidence"]  # the same evidence, the answer emptied

    plain = Medico(correct=False)
    plain.detect.fields = {"verdict": {"threshold": 0.5}}
    assert _run(plain, _medico_lm(), _example("Paris"))[0].label is True  # uncalibrated: P(True) 0.81


def test_medico_failed_content_free_request_is_counted_and_the_verdict_read_uncalibrated():
    from halluscope.programs.medico.program import Medico

    pred, _ = _run(Medico(correct=False, calibrate="content_free"), _medico_lm(parse_content_free=False),
                   _example("Paris"))
    assert pred.failures.get("content_free") == 1
    assert pred.label is True and pred.score == pytest.approx(0.81)
    with pytest.raises(ValueError, match="option 'calibrate' of program 'medico'"):
        get_program("medico").make(calibrate="no_evidence")
