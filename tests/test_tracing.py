"""``--trace``: each item's module, predictor and LM calls as an MLflow trace in a local SQLite store, with the
prompts and completions readable and credentials redacted; nothing traced without it."""

from __future__ import annotations

import dspy
import pytest
from mlflow.tracking import MlflowClient

from halluscope.tracking.traces import lm_tracing
from halluscope.programs.registry import get_program
from halluscope.evaluation.runner import run_eval
from halluscope.lm.scripted import scripted_lm

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
    spec = get_program("spans")
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


def _traces(store, experiment):
    client = MlflowClient(store)
    exp = client.get_experiment_by_name(experiment)
    assert exp is not None, f"no experiment {experiment}"
    return client, [client.get_trace(t.info.trace_id)
                    for t in client.search_traces(locations=[exp.experiment_id], max_results=1000)]


def _lm_spans(trace):
    return [s for s in trace.data.spans if s.name.endswith(".__call__") and "LM" in s.name]


def test_optimize_trace_flag(tmp_path, store, monkeypatch):
    """``optimize --trace``: the optimizer's LM calls while compiling (and the evaluation's) are traces of kind
    optimize in the program's experiment, redacted; the optimize run is recorded beside them."""
    import json

    from halluscope.cli.optimize import build_parser, run
    from halluscope.loaders.demo import write_demo_data

    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    root = write_demo_data(tmp_path / "demo")
    data = root / "val" / "mushroom.de-val.v2.extra.jsonl"  # each question carries a key and a secret's value
    rows = [json.loads(line) for line in data.read_text(encoding="utf-8").splitlines() if line.strip()]
    data.write_text("".join(json.dumps({**r, "model_input": f"{r['model_input']} (key {SECRET_KEY}, token "
                                                            f"{SECRET_ENV})"}, ensure_ascii=False) + "\n"
                            for r in rows), encoding="utf-8")
    lm = scripted_lm(_responder)
    p = build_parser()
    args = p.parse_args(["--program", "spans", "--metric", "iou", "--lang", "de", "--adapter", "json",
                         "--data-dir", str(root),
                         "--optimizer", "bootstrap", "--folds", "2", "--compiled-dir", str(tmp_path / "compiled"),
                         "--report-dir", str(tmp_path / "reports"), "--tracking-uri", store, "--quiet", "--trace"])
    assert run(args, p, task_lm=lm) == 0
    client, traces = _traces(store, "halluscope/spans/de")
    assert traces and {t.info.tags["halluscope.kind"] for t in traces} == {"optimize"}
    assert len({t.info.tags["halluscope.session"] for t in traces}) == 1  # one command, one session
    lm_spans = [s for t in traces for s in _lm_spans(t)]
    assert len(lm_spans) >= len(traces) // 2 and lm_spans  # the LM calls themselves are recorded
    prompts = " ".join(str(s.inputs) for s in lm_spans)
    assert "(key ***, token ***)" in prompts  # readable prompts, the question's secrets masked
    assert '"probability": 0.9' in " ".join(str(s.outputs) for s in lm_spans)  # the completions
    for t in traces:
        dump = t.to_json()
        assert SECRET_ENV not in dump and SECRET_KEY not in dump
    runs = client.search_runs([client.get_experiment_by_name("halluscope/spans/de").experiment_id],
                              filter_string="tags.`halluscope.kind` = 'optimize'")
    assert len(runs) == 1 and runs[0].info.status == "FINISHED"


def test_detect_trace_flag(tmp_path, store, monkeypatch, capsys):
    """``halluscope detect --trace``: one trace per answer (--answer and --input), kind detect, redacted."""
    import json

    import halluscope.cli.detect as detect_cmd
    from halluscope.artifacts import store as A
    from halluscope.cli import main

    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    root = tmp_path / "compiled"
    A.write_artifact(get_program("spans").make(), {"source": "fixture"}, program_name="spans", lang="de", metric="iou",
                     root=root)
    lm = scripted_lm(_responder)

    def fake_setup(args, needed=True):
        dspy.configure(lm=lm, adapter=dspy.JSONAdapter())
        return lm

    monkeypatch.setattr(detect_cmd, "setup_lm", fake_setup)
    answer = f"Die Provinz heißt Álava. Token {SECRET_ENV}."
    rc = main(["detect", "--program", "spans", "--lang", "de", "--compiled-dir", str(root), "--answer", answer,
               "--question", f"Welche Provinz (key {SECRET_KEY})?", "--trace", "--tracking-uri", store])
    assert rc == 0 and json.loads(capsys.readouterr().out)["ok"] is True
    _, traces = _traces(store, "halluscope/spans/de")
    assert len(traces) == 1 and traces[0].info.tags["halluscope.kind"] == "detect"
    (lm_span,) = _lm_spans(traces[0])
    prompt = str(lm_span.inputs)
    assert "Die Provinz heißt Álava" in prompt and "Welche Provinz" in prompt and "***" in prompt
    assert SECRET_ENV not in traces[0].to_json() and SECRET_KEY not in traces[0].to_json()

    inp = tmp_path / "answers.jsonl"
    inp.write_text("".join(json.dumps({"id": f"a{i}", "answer": f"Berlin ist groß {i}."}) + "\n" for i in range(2)))
    rc = main(["detect", "--program", "spans", "--lang", "de", "--compiled-dir", str(root), "--input", str(inp),
               "--output", str(tmp_path / "out.jsonl"), "--no-progress", "--trace", "--tracking-uri", store])
    assert rc == 0
    _, traces = _traces(store, "halluscope/spans/de")
    sessions = {}
    for t in traces:
        sessions.setdefault(t.info.tags["halluscope.session"], []).append(t)
    assert sorted(len(v) for v in sessions.values()) == [1, 2]  # the --input command: one trace per row

    # without --trace nothing more is recorded
    rc = main(["detect", "--program", "spans", "--lang", "de", "--compiled-dir", str(root), "--answer", answer,
               "--tracking-uri", store])
    assert rc == 0 and len(_traces(store, "halluscope/spans/de")[1]) == 3
