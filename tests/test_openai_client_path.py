"""The real-model client path: ``--lm openai/NAME --api-base http://127.0.0.1:PORT/v1`` against an
OpenAI-compatible server on 127.0.0.1 (:mod:`halluscope.serve.openai_compat`).

Fast tests use the schema stand-in backend (a JSON object valid under the schema each request sends; the span
detector's answers quote the first word of the answer), so they check the client side for real: what is sent
(response_format with the bounded schema, max_tokens per stage), one call per item, the cache keyed by the
server, retries and timeouts, evaluate/optimize/load_compiled+detect end to end, and that no API key is written
anywhere. The ``embedded`` test serves the embedded GGUF itself.
"""

from __future__ import annotations

import contextlib
import json
import re
import socket
import threading
import time
from pathlib import Path

import dspy
import httpx
import pytest
import uvicorn

from halluscope.artifacts import store as A
from halluscope.cli import main as cli_main
from halluscope.artifacts.compiled import detect
from halluscope.lm.models import SchemaJSONAdapter, configure
from halluscope.programs.registry import get_program
from halluscope.serve.openai_compat import LlamaBackend, SchemaBackend, create_openai_app, schema_instance

SECRET = "sk-halluscope-LEAK-CHECK-7f3a9c"


def first_word_of_answer(body: dict, schema: dict) -> dict:
    """Quote the first word of the answer in the prompt (DSPy's ``[[ ## answer ## ]]`` field)."""
    if "spans" not in schema.get("properties", {}):
        return {}
    user = body["messages"][-1]["content"]
    m = re.search(r"\[\[ ## answer ## \]\]\n\s*(\S+)", user)
    return {"spans": [{"text": m.group(1).strip(".,"), "probability": 0.8}] if m else []}


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@contextlib.contextmanager
def running(app):
    """``app`` on 127.0.0.1 (uvicorn on a thread) for the duration; yields its /v1 base URL."""
    port = _free_port()
    server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=port, log_level="warning"))
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    for _ in range(300):
        try:
            httpx.get(f"http://127.0.0.1:{port}/v1/models", timeout=1)
            break
        except httpx.HTTPError:
            time.sleep(0.05)
    try:
        yield f"http://127.0.0.1:{port}/v1"
    finally:
        server.should_exit = True
        thread.join(15)


@pytest.fixture
def home(tmp_path, monkeypatch):
    monkeypatch.setenv("HALLUSCOPE_HOME", str(tmp_path))
    monkeypatch.delenv("HALLUSCOPE_CACHE_DIR", raising=False)
    monkeypatch.delenv("HALLUSCOPE_COMPILED_DIR", raising=False)
    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    monkeypatch.chdir(tmp_path)
    return tmp_path


def assert_no_secret(root: Path, secret: str = SECRET) -> int:
    """No file under ``root`` (outputs, MLflow store and artifacts, compiled artifacts, LM cache) holds the
    key, in plain bytes or UTF-16. Returns how many files were checked."""
    needles = [secret.encode(), secret.encode("utf-16-le")]
    n = 0
    for p in root.rglob("*"):
        if p.is_file():
            n += 1
            data = p.read_bytes()
            assert not any(x in data for x in needles), f"API key found in {p}"
    return n


def test_schema_instance_is_valid_for_dspy_shaped_schemas():
    schema = {"$defs": {"Q": {"type": "object", "properties": {"text": {"type": "string"},
                                                                "p": {"type": "number"}},
                              "required": ["text", "p"]}},
              "type": "object", "required": ["spans", "verdict", "n"],
              "properties": {"spans": {"type": "array", "items": {"$ref": "#/$defs/Q"}},
                             "verdict": {"enum": ["yes", "no"]}, "n": {"type": ["integer", "null"]},
                             "opt": {"type": "string"}}}
    assert schema_instance(schema) == {"spans": [], "verdict": "yes", "n": 0}
    assert schema_instance({"$defs": schema["$defs"], "$ref": "#/$defs/Q"}) == {"text": "", "p": 0.0}


def test_schema_adapter_sends_the_bounded_schema_and_each_stages_budget(home):
    app = create_openai_app(SchemaBackend(first_word_of_answer))
    with running(app) as base:
        lm = configure("openai/stand-in", api_base=base, max_tokens=300)
        assert isinstance(dspy.settings.adapter, SchemaJSONAdapter)
        det = detect(get_program("spans").make(), "Canberra is the capital.", lang="en")
        assert [(s.start, s.end) for s in det.spans] == [(0, 8)]

        class Stage(dspy.Signature):
            """Summarise."""
            text: str = dspy.InputField()
            summary: str = dspy.OutputField()

        dspy.Predict(Stage)(text="abc", config={"max_tokens": 64})
    first, second = app.state.requests
    rf = first["response_format"]
    assert rf["type"] == "json_schema" and rf["json_schema"]["strict"] is True
    schema = rf["json_schema"]["schema"]
    # bounded to fit the 300-token budget (schema_bounds): 4 quotes of at most 134 characters, not 8 x 200
    assert schema["properties"]["spans"]["maxItems"] == 4
    # the quote items are written out in full (signatures.spans.QuotedSpans: no "$ref" for a small model to copy)
    assert "$defs" not in schema and schema["properties"]["spans"]["items"]["properties"]["text"]["maxLength"] == 134
    assert first["max_tokens"] == 300 and second["max_tokens"] == 64  # the LM's budget, then the stage's own
    assert second["response_format"]["json_schema"]["schema"]["required"] == ["summary"]
    assert lm.engine.base_url == base


def test_without_the_schema_a_free_text_server_costs_two_calls(home):
    """With --response-schema off the chat adapter's free-text answer does not parse; DSPy's JSON fallback
    then asks the server for the signature's schema (the engine advertises structured output), so the item
    parses at the cost of two calls. With the schema (the default for --api-base) it is one call."""
    app = create_openai_app(SchemaBackend())  # free text when no schema is sent
    with running(app) as base:
        configure("openai/stand-in", api_base=base, response_schema=False)
        det = detect(get_program("spans").make(), "Canberra is the capital.", lang="en")
        assert det.failures == {} and det.spans == []
        first, second = app.state.requests
        assert "response_format" not in first and first["max_tokens"] == 512  # max_tokens even without a schema
        assert second["response_format"]["type"] == "json_schema"
        configure("openai/stand-in", api_base=base)
        det = detect(get_program("spans").make(), "Canberra is the capital.", lang="en")
        assert det.failures == {} and len(app.state.requests) == 3
    with pytest.raises(ValueError, match="JSON adapter"):
        configure("openai/stand-in", api_base="http://127.0.0.1:9/v1", adapter="chat", response_schema=True)


def item_calls(app) -> list[dict]:
    """The requests programs made (the CLI may also send one plain "is the LM there" check per run)."""
    return [r for r in app.state.requests if "response_format" in r]


def _evaluate(base: str, *extra: str) -> dict:
    rc = cli_main(["evaluate", "--program", "spans", "--lang", "en", "--limit", "3", "--lm", "openai/stand-in",
                   "--api-base", base, "--api-key", SECRET, "--no-progress", *extra])
    assert rc == 0
    (summary,) = sorted(Path("outputs").glob("spans-*/spans.summary.json"), key=lambda p: p.stat().st_mtime)[-1:]
    return json.loads(summary.read_text())["summary"]


def test_evaluate_through_a_server_one_call_per_item_cached_per_server(home):
    one = create_openai_app(SchemaBackend(first_word_of_answer))
    two = create_openai_app(SchemaBackend(first_word_of_answer))
    with running(one) as base_one, running(two) as base_two:
        s = _evaluate(base_one)
        assert s["n"] == 3 and s["lm_calls"] == 3 and s["lm_calls_per_item"] == 1.0
        assert not any(k.startswith("failures_") for k in s), s  # every answer parsed, every quote mapped
        assert len(item_calls(one)) == 3
        assert all(r["response_format"]["type"] == "json_schema" and r["max_tokens"] == 512
                   for r in item_calls(one))
        time.sleep(1)  # a new output folder name
        again = _evaluate(base_one)
        assert again["lm_cache_hits"] == 3 and len(item_calls(one)) == 3  # served from the cache
        time.sleep(1)
        _evaluate(base_two)  # same model name, another server: its own cache entries
        assert len(item_calls(two)) == 3 and len(item_calls(one)) == 3
    assert sorted(p.name for p in (home / ".cache" / "dspy").iterdir() if p.name.startswith("server-")) == sorted(
        {f"server-{__import__('hashlib').sha256(b.encode()).hexdigest()[:12]}" for b in (base_one, base_two)})
    assert assert_no_secret(home) > 5


@pytest.mark.parametrize("where", ["userinfo", "query"])
def test_credentials_in_the_api_base_are_sent_as_a_header_and_written_nowhere(home, capsys, where):
    """#24: ``--api-base http://user:pw@host/v1`` and ``?api_key=`` work (the credential travels as an
    Authorization header) and the credential appears in no output, log line, cache entry or MLflow record."""
    seen = []

    class Auth:  # records the Authorization header of each request
        def __init__(self, app):
            self.app = app

        async def __call__(self, scope, receive, send):
            if scope["type"] == "http" and scope["path"].endswith("/chat/completions"):
                seen.append(dict(scope["headers"]).get(b"authorization", b"").decode())
            await self.app(scope, receive, send)

    app = create_openai_app(SchemaBackend(first_word_of_answer))
    with running(Auth(app)) as base:
        host = base.split("://", 1)[1]
        url = f"http://alice:{SECRET}@{host}" if where == "userinfo" else f"{base}?api_key={SECRET}"
        rc = cli_main(["evaluate", "--program", "spans", "--lang", "en", "--limit", "2", "--lm", "openai/stand-in",
                       "--api-base", url, "--no-progress"])
        assert rc == 0
    out = capsys.readouterr()
    assert seen and all(h.startswith("Basic " if where == "userinfo" else "Bearer ") for h in seen)
    assert SECRET in (__import__("base64").b64decode(seen[0][6:]).decode() if where == "userinfo" else seen[0])
    assert SECRET not in out.out + out.err
    assert assert_no_secret(home) > 5  # outputs, MLflow store, LM cache


def test_retries_recover_from_server_errors_and_timeouts_fail_the_item_fast(home):
    flaky = create_openai_app(SchemaBackend(first_word_of_answer), fail_first=2)
    with running(flaky) as base:
        configure("openai/stand-in", api_base=base, num_retries=3, cache_dir=home / "c1")
        det = detect(get_program("spans").make(), "Canberra is the capital.", lang="en")
        assert [(s.start, s.end) for s in det.spans] == [(0, 8)]
        assert len(flaky.state.requests) == 3  # two 500s, then the answer
    slow = create_openai_app(SchemaBackend(first_word_of_answer), delay_s=5)
    with running(slow) as base:
        configure("openai/stand-in", api_base=base, num_retries=0, timeout=0.5, cache_dir=home / "c2")
        t0 = time.perf_counter()
        with pytest.raises(Exception, match="(?i)time"):
            detect(get_program("spans").make(), "Canberra is the capital.", lang="en")
        assert time.perf_counter() - t0 < 4.5


def test_optimize_through_a_server_then_load_and_detect(home):
    app = create_openai_app(SchemaBackend(first_word_of_answer))
    with running(app) as base:
        rc = cli_main(["optimize", "--program", "spans", "--lang", "en", "--limit", "6", "--optimizer", "bootstrap",
                       "--folds", "2", "--max-bootstrapped-demos", "1", "--max-labeled-demos", "1",
                       "--lm", "openai/stand-in", "--api-base", base, "--api-key", SECRET, "--quiet"])
        assert rc == 0
        n_optimize = len(item_calls(app))
        assert n_optimize > 0 and all(r["response_format"]["type"] == "json_schema" for r in item_calls(app))
        detector = A.load_compiled("spans", lang="en", metric="iou", root=home / "compiled")
        assert (detector.manifest.get("task_lm") or {}).get("model") == "openai/stand-in"
        configure("openai/stand-in", api_base=base, api_key=SECRET)
        det = detect(detector, "Paris is the capital of Germany.", question="What is the capital of Germany?")
        assert [(s.start, s.end, s.prob) for s in det.spans] == [(0, 5, 0.8)]
        assert len(item_calls(app)) == n_optimize + 1
    assert assert_no_secret(home) > 5  # outputs, MLflow store and artifacts, compiled artifact, cache


@pytest.mark.embedded
def test_embedded_gguf_behind_an_openai_compatible_server(home):
    """The embedded SmolLM2 served over HTTP: every item parses in one call, output bounded by max_tokens.
    (What the 135M model quotes is mostly wrong: this proves the plumbing, not the detector.)"""
    backend = LlamaBackend()
    app = create_openai_app(backend, model_name="smollm2")
    with running(app) as base:
        rc = cli_main(["evaluate", "--program", "spans", "--lang", "en", "--limit", "3", "--lm", "openai/smollm2",
                       "--api-base", base, "--max-tokens", "256", "--no-progress", "--no-mlflow"])
        assert rc == 0
    (summary,) = Path("outputs").glob("spans-*/spans.summary.json")
    s = json.loads(summary.read_text())["summary"]
    assert s["n"] == 3 and s["lm_calls"] == 3, s  # one call per item: no chat-then-JSON fallback
    assert "failures_parse" not in s, s
    assert s["lm_output_tokens"] <= 3 * 256
    assert [r["max_tokens"] for r in item_calls(app)] == [256] * 3


def test_serve_a_compiled_detector_whose_lm_is_a_server(home):
    """HTTP all the way: ``halluscope serve`` (its own process, configured like a user would) calls an
    OpenAI-compatible LM server for each detection."""
    import subprocess
    import sys

    from halluscope.programs.spans.program import SpanDetector

    A.write_artifact(SpanDetector(), {"source": "fixture"}, program_name="spans", lang="en", metric="iou",
                     root=home / "compiled")
    lm_app = create_openai_app(SchemaBackend(first_word_of_answer))
    with running(lm_app) as lm_base:
        port = _free_port()
        proc = subprocess.Popen([sys.executable, "-m", "halluscope", "serve", "--program", "spans", "--lang", "en",
                                 "--port", str(port), "--lm", "openai/stand-in", "--api-base", lm_base,
                                 "--log-level", "warning"], stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        try:
            for _ in range(600):
                try:
                    httpx.get(f"http://127.0.0.1:{port}/healthz", timeout=1)
                    break
                except httpx.HTTPError:
                    assert proc.poll() is None, proc.stdout.read()
                    time.sleep(0.1)
            r = httpx.post(f"http://127.0.0.1:{port}/v1/detect", timeout=60,
                           json={"answer": "Sydney is the capital of Australia.", "question": "Capital?"})
            assert r.status_code == 200, r.text
            assert [(s["start"], s["end"]) for s in r.json()["spans"]] == [(0, 6)]
            assert len(item_calls(lm_app)) == 2  # serve's start-up check (one probe answer), then the request
            assert item_calls(lm_app)[1]["response_format"]["type"] == "json_schema"
        finally:
            proc.terminate()
            proc.communicate(timeout=20)


@contextlib.contextmanager
def lm_server(*args: str):
    """``halluscope lm-server`` (the model factory's safe parameters unless the probe said otherwise) on a free
    port, in its own process; yields its base URL and the line it printed on start."""
    import subprocess
    import sys

    port = _free_port()
    proc = subprocess.Popen([sys.executable, "-m", "halluscope", "lm-server", "--port", str(port), *args],
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    base = f"http://127.0.0.1:{port}/v1"
    try:
        started = proc.stderr.readline()  # printed once the model is loaded, before the port is bound
        for _ in range(600):
            try:
                httpx.get(f"{base}/models", timeout=1)
                break
            except httpx.HTTPError:
                assert proc.poll() is None, f"halluscope lm-server did not start: {started}{proc.stderr.read()}"
                time.sleep(0.2)
        yield base, started
    finally:
        proc.terminate()
        proc.wait(30)


@pytest.mark.embedded
def test_lm_server_answers_chat_completions_with_the_embedded_model(home):
    with lm_server("--name", "smollm2", "--n-ctx", "2048") as (base, started):
        assert started.startswith("halluscope lm-server: ") and "'smollm2'" in started and "use_extra_bufts" in started
        assert httpx.get(f"{base}/models", timeout=10).json()["data"][0]["id"] == "smollm2"
        r = httpx.post(f"{base}/chat/completions", timeout=120, json={
            "model": "smollm2", "messages": [{"role": "user", "content": "Name the capital of France."}],
            "max_tokens": 8, "temperature": 0,
            "response_format": {"type": "json_schema", "json_schema": {"name": "A", "schema": {
                "type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}}})
        assert r.status_code == 200, r.text
        out = r.json()
        assert out["usage"]["completion_tokens"] <= 8 and out["choices"][0]["finish_reason"] in ("stop", "length")
        if out["choices"][0]["finish_reason"] == "stop":
            assert set(json.loads(out["choices"][0]["message"]["content"])) == {"city"}


@pytest.mark.embedded
def test_every_lm_program_through_a_real_server(home):
    """A real OpenAI-compatible server process on the embedded GGUF (``halluscope lm-server``, which builds the
    model with the factory's safe parameters: ``python -m llama_cpp.server`` cannot be given them and dies on a
    CPU that advertises AMX in a VM that does not enable it, #33): the client's first choice, ``json_schema``, is
    taken, max_tokens is honoured, and every LM program runs its 2 items with no HTTP failure."""
    from halluscope.lm.openai_client import reset_server_capabilities, server_capabilities

    reset_server_capabilities()
    with lm_server("--name", "smollm2", "--n-ctx", "8192") as (base, _):
        runs = {"spans": ["--lang", "en"], "halluclean": ["--task", "qa"], "direct": ["--task", "qa"],
                "finch": ["--lang", "en", "-O", "n_samples=1"],
                "medico": ["--task", "qa", "-O", "correct=false", "-O", "sources=context"],
                "jointcq": ["--lang", "en", "-O", "retriever=context"]}
        for program, data in runs.items():
            rc = cli_main(["evaluate", "--program", program, *data, "--limit", "2", "--lm", "openai/smollm2",
                           "--api-base", base, "--max-tokens", "64", "--no-progress", "--no-mlflow",
                           "--max-failed-share", "1"])
            assert rc == 0, program
            (summary,) = Path("outputs").glob(f"{program}-*/{program}.summary.json")
            s = json.loads(summary.read_text())["summary"]
            assert s["n"] == 2 and s["lm_calls"] >= 2, (program, s)
            assert not any(k.startswith("failures_error") for k in s), (program, s)  # no HTTP failure
            engine = dspy.settings.lm.engine  # the client the command configured
            assert engine.stats.over_budget == 0, program  # no generation longer than the max_tokens it was sent
        caps = server_capabilities()
        assert caps == {f"{base} smollm2": {"format": "json_schema", "max_completion_tokens": False}}
