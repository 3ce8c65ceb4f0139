"""``halluscope ui``: the MLflow server starts on a local SQLite store with the offline environment, and its
REST API lists halluscope's experiments (no network: 127.0.0.1 only)."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path

import pytest

from halluscope.cli.ui import OFFLINE_ENV, free_port, ui_command, ui_env
from halluscope.tracking.runs import track_run


def test_ui_command_and_environment():
    env = ui_env({"PATH": "/bin", "LITELLM_LOCAL_MODEL_COST_MAP": "False"})
    assert env["LITELLM_LOCAL_MODEL_COST_MAP"] == "True"  # what makes the server start offline
    assert env["MLFLOW_DISABLE_TELEMETRY"] == "true" and env["DO_NOT_TRACK"] == "true" and env["PATH"] == "/bin"
    cmd = ui_command("sqlite:////tmp/x/mlflow.db", port=5123)
    assert cmd[1:4] == ["-m", "mlflow", "server"]
    assert cmd[cmd.index("--backend-store-uri") + 1] == "sqlite:////tmp/x/mlflow.db"
    assert cmd[cmd.index("--port") + 1] == "5123" and cmd[cmd.index("--host") + 1] == "127.0.0.1"
    assert cmd[cmd.index("--artifacts-destination") + 1] == "/tmp/x/artifacts"
    assert "--artifacts-destination" not in ui_command("http://server:5000")


def _get(url: str) -> dict:
    with urllib.request.urlopen(url, timeout=5) as r:
        return json.loads(r.read())


def test_ui_starts_offline_and_serves_the_experiments(tmp_path):
    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    run_id = track_run("evaluate", "mark-all", "de", {"program": "mark-all"}, {"iou": 0.4, "lm_calls": 0},
                       tracking_uri=uri, strict=True)
    port = free_port()
    env = {k: v for k, v in os.environ.items() if k not in OFFLINE_ENV}  # the command must set them itself
    env.update(HALLUSCOPE_HOME=str(tmp_path), NO_PROXY="*", no_proxy="*")
    proc = subprocess.Popen([sys.executable, "-m", "halluscope", "ui", "--port", str(port), "--tracking-uri", uri],
                            env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                            start_new_session=True)
    base = f"http://127.0.0.1:{port}"
    try:
        first = proc.stdout.readline()
        assert "MLflow UI on" in first and uri in first
        assert f"http://127.0.0.1:{port}" in proc.stdout.readline()
        deadline, data = time.time() + 120, None
        while time.time() < deadline and proc.poll() is None:
            try:
                data = _get(f"{base}/api/2.0/mlflow/experiments/search?max_results=100")
                break
            except (urllib.error.URLError, ConnectionError, OSError):
                time.sleep(0.5)
        assert proc.poll() is None, "the UI process exited"
        assert data is not None, "the UI did not answer within 120 s"
        names = {e["name"] for e in data["experiments"]}
        assert "halluscope/mark-all/de" in names
        run = _get(f"{base}/api/2.0/mlflow/runs/get?run_id={run_id}")["run"]
        metrics = {m["key"]: m["value"] for m in run["data"]["metrics"]}
        assert metrics["iou"] == 0.4 and run["info"]["status"] == "FINISHED"
    finally:
        os.killpg(proc.pid, signal.SIGTERM)
        try:
            proc.wait(timeout=15)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()


def _parents() -> dict[int, int]:
    """pid -> parent pid of every live (not zombie) process."""
    out = {}
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                stat = (entry / "stat").read_text()
            except OSError:
                continue
            fields = stat[stat.rindex(")") + 2:].split()  # after "pid (comm) ": state, ppid, ...
            if fields[0] != "Z":
                out[int(entry.name)] = int(fields[1])
    return out


def _descendants(pid: int) -> set[int]:
    parents, found, frontier = _parents(), set(), {pid}
    while frontier:
        frontier = {p for p, pp in parents.items() if pp in frontier} - found
        found |= frontier
    return found


def _alive(pids: set[int]) -> set[int]:
    return pids & set(_parents())


def _port_answers(port: int) -> bool:
    with socket.socket() as s:
        s.settimeout(1)
        return s.connect_ex(("127.0.0.1", port)) == 0


@pytest.mark.parametrize("signum", [signal.SIGTERM, signal.SIGINT])
def test_ui_stopped_by_a_signal_leaves_no_process_and_no_port(tmp_path, signum):
    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    port = free_port()
    env = {**os.environ, "HALLUSCOPE_HOME": str(tmp_path), "NO_PROXY": "*", "no_proxy": "*"}
    proc = subprocess.Popen([sys.executable, "-m", "halluscope", "ui", "--port", str(port), "--tracking-uri", uri],
                            env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    children: set[int] = set()
    try:
        deadline = time.time() + 120
        while time.time() < deadline and proc.poll() is None and not _port_answers(port):
            time.sleep(0.5)
        assert _port_answers(port), "the UI did not listen within 120 s"
        time.sleep(1)  # let the server start its workers
        children = _descendants(proc.pid)
        assert children, "the MLflow server runs as a child of halluscope ui"
        proc.send_signal(signum)  # to halluscope only, as a service manager or `kill PID` would
        assert proc.wait(timeout=30) == 0
        deadline = time.time() + 5
        while time.time() < deadline and (_alive(children) or _port_answers(port)):
            time.sleep(0.2)
        assert _alive(children) == set()
        assert not _port_answers(port)
    finally:
        if proc.poll() is None:
            proc.kill()
        for pid in _alive(children):  # never leave a server behind a failed test
            os.kill(pid, signal.SIGKILL)
