"""MLflow tracking for optimize and evaluate runs, and the run table behind ``halluscope compare``.

Where runs go
-------------
``--tracking-uri`` (the ``tracking_uri`` argument), else ``$MLFLOW_TRACKING_URI``, else the embedded
default: a SQLite store ``<project>/mlruns/mlflow.db`` whose experiments keep their artifacts in
``<project>/mlruns/artifacts`` (``mlruns/`` is git-ignored). ``mlflow ui --backend-store-uri
sqlite:///<project>/mlruns/mlflow.db`` shows them. One experiment per program and language:
``halluscope/<program>/<lang>``.

What is logged
--------------
Params (strings, redacted), metrics (numbers; per-fold ones also as steps), tags (kind, program, lang,
git commit) and artifact *files* (our JSON/JSONL outputs). Never a pickled program (``mlflow.dspy`` is not
used: it pickles the program and the LM with its API key). Anything that looks like a secret — a param
whose name says key/token/secret/password, a value shaped like a known API key, or the literal value of
any ``*API_KEY*``/``*TOKEN*`` environment variable — is replaced by ``***``; an artifact file containing
such a literal is not logged.
"""

from __future__ import annotations

import contextlib
import json
import logging
import math
import os
import re
import threading
import time
from pathlib import Path
from typing import Any, Iterable, Mapping, Sequence

try:
    import fcntl
except ImportError:  # Windows
    fcntl = None

from halluscope.core import paths
from halluscope.core.paths import default_tracking_uri, resolve_tracking_uri
from halluscope.artifacts.store import git_commit
from halluscope.core.redact import REDACTED, known_secrets, redact  # the one redaction function (re-exported)

paths.set_offline_defaults()

logger = logging.getLogger(__name__)

__all__ = [
    "check_tracking_store",
    "TrackingStoreError",
    "experiment_name",
    "redact",
    "redact_params",
    "metric_key",
    "track_run",
    "log_datasets",
    "runs_table",
    "plot_scores",
]

_SECRET_NAME = re.compile(r"(api[_-]?key|apikey|token|secret|passw(or)?d|authorization|credential)", re.I)


class TrackingStoreError(RuntimeError):
    """The tracking store cannot be used (unreachable, not an MLflow server, unwritable); the message is one line."""


#: Seconds :func:`check_tracking_store` waits for a tracking server (``$HALLUSCOPE_TRACKING_CHECK_TIMEOUT`` wins);
#: a database or file store gets four times as long (a fresh SQLite store creates its tables).
CHECK_TIMEOUT = 5.0


def check_tracking_store(tracking_uri: str | None = None, timeout: float | None = None) -> str:
    """Open the tracking store a run will record to and check it answers, before any work; return its URI.

    A tracking server (``http(s)://``) gets one request without retries (``experiments/get-by-name``): no answer
    within ``timeout`` seconds, a refused connection, an HTTP error other than MLflow's own "not found", or a
    reply that is not MLflow's JSON is a :class:`TrackingStoreError`. A SQLite store must be a database file (or
    none yet) in a writable folder, opened with ``sqlite3``. Any other store (a folder, a database URL) is opened
    by the MLflow client on a helper thread and asked for one experiment, within four times ``timeout``. The
    message is one line, credentials in the URI redacted."""
    from halluscope.core.redact import redact_url

    uri = resolve_tracking_uri(tracking_uri, create=False)  # the SQLite check makes the folder, or says why not
    timeout = float(timeout if timeout is not None else os.environ.get("HALLUSCOPE_TRACKING_CHECK_TIMEOUT",
                                                                      CHECK_TIMEOUT))
    shown = redact_url(uri)
    if uri.split(":", 1)[0].lower() in ("http", "https"):
        _check_server(uri, shown, timeout)
        return uri
    db = paths.sqlite_path(uri)
    if db is not None:  # opened with sqlite3 (MLflow creates its tables when the run is recorded)
        _check_sqlite(db, shown, timeout)
        return uri
    import mlflow  # noqa: F401  (imported here, outside the time limit: about 2 s)

    outcome: dict = {}

    def probe():
        try:
            client, _ = open_client(uri)
            with _store_lock(uri):
                client.search_experiments(max_results=1)
            outcome["ok"] = True
        except BaseException as e:  # noqa: BLE001 - reported by the caller's thread
            outcome["error"] = e

    worker = threading.Thread(target=probe, daemon=True, name="halluscope-tracking-check")
    worker.start()
    worker.join(timeout * 4)
    if worker.is_alive():
        raise TrackingStoreError(f"the tracking store {shown} did not answer within {timeout * 4:g} s")
    if "error" in outcome:
        e = outcome["error"]
        raise TrackingStoreError(f"cannot use the tracking store {shown}: {type(e).__name__}: "
                                 + " ".join(redact(str(e)).split())[:300])
    return uri


def _check_sqlite(db: Path, shown: str, timeout: float) -> None:
    import sqlite3

    try:
        db.parent.mkdir(parents=True, exist_ok=True)
        if not os.access(db.parent, os.W_OK | os.X_OK):
            raise PermissionError(f"the folder {db.parent} is not writable")
        with contextlib.closing(sqlite3.connect(str(db), timeout=timeout)) as con:
            con.execute("SELECT count(*) FROM sqlite_master").fetchone()
    except (OSError, sqlite3.Error) as e:
        raise TrackingStoreError(f"cannot use the tracking store {shown}: {type(e).__name__}: "
                                 + " ".join(redact(str(e)).split())[:300]) from None


def _check_server(uri: str, shown: str, timeout: float) -> None:
    import urllib.error
    import urllib.parse
    import urllib.request

    url = uri.rstrip("/") + "/api/2.0/mlflow/experiments/get-by-name?" + urllib.parse.urlencode(
        {"experiment_name": "halluscope-tracking-check"})
    parts = urllib.parse.urlsplit(url)
    if parts.username or parts.password:  # credentials go as a header, never in the request line
        url = urllib.parse.urlunsplit(parts._replace(netloc=parts.hostname + (f":{parts.port}" if parts.port else "")))
    request = urllib.request.Request(url, headers={"Accept": "application/json"})
    if parts.username or parts.password:
        import base64

        token = base64.b64encode(f"{urllib.parse.unquote(parts.username or '')}:"
                                 f"{urllib.parse.unquote(parts.password or '')}".encode()).decode()
        request.add_header("Authorization", f"Basic {token}")
    try:
        with urllib.request.urlopen(request, timeout=timeout) as resp:  # noqa: S310 - the user's own server
            status, body, kind = resp.status, resp.read(20_000), resp.headers.get("Content-Type", "")
    except urllib.error.HTTPError as e:
        status, body, kind = e.code, e.read(20_000), e.headers.get("Content-Type", "") if e.headers else ""
    except (TimeoutError, OSError) as e:  # URLError is an OSError; a socket timeout a TimeoutError
        reason = getattr(e, "reason", e)
        if isinstance(reason, TimeoutError) or "timed out" in str(reason):
            raise TrackingStoreError(f"the tracking server {shown} did not answer within {timeout:g} s") from None
        raise TrackingStoreError(f"cannot reach the tracking server {shown}: "
                                 + " ".join(redact(str(reason)).split())[:200]) from None
    try:
        data = json.loads(body or b"null")
    except ValueError:
        data = None
    if status in (401, 403):
        raise TrackingStoreError(f"the tracking server {shown} refused the request (HTTP {status}): set "
                                 f"MLFLOW_TRACKING_USERNAME/PASSWORD or MLFLOW_TRACKING_TOKEN")
    if not isinstance(data, dict) or (status != 200 and "error_code" not in data):
        raise TrackingStoreError(f"{shown} is not an MLflow tracking server (HTTP {status}, "
                                 f"{kind.split(';')[0] or 'no content type'})")


def experiment_name(program: str, lang: str | None) -> str:
    return f"halluscope/{program}/{lang or 'all'}"


# ------------------------------------------------------------------------------------------------------
# Redaction
# ------------------------------------------------------------------------------------------------------


def redact_params(params: Mapping[str, Any], extra_secrets: Sequence[str] = ()) -> dict[str, str]:
    """Params as MLflow strings: secret-named keys fully redacted, values scrubbed, None -> "None"."""
    out = {}
    for k, v in params.items():
        key = _clean_key(str(k))
        if _SECRET_NAME.search(str(k)) and v not in (None, "", False):
            out[key] = REDACTED
        else:
            out[key] = redact(v if isinstance(v, str) else ("None" if v is None else v), extra_secrets)[:6000]
    return out


def _file_has_secret(path: Path, extra_secrets: Sequence[str] = ()) -> bool:
    secrets = [s for s in (*extra_secrets, *known_secrets()) if s and len(s) >= 4]
    if not secrets:
        return False
    try:
        if path.stat().st_size > 50_000_000:
            return False
        data = path.read_bytes()
    except OSError:
        return False
    return any(s.encode() in data for s in secrets)


def _clean_key(name: str) -> str:
    name = name.replace("+", "_plus_")
    name = re.sub(r"[^/\w.\- ]", "_", name)
    return name.strip("/")[:250] or "_"


def metric_key(*parts: str) -> str:
    """An MLflow-safe metric name from parts.

    ``metric_key("cv", "compiled", "iou+corr")`` -> ``cv/compiled/iou_plus_corr``."""
    return "/".join(_clean_key(str(p)) for p in parts if p != "")


# ------------------------------------------------------------------------------------------------------
# Logging a run
# ------------------------------------------------------------------------------------------------------


#: How long tracking waits on a bad store. MLflow's defaults retry an HTTP request for about 4 minutes and the
#: creation of a SQLite engine for about 100 s; a run's files are on disk anyway, so tracking gives up after a few
#: seconds. The MLFLOW_HTTP_REQUEST_* environment variables, when set, win; HALLUSCOPE_MLFLOW_DB_RETRIES sets
#: the SQL store's attempts.
HTTP_DEFAULTS = {"MLFLOW_HTTP_REQUEST_MAX_RETRIES": "2", "MLFLOW_HTTP_REQUEST_BACKOFF_FACTOR": "1",
                 "MLFLOW_HTTP_REQUEST_TIMEOUT": "20"}
DB_RETRIES = 3


def _bound_mlflow_waits() -> None:
    import mlflow.store.db.utils as db_utils  # mlflow is imported only when tracking (about 2 s)

    for k, v in HTTP_DEFAULTS.items():
        os.environ.setdefault(k, v)
    db_utils.MAX_RETRY_COUNT = int(os.environ.get("HALLUSCOPE_MLFLOW_DB_RETRIES", DB_RETRIES))


@contextlib.contextmanager
def _store_lock(uri: str):
    """For a SQLite store, an inter-process lock (``<db>.lock``) around one run's writes: concurrent processes
    creating the tables of a fresh store, or writing at once, otherwise fail with "table already exists" or
    "database is locked". Other stores (a tracking server, files) need none; where ``fcntl`` is missing
    (Windows) concurrent runs on one SQLite store are not supported."""
    if not uri.startswith("sqlite:///") or fcntl is None:
        yield
        return
    db = Path(uri[len("sqlite:///"):])
    try:
        db.parent.mkdir(parents=True, exist_ok=True)
        f = open(str(db) + ".lock", "a+")
    except OSError:  # an unusable location: MLflow reports it (quickly, see _bound_mlflow_waits)
        yield
        return
    with f:
        fcntl.flock(f, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(f, fcntl.LOCK_UN)


def open_client(tracking_uri: str | None):
    """An ``MlflowClient`` on the resolved store (:func:`halluscope.core.paths.resolve_tracking_uri`) and its URI."""
    import mlflow  # noqa: F401  (about 2 s; only when tracking)
    from mlflow.tracking import MlflowClient  # (idem)

    _bound_mlflow_waits()

    uri = resolve_tracking_uri(tracking_uri)
    return MlflowClient(tracking_uri=uri), uri


def get_experiment_id(client, name: str, uri: str) -> str:
    """The id of experiment ``name`` in the store at ``uri``: restored when deleted, created when missing (on the
    project's own store with its artifacts beside it)."""
    from mlflow.exceptions import MlflowException  # mlflow is imported only when tracking (about 2 s)

    exp = client.get_experiment_by_name(name)
    if exp is not None:
        if exp.lifecycle_stage == "deleted":
            client.restore_experiment(exp.experiment_id)
        return exp.experiment_id
    location = None
    if uri == default_tracking_uri():
        art = paths.tracking_dir() / "artifacts"
        art.mkdir(parents=True, exist_ok=True)
        location = art.as_uri()
    try:
        return client.create_experiment(name, artifact_location=location)
    except MlflowException:  # created meanwhile by a concurrent run
        exp = client.get_experiment_by_name(name)
        if exp is None:
            raise
        return exp.experiment_id


def track_run(
    kind: str,
    program: str,
    lang: str | None,
    params: Mapping[str, Any],
    metrics: Mapping[str, float],
    artifacts: Iterable[str | os.PathLike] = (),
    tracking_uri: str | None = None,
    step_metrics: Mapping[str, Sequence[tuple[int, float]]] | None = None,
    *,
    tags: Mapping[str, Any] | None = None,
    artifact_dirs: Mapping[str, Iterable[str | os.PathLike]] | None = None,
    status: str = "FINISHED",
    run_name: str | None = None,
    strict: bool = False,
    parent_run_id: str | None = None,
    datasets: Sequence[Mapping[str, Any]] = (),
) -> str | None:
    """Record one finished run in MLflow and return its run id.

    ``kind`` is "optimize" or "evaluate"; ``metrics`` are logged once (non-numbers and NaN are skipped);
    ``step_metrics`` maps a name to ``[(step, value), ...]`` (e.g. per-fold scores); ``artifacts`` are files
    logged at the root, ``artifact_dirs`` maps a folder name inside the run to files. ``status`` is FINISHED,
    FAILED or KILLED. ``parent_run_id`` nests the run under another (the UI shows it as a child run);
    ``datasets`` are logged as MLflow dataset inputs (see :func:`log_datasets`). Tracking never takes a run
    down: with ``strict=False`` (the default) an MLflow error is printed and None returned.
    """
    try:
        with _store_lock(resolve_tracking_uri(tracking_uri)):
            return _track(kind, program, lang, params, metrics, artifacts, tracking_uri, step_metrics, tags,
                          artifact_dirs, status, run_name, parent_run_id, datasets)
    except Exception as e:
        if strict:
            raise
        logger.warning("MLflow tracking failed (%s: %s); the run's files are still on disk", type(e).__name__,
                       str(e)[:300])
        return None


def _track(kind, program, lang, params, metrics, artifacts, tracking_uri, step_metrics, tags, artifact_dirs,
           status, run_name, parent_run_id=None, datasets=()) -> str:
    from mlflow.entities import Metric, Param  # mlflow is imported only when tracking (about 2 s)

    client, uri = open_client(tracking_uri)
    exp_id = get_experiment_id(client, experiment_name(program, lang), uri)
    git = git_commit()
    all_tags = {"halluscope.kind": kind, "halluscope.program": program, "halluscope.lang": lang or "all",
                "git.commit": git.get("commit") or "unknown", "git.dirty": str(git.get("dirty")),
                **{k: v for k, v in (tags or {}).items()}}
    if parent_run_id:
        all_tags["mlflow.parentRunId"] = parent_run_id
    run = client.create_run(exp_id, run_name=run_name or f"{kind}-{program}-{lang}-{time.strftime('%Y%m%d-%H%M%S')}",
                            tags={k: redact(v)[:5000] for k, v in all_tags.items()})
    run_id = run.info.run_id
    try:
        now = int(time.time() * 1000)
        p = redact_params(params)
        plist = [Param(k, v) for k, v in p.items()]
        for i in range(0, len(plist), 100):
            client.log_batch(run_id, params=plist[i:i + 100])
        if datasets:
            log_datasets(client, run_id, datasets)
        mlist = []
        for k, v in metrics.items():
            if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(float(v)):
                continue
            mlist.append(Metric(_clean_key(str(k)), float(v), now, 0))
        for k, series in (step_metrics or {}).items():
            for step, v in series:
                if isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(float(v)):
                    mlist.append(Metric(_clean_key(str(k)), float(v), now, int(step)))
        for i in range(0, len(mlist), 1000):
            client.log_batch(run_id, metrics=mlist[i:i + 1000])
        groups: dict[str | None, list] = {None: list(artifacts or [])}
        for folder, files in (artifact_dirs or {}).items():
            groups.setdefault(folder, []).extend(files)
        for folder, files in groups.items():
            for f in files:
                f = Path(f)
                if not f.is_file():
                    continue
                if _file_has_secret(f):
                    logger.warning("not logging %s to MLflow: it contains an API key or token", f)
                    continue
                client.log_artifact(run_id, str(f), artifact_path=folder)
    except Exception:
        client.set_terminated(run_id, "FAILED")
        raise
    client.set_terminated(run_id, status)
    return run_id


def log_datasets(client, run_id: str, datasets: Sequence[Mapping[str, Any]]) -> None:
    """Log each ``{"name", "split", "content_hash", "n", "source"}`` as an MLflow dataset input of the run.

    The dataset's digest is the first 16 hex digits of ``content_hash`` (MLflow keeps at most 36 characters);
    the full hash, the split and the item count are in its profile, and the split is its context tag (the UI
    shows it beside the dataset's name)."""
    from mlflow.entities import Dataset, DatasetInput, InputTag  # mlflow only when tracking (about 2 s)

    inputs = []
    for d in datasets:
        h = str(d.get("content_hash") or "")
        profile = {"content_hash": h, "split": d.get("split"), "num_rows": d.get("n")}
        ds = Dataset(name=redact(str(d["name"]))[:500], digest=h[:16] or "none", source_type="local",
                     source=redact(json.dumps({"uri": str(d.get("source") or d["name"])})),
                     profile=json.dumps(profile))
        inputs.append(DatasetInput(ds, tags=[InputTag("mlflow.data.context", str(d.get("split") or "train"))]))
    client.log_inputs(run_id, datasets=inputs)


# ------------------------------------------------------------------------------------------------------
# Reading runs back: the compare table and plot
# ------------------------------------------------------------------------------------------------------


def _short_lm(model: str | None) -> str:
    """The LM's short name for tables and legends; a run without one says so in words ("no LM")."""
    if not model or str(model).strip().lower() in ("none", "-"):
        return "no LM"
    try:  # optimize logs a JSON description
        d = json.loads(model)
        if isinstance(d, dict):
            model = d.get("model") or model
    except (ValueError, TypeError):
        pass
    s = str(model).rsplit("/", 1)[-1]
    return s.split("@", 1)[0]


def runs_table(
    tracking_uri: str | None = None,
    *,
    metric: str = "iou",
    program: str | None = None,
    lang: str | None = None,
    kind: str | None = None,
    max_runs: int = 5000,
) -> list[dict]:
    """One row per halluscope run (newest first): kind, program, lang, optimizer, LM, the score on
    ``metric`` (for optimize runs the cross-validated compiled mean, with its sd and the zero-shot mean;
    for evaluate runs the score on the data), test score, LM calls, wall time, run id."""
    client, _ = open_client(tracking_uri)
    name_filter = "name LIKE 'halluscope/%'"
    exps = client.search_experiments(filter_string=name_filter, max_results=1000)
    exps = [e for e in exps if (program is None or e.name.split("/")[1:2] == [program])
            and (lang is None or e.name.split("/")[2:3] == [lang])]
    if not exps:
        return []
    rows = []
    token = None
    mk = metric_key(metric)
    while True:
        page = client.search_runs([e.experiment_id for e in exps], max_results=min(1000, max_runs),
                                  order_by=["attributes.start_time DESC"], page_token=token)
        for r in page:
            t = r.data.tags
            if "mlflow.parentRunId" in t:  # a fold or the final compile of an optimize run: in its parent
                continue
            k = t.get("halluscope.kind", "?")
            if kind is not None and k != kind:
                continue
            p, m = r.data.params, r.data.metrics
            if k == "optimize":
                score, sd = m.get(f"cv/compiled/{mk}"), m.get(f"cv/compiled/{mk}.sd")
                zero = m.get(f"cv/zero_shot/{mk}")
                if score is None:  # no cross-validation: the final program's validation score
                    score = m.get(f"final/val_score") if p.get("metric") == metric else None
            else:
                score, sd, zero = m.get(mk), None, None
            zero_sd = m.get(f"cv/zero_shot/{mk}.sd") if k == "optimize" else None
            if r.info.status != "FINISHED":  # a failed, killed or running run is listed but never ranked
                score = sd = zero = zero_sd = None
            rows.append({
                "run_id": r.info.run_id,
                "start": time.strftime("%Y-%m-%d %H:%M", time.localtime(r.info.start_time / 1000)),
                "status": r.info.status,
                "kind": k,
                "program": t.get("halluscope.program", p.get("program", "?")),
                "lang": t.get("halluscope.lang", "?"),
                "optimizer": p.get("optimizer_desc") or p.get("optimizer") or ("-" if k != "optimize" else "?"),
                "opt_metric": p.get("metric", "-"),
                "lm": _short_lm(p.get("lm") or p.get("task_lm")),
                "source": p.get("source", "-"),
                "n": m.get("n"),
                "score": score,
                "sd": sd,
                "zero_shot": zero,
                "zero_shot_sd": zero_sd,
                "test": m.get(f"test/{mk}"),
                "lm_calls": m.get("lm_calls"),
                "lm_cache_hits": m.get("lm_cache_hits"),
                "lm_tokens": (None if m.get("lm_input_tokens") is None
                              else m["lm_input_tokens"] + m.get("lm_output_tokens", 0.0)),
                "seconds": m.get("seconds"),
            })
        token = page.token
        if not token or len(rows) >= max_runs:
            break
    return rows


def format_table(rows: list[dict], metric: str) -> str:
    def f(v, nd=4):
        return "-" if v is None else f"{v:.{nd}f}"

    head = ["start", "kind", "program", "lang", "data", "optimizer", "LM", "n", f"{metric}", "± sd", "zero-shot",
            "test", "LM calls (cached)", "seconds", "run"]
    body = []
    for r in rows:
        calls = "-" if r["lm_calls"] is None else f"{int(r['lm_calls'])} ({int(r['lm_cache_hits'] or 0)})"
        body.append([r["start"], r["kind"], r["program"], r["lang"], _short_source(r["source"]),
                     _short_opt(r["optimizer"]), r["lm"],
                     "-" if r["n"] is None else str(int(r["n"])),
                     f(r["score"]) if r.get("status", "FINISHED") == "FINISHED" else r["status"],
                     f(r["sd"], 3), f(r["zero_shot"]),
                     f(r["test"]), calls, "-" if r["seconds"] is None else f"{r['seconds']:.0f}", r["run_id"][:8]])
    widths = [max(len(str(x)) for x in col) for col in zip(head, *body)] if body else [len(h) for h in head]
    lines = ["  ".join(str(x).ljust(w) for x, w in zip(head, widths)),
             "  ".join("-" * w for w in widths)]
    lines += ["  ".join(str(x).ljust(w) for x, w in zip(row, widths)) for row in body]
    return "\n".join(lines)


def _short_source(source: str) -> str:
    """``mushroom/de/val/context=native`` -> ``mushroom/val/native``; ``demo/...`` -> ``DEMO/...``."""
    parts = str(source or "-").split("/")
    ctx = [p.split("=", 1)[1] for p in parts if p.startswith("context=")]
    head = [p for p in parts if not p.startswith("context=")]
    if len(head) >= 3:
        head = [head[0], head[2]]
    out = "/".join(head + ctx)
    return out.replace("demo", "DEMO", 1) if out.startswith("demo") else out


def _short_opt(desc: str) -> str:
    return desc if len(desc) <= 48 else desc[:45] + "..."


#: Below this many items a score is marked as resting on few items (``n=3!``) in the plots.
FEW_ITEMS = 10


def metric_range(metric: str) -> tuple[float, float]:
    """The values ``metric`` can take: [-1, 1] for a correlation, [-1, 2] for ``iou+corr``, else [0, 1]."""
    return {"corr": (-1.0, 1.0), "iou+corr": (-1.0, 2.0)}.get(metric, (0.0, 1.0))


def error_bar(value: float, sd: float | None, metric: str) -> tuple[float, float]:
    """(below, above): the sd over folds either side of ``value``, clipped to the metric's range (an IoU of 0.9
    ± 0.3 is drawn from 0.6 to 1.0, never past 1.0)."""
    if sd is None or not math.isfinite(sd) or sd <= 0:
        return 0.0, 0.0
    lo, hi = metric_range(metric)
    return max(0.0, min(sd, value - lo)), max(0.0, min(sd, hi - value))


def is_demo(row: dict) -> bool:
    """A run on the built-in demo set (its scores mean nothing: the plots draw it grey and hatched)."""
    return str(row.get("source", "")).startswith("demo")


def n_text(n) -> str:
    """``n=240``, or ``n=3!`` below :data:`FEW_ITEMS` items; ``n=?`` when the run logged none."""
    if n is None or not isinstance(n, (int, float)) or not math.isfinite(n):
        return "n=?"
    return f"n={int(n)}" + ("!" if n < FEW_ITEMS else "")


def wrap_label(label: str, width: int = 60) -> str:
    """A legend or axis label over several lines instead of cut (``fit (the program's own fit hook …``)."""
    import textwrap

    return "\n".join(textwrap.wrap(label, width, break_long_words=False, break_on_hyphens=False)) or label


def plot_scores(rows: list[dict], metric: str, path: str | os.PathLike) -> Path | None:
    """A grouped bar chart of ``metric`` by language (latest run per series and language) saved as PNG.

    Series: each evaluated program+LM, and for optimize runs the zero-shot and compiled CV means (error bars:
    the sd over folds, clipped to the metric's range). Each bar is labelled with its score and its number of
    items (``n=3!`` below :data:`FEW_ITEMS`); a score of 0 is drawn as a mark on the axis, not an invisible bar;
    demo-data runs are grey and hatched. Returns the path, or None when no run has a score.
    """
    import matplotlib  # only for the optional plot (about 1 s to import)

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt  # after choosing the non-interactive backend

    points: dict[tuple[str, str], tuple[float, float | None, float | None, bool]] = {}
    for r in rows:  # newest first: keep the first seen
        if r["status"] != "FINISHED":
            continue
        demo = " DEMO DATA" if is_demo(r) else ""
        if r["kind"] == "optimize":
            if r["score"] is not None:
                label = f"{r['program']} {_opt_name(r['optimizer'])} [{r['opt_metric']}] ({r['lm']}){demo}"
                points.setdefault((label, r["lang"]), (r["score"], r["sd"], r.get("n"), bool(demo)))
            if r["zero_shot"] is not None:
                points.setdefault((f"{r['program']} zero-shot, CV ({r['lm']}){demo}", r["lang"]),
                                  (r["zero_shot"], r.get("zero_shot_sd"), r.get("n"), bool(demo)))
        elif r["score"] is not None:
            points.setdefault((f"{r['program']} evaluate ({r['lm']}){demo}", r["lang"]),
                              (r["score"], None, r.get("n"), bool(demo)))
    if not points:
        return None
    lo, hi = metric_range(metric)
    langs = sorted({lang for _, lang in points})
    series = sorted({label for label, _ in points})
    fig, ax = plt.subplots(figsize=(max(6.0, 0.35 * len(langs) * len(series) + 2.0), 4.5 + 0.22 * len(series)))
    width = 0.8 / len(series)
    span = hi - lo
    labelled: set[str] = set()  # one legend entry per series
    for i, s in enumerate(series):
        color = plt.cm.tab10(i % 10)
        for j, lang in enumerate(langs):
            if (s, lang) not in points:
                continue
            v, sd, n, demo = points[(s, lang)]
            x = j + (i - (len(series) - 1) / 2) * width
            below, above = error_bar(v, sd, metric)
            style = dict(color="0.75", hatch="//", edgecolor="0.45") if demo else dict(color=color)
            ax.bar([x], [v], width=width, yerr=[[below], [above]], capsize=3,
                   label=None if s in labelled else wrap_label(s), **style)
            labelled.add(s)
            if v == 0:  # a bar of height 0 is invisible: a mark on the axis says the run is there
                ax.plot([x - width * 0.4, x + width * 0.4], [0, 0], color="0.45" if demo else color, linewidth=3,
                        solid_capstyle="butt", zorder=4)
            ax.text(x, max(v, 0) + above + 0.015 * span, f"{v:.3f}\n{n_text(n)}", ha="center", va="bottom",
                    fontsize=6, color="firebrick" if n_text(n).endswith("!") else "black")
    ax.set_xticks(range(len(langs)))
    ax.set_xticklabels(langs)
    ax.set_ylabel(metric)
    ax.set_xlabel("language")
    ax.set_title(f"{metric} by language (latest run per series; error bars: sd over CV folds, within the metric's "
                 f"range; n: items, ! under {FEW_ITEMS})", fontsize=9)
    ax.set_ylim(min(0.0, lo) if any(v < 0 for v, *_ in points.values()) else 0.0, hi + 0.15 * span)
    ax.axhline(hi, color="0.6", linewidth=0.6, linestyle=":")
    ax.legend(fontsize=7, loc="upper center", bbox_to_anchor=(0.5, -0.14), ncol=1, frameon=False)
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=120, bbox_inches="tight")
    plt.close(fig)
    return path


def _opt_name(desc: str) -> str:
    return desc.split("(", 1)[0] if desc and desc not in ("?", "-") else "unknown optimizer"
