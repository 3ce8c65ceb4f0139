"""Issue #10, runs that fail say so; scores equal the official score of the file written."""

from __future__ import annotations

import json
import time

import dspy
import pytest

from halluscope.cli import main as cli_main
from halluscope.programs import registry


@pytest.fixture
def demo_env(monkeypatch):
    monkeypatch.delenv("HALLUSCOPE_DATA_DIR", raising=False)
    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)


class Boom(dspy.Module):
    def forward(self, **kw):
        raise RuntimeError("the LM is unreachable")


def build_boom() -> Boom:
    """A program whose every item fails."""
    return Boom()


@pytest.fixture
def boom(monkeypatch):
    spec = registry.ProgramSpec(name="boom-test", build=build_boom, description="fails", uses_lm=False)
    monkeypatch.setitem(registry.REGISTRY, spec.name, spec)
    return spec


def _ex(i, hard, label=True):
    return dspy.Example(id=f"x{i}", question="q", answer="alpha beta gamma", lang="en", context="",
                        hard_labels=hard, soft_labels=[{"start": s, "end": e, "prob": 1.0} for s, e in hard],
                        label=label).with_inputs("question", "answer", "lang", "context")


# -- scores equal what is written ------------------------------------------------------------------


def test_a_failed_item_is_scored_as_the_empty_prediction_written_for_it():
    from halluscope.evaluation.runner import score_predictions

    # Official scorer: an empty gold vs an empty prediction is IoU 1.0; a failed item is written as empty.
    scores = score_predictions([_ex(0, [], label=False), _ex(1, [[0, 5]])], [None, None])
    assert scores["iou"] == pytest.approx(0.5)


def test_items_without_gold_labels_are_not_scored():
    from halluscope.evaluation.runner import score_predictions

    unlabelled = [_ex(0, [], label=None), _ex(1, [], label=None)]
    assert score_predictions(unlabelled, [None, None]) == {}
    # a mixed set is scored on its labelled items only
    mixed = score_predictions([_ex(0, [[0, 5]]), _ex(1, [], label=None)],
                              [{"hard_labels": [[0, 5]], "soft_labels": [{"start": 0, "end": 5, "prob": 1.0}]}, None])
    assert mixed["iou"] == pytest.approx(1.0)


def test_evaluate_on_unlabelled_items_writes_the_submission_only(tmp_path, demo_env, capsys, monkeypatch):
    import halluscope.cli.evaluate as ev

    real = ev.load_examples

    def unlabelled(args):
        examples, source = real(args)
        return [ex.copy(hard_labels=[], soft_labels=[], label=None) for ex in examples], source

    monkeypatch.setattr(ev, "load_examples", unlabelled)
    rc = cli_main(["evaluate", "--program", "mark-all", "--lang", "de", "--out-dir", str(tmp_path), "--no-mlflow",
                   "--no-progress"])
    out = capsys.readouterr().out
    assert rc == 0
    assert "no gold labels" in out and "iou" not in out.split("no gold labels")[1]
    assert list(tmp_path.rglob("*.submission.jsonl"))
    summary = json.loads(next(tmp_path.rglob("*.summary.json")).read_text())["summary"]
    assert "iou" not in summary and "corr" not in summary


# -- runs in which (nearly) everything fails ---------------------------------------------------------


def test_evaluate_where_every_item_fails_exits_nonzero_and_is_failed_in_mlflow(tmp_path, demo_env, boom, capsys):
    from mlflow.tracking import MlflowClient

    from halluscope.tracking.runs import runs_table

    uri = f"sqlite:///{tmp_path / 'm.db'}"
    rc = cli_main(["evaluate", "--program", boom.name, "--lang", "de", "--out-dir", str(tmp_path / "out"),
                   "--tracking-uri", uri, "--no-progress"])
    captured = capsys.readouterr()
    assert rc == 1
    assert "FAILED" in captured.out + captured.err and "failed" in (captured.out + captured.err)
    assert list((tmp_path / "out").rglob("*.predictions.jsonl"))  # what was done is still written
    client = MlflowClient(uri)
    runs = client.search_runs([e.experiment_id for e in client.search_experiments()])
    assert [r.info.status for r in runs] == ["FAILED"]
    rows = runs_table(uri, metric="iou")
    assert rows and all(r["score"] is None for r in rows)  # compare does not rank it


def test_failed_share_threshold(tmp_path, demo_env, monkeypatch, capsys):
    """More than --max-failed-share failed items -> exit 1; at or below it -> exit 0 with the count printed."""
    calls = {"n": 0}

    class Half(dspy.Module):
        def forward(self, answer="", **kw):
            calls["n"] += 1
            if calls["n"] % 2:
                raise RuntimeError("flaky")
            return registry.get_program("mark-all").make()(answer=answer)

    spec = registry.ProgramSpec(name="half-test", build=Half, description="half fail", uses_lm=False)
    monkeypatch.setitem(registry.REGISTRY, spec.name, spec)
    base = ["evaluate", "--program", spec.name, "--lang", "de", "--out-dir", str(tmp_path), "--no-mlflow",
            "--no-progress"]
    assert cli_main(base + ["--max-failed-share", "0.25"]) == 1
    calls["n"] = 0
    assert cli_main(base + ["--max-failed-share", "0.75"]) == 0


def test_the_lm_is_checked_once_before_the_loop(tmp_path, demo_env, capsys):
    t0 = time.perf_counter()
    with pytest.raises(SystemExit) as e:
        cli_main(["evaluate", "--program", "spans", "--lang", "de", "--out-dir", str(tmp_path), "--no-mlflow",
                  "--no-progress", "--lm", "openai/some-model", "--api-base", "http://127.0.0.1:9/v1",
                  "--api-key", "x-test-key-77", "--cache-dir", str(tmp_path / "cache")])
    err = capsys.readouterr().err
    assert e.value.code == 1 and "LM check failed" in err and "x-test-key-77" not in err
    assert not list(tmp_path.rglob("*.predictions.jsonl"))  # nothing ran
    assert time.perf_counter() - t0 < 60


@pytest.mark.parametrize("bad", [["--max-tokens", "-1"], ["--max-tokens", "0"], ["--temperature", "nan"]])
def test_impossible_lm_settings_are_usage_errors(tmp_path, demo_env, bad, capsys):
    with pytest.raises(SystemExit) as e:
        cli_main(["evaluate", "--program", "spans", "--lang", "de", "--out-dir", str(tmp_path), "--no-mlflow",
                  *bad])
    assert e.value.code == 2 and bad[0] in capsys.readouterr().err


@pytest.mark.parametrize("opt", ["shift=NaN", "shift=inf", "novalue", "=3"])
def test_bad_program_options_exit_2_with_a_clear_message(tmp_path, demo_env, opt, capsys):
    with pytest.raises(SystemExit) as e:
        cli_main(["evaluate", "--program", "logits", "--lang", "de", "--out-dir", str(tmp_path), "--no-mlflow",
                  "-O", opt])
    err = capsys.readouterr().err
    assert e.value.code == 2 and "Traceback" not in err and ("shift" in err or opt in err)


def test_out_dir_that_is_a_file_fails_before_any_work(tmp_path, demo_env, boom, capsys):
    f = tmp_path / "taken"
    f.write_text("x")
    with pytest.raises(SystemExit) as e:
        cli_main(["evaluate", "--program", boom.name, "--lang", "de", "--out-dir", str(f), "--no-mlflow"])
    assert e.value.code == 2 and "--out-dir" in capsys.readouterr().err


def test_run_folders_are_unique_and_created_exclusively(tmp_path):
    from halluscope.core.fileio import create_unique_dir

    a, b = create_unique_dir(tmp_path, "same"), create_unique_dir(tmp_path, "same")
    assert a != b and a.is_dir() and b.is_dir() and b.name == "same-2"


def test_two_optimize_runs_in_the_same_second_get_their_own_report_folders(tmp_path, monkeypatch):
    from halluscope.optimize.run import OptimizeConfig, stage_prepare
    from halluscope.lm.scripted import scripted_lm

    monkeypatch.setattr(time, "strftime", lambda fmt, *a: "20260101-000000")  # the same second
    lm = scripted_lm({"spans": []})
    examples = [_ex(i, [[0, 5]] if i % 2 else [], label=bool(i % 2)) for i in range(8)]
    config = OptimizeConfig(program="spans", metric="iou", lang="en", report_dir=tmp_path, mlflow=False)
    a = stage_prepare(config, examples, task_lm=lm, log=lambda _: None)
    b = stage_prepare(config, examples, task_lm=lm, log=lambda _: None)
    assert a.report_dir != b.report_dir and a.report_dir.is_dir() and b.report_dir.is_dir()


# -- optimize: a run whose items fail mid-run fails (#10) ---------------------------------------------


def _failing_lm():
    from halluscope.lm.scripted import scripted_lm

    def respond(call):
        raise RuntimeError("server went away")

    return scripted_lm(respond)


def _optimize(tmp_path, lm, *extra):
    from halluscope.cli.optimize import build_parser, run

    p = build_parser()
    argv = ["--program", "spans", "--metric", "iou", "--lang", "de", "--adapter", "json", "--optimizer", "bootstrap",
            "--compiled-dir", str(tmp_path / "compiled"), "--report-dir", str(tmp_path / "reports"),
            "--tracking-uri", f"sqlite:///{tmp_path / 'mlflow.db'}", "--folds", "2", "--quiet", *extra]
    return run(p.parse_args(argv), p, task_lm=lm)


def test_optimize_where_every_item_fails_exits_nonzero_writes_no_artifact_and_is_failed(tmp_path, demo_env,
                                                                                         capsys):
    """The LM fails on every call after the run started: BootstrapFewShot scores each failure 0 and stays under
    its error budget, so before #10 the run FINISHED with an artifact of a program that never answered."""
    from mlflow.tracking import MlflowClient

    from halluscope.artifacts.store import list_versions
    from halluscope.tracking.runs import runs_table

    rc = _optimize(tmp_path, _failing_lm())
    out = capsys.readouterr().out
    assert rc == 1
    line = next(ln for ln in out.splitlines() if ln.startswith("NO ARTIFACT WRITTEN"))
    assert "fold 1: 3 of 3 LM calls of the compile failed (more than --max-failed-share 0.5)" in line
    assert "server went away" in line
    assert not list_versions("spans", "de", "iou", root=tmp_path / "compiled", include_invalid=True)
    report = json.loads(next((tmp_path / "reports").glob("*/report.json")).read_text())
    assert report["status"] == "FAILED" and "max-failed-share" in report["error"]
    assert report["max_failed_share"] == 0.5
    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    client = MlflowClient(uri)
    runs = client.search_runs([client.get_experiment_by_name("halluscope/spans/de").experiment_id],
                              filter_string="tags.`halluscope.kind` = 'optimize'")
    assert [r.info.status for r in runs] == ["FAILED"]
    assert all(r["score"] is None for r in runs_table(uri, metric="iou") if r["kind"] == "optimize")


def test_optimize_failed_share_threshold_is_the_users(tmp_path, demo_env, capsys):
    """--max-failed-share 1 tolerates every failure (the run finishes, the failures are in the report);
    a share outside [0, 1] is a usage error."""
    from halluscope.artifacts.store import list_versions

    assert _optimize(tmp_path, _failing_lm(), "--max-failed-share", "1", "--no-mlflow") == 0
    assert list_versions("spans", "de", "iou", root=tmp_path / "compiled")
    report = json.loads(next((tmp_path / "reports").glob("*/report.json")).read_text())
    assert report["status"] == "FINISHED" and report["usage"]["lm_errors"] > 0
    with pytest.raises(SystemExit) as e:
        _optimize(tmp_path, _failing_lm(), "--max-failed-share", "1.5")
    assert e.value.code == 2 and "--max-failed-share: expected a finite number in [0, 1]" in capsys.readouterr().err


def test_a_compile_whose_lm_calls_fail_beyond_the_share_is_a_compile_error():
    """compile_program counts the LM calls of the compile and the failed ones: above the share it raises
    CompileError naming the last error; at share 1 it returns, with both counts in its info."""
    from halluscope.optimize.cv import CompileError, FailureCounter, OptimizerConfig, compile_program
    from halluscope.metrics.adapters import get_metric

    trainset = [_ex(i, [[0, 5]]) for i in range(3)]
    cfg = OptimizerConfig(name="bootstrap")
    lm = _failing_lm()
    with dspy.context(adapter=dspy.JSONAdapter()):
        with pytest.raises(CompileError, match=r"3 of 3 LM calls of the compile failed .*server went away"):
            compile_program(registry.get_program("spans").build(), trainset, get_metric("iou"), cfg, task_lm=lm,
                            failures=FailureCounter(), max_failed_share=0.5)
        _, info = compile_program(registry.get_program("spans").build(), trainset, get_metric("iou"), cfg, task_lm=lm,
                                  failures=FailureCounter(), max_failed_share=1.0)
    assert info["lm_calls"] == info["lm_errors"] == 3


def test_optimize_where_held_out_items_fail_fails_after_the_fold(tmp_path, demo_env, monkeypatch, capsys):
    """A program with a fit hook (no LM) that raises on every item: the fit works, every held-out item fails;
    the run stops after the first fold, FAILED, with no artifact."""
    from halluscope.artifacts.store import list_versions
    from halluscope.cli.optimize import build_parser, run

    spec = registry.ProgramSpec(name="boom-fit-test", build=build_boom, description="fails", uses_lm=False,
                                fit=lambda module, trainset, metric_name: {"fitted": 1})
    monkeypatch.setitem(registry.REGISTRY, spec.name, spec)
    p = build_parser()
    args = p.parse_args(["--program", spec.name, "--metric", "iou", "--lang", "de", "--folds", "3",
                         "--compiled-dir", str(tmp_path / "compiled"), "--report-dir", str(tmp_path / "reports"),
                         "--no-mlflow"])
    assert run(args, p) == 1
    out = capsys.readouterr().out
    line = next(ln for ln in out.splitlines() if ln.startswith("NO ARTIFACT WRITTEN"))
    assert "after fold 1:" in line and "held-out items of the zero-shot program failed" in line
    assert "raised: RuntimeError x" in line
    assert not list_versions(spec.name, "de", "iou", root=tmp_path / "compiled", include_invalid=True)
    report = json.loads(next((tmp_path / "reports").glob("*/report.json")).read_text())
    assert report["status"] == "FAILED" and len(report["cv"]["folds"]) == 1


def test_optimize_whose_test_items_fail_is_failed_with_no_artifact(tmp_path, monkeypatch):
    """--folds 1 (no held-out folds) and a test set on which every item fails: FAILED after score_test."""
    from halluscope.optimize.run import FAILED, OptimizeConfig, run_optimize

    spec = registry.ProgramSpec(name="boom-fit-test", build=build_boom, description="fails", uses_lm=False,
                                fit=lambda module, trainset, metric_name: {"fitted": 1})
    monkeypatch.setitem(registry.REGISTRY, spec.name, spec)
    examples = [_ex(i, [[0, 5]]) for i in range(4)]
    config = OptimizeConfig(program=spec.name, metric="iou", lang="en", folds=1, test_examples=examples,
                            compiled_dir=tmp_path / "compiled", report_dir=tmp_path / "reports", mlflow=False)
    res = run_optimize(config, examples)
    assert res.status == FAILED and res.exit_code == 1 and res.artifact is None
    assert res.error.startswith("test: 4 of 4 test items of the compiled program failed")
    assert "score_test" in res.stages and "write_artifact" not in res.stages
    assert json.loads(res.report_path.read_text())["status"] == "FAILED"
