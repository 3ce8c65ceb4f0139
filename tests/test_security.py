"""Issue #10, security: credentials never reach a file, artifacts cannot choose where credentials go, item ids
cannot escape the data folder."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import dspy
import pytest

from halluscope.artifacts import store as A
from halluscope.core.redact import redact, redact_argv, redact_obj, redact_url, register_secret
from halluscope.lm.scripted import scripted_lm

KEY = "cli-key-Zq8w3LmP0x"  # shaped like no known provider key: only registration/argv handling can hide it
URL = "http://alice:pw-Hx71bq@127.0.0.1:9/v1?api_key=qk-91aa77bb&x=1"


def _no_secret(text: str) -> None:
    for s in (KEY, "pw-Hx71bq", "alice:", "qk-91aa77bb"):
        assert s not in text, f"{s!r} leaked"


def _responder(call):
    if "spans" in call.outputs:
        words = call.inputs.get("answer", "").strip().rstrip(".").split()
        return {"spans": [{"text": words[-1], "probability": 0.9}] if words else []}
    return {"proposed_instruction": "Quote wrong names.", "observations": "x", "summary": "x",
            "program_description": "x", "module_description": "x"}


# -- the redaction function ---------------------------------------------------------------------------


def test_redact_url_argv_and_objects():
    assert redact_url(URL) == "http://***@127.0.0.1:9/v1?api_key=***&x=1"
    assert redact_url("https://h/x?key=abc&token=def&q=1") == "https://h/x?key=***&token=***&q=1"
    register_secret(KEY)
    assert redact(f"error talking to {URL} with {KEY}").count("***") == 3
    argv = ["--lm", "openai/x", "--api-key", "other-key-123", "--api-base", URL, "--prompt-api-key=zz-9876",
            "--hf-token", "tok123456"]
    out = redact_argv(argv)
    assert out[3] == "***" and out[6] == "--prompt-api-key=***" and out[8] == "***"
    assert "pw-Hx71bq" not in " ".join(out) and out[:2] == ["--lm", "openai/x"]
    obj = redact_obj({"task_lm": {"model": "openai/x", "api_base": URL, "api_key": "abcd1234"}, "n": 3,
                      "argv": [KEY], "ok": True})
    assert obj["task_lm"]["api_key"] == "***" and obj["n"] == 3 and obj["ok"] is True
    _no_secret(json.dumps(obj))


def test_make_lm_registers_its_key_and_describe_hides_url_credentials():
    from halluscope.lm.models import describe, make_lm

    lm = make_lm("openai/some-model", api_base=URL, api_key="mk-unique-4471xx")
    assert "mk-unique-4471xx" not in redact(f"request failed: key mk-unique-4471xx")
    _no_secret(describe(lm))
    assert "127.0.0.1:9" in describe(lm)


# -- nothing secret in report.json, manifest.json, summary.json, MLflow -------------------------------


def test_optimize_report_manifest_and_mlflow_hold_no_credentials(tmp_path, monkeypatch, capsys):
    from mlflow.tracking import MlflowClient

    from halluscope.cli.optimize import build_parser, run

    monkeypatch.delenv("HALLUSCOPE_DATA_DIR", raising=False)
    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    argv = ["--metric", "iou", "--lang", "de", "--adapter", "json", "--compiled-dir", str(tmp_path / "compiled"),
            "--report-dir", str(tmp_path / "reports"), "--tracking-uri", uri, "--candidates", "2", "--trials", "2",
            "--quiet", "--api-key", KEY, "--api-base", URL]
    monkeypatch.setattr(sys, "argv", ["optimize.py", *argv])
    lm = scripted_lm(_responder)
    # As if the task LM were served from that URL and something recorded it raw: the writers must redact.
    monkeypatch.setattr("halluscope.optimize.run.describe", lambda _lm: json.dumps({"model": _lm.model, "api_base": URL}))
    p = build_parser()
    assert run(p.parse_args(argv), p, task_lm=lm) == 0
    capsys.readouterr()
    report = next((tmp_path / "reports").rglob("report.json")).read_text()
    assert "--api-key" in report  # the argv is recorded, its secret is not
    _no_secret(report)
    for f in (tmp_path / "compiled").rglob("*.json"):
        _no_secret(f.read_text())
    art = A.load_compiled("spans", lang="de", metric="iou", version=1,  # the scripted compile changed nothing:
                          root=tmp_path / "compiled")                    # never served by default, still verifies
    assert "127.0.0.1:9" in art.manifest["task_lm"]["api_base"]
    client = MlflowClient(uri)
    runs = client.search_runs([e.experiment_id for e in client.search_experiments()])
    assert runs
    for r in runs:
        _no_secret(json.dumps(r.data.params) + json.dumps(r.data.tags))
        local = client.download_artifacts(r.info.run_id, "", str(tmp_path / f"dl-{r.info.run_id}"))
        for f in Path(local).rglob("*"):
            if f.is_file():
                _no_secret(f.read_text(errors="replace"))


def test_error_text_in_eval_results_and_summary_is_redacted(tmp_path):
    from halluscope.cli.evaluate import write_outputs
    from halluscope.evaluation.runner import run_eval

    register_secret(KEY)

    class Leaky(dspy.Module):
        def forward(self, question, answer, lang, context):
            raise ConnectionError(f"cannot reach {URL} (key {KEY})")

    ex = dspy.Example(id="x1", question="q", answer="a b", lang="en", context="", hard_labels=[], soft_labels=[],
                      label=False).with_inputs("question", "answer", "lang", "context")
    res = run_eval(Leaky(), [ex], progress=False)
    assert res.errors and "127.0.0.1:9" in res.errors[0]
    _no_secret("\n".join(res.errors))
    try:  # the dataset registry (issue 8) passes a DatasetSpec; before it, the dataset's name
        from halluscope.loaders import get_dataset
        dataset = get_dataset("mushroom")
    except ImportError:
        dataset = "mushroom"
    files = write_outputs(tmp_path / "out", "leaky", [ex], res, dataset)
    for f in files:
        _no_secret(f.read_text())


def test_detect_jsonl_error_rows_are_redacted(tmp_path):
    from halluscope.artifacts.compiled import detect_jsonl

    register_secret(KEY)

    class Leaky(dspy.Module):
        def forward(self, **kw):
            raise ConnectionError(f"cannot reach {URL} (key {KEY})")

    inp = tmp_path / "in.jsonl"
    inp.write_text(json.dumps({"id": "a", "answer": "x y"}) + "\n")
    stats = detect_jsonl(Leaky(), inp, tmp_path / "out.jsonl", lang="en", progress=False)
    assert stats["failed"] == 1
    _no_secret((tmp_path / "out.jsonl").read_text())


# -- artifacts cannot choose endpoints or models that receive credentials ------------------------------


def _reseal(version_dir: Path, **options) -> None:
    """What anyone who can edit an artifact can do: change its options and recompute the (unkeyed) hash."""
    man = json.loads((version_dir / "manifest.json").read_text())
    man["program_options"].update(options)
    man["content_hash"] = A.content_hash((version_dir / "program.json").read_bytes(), man)
    (version_dir / "manifest.json").write_text(json.dumps(man))


@pytest.mark.parametrize("program, option, value", [
    ("finch", "samplers", ["openai/gpt-4o-mini?api_base=http://evil.example:8080/v1"]),
    ("finch", "samplers", ["anthropic/claude-3-5-haiku-latest"]),
    ("finch", "samplers", [{"lm": "self", "api_base": "http://evil.example/v1"}]),
    ("finch", "improver", "openai/gpt-4o"),
    ("medico", "search", "http://evil.example/search"),
    ("jointcq", "retriever", "search:http://evil.example/collect?q=1"),
])
def test_artifact_options_choosing_an_endpoint_or_model_are_refused_without_opt_in(tmp_path, program, option,
                                                                                   value):
    from halluscope.programs.registry import get_program

    spec = get_program(program)
    art = A.write_artifact(spec.make(), {"program_options": spec.options}, program_name=program, lang="de",
                           metric="iou", root=tmp_path)
    A.load_compiled(program, lang="de", metric="iou", root=tmp_path)  # defaults: fine
    _reseal(art.path, **{option: value})
    with pytest.raises(A.ArtifactError) as e:
        A.load_compiled(program, lang="de", metric="iou", root=tmp_path)
    assert option in str(e.value) and "trust_endpoints" in str(e.value)
    assert "evil.example/v1?" not in str(e.value)
    det = A.load_compiled(program, lang="de", metric="iou", root=tmp_path, trust_endpoints=True)  # explicit opt-in
    assert det.manifest["program_options"][option] == value


def test_ray_workers_load_an_endpoint_artifact_only_with_the_drivers_opt_in(tmp_path):
    """A Ray actor reloads the artifact by path + hash: it refuses an endpoint-choosing one unless the user who
    started the job opted in (--trust-artifact-endpoints is passed on to the actors)."""
    from halluscope.programs.registry import get_program
    from halluscope.evaluation.scale import load_artifact

    spec = get_program("jointcq")
    art = A.write_artifact(spec.make(), {"program_options": spec.options}, program_name="jointcq", lang="de",
                           metric="iou", root=tmp_path)
    _reseal(art.path, retriever="search:http://evil.example/api")
    trusted = A.load_compiled("jointcq", lang="de", metric="iou", root=tmp_path, trust_endpoints=True)
    with pytest.raises(A.ArtifactError, match="trust_endpoints"):
        load_artifact(trusted.path, trusted.content_hash)
    assert load_artifact(trusted.path, trusted.content_hash, trust_endpoints=True).content_hash == trusted.content_hash


def test_artifact_with_harmless_lm_choices_loads(tmp_path):
    from halluscope.programs.registry import get_program

    spec = get_program("finch")
    opts = {**spec.options, "samplers": ["self?temperature=0.5&seed=3", "local?temperature=1.0"]}
    A.write_artifact(spec.make(**opts), {"program_options": opts}, program_name="finch", lang="de", metric="iou",
                     root=tmp_path)
    det = A.load_compiled("finch", lang="de", metric="iou", root=tmp_path)
    assert det.manifest["program_options"]["samplers"][0].startswith("self")


@pytest.mark.parametrize("value, refused", [
    ("search:http://evil.example/api", True),
    ("search:https://evil.example/api", True),
    ("SEARCH:http://evil.example/api", True),
    ("kb:http://evil.example/index", True),        # a URL anywhere
    ("nosuch:x", True),                            # not a local retriever
    (["search:http://evil.example/api"], True),    # not a spec string
    ("search", False),                             # the loading user's own $HALLUSCOPE_SEARCH_URL
    ("context", False),
    ("context:800", False),
    ("kb:/data/index", False),
    ("files:/data/a.txt,/data/b.md", False),
    ("kg:/data/triples.tsv", False),
])
def test_jointcq_retriever_judged_as_an_endpoint_only_when_it_sends_requests(value, refused):
    from halluscope.programs.registry import get_program

    spec = get_program("jointcq")
    assert "retriever" in spec.endpoint_options
    if refused:
        with pytest.raises(A.ArtifactEndpointError) as e:
            A.check_endpoint_options(spec, {"retriever": value}, "x")
        assert "retriever=" in str(e.value) and "--trust-artifact-endpoints" in str(e.value)
    else:
        A.check_endpoint_options(spec, {"retriever": value}, "x")


def test_jointcq_search_artifact_never_contacts_the_host_nor_sends_the_key(tmp_path, monkeypatch, capsys):
    """Without the opt-in, nothing is built from the options: no search request leaves with the key."""
    import urllib.request

    from halluscope.cli import main as cli_main
    from halluscope.programs.registry import get_program

    sent = []
    monkeypatch.setattr(urllib.request, "urlopen", lambda *a, **k: sent.append(a) or (_ for _ in ()).throw(OSError))
    monkeypatch.setenv("HALLUSCOPE_SEARCH_KEY", "sk-search-secret-123456")
    spec = get_program("jointcq")
    art = A.write_artifact(spec.make(), {"program_options": spec.options}, program_name="jointcq", lang="de",
                           metric="iou", root=tmp_path)
    _reseal(art.path, retriever="search:http://evil.example/collect")
    rc = cli_main(["detect", "--program", "jointcq", "--lang", "de", "--compiled-dir", str(tmp_path),
                   "--question", "q?", "--answer", "Berlin is in France."])
    err = capsys.readouterr().err
    assert rc == 2 and "--trust-artifact-endpoints" in err and "retriever" in err
    assert sent == [] and "sk-search-secret" not in err


def test_detect_cli_refuses_an_endpoint_choosing_artifact(tmp_path, capsys):
    from halluscope.cli import main as cli_main
    from halluscope.programs.registry import get_program

    spec = get_program("finch")
    art = A.write_artifact(spec.make(), {"program_options": spec.options}, program_name="finch", lang="de",
                           metric="iou", root=tmp_path)
    _reseal(art.path, samplers=["openai/x?api_base=http://evil.example/v1"])
    rc = cli_main(["detect", "--program", "finch", "--lang", "de", "--compiled-dir", str(tmp_path), "--answer", "x"])
    assert rc == 2 and "--trust-artifact-endpoints" in capsys.readouterr().err


# -- item ids cannot escape the data folder ----------------------------------------------------------


@pytest.mark.parametrize("bad_id", ["../../x", "../secret", "a/b", "..\\x", "/etc/passwd", ".."])
def test_item_id_with_path_parts_is_refused_with_native_context(tmp_path, bad_id):
    from halluscope.loaders.mushroom import load_mushroom

    root = tmp_path / "data"
    (root / "val").mkdir(parents=True)
    (root / "context" / "val" / "native" / "de").mkdir(parents=True)
    (tmp_path / "x.context.txt").write_text("OUTSIDE")  # what ../../x would read
    (root / "context" / "val" / "native" / "de" / "ok-1.context.txt").write_text("inside")
    rows = [{"id": "ok-1", "lang": "DE", "model_input": "q", "model_output_text": "a b", "hard_labels": []},
            {"id": bad_id, "lang": "DE", "model_input": "q", "model_output_text": "a b", "hard_labels": []}]
    f = root / "val" / "mushroom.de-val.v2.jsonl"
    f.write_text("".join(json.dumps(r) + "\n" for r in rows))
    with pytest.raises(ValueError) as e:
        load_mushroom(root, lang="de", context="native")
    assert "line 2" in str(e.value) and "'id'" in str(e.value) and str(f) in str(e.value)
    assert [ex.context for ex in load_mushroom(root, lang="de", context="native", limit=1)] == ["inside"]
