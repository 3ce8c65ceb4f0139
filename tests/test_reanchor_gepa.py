"""ReAnchor calibration of decision outputs and GEPA with textual feedback (#21), on scripted LMs."""

from __future__ import annotations

import json
import math
from typing import Literal

import dspy
import pytest

from halluscope.artifacts import store as A
from halluscope.core.decisions import (NoLogprobsError, logprobs_problem, option_probabilities,
                                  with_logprob_decisions)
from halluscope.metrics.feedback import evidence_snippet, feedback_metric, response_feedback, span_feedback
from halluscope.optimize.cv import OptimizerConfig
from halluscope.optimize.optimizers import gepa_metric
from halluscope.optimize.run import FINISHED, OptimizeConfig, optimizer_tracking, run_optimize
from halluscope.lm.scripted import scripted_lm


def _examples(n: int = 16) -> list[dspy.Example]:
    """Even items are hallucinated ("Berlin" where the context says Paris)."""
    out = []
    for i in range(n):
        bad = i % 2 == 0
        out.append(dspy.Example(id=str(i), question=f"Where is item {i}?", answer=("Berlin" if bad else "Paris")
                                + f" holds item {i}.", context=f"Item {i} is in Paris. It is old.", task="qa",
                                label=bad).with_inputs("question", "answer", "context", "task"))
    return out


def _p_yes(call) -> float:
    """A model that says Yes to everything, a little more surely when the answer is wrong."""
    return 0.93 if "Berlin" in call.inputs.get("input", "") else 0.81


def _logprobs(call) -> dict:
    return {k: {"Yes": _p_yes(call), "No": 1 - _p_yes(call)} for k in call.outputs}


def _always_yes_lm(**kw):
    return scripted_lm(lambda call: {k: "Yes" for k in call.outputs}, **kw)


def _config(tmp_path, **kw) -> OptimizeConfig:
    base = dict(program="direct", metric="accuracy", folds=2, mlflow=False, compiled_dir=tmp_path / "compiled",
                report_dir=tmp_path / "reports")
    base.update(kw)
    return OptimizeConfig(**base)


# ------------------------------------------------------------------------------------------------------
# Reading probabilities from token alternatives
# ------------------------------------------------------------------------------------------------------


def test_option_probabilities_read_the_value_token_and_its_alternatives():
    text = '{"verdict": "Yes"}'
    tokens = [{"token": '{"verdict": "', "logprob": -0.1, "top_logprobs": []},
              {"token": "Yes", "logprob": math.log(0.6), "top_logprobs": [
                  {"token": "Yes", "logprob": math.log(0.6)}, {"token": "yes", "logprob": math.log(0.1)},
                  {"token": "No", "logprob": math.log(0.2)}, {"token": "The", "logprob": math.log(0.1)}]},
              {"token": '"}', "logprob": -0.1, "top_logprobs": []}]
    p = option_probabilities(tokens, text.index("Yes"), ["Yes", "No"])
    assert p == pytest.approx({"Yes": 0.7 / 0.9, "No": 0.2 / 0.9})
    # a token that carries the opening quote: the alternatives must carry it too
    tokens = [{"token": '{"verdict": ', "logprob": -0.1},
              {"token": '"No', "logprob": math.log(0.5), "top_logprobs": [
                  {"token": '"No', "logprob": math.log(0.5)}, {"token": '"Yes', "logprob": math.log(0.5)},
                  {"token": "Yes", "logprob": math.log(0.9)}]}]
    assert option_probabilities(tokens, len('{"verdict": "'), ["Yes", "No"]) == pytest.approx({"Yes": .5, "No": .5})
    assert option_probabilities(tokens[:1], 3, ["Yes", "No"]) is None  # no alternative begins a label


def test_calibrated_direct_reads_p_yes_into_the_score():
    from halluscope.programs.halluclean.program import build_direct

    lm = _always_yes_lm(logprobs=_logprobs)
    program = build_direct(decisions=True)
    program.ask.fields = {"verdict": {"threshold": 0.9}}
    ex = _examples(2)
    with dspy.context(lm=lm, adapter=with_logprob_decisions(dspy.JSONAdapter())):
        wrong, right = (program(**e.inputs()) for e in ex)
    assert (wrong.label, right.label) == (True, False)  # P(Yes) 0.93 / 0.81 against the cut point 0.9
    assert wrong.score == pytest.approx(0.93) and right.score == pytest.approx(0.81)
    assert all("Literal" in c.outputs["verdict"] and "'No'" in c.outputs["verdict"] for c in lm.engine.calls)


# ------------------------------------------------------------------------------------------------------
# ReAnchor through the optimize run
# ------------------------------------------------------------------------------------------------------


def test_reanchor_calibrates_direct_under_cross_validation_and_the_artifact_keeps_the_fit(tmp_path):
    lm = _always_yes_lm(logprobs=_logprobs)
    cfg = _config(tmp_path, optimizer=OptimizerConfig(name="reanchor"))
    res = run_optimize(cfg, _examples(), task_lm=lm)
    assert res.status == FINISHED, res.error
    zs, cp = res.cv.mean("zero_shot"), res.cv.mean("compiled")
    assert zs["balanced_accuracy"]["mean"] == 0.5  # the generated word: Yes to everything
    assert cp["balanced_accuracy"]["mean"] == 1.0  # the fitted cut point on P(Yes) separates them
    row = res.final_info["reanchor"]["fitted"][0]
    assert (row["predictor"], row["field"], row["parameter"]) == ("ask", "verdict", "threshold")
    assert 0.81 < row["value"] <= 0.93
    assert res.manifest["program_options"]["decisions"] is True
    assert res.manifest["optimizer"]["name"] == "reanchor"

    saved = json.loads((res.artifact.path / "program.json").read_text())
    assert saved["ask"]["fields"] == {"verdict": {"threshold": row["value"]}}  # JSON, part of the state
    loaded = A.load_compiled("direct", lang="all", metric="accuracy", root=tmp_path / "compiled")
    assert loaded.program.ask.fields == saved["ask"]["fields"]
    with dspy.context(lm=lm, adapter=with_logprob_decisions(dspy.JSONAdapter())):
        labels = [loaded.program(**e.inputs()).label for e in _examples(4)]
    assert labels == [True, False, True, False]


def test_bootstrap_then_reanchor_is_one_staged_optimizer(tmp_path):
    lm = _always_yes_lm(logprobs=_logprobs)
    opt = OptimizerConfig(name="bootstrap+reanchor", max_bootstrapped_demos=1)
    assert (opt.name, opt.reanchor, opt.label) == ("bootstrap", True, "bootstrap+reanchor")
    res = run_optimize(_config(tmp_path, optimizer=opt, folds=1), _examples(), task_lm=lm)
    assert res.status == FINISHED, res.error
    assert "reanchor" in res.final_info and res.manifest["optimizer"]["reanchor"] is True
    assert "then ReAnchor" in res.manifest["optimizer"]["description"]


def test_reanchor_refuses_a_backend_without_logprobs_in_one_line(tmp_path):
    lm = _always_yes_lm()  # answers, but never with log-probabilities
    problem = logprobs_problem(lm)
    assert problem is not None and "scripted/test" in problem and "\n" not in problem
    assert len(lm.engine.calls) == 1  # one probe call
    with pytest.raises(ValueError, match="returns no token log-probabilities") as e:
        run_optimize(_config(tmp_path, optimizer=OptimizerConfig(name="reanchor")), _examples(), task_lm=lm)
    assert "scripted/test" in str(e.value)
    assert len(lm.engine.calls) == 2  # only the run's own probe: nothing was evaluated or compiled


def test_a_calibrated_program_on_a_backend_without_logprobs_fails_the_item_not_the_run():
    from halluscope.programs.halluclean.program import build_direct

    program = build_direct(decisions=True)
    program.ask.fields = {"verdict": {"threshold": 0.5}}
    with dspy.context(lm=_always_yes_lm(), adapter=with_logprob_decisions(dspy.JSONAdapter())):
        with pytest.raises(NoLogprobsError, match="scripted/test"):
            program(**_examples(1)[0].inputs())


def test_verbal_fallback_lets_the_lm_write_its_probability(tmp_path):
    def respond(call):  # DSPy's own decision request: the LM writes {"noul": p}
        return {k: {"noul": _p_yes(call)} for k in call.outputs if call.outputs[k].endswith("Evidence")} or \
            {k: "Yes" for k in call.outputs}

    lm = scripted_lm(respond)
    cfg = _config(tmp_path, optimizer=OptimizerConfig(name="reanchor", decision_probs="verbal"))
    res = run_optimize(cfg, _examples(), task_lm=lm)
    assert res.status == FINISHED, res.error
    assert res.cv.mean("compiled")["accuracy"]["mean"] == 1.0
    assert res.final_info["decision_probs"] == "verbal"


def test_reanchor_on_a_program_without_decisions_is_refused_by_name(tmp_path):
    items = [dspy.Example(id=str(i), answer="Paris", question="q", hard_labels=[[0, 2]]).with_inputs(
        "answer", "question") for i in range(2)]
    cfg = _config(tmp_path, program="spans", metric="iou", optimizer=OptimizerConfig(name="reanchor"))
    with pytest.raises(ValueError, match="'spans' has no decision output .* programs with one: direct"):
        run_optimize(cfg, items, task_lm=_always_yes_lm(logprobs=_logprobs))


# ------------------------------------------------------------------------------------------------------
# Bad optimizer settings
# ------------------------------------------------------------------------------------------------------


def test_optimizer_typo_and_zero_budget_are_clear_errors():
    with pytest.raises(ValueError, match="unknown optimizer 'mipor' \\(did you mean 'mipro'\\?\\)"):
        OptimizerConfig(name="mipor")
    with pytest.raises(ValueError, match="at least 1, not 0"):
        OptimizerConfig(name="gepa", max_metric_calls=0)
    with pytest.raises(ValueError, match="GEPA's budget"):
        OptimizerConfig(name="mipro", max_metric_calls=10)
    with pytest.raises(ValueError, match="follows a prompt optimizer"):
        OptimizerConfig(name="reanchor", reanchor=True)


@pytest.mark.parametrize("argv, message", [
    (["--optimizer", "gepaa"], "did you mean 'gepa'"),
    (["--optimizer", "gepa", "--max-metric-calls", "0"], "at least 1, not 0"),
    (["--optimizer", "mipro+reanchr"], "did you mean 'mipro+reanchor'"),
])
def test_cli_refuses_bad_optimizer_settings_without_a_traceback(argv, message, capsys):
    from halluscope.cli.optimize import build_parser, validate_args

    p = build_parser()
    with pytest.raises(SystemExit) as e:
        validate_args(p, p.parse_args(["--program", "direct", "--metric", "f1", "--task", "qa", *argv]))
    assert e.value.code == 2
    err = capsys.readouterr().err
    assert message in err and "Traceback" not in err


def test_cli_reanchor_without_logprobs_exits_2_naming_the_backend(tmp_path, capsys, monkeypatch):
    monkeypatch.delenv("HALLUSCOPE_DATA_DIR", raising=False)
    import halluscope.cli.optimize as cmd

    p = cmd.build_parser()
    args = p.parse_args(["--program", "direct", "--metric", "f1", "--lang", "de", "--optimizer", "reanchor",
                         "--no-mlflow", "--compiled-dir", str(tmp_path / "c"), "--report-dir", str(tmp_path / "r")])
    with pytest.raises(SystemExit) as e:
        cmd.run(args, p, task_lm=_always_yes_lm())
    assert e.value.code == 2
    err = capsys.readouterr().err
    assert "backend scripted/test returns no token log-probabilities" in err and "Traceback" not in err


def test_jointcq_refuses_gepa_and_reanchor_in_one_line():
    from halluscope.optimize.run import optimizer_for
    from halluscope.programs.registry import get

    with pytest.raises(ValueError, match="'jointcq' compiles its prompts in its own fit hook"):
        optimizer_for(get("jointcq"), OptimizerConfig(name="gepa"), {})


# ------------------------------------------------------------------------------------------------------
# GEPA and feedback metrics
# ------------------------------------------------------------------------------------------------------


def test_span_feedback_names_missed_and_false_spans_with_offsets():
    answer = "The capital is Berlin and it has 3 million people."
    text = span_feedback(answer, [[15, 21]], [[33, 42]], 0.0, "iou")
    assert "Missed hallucinated span(s): 'Berlin' (characters 15-21)" in text
    assert "Marked but not hallucinated (false): '3 million' (characters 33-42)" in text
    assert "Correctly marked: 'Berlin'" in span_feedback(answer, [[15, 21]], [[14, 22]], 0.8, "iou")
    metric = feedback_metric("iou")
    out = metric(dspy.Example(answer=answer, hard_labels=[[15, 21]]), dspy.Prediction(hard_labels=[[33, 42]]),
                 None, None, None)
    assert out.score == 0.0 and "'Berlin' (characters 15-21)" in out.feedback
    failed = metric(dspy.Example(answer=answer, hard_labels=[[15, 21]]), dspy.Prediction(), None, None, None)
    assert failed.score == 0.0 and "no usable spans" in failed.feedback and "'Berlin'" in failed.feedback


def test_response_feedback_says_fp_or_fn_with_the_evidence_snippet():
    ex = _examples(2)
    assert evidence_snippet(ex[0].context, ex[0].answer) == "Item 0 is in Paris."
    fn = response_feedback(ex[0], True, False, 0.0, "f1")
    assert "False negative" in fn and "'Berlin holds item 0.'" in fn and "'Item 0 is in Paris.'" in fn
    fp = feedback_metric("accuracy")(ex[1], dspy.Prediction(label=True), None, None, None)
    assert fp.score == 0.0 and "False positive" in fp.feedback and "Item 1 is in Paris." in fp.feedback
    ok = feedback_metric("f1")(ex[1], dspy.Prediction(label=False), None, None, None)
    assert ok.score == 1.0 and ok.feedback.startswith("f1 = 1.00. Correct")


def test_a_metric_without_feedback_gets_gepas_score_only_fallback_and_says_so():
    said = []
    metric = gepa_metric(None, lambda gold, pred, trace=None: 0.25, said.append)
    assert metric(None, None, None, None, None) == 0.25
    assert said and "has no feedback" in said[0] and "score only" in said[0]


def test_gepa_feedback_reaches_the_reflection_prompt_and_the_chosen_candidate_is_logged(tmp_path):
    def task(call):  # the reflected instruction makes the scripted model judge by the evidence
        strict = "contradicts the knowledge" in call.system
        return {"verdict": ("Yes" if "Berlin" in call.inputs.get("input", "") else "No") if strict else "Yes"}

    lm = scripted_lm(task)
    reflection = scripted_lm({"new_instruction": "Say Yes only when the answer contradicts the knowledge."},
                             model="scripted/reflect")
    cfg = _config(tmp_path, metric="f1", folds=1, optimizer=OptimizerConfig(name="gepa", max_metric_calls=30))
    with dspy.context(adapter=dspy.JSONAdapter()):
        res = run_optimize(cfg, _examples(12), task_lm=lm, prompt_lm=reflection)
    assert res.status == FINISHED, res.error
    prompts = [c.user for c in reflection.engine.calls]
    assert prompts, "the reflection LM was never asked"
    assert any("False positive: the answer 'Paris holds item" in p and "The evidence says: 'Item" in p
               for p in prompts)
    gepa = res.final_info["gepa"]
    assert gepa["chosen"] == 1 and gepa["candidates"][1]["val_score"] == 1.0 and 1 in gepa["pareto"]
    assert "contradicts the knowledge" in json.loads((res.artifact.path / "program.json").read_text())[
        "ask"]["signature"]["instructions"]
    metrics, step, files = optimizer_tracking(res.final_info, tmp_path)
    assert metrics["gepa/chosen"] == 1 and metrics["gepa/candidates"] == len(gepa["candidates"])
    assert step["gepa/candidate_val_score"][1] == (1, 1.0)
    assert json.loads(files[0].read_text())["chosen"] == 1


def test_reanchor_calibrates_halluclean_judge_after_plan_and_reason(tmp_path):
    def respond(call):
        out = {k: "Yes" for k, t in call.outputs.items() if "Literal" in t}
        out.update(plan="1. compare the place", analysis="the place differs" if "Berlin" in call.inputs.get(
            "input", "") else "the place matches")
        return out

    lm = scripted_lm(respond, logprobs=_logprobs)
    cfg = _config(tmp_path, program="halluclean", program_options={"revise": False},
                  optimizer=OptimizerConfig(name="reanchor"))
    res = run_optimize(cfg, _examples(), task_lm=lm)
    assert res.status == FINISHED, res.error
    assert res.cv.mean("compiled")["balanced_accuracy"]["mean"] == 1.0
    assert res.cv.mean("zero_shot")["balanced_accuracy"]["mean"] < 1.0
    rows = res.final_info["reanchor"]["fitted"]
    assert [(r["predictor"], r["field"]) for r in rows] == [("judge", "verdict")] and "value" in rows[0]
    saved = json.loads((res.artifact.path / "program.json").read_text())
    assert "fields" not in saved["plan"] and saved["judge"]["fields"]["verdict"]["threshold"] == rows[0]["value"]


def test_a_choice_output_reads_its_label_probabilities_and_applies_the_weights():
    class Verify(dspy.Signature):
        """Is the claim correct, hallucinated or unverifiable?"""

        claim: str = dspy.InputField()
        label: Literal["correct", "hallucinated", "unverifiable"] = dspy.OutputField(desc="the verdict")

    dist = {"correct": 0.5, "hallucinated": 0.3, "unverifiable": 0.2}
    lm = scripted_lm({"label": "correct"}, logprobs=lambda call: {"label": dist})
    verify = dspy.Predict(Verify)
    with dspy.context(lm=lm, adapter=with_logprob_decisions(dspy.JSONAdapter())):
        verify.fields = {"label": {"weights": {"correct": 1.0, "hallucinated": 1.0, "unverifiable": 1.0}}}
        assert verify(claim="x").label == "correct"
        verify.fields = {"label": {"weights": {"correct": 0.5, "hallucinated": 1.0, "unverifiable": 1.0}}}
        assert verify(claim="x").label == "hallucinated"  # 0.25 < 0.3: the fitted weight moves the decision
