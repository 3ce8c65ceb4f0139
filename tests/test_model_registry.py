"""Compiled artifacts in the MLflow model registry: a model from code (no pickle written or read), aliases,
``load_compiled("models:/...")`` with the hash and signature checks, and ``mlflow models serve`` offline."""

from __future__ import annotations

import glob
import json
import os
import pickle
import signal
import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path

import pytest
from mlflow.tracking import MlflowClient

from halluscope.artifacts import store as A
from halluscope.cli.ui import OFFLINE_ENV, free_port
from halluscope.tracking.model_registry import MODEL_CODE, register_artifact
from halluscope.optimize.run import run_optimize
from halluscope.programs.registry import get_program
from tests.test_optimize_stages import PROGRAM, _config, _examples, fit_program  # noqa: F401  (fixture)


@pytest.fixture
def store(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)  # MLflow's default artifact root (./mlruns) lands in the temp folder
    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    return f"sqlite:///{tmp_path / 'mlflow.db'}"


def _no_unpickling(monkeypatch):
    import cloudpickle

    def refuse(*a, **k):
        raise AssertionError("something was unpickled")

    for mod in (pickle, cloudpickle):
        monkeypatch.setattr(mod, "load", refuse)
        monkeypatch.setattr(mod, "loads", refuse)


def test_register_load_by_alias_without_pickles(tmp_path, store, fit_program, monkeypatch):  # noqa: F811
    res = run_optimize(_config(tmp_path), _examples(8))
    art = res.artifact
    reg = register_artifact(art.path, tracking_uri=store)
    assert (reg.name, reg.version, reg.alias) == (f"halluscope-{PROGRAM}-de", 1, "champion")
    assert reg.uri == f"models:/halluscope-{PROGRAM}-de@champion"

    client = MlflowClient(store, registry_uri=store)
    mv = client.get_model_version_by_alias(reg.name, "champion")
    assert int(mv.version) == 1 and mv.tags["halluscope.content_hash"] == art.content_hash
    assert mv.tags["halluscope.metric"] == "f1" and mv.tags["halluscope.version"] == "1"

    _no_unpickling(monkeypatch)
    loaded = A.load_compiled(reg.uri, tracking_uri=store)
    assert loaded.content_hash == art.content_hash and loaded.manifest == art.manifest
    assert loaded.program.threshold == art.program.threshold == res.final_info["threshold"]
    model_dir = loaded.path.parent.parent
    files = {str(Path(p).relative_to(model_dir)) for p in glob.glob(f"{model_dir}/**", recursive=True)
             if Path(p).is_file()}
    assert {"MLmodel", "mlflow_model.py", "artifacts/v0001/program.json", "artifacts/v0001/manifest.json"} <= files
    assert not [f for f in files if f.endswith((".pkl", ".pickle", ".cloudpickle"))]
    assert (model_dir / "mlflow_model.py").read_text() == MODEL_CODE.read_text()  # the model is this code
    assert "loader_module: mlflow.pyfunc.loaders.code_model" in (model_dir / "MLmodel").read_text()

    # MLflow's own loader runs the code and the same checks; nothing is unpickled there either
    import mlflow.pyfunc

    monkeypatch.setenv("MLFLOW_TRACKING_URI", store)
    monkeypatch.setenv("MLFLOW_REGISTRY_URI", store)
    model = mlflow.pyfunc.load_model(f"models:/{reg.name}/1")
    (short, long_) = model.predict([{"answer": "short", "id": "a"}, {"answer": "x" * 200}])
    assert short == {**short, "id": "a", "ok": True, "label": False}
    assert long_["ok"] and long_["label"] is True and long_["id"] == "1"

    # a pinned version and the manifest keys are checked like a local load
    assert A.load_compiled(f"models:/{reg.name}/1", tracking_uri=store, lang="de", metric="f1").version == 1
    with pytest.raises(A.ArtifactMismatchError, match="lang"):
        A.load_compiled(reg.uri, tracking_uri=store, lang="en")
    with pytest.raises(A.ArtifactNotFoundError):
        A.load_compiled(f"models:/{reg.name}@nope", tracking_uri=store)
    with pytest.raises(ValueError, match="models:/NAME@ALIAS"):
        A.load_compiled("models:/just-a-name", tracking_uri=store)


def test_alias_moves_and_tampered_model_is_refused(tmp_path, store, fit_program):  # noqa: F811
    first = run_optimize(_config(tmp_path), _examples(8)).artifact
    second = run_optimize(_config(tmp_path), _examples(8, offset=3)).artifact
    r1 = register_artifact(first.path, tracking_uri=store)
    r2 = register_artifact(second, tracking_uri=store)  # a CompiledDetector works too
    assert (r1.version, r2.version) == (1, 2)
    assert A.load_compiled(r2.uri, tracking_uri=store).version == 2  # @champion moved to the new version
    assert A.load_compiled(f"models:/{r1.name}/1", tracking_uri=store).content_hash == first.content_hash

    # the command: the best local version (highest CV score; the newest on ties) under another alias
    from halluscope.cli import main

    assert main(["register", "--program", PROGRAM, "--lang", "de", "--metric", "f1", "--compiled-dir",
                 str(tmp_path / "compiled"), "--alias", "prod", "--tracking-uri", store]) == 0
    best = A.load_compiled(PROGRAM, lang="de", metric="f1", root=tmp_path / "compiled")
    via_cli = A.load_compiled(f"models:/{r1.name}@prod", tracking_uri=store)
    assert via_cli.content_hash == best.content_hash and via_cli.manifest["version"] == best.version
    assert main(["register", "--program", PROGRAM, "--lang", "en", "--metric", "f1", "--compiled-dir",
                 str(tmp_path / "compiled"), "--tracking-uri", store]) == 2

    # edit the stored manifest of version 1: its hash no longer matches, and loading refuses
    (stored,) = glob.glob(str(tmp_path / f"mlruns/*/{r1.run_id}/**/v0001/manifest.json"), recursive=True)
    m = json.loads(Path(stored).read_text())
    m["lang"] = "en"
    Path(stored).write_text(json.dumps(m))
    with pytest.raises(A.ArtifactIntegrityError, match="content hash mismatch"):
        A.load_compiled(f"models:/{r1.name}/1", tracking_uri=store)

    # a broken artifact is never registered
    bad = tmp_path / "compiled" / PROGRAM / "de" / "f1" / "v0002" / "program.json"
    bad.write_text(bad.read_text().replace("}", " }", 1))
    with pytest.raises(A.ArtifactIntegrityError):
        register_artifact(bad.parent, tracking_uri=store)


def _post(url: str, body: dict) -> dict:
    req = urllib.request.Request(url, data=json.dumps(body).encode(), headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=10) as r:
        return json.loads(r.read())


def test_mlflow_models_serve_offline(tmp_path, store):
    """``mlflow models serve --env-manager local`` on the registered alias (a program without an LM)."""
    art = A.write_artifact(get_program("mark-all").make(), {"source": "fixture"}, program_name="mark-all", lang="de",
                           metric="iou", root=tmp_path / "compiled")
    reg = register_artifact(art.path, tracking_uri=store)
    port = free_port()
    env = {**os.environ, **OFFLINE_ENV, "MLFLOW_TRACKING_URI": store, "MLFLOW_REGISTRY_URI": store,
           "NO_PROXY": "*", "no_proxy": "*",  # the server runs uvicorn from the environment's bin folder
           "PATH": os.pathsep.join([str(Path(sys.executable).parent), os.environ.get("PATH", "")])}
    proc = subprocess.Popen([sys.executable, "-m", "mlflow", "models", "serve", "-m", reg.uri, "--env-manager",
                             "local", "--host", "127.0.0.1", "--port", str(port), "--workers", "1"],
                            env=env, cwd=tmp_path, stdout=subprocess.DEVNULL, stderr=subprocess.STDOUT,
                            start_new_session=True)
    try:
        deadline, out = time.time() + 240, None
        body = {"dataframe_records": [{"answer": "Die Provinz heißt Álava.", "id": "a1"}, {"answer": "Berlin"}]}
        while time.time() < deadline and proc.poll() is None:
            try:
                out = _post(f"http://127.0.0.1:{port}/invocations", body)
                break
            except (urllib.error.URLError, ConnectionError, OSError):
                time.sleep(1)
        assert proc.poll() is None, "mlflow models serve exited"
        assert out is not None, "the model server did not answer within 240 s"
        first, second = out["predictions"]
        assert first["id"] == "a1" and first["ok"] and first["hard_labels"] == [[0, 24]]
        assert second["ok"] and second["hard_labels"] == [[0, 6]]
    finally:
        os.killpg(proc.pid, signal.SIGTERM)
        try:
            proc.wait(timeout=15)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()


def _serve_app(argv, monkeypatch):
    """``halluscope serve ARGV`` up to the point where uvicorn would start: (exit status, the app it would serve)."""
    import uvicorn

    from halluscope.cli import build_parser

    started = {}
    monkeypatch.setattr(uvicorn, "run", lambda app, **kw: started.update(app=app, **kw))
    args = build_parser().parse_args(["serve", *argv])
    return args.func(args), started.get("app")


def test_serve_model_uri_from_the_registry(tmp_path, store, monkeypatch, capsys):
    """``halluscope serve --model models:/NAME@ALIAS`` (no --lang needed) serves the registered artifact under
    its program and language, beside local ones, loaded without pickles and with the hash checks."""
    from fastapi.testclient import TestClient

    root = tmp_path / "compiled"
    de = A.write_artifact(get_program("mark-all").make(), {"source": "fixture"}, program_name="mark-all", lang="de",
                          metric="iou", root=root)
    en = A.write_artifact(get_program("mark-all").make(), {"source": "fixture"}, program_name="mark-all", lang="en",
                          metric="iou", root=root)
    reg = register_artifact(de.path, tracking_uri=store)
    assert reg.uri == "models:/halluscope-mark-all-de@champion"
    _no_unpickling(monkeypatch)

    rc, app = _serve_app(["--model", reg.uri, "--tracking-uri", store], monkeypatch)
    assert rc == 0, capsys.readouterr().err
    assert "loaded mark-all/de/iou v0001" in capsys.readouterr().err
    with TestClient(app) as c:
        arts = c.get("/v1/artifacts").json()["artifacts"]
        assert [(a["program"], a["lang"], a["version"], a["content_hash"]) for a in arts] == [
            ("mark-all", "de", 1, de.content_hash)]
        r = c.post("/v1/detect", json={"answer": "Die Provinz heißt Álava."})  # the only one: no lang needed
        assert r.status_code == 200, r.text
        assert r.json()["hard_labels"] == [[0, 24]]
        assert r.json()["artifact"] == {"program": "mark-all", "key": "de", "metric": "iou", "version": 1,
                                        "content_hash": de.content_hash}

    # beside a local artifact named by --lang, each under its own language; the same artifact twice is one
    rc, app = _serve_app(["--model", reg.uri, "--model", reg.uri, "--tracking-uri", store, "--program",
                          "mark-all", "--lang", "en", "--lang", "de", "--compiled-dir", str(root)], monkeypatch)
    assert rc == 0
    with TestClient(app) as c:
        arts = c.get("/v1/artifacts").json()["artifacts"]
        assert [(a["lang"], a["content_hash"]) for a in arts] == [("de", de.content_hash), ("en", en.content_hash)]
        for lang, h in (("de", de.content_hash), ("en", en.content_hash)):
            r = c.post("/v1/detect", json={"answer": "Eins.", "lang": lang})
            assert r.status_code == 200 and r.json()["artifact"]["content_hash"] == h

    # bad URIs and unknown aliases are start-up errors naming the problem (exit 2, nothing served)
    for argv, words in ((["--model", "halluscope-mark-all-de"], "models:/NAME@ALIAS"),
                        (["--model", "models:/halluscope-mark-all-de@nope"], "cannot load"),
                        ([], "--lang or --task")):
        rc, app = _serve_app([*argv, "--tracking-uri", store], monkeypatch)
        assert rc == 2 and app is None
        assert words in capsys.readouterr().err

    # a different artifact under the same program/language/version as the registered one is refused
    other = tmp_path / "other"
    A.write_artifact(get_program("mark-all").make(), {"source": "another fixture"}, program_name="mark-all", lang="de",
                     metric="iou", root=other)
    rc, app = _serve_app(["--model", reg.uri, "--tracking-uri", store, "--program", "mark-all", "--lang", "de",
                          "--compiled-dir", str(other)], monkeypatch)
    assert rc == 2 and "two different artifacts" in capsys.readouterr().err


def test_the_model_code_of_a_model_registered_before_the_layout_change_still_imports():
    """A registered model stores its code (the models-from-code file) as it was when registered; before #22 that
    file imported these paths, so they keep resolving (to the modules that moved) and such a model loads (#22)."""
    import subprocess
    import sys

    code = ("from halluscope.artifacts import load_artifact_dir\n"
            "from halluscope.detector import detect\n"
            "from halluscope.lm import configure\n"
            "from halluscope.programs.registry import get\n"
            "from halluscope.redact import redact\n"
            "import halluscope.artifacts.store as store, halluscope.artifacts.compiled as compiled\n"
            "import halluscope.core.redact as r, halluscope.lm.models as m\n"
            "assert (load_artifact_dir, detect, configure, redact) == "
            "(store.load_artifact_dir, compiled.detect, m.configure, r.redact)\n")
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr[-2000:]
