"""optimize/run.py as stages: their order, each held-out fold scored once, the result's exit codes, a failed or
interrupted compile still reported, and a program fitted by its ProgramSpec.fit hook (no LM) end to end."""

from __future__ import annotations

import json
import threading

import dspy
import pytest

from halluscope.artifacts import store as A
from halluscope.core.contract import Detection, to_prediction
from halluscope.metrics.classification import classification_report
from halluscope.optimize.cv import OptimizerConfig
from halluscope.optimize.run import FAILED, FINISHED, KILLED, OptimizeConfig, OptimizeResult, run_optimize
from halluscope.programs import registry
from halluscope.lm.scripted import scripted_lm

# ------------------------------------------------------------------------------------------------------
# a test-only program: no LM, one threshold fitted by its fit hook
# ------------------------------------------------------------------------------------------------------

PROGRAM = "test-length-threshold"
DEFAULT_THRESHOLD = 1000.0


class LengthThreshold(dspy.Module):
    """Hallucinated when the answer is longer than ``threshold`` characters; counts its calls."""

    calls: list[str] = []  # answers seen, across instances (reset by the fixture)
    _lock = threading.Lock()

    def __init__(self, threshold: float = DEFAULT_THRESHOLD):
        super().__init__()
        self.threshold = float(threshold)

    def forward(self, answer: str = "", **_):
        with LengthThreshold._lock:
            LengthThreshold.calls.append(answer)
        flagged = len(answer) > self.threshold
        return to_prediction(Detection(answer=answer, label=flagged, score=1.0 if flagged else 0.0))

    # DSPy's Module state holds predictors only: the fitted parameter travels through these two.
    def dump_state(self, json_mode=True):
        return {"threshold": {"value": self.threshold}}

    def load_state(self, state, **_):
        self.threshold = float(state["threshold"]["value"])
        return self


def fit_threshold(module, trainset, metric_name):
    """The threshold (between two answer lengths) with the best ``metric_name`` on ``trainset``."""
    gold = [bool(ex.label) for ex in trainset]
    lengths = sorted({len(ex.answer) for ex in trainset})
    candidates = [lengths[0] - 0.5] + [n + 0.5 for n in lengths]

    def score(t):
        return classification_report(gold, [len(ex.answer) > t for ex in trainset])[metric_name]

    best = max(candidates, key=lambda t: (score(t), -t))
    module.threshold = best
    FIT_CALLS.append(len(trainset))
    return {"threshold": best, "train_score": score(best)}


FIT_CALLS: list[int] = []


@pytest.fixture
def fit_program(monkeypatch):
    spec = registry.ProgramSpec(name=PROGRAM, build=LengthThreshold, description="test only: a length threshold",
                                level="response", default_metric="f1", uses_lm=False, fit=fit_threshold)
    registry.get_program("spans")  # load the built-in programs first
    monkeypatch.setitem(registry.REGISTRY, PROGRAM, spec)
    LengthThreshold.calls = []
    FIT_CALLS.clear()
    yield spec


def _examples(n: int = 8, offset: int = 0) -> list[dspy.Example]:
    """Longer answers are the hallucinated ones (a threshold separates them)."""
    out = []
    for i in range(offset, offset + n):
        hallucinated = (i - offset) >= n // 2
        answer = "x" * (10 + 3 * (i - offset)) + f" #{i}"
        out.append(dspy.Example(id=f"t-{i}", lang="de", question=f"q{i}?", answer=answer, context="",
                                label=hallucinated).with_inputs("question", "answer", "lang", "context"))
    return out


def _config(tmp_path, **kw) -> OptimizeConfig:
    base = dict(program=PROGRAM, metric="f1", lang="de", source="fixture", folds=2,
                compiled_dir=tmp_path / "compiled", report_dir=tmp_path / "reports", mlflow=False)
    base.update(kw)
    return OptimizeConfig(**base)


def _report(tmp_path) -> dict:
    (path,) = (tmp_path / "reports").glob("*/report.json")
    return json.loads(path.read_text())


def _span_ex(i: int, hallucinated: bool) -> dspy.Example:
    answer = f"Answer number {i} says Paris."
    hard = [[len(answer) - 6, len(answer) - 1]] if hallucinated else []
    return dspy.Example(id=f"x-{i}", lang="de", question=f"q{i}?", answer=answer, context="",
                        hard_labels=hard, soft_labels=[{"start": s, "end": e, "prob": 1.0} for s, e in hard],
                        label=hallucinated).with_inputs("question", "answer", "lang", "context")


def _responder(call):
    """Quotes the last word of the answer; plausible text for the optimizer's own calls."""
    if "spans" in call.outputs:
        words = str(call.inputs.get("answer", "")).strip().rstrip(".").split()
        return {"spans": [{"text": words[-1], "probability": 0.9}] if words else []}
    return {"proposed_instruction": "Quote every wrong name, number or date in the answer.",
            "observations": "Short factual answers.", "summary": "Short factual answers.",
            "program_description": "Finds wrong spans.", "module_description": "Extracts wrong spans."}


# ------------------------------------------------------------------------------------------------------
# stages, scoring once
# ------------------------------------------------------------------------------------------------------


def test_stages_run_in_order_and_each_heldout_fold_is_scored_once(tmp_path, fit_program, monkeypatch):
    import halluscope.evaluation.runner as runner

    scored: list[list[str]] = []
    real_score = runner.score_predictions

    def counting_score(examples, predictions):
        scored.append([str(ex.get("id")) for ex in examples])
        return real_score(examples, predictions)

    monkeypatch.setattr(runner, "score_predictions", counting_score)
    examples, test = _examples(8), _examples(4, offset=100)
    seen: list[str] = []
    lines: list[str] = []
    res = run_optimize(_config(tmp_path, test_examples=test, test_path="fixture-test"), examples,
                       log=lines.append, on_stage=lambda name, r: seen.append(name))

    assert res.status == FINISHED and res.exit_code == 0 and res.error is None
    order = ["prepare", "cross_validate", "final_compile", "score_test", "build_manifest", "write_artifact",
             "write_report"]
    assert res.stages == order and seen == order
    assert any("-- fold 1/2" in s for s in lines) and any("final compile on all 8 items" in s for s in lines)

    # every example is held out once: run by the zero-shot and by the compiled program once each (the fit hook
    # never calls the program), and the test items once each by the final and the zero-shot program
    for ex in examples + test:
        assert LengthThreshold.calls.count(ex.answer) == 2, ex.id
    assert len(LengthThreshold.calls) == 2 * (len(examples) + len(test))
    # each evaluation scored once: zero-shot + compiled per fold, then the two test evaluations
    folds = [f.heldout_ids for f in res.cv.folds]
    assert scored == [folds[0], folds[0], folds[1], folds[1], [e.id for e in test], [e.id for e in test]]
    assert FIT_CALLS == [4, 4, 8]  # one fit per fold, then the final fit on everything


def test_heldout_fold_is_scored_once_under_mipro_with_the_scripted_lm(tmp_path, monkeypatch):
    """An LM program compiled by MIPROv2: per fold, exactly two evaluations (zero-shot, compiled) of the
    held-out items, each running the program once per item and scored once."""
    import halluscope.evaluation.runner as runner

    evals: list[list[str]] = []
    scored: list[list[str]] = []
    real_eval, real_score = runner.run_eval, runner.score_predictions

    def counting_eval(program, examples, **kw):
        evals.append([str(ex.get("id")) for ex in examples])
        return real_eval(program, examples, **kw)

    def counting_score(examples, predictions):
        scored.append([str(ex.get("id")) for ex in examples])
        return real_score(examples, predictions)

    monkeypatch.setattr(runner, "run_eval", counting_eval)
    monkeypatch.setattr(runner, "score_predictions", counting_score)
    examples = [_span_ex(i, i % 3 != 0) for i in range(8)]
    lm = scripted_lm(_responder)
    with dspy.context(lm=lm, adapter=dspy.JSONAdapter()):
        res = run_optimize(_config(tmp_path, program="spans", metric="iou",
                                   optimizer=OptimizerConfig(candidates=2, trials=2)), examples, task_lm=lm)
    assert res.status == FINISHED and res.optimizer.name == "mipro"
    folds = [f.heldout_ids for f in res.cv.folds]
    assert evals == [folds[0], folds[0], folds[1], folds[1]]
    assert scored == evals
    assert sorted(folds[0] + folds[1]) == sorted(ex.id for ex in examples)
    assert res.artifact is not None and res.artifact.manifest["optimizer"]["name"] == "mipro"


# ------------------------------------------------------------------------------------------------------
# the result object; failures
# ------------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("status, code", [(FINISHED, 0), (FAILED, 1), (KILLED, 130), ("RUNNING", 1)])
def test_result_exit_codes(status, code):
    res = OptimizeResult(program="p", metric="f1", lang="de", source="s", n=0, optimizer=OptimizerConfig(),
                         status=status)
    assert res.exit_code == code


def test_failed_compile_still_writes_the_report(tmp_path, fit_program, monkeypatch):
    calls = {"n": 0}

    def flaky_fit(module, trainset, metric_name):
        calls["n"] += 1
        if calls["n"] == 2:
            raise RuntimeError("fit blew up")
        return fit_threshold(module, trainset, metric_name)

    import dataclasses

    monkeypatch.setitem(registry.REGISTRY, PROGRAM, dataclasses.replace(fit_program, fit=flaky_fit))
    res = run_optimize(_config(tmp_path), _examples(8))
    assert res.status == FAILED and res.exit_code == 1
    assert "fold 2" in res.error and "fit blew up" in res.error
    assert res.stages == ["prepare", "cross_validate", "write_report"]
    assert res.artifact is None and res.final is None and len(res.cv.folds) == 1
    report = _report(tmp_path)
    assert report["status"] == "FAILED" and "fit blew up" in report["error"]
    assert len(report["cv"]["folds"]) == 1 and "cv_partial" not in report
    assert res.report_path is not None and res.report_path.exists()
    assert not A.list_versions(PROGRAM, "de", "f1", root=tmp_path / "compiled", include_invalid=True)


def test_interrupted_final_compile_is_killed_and_reported(tmp_path, fit_program, monkeypatch):
    def interrupted_fit(module, trainset, metric_name):
        if len(trainset) == 8:  # the final fit
            raise KeyboardInterrupt
        return fit_threshold(module, trainset, metric_name)

    import dataclasses

    monkeypatch.setitem(registry.REGISTRY, PROGRAM, dataclasses.replace(fit_program, fit=interrupted_fit))
    res = run_optimize(_config(tmp_path), _examples(8))
    assert res.status == KILLED and res.exit_code == 130 and res.error == "interrupted"
    assert res.stages == ["prepare", "cross_validate", "final_compile", "write_report"]
    report = _report(tmp_path)
    assert report["status"] == "KILLED" and len(report["cv"]["folds"]) == 2
    assert res.artifact is None


def test_sigterm_during_a_run_is_an_interrupt_and_the_report_keeps_the_folds(tmp_path, fit_program, monkeypatch):
    """A scheduler's SIGTERM (kill, timeout) stops the run as Ctrl-C does: KILLED, the folds done reported, no
    artifact, and the previous SIGTERM handler back afterwards (#21 round eight: killed runs said "running")."""
    import dataclasses
    import os
    import signal
    import time

    def killed_fit(module, trainset, metric_name):
        if len(trainset) == 8:  # the final fit
            os.kill(os.getpid(), signal.SIGTERM)
            time.sleep(5)  # the handler interrupts this
        return fit_threshold(module, trainset, metric_name)

    monkeypatch.setitem(registry.REGISTRY, PROGRAM, dataclasses.replace(fit_program, fit=killed_fit))
    before = signal.getsignal(signal.SIGTERM)
    res = run_optimize(_config(tmp_path), _examples(8))
    assert res.status == KILLED and res.exit_code == 130 and res.error == "interrupted"
    report = _report(tmp_path)
    assert report["status"] == "KILLED" and len(report["cv"]["folds"]) == 2
    assert res.artifact is None
    assert signal.getsignal(signal.SIGTERM) is before


def test_prepare_refuses_before_any_work(tmp_path, fit_program):
    from halluscope.optimize.cv import FoldSizeError

    with pytest.raises(FoldSizeError):
        run_optimize(_config(tmp_path, folds=3), _examples(2))
    with pytest.raises(ValueError, match="no examples"):
        run_optimize(_config(tmp_path), [])
    with pytest.raises(ValueError, match="uses no LM and has no fit hook"):
        run_optimize(_config(tmp_path, program="mark-all"), _examples(8))
    assert not (tmp_path / "reports").exists()


# ------------------------------------------------------------------------------------------------------
# the fit hook end to end
# ------------------------------------------------------------------------------------------------------


def test_fit_program_round_trips_its_fitted_parameter(tmp_path, fit_program):
    res = run_optimize(_config(tmp_path, folds=2), _examples(8))
    assert res.status == FINISHED and res.optimizer.name == "fit"
    fitted = res.final.threshold
    assert fitted != DEFAULT_THRESHOLD and res.final_info["threshold"] == fitted
    assert [f.compile_info["n_train"] for f in res.cv.folds] == [4, 4]
    assert all("threshold" in f.compile_info for f in res.cv.folds)
    assert res.cv.mean("compiled")["f1"]["mean"] > res.cv.mean("zero_shot")["f1"]["mean"]

    m = res.artifact.manifest
    assert m["optimizer"] == {"name": "fit", "seed": 0, "threads": 1, "max_errors": None,
                              "description": "fit (the program's own fit hook)"}
    assert m["task_lm"] is None and m["prompt_lm"] is None and m["predictors"] == {}
    state = json.loads((res.artifact.path / "program.json").read_text())
    assert state["threshold"] == {"value": fitted}

    loaded = A.load_compiled(PROGRAM, lang="de", metric="f1", root=tmp_path / "compiled")
    assert loaded.version == 1 and loaded.program.threshold == fitted
    assert loaded("x" * 100).label is (100 > fitted)


def test_fit_program_through_the_cli_needs_no_lm(tmp_path, fit_program, monkeypatch, capsys):
    monkeypatch.delenv("HALLUSCOPE_DATA_DIR", raising=False)
    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    import halluscope.cli.optimize as cmd

    def no_lm(*a, **k):
        raise AssertionError("a program without an LM must not set one up")

    monkeypatch.setattr(cmd, "setup_lm", no_lm)
    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    rc = cmd.main(["--program", PROGRAM, "--metric", "f1", "--lang", "de", "--compiled-dir", str(tmp_path / "compiled"),
                   "--report-dir", str(tmp_path / "reports"), "--tracking-uri", uri, "--folds", "2"])
    out = capsys.readouterr().out
    assert rc == 0
    assert "zero-shot vs compiled, 2-fold cross-validation" in out and "fit hook" in out
    assert "artifact: " in out and "LM calls: 0" in out

    loaded = A.load_compiled(PROGRAM, lang="de", metric="f1", root=tmp_path / "compiled")
    m = loaded.manifest
    assert m["optimizer"]["name"] == "fit" and m["data"]["n"] == 7 and len(m["cv"]["folds"]) == 2
    assert loaded.program.threshold == m["final"]["threshold"] != DEFAULT_THRESHOLD

    from mlflow.tracking import MlflowClient

    client = MlflowClient(uri)
    run = client.search_runs([client.get_experiment_by_name(f"halluscope/{PROGRAM}/de").experiment_id],
                             filter_string="tags.`halluscope.kind` = 'optimize'")[0]  # the parent run
    assert run.info.status == "FINISHED"
    assert run.data.params["optimizer"] == "fit" and "cv/compiled/f1" in run.data.metrics


def test_cli_still_refuses_a_program_without_lm_or_fit(capsys, tmp_path):
    # checked once, by plan_run, before any LM is set up: a usage error (exit 2) naming the program
    from halluscope.cli.optimize import main

    with pytest.raises(SystemExit) as e:
        main(["--program", "mark-all", "--metric", "iou", "--lang", "de", "--no-mlflow",
              "--compiled-dir", str(tmp_path / "compiled"), "--report-dir", str(tmp_path / "reports")])
    assert e.value.code == 2
    assert "'mark-all' uses no LM and has no fit hook" in capsys.readouterr().err
    assert not (tmp_path / "compiled").exists()


@pytest.mark.parametrize("program, lang, metric", [("spans", "de", "iou"), ("halluclean", "qa", "f1")])
def test_committed_artifacts_still_load(program, lang, metric):
    from halluscope.core.paths import compiled_dir

    art = A.load_compiled(program, lang=lang, metric=metric, version=1, root=compiled_dir())
    for key in ("cv", "final", "optimizer", "task_lm", "data", "usage", "compared", "program_options"):
        assert key in art.manifest


# ------------------------------------------------------------------------------------------------------
# which optimizer runs for a program with a fit hook (#11)
# ------------------------------------------------------------------------------------------------------


def test_optimizer_for_a_program_with_a_fit_hook():
    from halluscope.optimize.cv import min_compile_items
    from halluscope.optimize.run import optimizer_for

    def plain_fit(module, trainset, metric_name):
        return {}

    def compiling_fit(module, trainset, metric_name, *, optimizer="bootstrap"):
        return {}

    def spec(fit, uses_lm=True):
        return registry.ProgramSpec(name="t", build=LengthThreshold, description="t", uses_lm=uses_lm, fit=fit)

    default, chosen = OptimizerConfig(), OptimizerConfig(name="bootstrap", seed=3)
    assert default.name == "mipro" and not default.chosen and chosen.chosen
    assert "chosen" not in default.to_dict() and "then_fit" not in default.to_dict()
    # no fit hook: the config as given (MIPROv2 by default)
    assert optimizer_for(registry.get_program("spans"), default) is default
    # a fit hook, no optimizer chosen, or no LM: the hook alone
    for s, c in ((spec(plain_fit), default), (spec(plain_fit, uses_lm=False), chosen),
                 (spec(compiling_fit, uses_lm=False), chosen)):
        got = optimizer_for(s, c)
        assert got.name == "fit" and not got.then_fit and got.fit_with is None and got.label == "fit"
    # an LM program, an optimizer chosen: compile the prompts, then the hook fits the compiled program
    got = optimizer_for(spec(plain_fit), chosen)
    assert (got.name, got.then_fit, got.seed, got.label) == ("bootstrap", True, 3, "bootstrap+fit")
    assert got.describe().endswith(", then fit (the program's own fit hook, on the compiled program)")
    assert got.to_dict()["then_fit"] is True
    # a hook that compiles prompts itself (takes optimizer=) gets the optimizer chosen
    got = optimizer_for(spec(compiling_fit), OptimizerConfig(name="mipro"))
    assert (got.name, got.fit_with, got.label) == ("fit", "mipro", "fit(mipro)")
    assert got.describe() == "fit (the program's own fit hook, compiling with MIPROv2)"
    assert min_compile_items(got) == 2 and got.to_dict()["fit_with"] == "mipro"
    with pytest.raises(ValueError, match="then_fit"):
        OptimizerConfig(name="fit", then_fit=True)


def test_compile_program_runs_the_fit_hook_after_the_optimizer_or_hands_it_the_optimizer(monkeypatch):
    """then_fit: the hook sees the compiled program (its demos) after BootstrapFewShot; fit_with: the hook gets
    ``optimizer=``."""
    from halluscope.metrics.adapters import get_metric
    from halluscope.optimize.cv import FailureCounter, compile_program

    def respond(call):
        words = call.inputs.get("answer", "").split()
        return {"spans": [{"text": words[-1], "probability": 0.9}] if words else []}

    seen = {}

    def fit_after(module, trainset, metric_name):
        seen["demos"] = sum(len(p.demos) for p in module.predictors())
        return {"fitted_after": 1}

    def fit_with(module, trainset, metric_name, *, optimizer="bootstrap"):
        seen["optimizer"] = optimizer
        return {}

    examples = [dspy.Example(id=f"x{i}", question="q", answer=f"it is wrong{i}", context="", lang="en",
                             hard_labels=[[6, 12 + len(str(i))]], label=True).with_inputs("question", "answer",
                                                                                         "context", "lang")
                for i in range(3)]
    lm = scripted_lm(respond)
    with dspy.context(adapter=dspy.JSONAdapter()):
        program, info = compile_program(registry.get_program("spans").build(), examples, get_metric("iou"),
                                        OptimizerConfig(name="bootstrap", then_fit=True), task_lm=lm,
                                        failures=FailureCounter(), fit=fit_after, metric_name="iou")
    assert info["fitted_after"] == 1 and seen["demos"] == 2 == sum(len(p.demos) for p in program.predictors())
    assert info["lm_errors"] == 0 and info["lm_calls"] >= 2
    compile_program(registry.get_program("spans").build(), examples, get_metric("iou"),
                    OptimizerConfig(name="fit", fit_with="mipro"), task_lm=lm, fit=fit_with, metric_name="iou")
    assert seen["optimizer"] == "mipro"


def test_jointcq_gets_the_chosen_optimizer(monkeypatch):
    """JointCQ's fit hook compiles its claim-query stage itself: ``--optimizer mipro`` reaches
    compile_claim_queries (BootstrapFewShot when none is chosen)."""
    import halluscope.programs.jointcq.demo_filter as jf
    from halluscope.optimize.run import optimizer_for

    spec = registry.get_program("jointcq")
    assert optimizer_for(spec, OptimizerConfig()).fit_with is None
    cfg = optimizer_for(spec, OptimizerConfig(name="mipro"))
    assert cfg.name == "fit" and cfg.fit_with == "mipro"
    used = []

    def fake_compile(program, trainset, *, optimizer="bootstrap", **kw):
        used.append(optimizer)
        return program

    monkeypatch.setattr(jf, "compile_claim_queries", fake_compile)
    module = spec.build()
    info = spec.fit(module, [], "f1", optimizer=cfg.fit_with)
    spec.fit(module, [], "f1")
    assert used == ["mipro", "bootstrap"] and info["criteria_optimizer"] == "mipro"
