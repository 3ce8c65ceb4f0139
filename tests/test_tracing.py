"""``--trace``: each item's module, predictor and LM calls as an MLflow trace in a local SQLite store, with the
prompts and completions readable and credentials redacted; nothing traced without it."""

from __future__ import annotations

import dspy
import pytest
from mlflow.tracking import MlflowClient

from halluscope.optimize.tracing import lm_tracing
from halluscope.programs.registry import get
from halluscope.runner import run_eval
from halluscope.testing import scripted_lm

SECRET_ENV = "s3cr3t-env-value-4711"
SECRET_KEY = "sk-ABCDEFGHIJKLMNOPQRSTUVWX"


def _responder(call):
    words = call.inputs.get("answer", "").strip().rstrip(".").split()
    return {"spans": [{"text": words[-1], "probability": 0.9}] if words else []}


def _examples():
    return [dspy.Example(id=f"e{i}", lang="de", question=f"Frage {i} (key {SECRET_KEY})?",
                         answer=f"Die Provinz heißt Álava {i}. Token {SECRET_ENV}.", context="",
                         hard_labels=[], soft_labels=[]).with_inputs("question", "answer", "context", "lang")
            for i in range(2)]


@pytest.fixture
def store(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("MY_SERVICE_API_KEY", SECRET_ENV)
    return f"sqlite:///{tmp_path / 'mlflow.db'}"


def test_trace_records_each_lm_call_redacted(store):
    spec = get("spans")
    lm = scripted_lm(_responder)
    with dspy.context(lm=lm, adapter=dspy.JSONAdapter()):
        with lm_tracing(True, experiment="halluscope/spans/de", tracking_uri=store) as session:
            result = run_eval(spec.make(), _examples(), progress=False, extra_inputs=spec.extra_inputs)
        assert result.summary()["lm_calls"] == 2
        assert session.count() == 2  # one trace per item
        run_eval(spec.make(), _examples(), progress=False, extra_inputs=spec.extra_inputs)  # after the block
    client = MlflowClient(store)
    traces = client.search_traces(locations=[session.experiment_id], max_results=100)
    assert len(traces) == 2  # nothing traced outside the block
    trace = client.get_trace(traces[0].info.trace_id)
    assert trace.info.tags["halluscope.session"] == session.session
    spans = trace.data.spans
    lm_spans = [s for s in spans if s.name.endswith(".__call__") and "LM" in s.name]
    assert len(lm_spans) == 1
    prompt = str(lm_spans[0].inputs)
    assert "Die Provinz heißt Álava" in prompt and "***" in prompt  # the prompt, readable, with secrets masked
    assert '"probability": 0.9' in str(lm_spans[0].outputs)  # the completion (its quote is the secret: masked)
    assert {"SpanDetector.forward"} <= {s.name for s in spans} or any("Predict" in s.name for s in spans)
    dump = trace.to_json()
    assert SECRET_ENV not in dump and SECRET_KEY not in dump


def test_tracing_off_records_nothing(store):
    with lm_tracing(False, experiment="halluscope/spans/de", tracking_uri=store) as session:
        assert session is None
    assert MlflowClient(store).get_experiment_by_name("halluscope/spans/de") is None


def test_evaluate_trace_flag(tmp_path, store, monkeypatch, capsys):
    """``halluscope evaluate --trace``: one trace per item in the run's experiment, beside the run itself."""
    import halluscope.cli.evaluate as ev
    from halluscope.cli import main
    from halluscope.loaders.demo import write_demo_data

    monkeypatch.delenv("HALLUSCOPE_DATA_DIR", raising=False)
    lm = scripted_lm(_responder)

    def fake_setup(args, needed=True):
        dspy.configure(lm=lm, adapter=dspy.JSONAdapter())
        return lm

    monkeypatch.setattr(ev, "setup_lm", fake_setup)
    root = write_demo_data(tmp_path / "demo")
    rc = main(["evaluate", "--program", "spans", "--lang", "de", "--data-dir", str(root), "--limit", "2",
               "--out-dir", str(tmp_path / "out"), "--no-progress", "--trace", "--tracking-uri", store])
    assert rc == 0
    client = MlflowClient(store)
    exp = client.get_experiment_by_name("halluscope/spans/de")
    traces = client.search_traces(locations=[exp.experiment_id], max_results=100)
    assert len(traces) == 2 and {t.info.tags["halluscope.kind"] for t in traces} == {"evaluate"}
    assert len(client.search_runs([exp.experiment_id])) == 1  # the evaluate run
