"""``--engine inprocess|ray`` for ``halluscope detect`` and ``halluscope evaluate`` (see :mod:`halluscope.evaluation.scale`).

The arguments, and the Ray side of both commands: the job runs in Ray actors that each build or load the
program and configure their own LM, so no LM is set up in the driver. Ray is imported only when a job runs.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

from halluscope.core import paths
from halluscope.artifacts.store import ArtifactError
from halluscope.cli.common import POSITIVE_INT, THREADS, failed_share_line, ranged
from halluscope.core.contract import describe_failed
from halluscope.programs.registry import get_program, number
from halluscope.evaluation.scale import LMConfig, RayOptions, detect_ray, evaluate_ray, parts_dir


def add_engine_args(p: argparse.ArgumentParser) -> None:
    g = p.add_argument_group("engine")
    g.add_argument("--engine", choices=["inprocess", "ray"], default="inprocess",
                   help="inprocess (the default: threads in this process) or ray (Ray Data actors; the "
                        "ray extra: pip install 'halluscope[ray]')")
    g.add_argument("--address", default=None,
                   help="Ray cluster to join ('auto', 'ray://host:10001'); default: a local Ray on this machine")
    g.add_argument("--workers", type=THREADS, default=2, help="Ray actors, each with its own program and LM (default 2)")
    g.add_argument("--batch-size", type=POSITIVE_INT, default=256,
                   help="rows per Ray batch: the unit written at once, and at most lost when a job is killed")
    g.add_argument("--cpus-per-worker", type=ranged(number(0, 1024, lo_open=True)), default=1.0,
                   help="CPUs Ray reserves per actor (the embedded model's threads); a fraction for a hosted LM")
    g.add_argument("--lm-concurrency", type=THREADS, default=None,
                   help="at most this many LM calls in flight across all Ray actors (a hosted LM's limit)")
    g.add_argument("--lm-per-minute", type=ranged(number(0, lo_open=True)), default=None,
                   help="at most this many LM calls started per minute across all Ray actors")
    g.add_argument("--verbose", action="store_true",
                   help="--engine ray: show Ray's own logs (INFO, its workers' output, its core's errors); by "
                        "default only its warnings (the full logs stay in Ray's session folder under /tmp/ray)")
    g.add_argument("--import", dest="imports", action="append", default=[], metavar="MODULE",
                   help="module every Ray actor imports first (a plugin that registers programs; repeatable)")


def ray_options(args) -> RayOptions:
    """The :class:`RayOptions` of the engine arguments (ValueError on bad values)."""
    return RayOptions(address=args.address, workers=args.workers, batch_size=args.batch_size,
                      cpus_per_worker=args.cpus_per_worker, lm_concurrency=args.lm_concurrency,
                      lm_per_minute=args.lm_per_minute, imports=tuple(args.imports),
                      progress=not args.no_progress, verbose=getattr(args, "verbose", False))


def detect_with_ray(args, detector, *, lang: str | None, task: str | None) -> int:
    """``halluscope detect --engine ray``: exit 1 when more than ``--max-failed-share`` of the output's rows failed
    (by default: any), 0 otherwise, 2 on bad input."""
    print(f"loaded {detector.path} (v{detector.version:04d}, hash {detector.content_hash[:12]})", file=sys.stderr)
    spec = get_program(args.program)
    needs_lm = spec.needs_lm(detector.manifest.get("program_options"))
    out = Path(args.output) if args.output else paths.outputs_dir() / "detect" / time.strftime(
        "%Y%m%d-%H%M%S") / "detections.parquet"
    try:
        stats = detect_ray(detector, args.input, out, opts=ray_options(args), lang=lang, task=task,
                           lm=LMConfig.from_args(args) if needs_lm else None, extra_inputs=spec.extra_inputs,
                           retry_failed=args.retry_failed,
                           trust_endpoints=getattr(args, "trust_artifact_endpoints", False))
    except (OSError, ValueError, ImportError, ArtifactError) as e:  # scale.ResumeError is a ValueError
        print(f"halluscope detect: {e}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:  # Ctrl-C or SIGTERM: every part written so far is whole
        print(f"halluscope detect: interrupted; the rows written so far are kept in {parts_dir(out)}: run the "
              f"same command again to resume", file=sys.stderr)
        return 130
    if stats.get("already_finished"):
        print(f"nothing to do: {stats['output']} is this job's finished output ({stats['output_rows']} rows, "
              f"{stats['output_failed']} failed; --retry-failed reruns those)")
    else:
        print_summary(stats)
    why = describe_failed(stats.get("failed_kinds") or {})
    problem = failed_share_line(stats["output_failed"], stats["output_rows"], args.max_failed_share,
                                why if stats["skipped"] == 0 else "", "rows")
    if problem:
        print(problem, file=sys.stderr)
        return 1
    return 0


def print_summary(stats: dict) -> None:
    done = stats["rows"] - stats["skipped"]
    print(f"{stats['rows']} rows: {stats['skipped']} already done, {done} run now "
          f"({stats['ok']} ok, {stats['failed']} failed) in {stats['seconds']:.1f} s = {stats['rows_per_s']} rows/s; "
          f"LM calls {stats['lm_calls']}, tokens {stats['lm_input_tokens']} in / {stats['lm_output_tokens']} out"
          + (f"; LM gate {stats['lm_gate']}" if "lm_gate" in stats else ""))
    print(f"output: {stats['output']} ({stats['output_rows']} rows, {stats['output_failed']} failed); "
          f"resume state: {stats['parts']}")


def evaluate_with_ray(args, spec, options: dict, examples, artifact=None):
    """``halluscope evaluate --engine ray``: the :class:`EvalResult`, or None after printing a bad-input error.
    With ``artifact`` (a ``CompiledDetector``, ``--artifact``) each actor loads it by path and content hash."""
    try:
        return evaluate_ray(spec.name, options, examples, opts=ray_options(args),
                            lm=LMConfig.from_args(args) if spec.needs_lm(options) else None,
                            artifact=(str(artifact.path), artifact.content_hash) if artifact is not None else None,
                            trust_endpoints=getattr(args, "trust_artifact_endpoints", False))
    except (ValueError, ImportError, ArtifactError) as e:
        print(f"halluscope evaluate: {e}", file=sys.stderr)
        return None
