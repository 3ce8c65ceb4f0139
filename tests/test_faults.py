"""Faults of issue #35 (items 5, 6, 8): a server that trickles its answer, numbers with no sane range, a base URL
with a query. The servers are real sockets on 127.0.0.1 or ``httpx.MockTransport`` handlers."""

from __future__ import annotations

import json
import re
import socket
import threading
import time

import dspy
import httpx
import pytest

from halluscope.lm.models import OpenAICompatEngine, make_lm
from halluscope.lm.openai_client import reset_server_capabilities


@pytest.fixture(autouse=True)
def fresh_caps():
    reset_server_capabilities()
    yield
    reset_server_capabilities()


def completion(content: str) -> dict:
    return {"id": "c1", "object": "chat.completion", "model": "m",
            "choices": [{"index": 0, "message": {"role": "assistant", "content": content}, "finish_reason": "stop"}],
            "usage": {"prompt_tokens": 3, "completion_tokens": 1, "total_tokens": 4}}


class TricklingServer:
    """Answers every request with its headers at once and then one byte of the body every ``every`` seconds
    (``total`` bytes at most), so each socket read succeeds well within a per-read timeout."""

    def __init__(self, every: float, total: int = 1000):
        self.every, self.total = every, total
        self.sock = socket.socket()
        self.sock.bind(("127.0.0.1", 0))
        self.sock.listen(8)
        self.port = self.sock.getsockname()[1]
        self.done = threading.Event()
        self.bytes_sent = 0
        self.thread = threading.Thread(target=self._accept, daemon=True)
        self.thread.start()

    def _accept(self):
        self.sock.settimeout(0.1)
        while not self.done.is_set():
            try:
                conn, _ = self.sock.accept()
            except OSError:
                continue
            threading.Thread(target=self._answer, args=(conn,), daemon=True).start()

    def _answer(self, conn):
        try:
            conn.recv(65536)
            conn.sendall(b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\n"
                         b"Content-Length: %d\r\n\r\n" % self.total)
            for _ in range(self.total):
                if self.done.wait(self.every):
                    break
                conn.sendall(b" ")
                self.bytes_sent += 1
        except OSError:
            pass
        finally:
            conn.close()

    def close(self):
        self.done.set()
        self.thread.join(2)
        self.sock.close()


@pytest.fixture
def trickle():
    srv = TricklingServer(every=0.25, total=24)  # 6 s of trickle: the old client waited for all of it
    yield srv
    srv.close()


def test_a_server_trickling_its_answer_fails_at_the_timeout_for_the_whole_request(trickle):
    # one byte every 0.25 s never trips a per-read timeout of 1 s; the request as a whole must stop at 1 s
    engine = OpenAICompatEngine(f"http://127.0.0.1:{trickle.port}/v1", "m", timeout=1.0, retries=0)
    lm = dspy.LM("openai/m", engine=engine, num_retries=0, cache=False)
    t0 = time.perf_counter()
    with pytest.raises(Exception) as info:
        lm("hi")
    took = time.perf_counter() - t0
    assert took < 2.0, f"the trickling request ran {took:.1f} s with timeout=1"
    assert "timed out" in str(info.value) and "within 1 s" in str(info.value)
    assert trickle.bytes_sent >= 2  # the server did trickle: each read was within the per-read timeout


def test_the_whole_request_timeout_applies_to_each_retry_and_to_the_lm_check(trickle):
    lm = make_lm("openai/m", api_base=f"http://127.0.0.1:{trickle.port}/v1", num_retries=1, backoff=0.01,
                 timeout=0.6)
    from halluscope.lm.models import LMCheckError, check_lm

    t0 = time.perf_counter()
    with pytest.raises(LMCheckError, match="timed out"):
        check_lm(lm, timeout=0.6)
    assert time.perf_counter() - t0 < 1.6
    t0 = time.perf_counter()
    with pytest.raises(Exception, match="after 2 attempts"):
        lm("hi")
    assert time.perf_counter() - t0 < 2.5


def test_a_normal_answer_still_arrives_through_the_deadline_thread():
    seen = []

    def handler(request: httpx.Request) -> httpx.Response:
        seen.append(str(request.url))
        return httpx.Response(200, json=completion("fine"), headers={"retry-after": "1"})

    engine = OpenAICompatEngine("http://127.0.0.1:9/v1", "m", timeout=5, transport=httpx.MockTransport(handler))
    lm = dspy.LM("openai/m", engine=engine, num_retries=0, cache=False)
    assert lm("hi") == ["fine"]
    assert seen == ["http://127.0.0.1:9/v1/chat/completions"]


# -- item 8: a base URL with a query --------------------------------------------------------------------------


@pytest.mark.parametrize("base,want", [
    ("http://h/v1?token=T-35-secret&x=1", "http://h/v1/chat/completions?x=1"),
    ("http://h/v1/?x=1&y=two%20words", "http://h/v1/chat/completions?x=1&y=two+words"),
    ("http://h:8080/v1?api-version=2024-06-01", "http://h:8080/v1/chat/completions?api-version=2024-06-01"),
    ("http://h/v1", "http://h/v1/chat/completions"),
    ("http://h", "http://h/chat/completions"),
])
def test_a_base_url_with_a_query_gets_the_path_joined_and_the_query_kept_after_it(base, want):
    seen = []

    def handler(request: httpx.Request) -> httpx.Response:
        seen.append((str(request.url), request.headers.get("authorization")))
        return httpx.Response(200, json=completion("ok"))

    engine = OpenAICompatEngine(base, "m", transport=httpx.MockTransport(handler))
    dspy.LM("openai/m", engine=engine, num_retries=0, cache=False)("hi")
    (url, auth), = seen
    assert url == want
    if "token=" in base:
        assert auth == "Bearer T-35-secret" and "T-35-secret" not in url


def test_a_404_names_the_url_it_posted_with_the_query_after_the_path():
    engine = OpenAICompatEngine("http://h/v1?x=1", "m", retries=0,
                                transport=httpx.MockTransport(lambda r: httpx.Response(404, text="not found")))
    with pytest.raises(Exception) as info:
        dspy.LM("openai/m", engine=engine, num_retries=0, cache=False)("hi")
    assert "it POSTs http://h/v1/chat/completions?x=1" in str(info.value)


# -- item 6: every number has a sane range ----------------------------------------------------------------------

# (command, argv, the line's start, the range it names): the probes
HUGE_NUMBERS = [
    ("evaluate", ["--lm-retries", str(10**30)], "argument --lm-retries", "expected a whole number in [0, 100]"),
    ("evaluate", ["--program", "grounded", "-O", f"window={10**15}"], "option 'window' of program 'grounded'",
     "expected a whole number in [0, 1000000]"),
    ("evaluate", ["--threads", str(10**20)], "argument --threads", "expected a whole number in [1, 1024]"),
    ("evaluate", ["--limit", str(10**40)], "argument --limit", "expected a whole number in [1, 1000000000]"),
    ("optimize", ["--seed", str(2**70)], "argument --seed", "expected a whole number in [0, 4294967295]"),
    ("optimize", ["--threads", str(10**20)], "argument --threads", "expected a whole number in [1, 1024]"),
    ("detect", ["--threads", str(10**20), "--answer", "x"], "argument --threads", "in [1, 1024]"),
    ("evaluate", ["--lm-timeout", "1e300"], "argument --lm-timeout", "expected a finite number in (0, 604800]"),
    ("evaluate", ["--max-tokens", str(10**12)], "argument --max-tokens", "in [1, 10000000]"),
    ("evaluate", ["--program", "spans", "-O", "fuzzy_threshold=" + "9" * 400], "option 'fuzzy_threshold'",
     "(400 characters)"),
]


@pytest.mark.parametrize("command,argv,named,allowed", HUGE_NUMBERS, ids=[" ".join(p[1][:2]) for p in HUGE_NUMBERS])
def test_huge_numbers_are_refused_in_one_line_naming_the_flag_and_its_range(command, argv, named, allowed, capsys,
                                                                            monkeypatch, tmp_path):
    from halluscope import cli

    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("HALLUSCOPE_DATA_DIR", str(tmp_path / "no-data-loaded"))
    t0 = time.perf_counter()
    with pytest.raises(SystemExit) as e:
        cli.main([command, "--lang", "de", "--no-mlflow", *argv] if command != "detect" else
                 [command, "--lang", "de", *argv])
    err = capsys.readouterr().err
    assert e.value.code == 2, err
    line = err.strip().splitlines()[-1]
    assert "error:" in line and named in line and allowed in line, err
    assert "Traceback" not in err and list(tmp_path.iterdir()) == []
    assert time.perf_counter() - t0 < 30


def _number_arguments():
    """(command, flag, type) of every argument of every command whose type is not text."""
    from halluscope import cli

    parser = cli.build_parser("*")
    sub = next(a for a in parser._actions if a.dest == "command")
    out = []
    for command, p in sub.choices.items():
        stack = [p]
        while stack:
            q = stack.pop()
            for a in q._actions:
                if a.choices and isinstance(a.choices, dict):  # a nested command (index build)
                    stack.extend(a.choices.values())
                elif a.type is not None and a.type is not str:
                    out.append((command, "/".join(a.option_strings) or a.dest, a.type))
    return out


def test_every_number_argument_of_every_command_has_a_finite_range():
    import math

    found = _number_arguments()
    assert len(found) > 30 and {f for _, f, _ in found} >= {"--threads", "--lm-retries", "--limit", "--seed"}
    for command, flag, kind in found:
        option_type = getattr(kind, "option_type", None)
        assert option_type is not None, f"{command} {flag}: type {kind!r} has no declared range (use common.ranged)"
        assert option_type.kind in ("int", "float"), (command, flag)
        assert math.isfinite(option_type.lo) and math.isfinite(option_type.hi), (command, flag)
        with pytest.raises(Exception, match="expected"):
            kind(str(10**40))


def test_every_number_option_of_every_program_refuses_a_huge_value_by_name():
    import halluscope.programs  # noqa: F401 - registers the built-in programs
    from halluscope.programs.registry import REGISTRY, InvalidOptionError

    checked = 0
    for name, spec in REGISTRY.items():
        if spec.build.__module__.startswith("tests."):
            continue
        for option, option_type in spec.types.items():
            if option_type.kind not in ("int", "float"):
                continue
            for huge in (10**15, 1e300, -(10**15), str(10**40)):
                with pytest.raises(InvalidOptionError, match="option " + re.escape(f"'{option}' of program '{name}': expected ") + ".* in "):
                    spec.check_options({option: huge})
            checked += 1
    assert checked >= 30
