"""``halluscope ui``: the MLflow UI on the project's store, started so that it works without internet.

    halluscope ui                       # http://127.0.0.1:5000, the store of optimize/evaluate runs
    halluscope ui --port 5001 --tracking-uri sqlite:////abs/path/mlflow.db

Why not plain ``mlflow ui``: the MLflow server imports litellm, and litellm fetches its model cost map from
the internet at import time; on a machine without internet a logging filter in litellm's retry thread then
deadlocks on the import lock and the server never binds its port. ``LITELLM_LOCAL_MODEL_COST_MAP=True`` makes
litellm read the copy it ships with. Telemetry is turned off too (``MLFLOW_DISABLE_TELEMETRY`` and
``DO_NOT_TRACK``, both read by MLflow 3.17). The server runs one worker and listens on 127.0.0.1 unless
``--host`` says otherwise.

The server runs in a process group of its own, which ``halluscope ui`` owns: SIGTERM, SIGINT (Ctrl-C) or
SIGHUP (the terminal closed) stop MLflow and every child it started, and the port is free again.
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
from pathlib import Path

from halluscope.core import paths
from halluscope.cli.common import PORT
from halluscope.core.paths import resolve_tracking_uri

__all__ = ["OFFLINE_ENV", "add_parser", "cmd_ui", "free_port", "run_group", "stop_group", "ui_command", "ui_env"]

# What the server's environment gets (over the caller's): start offline, send nothing anywhere.
OFFLINE_ENV = paths.OFFLINE_ENV


def add_parser(subparsers) -> None:
    u = subparsers.add_parser("ui", help="start the MLflow UI on the project's runs (works offline)")
    u.add_argument("--port", type=PORT, default=5000, help="port (default 5000; 0 = any free port)")
    u.add_argument("--host", default="127.0.0.1", help="interface to listen on (default 127.0.0.1)")
    u.add_argument("--tracking-uri", default=None,
                   help="MLflow store (default $MLFLOW_TRACKING_URI, else the project's sqlite store)")
    u.set_defaults(func=cmd_ui)


def free_port(host: str = "127.0.0.1") -> int:
    """A port nobody listens on right now."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind((host, 0))
        return s.getsockname()[1]


def ui_env(base: dict | None = None) -> dict:
    """``base`` (default: this process's environment) with :data:`OFFLINE_ENV` set."""
    env = dict(os.environ if base is None else base)
    env.update(OFFLINE_ENV)
    return env


def _artifacts_destination(uri: str) -> Path | None:
    """For a SQLite store, ``artifacts/`` beside the database (where halluscope's experiments keep theirs),
    so that experiments created in the UI do not write to ``./mlartifacts``; None for other stores."""
    db = paths.sqlite_path(uri)
    return None if db is None else db.parent / "artifacts"


def ui_command(uri: str, *, host: str = "127.0.0.1", port: int = 5000) -> list[str]:
    """The ``mlflow server`` command line for ``uri`` (run it with :func:`ui_env`)."""
    cmd = [sys.executable, "-m", "mlflow", "server", "--backend-store-uri", uri, "--host", host,
           "--port", str(port), "--workers", "1"]
    dest = _artifacts_destination(uri)
    if dest is not None:
        cmd += ["--artifacts-destination", str(dest)]
    return cmd


def cmd_ui(args) -> int:
    uri = resolve_tracking_uri(args.tracking_uri, create=False)
    port = args.port or free_port(args.host)
    dest = _artifacts_destination(uri)
    if dest is not None:
        try:
            dest.mkdir(parents=True, exist_ok=True)
        except OSError as e:  # a read-only working folder without $HALLUSCOPE_HOME: one line, not a traceback
            print(f"halluscope ui: error: cannot make the MLflow store in {dest.parent}: {e.strerror or e} "
                  f"(--tracking-uri chooses another store; {paths.home_hint()})", file=sys.stderr)
            return 2
    cmd = ui_command(uri, host=args.host, port=port)
    print(f"MLflow UI on {uri}\n  http://{args.host}:{port}   (Ctrl-C stops it)", flush=True)
    return run_group(cmd, env=ui_env())


def run_group(cmd: list[str], *, env: dict | None = None, grace_s: float = 10.0) -> int:
    """Run ``cmd`` in a process group of its own and wait; SIGTERM, SIGINT (Ctrl-C) or SIGHUP to this process
    stop the whole group (the MLflow server and every worker it started): SIGTERM first, SIGKILL to what is
    left after ``grace_s``. Returns the server's exit status, or 0 when it was stopped by a signal."""
    proc = subprocess.Popen(cmd, env=env, start_new_session=True)  # its own session: one group to stop
    stopping = {"signal": None}

    def stop(signum, _frame):
        stopping["signal"] = signum
        raise KeyboardInterrupt

    previous = {sig: signal.signal(sig, stop) for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP)}
    try:
        return proc.wait()
    except KeyboardInterrupt:
        stop_group(proc, grace_s)
        return 0
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)
        if proc.poll() is None:  # any other way out (an error): never leave the server behind
            stop_group(proc, grace_s)


def stop_group(proc: subprocess.Popen, grace_s: float = 10.0) -> None:
    """SIGTERM to ``proc``'s process group, SIGKILL to the group after ``grace_s``; waits for ``proc``."""
    try:
        os.killpg(proc.pid, signal.SIGTERM)
    except ProcessLookupError:
        pass
    try:
        proc.wait(timeout=grace_s)
    except subprocess.TimeoutExpired:
        pass
    try:  # the server's workers may outlive it by a moment: whatever is left in the group goes now
        os.killpg(proc.pid, signal.SIGKILL)
    except ProcessLookupError:
        pass
    proc.wait()
