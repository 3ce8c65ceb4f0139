"""``halluscope register``: a compiled artifact into the MLflow model registry (a model from code, no pickle).

    halluscope register --program spans --lang de --metric iou              # the best version, @champion
    halluscope register --lang de --version 3 --alias challenger --name my-spans-de

Then ``load_compiled("models:/halluscope-spans-de@champion")`` or
``mlflow models serve -m models:/halluscope-spans-de@champion --env-manager local`` (see
:mod:`halluscope.tracking.model_registry`).
"""

from __future__ import annotations

import sys

from halluscope.artifacts.store import ArtifactError, best_version, list_versions
from halluscope.cli.common import check_tracking
from halluscope.metrics.adapters import METRICS
from halluscope.tracking.model_registry import register_artifact
from halluscope.programs.registry import program_names


def add_parser(subparsers) -> None:
    r = subparsers.add_parser("register", help="register a compiled artifact as an MLflow model (no pickle)")
    r.add_argument("--program", choices=program_names(), default="spans", help="the artifact's program (default spans)")
    r.add_argument("--lang", required=True, metavar="LANG|TASK", help="the artifact's language (or HalluClean task)")
    r.add_argument("--metric", choices=list(METRICS), default="iou",
                   help="the metric the artifact was optimised for (default iou)")
    r.add_argument("--version", default=None, help="the version to register (3 or v0003); default: the best one")
    r.add_argument("--compiled-dir", default=None,
                   help="artifact root to read (default: <home>/compiled, then the artifacts "
                        "bundled with the package; given: only this folder)")
    r.add_argument("--name", default=None, help="registered model name (default halluscope-<program>-<lang>)")
    r.add_argument("--alias", default="champion", help="alias to point at the new version (default champion; "
                                                        "'' for none)")
    r.add_argument("--tracking-uri", default=None,
                   help="MLflow store and registry (default $MLFLOW_TRACKING_URI, else the project's sqlite store)")
    r.set_defaults(func=cmd_register)


def cmd_register(args) -> int:
    versions = [v for v in list_versions(args.program, args.lang, args.metric, root=args.compiled_dir)]
    if args.version is not None:
        wanted = str(args.version).lstrip("v").lstrip("0") or "0"
        chosen = next((v for v in versions if str(v.version) == wanted), None)
    else:
        chosen = best_version(versions)
    if chosen is None:
        print(f"halluscope register: no compiled {args.program} for {args.lang}/{args.metric}"
              f"{' version ' + str(args.version) if args.version else ''}", file=sys.stderr)
        return 2
    check_tracking(args, "register", always=True)  # an unusable store is one line, exit 2, not a traceback
    try:
        reg = register_artifact(chosen.path, name=args.name, alias=args.alias or None, tracking_uri=args.tracking_uri)
    except ArtifactError as e:
        print(f"halluscope register: {e}", file=sys.stderr)
        return 2
    what = "registered" if reg.created else "already registered:"
    alias = f" @{reg.alias}" if reg.alias else ""
    print(f"{what} {chosen.path} as {reg.name} version {reg.version}{alias} (content hash {reg.content_hash[:12]})")
    print(f"load it with load_compiled({reg.uri!r}); serve it with: "
          f"mlflow models serve -m {reg.uri} --env-manager local")
    return 0
