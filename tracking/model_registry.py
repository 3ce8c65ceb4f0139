"""Compiled artifacts in the MLflow model registry, without pickles.

    from halluscope.tracking.model_registry import register_artifact
    mv = register_artifact("compiled/spans/de/iou/v0003", alias="champion")   # -> halluscope-spans-de v1
    detector = load_compiled("models:/halluscope-spans-de@champion")            # verified like a local one

    mlflow models serve -m models:/halluscope-spans-de@champion --env-manager local --port 5002

:func:`register_artifact` verifies the version folder (content hash), logs it as an MLflow *model from code*
— the model's code is :mod:`halluscope.tracking.mlflow_model` (a source file MLflow stores as is), its artifact the
folder's ``program.json`` + ``manifest.json`` — in a run of the experiment ``halluscope/<program>/<lang>``,
registers it as a new version of ``halluscope-<program>-<lang>`` (or ``name``) unless a version with the same
content hash is registered already (that one is reused: registering twice makes no second version), tags the version with the
artifact's content hash, program, language, metric and version, and points ``alias`` at it (an alias moves:
``@champion`` is what production serves). No cloudpickle file is written: requirements are given, not
inferred (inference would load the model and its LM), and the model is never run while logging.
"""

from __future__ import annotations

import importlib.metadata
import logging
import os
import tempfile
import warnings
from dataclasses import dataclass
from pathlib import Path

from halluscope.artifacts import store as artifacts
from halluscope.artifacts.compiled import CompiledDetector

__all__ = ["MODEL_CODE", "RegisteredArtifact", "default_model_name", "register_artifact", "set_alias"]

MODEL_CODE = Path(__file__).with_name("mlflow_model.py")  # the models-from-code file

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class RegisteredArtifact:
    name: str
    version: int
    alias: str | None
    run_id: str
    content_hash: str
    created: bool = True  # False: this artifact (same content hash) was registered already; that version is reused

    @property
    def uri(self) -> str:
        """``models:/NAME@ALIAS`` (or ``models:/NAME/VERSION`` without an alias)."""
        return f"models:/{self.name}@{self.alias}" if self.alias else f"models:/{self.name}/{self.version}"


def default_model_name(program: str, lang: str) -> str:
    return f"halluscope-{program}-{lang}"


def _requirements() -> list[str]:
    out = []
    for dist in ("halluscope", "dspy", "mlflow"):
        try:
            out.append(f"{dist}=={importlib.metadata.version(dist)}")
        except importlib.metadata.PackageNotFoundError:
            out.append(dist)
    return out


def register_artifact(
    artifact: str | os.PathLike | CompiledDetector,
    *,
    name: str | None = None,
    alias: str | None = "champion",
    tracking_uri: str | None = None,
) -> RegisteredArtifact:
    """Register one compiled version folder (or a loaded :class:`CompiledDetector`) as a new MLflow model version.

    Raises :class:`halluscope.artifacts.store.ArtifactIntegrityError` when the folder does not match its hash
    (nothing is registered then).
    """
    import mlflow  # heavy (about 2 s): only when registering
    from mlflow.exceptions import MlflowException
    from mlflow.models import ModelSignature
    from mlflow.tracking import MlflowClient
    from mlflow.types import ColSpec, Schema

    from halluscope.tracking.mlflow_model import ARTIFACT_KEY
    from halluscope.core.paths import resolve_tracking_uri
    from halluscope.tracking.runs import get_experiment_id

    path = Path(artifact.path if isinstance(artifact, CompiledDetector) else artifact)
    manifest, _ = artifacts.verify_artifact(path)
    program, lang, metric, version = (manifest.get(k) for k in ("program", "lang", "metric", "version"))
    name = name or default_model_name(program, lang)
    uri = resolve_tracking_uri(tracking_uri)
    client = MlflowClient(tracking_uri=uri, registry_uri=uri)
    exp_id = get_experiment_id(client, f"halluscope/{program}/{lang}", uri)
    signature = ModelSignature(inputs=Schema([
        ColSpec("string", "answer"), ColSpec("string", "question", required=False),
        ColSpec("string", "context", required=False), ColSpec("string", "lang", required=False),
        ColSpec("string", "id", required=False)]))
    tags = {"halluscope.content_hash": manifest["content_hash"], "halluscope.program": program,
            "halluscope.lang": lang, "halluscope.metric": metric, "halluscope.version": str(version),
            "halluscope.artifact": str(path)}
    existing = _registered_version(client, name, manifest["content_hash"])
    if existing is not None:  # registering the same artifact again is a no-op (the alias still moves)
        if alias:
            client.set_registered_model_alias(name, alias, str(existing.version))
        logger.debug("%s is %s version %s already", path, name, existing.version)
        return RegisteredArtifact(name=name, version=int(existing.version), alias=alias, run_id=existing.run_id,
                                  content_hash=manifest["content_hash"], created=False)
    # The model is saved locally and logged with the client: MLflow's fluent API would need the global tracking
    # and registry URIs changed (and MLflow keeps them in environment variables that subprocesses inherit).
    run = client.create_run(exp_id, run_name=f"register {program}/{lang}/{metric} v{version:04d}",
                            tags={"halluscope.kind": "register", **tags})
    try:
        with tempfile.TemporaryDirectory(prefix="halluscope-register-") as tmp:
            local = Path(tmp) / "model"
            with warnings.catch_warnings():  # MLflow's advice on type hints and input examples: not for users
                warnings.filterwarnings("ignore", category=UserWarning, module=r"mlflow\..*")
                mlflow.pyfunc.save_model(path=str(local), python_model=str(MODEL_CODE),
                                         artifacts={ARTIFACT_KEY: str(path)}, signature=signature,
                                         pip_requirements=_requirements())
            client.log_artifacts(run.info.run_id, str(local), artifact_path="model")
        try:
            client.create_registered_model(name, tags={"halluscope.program": program, "halluscope.lang": lang})
        except MlflowException as e:
            if e.error_code != "RESOURCE_ALREADY_EXISTS":
                raise
        mv = client.create_model_version(name, source=f"{run.info.artifact_uri}/model", run_id=run.info.run_id,
                                         tags=tags, description=f"{path} ({manifest['content_hash'][:12]})")
        mv_version = int(mv.version)
        if alias:
            client.set_registered_model_alias(name, alias, str(mv_version))
    except Exception:
        client.set_terminated(run.info.run_id, "FAILED")
        raise
    client.set_terminated(run.info.run_id, "FINISHED")
    logger.debug("registered %s as %s version %d%s", path, name, mv_version, f" @{alias}" if alias else "")
    return RegisteredArtifact(name=name, version=mv_version, alias=alias, run_id=run.info.run_id,
                              content_hash=manifest["content_hash"])


def _registered_version(client, name: str, content_hash: str):
    """The newest version of registered model ``name`` tagged with ``content_hash`` (None: none, or no such model)."""
    from mlflow.exceptions import MlflowException

    quoted = name.replace("'", "\\'")
    try:
        versions = client.search_model_versions(f"name='{quoted}'")
    except MlflowException:
        return None
    same = [v for v in versions if (v.tags or {}).get("halluscope.content_hash") == content_hash]
    return max(same, key=lambda v: int(v.version), default=None)


def set_alias(name: str, alias: str, version: int, *, tracking_uri: str | None = None) -> None:
    """Point ``alias`` (e.g. ``champion``) of registered model ``name`` at ``version``."""
    from mlflow.tracking import MlflowClient

    from halluscope.core.paths import resolve_tracking_uri

    uri = resolve_tracking_uri(tracking_uri)
    MlflowClient(tracking_uri=uri, registry_uri=uri).set_registered_model_alias(name, alias, str(version))
