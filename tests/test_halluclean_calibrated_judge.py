"""``halluclean -O calibrate=content_free``: the judge's P(Yes) divided by a content-free judge request's (#21 round
five), on scripted LMs."""

from __future__ import annotations

import json

import dspy
import pytest

from halluscope.core.decisions import contextual_probability, with_logprob_decisions
from halluscope.lm.scripted import scripted_lm
from halluscope.optimize.cv import OptimizerConfig
from halluscope.optimize.run import FINISHED, OptimizeConfig, run_optimize
from halluscope.programs.registry import OptionError, get_program

from tests.test_reanchor_gepa import _baseline_examples


def _examples() -> list[dspy.Example]:
    """Two contexts with different baselines; even items are hallucinated (the fixture direct's calibration tests use)."""
    return _baseline_examples()


def _content_free(call) -> bool:
    return "(empty)" in call.inputs.get("input", "")


def _p_yes(call) -> float:
    """The judge says Yes to everything; its P(Yes) is a per-context baseline (what the content-free request gets)
    moved a little by the answer: raw P(Yes) does not separate right from wrong across the two contexts."""
    text = call.inputs.get("input", "")
    base = 0.95 if "Paris." in text else 0.70
    if _content_free(call):
        return base
    wrong = any(city in text for city in ("Berlin", "Madrid"))
    return {0.95: (0.97 if wrong else 0.93), 0.70: (0.80 if wrong else 0.65)}[base]


def _respond(call):
    if "verdict" in call.outputs:
        return {"verdict": "Yes"}
    if "answer" in call.outputs:  # the log-probability probe before an optimizer runs
        return {"answer": "Yes"}
    return {"plan": "1. compare the place", "analysis": "the place is named"}


def _lm(respond=_respond):
    return scripted_lm(respond, logprobs=lambda call: {
        k: {"Yes": _p_yes(call), "No": 1 - _p_yes(call)} for k in call.outputs if k in ("verdict", "answer")})


def test_the_content_free_judge_request_has_no_answer_and_no_analysis_and_divides_p_yes():
    examples = _examples()
    lm = _lm()
    raw = get_program("halluclean").make(revise=False, decisions=True)
    raw.judge.fields = {"verdict": {"threshold": 0.5}}
    program = get_program("halluclean").make(revise=False, calibrate="content_free")
    assert program.judge.fields == {"verdict": {"threshold": 0.5}}  # a decision from the start
    with dspy.context(lm=lm, adapter=with_logprob_decisions(dspy.JSONAdapter())):
        raw_preds = [raw(**e.inputs()) for e in examples]
        n_before = len(lm.engine.calls)
        preds = [program(**e.inputs()) for e in examples]
    labels = [e.label for e in examples]
    assert all(p.label for p in raw_preds)  # raw P(Yes) 0.65-0.97: "Yes" on every case
    assert [p.label for p in preds] == labels  # calibrated: the default cut 0.5 separates them
    for p, e in zip(preds, examples):
        base = 0.95 if "Paris" in e.context else 0.70
        raw_p = {0.95: (0.97 if e.label else 0.93), 0.70: (0.80 if e.label else 0.65)}[base]
        assert p.score == pytest.approx(contextual_probability(raw_p, base)) and not p.failures
    calls = lm.engine.calls[n_before:]
    judge = [c for c in calls if "verdict" in c.outputs]
    free = [c for c in judge if _content_free(c)]
    assert len(free) == len(examples) and len(judge) == 2 * len(examples)  # one more judge request per case
    assert all(c.inputs["analysis"] == "" for c in free)  # no plan or reasoning for the content-free request
    assert all(c.inputs["analysis"] == "the place is named" for c in judge if not _content_free(c))
    # plan and reason run once per case, never for the content-free request
    assert len([c for c in calls if "plan" in c.outputs]) == len(examples)
    assert not [c for c in calls if not ("verdict" in c.outputs) and _content_free(c)]


def test_the_content_free_judge_request_is_not_traced_nor_a_decision_reanchor_sees():
    from halluscope.core.decisions import decision_evidence

    program = get_program("halluclean").make(revise=False, calibrate="content_free")
    with dspy.context(lm=_lm(), adapter=with_logprob_decisions(dspy.JSONAdapter()), trace=[]), \
            decision_evidence() as log:
        program(**_examples()[0].inputs())
        trace = dspy.settings.trace
    judged = [t for t in trace if "verdict" in t[2]]
    assert len(judged) == 1 and "(empty)" not in judged[0][1]["input"]
    assert len([ev for _, name, ev in log if name == "verdict"]) == 1


def test_a_content_free_judge_request_that_fails_counts_a_failure_and_the_case_goes_on():
    def respond(call):
        if "verdict" in call.outputs and _content_free(call):
            return "not json at all"
        return _respond(call)

    program = get_program("halluclean").make(revise=False, calibrate="content_free")
    with dspy.context(lm=_lm(respond), adapter=with_logprob_decisions(dspy.JSONAdapter())):
        pred = program(**_examples()[0].inputs())
    assert pred.failures.get("content_free") == 1
    assert pred.score == pytest.approx(0.97) and pred.label is True  # read uncalibrated, and said so


def test_halluclean_calibrate_option_is_checked_by_the_registry():
    assert get_program("halluclean").make(calibrate="content_free").calibrate == "content_free"
    assert get_program("halluclean").make().calibrate is None
    with pytest.raises(OptionError, match="calibrate"):
        get_program("halluclean").make(calibrate="contentfree")


def test_reanchor_fits_the_calibrated_judge(tmp_path):
    cfg = OptimizeConfig(program="halluclean", program_options={"revise": False, "calibrate": "content_free"},
                         metric="accuracy", folds=2, mlflow=False, compiled_dir=tmp_path / "compiled",
                         report_dir=tmp_path / "reports", optimizer=OptimizerConfig(name="reanchor"))
    res = run_optimize(cfg, _examples(), task_lm=_lm())
    assert res.status == FINISHED, res.error
    assert res.cv.mean("zero_shot")["balanced_accuracy"]["mean"] == 1.0  # the calibrated cut 0.5 already separates
    assert res.cv.mean("compiled")["balanced_accuracy"]["mean"] == 1.0
    saved = json.loads((res.artifact.path / "program.json").read_text())
    assert "threshold" in saved["judge"]["fields"]["verdict"]
