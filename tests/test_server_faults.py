"""OpenAI-compatible servers that misbehave (#20, #24): the client negotiates what they accept, and every fault is a
counted failure of that item with its reason on one line, no traceback, no secret; the run goes on.

Most servers here are ``httpx.MockTransport`` handlers (no sockets, no sleeps); "down" and "slow" are real
sockets on 127.0.0.1.
"""

from __future__ import annotations

import json
import logging
import socket
import threading
import time
from pathlib import Path

import dspy
import httpx
import pytest

from halluscope.lm import models as lmmod
from halluscope.core.contract import item_failure
from halluscope.lm.models import (GuardedJSONAdapter, OpenAICompatEngine, ReplyCache, SchemaJSONAdapter, TruncatedOutputError,
                           configure, evict_last_reply, json_truncated, make_lm)
from halluscope.lm.openai_client import clean_error_text, reset_server_capabilities, server_capabilities, split_url_credentials
from halluscope.programs.registry import get_program
from halluscope.evaluation.runner import run_eval

SECRET = "sk-halluscope-FAULT-LEAK-1b2c3d4e5f"


@pytest.fixture(autouse=True)
def fresh_caps():
    reset_server_capabilities()
    yield
    reset_server_capabilities()


def ex(i: int, answer: str) -> dspy.Example:
    e = dspy.Example(id=f"x-{i}", question="What is the capital of France?", answer=answer, lang="en", context="",
                     hard_labels=[], soft_labels=[], label=False)
    return e.with_inputs("question", "answer", "lang", "context")


ITEMS = [ex(0, "Paris is the capital."), ex(1, "Lyon is the capital."), ex(2, "Nice is the capital.")]


def completion(content: str, finish: str = "stop", completion_tokens: int = 5) -> dict:
    return {"id": "c1", "object": "chat.completion", "model": "m",
            "choices": [{"index": 0, "message": {"role": "assistant", "content": content}, "finish_reason": finish}],
            "usage": {"prompt_tokens": 10, "completion_tokens": completion_tokens,
                      "total_tokens": 10 + completion_tokens}}


def spans_reply(body: dict) -> str:
    """Quote the first word of the answer (DSPy's ``[[ ## answer ## ]]`` field in the last message)."""
    user = body["messages"][-1]["content"]
    word = user.split("[[ ## answer ## ]]", 1)[1].split()[0] if "[[ ## answer ## ]]" in user else "x"
    return json.dumps({"spans": [{"text": word, "probability": 0.9}]})


class Server:
    """A scripted OpenAI-compatible server: ``reply(body, n) -> httpx.Response`` (``n``: the request's index);
    keeps every request body and header."""

    def __init__(self, reply):
        self.reply = reply
        self.bodies: list[dict] = []
        self.headers: list[dict] = []
        self.lock = threading.Lock()

    def __call__(self, request: httpx.Request) -> httpx.Response:
        body = json.loads(request.content)
        with self.lock:
            self.bodies.append(body)
            self.headers.append(dict(request.headers))
            n = len(self.bodies) - 1
        return self.reply(body, n)

    def lm(self, *, retries: int = 2, base: str = "http://127.0.0.1:9/v1", api_key: str | None = SECRET,
           cache: bool = False) -> dspy.LM:
        engine = OpenAICompatEngine(base, "m", api_key=api_key, retries=retries, backoff=0.01,
                                    transport=httpx.MockTransport(self))
        return dspy.LM("openai/m", engine=engine, num_retries=0, cache=cache, max_tokens=256)


def ok(body, n) -> httpx.Response:
    return httpx.Response(200, json=completion(spans_reply(body)))


def spans_run(lm: dspy.LM, items=ITEMS, adapter=None):
    with dspy.context(lm=lm, adapter=adapter or SchemaJSONAdapter()):
        return run_eval(get_program("spans").make(), items, progress=False)


def assert_clean(errors: list[str]) -> None:
    for e in errors:
        assert "\n" not in e and "Traceback" not in e and "File " not in e, e
        assert SECRET not in e, e


# -- structured-output negotiation ------------------------------------------------------------------------------


def test_a_server_that_rejects_json_schema_gets_json_object_with_the_schema_and_it_is_remembered():
    def reply(body, n):
        if body.get("response_format", {}).get("type") == "json_schema":  # llama-cpp-python's server: a 500
            return httpx.Response(500, text="Traceback (most recent call last):\n  File \"app.py\", line 3\n"
                                            "ValueError: response_format type json_schema not supported")
        return ok(body, n)

    server = Server(reply)
    res = spans_run(server.lm())
    assert res.failed_items == 0 and not res.errors
    kinds = [b.get("response_format", {}).get("type") for b in server.bodies]
    assert kinds == ["json_schema", "json_object", "json_object", "json_object"]  # refused once, then remembered
    assert server.bodies[1]["response_format"]["schema"]["properties"]["spans"]["type"] == "array"
    assert all(b["max_tokens"] == 256 for b in server.bodies)
    assert server_capabilities() == {"http://127.0.0.1:9/v1 m": {"format": "json_object_schema",
                                                                  "max_completion_tokens": False}}


def test_a_server_that_rejects_response_format_entirely_ends_with_none_and_the_run_parses():
    def reply(body, n):
        if "response_format" in body or "grammar" in body:
            return httpx.Response(400, json={"error": {"message": "Unrecognized request argument: response_format "
                                                                  "/ grammar"}})
        return ok(body, n)

    server = Server(reply)
    lm = server.lm()
    res = spans_run(lm)
    assert res.failed_items == 0
    first_call = server.bodies[:5]
    assert [("response_format" in b and b["response_format"]["type"]) or ("grammar" in b and "grammar")
            for b in first_call] == ["json_schema", "json_object", "grammar", "json_object", False]
    assert "root ::=" in first_call[2]["grammar"]  # a GBNF grammar made from the schema
    assert all("response_format" not in b and "grammar" not in b for b in server.bodies[5:])
    assert len(server.bodies) == 5 + 2 and lm.engine.stats.downgrades == 4


def test_a_500_that_does_not_name_the_format_is_retried_not_downgraded():
    def reply(body, n):
        return httpx.Response(500, json={"error": {"message": "CUDA out of memory"}}) if n < 2 else ok(body, n)

    server = Server(reply)
    res = spans_run(server.lm(retries=3), ITEMS[:1])
    assert res.failed_items == 0
    assert [b["response_format"]["type"] for b in server.bodies] == ["json_schema"] * 3


def test_a_server_that_ignores_max_tokens_is_sent_max_completion_tokens_and_counted(caplog):
    def reply(body, n):
        return httpx.Response(200, json=completion(spans_reply(body), completion_tokens=3195))

    server = Server(reply)
    lm = server.lm()
    with caplog.at_level(logging.WARNING, logger="halluscope.lm.openai_client"):
        spans_run(lm)
    assert "max_completion_tokens" not in server.bodies[0]
    assert all(b["max_completion_tokens"] == b["max_tokens"] == 256 for b in server.bodies[1:])
    assert lm.engine.stats.over_budget == 3
    assert sum("ignores max_tokens" in r.getMessage() for r in caplog.records) == 1  # warned once


def test_stop_and_sampling_parameters_are_sent():
    server = Server(ok)
    lm = server.lm()
    lm("hello", stop=["\n\n"], seed=3, top_p=0.5, temperature=0.2)
    body = server.bodies[-1]
    assert (body["stop"], body["seed"], body["top_p"], body["temperature"], body["max_tokens"], body["stream"]) == (
        ["\n\n"], 3, 0.5, 0.2, 256, False)
    assert body["model"] == "m" and "response_format" not in body


# -- faults: each a counted failure of its item, the run goes on --------------------------------------------------


def test_429_is_retried_with_retry_after_then_succeeds():
    def reply(body, n):
        if n < 2:
            return httpx.Response(429, headers={"Retry-After": "0"}, json={"error": {"message": "slow down"}})
        return ok(body, n)

    server = Server(reply)
    lm = server.lm(retries=3)
    res = spans_run(lm, ITEMS[:1])
    assert res.failed_items == 0 and len(server.bodies) == 3 and lm.engine.stats.retries == 2


@pytest.mark.parametrize("status,body,ctype,reason", [
    (429, json.dumps({"error": {"message": "rate limited"}}), "application/json", "HTTP 429: rate limited"),
    (503, "<html><body><h1>503 Service Unavailable</h1></body></html>", "text/html", "HTTP 503: 503 Service"),
    (200, "<!DOCTYPE html><html><body>Welcome to nginx</body></html>", "text/html", "answered HTML"),
    (200, json.dumps({"id": "x", "choices": []}), "application/json", "no choices"),
    (200, 'data: {"choices": [{"delta": {"content": "{"}}]}\n\ndata: [DONE]\n\n', "text/event-stream",
     "streamed its answer"),
    (200, "not json at all", "text/plain", "not JSON"),
    (401, json.dumps({"error": {"message": f"invalid key {SECRET}"}}), "application/json", "HTTP 401"),
])
def test_bad_server_answers_are_counted_failures_with_one_clean_line(status, body, ctype, reason):
    def reply(b, n):
        if b["messages"][-1]["content"].find("Lyon") >= 0:  # only the second item meets the fault
            return httpx.Response(status, text=body, headers={"content-type": ctype, "Retry-After": "0"})
        return ok(b, n)

    server = Server(reply)
    res = spans_run(server.lm(retries=1))
    assert [item_failure(p) for p in res.predictions] == [None, "error", None]  # the run went on
    assert res.failed_items == 1 and len(res.errors) == 1
    assert reason in res.errors[0] and res.errors[0].startswith("x-1: LM"), res.errors[0]
    assert_clean(res.errors)
    assert sum(1 for b in server.bodies if "Lyon" in b["messages"][-1]["content"]) == (2 if status >= 429 else 1)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_a_server_that_is_down_fails_each_item_with_its_reason_and_no_secret():
    base = f"http://user:{SECRET}@127.0.0.1:{_free_port()}/v1"
    lm = make_lm("openai/m", api_base=base, num_retries=1, backoff=0.01, timeout=2)
    t0 = time.perf_counter()
    res = spans_run(lm, ITEMS[:2])
    assert time.perf_counter() - t0 < 10
    assert res.failed_items == 2 and all("cannot reach http://127.0.0.1:" in e for e in res.errors), res.errors
    assert "after 2 attempts" in res.errors[0]
    assert_clean(res.errors)
    with pytest.raises(lmmod.LMCheckError) as info:  # what a command says before any item
        lmmod.check_lm(lm, timeout=2)
    assert "cannot reach" in str(info.value) and SECRET not in str(info.value)


def test_a_slow_server_times_out_per_item_and_the_run_goes_on():
    ready = threading.Event()
    srv = socket.socket()
    srv.bind(("127.0.0.1", 0))
    srv.listen(8)
    port = srv.getsockname()[1]
    conns = []
    done = threading.Event()

    def accept():  # accepts connections and never answers
        ready.set()
        srv.settimeout(0.2)
        while not done.is_set():
            try:
                conns.append(srv.accept()[0])
            except OSError:
                continue

    t = threading.Thread(target=accept, daemon=True)
    t.start()
    ready.wait()
    try:
        lm = make_lm("openai/m", api_base=f"http://127.0.0.1:{port}/v1", num_retries=0, timeout=0.3)
        t0 = time.perf_counter()
        res = spans_run(lm, ITEMS[:2])
        assert time.perf_counter() - t0 < 5
        assert res.failed_items == 2 and all("timed out" in e for e in res.errors), res.errors
        assert_clean(res.errors)
    finally:
        done.set()
        t.join(2)
        for c in conns:
            c.close()
        srv.close()


# -- garbage is never success -------------------------------------------------------------------------------------


@pytest.mark.parametrize("content,finish", [
    ('{"spans": [', "length"),
    ('{"spans": [', "stop"),
    ('{"spans": [{"text": "Paris", "probability": 0.9}, {"text": "cap', "stop"),
    ('{"spans": [{"text": "Paris", "probability": 0.9}]}', "length"),  # complete-looking, but cut at the budget
])
def test_truncated_output_is_a_parse_failure_not_zero_or_one_spans(content, finish):
    server = Server(lambda b, n: httpx.Response(200, json=completion(content, finish)))
    res = spans_run(server.lm(), ITEMS[:2])
    assert [item_failure(p) for p in res.predictions] == ["parse", "parse"]
    assert all(p.spans == [] for p in res.predictions)
    assert res.failures["parse"] == 2 and res.failures["truncated"] == 2
    assert res.predictions[0].detection.failures == {"parse": 1, "truncated": 1}  # what gets written per item
    assert res.failed_items == 2


def test_json_truncated_detector():
    assert json_truncated('{"spans": [')
    assert json_truncated('{"spans": [{"text": "Paris", "probability": 0.9}, {"text": "ca')
    assert json_truncated('{"a": "unterminated')
    assert not json_truncated('{"spans": []}')
    assert not json_truncated('Sure! {"spans": [{"text": "}{]["}]} trailing')
    assert not json_truncated("no json here")
    assert not json_truncated('{"a": "\\"quoted\\" }"}')


def test_json_that_does_not_match_the_schema_is_a_counted_parse_failure():
    server = Server(lambda b, n: httpx.Response(200, json=completion('{"verdict": "yes"}')))
    res = spans_run(server.lm())
    assert res.failed_items == 3 and res.failures == {"parse": 3} and not res.errors


def test_garbage_replies_are_not_cached_and_a_fixed_server_is_asked_again(tmp_path):
    state = {"fixed": False}

    def reply(body, n):
        return ok(body, n) if state["fixed"] else httpx.Response(200, json=completion("I cannot help with that"))

    server = Server(reply)
    lm = server.lm(cache=True)
    configure(lm, cache_dir=tmp_path / "cache")
    assert isinstance(dspy.cache, ReplyCache)
    with dspy.context(adapter=SchemaJSONAdapter()):
        first = run_eval(get_program("spans").make(), ITEMS, progress=False)
        assert first.failed_items == 3 and len(server.bodies) == 3
        state["fixed"] = True
        second = run_eval(get_program("spans").make(), ITEMS, progress=False)  # not replayed from the cache
        assert second.failed_items == 0 and len(server.bodies) == 6
        third = run_eval(get_program("spans").make(), ITEMS, progress=False)  # good replies are cached
        assert third.failed_items == 0 and len(server.bodies) == 6 and third.usage.cache_hits == 3


def test_a_truncated_reply_from_the_embedded_engine_is_refused_and_evicted(tmp_path):
    from tests.test_lm import FakeLlama, engine_with  # the engine with a fake llama.cpp model

    gguf = tmp_path / "tiny.gguf"
    gguf.write_bytes(b"GGUF-not-really")
    fake = FakeLlama(reply='{"answer": "4"}', finish="length")
    lm = dspy.LM("llamacpp/test-cut", engine=engine_with(gguf, fake), cache=True)
    configure(lm, cache_dir=tmp_path / "cache")
    with dspy.context(adapter=GuardedJSONAdapter()):
        with pytest.raises(TruncatedOutputError, match="max_tokens"):
            dspy.Predict("question -> answer")(question="2+2?")
        fake.finish = "stop"
        assert dspy.Predict("question -> answer")(question="2+2?").answer == "4"
    assert len(fake.requests) == 2 and lm.engine.stats.cut_generations == 1
    assert evict_last_reply() is True  # the good one was cached (and is the last this thread touched)


def test_within_keep_failed_replies_a_failed_reply_is_replayed_from_memory_not_asked_again(tmp_path):
    """An optimizer replays the same requests (ReAnchor once per candidate): a reply that failed to parse is served
    again while the scope is open instead of being regenerated each time; it stays off the disk, so once the scope
    closes (a later run) the server is asked again."""
    from halluscope.lm.models import keep_failed_replies

    state = {"fixed": False}

    def reply(body, n):
        return ok(body, n) if state["fixed"] else httpx.Response(200, json=completion("I cannot help with that"))

    server = Server(reply)
    configure(server.lm(cache=True), cache_dir=tmp_path / "cache")
    with dspy.context(adapter=SchemaJSONAdapter()):
        with keep_failed_replies(), keep_failed_replies():  # scopes nest
            for _ in range(3):
                assert run_eval(get_program("spans").make(), ITEMS, progress=False).failed_items == 3
            assert len(server.bodies) == 3  # asked once per item, then replayed
            state["fixed"] = True
            assert run_eval(get_program("spans").make(), ITEMS, progress=False).failed_items == 3  # the kept replies
            assert len(server.bodies) == 3
        assert dspy.cache._failed == {}  # dropped when the last scope closed
        after = run_eval(get_program("spans").make(), ITEMS, progress=False)
        assert after.failed_items == 0 and len(server.bodies) == 6  # never on disk: asked again


# -- credentials in the base URL ------------------------------------------------------------------------------------


def test_credentials_in_the_url_move_to_headers_and_are_redacted():
    u = split_url_credentials(f"http://alice:{SECRET}@127.0.0.1:8080/v1/")
    assert u.base == "http://127.0.0.1:8080/v1" and u.headers["Authorization"].startswith("Basic ")
    q = split_url_credentials(f"https://host.example/v1?api_key={SECRET}&region=eu")
    assert q.base == "https://host.example/v1?region=eu" and q.headers == {"Authorization": f"Bearer {SECRET}"}
    assert lmmod.redact(f"error at {SECRET}") == "error at ***"  # registered as a secret
    with pytest.raises(ValueError, match="http"):
        split_url_credentials("ftp://x/y")

    server = Server(ok)
    engine = OpenAICompatEngine(f"http://alice:{SECRET}@127.0.0.1:9/v1", "m", transport=httpx.MockTransport(server))
    lm = dspy.LM("openai/m", engine=engine, num_retries=0, cache=False)
    lm("hi")
    import base64

    assert server.headers[0]["authorization"] == "Basic " + base64.b64encode(f"alice:{SECRET}".encode()).decode()
    assert SECRET not in repr(engine) and SECRET not in lmmod.describe(lm)
    assert lmmod.describe(lm) == '{"model": "openai/m", "api_base": "http://127.0.0.1:9/v1"}'


def test_credentials_in_the_url_of_a_non_openai_provider_are_refused_redacted():
    with pytest.raises(ValueError) as info:
        make_lm("ollama_chat/llama3", api_base=f"http://u:{SECRET}@127.0.0.1:11434")
    assert "--api-key" in str(info.value) and SECRET not in str(info.value)


def test_the_cache_folder_of_a_server_does_not_depend_on_its_credentials(tmp_path):
    a = configure("openai/m", api_base=f"http://u:{SECRET}@127.0.0.1:9/v1", cache_dir=tmp_path)
    b = configure("openai/m", api_base="http://127.0.0.1:9/v1?api_key=other-key-123", cache_dir=tmp_path)
    assert lmmod.server_base(a) == lmmod.server_base(b) == "http://127.0.0.1:9/v1"
    (folder,) = [p.name for p in tmp_path.iterdir()]
    assert folder.startswith("server-") and SECRET not in folder


def test_clean_error_text_is_one_line_without_traceback_or_secret():
    body = ("Traceback (most recent call last):\n  File \"/srv/app.py\", line 10, in handler\n    raise X\n"
            f"RuntimeError: backend failed for key {SECRET}\nFile ")
    out = clean_error_text(body)
    assert out == "raise X RuntimeError: backend failed for key ***"
    assert clean_error_text(json.dumps({"detail": [{"loc": ["body", "response_format", "type"],
                                                    "msg": "unexpected value"}]})) == \
        "body.response_format.type: unexpected value"


def test_a_cut_chat_answer_recovered_by_the_json_fallback_is_not_a_failure():
    from halluscope.lm.models import GuardedChatAdapter

    def reply(body, n):
        if "response_format" not in body:  # the chat adapter's call: cut at the budget
            return httpx.Response(200, json=completion("[[ ## spans ## ]]\n[{\"text\": \"Par", "length"))
        return ok(body, n)  # DSPy's JSON fallback

    server = Server(reply)
    res = spans_run(server.lm(), ITEMS[:1], adapter=GuardedChatAdapter())
    assert len(server.bodies) == 2 and res.failures == {} and res.failed_items == 0
    both_cut = Server(lambda b, n: httpx.Response(200, json=completion('{"spans": [{"text": "Pa', "length")))
    res = spans_run(both_cut.lm(), ITEMS[:1], adapter=GuardedChatAdapter())
    assert len(both_cut.bodies) == 2 and res.failures == {"parse": 1, "truncated": 1}  # counted once
