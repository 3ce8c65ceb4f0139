"""Versioned compiled-program artifacts: write once, verify on load, never unpickle.

Layout (``root`` defaults to :func:`halluscope.core.paths.compiled_dir`, ``./compiled``)::

    compiled/<program>/<lang>/<metric>/v0001/program.json    # DSPy per-predictor state (JSON, no pickle)
    compiled/<program>/<lang>/<metric>/v0001/manifest.json   # what it is, how it was made, how good it is

Writing (:func:`write_artifact`) builds both files in a hidden temp folder beside the versions and renames
the folder to the next free ``vNNNN`` in one ``os.rename``: a version is complete or absent, and an existing
version is never overwritten (renaming onto a non-empty folder fails; the writer then takes the next number).

A program whose state includes binary weights (the ``encoder`` program's trained layers) returns them from
``artifact_files() -> {name: bytes}``: each is written beside ``program.json`` as ``<name>.safetensors`` (no other
kind of file: never a pickle), at most :data:`MAX_FILES_BYTES` in all, and listed in ``manifest["files"]`` with
its SHA-256; on load every listed file must be there and match, and the program gets them through
``load_artifact_files({name: bytes})``.

``manifest["content_hash"]`` is the SHA-256 of ``program.json``'s bytes followed by the canonical JSON of the
manifest without ``content_hash`` (which holds the listed files' hashes); :func:`load_compiled` recomputes it and refuses a mismatch
(:class:`ArtifactIntegrityError`). It then rebuilds the program from the registry with the recorded build
options and checks that every predictor's input/output field names equal the manifest's — DSPy itself loads
fields *by position* and would silently accept a renamed field — refusing a mismatch
(:class:`ArtifactMismatchError`). State is parsed with ``json`` and applied with ``load_state``: no pickle
is ever read, and an LM stored inside a predictor's state is refused.

Two stores are read when no ``root`` is given (:func:`store_roots`): the user's own ``<home>/compiled`` and the
**bundled** one, the served default artifacts that ship inside the package (``halluscope.compiled``, package
data of the wheel; in a clone it is the repository's ``compiled/``). Their versions compete under one serving rule
(:func:`rank_versions`), and version numbers are unique across both (a new version is numbered after the highest
of either), so ``--version N`` names one version. New versions are written only to the user's store.
"""

from __future__ import annotations

import datetime
import hashlib
import json
import os
import re
import shutil
import logging
import subprocess
import tempfile
import uuid
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import dspy
import orjson
from dspy.utils.saving import get_dependency_versions

from halluscope.core import paths
from halluscope.core.redact import redact, redact_obj
from halluscope.artifacts.compiled import CompiledDetector
from halluscope.artifacts.checks import checked_json, checked_state
from halluscope.programs.registry import get_program
from halluscope.core.tasks import HALLUCLEAN_TASKS

__all__ = [
    "ARTIFACT_FORMAT",
    "ArtifactError",
    "ArtifactNotFoundError",
    "ArtifactIntegrityError",
    "ArtifactMismatchError",
    "ArtifactEndpointError",
    "check_endpoint_options",
    "VersionInfo",
    "signature_fields",
    "content_hash",
    "write_artifact",
    "list_versions",
    "load_compiled",
    "load_artifact_dir",
    "read_artifact_files",
    "MAX_FILES_BYTES",
    "load_model_uri",
    "MODEL_URI_PREFIX",
    "verify_artifact",
    "git_commit",
    "selection_score",
    "zero_shot_score",
    "below_zero_shot",
    "comparison_key",
    "Ranked",
    "rank_versions",
    "best_version",
    "is_demo",
    "UNTRACKED_FILE",
    "RETIRED_FILE",
    "retired_reason",
    "untracked_reason",
    "mark_tracked",
    "unchanged",
    "bundled_dir",
    "store_roots",
]

logger = logging.getLogger(__name__)

ARTIFACT_FORMAT = "halluscope-compiled/1"
MODEL_URI_PREFIX = "models:/"  # an MLflow registered model (see halluscope.tracking.model_registry)
PROGRAM_FILE = "program.json"
MANIFEST_FILE = "manifest.json"
# Beside the two files of a version made by a tracked run until its MLflow run is recorded (then removed): a
# version that still has it (the run was interrupted after the artifact became visible, or tracking failed) is
# listed as untracked. Not part of the content hash.
UNTRACKED_FILE = "UNTRACKED"
# A committed version that must no longer be served by default holds this file with the reason (one line). It stays
# loadable with an explicit --version (a caller pinned to it keeps working) and is listed with its reason; it never
# competes in rank_versions. Not part of the content hash: retiring a version does not edit it.
RETIRED_FILE = "RETIRED"
_VERSION_RE = re.compile(r"^v(\d{4,})$")
# The binary files a program may store beside program.json (artifact_files): safetensors only, plain names.
_FILE_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,63}\.safetensors$")
MAX_FILES_BYTES = 16 * 1024 * 1024


class ArtifactError(Exception):
    """Base class of artifact problems."""


class ArtifactNotFoundError(ArtifactError, FileNotFoundError):
    """No (such) version."""


class ArtifactIntegrityError(ArtifactError):
    """The files do not match their content hash (tampered, truncated or hand-edited)."""


class ArtifactMismatchError(ArtifactError):
    """The artifact does not fit the program the code builds today (fields, predictors, program)."""


class ArtifactEndpointError(ArtifactError):
    """The artifact's build options choose an LM, a model server or an endpoint, which would receive the loading
    user's credentials; refused unless the user opts in (``trust_endpoints=True``)."""


# LM settings an artifact may set on an embedded/configured LM ("self", "local"): none of them moves a request.
_SAFE_LM_SETTINGS = {"temperature", "seed", "max_tokens", "top_p", "top_k", "n", "rollout_id", "cache"}


def _chooses_endpoint(value: Any) -> bool:
    """Whether an option value names an LM, server or URL other than the configured LM (``self``) or the embedded
    one (``local``) with harmless settings (:data:`_SAFE_LM_SETTINGS`)."""
    if value is None or isinstance(value, (bool, int, float)):
        return False
    if isinstance(value, str):
        for part in (p.strip() for p in value.split(",") if p.strip()):
            name, _, query = part.partition("?")
            keys = {q.partition("=")[0].strip() for q in query.split("&") if q}
            if name.strip() not in ("self", "local") or not keys <= _SAFE_LM_SETTINGS:
                return True
        return False
    if isinstance(value, dict):
        rest = {k for k in value if k != "lm"}
        return _chooses_endpoint(str(value.get("lm", "self"))) or not rest <= _SAFE_LM_SETTINGS
    if isinstance(value, (list, tuple)):
        return any(_chooses_endpoint(v) for v in value)
    return True


# Retrievers that read only local data (the item's context, a knowledge-base index, files, a triples file).
_LOCAL_RETRIEVERS = {"context", "kb", "files", "kg"}


def _retriever_chooses_endpoint(value: Any) -> bool:
    """Whether a retriever spec (JointCQ's ``retriever``) sends requests somewhere the artifact chose: a search
    spec with a URL (``search:URL``: the search retriever sends ``$HALLUSCOPE_SEARCH_KEY`` there), any URL, or
    a retriever other than the local ones (:data:`_LOCAL_RETRIEVERS`). A bare ``search`` uses the loading
    user's own ``$HALLUSCOPE_SEARCH_URL`` (as MEDICO's ``sources=...,search`` does) and is not refused."""
    if not isinstance(value, str):
        return True
    prefix, _, arg = value.partition(":")
    prefix = prefix.strip().lower()
    if prefix == "search":
        return bool(arg.strip())
    return prefix not in _LOCAL_RETRIEVERS or "://" in value


# How an endpoint option's value is judged, by option name; any other name is an LM/server/URL option.
_ENDPOINT_JUDGES = {"retriever": _retriever_chooses_endpoint}


def check_endpoint_options(spec, options: dict, where: str | os.PathLike = "artifact") -> None:
    """Refuse (:class:`ArtifactEndpointError`) options of ``spec.endpoint_options`` that an artifact set to an
    LM, server or URL other than the program's default or ``self``/``local`` (a ``retriever`` spec: to a search
    URL or a non-local retriever): the manifest's content hash is unkeyed, so anyone who can edit an artifact
    could otherwise send the loading user's API keys anywhere."""
    defaults = spec.options
    bad = [name for name in getattr(spec, "endpoint_options", ())
           if name in options and options[name] != defaults.get(name)
           and _ENDPOINT_JUDGES.get(name, _chooses_endpoint)(options[name])]
    if bad:
        shown = ", ".join(f"{n}={redact(options[n])}" for n in bad)
        raise ArtifactEndpointError(
            f"{where}: the artifact's program options choose where LM or search requests (and the credentials "
            f"from your environment) go: {shown}. Refusing to load it; if you trust this artifact, load it with "
            f"load_compiled(..., trust_endpoints=True) (halluscope detect --trust-artifact-endpoints)")


@dataclass(frozen=True)
class VersionInfo:
    version: int
    path: Path
    created_at: str | None
    score: float | None  # selection score: cross-validated compiled mean of the artifact's metric
    manifest: dict | None  # None when manifest.json is unreadable
    origin: str = "home"  # "home": the user's store (or the root asked for); "bundled": shipped in the package

    @property
    def name(self) -> str:
        return f"v{self.version:04d}"


def bundled_dir() -> Path | None:
    """The folder of the artifacts that ship inside the package (``halluscope.compiled``'s package data: the served
    default versions, one per program/language-or-task/metric), or None when the package has none."""
    return paths.bundled_compiled_dir()


def store_roots(root: str | os.PathLike | None = None) -> list[tuple[Path, str]]:
    """The stores read, as ``(folder, origin)``: ``root`` alone when given; else the user's
    (:func:`halluscope.core.paths.compiled_dir`) then the bundled one (:func:`bundled_dir`), once when both are
    the same folder (a clone run from its root)."""
    if root is not None:
        return [(Path(root), "home")]
    home = paths.compiled_dir()
    out = [(home, "home")]
    bundled = bundled_dir()
    if bundled is not None and _same_folder(bundled, home) is False:
        out.append((bundled, "bundled"))
    return out


def _same_folder(a: Path, b: Path) -> bool:
    try:
        return a.resolve() == b.resolve()
    except OSError:
        return False


# ------------------------------------------------------------------------------------------------------
# Hashing and signatures
# ------------------------------------------------------------------------------------------------------


def canonical_json(obj: Any) -> bytes:
    return json.dumps(obj, sort_keys=True, ensure_ascii=False, separators=(",", ":"), allow_nan=False).encode()


def content_hash(program_bytes: bytes, manifest: dict) -> str:
    """SHA-256 over ``program.json``'s bytes and the canonical manifest without ``content_hash``."""
    body = {k: v for k, v in manifest.items() if k != "content_hash"}
    h = hashlib.sha256()
    h.update(program_bytes)
    h.update(b"\0")
    h.update(canonical_json(body))
    return h.hexdigest()


def signature_fields(program: dspy.Module) -> dict[str, dict]:
    """``{predictor_name: {"signature", "inputs", "outputs"}}`` — the field names, in order, of each predictor."""
    out = {}
    for name, pred in program.named_predictors():
        sig = pred.signature
        out[name] = {
            "signature": getattr(sig, "__name__", type(sig).__name__),
            "inputs": list(sig.input_fields.keys()),
            "outputs": list(sig.output_fields.keys()),
        }
    return out


def selection_score(manifest: dict) -> float | None:
    """The score :func:`load_compiled` ranks versions by: the cross-validated compiled mean of the manifest's
    metric (None when the version was compiled without cross-validation)."""
    try:
        v = manifest["cv"]["mean"]["compiled"][manifest["metric"]]["mean"]
    except (KeyError, TypeError):
        return None
    return float(v) if isinstance(v, (int, float)) else None


def git_commit(cwd: str | os.PathLike | None = None) -> dict:
    """``{"commit": sha or None, "dirty": bool or None}`` of the git checkout at ``cwd`` (default: the home
    folder, see :mod:`halluscope.core.paths`)."""
    cwd = Path(cwd) if cwd is not None else paths.home()
    try:
        sha = subprocess.run(["git", "rev-parse", "HEAD"], cwd=cwd, capture_output=True, text=True,
                             timeout=10).stdout.strip() or None
        dirty = subprocess.run(["git", "status", "--porcelain", "--untracked-files=no"], cwd=cwd,
                               capture_output=True, text=True, timeout=10).stdout.strip() != ""
        return {"commit": sha, "dirty": dirty if sha else None}
    except (OSError, subprocess.SubprocessError):
        return {"commit": None, "dirty": None}


# ------------------------------------------------------------------------------------------------------
# Paths
# ------------------------------------------------------------------------------------------------------


def _safe_part(s: str, what: str) -> str:
    s = str(s)
    if not s or s in (".", "..") or "/" in s or "\\" in s or s.startswith("."):
        raise ValueError(f"invalid {what} for an artifact path: {s!r}")
    return s


def artifact_dir(program: str, lang: str, metric: str, root: str | os.PathLike | None = None) -> Path:
    root = Path(root) if root is not None else paths.compiled_dir()
    return root / _safe_part(program, "program") / _safe_part(lang, "language") / _safe_part(metric, "metric")


def _parse_version(version: int | str) -> int:
    if isinstance(version, bool):
        raise ValueError(f"invalid version {version!r}")
    if isinstance(version, int):
        if version < 1:
            raise ValueError(f"versions start at 1, not {version}")
        return version
    m = re.fullmatch(r"v?(\d+)", str(version).strip())
    if not m or int(m.group(1)) < 1:
        raise ValueError(f"invalid version {version!r}: use a number like 3 or 'v0003'")
    return int(m.group(1))


# ------------------------------------------------------------------------------------------------------
# Writing
# ------------------------------------------------------------------------------------------------------


def _program_bytes(program: dspy.Module) -> bytes:
    """DSPy's ``program.save(x.json)`` format (per-predictor state + dependency versions), with any LM a
    predictor carries removed: production configures its own LM, and an LM state is no place for keys."""
    state = program.dump_state()
    for value in state.values():
        if isinstance(value, dict) and value.get("lm") is not None:
            value["lm"] = None
    state["metadata"] = {"dependency_versions": get_dependency_versions()}
    return orjson.dumps(state, option=orjson.OPT_INDENT_2 | orjson.OPT_APPEND_NEWLINE)


def _program_files(program: dspy.Module) -> dict[str, bytes]:
    """The program's binary files (``artifact_files()``), checked: safetensors names, bytes, within the size cap."""
    get_files = getattr(program, "artifact_files", None)
    files = dict(get_files() or {}) if callable(get_files) else {}
    for name, b in files.items():
        if not isinstance(name, str) or not _FILE_RE.match(name) or name in (PROGRAM_FILE, MANIFEST_FILE):
            raise ArtifactError(f"artifact file name {name!r}: a program may store only NAME.safetensors files")
        if not isinstance(b, (bytes, bytearray)):
            raise ArtifactError(f"artifact file {name}: bytes expected, not {type(b).__name__}")
    total = sum(len(b) for b in files.values())
    if total > MAX_FILES_BYTES:
        raise ArtifactError(f"the program's artifact files hold {total / 2**20:.1f} MiB, more than the "
                            f"{MAX_FILES_BYTES / 2**20:.0f} MiB an artifact version may hold")
    return {k: bytes(v) for k, v in files.items()}


def read_artifact_files(path: str | os.PathLike, manifest: dict) -> dict[str, bytes]:
    """The binary files ``manifest["files"]`` lists in the version folder ``path``, each checked against its
    SHA-256 (:class:`ArtifactIntegrityError` when one is missing, oversized, misnamed or does not match)."""
    path = Path(path)
    listed = manifest.get("files") or {}
    if not isinstance(listed, dict):
        raise ArtifactIntegrityError(f"{path / MANIFEST_FILE}: files must map names to SHA-256; refusing to load")
    out, total = {}, 0
    for name, digest in sorted(listed.items()):
        if not _FILE_RE.match(str(name)) or name in (PROGRAM_FILE, MANIFEST_FILE):
            raise ArtifactIntegrityError(f"{path / MANIFEST_FILE}: artifact file {name!r} is not NAME.safetensors; "
                                         f"refusing to load")
        f = path / name
        if not f.is_file() or f.is_symlink():
            raise ArtifactIntegrityError(f"{path} is not a complete artifact (its manifest lists {name}, which is "
                                         f"missing)")
        total += f.stat().st_size
        if total > MAX_FILES_BYTES:
            raise ArtifactIntegrityError(f"{path}: the artifact files are larger than {MAX_FILES_BYTES >> 20} MiB; "
                                         f"refusing to load")
        b = f.read_bytes()
        if hashlib.sha256(b).hexdigest() != digest:
            raise ArtifactIntegrityError(f"{f} does not match its SHA-256 in the manifest (modified after it was "
                                         f"written, or corrupt); refusing to load. Recompile, or load another version.")
        out[name] = b
    return out


def _write_file(path: Path, data: bytes) -> None:
    with open(path, "xb") as f:
        f.write(data)
        f.flush()
        os.fsync(f.fileno())


def write_artifact(
    program: dspy.Module,
    manifest: dict,
    *,
    program_name: str,
    lang: str,
    metric: str,
    root: str | os.PathLike | None = None,
    untracked: str | None = None,
) -> CompiledDetector:
    """Write ``program``'s state and ``manifest`` as the next version; return it as a :class:`CompiledDetector`.

    ``manifest`` is completed here with ``format``, ``program``, ``lang``, ``metric``, ``version``,
    ``predictors`` (signature field names), ``program_file``, ``program_sha256``, ``created_at`` (if absent)
    and ``content_hash``. The caller's dict is not modified. ``untracked`` (a reason) writes
    :data:`UNTRACKED_FILE` into the version before it becomes visible; :func:`mark_tracked` removes it once the
    run that made it is recorded.
    """
    base = artifact_dir(program_name, lang, metric, root)
    try:
        base.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        raise ArtifactError(f"cannot write an artifact under {base}: {e.strerror or e}") from None
    data = _program_bytes(program)
    files = _program_files(program)
    m = redact_obj(dict(manifest))  # no credential (an API key, user:pass@ in a server URL) is ever written
    if files:
        m["files"] = {name: hashlib.sha256(b).hexdigest() for name, b in sorted(files.items())}
    m.update(format=ARTIFACT_FORMAT, program=program_name, lang=lang, metric=metric,
             predictors=signature_fields(program), program_file=PROGRAM_FILE,
             program_sha256=hashlib.sha256(data).hexdigest())
    m.setdefault("created_at", datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"))
    tmp = base / f".tmp-{uuid.uuid4().hex}"
    tmp.mkdir()
    try:
        _write_file(tmp / PROGRAM_FILE, data)
        for name, b in files.items():
            _write_file(tmp / name, b)
        if untracked:
            _write_file(tmp / UNTRACKED_FILE, (untracked.strip() + "\n").encode())
        version = 0
        for _ in range(1000):
            listed = max((v.version for v in list_versions(program_name, lang, metric, root=root,
                                                           include_invalid=True)), default=0)
            version = max(listed, version) + 1
            m["version"] = version
            m.pop("content_hash", None)
            m["content_hash"] = content_hash(data, m)
            man_path = tmp / MANIFEST_FILE
            if man_path.exists():
                man_path.unlink()
            _write_file(man_path, json.dumps(m, indent=2, ensure_ascii=False, allow_nan=False).encode() + b"\n")
            target = base / f"v{version:04d}"
            if target.exists():
                continue
            try:
                os.rename(tmp, target)  # atomic; fails if a concurrent writer took this number
            except OSError:
                if target.exists():
                    continue
                raise
            _fsync_dir(base)
            return CompiledDetector(program=program, manifest=m, path=target)
        raise ArtifactError(f"could not find a free version number under {base}")
    finally:
        if tmp.exists():
            shutil.rmtree(tmp, ignore_errors=True)


def _marker_text(path: str | os.PathLike, name: str, default: str) -> str | None:
    """The stripped text of the marker file ``name`` in a version folder (``default`` when empty), or None."""
    try:
        text = (Path(path) / name).read_text(encoding="utf-8").strip()
    except OSError:
        return None
    return text or default


def retired_reason(path: str | os.PathLike) -> str | None:
    """Why the version folder ``path`` is retired from the default choice (the text of its :data:`RETIRED_FILE`),
    or None when it is not retired."""
    return _marker_text(path, RETIRED_FILE, "no reason given")


def untracked_reason(path: str | os.PathLike) -> str | None:
    """Why the version folder ``path`` has no MLflow run (the text of its :data:`UNTRACKED_FILE`), or None."""
    return _marker_text(path, UNTRACKED_FILE, "no MLflow run recorded")


def mark_tracked(path: str | os.PathLike) -> None:
    """The run that made the version at ``path`` is recorded in MLflow: remove its :data:`UNTRACKED_FILE`."""
    try:
        (Path(path) / UNTRACKED_FILE).unlink()
    except FileNotFoundError:
        pass


def _fsync_dir(path: Path) -> None:
    try:
        fd = os.open(path, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)


# ------------------------------------------------------------------------------------------------------
# Listing and loading
# ------------------------------------------------------------------------------------------------------


def _read_manifest(path: Path) -> dict | None:
    try:
        m = json.loads((path / MANIFEST_FILE).read_text(encoding="utf-8"))
    except (OSError, ValueError, RecursionError):
        return None
    return m if isinstance(m, dict) else None


def list_versions(program: str, lang: str, metric: str, *, root: str | os.PathLike | None = None,
                  include_invalid: bool = False) -> list[VersionInfo]:
    """The versions of ``<program>/<lang>/<metric>`` in the stores (:func:`store_roots`), oldest first; a bundled
    version whose content hash equals one in the user's store is listed once, as the user's.

    Folders whose manifest cannot be read are listed only with ``include_invalid`` (their ``manifest`` is
    None). Nothing is verified here: :func:`load_compiled` verifies what it loads.
    """
    out: list[VersionInfo] = []
    for folder, origin in store_roots(root):
        base = artifact_dir(program, lang, metric, folder)
        if not base.is_dir():
            continue
        seen = {(v.manifest or {}).get("content_hash") for v in out if v.manifest}
        for p in base.iterdir():
            m_ver = _VERSION_RE.match(p.name)
            if not m_ver or not p.is_dir():
                continue
            man = _read_manifest(p)
            if man is None and not include_invalid:
                continue
            if man is not None and origin == "bundled" and man.get("content_hash") in seen:
                continue
            out.append(VersionInfo(version=int(m_ver.group(1)), path=p, created_at=(man or {}).get("created_at"),
                                   score=selection_score(man) if man else None, manifest=man, origin=origin))
    return sorted(out, key=lambda v: (v.version, v.origin != "home"))


def is_demo(manifest: dict | None) -> bool:
    """Whether a version was compiled on the built-in demo set (its scores mean nothing)."""
    return str((manifest or {}).get("source", "")).startswith("demo")


def zero_shot_score(manifest: dict | None) -> float | None:
    """The cross-validated zero-shot mean of the manifest's metric (the unfitted program on the same folds)."""
    try:
        v = (manifest or {})["cv"]["mean"]["zero_shot"][manifest["metric"]]["mean"]
    except (KeyError, TypeError):
        return None
    return float(v) if isinstance(v, (int, float)) else None


def below_zero_shot(manifest: dict | None) -> bool:
    """Whether the compile made the program worse: its cross-validated compiled score is below the zero-shot one."""
    compiled, zero = selection_score(manifest or {}), zero_shot_score(manifest)
    return compiled is not None and zero is not None and compiled < zero


def comparison_key(manifest: dict | None) -> tuple:
    """What makes two versions' scores comparable: the data they were compiled on (``data.data_hash``; the demo
    set is never comparable with real data, even in manifests without a hash) and the fold scheme (``cv.k``,
    ``cv.seed``; 1 fold = no cross-validation)."""
    m = manifest or {}
    cv = m.get("cv") or {}
    return ((m.get("data") or {}).get("data_hash"), int(cv.get("k") or 1), cv.get("seed"), is_demo(m))


@dataclass(frozen=True)
class Ranked:
    """One version as :func:`rank_versions` judged it: whether it is the one served by default, and why (not)."""

    info: VersionInfo
    best: bool
    why: str
    below_zero_shot: bool = False
    untracked: str | None = None  # why the version has no MLflow run (see UNTRACKED_FILE), or None
    retired: str | None = None  # why the version is no longer served by default (see RETIRED_FILE), or None


def _n_items(m: dict) -> int:
    return int((m.get("data") or {}).get("n") or 0)


def unchanged(manifest: dict | None) -> bool:
    """Whether the compile changed nothing against the zero-shot program (the manifest's ``changes`` is an empty
    list; a manifest without the record claims nothing either way)."""
    return isinstance((manifest or {}).get("changes"), list) and not manifest["changes"]


def missing_reason(manifest: dict | None, installed: set[str] | None = None) -> str | None:
    """Why the program a manifest records cannot run with what is installed (an optional extra it needs, e.g.
    ``grounded -O encoder_prob=true`` without the ``encoder`` extra), or None (also for an unknown program: the
    loader says so). ``installed``: assume exactly these extras are installed instead of checking."""
    if not isinstance(manifest, dict):
        return None
    try:
        spec = get_program(str(manifest.get("program")))
    except Exception:  # noqa: BLE001 — an unknown program is the loader's error, not the ranking's
        return None
    return spec.missing(manifest.get("program_options") or {}, installed)


def rank_versions(versions: list[VersionInfo], metric: str | None = None,
                  installed: set[str] | None = None) -> list[Ranked]:
    """Every version (in the order given) with whether it is the best, and why it is or is not.

    The honest choice (:func:`best_version`): scores compete only among versions compiled on the same data with
    the same fold scheme (:func:`comparison_key`), so first a group of comparable versions is chosen, preferring
    real data to the demo set, then more items, then more folds, then the group that was there first (a new run
    on other data never displaces a version silently: ``detect --list`` says why it is not served; pin it with
    ``--version``). Within the group the highest cross-validated compiled score wins, the newest on ties, except
    that a version whose compiled score is below its zero-shot score (:func:`below_zero_shot`: the compile made
    it worse) loses to any that is not; when every version of the group is below, the best of them is served and
    marked so (:func:`load_compiled` warns). Never served by default (each stays loadable with ``--version``): a
    retired version (:data:`RETIRED_FILE`), an untracked one (:data:`UNTRACKED_FILE`: its optimize run was
    interrupted or not recorded), one whose compile changed nothing against the zero-shot program
    (:func:`unchanged`), and one that needs an extra that is not installed (:func:`missing_reason`; ``installed``:
    assume exactly these extras are)."""
    excluded: dict[Path, str | None] = {}
    for v in versions:
        reason = retired_reason(v.path)
        if reason is not None:
            excluded[v.path] = f"retired ({reason})"
        elif untracked_reason(v.path) is not None:
            excluded[v.path] = "untracked: its optimize run was interrupted or not recorded"
        elif unchanged(v.manifest):
            excluded[v.path] = "the compile changed nothing against the zero-shot program"
        elif (lacking := missing_reason(v.manifest, installed)) is not None:
            excluded[v.path] = f"what it needs is not installed ({lacking})"
    readable = [v for v in versions if v.manifest is not None and v.path not in excluded]
    groups: dict[tuple, list[VersionInfo]] = {}
    for v in readable:
        groups.setdefault(comparison_key(v.manifest), []).append(v)

    def group_rank(members: list[VersionInfo]) -> tuple:
        m = members[0].manifest
        return (not is_demo(m), _n_items(m), comparison_key(m)[1], -min(v.version for v in members))

    def member_rank(v: VersionInfo) -> tuple:
        return (not below_zero_shot(v.manifest), v.score is not None, v.score if v.score is not None else 0.0,
                v.version, v.origin == "home")

    best = None
    if groups:
        chosen_group = max(groups.values(), key=group_rank)
        best = max(chosen_group, key=member_rank)
    out = []
    for v in versions:
        untracked = untracked_reason(v.path)
        if v.manifest is None:
            out.append(Ranked(v, False, "unreadable manifest: never served", untracked=untracked))
            continue
        below = below_zero_shot(v.manifest)
        if v.path in excluded:
            out.append(Ranked(v, False, f"not served: {excluded[v.path]}; pin it with --version {v.version}",
                              below, untracked, retired_reason(v.path)))
            continue
        why = _why(v, best, metric or v.manifest.get("metric") or "score", len(groups[comparison_key(v.manifest)]))
        out.append(Ranked(v, best is not None and v.path == best.path, why, below, untracked))
    return out


def _fmt_score(x: float | None) -> str:
    return "-" if x is None else f"{x:.4f}"


def _why(v: VersionInfo, best: VersionInfo, metric: str, n_comparable: int) -> str:
    m, b = v.manifest, best.manifest
    k, bk = comparison_key(m)[1], comparison_key(b)[1]
    n, bn = _n_items(m), _n_items(b)
    data = "demo" if is_demo(m) else "real"
    below = (f"; BELOW ZERO-SHOT: compiled {metric} {_fmt_score(v.score)} < zero-shot "
             f"{_fmt_score(zero_shot_score(m))}, the unfitted program scored higher" if below_zero_shot(m) else "")
    if v.path == best.path:
        how = ("no other version on the same data and folds" if n_comparable == 1 else
               f"the highest cv {metric} of {n_comparable} comparable versions" if v.score is not None else
               f"the newest of {n_comparable} comparable versions without a cv score")
        return f"served by default: {data} data, {n} items, {k}-fold cv, {how}{below}"
    if comparison_key(m) != comparison_key(b):
        if is_demo(m) and not is_demo(b):
            return f"not served: demo data never displaces a real-data version (v{best.version:04d}){below}"
        if n != bn:
            return (f"not served: compiled on {n} items, v{best.version:04d} on {bn}; scores on other data are not "
                    f"comparable{below}")
        if k != bk:
            return (f"not served: {k}-fold cv, v{best.version:04d} {bk}-fold; scores under other folds are not "
                    f"comparable{below}")
        return (f"not served: other data or folds than v{best.version:04d}, which came first; scores are not "
                f"comparable (pin it with --version {v.version}){below}")
    if below_zero_shot(m) and not below_zero_shot(b):
        return f"not served{below}"
    if v.score is None:
        return f"not served: no cv score (v{best.version:04d} has {_fmt_score(best.score)}){below}"
    if best.score is not None and v.score < best.score:
        return (f"not served: lower cv {metric} ({_fmt_score(v.score)} < {_fmt_score(best.score)}) on the same data "
                f"and folds{below}")
    return f"not served: same cv {metric} as v{best.version:04d}, which is newer{below}"


def best_version(versions: list[VersionInfo], installed: set[str] | None = None) -> VersionInfo | None:
    """The version :func:`load_compiled` serves by default (the honest choice of :func:`rank_versions`;
    ``installed``: as if exactly these extras were installed)."""
    for r in rank_versions(versions, installed=installed):
        if r.best:
            return r.info
    return None


def verify_artifact(path: str | os.PathLike) -> tuple[dict, bytes]:
    """Check one version folder's content hash; return ``(manifest, program_bytes)``.

    Raises :class:`ArtifactIntegrityError` when a file is missing, unreadable or does not match the hash.
    """
    path = Path(path)
    man_file, prog_file = path / MANIFEST_FILE, path / PROGRAM_FILE
    if not man_file.is_file() or not prog_file.is_file():
        raise ArtifactIntegrityError(f"{path} is not a complete artifact (needs {MANIFEST_FILE} and {PROGRAM_FILE})")
    manifest = checked_json(man_file.read_text(encoding="utf-8"), man_file, error=ArtifactIntegrityError)
    if not isinstance(manifest, dict) or manifest.get("format") != ARTIFACT_FORMAT:
        raise ArtifactIntegrityError(
            f"{man_file}: unknown artifact format {manifest.get('format') if isinstance(manifest, dict) else None!r}"
            f" (expected {ARTIFACT_FORMAT!r}); refusing to load")
    if manifest.get("program_file", PROGRAM_FILE) != PROGRAM_FILE:
        raise ArtifactIntegrityError(f"{man_file}: program_file must be {PROGRAM_FILE!r}; refusing to load")
    data = prog_file.read_bytes()
    expected = manifest.get("content_hash")
    actual = content_hash(data, manifest)
    if not expected or expected != actual:
        raise ArtifactIntegrityError(
            f"content hash mismatch in {path}: the manifest says {str(expected)[:16]}…, the files hash to "
            f"{actual[:16]}…. The artifact was modified after it was written (or is corrupt); refusing to load. "
            f"Recompile, or load another version.")
    read_artifact_files(path, manifest)
    return manifest, data


def check_compatible(program: dspy.Module, manifest: dict, state: dict, where: Path) -> None:
    """Refuse (:class:`ArtifactMismatchError`) unless the code's predictors and field names equal the manifest's."""
    code = signature_fields(program)
    saved = manifest.get("predictors") or {}
    problems = []
    if set(code) != set(saved):
        problems.append(f"predictors differ: artifact has {sorted(saved)}, the code builds {sorted(code)}")
    for name in sorted(set(code) & set(saved)):
        for kind in ("inputs", "outputs"):
            if list(saved[name].get(kind, [])) != code[name][kind]:
                problems.append(f"{name}: {kind[:-1]} fields were {saved[name].get(kind)} when compiled, "
                                f"the code now has {code[name][kind]}")
    for name in code:
        st = state.get(name)
        if not isinstance(st, dict):
            problems.append(f"{name}: no state in {PROGRAM_FILE}")
            continue
        n_fields = len(code[name]["inputs"]) + len(code[name]["outputs"])
        saved_fields = (st.get("signature") or {}).get("fields") or []
        if len(saved_fields) != n_fields:
            problems.append(f"{name}: {PROGRAM_FILE} holds {len(saved_fields)} fields, the signature has {n_fields}")
        if st.get("lm") is not None:
            problems.append(f"{name}: {PROGRAM_FILE} carries an LM; artifacts never do (refusing to load it)")
    own = set(program.dump_state()) - set(code)  # state the program saves besides predictors (fitted parameters)
    if own - set(state):
        problems.append(f"{PROGRAM_FILE} lacks the program's own state {sorted(own - set(state))}")
    extra = sorted(k for k in state if k != "metadata" and k not in code and k not in own)
    if extra:
        problems.append(f"{PROGRAM_FILE} has state for predictors the code does not build: {extra}")
    if problems:
        raise ArtifactMismatchError(
            f"artifact {where} does not match the current code ({manifest.get('program')}):\n  - "
            + "\n  - ".join(problems) + "\nRecompile with optimize.py for the current code.")


def load_compiled(
    program: str = "spans",
    *,
    lang: str | None = None,
    metric: str | None = None,
    version: int | str | None = None,
    root: str | os.PathLike | None = None,
    tracking_uri: str | None = None,
    trust_endpoints: bool = False,
    options: dict | None = None,
) -> CompiledDetector:
    """Load the best (or the pinned ``version``) compiled ``program`` for ``lang``/``metric``, verified.
    Configure an LM (:func:`halluscope.configure`) before calling it.

    An artifact whose options choose an LM, model server or URL (a FINCH-ZK sampler, MEDICO's search endpoint,
    JointCQ's ``search:URL`` retriever)
    other than the configured/embedded LM is refused (:class:`ArtifactEndpointError`) unless
    ``trust_endpoints=True``: the content hash detects accidental damage, not a deliberate edit.

    Example::

        from halluscope import configure, detect, load_compiled
        configure("local")
        detector = load_compiled("spans", lang="de", metric="iou")
        det = detect(detector, "Die spanische Provinz heißt Álava.", question="...")

    ``program`` may instead be an MLflow registered-model URI, ``models:/halluscope-spans-de@champion`` or
    ``models:/halluscope-spans-de/3`` (see :func:`load_model_uri`; ``tracking_uri`` names the store, default
    as for tracking); ``lang``/``metric``/``version``, when given, must then match what is registered.

    ``options``: build options to change at load time, only those the program declares safe to change
    (``ProgramSpec.load_options``: a knowledge base, files, retriever settings); any other is refused by name
    (:class:`LoadOptionError`, a ValueError). The manifest copy of the loaded detector records them under
    ``load_options``.

    Raises :class:`ArtifactNotFoundError`, :class:`ArtifactIntegrityError` (hash),
    :class:`ArtifactMismatchError` (signature/program) — never loads anything unverified.
    """
    if str(program).startswith(MODEL_URI_PREFIX):
        expect = {k: v for k, v in (("lang", lang), ("metric", metric)) if v is not None}
        if version is not None:
            expect["version"] = _parse_version(version)
        return load_model_uri(program, tracking_uri=tracking_uri, expect=expect, trust_endpoints=trust_endpoints,
                              options=options)
    if lang is None or metric is None:
        raise ValueError(f"load_compiled({program!r}) needs lang= and metric= (or a models:/ URI as program)")
    base = artifact_dir(program, lang, metric, root)
    versions = list_versions(program, lang, metric, root=root, include_invalid=True)
    if version is not None:
        wanted = _parse_version(version)
        chosen = next((v for v in versions if v.version == wanted), None)
        if chosen is None:
            have = ", ".join(v.name for v in versions) or "none"
            raise ArtifactNotFoundError(f"no version v{wanted:04d} under {base} (versions: {have})")
    else:
        ranked = rank_versions([v for v in versions if v.manifest is not None], metric)
        chosen = next((r.info for r in ranked if r.best), None)
        if chosen is None and ranked:
            raise ArtifactNotFoundError(
                f"no version of {program!r} for lang={lang!r}, metric={metric!r} is served by default: "
                + "; ".join(f"{r.info.name}: {r.why}" for r in ranked))
        if chosen is None:
            where = " or ".join(str(artifact_dir(program, lang, metric, r)) for r, _ in store_roots(root))
            raise ArtifactNotFoundError(
                f"no compiled {program!r} for lang={lang!r}, metric={metric!r} under {where}; "
                f"run: {paths.optimize_command()} --program {program} {'--task' if lang in HALLUCLEAN_TASKS else '--lang'} "
                f"{lang} --metric {metric}")
        if below_zero_shot(chosen.manifest):
            logger.warning("%s: served by default, but its cross-validated compiled %s (%.4f) is below its zero-shot "
                           "score (%.4f): the unfitted program scored higher on the same folds (recompile, or pin "
                           "another version)", chosen.path, metric, chosen.score, zero_shot_score(chosen.manifest))
    return load_artifact_dir(chosen.path, expect={"program": program, "lang": lang, "metric": metric,
                                                  "version": chosen.version}, trust_endpoints=trust_endpoints,
                             options=options)


class LoadOptionError(ValueError):
    """A build option that cannot be changed when an artifact is loaded (or is unknown)."""


def check_load_options(spec, overrides: dict | None) -> dict:
    """``overrides`` if every name is one of ``spec.load_options``; else :class:`LoadOptionError` naming it."""
    overrides = dict(overrides or {})
    refused = sorted(k for k in overrides if k not in spec.load_options)
    if refused:
        allowed = ", ".join(spec.load_options) or "none"
        kind = "unknown option" if any(k not in spec.options for k in refused) else "option"
        raise LoadOptionError(f"{spec.name}: {kind}{'s' if len(refused) > 1 else ''} {', '.join(refused)} cannot "
                              f"be set when loading a compiled artifact (only at optimize time); options that "
                              f"can: {allowed}")
    return overrides


def load_artifact_dir(path: str | os.PathLike, *, expect: dict | None = None,
                      trust_endpoints: bool = False, options: dict | None = None) -> CompiledDetector:
    """Load one version folder (``program.json`` + ``manifest.json``) with every check :func:`load_compiled`
    makes: the content hash, the manifest's keys against ``expect`` (e.g. ``{"program": "spans", "lang":
    "de"}``), the build options, and the predictors' field names against the code."""
    path = Path(path)
    manifest, data = verify_artifact(path)
    for key, want in (expect or {}).items():
        if manifest.get(key) != want:
            raise ArtifactMismatchError(f"{path}: manifest says {key}={manifest.get(key)!r}, "
                                        f"expected {want!r}; refusing to load")
    chosen = VersionInfo(version=int(manifest.get("version") or 0), path=path,
                         created_at=manifest.get("created_at"), score=selection_score(manifest), manifest=manifest)
    try:
        spec = get_program(str(manifest.get("program")))
    except KeyError as e:
        raise ArtifactMismatchError(str(e)) from None
    overrides = check_load_options(spec, options)
    options = {**(manifest.get("program_options") or {}), **overrides}
    if not trust_endpoints:  # before anything is built from the options
        check_endpoint_options(spec, options, chosen.path)
    try:
        module = spec.make(**options)
    except (TypeError, ValueError) as e:  # ValueError: includes UnknownOptionError naming the valid options
        raise ArtifactMismatchError(
            f"{chosen.path}: the code no longer accepts the build options {options}: {e}") from None
    state = checked_state(data, chosen.path / PROGRAM_FILE, error=ArtifactIntegrityError)  # finite, in range
    check_compatible(module, manifest, state, chosen.path)
    _warn_versions(state, chosen.path)
    module.load_state({k: v for k, v in state.items() if k != "metadata"})
    files = read_artifact_files(chosen.path, manifest)
    load_files = getattr(module, "load_artifact_files", None)
    if files and not callable(load_files):
        raise ArtifactMismatchError(f"{chosen.path}: the artifact holds {', '.join(files)}, which program "
                                    f"{manifest.get('program')!r} does not read; refusing to load")
    if callable(load_files):
        try:
            load_files(files)
        except ValueError as e:
            raise ArtifactMismatchError(f"{chosen.path}: {e}") from None
    if overrides:  # a copy: the manifest on disk (and its hash) is what was compiled
        manifest = {**manifest, "program_options": options, "load_options": overrides}
    return CompiledDetector(program=module, manifest=manifest, path=chosen.path)


def load_model_uri(uri: str, *, tracking_uri: str | None = None, expect: dict | None = None,
                   dst: str | os.PathLike | None = None, trust_endpoints: bool = False,
                   options: dict | None = None) -> CompiledDetector:
    """Load a compiled artifact registered in MLflow (``models:/NAME@ALIAS`` or ``models:/NAME/VERSION``).

    The model's files are downloaded (to ``dst``, default a new temporary folder), its JSON state and manifest
    found inside, and loaded by :func:`load_artifact_dir` with all of its checks; the registered model
    version's ``halluscope.content_hash`` tag must equal the manifest's. Nothing is unpickled: the MLflow
    model's Python code is not even imported here (only files are read). ``tracking_uri`` defaults as for
    tracking (``$MLFLOW_TRACKING_URI``, else the project's SQLite store) and is also the registry.
    """
    import mlflow  # heavy (about 2 s): only for models:/ URIs
    from mlflow.exceptions import MlflowException
    from mlflow.tracking import MlflowClient

    uri_store = paths.resolve_tracking_uri(tracking_uri, create=False)  # a reader: makes no store folder
    name, ref = _parse_model_uri(uri)
    client = MlflowClient(tracking_uri=uri_store, registry_uri=uri_store)
    try:
        mv = client.get_model_version_by_alias(name, ref[1:]) if ref.startswith("@") else \
            client.get_model_version(name, ref)
        # the version's source directly: MLflow resolves models:/ URIs with the *global* registry URI
        local = mlflow.artifacts.download_artifacts(
            artifact_uri=client.get_model_version_download_uri(name, mv.version),
            dst_path=str(dst or tempfile.mkdtemp(prefix="halluscope-model-")), tracking_uri=uri_store)
    except MlflowException as e:
        raise ArtifactNotFoundError(f"cannot load {uri} from {uri_store}: {str(e)[:300]}") from None
    found = sorted(Path(local).glob(f"artifacts/*/{MANIFEST_FILE}"))
    if len(found) != 1:
        raise ArtifactIntegrityError(f"{uri} (version {mv.version}) holds {len(found)} halluscope artifacts "
                                     f"under artifacts/; expected exactly one; refusing to load")
    detector = load_artifact_dir(found[0].parent, expect=expect, trust_endpoints=trust_endpoints, options=options)
    registered = (mv.tags or {}).get("halluscope.content_hash")
    if registered != detector.content_hash:
        raise ArtifactIntegrityError(
            f"{uri} (version {mv.version}): the registry records content hash {str(registered)[:16]}…, the files "
            f"hold {detector.content_hash[:16]}…; refusing to load")
    return detector


def _parse_model_uri(uri: str) -> tuple[str, str]:
    """``models:/NAME@ALIAS`` -> ``(NAME, "@ALIAS")``; ``models:/NAME/3`` -> ``(NAME, "3")``."""
    rest = uri[len(MODEL_URI_PREFIX):].strip("/")
    if "@" in rest:
        name, alias = rest.rsplit("@", 1)
        if name and alias and "/" not in name:
            return name, "@" + alias
    else:
        name, _, ver = rest.partition("/")
        if name and ver.isdigit():
            return name, ver
    raise ValueError(f"invalid model URI {uri!r}: use models:/NAME@ALIAS or models:/NAME/VERSION")


#: the recorded versions whose difference can change what a loaded artifact does: DSPy's (it reads the saved
#: signatures and demos). The Python minor version and cloudpickle's, which DSPy records too, cannot: the state is
#: JSON, never a pickle, so the bundled artifacts load the same on every Python the package supports, silently.
VERSIONS_THAT_MATTER = ("dspy",)


def _warn_versions(state: dict, where: Path) -> None:
    saved = ((state.get("metadata") or {}).get("dependency_versions")) or {}
    now = get_dependency_versions()
    diff = {k: (v, now.get(k)) for k, v in saved.items() if k in VERSIONS_THAT_MATTER and now.get(k) != v}
    if diff:
        logger.warning("%s was compiled with %s; running with %s", where,
                       ", ".join(f"{k}=={a}" for k, (a, _) in diff.items()),
                       ", ".join(f"{k}=={b}" for k, (_, b) in diff.items()))
