"""ReAnchor calibration of decision outputs and GEPA with textual feedback (#21), on scripted LMs."""

from __future__ import annotations

import json
import math
from typing import Literal

import dspy
import pytest

from halluscope.artifacts import store as A
from halluscope.core.decisions import (NoLogprobsError, contextual_probability, logprobs_problem,
                                  option_probabilities, with_logprob_decisions)
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
# Contextual calibration (content-free P(Yes), round three)
# ------------------------------------------------------------------------------------------------------


def test_contextual_probability_divides_by_the_content_free_probability():
    assert contextual_probability(0.9, 0.9) == pytest.approx(0.5)  # as likely Yes as with no answer at all
    # each label divided by its content-free probability, renormalised = sigmoid(logit p - logit prior)
    p, q = 0.93, 0.81
    want = (p / q) / (p / q + (1 - p) / (1 - q))
    assert contextual_probability(p, q) == pytest.approx(want)
    assert contextual_probability(p, q) == pytest.approx(1 / (1 + math.exp(-(math.log(p / (1 - p))
                                                                             - math.log(q / (1 - q))))))
    assert contextual_probability(0.8, 0.95) < 0.5 < contextual_probability(0.8, 0.6)  # below / above its baseline
    assert contextual_probability(0.5, 0.5) == pytest.approx(0.5)
    assert contextual_probability(0.3, 0.5) == pytest.approx(0.3)  # a balanced baseline changes nothing
    # certainty on either side stays a finite probability strictly inside (0, 1)
    for p, q in ((1.0, 1.0), (0.0, 0.0), (1.0, 0.0), (0.0, 1.0)):
        assert 0.0 < contextual_probability(p, q) < 1.0
    assert contextual_probability(1.0, 1.0) == pytest.approx(0.5) == contextual_probability(0.0, 0.0)
    assert contextual_probability(1.0, 0.0) > 1 - 1e-9 and contextual_probability(0.0, 1.0) < 1e-9


def _baseline_examples() -> list[dspy.Example]:
    """Two contexts with different baselines: raw P(Yes) does not separate right from wrong across them."""
    out = []
    for i in range(8):
        ctx = "Item is in Paris." if i % 4 < 2 else "Item is in Rome."
        bad = i % 2 == 0
        city = ("Berlin" if bad else "Paris") if "Paris" in ctx else ("Madrid" if bad else "Rome")
        out.append(dspy.Example(id=str(i), question=f"Where is item {i}?", answer=f"{city} holds it.", context=ctx,
                                task="qa", label=bad).with_inputs("question", "answer", "context", "task"))
    return out


def _baseline_p_yes(call) -> float:
    """P(Yes) = a per-context baseline (the content-free request, no answer, gets it) moved a little by the answer."""
    text = call.inputs.get("input", "")
    base = 0.95 if "Paris." in text else 0.70
    if "(empty)" in text:
        return base
    wrong = any(city in text for city in ("Berlin", "Madrid"))
    return {0.95: (0.97 if wrong else 0.93), 0.70: (0.80 if wrong else 0.65)}[base]


def _baseline_lm():
    return _always_yes_lm(logprobs=lambda call: {k: {"Yes": _baseline_p_yes(call), "No": 1 - _baseline_p_yes(call)}
                                                 for k in call.outputs})


def test_content_free_calibration_takes_out_the_per_context_baseline():
    from halluscope.programs.halluclean.program import build_direct

    lm = _baseline_lm()
    raw = build_direct(decisions=True)
    raw.ask.fields = {"verdict": {"threshold": 0.5}}
    calibrated = build_direct(calibrate="content_free")
    assert calibrated.ask.fields == {"verdict": {"threshold": 0.5}}  # read from log-probabilities from the start
    examples = _baseline_examples()
    with dspy.context(lm=lm, adapter=with_logprob_decisions(dspy.JSONAdapter())):
        raw_scores = [raw(**e.inputs()).score for e in examples]
        n_before = len(lm.engine.calls)
        preds = [calibrated(**e.inputs()) for e in examples]
    labels = [e.label for e in examples]
    # raw: a right answer in the Paris context (0.93) scores above a wrong one in the Rome context (0.80)
    assert max(s for s, y in zip(raw_scores, labels) if not y) > min(s for s, y in zip(raw_scores, labels) if y)
    # calibrated: P(Yes) against the context's content-free P(Yes); the default cut point 0.5 separates them
    assert [p.label for p in preds] == labels
    for p, e in zip(preds, examples):
        base = 0.95 if "Paris" in e.context else 0.70
        assert p.score == pytest.approx(contextual_probability(_baseline_p_yes_of(e), base))
        assert not p.failures
    cf_calls = [c for c in lm.engine.calls[n_before:] if "(empty)" in c.inputs.get("input", "")]
    assert len(cf_calls) == len(examples)  # one content-free request per case (the scripted LM has no cache)
    assert len(lm.engine.calls) - n_before == 2 * len(examples)
    with dspy.context(lm=lm, adapter=with_logprob_decisions(dspy.JSONAdapter()), trace=[]):
        calibrated(**examples[0].inputs())
        trace = dspy.settings.trace
    # only the calibrated request is traced: an optimizer never takes the content-free one for a demo
    assert len(trace) == 1 and "(empty)" not in trace[0][1]["input"]


def _baseline_p_yes_of(ex) -> float:
    base = 0.95 if "Paris" in ex.context else 0.70
    return {0.95: (0.97 if ex.label else 0.93), 0.70: (0.80 if ex.label else 0.65)}[base]


def test_content_free_calibration_without_a_content_free_probability_counts_a_failure():
    from halluscope.programs.halluclean.program import build_direct

    def respond(call):  # the content-free request does not parse; the real one answers
        return "not json at all" if "(empty)" in call.inputs.get("input", "") else {k: "Yes" for k in call.outputs}

    lm = scripted_lm(respond, logprobs=lambda call: {k: {"Yes": 0.9, "No": 0.1} for k in call.outputs})
    program = build_direct(calibrate="content_free")
    with dspy.context(lm=lm, adapter=with_logprob_decisions(dspy.JSONAdapter())):
        pred = program(**_baseline_examples()[0].inputs())
    assert pred.failures.get("content_free") == 1
    assert pred.score == pytest.approx(0.9) and pred.label is True  # read uncalibrated, and said so


def test_calibrate_option_is_checked_by_the_registry():
    from halluscope.programs.registry import OptionError, get_program

    spec = get_program("direct")
    assert spec.make(calibrate="content_free").calibrate == "content_free"
    with pytest.raises(OptionError, match="calibrate"):
        spec.make(calibrate="contentfree")


def test_reanchor_fits_the_cut_point_on_the_calibrated_probability(tmp_path):
    lm = _baseline_lm()
    examples = _baseline_examples() * 2
    examples = [e.copy(id=f"{e.id}-{k}") for k, e in enumerate(examples)]
    cfg = _config(tmp_path, optimizer=OptimizerConfig(name="reanchor"), program_options={"calibrate": "content_free"},
                  folds=1)
    res = run_optimize(cfg, examples, task_lm=lm)
    assert res.status == FINISHED, res.error
    report = res.final_info["reanchor"]
    row = report["fitted"][0]
    # ReAnchor saw the calibrated requests only (one per training item), not the content-free ones
    assert row["observed"]["calls"] == len(examples)
    calibrated = sorted({round(contextual_probability(_baseline_p_yes_of(e), 0.95 if "Paris" in e.context else 0.70), 4)
                         for e in examples})
    assert (row["observed"]["min"], row["observed"]["max"]) == (calibrated[0], calibrated[-1])
    assert report["train_score_before"] == 1.0  # the default cut point 0.5 already separates them


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


def test_reanchor_on_a_program_without_decisions_is_refused_by_name():
    from halluscope.optimize.optimizers import reanchor_problem
    from halluscope.programs.spans.program import SpanDetector

    problem = reanchor_problem(SpanDetector(), "spans", _always_yes_lm(logprobs=_logprobs), "logprobs")
    assert problem is not None and "\n" not in problem
    assert "'spans' has no decision output" in problem and "programs with one: direct" in problem
    assert "jointcq" in problem and "finch" in problem
    assert reanchor_problem(SpanDetector(decisions=True), "spans", None, "logprobs") is None


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
    (["--optimizer", "gepa", "--max-metric-calls", "0"], "argument --max-metric-calls: expected a whole number in [1, 1000000000], got '0'"),
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


def test_jointcq_hands_gepa_to_its_hook_refuses_staged_reanchor_in_one_line_and_runs_reanchor_alone():
    from halluscope.optimize.run import optimizer_for
    from halluscope.programs.registry import get_program

    cfg = optimizer_for(get_program("jointcq"), OptimizerConfig(name="gepa", max_metric_calls=30), {})
    assert (cfg.name, cfg.fit_with, cfg.max_metric_calls, cfg.label) == ("fit", "gepa", 30, "fit(gepa)")
    assert optimizer_for(get_program("jointcq"), OptimizerConfig(name="gepa", auto="medium"), {}).auto == "medium"
    with pytest.raises(ValueError, match="'jointcq' compiles its prompts in its own fit hook"):
        optimizer_for(get_program("jointcq"), OptimizerConfig(name="gepa+reanchor", max_metric_calls=30), {})
    with pytest.raises(ValueError, match="--optimizer mipro\\+reanchor is not supported"):
        optimizer_for(get_program("jointcq"), OptimizerConfig(name="mipro+reanchor"), {})
    cfg = optimizer_for(get_program("jointcq"), OptimizerConfig(name="reanchor"), {})
    assert (cfg.name, cfg.fit_with, cfg.then_fit) == ("reanchor", None, False)


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


# ------------------------------------------------------------------------------------------------------
# Item 1 completeness: JointCQ's verdict, FINCH-ZK's judge, MEDICO's verdict, `spans`' per-quote confidence
# ------------------------------------------------------------------------------------------------------

JCQ_DIST = {"correct": 0.5, "hallucinated": 0.4, "unverifiable": 0.1}


def _jointcq_lm(**kw):
    from halluscope.signatures.jointcq import ClaimQuery

    def respond(call):
        if "pairs" in call.outputs:
            answer = call.inputs["answer"]
            return {"pairs": [ClaimQuery(claim=answer.rstrip("."), query=answer)]}
        if "answer" in call.outputs:  # the log-probability probe before the run
            return {"answer": "Yes"}
        return {"label": "correct", "rationale": "see [1]"}

    def dist(call):  # the verifier leans towards "hallucinated" when the claim says Berlin
        if "answer" in call.outputs:
            return {"answer": {"Yes": 0.9, "No": 0.1}}
        bad = "Berlin" in call.inputs.get("claim", "")
        return {"label": {"correct": 0.5, "hallucinated": 0.45 if bad else 0.3, "unverifiable": 0.05 if bad else 0.2}}

    return scripted_lm(respond, logprobs=kw.pop("logprobs", dist), **kw)


def test_jointcq_verifier_label_is_a_choice_whose_fitted_weights_change_the_decision():
    from halluscope.programs.registry import get_program

    program = get_program("jointcq").make(decisions=True)
    lm = scripted_lm({"pairs": lambda call: [{"claim": "Berlin holds item 0", "query": "item 0"}],
                      "label": "correct", "rationale": "see [1]"},
                     logprobs=lambda call: {"label": JCQ_DIST})
    ex = _examples(1)[0]
    with dspy.context(lm=lm, adapter=with_logprob_decisions(dspy.JSONAdapter())):
        program.verify.fields = {"label": {"weights": {"correct": 1.0, "hallucinated": 1.0, "unverifiable": 1.0}}}
        before = program(**ex.inputs())
        program.verify.fields = {"label": {"weights": {"correct": 0.5, "hallucinated": 1.0, "unverifiable": 1.0}}}
        after = program(**ex.inputs())
    assert [c["label"] for c in before.claims] == ["correct"] and before.label is False
    assert [c["label"] for c in after.claims] == ["hallucinated"] and after.label is True  # 0.25 < 0.4
    verify_calls = [c for c in lm.engine.calls if "label" in c.outputs]
    assert verify_calls and all("Literal" in c.outputs["label"] for c in verify_calls)


def test_jointcq_decisions_refuse_the_batched_verifier_in_one_line():
    from halluscope.programs.registry import get_program

    with pytest.raises(ValueError, match="decisions needs batch_verify=false"):
        get_program("jointcq").make(decisions=True, batch_verify=True)


def test_reanchor_fits_jointcq_verifier_weights_under_cross_validation(tmp_path):
    cfg = _config(tmp_path, program="jointcq", optimizer=OptimizerConfig(name="reanchor"))
    res = run_optimize(cfg, _examples(), task_lm=_jointcq_lm())
    assert res.status == FINISHED, res.error
    assert res.manifest["program_options"]["decisions"] is True
    assert res.cv.mean("zero_shot")["balanced_accuracy"]["mean"] == 0.5  # the generated word: always "correct"
    assert res.cv.mean("compiled")["balanced_accuracy"]["mean"] == 1.0  # weights on P(label) separate them
    rows = [r for r in res.final_info["reanchor"]["fitted"] if "value" in r]
    assert [(r["predictor"], r["field"], r["parameter"]) for r in rows] == [("verify", "label", "weights")]
    saved = json.loads((res.artifact.path / "program.json").read_text())
    assert set(saved["verify"]["fields"]["label"]["weights"]) == {"correct", "hallucinated", "unverifiable"}


def _finch_lm(logprobs=None):
    def respond(call):
        if "rating" in call.outputs:
            return {"explanation": "the other answer says Paris", "rating": "accurate"}
        if "answer" in call.outputs:
            return {"answer": "Item holds are in Paris."}
        return {k: "x" for k in call.outputs}

    return scripted_lm(respond, logprobs=logprobs)


def test_finch_judge_rating_is_a_choice_whose_fitted_weights_change_the_decision():
    from halluscope.programs.finch.program import FinchZK

    dist = {"accurate": 0.5, "contradiction": 0.4, "neutral": 0.1}
    lm = _finch_lm(logprobs=lambda call: {"rating": dist})
    program = FinchZK(n_samples=2, correct=False, decisions=True)
    assert program.batch_judge is False  # decisions: one judge call per (block, sample) pair
    ex = _examples(1)[0]
    with dspy.context(lm=lm, adapter=with_logprob_decisions(dspy.JSONAdapter())):
        program.judge.fields = {"rating": {"weights": {"accurate": 1.0, "contradiction": 1.0, "neutral": 1.0}}}
        before = program(**ex.inputs())
        program.judge.fields = {"rating": {"weights": {"accurate": 0.5, "contradiction": 1.0, "neutral": 1.0}}}
        after = program(**ex.inputs())
    assert [u["label"] for u in before.units] == ["accurate"] and before.label is False
    assert [u["label"] for u in after.units] == ["contradiction"] and after.label is True
    judge_calls = [c for c in lm.engine.calls if "rating" in c.outputs]
    assert judge_calls and all("Literal" in c.outputs["rating"] for c in judge_calls)


def _medico_p(call) -> dict:
    p = 0.93 if "Berlin" in call.inputs.get("answer", "") else 0.81
    return {k: {"Yes": p, "No": 1 - p} for k in call.outputs}


def _medico_lm(logprobs=None):
    def respond(call):  # says hallucinated to everything: True, or "Yes" when asked for a decision word
        return {k: ("Yes" if "Literal" in t else True) for k, t in call.outputs.items() if k in ("verdict", "answer")} \
            | ({"rationale": "see [1]"} if "rationale" in call.outputs else {})

    return scripted_lm(respond, logprobs=logprobs)


def test_medico_verdict_threshold_changes_the_decision_and_the_score_is_p_true():
    from halluscope.programs.medico.program import Medico

    program = Medico(correct=False)
    lm = _medico_lm(logprobs=_medico_p)
    wrong, right = (e.inputs() for e in _examples(2))
    with dspy.context(lm=lm, adapter=with_logprob_decisions(dspy.JSONAdapter())):
        program.detect.fields = {"verdict": {"threshold": 0.5}}
        assert (program(**wrong).label, program(**right).label) == (True, True)
        program.detect.fields = {"verdict": {"threshold": 0.9}}
        w, r = program(**wrong), program(**right)
    assert (w.label, r.label) == (True, False)
    assert (w.score, r.score) == (pytest.approx(0.93), pytest.approx(0.81))
    assert w.likelihood == "decision"


def test_reanchor_fits_medico_verdict_then_its_ensemble(tmp_path):
    lm = _medico_lm(logprobs=_medico_p)
    cfg = _config(tmp_path, program="medico", program_options={"correct": False},
                  optimizer=OptimizerConfig(name="reanchor"))
    res = run_optimize(cfg, _examples(), task_lm=lm)
    assert res.status == FINISHED, res.error
    assert res.manifest["optimizer"]["description"].startswith("ReAnchor") and "then fit" in \
        res.manifest["optimizer"]["description"]
    assert res.cv.mean("zero_shot")["balanced_accuracy"]["mean"] == 0.5
    assert res.cv.mean("compiled")["balanced_accuracy"]["mean"] == 1.0
    rows = [r for r in res.final_info["reanchor"]["fitted"] if "value" in r]
    assert [(r["predictor"], r["field"]) for r in rows] == [("detect", "verdict")]


def test_relative_to_cut_puts_the_cut_point_at_one_half():
    from halluscope.programs.spans.program import relative_to_cut

    assert relative_to_cut(0.9, 0.9) == 0.5
    assert relative_to_cut(0.45, 0.9) == pytest.approx(0.25)
    assert relative_to_cut(0.95, 0.9) == pytest.approx(0.75)
    assert relative_to_cut(1.0, 0.9) == 1.0 and relative_to_cut(0.0, 0.9) == 0.0


def test_spans_confirm_stage_fitted_threshold_changes_the_hard_labels():
    from halluscope.programs.spans.program import SpanDetector

    answer = "Berlin holds item 0 since 1920."
    lm = scripted_lm({"spans": [{"text": "Berlin", "probability": 0.9}, {"text": "1920", "probability": 0.9}],
                      "wrong": lambda call: "Yes" if "Literal" in call.outputs.get("wrong", "") else True},
                     logprobs=lambda call: {"wrong": {"Yes": 0.93 if call.inputs.get("quote") == "Berlin" else 0.81,
                                                      "No": 0.07 if call.inputs.get("quote") == "Berlin" else 0.19}})
    program = SpanDetector(decisions=True)
    with dspy.context(lm=lm, adapter=with_logprob_decisions(dspy.JSONAdapter())):
        program.confirm.fields = {"wrong": {"threshold": 0.5}}
        loose = program(question="Where is item 0?", answer=answer, context="Item 0 is in Paris.")
        program.confirm.fields = {"wrong": {"threshold": 0.9}}
        strict = program(question="Where is item 0?", answer=answer, context="Item 0 is in Paris.")
    assert loose.hard_labels == [[0, 6], [26, 30]]
    assert strict.hard_labels == [[0, 6]]  # P(wrong) of '1920' (0.81) is below the fitted cut point
    assert [c.inputs["quote"] for c in lm.engine.calls if "wrong" in c.outputs] == ["Berlin", "1920"] * 2
    assert not loose.failures and not strict.failures


def test_spans_without_decisions_keep_one_stage():
    from halluscope.programs.spans.program import SpanDetector

    assert [n for n, _ in SpanDetector().named_predictors()] == ["extract"]


@pytest.mark.parametrize("program, options", [
    ("halluclean", {"revise": False}), ("medico", {"correct": False}), ("jointcq", {}),
    ("finch", {"n_samples": 2, "correct": False}), ("spans", {}),
])
def test_reanchor_refuses_each_program_on_a_backend_without_logprobs_in_one_line(tmp_path, program, options):
    lm = _always_yes_lm()
    cfg = _config(tmp_path, program=program, program_options=options, optimizer=OptimizerConfig(name="reanchor"))
    with pytest.raises(ValueError, match="backend scripted/test returns no token log-probabilities") as e:
        run_optimize(cfg, _examples(4), task_lm=lm)
    assert "\n" not in str(e.value)
    assert len(lm.engine.calls) == 1  # the probe only: nothing was evaluated or compiled


@pytest.mark.parametrize("program", ["halluclean", "medico", "jointcq", "finch", "spans"])
def test_cli_refuses_typos_and_a_zero_budget_for_each_program(program, capsys):
    from halluscope.cli.optimize import build_parser, validate_args

    p = build_parser()
    for argv, message in ((["--optimizer", "reanchr"], "did you mean 'reanchor'"),
                          (["--optimizer", "gepa", "--max-metric-calls", "0"], "argument --max-metric-calls: expected a whole number in [1, 1000000000], got '0'")):
        with pytest.raises(SystemExit) as e:
            validate_args(p, p.parse_args(["--program", program, "--metric", "f1", "--task", "qa", *argv]))
        assert e.value.code == 2
        err = capsys.readouterr().err
        assert message in err and "Traceback" not in err


def test_grouped_folds_keep_an_answer_and_its_twin_together_and_stay_balanced():
    from halluscope.optimize.cv import make_folds

    items = [dspy.Example(id=f"{q}-{v}", source_id=str(q), label=(v == "h")) for q in range(17) for v in "rh"]
    folds = make_folds(items, k=5, seed=0, group_by="source_id")
    assert sorted(i for f in folds for i in f) == list(range(34))
    for f in folds:
        assert {items[i].source_id for i in f}.isdisjoint(
            {items[i].source_id for g in folds if g is not f for i in g})
        assert sum(items[i].label for i in f) * 2 == len(f)  # both answers of each question: balanced
    assert sorted(len(f) for f in folds) == [6, 6, 6, 8, 8]
    assert make_folds(items, k=5, seed=0, group_by="source_id") == folds
    assert make_folds(items, k=5, seed=1, group_by="source_id") != folds


def test_labelled_demos_of_direct_are_shown_in_its_wording_and_calibrated_with_it(tmp_path):
    """bootstrap+reanchor with labelled demos: the gold cases the optimizer picks are shown in the program's own
    wording (the dataset's task "qa" names the route; the signature's task is its description), with the gold
    verdict, in the calibrated request and in its content-free twin alike, and survive the artifact."""
    from halluscope.programs.halluclean.program import TASKS, route_inputs

    lm = _always_yes_lm(logprobs=_logprobs)
    opt = OptimizerConfig(name="bootstrap", reanchor=True, max_bootstrapped_demos=0, max_labeled_demos=4)
    cfg = _config(tmp_path, program="direct+routing", optimizer=opt, folds=1,
                  program_options={"task": "qa", "calibrate": "content_free"})
    examples = _examples()
    res = run_optimize(cfg, examples, task_lm=lm)
    assert res.status == FINISHED, res.error
    demos = res.final.ask.demos
    assert len(demos) == 4 and all(d.verdict == ("Yes" if d.label else "No") for d in demos)
    qa = TASKS["qa"]
    loaded_program = A.load_compiled("direct+routing", lang="all", metric="accuracy",
                                     root=tmp_path / "compiled").program
    # DSPy loads demos as plain dicts: they are rendered the same way
    assert [d["answer"] for d in loaded_program.ask.demos] == [d.answer for d in demos]
    n_before = len(lm.engine.calls)
    with dspy.context(lm=lm, adapter=with_logprob_decisions(dspy.JSONAdapter())):
        loaded_program(**examples[1].inputs())
    calls = lm.engine.calls[n_before:]
    assert len(calls) == 2 and sum("(empty)" in c.inputs["input"] for c in calls) == 1
    for c in calls:  # a decision output's demos are listed in the system message, as JSON
        assert c.inputs["task"] == qa.description
        shown = json.loads(c.system[c.system.index("[{"):c.system.rindex("}]") + 2])
        assert shown == [{**route_inputs(qa, d.question, d.answer, d.context), "verdict": d.verdict} for d in demos]


def test_jointcq_criteria_feedback_names_the_failed_checks_and_the_coverage():
    from halluscope.programs.jointcq.demo_filter import CriteriaJudge, criteria_feedback_metric

    lm = scripted_lm({"entailed": "yes", "decontextualised": "no", "relevant": "yes", "concise": "yes",
                      "searchable": lambda call: "no" if "museum" in call.inputs.get("query", "") else "yes"})
    metric = criteria_feedback_metric(judge=CriteriaJudge())
    gold = dspy.Example(question="Where is it?", answer="It is in Paris. It opened in 1889.", lang="en")
    pred = dspy.Prediction(pairs=[{"claim": "It is in Paris", "query": "museum"}])
    with dspy.context(lm=lm, adapter=dspy.JSONAdapter()):
        out = metric(gold, pred)
        empty = metric(gold, dspy.Prediction(pairs=[]))
    assert out.score == 0.0  # the pair fails, and half the answer is not covered
    assert "The claim 'It is in Paris' with the query 'museum' is not decontextualised, searchable." in out.feedback
    assert "The claims cover 50% of the answer's sentences" in out.feedback
    assert empty.score == 0.0 and "No claim was extracted, but the answer states facts" in empty.feedback


def test_jointcq_gepa_compiles_the_claim_query_stage_from_the_criteria_feedback(tmp_path):
    """``--optimizer gepa`` for JointCQ: its fit hook runs GEPA on the claim-query stage with the criteria
    feedback; the reflection LM reads which checks failed, and its instruction (which makes the scripted
    extractor write searchable queries) is chosen and saved."""
    from halluscope.signatures.jointcq import ClaimQuery

    def respond(call):
        if "pairs" in call.outputs:
            answer = call.inputs["answer"]
            good = "search-engine queries" in call.system
            return {"pairs": [ClaimQuery(claim=answer.rstrip("."), query=answer if good else "it")]}
        if "searchable" in call.outputs:
            ok = call.inputs.get("query") != "it"
            return {"relevant": "yes", "concise": "yes", "searchable": "yes" if ok else "no"}
        if "entailed" in call.outputs:
            return {"entailed": "yes", "decontextualised": "yes"}
        return {"label": "correct", "rationale": "see [1]"}

    lm = scripted_lm(respond)
    reflection = scripted_lm({"new_instruction": "Write one claim per fact and full search-engine queries."},
                             model="scripted/reflect")
    cfg = _config(tmp_path, program="jointcq", folds=1,
                  optimizer=OptimizerConfig(name="gepa", max_metric_calls=24))
    with dspy.context(adapter=dspy.JSONAdapter()):
        res = run_optimize(cfg, _examples(6), task_lm=lm, prompt_lm=reflection)
    assert res.status == FINISHED, res.error
    assert res.manifest["optimizer"]["fit_with"] == "gepa"
    assert res.manifest["optimizer"]["max_metric_calls"] == 24
    prompts = [c.user for c in reflection.engine.calls]
    assert any("with the query 'it' is not searchable" in p for p in prompts), "the feedback did not reach it"
    saved = json.loads((res.artifact.path / "program.json").read_text())
    assert "search-engine queries" in saved["generate"]["signature"]["instructions"]
    assert res.final_info["criteria_optimizer"] == "gepa"
