"""Issue #24: the tracking store is opened and checked before any work; a bad or hanging --tracking-uri is one
line, exit status 2, within a few seconds (before: reported 3-6 s, a hanging server 67 s, after the artifact)."""

from __future__ import annotations

import http.server
import socket
import threading
import time

import dspy
import pytest

from halluscope.tracking.runs import TrackingStoreError, check_tracking_store


@pytest.fixture(autouse=True)
def _env(monkeypatch, tmp_path):
    monkeypatch.delenv("HALLUSCOPE_DATA_DIR", raising=False)
    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    monkeypatch.setenv("HALLUSCOPE_HOME", str(tmp_path / "home"))
    monkeypatch.setenv("HALLUSCOPE_TRACKING_CHECK_TIMEOUT", "1.5")
    lm, adapter = dspy.settings.lm, dspy.settings.adapter
    yield
    dspy.configure(lm=lm, adapter=adapter)


@pytest.fixture
def hanging_server():
    """A port that accepts connections (the kernel's backlog) and never answers."""
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    sock.listen(8)
    yield f"http://user:hunter2pw@127.0.0.1:{sock.getsockname()[1]}"
    sock.close()


@pytest.fixture
def html_server():
    class Page(http.server.BaseHTTPRequestHandler):
        def do_GET(self):  # noqa: N802 - the stdlib's name
            body = b"<html><body>a web page</body></html>"
            self.send_response(200)
            self.send_header("Content-Type", "text/html")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args):
            pass

    srv = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Page)
    threading.Thread(target=srv.serve_forever, daemon=True).start()
    yield f"http://127.0.0.1:{srv.server_address[1]}"
    srv.shutdown()


def test_a_working_store_passes(tmp_path):
    uri = f"sqlite:///{tmp_path / 'ok' / 'mlflow.db'}"
    assert check_tracking_store(uri) == uri


def test_bad_stores_are_one_line_errors(tmp_path, hanging_server, html_server):
    (tmp_path / "afile").write_text("x")
    (tmp_path / "text.db").write_text("this is not a database, " * 100)
    for uri, words in [(f"sqlite:///{tmp_path / 'afile' / 'sub' / 'm.db'}", "cannot use the tracking store"),
                       (f"sqlite:///{tmp_path / 'text.db'}", "file is not a database"),
                       (hanging_server, "did not answer within 1.5 s"),
                       (html_server, "is not an MLflow tracking server (HTTP 200, text/html)"),
                       ("http://127.0.0.1:9", "cannot reach the tracking server")]:
        t0 = time.perf_counter()
        with pytest.raises(TrackingStoreError) as e:
            check_tracking_store(uri)
        assert words in str(e.value) and "\n" not in str(e.value)
        assert "hunter2pw" not in str(e.value)
        assert time.perf_counter() - t0 < 15


def _spy_lm(calls):
    from halluscope.lm.scripted import scripted_lm

    def respond(call):
        calls.append(call)
        return {"spans": []}

    return scripted_lm(respond)


def test_optimize_with_a_hanging_tracking_server_stops_before_any_work(tmp_path, hanging_server, capsys):
    from halluscope.cli.optimize import build_parser, run

    calls = []
    p = build_parser()
    args = p.parse_args(["--program", "spans", "--metric", "iou", "--lang", "de", "--optimizer", "bootstrap",
                         "--compiled-dir", str(tmp_path / "compiled"), "--report-dir", str(tmp_path / "reports"),
                         "--tracking-uri", hanging_server, "--quiet"])
    t0 = time.perf_counter()
    with pytest.raises(SystemExit) as e:
        run(args, p, task_lm=_spy_lm(calls))
    assert time.perf_counter() - t0 < 15
    err = capsys.readouterr().err
    assert e.value.code == 2
    line = next(ln for ln in err.splitlines() if "--tracking-uri" in ln)
    assert line.startswith("halluscope optimize: error: argument --tracking-uri: the tracking server")
    assert "did not answer" in line and "nothing was run" in line and "hunter2pw" not in err
    assert calls == [] and not (tmp_path / "reports").exists() and not (tmp_path / "compiled").exists()


def test_evaluate_with_a_bad_tracking_uri_stops_before_any_work(tmp_path, capsys):
    from halluscope.cli import main

    (tmp_path / "afile").write_text("x")
    with pytest.raises(SystemExit) as e:
        main(["evaluate", "--program", "mark-all", "--lang", "de", "--out-dir", str(tmp_path / "out"),
              "--tracking-uri", f"sqlite:///{tmp_path / 'afile' / 'm.db'}", "--no-progress"])
    assert e.value.code == 2
    assert "error: argument --tracking-uri: cannot use the tracking store" in capsys.readouterr().err
    assert not list((tmp_path / "out").rglob("*.jsonl"))  # nothing was run
    # --no-mlflow: no store is needed, none is checked
    assert main(["evaluate", "--program", "mark-all", "--lang", "de", "--out-dir", str(tmp_path / "out"),
                 "--tracking-uri", f"sqlite:///{tmp_path / 'afile' / 'm.db'}", "--no-progress", "--no-mlflow"]) == 0
