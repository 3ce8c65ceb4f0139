"""Scale-out on Ray Data: ``halluscope detect/evaluate --engine ray`` for corpora that outgrow one process.

    halluscope detect --lang de --input rows.parquet --output out.parquet --engine ray --workers 4
    halluscope detect ... --engine ray --address auto          # an existing Ray cluster
    halluscope evaluate --program spans --lang de --engine ray --workers 2

Ray is an optional extra (``pip install "halluscope[ray]"``, ``pip install -e ".[ray]"`` in a checkout) and is imported only here, inside the functions that
run a job: the default engine stays in-process and ``import halluscope.cli`` never imports Ray.

How a detection job runs (:func:`detect_ray`)
---------------------------------------------
* Rows are read by Ray Data (``read_parquet``, or ``read_text`` for JSONL so that a malformed line becomes a
  failed row instead of stopping the job) and mapped in batches by a pool of actors (:class:`DetectWorker`).
* Each actor loads the compiled artifact itself, **by path and content hash** (never a pickled program):
  :func:`halluscope.artifacts.store.load_compiled` verifies the files, then the actor refuses them unless their
  hash equals the one the driver saw. Each actor configures its own LM once (the embedded model: one copy
  per actor). A hosted LM gets one global gate (:class:`LMGate`, a named Ray actor) that every actor's
  DSPy callback passes through, so N workers together keep to the provider's concurrency and rate limit.
* Results come back to the driver in input order (``preserve_order``); each batch is written at once as an
  atomic Parquet part under ``<output>.parts/``, with the contract's fields flattened into columns
  (:data:`OUTPUT_COLUMNS`; spans, labels, units, evidence, failures and notes as JSON strings). A row that fails
  (missing answer, malformed line, program error, or a detection without usable output:
  :func:`halluscope.core.contract.item_failure`) is written with ``ok=false`` and its ``error``.
* At the end the parts are merged, in input order, into ``--output`` (``.parquet``: the flat columns;
  ``.jsonl``: the in-process engine's nested rows plus the LM columns).

Resuming: ``<output>.parts/job.json`` records the artifact's content hash and the input's size. A rerun
with the same output skips every row whose ``id`` is already in a part (so a killed job loses at most the
batches in flight) and refuses (:class:`ResumeError`) when the artifact's hash or the input changed. Rows
without an ``id`` get their 1-based position as id; they cannot be skipped by id, so a rerun recomputes
them and the merge keeps the newest result per position. Delete ``<output>.parts`` to start over.
"""

from __future__ import annotations

import datetime
import importlib
import json
import logging
import os
import threading
import time
import uuid
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Sequence

import dspy
from dspy.utils.callback import BaseCallback

from halluscope.artifacts.store import ArtifactIntegrityError, load_artifact_dir, load_compiled
from halluscope.core.contract import Detection, failure_reason, to_prediction
from halluscope.artifacts.compiled import CompiledDetector, detect
from halluscope.core.fileio import write_text_atomic
from halluscope.core.paths import install_hint
from halluscope.core.signals import stop_on_sigterm
from halluscope.lm.models import configure
from halluscope.lm.usage import LMUsage, UsageMeter
from halluscope.programs.registry import get_program
from halluscope.core.redact import error_text
from halluscope.evaluation.runner import EvalResult, score_predictions

__all__ = [
    "RayOptions",
    "LMConfig",
    "ResumeError",
    "OUTPUT_COLUMNS",
    "LMGate",
    "DetectWorker",
    "EvalWorker",
    "detect_ray",
    "evaluate_ray",
    "flatten_detection",
    "read_output",
]

log = logging.getLogger(__name__)

JOB_FORMAT = "halluscope-ray-detect/1"
JSON_COLUMNS = ("spans", "soft_labels", "hard_labels", "units", "failures", "evidence", "notes")
# The output's columns, in order: the id, success and error, the Detection contract flattened (JSON strings
# for its lists and dicts), LM usage of the row, and the content hash of the artifact that produced it.
OUTPUT_COLUMNS = ("id", "ok", "error", "answer", "spans", "soft_labels", "hard_labels", "label", "score",
                  "units", "rationale", "revision", "failures", "evidence", "notes", "lm_calls", "lm_input_tokens",
                  "lm_output_tokens", "artifact_hash")


class ResumeError(ValueError):
    """An output folder that was started with another artifact or another input."""


@dataclass
class RayOptions:
    """Where and how wide a Ray job runs.

    ``address``: None starts a local Ray (or reuses the one this process already started); "auto" or
    "ray://host:port" joins a cluster. ``workers``: actors in the pool. ``batch_size``: rows per batch (the
    unit that is written, and lost at most when a job is killed). ``cpus_per_worker``: CPUs Ray reserves per
    actor (also the embedded model's threads); use a fraction for a hosted LM. ``lm_concurrency`` /
    ``lm_per_minute``: the global limit on LM calls in flight / started per minute, shared by all actors
    (None: no gate). ``imports``: modules each actor imports first (plugins that register programs).
    """

    address: str | None = None
    workers: int = 2
    batch_size: int = 256
    cpus_per_worker: float = 1.0
    lm_concurrency: int | None = None
    lm_per_minute: float | None = None
    imports: tuple[str, ...] = ()
    progress: bool = True
    verbose: bool = False  # Ray's own logs (INFO, its workers' output, its C++ core's errors) on the console

    def __post_init__(self) -> None:
        if self.workers < 1:
            raise ValueError(f"--workers must be at least 1, not {self.workers}")
        if self.batch_size < 1:
            raise ValueError(f"--batch-size must be at least 1, not {self.batch_size}")
        if self.cpus_per_worker <= 0:
            raise ValueError(f"cpus per worker must be positive, not {self.cpus_per_worker}")
        if self.lm_concurrency is not None and self.lm_concurrency < 1:
            raise ValueError(f"--lm-concurrency must be at least 1, not {self.lm_concurrency}")
        if self.lm_per_minute is not None and not self.lm_per_minute > 0:
            raise ValueError(f"--lm-per-minute must be positive, not {self.lm_per_minute}")
        self.imports = tuple(self.imports)


@dataclass
class LMConfig:
    """What each actor passes to :func:`halluscope.lm.models.configure` (the same arguments as the CLI's LM flags).
    An ``api_key`` given here travels to the actors in their constructor arguments; prefer the provider's
    environment variable on the cluster."""

    lm: str = "local"
    cache_dir: str | None = None
    adapter: str | None = None
    api_base: str | None = None
    api_key: str | None = None
    max_tokens: int = 512
    temperature: float = 0.0
    extra: dict = field(default_factory=dict)

    @classmethod
    def from_args(cls, args) -> "LMConfig":
        return cls(lm=args.lm, cache_dir=args.cache_dir, adapter=args.adapter, api_base=args.api_base,
                   api_key=args.api_key, max_tokens=args.max_tokens, temperature=args.temperature)

    def configure(self, n_threads: int | None = None) -> dspy.LM:
        kwargs = dict(self.extra)
        if self.lm == "local" or self.lm.startswith("local:"):
            kwargs.setdefault("n_threads", n_threads)
        return configure(self.lm, cache_dir=self.cache_dir, adapter=self.adapter, api_base=self.api_base,
                         api_key=self.api_key, max_tokens=self.max_tokens, temperature=self.temperature, **kwargs)


# ------------------------------------------------------------------------------------------------------
# The global LM gate
# ------------------------------------------------------------------------------------------------------


class LMGate:
    """At most ``concurrency`` LM calls in flight and at most ``per_minute`` started per minute (calls are
    spaced evenly, ``60 / per_minute`` seconds apart). Thread-safe; run as one named Ray actor shared by all
    workers, or in-process. ``acquire`` blocks until the call may start; ``release`` ends it."""

    def __init__(self, concurrency: int | None = None, per_minute: float | None = None,
                 clock: Callable[[], float] = time.monotonic, sleep: Callable[[float], None] = time.sleep):
        self.concurrency = concurrency
        self.interval = 60.0 / per_minute if per_minute else 0.0
        self._slots = threading.BoundedSemaphore(concurrency) if concurrency else None
        self._lock = threading.Lock()
        self._next = 0.0
        self._clock, self._sleep = clock, sleep
        self.in_flight = 0
        self.max_in_flight = 0
        self.started = 0

    def acquire(self) -> float:
        """Wait for a slot and for the rate; return the seconds waited."""
        t0 = self._clock()
        if self._slots is not None:
            self._slots.acquire()
        if self.interval:
            with self._lock:
                start = max(self._clock(), self._next)
                self._next = start + self.interval
            delay = start - self._clock()
            if delay > 0:
                self._sleep(delay)
        with self._lock:
            self.in_flight += 1
            self.started += 1
            self.max_in_flight = max(self.max_in_flight, self.in_flight)
        return self._clock() - t0

    def release(self) -> None:
        with self._lock:
            self.in_flight -= 1
        if self._slots is not None:
            self._slots.release()

    def stats(self) -> dict:
        with self._lock:
            return {"started": self.started, "in_flight": self.in_flight, "max_in_flight": self.max_in_flight}


class GateCallback(BaseCallback):
    """A DSPy callback that holds a gate slot around every LM call (cache hits included: they pass quickly).
    ``acquire``/``release`` are plain callables, so the gate can be a Ray actor or an in-process one."""

    def __init__(self, acquire: Callable[[], Any], release: Callable[[], Any]):
        self._acquire, self._release = acquire, release
        self._held: set[str] = set()
        self._lock = threading.Lock()

    def on_lm_start(self, call_id, instance, inputs):
        self._acquire()
        with self._lock:
            self._held.add(call_id)

    def on_lm_end(self, call_id, outputs, exception=None):
        with self._lock:
            held = call_id in self._held
            self._held.discard(call_id)
        if held:
            self._release()


def _ray_gate_callback(gate) -> GateCallback:
    import ray  # optional dependency: only ever imported by a Ray job

    return GateCallback(lambda: ray.get(gate.acquire.remote()), lambda: gate.release.remote())


# ------------------------------------------------------------------------------------------------------
# Flattening and rows
# ------------------------------------------------------------------------------------------------------


def flatten_detection(det: dict) -> dict:
    """A ``Detection.to_dict()`` as flat columns: lists and dicts as JSON strings, the rest as they are."""
    out = {k: det.get(k) for k in OUTPUT_COLUMNS if k in det}
    for k in JSON_COLUMNS:
        if k in out:
            out[k] = json.dumps(out[k], ensure_ascii=False, default=str)
    return out


def _row_id(value: Any) -> str | None:
    if value is None or (isinstance(value, float) and value != value):
        return None
    return str(value)


def _parse_record(raw: dict, fmt: str) -> tuple[dict | None, str | None]:
    """``(record, error)`` of one input row: JSONL rows arrive as ``{"text": line}``."""
    if fmt != "jsonl":
        return raw, None
    try:
        rec = json.loads(raw["text"])
    except json.JSONDecodeError as e:
        return None, f"ValueError: malformed JSON line ({e.msg})"
    if not isinstance(rec, dict):
        return None, f"ValueError: expected a JSON object, got {type(rec).__name__}"
    return rec, None


def _output_schema():
    import pyarrow as pa  # heavy; comes with the datasets dependency

    types = {"ok": pa.bool_(), "label": pa.bool_(), "score": pa.float64(), "lm_calls": pa.int64(),
             "lm_input_tokens": pa.int64(), "lm_output_tokens": pa.int64()}
    fields = [pa.field(c, types.get(c, pa.string())) for c in OUTPUT_COLUMNS]
    return pa.schema([*fields, pa.field("_skip", pa.bool_())])


class DetectWorker:
    """One Ray Data actor of a detection job: loads the artifact at ``artifact_path`` once, refuses it unless
    its content hash is ``content_hash``, configures its own LM once, then maps batches of input rows to
    output rows (:data:`OUTPUT_COLUMNS` plus ``_skip`` for rows whose id was done in an earlier run)."""

    def __init__(self, artifact_path: str, content_hash: str, fmt: str, lang: str | None = None,
                 task: str | None = None, lm: LMConfig | None = None, imports: Sequence[str] = (), done: list | None = None,
                 gate=None, n_threads: int | None = None, extra_inputs: Sequence[str] = (),
                 trust_endpoints: bool = False):
        _import_plugins(imports)
        self.detector = load_artifact(artifact_path, content_hash, trust_endpoints=trust_endpoints)
        self.content_hash = content_hash
        self.fmt = fmt
        self.lang = lang or self.detector.lang
        self.task = task
        self.extra_inputs = tuple(extra_inputs)
        self.done = _resolve(done)
        if lm is not None:
            lm.configure(n_threads=n_threads)
        if gate is not None:  # beside any callbacks already installed
            dspy.configure(callbacks=[*(dspy.settings.callbacks or []), _ray_gate_callback(gate)])
        self.schema = _output_schema()

    def __call__(self, batch):
        import pyarrow as pa  # heavy; comes with the datasets dependency

        rows = [self.one(raw) for raw in batch.to_pylist()]
        return pa.Table.from_pylist(rows, schema=self.schema)

    def one(self, raw: dict) -> dict:
        rec, error = _parse_record(raw, self.fmt)
        row_id = _row_id(rec.get("id")) if rec is not None else None
        base = {"id": row_id, "artifact_hash": self.content_hash, "_skip": False, "lm_calls": 0,
                "lm_input_tokens": 0, "lm_output_tokens": 0}
        if row_id is not None and row_id in self.done:
            return {**base, "_skip": True}
        if error is None:
            answer = rec.get("answer", rec.get("model_output_text"))
            if not isinstance(answer, str):
                error = "ValueError: missing field 'answer' (or 'model_output_text'): no answer string"
        if error is not None:
            return {**base, "ok": False, "error": error}
        meter = UsageMeter()  # this row's calls, in this actor's process; DSPy's history off meanwhile (#21)
        try:
            extra = {k: rec.get(k) for k in self.extra_inputs}
            with meter.counting():
                det = detect(self.detector, answer, question=rec.get("question", rec.get("model_input")) or "",
                             context=rec.get("context") or "", lang=(rec.get("lang") or "").lower() or self.lang,
                             task=self.task, **extra)
            out = {**base, "ok": True, **flatten_detection(det.to_dict())}
            reason = failure_reason(det.failures)
            if reason:  # a detection without usable output (unreadable, truncated, LM error) is a failed row
                out.update(ok=False, error=f"unusable output: {reason}")
        except Exception as e:  # one bad row never stops the job: it is written with its error
            out = {**base, "ok": False, "error": error_text(e)}
        usage = meter.lm_usage()
        out.update(lm_calls=usage.calls, lm_input_tokens=usage.input_tokens, lm_output_tokens=usage.output_tokens)
        return out


def load_artifact(artifact_path: str | os.PathLike, content_hash: str, *,
                  trust_endpoints: bool = False) -> CompiledDetector:
    """Load the artifact version folder ``.../<program>/<lang>/<metric>/vNNNN`` (verified by
    :func:`load_compiled`) and refuse it unless its content hash is ``content_hash``. ``trust_endpoints`` is the
    driver's user's opt-in (``--trust-artifact-endpoints``) for an artifact whose options choose endpoints."""
    path = Path(artifact_path)
    manifest = json.loads((path / "manifest.json").read_text(encoding="utf-8"))
    detector = load_compiled(manifest["program"], lang=manifest["lang"], metric=manifest["metric"],
                             version=path.name, root=path.parents[3], trust_endpoints=trust_endpoints)
    if detector.content_hash != content_hash:
        raise ArtifactIntegrityError(
            f"{path} now hashes to {detector.content_hash[:16]}…, but the job was started with "
            f"{content_hash[:16]}…; the artifact changed during the job; refusing to use it")
    return detector


def _import_plugins(imports: Sequence[str]) -> None:
    for name in imports:
        importlib.import_module(name)


def _resolve(done: list | None) -> frozenset:
    """The done-id set, passed to actors as ``[ObjectRef]`` (one copy in the object store, not one per actor)."""
    if not done:
        return frozenset()
    import ray  # optional dependency: only ever imported by a Ray job

    return ray.get(done[0])


# ------------------------------------------------------------------------------------------------------
# Ray session
# ------------------------------------------------------------------------------------------------------


def _ray():
    try:
        import ray  # optional dependency: only ever imported by a Ray job
    except ImportError:
        raise ImportError(f"--engine ray needs Ray: {install_hint('ray')}") from None
    return ray


def init_ray(opts: RayOptions):
    """Connect to ``opts.address`` or start a local Ray with enough CPU slots for the pool and its reads;
    reuse a session this process already has."""
    ray = _ray()
    if ray.is_initialized():
        return ray
    if not opts.verbose:
        # Ray's C++ core logs errors that are not (an actor killed at shutdown: "Failed to kill actor",
        # "E core_worker.cc"); they stay in Ray's session log files under /tmp/ray. --verbose shows them.
        os.environ.setdefault("RAY_BACKEND_LOG_LEVEL", "fatal")
    kwargs: dict[str, Any] = {"include_dashboard": False, "log_to_driver": opts.verbose,
                              "logging_level": logging.INFO if opts.verbose else logging.WARNING}
    if opts.address:
        ray.init(address=opts.address, **kwargs)
    else:
        cpus = max(os.cpu_count() or 1, int(opts.workers * opts.cpus_per_worker + 0.999) + 1)
        ray.init(num_cpus=cpus, **kwargs)
    return ray


def _start_gate(ray, opts: RayOptions):
    if opts.lm_concurrency is None and opts.lm_per_minute is None:
        return None
    waiting = opts.workers * 4 + 16
    actor = ray.remote(num_cpus=0, max_concurrency=waiting)(LMGate)
    return actor.options(name=f"halluscope-lm-gate-{uuid.uuid4().hex[:8]}").remote(
        opts.lm_concurrency, opts.lm_per_minute)


def _set_context(opts: RayOptions):
    from ray.data import DataContext  # optional dependency: only ever imported by a Ray job

    ctx = DataContext.get_current()
    ctx.execution_options.preserve_order = True
    # Ray Data's own bars count blocks per operator and print nothing useful on a pipe: the driver draws one bar
    # of items instead (:func:`_item_bar`); Ray's show with --verbose
    ctx.enable_progress_bars = opts.progress and opts.verbose
    if hasattr(ctx, "print_on_execution_start"):  # the plan printed when a dataset starts: --verbose only
        ctx.print_on_execution_start = opts.verbose
    if not opts.verbose:  # Ray Data sets its own loggers to INFO when imported ("execution finished in ...")
        for name in ("ray", "ray.data"):
            logging.getLogger(name).setLevel(logging.WARNING)
    return ctx


def _item_bar(opts: RayOptions, total: int, desc: str):
    """The job's progress on stderr, in items (rows), advanced by the driver as each batch arrives from the actors:
    ``detect (ray, 2 workers): 40%|####      | 96/240 [00:12<00:18, 8.0 item/s]``. Off with ``progress=False``."""
    import sys

    from tqdm import tqdm

    return tqdm(total=total, desc=f"{desc} (ray, {opts.workers} worker{'s' if opts.workers != 1 else ''})",
                unit="item", disable=not opts.progress, file=sys.stderr, mininterval=0.5, dynamic_ncols=True)


def actor_cpus(ray, opts: RayOptions) -> float:
    """CPUs Ray reserves per actor: ``opts.cpus_per_worker``, lowered so the pool leaves one CPU of the cluster
    to Ray Data's own tasks (listing and reading files); a pool holding every CPU would wait for them forever."""
    cpus = float(ray.cluster_resources().get("CPU", 0))
    fit = (cpus - 1) / opts.workers
    if fit <= 0:
        raise ValueError(f"the Ray cluster has {cpus:g} CPUs: too few for {opts.workers} workers and the reads")
    if fit < opts.cpus_per_worker:
        log.warning("%d workers x %g CPUs do not fit beside the reads on %g CPUs; reserving %.2f CPUs per worker",
                    opts.workers, opts.cpus_per_worker, cpus, fit)
        return fit
    return opts.cpus_per_worker


def _pool(ray, opts: RayOptions):
    return ray.data.ActorPoolStrategy(size=opts.workers)


# ------------------------------------------------------------------------------------------------------
# detect
# ------------------------------------------------------------------------------------------------------


def input_format(path: str | os.PathLike) -> str:
    name = str(path).lower()
    if name.endswith(".jsonl") or name.endswith(".json"):
        return "jsonl"
    if name.endswith(".parquet") or Path(path).is_dir():
        return "parquet"
    raise ValueError(f"{path}: the Ray engine reads .jsonl or .parquet (a file or a folder of Parquet files)")


def _count_rows(path: Path, fmt: str) -> int:
    """Rows in the input (JSONL: its lines), read from Parquet metadata; a damaged Parquet file is refused here,
    by name, before any work starts."""
    if not path.exists():
        raise FileNotFoundError(f"input not found: {path}")
    if fmt == "jsonl":
        with open(path, "rb") as f:
            return sum(chunk.count(b"\n") for chunk in iter(lambda: f.read(1 << 20), b"")) + 1
    import pyarrow.parquet as pq  # heavy; comes with the datasets dependency

    rows = 0
    for f in sorted(path.rglob("*.parquet")) if path.is_dir() else [path]:
        try:
            rows += pq.ParquetFile(f).metadata.num_rows
        except Exception as e:  # pyarrow raises ArrowInvalid / OSError for damaged files
            raise ValueError(f"{f}: not a readable Parquet file ({type(e).__name__}: {e})") from None
    return rows


def _input_fingerprint(path: Path) -> dict:
    files = sorted(p for p in path.rglob("*") if p.is_file()) if path.is_dir() else [path]
    return {"input": str(path.resolve()), "input_bytes": sum(p.stat().st_size for p in files)}


def parts_dir(out_path: str | os.PathLike) -> Path:
    out = Path(out_path)
    return out.with_name(out.name + ".parts")


def _open_job(parts: Path, job: dict) -> None:
    """Create ``parts/job.json`` or check that this run continues the same job."""
    meta = parts / "job.json"
    if meta.is_file():
        old = json.loads(meta.read_text(encoding="utf-8"))
        if old.get("artifact_hash") != job["artifact_hash"]:
            raise ResumeError(
                f"{parts} was started with artifact hash {str(old.get('artifact_hash'))[:16]}… "
                f"({old.get('artifact')}), but the artifact now hashes to {job['artifact_hash'][:16]}… "
                f"({job['artifact']}): the artifact changed between runs; refusing to mix their rows. "
                f"Write to another --output, or delete {parts} to start over.")
        for key in ("input", "input_bytes"):
            if old.get(key) != job[key]:
                raise ResumeError(f"{parts} was started on {old.get('input')} ({old.get('input_bytes')} bytes), "
                                  f"not {job['input']} ({job['input_bytes']} bytes): the input changed between runs; "
                                  f"write to another --output, or delete {parts} to start over.")
        return
    parts.mkdir(parents=True, exist_ok=True)
    write_text_atomic(meta, json.dumps(job, indent=2) + "\n")


def _part_files(parts: Path) -> list[Path]:
    return sorted(parts.glob("part-*.parquet"))


def _done_ids(parts: Path, retry_failed: bool) -> set[str]:
    import pyarrow.parquet as pq  # heavy; comes with the datasets dependency

    done: set[str] = set()
    for f in _part_files(parts):
        t = pq.read_table(f, columns=["id", "ok"]).to_pydict()
        done.update(i for i, ok in zip(t["id"], t["ok"]) if i is not None and (ok or not retry_failed))
    return done


def _write_part(parts: Path, run: str, seq: int, table) -> Path:
    import pyarrow.parquet as pq  # heavy; comes with the datasets dependency

    path = parts / f"part-{run}-{seq:06d}.parquet"
    tmp = parts / f".{path.name}.tmp"
    pq.write_table(table, tmp)
    os.replace(tmp, path)
    return path


def detect_ray(
    detector: CompiledDetector,
    in_path: str | os.PathLike,
    out_path: str | os.PathLike,
    *,
    opts: RayOptions,
    lm: LMConfig | None = None,
    lang: str | None = None,
    task: str | None = None,
    extra_inputs: Sequence[str] = (),
    retry_failed: bool = False,
    on_batch: Callable[[int], None] | None = None,
    trust_endpoints: bool = False,
) -> dict:
    """Detect on every row of ``in_path`` (JSONL or Parquet) with a pool of Ray actors; write ``out_path``
    (``.parquet`` or ``.jsonl``) in input order. Resumable (see the module docstring).

    ``lm=None`` runs a program that needs no LM. ``on_batch(n_written)`` is called after each part is
    written (tests use it to stop a job mid-way). Returns counts: rows, skipped (done in an earlier run),
    ok, failed, lm_calls, lm_input_tokens, lm_output_tokens, seconds, rows_per_s, output, parts.
    """
    import pyarrow as pa  # heavy; comes with the datasets dependency

    in_path, out_path = Path(in_path), Path(out_path)
    fmt = input_format(in_path)
    if out_path.suffix not in (".parquet", ".jsonl"):
        raise ValueError(f"{out_path}: --output must end in .parquet or .jsonl")
    n_rows = _count_rows(in_path, fmt)
    if not detector.content_hash:
        raise ArtifactIntegrityError(f"{detector.path} has no content hash; the Ray engine loads verified artifacts")
    parts = parts_dir(out_path)
    job = {"format": JOB_FORMAT, "artifact": str(Path(detector.path).resolve()),
           "artifact_hash": detector.content_hash, "program": detector.name, **_input_fingerprint(in_path)}
    _open_job(parts, job)
    finished = finished_job(parts, out_path, retry_failed)
    if finished is not None:  # nothing to do: said from job.json, without starting Ray
        return finished
    done = _done_ids(parts, retry_failed)

    ray = init_ray(opts)
    with stop_on_sigterm():
        stats = _run_detect(ray, opts, detector, in_path, out_path, parts, job, fmt, n_rows, done, lang=lang,
                            task=task, lm=lm, extra_inputs=extra_inputs, on_batch=on_batch,
                            trust_endpoints=trust_endpoints)
    _mark_finished(parts, stats)
    return stats


def finished_job(parts: Path, out_path: Path, retry_failed: bool = False) -> dict | None:
    """The stats of a job ``parts/job.json`` records as finished, when its output is still the file it wrote
    (same size) and nothing is to be retried; else None (the job runs)."""
    meta = parts / "job.json"
    try:
        done = json.loads(meta.read_text(encoding="utf-8")).get("finished")
    except (OSError, ValueError):
        return None
    if not isinstance(done, dict) or not out_path.is_file() or out_path.stat().st_size != done.get("output_bytes"):
        return None
    if retry_failed and done.get("output_failed"):
        return None
    return {"rows": done["output_rows"], "skipped": done["output_rows"], "ok": 0, "failed": 0, "lm_calls": 0,
            "lm_input_tokens": 0, "lm_output_tokens": 0, "seconds": 0.0, "rows_per_s": 0.0,
            "output": str(out_path), "parts": str(parts), "output_rows": done["output_rows"],
            "output_failed": done["output_failed"], "already_finished": True}


def _mark_finished(parts: Path, stats: dict) -> None:
    meta = parts / "job.json"
    job = json.loads(meta.read_text(encoding="utf-8"))
    job["finished"] = {"output_rows": stats["output_rows"], "output_failed": stats["output_failed"],
                       "output_bytes": Path(stats["output"]).stat().st_size,
                       "at": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds")}
    write_text_atomic(meta, json.dumps(job, indent=2) + "\n")


def _run_detect(ray, opts, detector, in_path, out_path, parts, job, fmt, n_rows, done, *, lang, task, lm,
                extra_inputs, on_batch, trust_endpoints) -> dict:
    import pyarrow as pa  # heavy; comes with the datasets dependency

    _set_context(opts)
    gate = _start_gate(ray, opts)
    blocks = {"override_num_blocks": max(1, -(-n_rows // opts.batch_size))}
    ds = (ray.data.read_text(str(in_path), **blocks) if fmt == "jsonl"
          else ray.data.read_parquet(str(in_path), **blocks))
    # Blocks of one batch (streaming; a Parquet row group is otherwise one block, whatever override_num_blocks
    # says): an actor's task is then one batch, the pool shares the work, and the driver writes each batch as it
    # arrives (larger blocks would reach the driver, and be lost on a kill, many batches at a time).
    ds = ds.repartition(target_num_rows_per_block=opts.batch_size)
    ds = ds.map_batches(
        DetectWorker, batch_size=opts.batch_size, batch_format="pyarrow", compute=_pool(ray, opts),
        num_cpus=actor_cpus(ray, opts),
        fn_constructor_kwargs={
            "artifact_path": job["artifact"], "content_hash": detector.content_hash, "fmt": fmt, "lang": lang,
            "task": task, "lm": lm, "imports": opts.imports, "done": [ray.put(frozenset(done))] if done else None,
            "gate": gate, "n_threads": max(1, int(opts.cpus_per_worker)), "extra_inputs": tuple(extra_inputs),
            "trust_endpoints": bool(trust_endpoints)})

    run = datetime.datetime.now(datetime.timezone.utc).strftime("%Y%m%dT%H%M%S") + "-" + uuid.uuid4().hex[:6]
    stats = {"rows": 0, "skipped": 0, "ok": 0, "failed": 0, "lm_calls": 0, "lm_input_tokens": 0,
             "lm_output_tokens": 0, "failed_kinds": {}}
    t0 = time.perf_counter()
    pos = seq = 0
    bar = _item_bar(opts, n_rows, "detect")
    for batch in ds.iter_batches(batch_size=None, batch_format="pyarrow"):
        n = batch.num_rows
        bar.update(n)
        batch = batch.append_column("_pos", pa.array(range(pos, pos + n), type=pa.int64()))
        pos += n
        d = batch.to_pydict()
        keep = [i for i, s in enumerate(d["_skip"]) if not s]
        stats["rows"] += n
        stats["skipped"] += n - len(keep)
        if not keep:
            continue
        table = batch.take(keep).drop_columns(["_skip"])
        ids = [i if i is not None else str(p + 1) for i, p in zip(table["id"].to_pylist(), table["_pos"].to_pylist())]
        table = table.set_column(table.schema.get_field_index("id"), "id", pa.array(ids, type=pa.string()))
        _write_part(parts, run, seq, table)
        seq += 1
        ok = sum(bool(x) for x in table["ok"].to_pylist())
        stats["ok"] += ok
        stats["failed"] += table.num_rows - ok
        for good, err in zip(table["ok"].to_pylist(), table["error"].to_pylist()):
            if not good:
                kind = error_kind(err)
                stats["failed_kinds"][kind] = stats["failed_kinds"].get(kind, 0) + 1
        for k in ("lm_calls", "lm_input_tokens", "lm_output_tokens"):
            stats[k] += sum(table[k].to_pylist())
        if on_batch is not None:
            on_batch(seq)
    bar.total = bar.n  # the row count was an estimate (a JSONL's lines, a last one without a newline counted)
    bar.refresh()
    bar.close()
    seconds = time.perf_counter() - t0
    merged, merged_ok = merge_parts(parts, out_path)
    if gate is not None:
        stats["lm_gate"] = ray.get(gate.stats.remote())
        ray.kill(gate)
    processed = stats["rows"] - stats["skipped"]
    stats.update(seconds=round(seconds, 2), rows_per_s=round(processed / seconds, 1) if seconds else 0.0,
                 output=str(out_path), parts=str(parts), output_rows=merged,
                 output_failed=merged - merged_ok)
    return stats


def error_kind(error: str | None) -> str:
    """The failure kind of a failed row's ``error``: ``parse`` for ``unusable output: parse``, ``error:ValueError``
    for ``ValueError: ...`` (as :func:`halluscope.core.contract.describe_failed` names them)."""
    text = str(error or "")
    if text.startswith("unusable output: "):
        return text[len("unusable output: "):]
    head = text.split(":", 1)[0].strip()
    return f"error:{head}" if head.isidentifier() else "error:unknown"


def _merged_table(parts: Path):
    """All parts in input order, the newest result per position."""
    import pyarrow as pa  # heavy; comes with the datasets dependency
    import pyarrow.parquet as pq

    files = _part_files(parts)
    if not files:
        return pa.Table.from_pylist([], schema=_output_schema().remove(len(OUTPUT_COLUMNS)))
    # parts written before the contract gained `notes` lack that column: it is null there
    table = pa.concat_tables([pq.read_table(f) for f in files], promote_options="default")
    order = pa.array(range(table.num_rows), type=pa.int64())
    table = table.append_column("_seq", order)
    # newest per position: sort by (_pos, _seq desc), then keep the first row of each position
    table = table.sort_by([("_pos", "ascending"), ("_seq", "descending")])
    pos = table["_pos"].to_numpy()
    first = [0] + [i for i in range(1, len(pos)) if pos[i] != pos[i - 1]] if len(pos) else []
    table = table.take(pa.array(first, type=pa.int64())) if len(pos) else table
    return table.select(list(OUTPUT_COLUMNS))


def merge_parts(parts: Path, out_path: Path) -> tuple[int, int]:
    """Write the merged parts to ``out_path`` atomically; return (rows, ok rows)."""
    import pyarrow.parquet as pq  # heavy; comes with the datasets dependency

    table = _merged_table(parts)
    out_path.parent.mkdir(parents=True, exist_ok=True)
    if out_path.suffix == ".parquet":
        tmp = out_path.with_name(f".{out_path.name}.tmp")
        pq.write_table(table, tmp)
        os.replace(tmp, out_path)
    else:
        lines = (json.dumps(_nested(r), ensure_ascii=False, default=str) + "\n" for r in table.to_pylist())
        write_text_atomic(out_path, "".join(lines))
    return table.num_rows, sum(bool(x) for x in table["ok"].to_pylist())


def _nested(row: dict) -> dict:
    """A flat output row as the in-process engine's JSONL row: ``{"id", "ok", ...contract}`` or
    ``{"id", "ok": false, "error"}``, plus the LM usage and artifact hash columns."""
    out = {"id": row["id"], "ok": bool(row["ok"])}
    if not row["ok"]:
        out["error"] = row["error"]
    else:
        for k in OUTPUT_COLUMNS[3:]:
            out[k] = json.loads(row[k]) if k in JSON_COLUMNS and row[k] is not None else row[k]
    for k in ("lm_calls", "lm_input_tokens", "lm_output_tokens", "artifact_hash"):
        out[k] = row[k]
    return out


def read_output(path: str | os.PathLike) -> list[dict]:
    """The rows of a Ray-engine output (Parquet or JSONL) as dicts, JSON columns decoded."""
    path = Path(path)
    if path.suffix == ".jsonl":
        return [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines() if line.strip()]
    import pyarrow.parquet as pq  # heavy; comes with the datasets dependency

    return [_nested(r) for r in pq.read_table(path).to_pylist()]


# ------------------------------------------------------------------------------------------------------
# evaluate
# ------------------------------------------------------------------------------------------------------


class EvalWorker:
    """One Ray Data actor of an evaluation: builds the registered program from its name and build options
    (never a pickled module), configures its own LM once, and runs it on batches of examples (JSON rows)."""

    def __init__(self, program: str, options: dict, lm: LMConfig | None = None, imports: Sequence[str] = (),
                 gate=None, n_threads: int | None = None, extra_inputs: Sequence[str] = (),
                 artifact: tuple[str, str] | None = None, trust_endpoints: bool = False):
        _import_plugins(imports)
        if artifact is not None:  # a compiled artifact, by path and content hash (verified as detect verifies it)
            path, content_hash = artifact
            detector = load_artifact_dir(path, trust_endpoints=trust_endpoints)
            if detector.content_hash != content_hash:
                raise ArtifactIntegrityError(f"{path} now hashes to {detector.content_hash[:16]}…, but the job was "
                                             f"started with {content_hash[:16]}…; refusing to use it")
            self.program = detector.program
        else:
            self.program = get_program(program).make(**options)
        self.extra_inputs = tuple(extra_inputs)
        if lm is not None:
            lm.configure(n_threads=n_threads)
        if gate is not None:  # beside any callbacks already installed
            dspy.configure(callbacks=[*(dspy.settings.callbacks or []), _ray_gate_callback(gate)])

    def __call__(self, batch):
        import pyarrow as pa  # heavy; comes with the datasets dependency

        return pa.Table.from_pylist([self.one(r) for r in batch.to_pylist()])

    def one(self, row: dict) -> dict:
        ex = json.loads(row["example"])
        kwargs = {k: ex.get(k) for k in row["inputs"].split(",") if k}
        kwargs.update({k: ex.get(k) for k in self.extra_inputs})
        meter = UsageMeter()  # this item's calls, in this actor's process; DSPy's history off meanwhile (#21)
        out = {"_pos": row["_pos"], "ok": True, "error": None, "prediction": None}
        try:
            with meter.counting():
                pred = self.program(**kwargs)
            det = pred.get("detection")
            d = det.to_dict() if isinstance(det, Detection) else {}
            extras = {k: v for k, v in pred.items() if k not in d and k != "detection"}
            out["prediction"] = json.dumps({"detection": d, "extra": extras}, ensure_ascii=False, default=str)
        except Exception as e:  # the run goes on; this example is a counted failure
            out.update(ok=False, error=error_text(e))
        usage = meter.lm_usage()
        out.update(lm_calls=usage.calls, lm_input_tokens=usage.input_tokens, lm_output_tokens=usage.output_tokens,
                   lm_cache_hits=usage.cache_hits)
        return out


def evaluate_ray(program: str, options: dict, examples: Sequence[dspy.Example], *, opts: RayOptions,
                 lm: LMConfig | None = None, artifact: tuple[str, str] | None = None,
                 trust_endpoints: bool = False) -> EvalResult:
    """:func:`halluscope.evaluation.runner.run_eval` on a pool of Ray actors: the same :class:`EvalResult` (scores,
    failures, LM usage summed over the actors, predictions in example order). ``artifact`` = ``(version folder,
    content hash)`` runs that compiled artifact instead of the program built from ``options``."""
    spec = get_program(program)
    examples = list(examples)
    ray = init_ray(opts)
    _set_context(opts)
    gate = _start_gate(ray, opts)
    rows = [{"_pos": i, "inputs": ",".join(ex.inputs().keys()),
             "example": json.dumps(ex.toDict(), ensure_ascii=False, default=str)} for i, ex in enumerate(examples)]
    ds = ray.data.from_items(rows).map_batches(
        EvalWorker, batch_size=opts.batch_size, batch_format="pyarrow", compute=_pool(ray, opts),
        num_cpus=actor_cpus(ray, opts),
        fn_constructor_kwargs={"program": program, "options": options, "lm": lm, "imports": opts.imports,
                               "gate": gate, "n_threads": max(1, int(opts.cpus_per_worker)),
                               "extra_inputs": spec.extra_inputs, "artifact": artifact,
                               "trust_endpoints": bool(trust_endpoints)})
    t0 = time.perf_counter()
    out = []
    with _item_bar(opts, len(rows), "evaluate") as bar:
        for b in ds.iter_batches(batch_size=None, batch_format="pyarrow"):
            out.extend(b.to_pylist())
            bar.update(b.num_rows)
    out.sort(key=lambda r: r["_pos"])
    seconds = time.perf_counter() - t0
    if gate is not None:
        ray.kill(gate)
    failures: dict[str, int] = {}
    notes: dict[str, int] = {}
    predictions: list[Any] = []
    errors: list[str] = []
    failed: list[str | None] = []  # per item, as run_eval: why it is a failed item (item_failure)
    usage = LMUsage()
    for ex, r in zip(examples, out):
        usage.calls += r["lm_calls"]
        usage.cache_hits += r["lm_cache_hits"]
        usage.input_tokens += r["lm_input_tokens"]
        usage.output_tokens += r["lm_output_tokens"]
        if not r["ok"]:
            kind = r["error"].split(":", 1)[0]
            failures[f"error:{kind}"] = failures.get(f"error:{kind}", 0) + 1
            errors.append(f"{ex.get('id', '?')}: {r['error']}")
            predictions.append(None)
            failed.append(f"error:{kind}")
            continue
        p = json.loads(r["prediction"])
        pred = to_prediction(Detection.from_dict(p["detection"]), **{
            k: v for k, v in p["extra"].items() if k not in ("spans", "soft_labels", "hard_labels", "label", "score",
                                                            "rationale", "revision", "units", "failures", "notes")})
        for k, v in (pred.get("failures") or {}).items():
            failures[k] = failures.get(k, 0) + int(v)
        for k, v in (pred.get("notes") or {}).items():
            notes[k] = notes.get(k, 0) + int(v)
        predictions.append(pred)
        failed.append(failure_reason(pred.get("failures")))
    result = EvalResult(n=len(examples), scores=score_predictions(examples, predictions), failures=failures,
                        usage=usage, seconds=seconds, predictions=predictions, errors=errors, failed=failed,
                        notes=notes)
    if spec.report is not None:
        try:
            result.report = dict(spec.report(examples, predictions) or {})
        except Exception as e:  # a failing report must not lose the evaluation
            result.report = {"report_error": f"{type(e).__name__}: {e}"}
    return result
