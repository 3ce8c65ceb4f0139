"""``halluscope serve``: the HTTP API on compiled artifacts, with FastAPI's TestClient (no network, no model).

No-LM programs (mark-all, logits) run for real; the span detector runs on a scripted LM.
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

import dspy
import httpx
import pytest
from fastapi.testclient import TestClient

from halluscope.artifacts import store as A
from halluscope.cli import build_parser
from halluscope.cli.serve import is_loopback, resolve_detectors
from halluscope.programs.registry import get_program
from halluscope.serve import Limits, create_app
from halluscope.lm.scripted import scripted_lm

ANSWER = "The capital of Australia is Sydney."


def write(root: Path, program: str, key: str, metric: str = "iou", options: dict | None = None,
          score: float | None = 0.4):
    manifest = {"source": "fixture", "program_options": options or {}}
    if score is not None:
        manifest["cv"] = {"mean": {"compiled": {metric: {"mean": score, "sd": 0.01}},
                                   "zero_shot": {metric: {"mean": score - 0.1, "sd": 0.02}}}}
    return A.write_artifact(get_program(program).make(**(options or {})), manifest, program_name=program, lang=key,
                            metric=metric, root=root)


@pytest.fixture
def markall(tmp_path):
    return [A.load_compiled("mark-all", lang=lang, metric="iou", root=tmp_path)
            for lang in ("de", "en") if write(tmp_path, "mark-all", lang)]


@pytest.fixture
def client(markall):
    with TestClient(create_app(markall)) as c:
        yield c


def test_detect_returns_the_contract_and_the_artifact(client, markall):
    r = client.post("/v1/detect", json={"answer": ANSWER, "question": "Capital?", "lang": "de"})
    assert r.status_code == 200, r.text
    body = r.json()
    assert body["spans"] == [{"start": 0, "end": len(ANSWER), "prob": 1.0}]
    assert body["hard_labels"] == [[0, len(ANSWER)]] and body["label"] is True and body["score"] == 1.0
    de = next(d for d in markall if d.lang == "de")
    assert body["artifact"] == {"program": "mark-all", "key": "de", "metric": "iou", "version": 1,
                                "content_hash": de.content_hash}
    assert body["rationale"] == "mark-all baseline" and body["seconds"] >= 0


def test_artifacts_health_and_openapi(client):
    arts = client.get("/v1/artifacts").json()["artifacts"]
    assert [(a["program"], a["lang"], a["version"]) for a in arts] == [("mark-all", "de", 1), ("mark-all", "en", 1)]
    assert arts[0]["selection_score"] == 0.4 and arts[0]["scores"]["zero_shot"]["mean"] == pytest.approx(0.3)
    assert arts[0]["uses_lm"] is False and len(arts[0]["content_hash"]) == 64
    health = client.get("/healthz").json()
    assert health["status"] == "ok" and health["loaded"] == 2
    schema = client.get("/openapi.json").json()
    assert {"/v1/detect", "/v1/detect/batch", "/v1/artifacts", "/healthz"} <= set(schema["paths"])
    props = schema["components"]["schemas"]["DetectRequest"]["properties"]
    assert props["answer"]["maxLength"] == Limits().max_answer_chars
    assert client.get("/docs").status_code == 200


def test_page_and_static_files_are_served_with_a_strict_csp(client):
    page = client.get("/")
    assert page.status_code == 200 and "text/html" in page.headers["content-type"]
    assert "default-src 'self'" in page.headers["content-security-policy"]
    for name in ("app.js", "style.css"):
        assert f"/static/{name}" in page.text
        assert client.get(f"/static/{name}").status_code == 200
    assert "http" not in page.text.replace("http-equiv", "")  # no external URL at all
    assert client.get("/static/../app.py").status_code == 404
    assert client.get("/static/secret.txt").status_code == 404


@pytest.mark.parametrize("payload, status, words", [
    ({"question": "q"}, 422, ["answer", "Field required"]),
    ({"answer": 5}, 422, ["answer", "string"]),
    ({"answer": "x" * 20_001}, 422, ["answer", "20000"]),
    ({"answer": "x", "evidence": ["e"] * 51}, 422, ["evidence"]),
    ({"answer": "x", "colour": "red"}, 422, ["colour", "Extra inputs"]),
    ({"answer": "x", "lang": "xx"}, 404, ["'xx'", "de, en"]),
    ({"answer": "x", "program": "nope"}, 404, ["'nope'", "mark-all/de/v0001"]),
    ({"answer": "x", "lang": "de", "version": 7}, 404, ["version 7", "v0001"]),
    ({"answer": "x", "lang": "de", "version": 0}, 422, ["version"]),
    ({"answer": "x"}, 422, ["lang auto", "unsure", "de, en"]),  # several loaded, none for "all": say so
    ({"answer": "x", "lang": "de", "inputs": {"model_output_logits": [1]}}, 422, ["model_output_logits"]),
])
def test_bad_requests_are_4xx_naming_the_problem(client, payload, status, words):
    r = client.post("/v1/detect", json=payload)
    assert r.status_code == status, r.text
    for w in words:
        assert w in r.json()["error"], (w, r.json())
    assert client.post("/v1/detect", json={"answer": ANSWER, "lang": "en"}).status_code == 200  # still serving


def test_malformed_json_and_wrong_content(client):
    r = client.post("/v1/detect", content=b'{"answer": "x",', headers={"content-type": "application/json"})
    assert r.status_code == 422 and "malformed JSON" in r.json()["error"]
    r = client.post("/v1/detect", content=b"answer=x", headers={"content-type": "text/plain"})
    assert r.status_code == 422
    assert client.get("/v1/detect").status_code == 405
    assert client.get("/nowhere").status_code == 404


def test_body_size_limit_by_header_and_by_stream(markall):
    with TestClient(create_app(markall, limits=Limits(max_body_bytes=2_000))) as c:
        r = c.post("/v1/detect", json={"answer": "x" * 5_000, "lang": "de"})
        assert r.status_code == 413 and "limit is 2000" in r.json()["error"]

        def chunks():  # no Content-Length: counted while reading
            for _ in range(10):
                yield b" " * 500

        r = c.post("/v1/detect", content=chunks(), headers={"content-type": "application/json"})
        assert r.status_code == 413
        assert c.post("/v1/detect", content=b"{}", headers={"content-length": "abc"}).status_code == 400
        assert c.post("/v1/detect", json={"answer": ANSWER, "lang": "de"}).status_code == 200


def test_combined_evidence_over_the_limit_is_refused(markall):
    with TestClient(create_app(markall, limits=Limits(max_evidence_chars=100))) as c:
        r = c.post("/v1/detect", json={"answer": "x", "lang": "de", "context": "c" * 60, "evidence": ["e" * 60]})
        assert r.status_code == 422 and "evidence" in r.json()["error"] and "100" in r.json()["error"]


def test_batch_is_bounded_and_reports_each_item(markall):
    with TestClient(create_app(markall, limits=Limits(max_batch=3))) as c:
        r = c.post("/v1/detect/batch", json={"items": [{"answer": "Eins.", "lang": "de"},
                                                       {"answer": "Two.", "lang": "fr"},
                                                       {"answer": "  ", "lang": "en"}]})
        assert r.status_code == 200, r.text
        body = r.json()
        assert [x["ok"] for x in body["results"]] == [True, False, True]
        assert body["results"][0]["hard_labels"] == [[0, 5]]
        assert body["results"][1]["status"] == 404 and "'fr'" in body["results"][1]["error"]
        assert body["results"][2]["spans"] == [] and (body["ok"], body["failed"]) == (2, 1)
        r = c.post("/v1/detect/batch", json={"items": [{"answer": "x", "lang": "de"}] * 4})
        assert r.status_code == 422 and "items" in r.json()["error"]
        r = c.post("/v1/detect/batch", json={"items": [{"answer": "x", "lang": "de"}, {"lang": "de"}]})
        assert r.status_code == 422 and "items.1.answer" in r.json()["error"]
        assert c.post("/v1/detect/batch", json={"items": []}).status_code == 422


def test_logits_program_takes_its_extra_inputs(tmp_path):
    write(tmp_path, "logits", "en")
    det = A.load_compiled("logits", lang="en", metric="iou", root=tmp_path)
    with TestClient(create_app([det])) as c:
        r = c.post("/v1/detect", json={"answer": "Paris is big", "inputs": {
            "model_output_tokens": ["Paris", " is", " big"], "model_output_logits": [5.0, 5.0, -3.0]}})
        assert r.status_code == 200, r.text
        body = r.json()
        top = max(body["spans"], key=lambda s: s["prob"])
        assert "Paris is big"[top["start"]:top["end"]] == "big" and top["prob"] > 0.5


def test_api_key_is_required_on_v1_routes_when_set(markall):
    with TestClient(create_app(markall, api_key="s3cret-key")) as c:
        assert c.get("/healthz").status_code == 200 and c.get("/").status_code == 200
        for headers in ({}, {"X-API-Key": "wrong"}, {"Authorization": "Bearer nope"}):
            r = c.post("/v1/detect", json={"answer": "x", "lang": "de"}, headers=headers)
            assert r.status_code == 401 and "API key" in r.json()["error"]
        assert c.get("/v1/artifacts").status_code == 401
        ok = c.post("/v1/detect", json={"answer": "x", "lang": "de"}, headers={"X-API-Key": "s3cret-key"})
        assert ok.status_code == 200
        assert c.get("/v1/artifacts", headers={"Authorization": "Bearer s3cret-key"}).status_code == 200


def test_serve_refuses_a_public_address_without_a_key(tmp_path, capsys, monkeypatch):
    monkeypatch.delenv("HALLUSCOPE_SERVE_KEY", raising=False)
    args = build_parser().parse_args(["serve", "--program", "mark-all", "--lang", "de", "--host", "0.0.0.0",
                                      "--compiled-dir", str(tmp_path)])
    assert args.func(args) == 2
    assert "without an API key" in capsys.readouterr().err
    assert is_loopback("127.0.0.1") and is_loopback("::1") and is_loopback("localhost")
    assert not is_loopback("0.0.0.0") and not is_loopback("10.1.2.3") and not is_loopback("example.org")


def test_serve_cli_names_a_missing_artifact(tmp_path, capsys):
    args = build_parser().parse_args(["serve", "--program", "mark-all", "--lang", "de", "--version", "7",
                                      "--compiled-dir", str(tmp_path)])
    assert args.func(args) == 2
    assert "no version v0007" in capsys.readouterr().err
    # no artifact at all: no dead end, the run policy serves the unfitted program and says so
    args = build_parser().parse_args(["serve", "--program", "mark-all", "--lang", "de", "--compiled-dir", str(tmp_path)])
    (det,) = resolve_detectors(args)
    assert det.name == "mark-all" and not det.fitted and det.path is None
    assert "no compiled artifact for 'de'" in capsys.readouterr().err
    args = build_parser().parse_args(["serve", "--program", "mark-all", "--compiled-dir", str(tmp_path)])
    assert args.func(args) == 2 and "--lang or --task" in capsys.readouterr().err


def test_resolve_detectors_loads_each_key_once(tmp_path):
    write(tmp_path, "mark-all", "de")
    write(tmp_path, "mark-all", "de", score=0.9)
    args = build_parser().parse_args(["serve", "--program", "mark-all", "--lang", "de", "--lang", "de",
                                      "--compiled-dir", str(tmp_path)])
    dets = resolve_detectors(args)
    assert [(d.lang, d.version) for d in dets] == [("de", 2)]  # the best version
    args.version = "1"
    assert [d.version for d in resolve_detectors(args)] == [1]


def test_serve_defaults_to_grounded_on_the_embedded_model_like_detect(tmp_path, capsys):
    """Without --program, a --lang is served by grounded with the embedded LM (its own artifact, else the
    cross-lingual one, said on stderr); another --lm or a --task keeps spans; no LM is needed for grounded."""
    write(tmp_path, "grounded", "de")
    write(tmp_path, "grounded", "all")
    write(tmp_path, "spans", "de")
    parse = lambda *a: build_parser().parse_args(["serve", *a, "--compiled-dir", str(tmp_path)])  # noqa: E731
    dets = resolve_detectors(parse("--lang", "de", "--lang", "fi"))
    assert [(d.name, d.lang) for d in dets] == [("grounded", "de"), ("grounded", "all")]
    assert "no artifact for 'fi', using the cross-lingual one" in capsys.readouterr().err
    assert not any(get_program(d.name).needs_lm(d.manifest.get("program_options")) for d in dets)
    assert [d.name for d in resolve_detectors(parse("--lang", "de", "--lm", "openai/gpt-4o-mini"))] == ["spans"]
    assert [d.name for d in resolve_detectors(parse("--lang", "de", "--program", "spans"))] == ["spans"]


# -- the LM lock and the timeout -------------------------------------------------------------------------

class _Gate:
    """Counts how many scripted LM calls are in flight at once; each call waits on ``release``."""

    def __init__(self):
        self.lock = threading.Lock()
        self.inside = 0
        self.max_inside = 0
        self.calls = 0
        self.release = threading.Event()

    def __call__(self, call):
        with self.lock:
            self.inside += 1
            self.calls += 1
            self.max_inside = max(self.max_inside, self.inside)
        try:
            self.release.wait(10)
            return {"spans": [{"text": "Sydney", "probability": 0.9}]}
        finally:
            with self.lock:
                self.inside -= 1


@pytest.fixture
def mixed(tmp_path):
    write(tmp_path, "spans", "en")
    write(tmp_path, "mark-all", "de")
    return [A.load_compiled("spans", lang="en", metric="iou", root=tmp_path),
            A.load_compiled("mark-all", lang="de", metric="iou", root=tmp_path)]


def test_lm_requests_take_turns_while_no_lm_requests_run_in_parallel(mixed):
    gate = _Gate()
    lm = scripted_lm(gate)
    app = create_app(mixed, lm=lm, adapter=dspy.JSONAdapter())
    with TestClient(app) as c:
        results = {}

        def post(i):
            results[i] = c.post("/v1/detect", json={"answer": ANSWER, "program": "spans"})

        threads = [threading.Thread(target=post, args=(i,)) for i in range(3)]
        for t in threads:
            t.start()
        time.sleep(0.5)
        # while an LM request holds the model, a no-LM request is answered at once
        t0 = time.perf_counter()
        r = c.post("/v1/detect", json={"answer": "Eins.", "program": "mark-all"})
        assert r.status_code == 200 and time.perf_counter() - t0 < 2
        assert c.get("/healthz").json()["lm_busy"] is True
        assert gate.inside == 1  # the other two wait for the slot, outside the model
        gate.release.set()
        for t in threads:
            t.join(20)
    assert gate.max_inside == 1 and gate.calls == 3
    for r in results.values():
        assert r.status_code == 200, r.text
        body = r.json()
        assert ANSWER[body["spans"][0]["start"]:body["spans"][0]["end"]] == "Sydney"
        assert body["artifact"]["program"] == "spans"


def test_a_slow_request_times_out_with_504_and_the_server_keeps_serving(mixed):
    gate = _Gate()
    app = create_app(mixed, lm=scripted_lm(gate), adapter=dspy.JSONAdapter(), limits=Limits(timeout_s=0.5))
    with TestClient(app) as c:
        r = c.post("/v1/detect", json={"answer": ANSWER, "program": "spans"})
        assert r.status_code == 504 and "0.5 s" in r.json()["error"]
        # the timed-out work still holds the model: the next LM request cannot get in within its timeout
        r = c.post("/v1/detect", json={"answer": ANSWER, "program": "spans"})
        assert r.status_code == 503 and "busy" in r.json()["error"]
        assert c.post("/v1/detect", json={"answer": "Eins.", "program": "mark-all"}).status_code == 200
        gate.release.set()
        for _ in range(50):
            if not c.get("/healthz").json()["lm_busy"]:
                break
            time.sleep(0.05)
        r = c.post("/v1/detect", json={"answer": ANSWER, "program": "spans"})
        assert r.status_code == 200, r.text
        assert c.get("/healthz").json()["timeouts"] == 2


def test_a_failing_program_is_a_contained_500(mixed):
    def boom(call):
        raise RuntimeError("engine exploded")

    app = create_app(mixed, lm=scripted_lm(boom), adapter=dspy.JSONAdapter())
    with TestClient(app, raise_server_exceptions=False) as c:
        r = c.post("/v1/detect", json={"answer": ANSWER, "program": "spans"})
        assert r.status_code == 500 and "engine exploded" in r.json()["error"]
        assert c.post("/v1/detect", json={"answer": "Eins.", "program": "mark-all"}).status_code == 200


# -- a real server process: start-up, disconnects ----------------------------------------------------------

def wait_healthy(proc, base: str, tries: int) -> None:
    """Poll ``base``/healthz until the server answers 200 (0.1 s apart); fail with its output if it never does."""
    for _ in range(tries):
        try:
            if httpx.get(base + "/healthz", timeout=1).status_code == 200:
                return
        except httpx.HTTPError:
            time.sleep(0.1)
    pytest.fail("server did not start: " + (proc.stdout.read() if proc.poll() is not None else ""))


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_real_server_survives_clients_that_disconnect(tmp_path):
    write(tmp_path, "mark-all", "de")
    before = sorted(str(p) for p in tmp_path.rglob("*"))
    work = tmp_path / "work"  # the server's working directory and home: it must write nothing there
    work.mkdir()
    port = _free_port()
    env = {**os.environ, "HALLUSCOPE_HOME": str(work)}
    proc = subprocess.Popen([sys.executable, "-m", "halluscope", "serve", "--program", "mark-all", "--lang", "de",
                             "--compiled-dir", str(tmp_path), "--port", str(port), "--log-level", "warning"],
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, cwd=work, env=env)
    base = f"http://127.0.0.1:{port}"
    try:
        wait_healthy(proc, base, tries=300)
        assert httpx.get(base + "/healthz").json()["startup_s"] > 0
        body = json.dumps({"answer": "Eins zwei.", "lang": "de"}).encode()
        # 1. a client that sends half the body and hangs up
        with socket.create_connection(("127.0.0.1", port)) as s:
            s.sendall(b"POST /v1/detect HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                      + f"Content-Length: {len(body)}\r\n\r\n".encode() + body[:5])
        # 2. a client that sends the whole request and leaves before the answer
        with socket.create_connection(("127.0.0.1", port)) as s:
            s.sendall(b"POST /v1/detect HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                      + f"Content-Length: {len(body)}\r\n\r\n".encode() + body)
        # 3. garbage instead of HTTP
        with socket.create_connection(("127.0.0.1", port)) as s:
            s.sendall(b"\x00\x01 not http\r\n\r\n")
        r = httpx.post(base + "/v1/detect", json={"answer": "Eins zwei.", "lang": "de"}, timeout=10)
        assert r.status_code == 200 and r.json()["hard_labels"] == [[0, 10]]
        assert proc.poll() is None
    finally:
        proc.terminate()
        out, _ = proc.communicate(timeout=20)
    assert "Traceback" not in out, out
    assert list(work.iterdir()) == []
    assert sorted(str(p) for p in tmp_path.rglob("*") if p != work) == before  # artifacts untouched


# -- evidence files read on the server (POST /v1/evidence) ---------------------------------------------------

def _upload(c, name: str, data: bytes, **headers):
    import base64

    return c.post("/v1/evidence", json={"filename": name, "content_base64": base64.b64encode(data).decode()},
                  headers=headers)


def _docx_bytes(tmp_path, *paragraphs: str) -> bytes:
    import docx

    document = docx.Document()
    for p in paragraphs:
        document.add_paragraph(p)
    document.save(str(tmp_path / "made.docx"))
    return (tmp_path / "made.docx").read_bytes()


def test_evidence_files_are_read_on_the_server(client, tmp_path):
    from tests.test_retrievers import text_pdf

    r = _upload(client, "moon.pdf", text_pdf("The Moon orbits the Earth every 27 days."))
    assert r.status_code == 200, r.text
    body = r.json()
    assert body["text"] == "The Moon orbits the Earth every 27 days." and body["type"] == "pdf"
    assert body["filename"] == "moon.pdf" and body["chars"] == len(body["text"]) and body["bytes"] > 100

    r = _upload(client, "C:\\Users\\me\\Everest.DOCX", _docx_bytes(tmp_path, "Mount Everest is 8849 m high.", "Nepal."))
    assert r.status_code == 200, r.text
    assert r.json()["text"] == "Mount Everest is 8849 m high.\n\nNepal." and r.json()["filename"] == "Everest.DOCX"
    for name, data in (("notes.txt", "Die Donau fließt durch Wien.\n".encode()), ("guide.md", b"# Rhine\n\nNorth Sea.")):
        r = _upload(client, name, data)
        assert r.status_code == 200 and r.json()["text"] == data.decode().strip()
    # the text goes on as an evidence passage, as the page sends it
    text = _upload(client, "moon.pdf", text_pdf("Canberra is the capital.")).json()["text"]
    r = client.post("/v1/detect", json={"answer": ANSWER, "lang": "de", "evidence": [text]})
    assert r.status_code == 200 and r.json()["artifact"]["key"] == "de"
    assert "/v1/evidence" in client.get("/openapi.json").json()["paths"]


def test_bad_evidence_files_are_4xx_naming_the_problem(client, tmp_path):
    from pypdf import PdfWriter

    writer = PdfWriter()
    writer.add_blank_page(200, 200)
    writer.encrypt("secret", algorithm="RC4-128")
    writer.write(tmp_path / "locked.pdf")
    cases = [
        ("empty.txt", b"", 422, "empty.txt: empty file"),
        ("blob.txt", b"\x00\x01\x02binary\x00" * 10, 422, "blob.txt: binary file"),
        ("fake.pdf", b"%PDF-1.4 this is not really a pdf", 422, "fake.pdf: unreadable PDF"),
        ("locked.pdf", (tmp_path / "locked.pdf").read_bytes(), 422, "locked.pdf: encrypted PDF"),
        ("fake.docx", b"PK\x03\x04 not a zip", 422, "fake.docx: unreadable DOCX"),
        ("blank.docx", _docx_bytes(tmp_path, "   "), 422, "blank.docx: no text in it"),
        ("image.png", b"\x89PNG\r\n", 415, "unsupported file type .png"),
        ("noext", b"text", 415, "unsupported file type (none)"),
    ]
    for name, data, status, words in cases:
        r = _upload(client, name, data)
        assert r.status_code == status, (name, r.text)
        assert words in r.json()["error"], (name, r.json())
    r = client.post("/v1/evidence", json={"filename": "a.txt", "content_base64": "not base64!"})
    assert r.status_code == 422 and "not valid base64" in r.json()["error"]
    r = client.post("/v1/evidence", json={"content_base64": ""})
    assert r.status_code == 422 and "filename" in r.json()["error"]
    assert _upload(client, "ok.txt", b"still serving").status_code == 200


def test_evidence_file_size_limits(markall):
    limits = Limits(max_upload_bytes=1_000, max_body_bytes=500, max_evidence_chars=600)
    with TestClient(create_app(markall, limits=limits)) as c:
        assert _upload(c, "fits.txt", b"a" * 580).status_code == 200  # a body over max_body_bytes is fine here
        r = _upload(c, "big.txt", b"a" * 1_001)  # within the body allowance, over the file limit
        assert r.status_code == 413 and "big.txt: too large: 1001 bytes, the limit is 1000" in r.json()["error"]
        r = _upload(c, "huge.txt", b"a" * 20_000)  # refused by the body limit before it is read
        assert r.status_code == 413 and "too large" in r.json()["error"]
        r = _upload(c, "long.txt", b"a" * 700)
        assert r.status_code == 422 and "700 characters, over the 600-character evidence limit" in r.json()["error"]
        # the larger body is allowed on /v1/evidence only
        assert c.post("/v1/detect", json={"answer": "x" * 600, "lang": "de"}).status_code == 413


def test_evidence_needs_the_key_when_set(markall):
    with TestClient(create_app(markall, api_key="k")) as c:
        assert _upload(c, "a.txt", b"text").status_code == 401
        assert _upload(c, "a.txt", b"text", **{"X-API-Key": "k"}).json()["text"] == "text"


def test_page_uploads_pdf_and_docx_to_the_server(client):
    page = client.get("/").text
    accept = page.split('accept="', 1)[1].split('"', 1)[0].split(",")
    assert {".pdf", ".docx", ".txt", ".md"} <= set(accept)
    js = client.get("/static/app.js").text
    assert '"/v1/evidence"' in js and "content_base64" in js


def test_docs_page_loads_its_assets_from_this_server_not_a_cdn(client, monkeypatch):
    html = client.get("/docs").text
    assert "/docs/assets/swagger-ui-bundle.js" in html and "/docs/assets/swagger-ui.css" in html
    assert "cdn" not in html.lower() and "https://" not in html.split("<body")[0]
    js = client.get("/docs/assets/swagger-ui-bundle.js")
    assert js.status_code == 200 and js.headers["content-type"].startswith("text/javascript")
    assert b"SwaggerUIBundle" in js.content[:2000]
    assert client.get("/docs/assets/../app.py").status_code == 404
    assert client.get("/redoc").status_code == 404  # ReDoc would need a CDN: off


def test_without_swagger_ui_installed_docs_is_off_and_the_schema_stays(markall, monkeypatch):
    import halluscope.serve.app as app_module

    monkeypatch.setattr(app_module, "swagger_assets", lambda: None)
    app = create_app(markall)
    assert app.state.docs_url is None
    with TestClient(app) as c:
        assert c.get("/docs").status_code == 404 and c.get("/openapi.json").status_code == 200


def test_detect_lists_the_passages_it_was_given_with_their_source_and_labels_its_counts(client):
    r = client.post("/v1/detect", json={"answer": ANSWER, "lang": "de", "context": "Canberra is the capital.",
                                        "evidence": ["Sydney is a city.",
                                                     {"text": "From a file.", "source": "file", "id": "notes.txt"}]})
    body = r.json()
    assert [(e["source"], e["id"], e["text"]) for e in body["evidence"]] == [
        ("context", "", "Canberra is the capital."), ("evidence", "evidence[0]", "Sydney is a city."),
        ("file", "notes.txt", "From a file.")]
    assert body["counts"] == {"hard_spans": 1, "soft_spans": 1, "units": 0, "units_flagged": 0}
    assert body["counts_text"] == "1 hallucinated span (p > 0.5) · 1 marked span (p > 0)"
    assert client.post("/v1/detect", json={"answer": ANSWER, "lang": "de"}).json()["evidence"] == []


def test_workers_share_the_port_and_stop_together(tmp_path):
    """``--workers 2``: two processes answer on one port; SIGINT (Ctrl-C) stops the parent and both workers."""
    import signal

    write(tmp_path, "mark-all", "de")
    port = _free_port()
    proc = subprocess.Popen([sys.executable, "-m", "halluscope", "serve", "--program", "mark-all", "--lang", "de",
                             "--compiled-dir", str(tmp_path), "--port", str(port), "--log-level", "warning",
                             "--workers", "2"], stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                            cwd=tmp_path)
    base = f"http://127.0.0.1:{port}"
    try:
        wait_healthy(proc, base, tries=600)
        children = {int(p) for p in subprocess.run(["pgrep", "-P", str(proc.pid)], capture_output=True,
                                                   text=True).stdout.split()}
        assert len(children) >= 2  # the two workers (and multiprocessing's resource tracker)
        with httpx.Client() as c:
            rows = [c.post(base + "/v1/detect", json={"answer": "Eins zwei.", "lang": "de"}) for _ in range(20)]
        assert all(r.status_code == 200 and r.json()["hard_labels"] == [[0, 10]] for r in rows)
    finally:
        proc.send_signal(signal.SIGINT)
        out, _ = proc.communicate(timeout=30)
    assert proc.returncode == 0 and "2 worker processes" in out and "Traceback" not in out, out
    time.sleep(0.5)

    def alive(pid: int) -> bool:
        try:
            return Path(f"/proc/{pid}/stat").read_text().rsplit(") ", 1)[1][:1] != "Z"
        except OSError:
            return False

    assert [p for p in children if alive(p)] == []


def test_lang_auto_picks_the_loaded_artifact_of_the_answers_language(client):
    """#34: lang "auto" (and no lang with several languages loaded) serves the answer's language."""
    for payload in ({"answer": "Die Hauptstadt von Australien ist Sydney.", "lang": "auto"},
                    {"answer": "Die Hauptstadt von Australien ist Sydney."}):
        r = client.post("/v1/detect", json=payload)
        assert r.status_code == 200, r.text
        body = r.json()
        assert body["lang_auto"]["lang"] == "de" and body["lang_auto"]["key"] == "de"
        assert body["artifact"]["key"] == "de" and body["lang_auto"]["confidence"] > 0.5
    body = client.post("/v1/detect", json={"answer": "The capital of Australia is Sydney.", "lang": "en"}).json()
    assert "lang_auto" not in body  # a named language is served as named


def test_detect_carries_the_verdict_and_what_to_mark(client):
    body = client.post("/v1/detect", json={"answer": ANSWER, "lang": "de"}).json()
    assert body["verdict"] == "hallucinated" and "span" in body["verdict_reason"]
    assert body["marks"] == [{"start": 0, "end": len(ANSWER), "prob": 1.0, "kind": "hallucinated"}]
