"""``halluscope serve``: an HTTP API and a web page for compiled detectors (see :mod:`halluscope.serve.app`).

    halluscope serve --program spans --lang de                       # http://127.0.0.1:8000/ and /docs
    halluscope serve --program spans --lang de --lang en --port 9000  # several languages at once
    halluscope serve --program halluclean --task qa --version 1
    halluscope serve --model models:/halluscope-spans-de@champion    # a registered MLflow model (see register)
    HALLUSCOPE_SERVE_KEY=... halluscope serve --lang de --host 0.0.0.0   # a key is required off loopback
    halluscope serve --lang de --workers 2                           # two processes share the port

``--model URI`` (repeatable) loads a model registered with ``halluscope register`` from the MLflow registry
(``--tracking-uri``, default ``$MLFLOW_TRACKING_URI`` or the project's store), verified like a local artifact
(content hash, signature) and served under its program and language like one named by ``--lang``;
``--program``/``--metric``/``--version`` apply to ``--lang``/``--task`` only.

The artifacts are loaded (and verified) once at start-up; the LM is configured only when a loaded program
uses one. Each detector is then run once on a probe answer (:func:`startup_check`): when more than
``--max-failed-share`` of them raise or give no usable output (an LM answering garbage), the server does not
start (exit 1, the reason in one line); ``--no-startup-check`` skips this. Clients send ``X-API-Key`` when a key
is set.
"""

from __future__ import annotations

import argparse
import ipaddress
import json
import logging
import os
import sys
import threading
import time

from halluscope.artifacts.store import MODEL_URI_PREFIX, ArtifactError, load_compiled
from halluscope.cli import STARTED
from halluscope.cli.common import (BYTES, PORT, POSITIVE_INT, SECONDS, THREADS, add_lm_args, add_max_failed_share,
                                   failed_share_line, parse_options, setup_lm)
from halluscope.core.contract import describe_failed, failed_kinds, failure_reason
from halluscope.artifacts.compiled import detect
from halluscope.core.redact import error_text, redact
from halluscope.core.tasks import HALLUCLEAN_TASKS
from halluscope.artifacts.policy import load_detector
from halluscope.artifacts.compiled import CompiledDetector
from halluscope.metrics.adapters import METRICS
from halluscope.programs.registry import get_program, program_names
from halluscope.serve.app import Limits, create_app, swagger_assets

KEY_ENV = "HALLUSCOPE_SERVE_KEY"


def add_parser(subparsers) -> None:
    s = subparsers.add_parser("serve", help="serve compiled detectors over HTTP (JSON API + web page)")
    g = s.add_argument_group("what to serve")
    g.add_argument("--program", choices=program_names(), default=None,
                   help="default: grounded for a --lang with the embedded model (--lm local; the cross-lingual "
                        "artifact for a language without its own), spans otherwise")
    g.add_argument("--lang", action="append", default=[], metavar="LANG",
                   help="language of an artifact to load (repeat for several)")
    g.add_argument("--task", action="append", default=[], metavar="TASK",
                   help="HalluClean task of a response-level artifact to load (repeat for several)")
    g.add_argument("--metric", choices=list(METRICS), default=None,
                   help="metric the artifacts were optimised for (default: the program's)")
    g.add_argument("--version", default=None, help="pin a version (3 or v0003); default: the best of each")
    g.add_argument("--compiled-dir", default=None,
                   help="artifact root to read (default: <home>/compiled, then the artifacts "
                        "bundled with the package; given: only this folder)")
    g.add_argument("--model", action="append", default=[], metavar="URI",
                   help="an MLflow registered model to serve, models:/NAME@ALIAS or models:/NAME/VERSION "
                        "(repeat for several; --lang/--task are then optional)")
    g.add_argument("--option", "-O", action="append", metavar="KEY=VALUE", default=None,
                   help="a build option to change when loading, only those safe at load time (MEDICO: -O kb=DIR, "
                        "-O files=a.pdf, -O k=8, ...); others are refused by name")
    g.add_argument("--tracking-uri", default=None,
                   help="MLflow store holding the --model registry (default $MLFLOW_TRACKING_URI, else the "
                        "project's sqlite store)")
    n = s.add_argument_group("server")
    n.add_argument("--host", default="127.0.0.1", help="address to bind (default 127.0.0.1, loopback only)")
    n.add_argument("--port", type=PORT, default=8000, help="port to listen on (default 8000)")
    n.add_argument("--require-key", default=os.environ.get(KEY_ENV), metavar="KEY",
                   help=f"API key clients must send as X-API-Key (default ${KEY_ENV}); required off loopback")
    n.add_argument("--timeout", type=SECONDS, default=Limits.timeout_s, help="seconds per request (default %(default)s)")
    n.add_argument("--max-body-bytes", type=BYTES, default=Limits.max_body_bytes,
                   help="largest request body; larger ones are refused with 413 (default %(default)s)")
    n.add_argument("--max-batch", type=POSITIVE_INT, default=Limits.max_batch,
                   help="most answers in one /v1/detect/batch request (default %(default)s)")
    n.add_argument("--max-upload-bytes", type=BYTES, default=Limits.max_upload_bytes,
                   help="largest evidence file the page may upload to /v1/evidence (default %(default)s)")
    n.add_argument("--workers", type=THREADS, default=1,
                   help="server processes sharing the port (uvicorn workers); each loads the detectors (and the "
                        "LM: N times its memory) and uses a core, for CPU-bound detectors such as grounded "
                        "without an LM scorer (default 1)")
    n.add_argument("--lm-concurrency", type=THREADS, default=1,
                   help="requests inside LM programs at once (1 for the embedded model)")
    n.add_argument("--log-level", default="info", choices=["critical", "error", "warning", "info", "debug"],
                   help="the server's log level (default info: one line per request)")
    n.add_argument("--no-startup-check", action="store_true",
                   help="start without running each loaded detector once on a probe answer")
    add_max_failed_share(n, 0.5, "start-up")
    add_lm_args(s)
    s.set_defaults(func=cmd_serve)


def is_loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False  # a host name: assume it is reachable from elsewhere


def resolve_detectors(args, *, quiet: bool = False) -> list[CompiledDetector]:
    """The compiled detectors the arguments name, loaded and verified (raises ArtifactError/ValueError).

    This is the one place that knows where artifacts come from: local version folders (``--lang``/``--task``)
    and MLflow registered models (``--model``), each verified by :func:`load_compiled`; all are handed to
    :func:`halluscope.serve.create_app` as ``CompiledDetector`` objects and addressed by program/language/version.
    The same artifact named twice is served once; two different ones under the same address are refused."""
    keys = [*args.lang, *args.task]
    models = list(dict.fromkeys(getattr(args, "model", None) or []))
    if not keys and not models:
        raise ValueError("name at least one --lang or --task (or --model models:/NAME@ALIAS) to serve")
    for uri in models:
        if not uri.startswith(MODEL_URI_PREFIX):
            raise ValueError(f"--model {uri!r}: expected an MLflow registered-model URI, models:/NAME@ALIAS or "
                             f"models:/NAME/VERSION")
    try:
        options = parse_options(getattr(args, "option", None))
    except argparse.ArgumentTypeError as e:
        raise ValueError(f"--option/-O: {e}") from None
    detectors = []
    for key in dict.fromkeys(keys):  # the library's run policy, as halluscope detect: it says what it chose
        is_task = key in args.task and key not in args.lang
        d = load_detector(lang=None if is_task else key, task=key if is_task else None, program=args.program,
                          metric=args.metric, version=args.version, lm=args.lm, root=args.compiled_dir,
                          options=options)
        if d.why and not quiet:
            print(d.why, file=sys.stderr)
        detectors.append(d)
    for uri in models:
        detectors.append(load_compiled(uri, tracking_uri=getattr(args, "tracking_uri", None), options=options))
    seen: dict[tuple[str, str, int], CompiledDetector] = {}
    for d in detectors:
        other = seen.setdefault((d.name, d.lang, d.version), d)
        if other is not d and other.content_hash != d.content_hash:
            raise ValueError(f"two different artifacts are both {d.name}/{d.lang} v{d.version:04d} ({other.path} "
                             f"and {d.path}); the server addresses them by program, language and version: serve "
                             f"one of them")
    return list(seen.values())


WORKER_ENV = "HALLUSCOPE_SERVE_WORKER_ARGS"  # the arguments each worker process rebuilds the app from


def build_app(args, *, detectors: list[CompiledDetector] | None = None, quiet: bool = False,
              started: float | None = None, lm_ready: bool = False):
    """The FastAPI app the arguments describe: the detectors loaded and verified (unless given), the LM set up
    when one of them uses it. ``started`` (``time.perf_counter()``): when start-up began, for ``/healthz``'s
    ``startup_s`` (default: now). ``lm_ready``: the caller has set the LM up already. Raises
    ArtifactError/ValueError on bad arguments."""
    t0 = time.perf_counter() if started is None else started
    limits = Limits(max_body_bytes=args.max_body_bytes, max_batch=args.max_batch, timeout_s=args.timeout,
                    max_upload_bytes=args.max_upload_bytes)
    if detectors is None:
        detectors = resolve_detectors(args, quiet=quiet)
    if not lm_ready and any(get_program(d.name).needs_lm(d.manifest.get("program_options")) for d in detectors):
        lm = setup_lm(args)  # else no LM configured
        compiled_with = {(d.manifest.get("task_lm") or {}).get("model") for d in detectors} - {None, lm.model}
        if compiled_with and not quiet:
            print(f"warning: compiled with {', '.join(sorted(compiled_with))}; serving with {lm.model}",
                  file=sys.stderr)
    return create_app(detectors, api_key=args.require_key, limits=limits, lm_concurrency=args.lm_concurrency,
                      startup_seconds=round(time.perf_counter() - t0, 3))


def worker_app():
    """``uvicorn --factory`` entry of each ``--workers`` process: the app rebuilt from the parent's arguments."""
    args = argparse.Namespace(**json.loads(os.environ[WORKER_ENV]))
    return build_app(args, quiet=True)


#: What the start-up check asks each loaded detector (a plain, true answer with its evidence).
PROBE = {"question": "Where is the Eiffel Tower?", "answer": "The Eiffel Tower is in Paris.",
         "context": "The Eiffel Tower is a wrought-iron tower on the Champ de Mars in Paris, France."}


def startup_check(detectors: list[CompiledDetector], max_share: float) -> str | None:
    """Run each detector once on :data:`PROBE` (its LM, if it has one, answers for real): a detector that raises
    or gives no usable output (:func:`halluscope.core.contract.item_failure`: unreadable, truncated, LM error) failed.
    Returns the one line saying why the server must not start when more than ``max_share`` of them failed, else
    None (failures at or below the share are printed as a warning)."""
    reasons, named = [], []
    for d in detectors:
        is_task = d.lang in HALLUCLEAN_TASKS
        try:
            det = detect(d, PROBE["answer"], question=PROBE["question"], context=PROBE["context"],
                         lang=None if is_task else d.lang, task=d.lang if is_task else None)
            reason = failure_reason(det.failures)
            shown = f"unusable output: {reason}" if reason else ""
        except Exception as e:  # noqa: BLE001 - the check reports it in one line
            reason = f"error:{type(e).__name__}"
            shown = " ".join(redact(error_text(e)).split())
        reasons.append(reason)
        if reason:
            named.append(f"{d.name}/{d.lang} v{d.version:04d}: {shown}")
    n_failed = sum(r is not None for r in reasons)
    why = "; ".join(named)
    problem = failed_share_line(n_failed, len(detectors), max_share, why, "detectors")
    if problem:
        return (f"start-up check: {problem[len('RUN '):]}: each was run once on a probe answer; nothing is "
                f"served (--no-startup-check skips the check)")
    if n_failed:
        print(f"warning: start-up check: {n_failed} of {len(detectors)} detectors gave no usable output on a probe "
              f"answer ({describe_failed(failed_kinds(reasons))}): {why}", file=sys.stderr)
    return None


def _listening(host: str, port: int) -> bool:
    """Whether something accepts connections on ``host:port`` (a wildcard host is asked on loopback)."""
    import socket

    target = {"0.0.0.0": "127.0.0.1", "::": "::1", "": "127.0.0.1"}.get(host, host)
    try:
        with socket.create_connection((target, port), timeout=0.5):
            return True
    except OSError:
        return False


def announce_when_listening(host: str, port: int, line: str) -> threading.Event:
    """Print ``line`` (its ``{}``: the seconds since the command started, imports included) once the server
    accepts connections on ``host:port``, from a thread polling every 50 ms, so that the line a user reads means
    the server answers now. Set the returned event to stop it (the server ended, or never started)."""
    stop = threading.Event()
    if port == 0:  # any free port: uvicorn's own log line names the one it got
        print(line.format(time.perf_counter() - STARTED), file=sys.stderr, flush=True)
        stop.set()
        return stop
    if _listening(host, port):  # something else has the port: uvicorn will say so, and nothing is announced
        stop.set()
        return stop

    def poll() -> None:
        while not stop.wait(0.05):
            if _listening(host, port):
                print(line.format(time.perf_counter() - STARTED), file=sys.stderr, flush=True)
                return

    threading.Thread(target=poll, name="halluscope-serve-ready", daemon=True).start()
    return stop


def cmd_serve(args) -> int:
    import uvicorn  # the server itself; imported here so other commands do not pay for it

    if not is_loopback(args.host) and not args.require_key:
        print(f"halluscope serve: refusing to listen on {args.host} without an API key: set ${KEY_ENV} or pass "
              f"--require-key (clients then send X-API-Key)", file=sys.stderr)
        return 2
    try:
        detectors = resolve_detectors(args)  # verified once here: a bad artifact fails before any worker starts
    except (ArtifactError, ValueError) as e:
        print(f"halluscope serve: {e}", file=sys.stderr)
        return 2
    for d in detectors:
        print(f"loaded {d.name}/{d.lang}/{d.metric} v{d.version:04d} ({d.content_hash[:12]}) from {d.path}" if d.path
              else f"serving the unfitted {d.name} for {d.lang} (no artifact)", file=sys.stderr)
    if any(get_program(d.name).needs_lm(d.manifest.get("program_options")) for d in detectors):  # else no LM configured
        lm = setup_lm(args)
        compiled_with = {(d.manifest.get("task_lm") or {}).get("model") for d in detectors} - {None, lm.model}
        if compiled_with:
            print(f"warning: compiled with {', '.join(sorted(compiled_with))}; serving with {lm.model}",
                  file=sys.stderr)
    if not args.no_startup_check:
        problem = startup_check(detectors, args.max_failed_share)
        if problem:
            print(f"halluscope serve: {problem}", file=sys.stderr)
            return 1
    logging.basicConfig(level=args.log_level.upper(), format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    docs = ("API docs at /docs, the OpenAPI schema at /openapi.json" if swagger_assets() is not None else
            "the OpenAPI schema at /openapi.json; no /docs page: no Swagger UI is installed")
    workers = f"; {args.workers} worker processes" if args.workers > 1 else ""
    if args.workers == 1:
        app = build_app(args, detectors=detectors, started=STARTED, lm_ready=True)
        line = f"serving on http://{args.host}:{args.port}/ ({docs}{workers}; ready in {{:.1f}} s)"
        announced = announce_when_listening(args.host, args.port, line)
        try:
            uvicorn.run(app, host=args.host, port=args.port, log_level=args.log_level)
        finally:
            announced.set()
        return 0
    # several processes share the port (uvicorn's supervisor); each loads the detectors (and the LM) itself
    os.environ[WORKER_ENV] = json.dumps({k: v for k, v in vars(args).items() if k != "func"})
    print(f"starting on http://{args.host}:{args.port}/ ({docs}{workers}; each answers once it has loaded the "
          f"detectors, {time.perf_counter() - STARTED:.1f} s in)", file=sys.stderr)
    uvicorn.run("halluscope.cli.serve:worker_app", factory=True, workers=args.workers, host=args.host,
                port=args.port, log_level=args.log_level)
    return 0
