"""The evaluation runner and the ``halluscope evaluate`` command."""

from __future__ import annotations

import json

import dspy
import pytest

from halluscope.cli import main
from halluscope.evaluation.runner import run_eval, score_predictions
from halluscope.lm.scripted import scripted_lm
from halluscope.loaders.demo import write_demo_data
from halluscope.loaders.mushroom import load_mushroom
from halluscope.programs.spans.program import SpanDetector


def ex(i, answer, hard, label=None):
    e = dspy.Example(id=f"x-{i}", question="q", answer=answer, lang="en", context="",
                     hard_labels=hard, soft_labels=[{"start": s, "end": t, "prob": 1.0} for s, t in hard],
                     annotations={}, label=bool(hard) if label is None else label)
    return e.with_inputs("question", "answer", "lang", "context")


class Flaky(dspy.Module):
    """Marks the word 'Berlin'; raises on answers containing 'boom'."""

    def forward(self, answer="", **_):
        if "boom" in answer:
            raise RuntimeError("model server went away")
        from halluscope.core.contract import Detection, Span, to_prediction

        i = answer.find("Berlin")
        spans = [Span(i, i + 6, 0.9)] if i >= 0 else []
        return to_prediction(Detection(answer=answer, spans=spans, label=bool(spans), score=0.9 if spans else 0,
                                       failures={"unmatched": 1} if "?" in answer else {}))


def test_run_eval_keeps_going_after_an_exception_and_scores_everything():
    data = [ex(0, "It is in Berlin.", [[9, 15]]), ex(1, "boom", [[0, 4]]), ex(2, "Fine? yes", [])]
    res = run_eval(Flaky(), data, progress=False)
    assert res.n == 3
    assert res.predictions[1] is None and res.predictions[0] is not None
    assert res.failures == {"error:RuntimeError": 1, "unmatched": 1}
    assert "model server went away" in res.errors[0]
    # iou: item0 exact 1.0, item1 failed 0.0, item2 both empty 1.0 -> 2/3
    assert res.scores["iou"] == pytest.approx(2 / 3)
    # response level: golds T,T,F; preds T, failed (counts as the opposite of gold: F), F -> acc 2/3
    assert res.scores["accuracy"] == pytest.approx(2 / 3)
    assert res.scores["recall"] == pytest.approx(0.5)
    s = res.summary()
    assert s["n"] == 3 and s["failures_unmatched"] == 1 and "seconds_per_item" in s


def test_run_eval_threads_give_the_same_predictions_in_order():
    data = [ex(i, f"Item {i} is in Berlin." if i % 2 else f"Item {i} ok.", [[0, 4]]) for i in range(8)]
    one = run_eval(Flaky(), data, progress=False)
    many = run_eval(Flaky(), data, threads=4, progress=False)
    assert [p.hard_labels for p in one.predictions] == [p.hard_labels for p in many.predictions]
    assert one.scores == many.scores


def test_run_eval_counts_lm_calls_tokens_and_cache_hits():
    data = [ex(i, f"Paris is in Germany number {i}.", [[12, 19]]) for i in range(3)]
    lm = scripted_lm({"spans": [{"text": "Germany", "probability": 0.9}]})
    with dspy.context(lm=lm, adapter=dspy.JSONAdapter()):
        res = run_eval(SpanDetector(), data, progress=False)
    assert res.usage.calls == 3 and res.usage.cache_hits == 0
    assert res.usage.input_tokens > 0 and res.usage.output_tokens > 0
    assert res.scores["iou"] == pytest.approx(1.0)


def test_report_hook_and_its_failure_do_not_lose_the_evaluation():
    data = [ex(0, "It is in Berlin.", [[9, 15]])]
    res = run_eval(Flaky(), data, progress=False, report=lambda exs, preds: {"extra": len(preds)})
    assert res.report == {"extra": 1}
    res = run_eval(Flaky(), data, progress=False, report=lambda exs, preds: 1 / 0)
    assert "ZeroDivisionError" in res.report["report_error"] and res.scores["iou"] == 1.0


def test_score_predictions_skips_unlabelled_items_for_response_metrics():
    data = [ex(0, "a Berlin", [[2, 8]]), ex(1, "b", [], label=None)]
    data[1] = data[1].copy(label=None)
    preds = [Flaky()(answer="a Berlin"), Flaky()(answer="b")]
    s = score_predictions(data, preds)
    assert s["accuracy"] == 1.0 and s["iou"] == 1.0


def test_cli_evaluate_baselines_on_demo_data_writes_official_submission(tmp_path, monkeypatch, capsys):
    monkeypatch.delenv("HALLUSCOPE_DATA_DIR", raising=False)
    root = write_demo_data(tmp_path / "demo")
    out = tmp_path / "out"
    rc = main(["evaluate", "--program", "mark-all", "--lang", "de", "--data-dir", str(root),
               "--out-dir", str(out), "--no-progress", "--no-mlflow"])
    assert rc == 0
    printed = capsys.readouterr().out
    assert "iou" in printed and "LM calls" in printed
    sub = next(out.rglob("mark-all.submission.jsonl"))
    rows = [json.loads(line) for line in sub.read_text(encoding="utf-8").splitlines()]
    items = load_mushroom(root, lang="de")
    assert [r["id"] for r in rows] == [e.id for e in items]
    for r, e in zip(rows, items):
        assert set(r) == {"id", "hard_labels", "soft_labels"}
        if e.answer.strip():
            assert r["hard_labels"] == [[len(e.answer) - len(e.answer.lstrip()), len(e.answer.rstrip())]]

    rc = main(["evaluate", "--program", "logits", "--lang", "de", "--data-dir", str(root), "--limit", "3",
               "--out-dir", str(out), "--no-progress", "--no-mlflow"])
    assert rc == 0
    summary = json.loads(next(out.rglob("logits.summary.json")).read_text())["summary"]
    assert summary["n"] == 3 and summary["lm_calls"] == 0
    # the demo logits are low exactly on the hallucinated tokens, so the baseline finds them
    assert summary["iou"] > 0.5


def test_cli_errors_name_the_problem(tmp_path, capsys):
    with pytest.raises(SystemExit):
        main(["evaluate", "--program", "no-such-program"])
    assert "invalid choice" in capsys.readouterr().err
    # a loader error: one line naming it, exit status 2, no traceback (--debug shows it)
    assert main(["evaluate", "--program", "mark-all", "--lang", "de", "--data-dir", str(tmp_path),
                 "--no-progress", "--no-mlflow"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("halluscope evaluate: error: no Mu-SHROOM val file for language 'de'") and \
        err.count("\n") == 1
    with pytest.raises(SystemExit) as e:  # a usage error: exit status 2, the argument named
        main(["evaluate", "--program", "mark-all", "--limit", "0", "--no-mlflow"])
    assert e.value.code == 2 and "argument --limit: expected a whole number in [1, 1000000000], got '0'" in capsys.readouterr().err


def test_dataset_defaults_to_halluclean_when_a_task_is_named():
    import argparse

    from halluscope.cli.common import resolve_dataset

    assert resolve_dataset(argparse.Namespace(dataset=None, task="qa")) == "halluclean"
    assert resolve_dataset(argparse.Namespace(dataset=None, task=None)) == "mushroom"
    assert resolve_dataset(argparse.Namespace(dataset="mushroom", task="qa")) == "mushroom"
