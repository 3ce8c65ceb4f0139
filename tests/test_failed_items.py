"""Issues #20 and #24: a failed item is one definition (halluscope.core.contract.item_failure), and every command
counts it toward --max-failed-share: an LM that answers only garbage (parse failures, not exceptions) fails the
run, with the reason in one line."""

from __future__ import annotations

import json
from pathlib import Path

import dspy
import pytest

from halluscope.cli import main as cli_main
from halluscope.core.contract import (ITEM_FAILURE_KINDS, Detection, describe_failed, failed_kinds, failure_reason,
                                 item_failure)
from halluscope.lm.scripted import scripted_lm

COMPILED = Path(__file__).resolve().parent.parent / "compiled"  # the committed artifacts


@pytest.fixture
def demo_env(monkeypatch, tmp_path):
    monkeypatch.delenv("HALLUSCOPE_DATA_DIR", raising=False)
    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    monkeypatch.setenv("HALLUSCOPE_HOME", str(tmp_path / "home"))


# -- the definition ----------------------------------------------------------------------------------------


@pytest.mark.parametrize("failures, reason", [
    ({}, None),
    (None, None),
    ({"unmatched": 3, "invalid_span": 1}, None),         # spans kept what it could map: usable
    ({"source_search": 1, "rerank": 1}, None),           # MEDICO lost one evidence source: usable
    ({"no_evidence": 1, "lm_answer_cut": 1}, None),      # grounded's neutral fallbacks: usable
    ({"verify_parse": 1, "search": 2}, None),            # one JointCQ claim unreadable: the others count
    ({"detector_failed:spans": 1}, None),                # a fused detector missing: grounded imputes it
    ({"parse": 1}, "parse"),
    ({"parse": 0}, None),                                # a zero count is no failure
    ({"unmatched": 1, "parse": 1}, "parse"),
    ({"generate_parse": 1}, "generate_parse"),           # JointCQ got no claims at all
    ({"verdict": 1}, "verdict"),                         # HalluClean's judge said neither yes nor no
    ({"truncated": 1}, "truncated"),
    ({"lm_error": 1, "lm_missing": 1}, "lm_error"),
    ({"lm_error:Timeout": 2}, "lm_error:Timeout"),       # a kind with its detail after ':'
    ({"error:RuntimeError": 1}, "error:RuntimeError"),   # what the runners record for a program that raised
])
def test_failure_reason(failures, reason):
    assert failure_reason(failures) == reason
    # the same rule for a prediction or a Detection carrying these failures
    det = Detection(answer="x", failures=dict(failures or {}))
    assert item_failure(det) == reason


def test_a_missing_prediction_is_a_failed_item_and_output_failures_come_first():
    assert item_failure(None) == "error"
    assert failure_reason({"truncated": 1, "parse": 1, "error:X": 1}) == "parse"  # OUTPUT_FAILURE_KEYS order


def test_every_failure_kind_is_documented_and_reasons_are_counted_and_described():
    assert {"error", "parse", "truncated", "lm_error"} <= ITEM_FAILURE_KINDS
    kinds = failed_kinds(["parse", None, "error:RuntimeError", "parse", None])
    assert kinds == {"parse": 2, "error:RuntimeError": 1}
    assert describe_failed(kinds) == "raised: RuntimeError x1; unusable output: parse x2"
    assert describe_failed({}) == ""


# -- the runners ---------------------------------------------------------------------------------------------


def _garbage_lm():
    """An LM that answers every call with text no adapter can read (not an exception)."""
    return scripted_lm(lambda call: "<html>502 Bad Gateway</html> lorem ipsum")


def _examples(n=4):
    return [dspy.Example(id=f"x{i}", question="Where is it?", answer="It is in Paris, France.", lang="en",
                         context="", hard_labels=[[9, 14]], soft_labels=[{"start": 9, "end": 14, "prob": 1.0}],
                         label=True).with_inputs("question", "answer", "lang", "context")
            for i in range(n)]


def test_run_eval_counts_parse_failures_as_failed_items():
    from halluscope.programs.registry import get_program
    from halluscope.evaluation.runner import run_eval

    with dspy.context(lm=_garbage_lm(), adapter=dspy.JSONAdapter()):
        res = run_eval(get_program("spans").build(), _examples(), progress=False)
    assert all(p is not None for p in res.predictions)  # nothing raised...
    assert res.failed_items == 4 and res.failed_kinds() == {"parse": 4}  # ...yet every item failed
    assert res.summary()["failed_items"] == 4


def test_evaluate_with_an_lm_that_answers_only_garbage_fails(tmp_path, demo_env, monkeypatch, capsys):
    """Before: only exceptions counted; parse failures did not, and the run exited 0."""
    import halluscope.cli.evaluate as ev

    def garbage_setup(args, *, needed=True):
        lm = _garbage_lm()
        dspy.configure(lm=lm, adapter=dspy.JSONAdapter())
        return lm

    monkeypatch.setattr(ev, "setup_lm", garbage_setup)
    rc = cli_main(["evaluate", "--program", "spans", "--lang", "de", "--out-dir", str(tmp_path / "out"),
                   "--no-mlflow", "--no-progress"])
    err = capsys.readouterr().err
    assert rc == 1
    line = next(ln for ln in err.splitlines() if ln.startswith("RUN FAILED"))
    assert "unusable output: parse x" in line and "--max-failed-share 0.5" in line
    rows = [json.loads(ln) for ln in next((tmp_path / "out").rglob("*.predictions.jsonl")).read_text().splitlines()]
    assert rows and all(r["failures"].get("parse") for r in rows)  # what was done is still written
    summary = json.loads(next((tmp_path / "out").rglob("*.summary.json")).read_text())["summary"]
    assert summary["failed_items"] == summary["n"]
    # the user may tolerate it
    assert cli_main(["evaluate", "--program", "spans", "--lang", "de", "--out-dir", str(tmp_path / "out2"),
                     "--no-mlflow", "--no-progress", "--max-failed-share", "1"]) == 0


class _Counted(dspy.Module):
    """Answers every item with a usable detection that records a non-fatal failure count."""

    def forward(self, answer="", **kw):
        from halluscope.core.contract import Detection, to_prediction

        return to_prediction(Detection(answer=answer, spans=[(0, 2, 0.9)], failures={"unaligned_units": 1}))


def test_cross_validate_log_names_the_fold_count_not_a_failure_kind():
    """The fold count was rebound by a ``for k, v in failures.items()`` loop: "-- fold 2/unaligned_units"."""
    from halluscope.optimize.cv import OptimizerConfig, cross_validate

    lines = []
    res = cross_validate(_Counted, _examples(6), "iou", OptimizerConfig(name="fit"), k=3, log=lines.append,
                         fit=lambda module, trainset, metric_name: {}, max_failed_share=0.5)
    assert res.error is None and len(res.folds) == 3
    heads = [ln for ln in lines if ln.startswith("-- fold")]
    assert [h.split(":")[0] for h in heads] == ["-- fold 1/3", "-- fold 2/3", "-- fold 3/3"]
    assert res.folds[0].zero_shot_failures == {"unaligned_units": 2} and res.folds[0].zero_shot_failed == {}


def test_optimize_with_an_lm_that_answers_only_garbage_fails_with_no_artifact(tmp_path, demo_env, capsys):
    from halluscope.artifacts.store import list_versions
    from halluscope.cli.optimize import build_parser, run

    p = build_parser()
    args = p.parse_args(["--program", "spans", "--metric", "iou", "--lang", "de", "--adapter", "json",
                         "--optimizer", "bootstrap", "--compiled-dir", str(tmp_path / "compiled"),
                         "--report-dir", str(tmp_path / "reports"), "--no-mlflow", "--quiet"])
    assert run(args, p, task_lm=_garbage_lm()) == 1
    line = next(ln for ln in capsys.readouterr().out.splitlines() if ln.startswith("NO ARTIFACT WRITTEN"))
    # the first fold's compile already produced nothing usable (the held-out check would follow it)
    assert "fold 1:" in line and "program results of the compile failed" in line and "unusable output: parse" in line
    assert not list_versions("spans", "de", "iou", root=tmp_path / "compiled", include_invalid=True)


def _garbage_setup(args, *, needed=True):
    lm = _garbage_lm()
    dspy.configure(lm=lm, adapter=dspy.JSONAdapter())
    return lm


def test_detect_with_an_lm_that_answers_only_garbage_fails(tmp_path, demo_env, monkeypatch, capsys):
    """The committed spans artifact run by an LM that answers garbage: every row is written (``"ok": false``,
    its error and contract fields) and the command exits 1 with the reason in one line."""
    import halluscope.cli.detect as dt

    monkeypatch.setattr(dt, "setup_lm", _garbage_setup)
    src = tmp_path / "in.jsonl"
    src.write_text("".join(json.dumps({"id": f"a{i}", "answer": "Paris is in Spain.", "question": "Where?"}) + "\n"
                           for i in range(3)))
    out = tmp_path / "out.jsonl"
    base = ["detect", "--program", "spans", "--lang", "de", "--lm", "openai/x", "--no-progress", "--compiled-dir",
            str(COMPILED)]
    assert cli_main([*base, "--input", str(src), "--output", str(out)]) == 1
    err = capsys.readouterr().err
    assert "RUN FAILED: 3 of 3 answers failed (unusable output: parse x3; more than --max-failed-share 0)" in err
    rows = [json.loads(ln) for ln in out.read_text().splitlines()]
    assert [r["ok"] for r in rows] == [False] * 3 and rows[0]["error"] == "unusable output: parse"
    assert rows[0]["failures"] == {"parse": 1}
    # a share the user tolerates: a warning, exit 0
    assert cli_main([*base, "--input", str(src), "--output", str(out), "--max-failed-share", "1"]) == 0
    assert "warning: 3 of 3 answers failed (unusable output: parse x3)" in capsys.readouterr().err
    # one answer
    assert cli_main([*base, "--answer", "Paris is in Spain."]) == 1
    captured = capsys.readouterr()
    assert json.loads(captured.out)["ok"] is False
    assert "RUN FAILED: 1 of 1 answers failed (unusable output: parse" in captured.err
    with pytest.raises(SystemExit) as e:
        cli_main([*base, "--answer", "x", "--max-failed-share", "2"])
    assert e.value.code == 2 and "--max-failed-share" in capsys.readouterr().err


def test_detect_one_answer_whose_program_raises_is_one_line(tmp_path, demo_env, monkeypatch, capsys):
    import halluscope.cli.detect as dt

    def boom_setup(args, *, needed=True):
        lm = scripted_lm(lambda call: (_ for _ in ()).throw(RuntimeError("the server went away\nFile x")))
        dspy.configure(lm=lm, adapter=dspy.JSONAdapter())
        return lm

    monkeypatch.setattr(dt, "setup_lm", boom_setup)
    rc = cli_main(["detect", "--program", "halluclean", "--task", "qa", "--metric", "f1", "--lm", "openai/x",
                   "--answer", "Paris is in Spain.", "--compiled-dir", str(COMPILED)])
    err = capsys.readouterr().err
    assert rc == 1 and "Traceback" not in err
    assert [ln for ln in err.splitlines() if "FAILED" in ln][0].startswith("halluscope detect: FAILED: ")


def _serve(argv, monkeypatch):
    """``halluscope serve ARGV`` up to the point where uvicorn would start: (exit status, whether it started)."""
    import uvicorn

    from halluscope.cli import build_parser

    started = {}
    monkeypatch.setattr(uvicorn, "run", lambda app, **kw: started.update(app=app))
    args = build_parser().parse_args(["serve", *argv])
    return args.func(args), "app" in started


def test_serve_does_not_start_when_its_detectors_give_no_usable_output(demo_env, monkeypatch, capsys):
    import halluscope.cli.serve as sv

    monkeypatch.setattr(sv, "setup_lm", _garbage_setup)
    base = ["--program", "spans", "--lang", "de", "--lm", "openai/x", "--compiled-dir", str(COMPILED)]
    rc, started = _serve(base, monkeypatch)
    err = capsys.readouterr().err
    assert rc == 1 and not started
    line = next(ln for ln in err.splitlines() if "start-up check" in ln)
    assert ("start-up check: FAILED: 1 of 1 detectors failed (spans/de v0001: unusable output: parse; more than "
            "--max-failed-share 0.5)") in line and "--no-startup-check" in line
    assert _serve([*base, "--no-startup-check"], monkeypatch) == (0, True)
    assert _serve([*base, "--max-failed-share", "1"], monkeypatch) == (0, True)
    assert "warning: start-up check: 1 of 1 detectors" in capsys.readouterr().err


def test_serve_starts_when_the_probe_works(demo_env, monkeypatch, capsys):
    """The committed grounded artifact (no LM) answers the probe: the server starts."""
    rc, started = _serve(["--lang", "de", "--compiled-dir", str(COMPILED)], monkeypatch)
    assert (rc, started) == (0, True)
    assert "start-up check" not in capsys.readouterr().err


def test_optimize_without_folds_with_an_lm_that_answers_only_garbage_fails(tmp_path, demo_env, capsys):
    """--folds 1: no held-out items to count; the compile's own program results are (before: exit 0 and an
    artifact of a program that never produced a usable output)."""
    from halluscope.artifacts.store import list_versions
    from halluscope.cli.optimize import build_parser, run

    p = build_parser()
    args = p.parse_args(["--program", "spans", "--metric", "iou", "--lang", "de", "--adapter", "json",
                         "--optimizer", "bootstrap", "--folds", "1", "--compiled-dir", str(tmp_path / "compiled"),
                         "--report-dir", str(tmp_path / "reports"), "--no-mlflow", "--quiet"])
    assert run(args, p, task_lm=_garbage_lm()) == 1
    line = next(ln for ln in capsys.readouterr().out.splitlines() if ln.startswith("NO ARTIFACT WRITTEN"))
    assert "program results of the compile failed" in line and "unusable output: parse" in line
    assert not list_versions("spans", "de", "iou", root=tmp_path / "compiled", include_invalid=True)


class _Unreadable(dspy.Module):
    """What an LM program returns when its LM answered garbage: a detection recording a parse failure."""

    def forward(self, answer="", **kw):
        from halluscope.core.contract import Detection, to_prediction

        return to_prediction(Detection(answer=answer, failures={"parse": 1}))


def test_cross_validation_stops_when_held_out_items_have_no_usable_output():
    from halluscope.optimize.cv import OptimizerConfig, cross_validate

    lines = []
    res = cross_validate(_Unreadable, _examples(6), "iou", OptimizerConfig(name="fit"), k=3, log=lines.append,
                         fit=lambda module, trainset, metric_name: {}, max_failed_share=0.5)
    assert len(res.folds) == 1 and res.folds[0].zero_shot_failed == {"parse": 2}
    assert res.error == ("after fold 1: 2 of 2 held-out items of the zero-shot program failed (more than "
                         "--max-failed-share 0.5); unusable output: parse x2")
