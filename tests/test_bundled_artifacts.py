"""Artifacts travel with the package, and one run policy decides what serves a language or a task.

The served default artifacts are package data of ``halluscope.compiled`` (pyproject lists them; the list is checked
here); :func:`halluscope.artifacts.store.store_roots` reads them beside the user's ``<home>/compiled``;
:func:`halluscope.artifacts.policy.load_detector` is what ``detect``, ``serve``, Ray and Python users call. The last
test builds the wheel, installs it into a fresh virtualenv and runs it from an empty folder.
"""

from __future__ import annotations

import json
import zipfile
import os
import shutil
import socket
import subprocess
import sys
import sysconfig
import time
from pathlib import Path

import pytest

from halluscope.artifacts import store
from halluscope.artifacts.policy import choose, load_detector
from halluscope.programs.encoder.program import extra_missing

ROOT = Path(__file__).resolve().parents[1]
EVIDENCE = ("The Golden Gate Bridge is a suspension bridge in San Francisco, California. It opened in 1937 "
            "and its main span is 1,280 metres long.")
SWAPPED = "The Golden Gate Bridge is a suspension bridge in Los Angeles."


def test_the_wheel_list_is_the_served_versions():
    """pyproject's package data of halluscope.compiled is exactly the served version of each program/key/metric,
    with no optional extra installed and with every one (two versions of a key where they differ)."""
    proc = subprocess.run([sys.executable, str(ROOT / "scripts" / "bundle_artifacts.py"), "--check"],
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    sys.path.insert(0, str(ROOT / "scripts"))
    try:
        import bundle_artifacts
    finally:
        sys.path.remove(str(ROOT / "scripts"))
    served = bundle_artifacts.served()
    assert "grounded/de/iou/v0002" in served and "grounded/all/iou/v0007" in served
    assert "grounded/de/iou/v0004" in served and "encoder/all/iou/v0001" in served  # with the encoder extra
    keys = [v.rsplit("/", 1)[0] for v in served]
    assert len(keys) == len(set(keys)) + 8  # ar de fi fr hi it sv zh: one version each without the extra, one with
    for v in served:  # never a retired one
        assert store.retired_reason(ROOT / "compiled" / v) is None, v


def test_an_empty_home_finds_the_bundled_artifacts(empty_home):
    versions = store.list_versions("grounded", "de", "iou")
    assert versions and {v.origin for v in versions} == {"bundled"}
    best = store.best_version(versions, installed=set())
    assert best.name == "v0002" and best.path.is_relative_to(store.bundled_dir())
    with_extra = store.best_version(versions, installed={"encoder"})
    assert with_extra.name == "v0004" and with_extra.path.is_relative_to(store.bundled_dir())
    detector = store.load_compiled("grounded", lang="de", metric="iou")
    assert detector.version == (2 if extra_missing() else 4)  # what is installed here decides


def _copy_version(src: Path, home: Path, version: int, **manifest_changes) -> Path:
    """A copy of the version ``src`` into ``home/compiled`` as ``version``, its manifest changed and re-hashed."""
    m = json.loads((src / "manifest.json").read_text())
    m.update(manifest_changes, version=version)
    m.pop("content_hash")
    data = (src / "program.json").read_bytes()
    m["content_hash"] = store.content_hash(data, m)
    dst = home / "compiled" / m["program"] / m["lang"] / m["metric"] / f"v{version:04d}"
    dst.mkdir(parents=True)
    (dst / "program.json").write_bytes(data)
    (dst / "manifest.json").write_text(json.dumps(m))
    return dst


def _served_bundled(key: str = "de") -> Path:
    """The bundled version of grounded/<key>/iou served here (v0002, or v0004 where the encoder extra is installed)."""
    return store.best_version(store.list_versions("grounded", key, "iou", root=store.bundled_dir())).path


def test_the_users_versions_compete_with_the_bundled_ones(empty_home):
    bundled = _served_bundled()
    score = store.selection_score(json.loads((bundled / "manifest.json").read_text()))
    # a demo-data run of the user's never displaces the bundled real-data version
    demo = _copy_version(bundled, empty_home, 7, source="demo (built-in)")
    assert store.best_version(store.list_versions("grounded", "de", "iou")).path == bundled
    shutil.rmtree(demo)
    # a version of the user's on the same data and folds with a higher score is served instead
    cv = json.loads((bundled / "manifest.json").read_text())["cv"]
    cv["mean"]["compiled"]["iou"]["mean"] = score + 0.01
    better = _copy_version(bundled, empty_home, 8, cv=cv)
    ranked = store.rank_versions(store.list_versions("grounded", "de", "iou"), "iou")
    assert [r.info.path for r in ranked if r.best] == [better]
    assert load_detector(lang="de").path == better
    # an identical copy of a bundled version is listed once, as the user's
    served = int(bundled.name[1:])
    same = _copy_version(bundled, empty_home, served)
    listed = store.list_versions("grounded", "de", "iou")
    assert [v.origin for v in listed if v.version == served] == ["home"] and same in [v.path for v in listed]


def test_new_versions_are_numbered_after_the_bundled_ones(empty_home):
    """Version numbers are unique across the user's and the bundled store, so --version N names one version."""
    from halluscope.programs.registry import get_program

    written = store.write_artifact(get_program("grounded").make(), {"source": "test"}, program_name="grounded", lang="de",
                                   metric="iou")
    highest = max(v.version for v in store.list_versions("grounded", "de", "iou", root=store.bundled_dir()))
    assert written.version == highest + 1 and written.path.is_relative_to(empty_home / "compiled")


def test_never_served_by_default_untracked_or_unchanged(empty_home):
    """An untracked version (its optimize run was killed) and a compile that changed nothing are listed with the
    reason and never served by default; both stay loadable with --version."""
    bundled = _served_bundled()
    served = int(bundled.name[1:])
    cv = json.loads((bundled / "manifest.json").read_text())["cv"]
    cv["mean"]["compiled"]["iou"]["mean"] += 0.05
    untracked = _copy_version(bundled, empty_home, 9, cv=cv)
    (untracked / store.UNTRACKED_FILE).write_text("interrupted\n")
    _copy_version(bundled, empty_home, 10, cv=cv, changes=[])
    ranked = {r.info.version: r for r in store.rank_versions(store.list_versions("grounded", "de", "iou"), "iou")}
    assert ranked[served].best and not ranked[9].best and not ranked[10].best
    assert "untracked" in ranked[9].why and "changed nothing" in ranked[10].why
    assert store.load_compiled("grounded", lang="de", metric="iou", version=9).path == untracked
    changed = _copy_version(bundled, empty_home, 11, cv=cv, changes=[{"predictor": "p", "what": "state"}])
    assert store.best_version(store.list_versions("grounded", "de", "iou")).path == changed


@pytest.mark.parametrize("kwargs, program, key, fitted", [
    ({"lang": "de"}, "grounded", "de", True),
    ({"lang": "ca"}, "grounded", "all", True),               # no Catalan artifact: the cross-lingual one
    ({"task": "qa"}, "grounded", "qa", True),
    ({"task": "mwp"}, "grounded", "all", True),              # no task artifact: the cross-lingual one, said
    ({"lang": "de", "lm": "openai/gpt-4o-mini"}, "spans", "de", True),
    ({"lang": "fi", "lm": "openai/gpt-4o-mini"}, "spans", "fi", False),   # a capable LM, no artifact: zero-shot
    ({"lang": "de", "lm": "local:/models/x.gguf"}, "grounded", "de", True),
])
def test_the_run_policy(empty_home, kwargs, program, key, fitted):
    c = choose(**kwargs)
    assert (c.program, c.key, c.fitted) == (program, key, fitted)
    assert c.why  # the default is always said
    if not fitted:
        assert "unfitted" in c.why


def test_any_program_falls_back_to_its_cross_lingual_artifact_for_a_language(monkeypatch):
    """A program compiled with --lang all (one multilingual artifact, the encoder's recipe) serves a language without
    its own artifact, and says so; only grounded's serves a HalluClean task (a span-level artifact fitted on
    Mu-SHROOM is no task-routed LM program)."""
    import halluscope.artifacts.policy as policy

    have = {("encoder", "all", "iou"), ("spans", "all", "iou")}
    monkeypatch.setattr(policy, "_has", lambda program, key, metric, root: (program, key, metric) in have)
    c = choose("fr", program="encoder")
    assert (c.key, c.fitted, c.refused) == ("all", True, False) and "using the cross-lingual one" in c.why
    c = choose("fi", lm="openai/gpt-4o-mini")
    assert (c.program, c.key, c.fitted) == ("spans", "all", True) and "encoder/all" not in c.why
    c = choose(task="qa", lm="openai/gpt-4o-mini")
    assert (c.program, c.key, c.fitted) == ("spans", "qa", False)  # no task artifact: zero-shot, not the span one
    assert choose("all", program="encoder").key == "all"
    assert choose(task="qa", program="encoder").refused


def test_no_dead_end_without_any_artifact(tmp_path):
    """No artifact anywhere (an explicit empty root): the unfitted grounded program serves, and says so; never the
    LM span detector on the embedded model."""
    detector = load_detector(lang="de", root=tmp_path)
    assert detector.name == "grounded" and not detector.fitted and detector.path is None
    assert "unfitted" in detector.why
    det = detector(SWAPPED, context=EVIDENCE)
    assert det.hard_labels and SWAPPED[det.hard_labels[0][0]:det.hard_labels[0][1]] in ("Los", "Angeles",
                                                                                        "Los Angeles")


def test_a_program_that_cannot_run_untrained_is_refused_not_served_unfitted(tmp_path, capsys):
    """The encoder's head has no weights before its fit: without a trained artifact detect, serve and
    load_detector refuse it in one line naming the optimize command (it used to serve the untrained program, which
    marked nothing and called every answer correct)."""
    from halluscope.artifacts.policy import choose
    from halluscope.artifacts.store import ArtifactNotFoundError
    from halluscope.cli import main

    choice = choose("de", None, program="encoder", root=tmp_path)
    assert choice.refused and not choice.fitted
    assert choice.why == ("program encoder: no trained artifact for 'de'/iou, and it cannot run untrained: train one "
                          "with python optimize.py --program encoder --lang de --metric iou")
    with pytest.raises(ArtifactNotFoundError, match="cannot run untrained"):
        load_detector(lang="de", program="encoder", root=tmp_path)
    assert not choose("de", None, program="grounded", root=tmp_path).refused  # grounded runs on its hand-set weights
    rc = main(["detect", "--program", "encoder", "--lang", "de", "--answer", "Berlin ist groß.",
               "--compiled-dir", str(tmp_path)])
    err = [x for x in capsys.readouterr().err.splitlines() if x.strip()]
    assert rc == 2 and len(err) == 1 and "cannot run untrained" in err[0] and "unfitted" not in err[0], err


def test_detect_cli_says_what_it_serves(empty_home, capsys):
    from halluscope.cli import main

    assert main(["detect", "--lang", "ca", "--answer", SWAPPED, "--context", EVIDENCE, "--format", "json"]) == 0
    err = capsys.readouterr().err
    assert "cross-lingual" in err and "grounded/all/iou" in err
    assert main(["detect", "--lang", "de", "--list"]) == 0
    out = capsys.readouterr().out
    assert "bundled with the package: " in out and "*best*" in out


def test_an_unusable_home_is_one_line_before_any_work(tmp_path, monkeypatch, capsys):
    """$HALLUSCOPE_HOME that cannot hold the outputs (here a file): optimize stops before any work with one line
    naming the folder, exit 2, and writes nothing; detect (which writes nothing there) still serves."""
    from halluscope.cli import main

    home = tmp_path / "home-is-a-file"
    home.write_text("")
    monkeypatch.setenv("HALLUSCOPE_HOME", str(home))
    monkeypatch.chdir(tmp_path)
    with pytest.raises(SystemExit) as e:
        main(["optimize", "--metric", "iou", "--lang", "de"])
    err = capsys.readouterr().err.strip().splitlines()
    assert e.value.code == 2 and err[-1].startswith("halluscope optimize: error: cannot write ")
    assert "nothing was run" in err[-1] and "Traceback" not in "\n".join(err)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["home-is-a-file"] and home.read_text() == ""
    assert main(["detect", "--lang", "de", "--answer", SWAPPED, "--context", EVIDENCE, "--format", "json"]) == 0


# -------------------------------------------------------------------------------------------------------------
# The installed wheel, in a fresh virtualenv, run from an empty folder
# -------------------------------------------------------------------------------------------------------------


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="module")
def installed(tmp_path_factory):
    """The wheel built from this tree, installed (not editable) into a new virtualenv whose dependencies are
    this environment's (a .pth file: no download, no rebuild of llama.cpp); returns its bin folder."""
    tmp = tmp_path_factory.mktemp("wheel")
    src = tmp / "src"
    shutil.copytree(ROOT, src, ignore=shutil.ignore_patterns(".git", ".venv", "__pycache__", "*.egg-info", "build",
                                                               "mlruns", "outputs", ".cache", "demo_data"))
    proc = subprocess.run([sys.executable, "-m", "pip", "wheel", "--no-deps", "--quiet", "-w", str(tmp), str(src)],
                          capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-2000:]
    (wheel,) = tmp.glob("halluscope-*.whl")
    venv = tmp / "venv"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True, timeout=120)
    site = Path(subprocess.run([str(venv / "bin" / "python"), "-c", "import sysconfig; print(sysconfig.get_paths()"
                                "['purelib'])"], capture_output=True, text=True, check=True).stdout.strip())
    # this environment's site folders, and those its .pth files add (a venv whose dependencies come from another)
    deps = {sysconfig.get_paths()["purelib"], sysconfig.get_paths()["platlib"],
            *(p for p in sys.path if p.endswith("site-packages"))}
    (site / "_halluscope_test_deps.pth").write_text("\n".join(sorted(deps)) + "\n")
    proc = subprocess.run([sys.executable, "-m", "pip", "--python", str(venv / "bin" / "python"), "install",
                           "--no-deps", "--no-index", "--quiet", str(wheel)], capture_output=True, text=True,
                          timeout=600)
    assert proc.returncode == 0, proc.stderr[-2000:]
    return venv / "bin", wheel


def _env(home: Path) -> dict:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("HALLUSCOPE_", "PYTHONPATH"))}
    return {**env, "HALLUSCOPE_HOME": str(home)}


def test_installed_wheel_detects_from_an_empty_folder(installed, tmp_path):
    bin_dir, wheel = installed
    work, home = tmp_path / "work", tmp_path / "home"
    work.mkdir()
    where = subprocess.run([str(bin_dir / "python"), "-c", "import halluscope.artifacts.store as s; "
                            "print(s.__file__); print(s.bundled_dir()); from halluscope.core.paths import install_hint as h, "
                            "optimize_command as o; print(h('encoder')); print(o())"], cwd=work, env=_env(home),
                           capture_output=True, text=True, timeout=120)
    module, bundled, hint, optimize = where.stdout.strip().split("\n")
    assert hint == 'pip install "halluscope[encoder]"'  # a wheel user is told the extra, not a checkout's -e .
    assert optimize == "halluscope optimize"  # and the command a wheel has (no optimize.py)
    assert Path(module).is_relative_to(bin_dir.parent) and Path(bundled).is_relative_to(bin_dir.parent), where
    for lang, question in (("de", ["--question", "Where is the Golden Gate Bridge?"]), ("en", [])):
        proc = subprocess.run([str(bin_dir / "halluscope"), "detect", "--lang", lang, "--answer", SWAPPED,
                               "--context", EVIDENCE, *question, "--format", "json"], cwd=work, env=_env(home),
                              capture_output=True, text=True, timeout=300)
        assert proc.returncode == 0, proc.stderr[-3000:]
        assert f"artifact for '{lang}'" in proc.stderr and "grounded" in proc.stderr
        row = json.loads(proc.stdout)
        flagged = [SWAPPED[a:b] for a, b in row["hard_labels"]]
        assert any(w in f for f in flagged for w in ("Los", "Angeles")), flagged
        assert row["label"] is True, row["rationale"]
    assert list(work.iterdir()) == []  # nothing written into the folder it ran from (no --output)
    # the trained encoder's weights (13.5 MiB, the encoder_prob signal's, served with the extra) are most of it;
    # everything else stays small
    with zipfile.ZipFile(wheel) as z:
        weights = sum(i.compress_size for i in z.infolist() if i.filename.endswith(".safetensors"))
    assert os.path.getsize(wheel) - weights < 3_000_000 and os.path.getsize(wheel) < 16_000_000


def test_installed_wheel_serves(installed, tmp_path):
    import httpx

    bin_dir, _ = installed
    work, home = tmp_path / "work", tmp_path / "home"
    work.mkdir()
    port = _free_port()
    server = subprocess.Popen([str(bin_dir / "halluscope"), "serve", "--lang", "en", "--port", str(port)],
                              cwd=work, env=_env(home), stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        deadline = time.monotonic() + 120
        while True:
            try:
                if httpx.get(f"http://127.0.0.1:{port}/healthz", timeout=2).status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            assert server.poll() is None and time.monotonic() < deadline, server.stdout.read()[-3000:]
            time.sleep(0.5)
        r = httpx.post(f"http://127.0.0.1:{port}/v1/detect", timeout=60,
                       json={"answer": SWAPPED, "context": EVIDENCE, "lang": "en"})
        assert r.status_code == 200, r.text
        body = r.json()
        assert body["hard_labels"] and body["label"] is True
    finally:
        server.terminate()
        server.wait(timeout=30)


def test_installed_wheel_with_a_home_it_cannot_write(installed, tmp_path):
    """A read-only install run from a folder it cannot write (a home under a file stands in: root ignores
    permissions). What needs to write nothing works, writing nothing anywhere; what must write says so in one line
    naming the folder, exit 2, no traceback; a stdout that cannot encode the answer still gets it."""
    bin_dir, _ = installed
    blocker, work = tmp_path / "a-file", tmp_path / "work"
    blocker.write_text("x")
    work.mkdir()
    env = {**_env(blocker / "home"), "PYTHONDONTWRITEBYTECODE": "1"}
    site = bin_dir.parent / "lib"

    def files():
        return {p for p in site.rglob("*") if "__pycache__" not in p.parts}

    before = files()

    def run(*argv, **extra):
        return subprocess.run([str(bin_dir / argv[0]), *argv[1:]], cwd=work, env={**env, **extra},
                              capture_output=True, text=True, timeout=300)

    proc = run("halluscope", "detect", "--lang", "de", "--answer", "Die Brücke ist grün.", "--context",
               "Die Brücke ist rot.", PYTHONIOENCODING="ascii")
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert json.loads(proc.stdout)["answer"] == "Die Brücke ist grün."
    proc = run("python", "-c", "import halluscope, dspy; d = halluscope.load_detector(lang='en'); "
               "halluscope.configure(dspy.LM('openai/x', api_key='k')); "
               f"print(halluscope.detect(d, {SWAPPED!r}, context={EVIDENCE!r}).label)")
    assert proc.returncode == 0 and proc.stdout.strip() == "True", proc.stderr[-3000:]
    assert proc.stderr.count("cannot make the LM cache folder") == 1
    for argv, folder in ((["evaluate", "--lang", "de", "--limit", "2"], "outputs"),
                         (["optimize", "--metric", "iou", "--lang", "de"], "compiled"),
                         (["ui"], "mlruns")):
        proc = run("halluscope", *argv)
        assert proc.returncode == 2 and "Traceback" not in proc.stderr, proc.stderr[-3000:]
        assert str(blocker / "home" / folder) in proc.stderr.strip().splitlines()[-1]
    proc = run("halluscope", "compare", "--no-plot")
    assert proc.returncode == 1 and "no halluscope runs" in proc.stdout and "Traceback" not in proc.stderr
    assert list(work.iterdir()) == [] and blocker.read_text() == "x" and files() == before


def test_optimize_context_none_scores_words_without_evidence(empty_home, capsys):
    """Mu-SHROOM's --context none protocol: optimize scores the words without evidence in every fold, the zero-shot
    program's too (an unfitted grounded would call every answer unverifiable and mark nothing)."""
    import json as _json

    from halluscope.cli import main

    assert main(["optimize", "--metric", "iou", "--lang", "de", "--context", "none", "--folds", "2",
                 "--no-mlflow"]) == 0
    assert "--context none: scoring the words without evidence" in capsys.readouterr().err
    (manifest,) = (empty_home / "compiled" / "grounded" / "de" / "iou").glob("v*/manifest.json")
    m = _json.loads(manifest.read_text())
    assert m["program_options"]["evidence_free"] is True
    zero = [f["zero_shot"]["iou"] for f in m["cv"]["folds"]]
    assert all(z < 1.0 for z in zero)  # words were marked (all-unverifiable output scores 1.0 only on empty gold)


def test_only_a_different_dspy_is_worth_a_warning_when_loading(caplog, tmp_path):
    """The bundled artifacts were compiled on one Python; a wheel user on another Python (3.12, 3.13) loads the same
    JSON state: no warning for the Python minor version or cloudpickle, which DSPy records beside its own version."""
    import logging

    from dspy.utils.saving import get_dependency_versions

    from halluscope.artifacts.store import _warn_versions

    now = get_dependency_versions()
    with caplog.at_level(logging.WARNING, logger="halluscope.artifacts.store"):
        _warn_versions({"metadata": {"dependency_versions": {**now, "python": "3.99", "cloudpickle": "0.1"}}},
                       tmp_path)
        assert caplog.text == ""
        _warn_versions({"metadata": {"dependency_versions": {**now, "python": "3.99", "dspy": "0.0.1"}}}, tmp_path)
    assert "dspy==0.0.1" in caplog.text and "python" not in caplog.text
