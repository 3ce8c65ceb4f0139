"""The llama.cpp model factory (#33): ``use_extra_bufts`` off unless the cached probe says the fast path works, the
probe in a subprocess (a crash there is a message, not a crash here), the cache's bad states, bad model paths, and
the ``halluscope`` supervisor that names a native crash."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
from pathlib import Path
from types import SimpleNamespace

import pytest

from halluscope.lm import llamacpp as L


class FakeLlama:
    """Stands in for ``llama_cpp.Llama``: like it, ``__init__`` assigns ``self.model_params`` from the defaults
    (``use_extra_bufts`` true) and loads the model with them; it records what the load would have been given."""

    loads: list = []

    def __init__(self, model_path: str, **kwargs):
        self.model_params = SimpleNamespace(use_extra_bufts=True, n_gpu_layers=0)
        self.kwargs = kwargs
        FakeLlama.loads.append((model_path, self.model_params.use_extra_bufts, kwargs))


@pytest.fixture
def probe_env(tmp_path, monkeypatch):
    """A fresh decision: the cache file in ``tmp_path``, no forcing, a fake model file and the fake Llama."""
    cache = tmp_path / "cache" / "llama-probe.json"
    monkeypatch.setenv(L.PROBE_CACHE_ENV, str(cache))
    monkeypatch.delenv(L.FAST_ENV, raising=False)
    model = tmp_path / "m.gguf"
    model.write_bytes(b"GGUF" + b"\0" * 16)
    monkeypatch.setattr(L, "_embedded_model", lambda: model)
    monkeypatch.setattr(L, "_llama_base", lambda: FakeLlama)
    FakeLlama.loads = []
    L.reset()
    yield SimpleNamespace(cache=cache, model=model)
    L.reset()


def probe_says(monkeypatch, code: str) -> list:
    """Make the probe run ``code`` in a subprocess; returns the list of probes started."""
    started = []

    def command(model_path):
        started.append(model_path)
        return [sys.executable, "-c", textwrap.dedent(code)]

    monkeypatch.setattr(L, "_probe_command", command)
    return started


def no_probe(monkeypatch) -> None:
    def command(model_path):
        raise AssertionError("the probe ran although the decision was known")

    monkeypatch.setattr(L, "_probe_command", command)


def cache_with(path: Path, fast: bool) -> None:
    key = L.probe_key()
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps({"format": 1, "entries": {L._key_id(key): {"fast": fast, "key": key}}}))


@pytest.mark.parametrize("fast", [False, True])
def test_the_cached_decision_is_what_the_factory_passes(probe_env, monkeypatch, fast):
    cache_with(probe_env.cache, fast)
    no_probe(monkeypatch)
    llm = L.load_llama(probe_env.model, n_ctx=512, logits_all=True)
    assert llm.model_params.use_extra_bufts is fast  # what llama.cpp is given when the model loads
    assert FakeLlama.loads == [(str(probe_env.model), fast, {"n_ctx": 512, "logits_all": True, "verbose": False})]
    assert "use_extra_bufts" not in llm.kwargs  # Llama itself never sees the keyword


def test_forcing_by_the_environment_skips_the_probe(probe_env, monkeypatch):
    no_probe(monkeypatch)
    for value, fast in (("0", False), ("1", True)):
        monkeypatch.setenv(L.FAST_ENV, value)
        assert L.load_llama(probe_env.model).model_params.use_extra_bufts is fast
    assert not probe_env.cache.exists()


def test_a_working_probe_is_run_once_and_cached(probe_env, monkeypatch):
    started = probe_says(monkeypatch, "print('ok')")
    assert L.load_llama(probe_env.model).model_params.use_extra_bufts is True
    assert L.load_llama(probe_env.model).model_params.use_extra_bufts is True
    assert len(started) == 1
    (entry,) = json.loads(probe_env.cache.read_text())["entries"].values()
    assert entry["fast"] is True and entry["key"] == L.probe_key()
    L.reset()  # a new process: reads the file, no probe
    assert L.fast_path() is True and len(started) == 1


@pytest.mark.parametrize("signum", [signal.SIGSEGV, signal.SIGILL])
def test_a_probe_that_dies_from_a_signal_gives_the_safe_parameters_and_one_line(probe_env, monkeypatch, caplog,
                                                                                 signum):
    probe_says(monkeypatch, f"import os; os.kill(os.getpid(), {int(signum)})")
    with caplog.at_level("WARNING", logger=L.__name__):
        llm = L.load_llama(probe_env.model)
    assert llm.model_params.use_extra_bufts is False
    (record,) = caplog.records
    assert f"crashed with signal {int(signum)} ({signum.name})" in record.getMessage()
    assert "safe parameters" in record.getMessage() and str(probe_env.cache) in record.getMessage()
    (entry,) = json.loads(probe_env.cache.read_text())["entries"].values()
    assert entry["fast"] is False and signum.name in entry["reason"]


def test_a_probe_that_hangs_or_fails_gives_the_safe_parameters(probe_env, monkeypatch, caplog):
    monkeypatch.setattr(L, "PROBE_TIMEOUT_S", 0.5)
    probe_says(monkeypatch, "import time; time.sleep(30)")
    with caplog.at_level("WARNING", logger=L.__name__):
        assert L.fast_path() is False
    assert "timed out after 0.5 s" in caplog.text
    probe_says(monkeypatch, "import sys; sys.exit('no llama_cpp here')")
    r = L.run_probe(probe_env.model)
    assert not r.fast and r.reason == "the probe failed (exit status 1: no llama_cpp here)"


def test_a_corrupted_cache_warns_probes_again_and_is_rewritten_whole(probe_env, monkeypatch, caplog):
    probe_env.cache.parent.mkdir(parents=True)
    probe_env.cache.write_text('{"entries": {"abc": {"fast": tr')
    started = probe_says(monkeypatch, "print('ok')")
    with caplog.at_level("WARNING", logger=L.__name__):
        assert L.fast_path() is True
    assert len(started) == 1
    assert [r.getMessage() for r in caplog.records] == [
        f"the llama.cpp probe cache {probe_env.cache} is corrupted: probing again and rewriting it"]
    assert json.loads(probe_env.cache.read_text())["entries"]  # valid JSON again
    assert sorted(p.name for p in probe_env.cache.parent.iterdir()) == ["llama-probe.json"]  # no temp file left


def test_an_unwritable_cache_folder_warns_once_and_keeps_the_safe_parameters(probe_env, monkeypatch, caplog,
                                                                             tmp_path):
    blocker = tmp_path / "a-file"
    blocker.write_text("x")
    monkeypatch.setenv(L.PROBE_CACHE_ENV, str(blocker / "sub" / "llama-probe.json"))  # a folder inside a file
    no_probe(monkeypatch)
    with caplog.at_level("WARNING", logger=L.__name__):
        assert L.load_llama(probe_env.model).model_params.use_extra_bufts is False
        assert L.load_llama(probe_env.model).model_params.use_extra_bufts is False  # decided once per process
    (record,) = caplog.records
    assert record.getMessage().startswith(f"cannot write the llama.cpp probe cache in {blocker / 'sub'}")
    assert blocker.read_text() == "x"


def test_no_home_directory_warns_once_and_keeps_the_safe_parameters(probe_env, monkeypatch, caplog):
    """A container run as a user id with no passwd entry and no $HOME (docker run --user 12345): Path.home()
    raises; the embedded model still loads, with the safe parameters (before: every LM call failed with
    'Could not determine home directory')."""
    from pathlib import Path as P

    for name in (L.PROBE_CACHE_ENV, "XDG_CACHE_HOME"):
        monkeypatch.delenv(name, raising=False)

    def no_home():
        raise RuntimeError("Could not determine home directory.")

    monkeypatch.setattr(P, "home", staticmethod(no_home))
    no_probe(monkeypatch)
    with caplog.at_level("WARNING", logger=L.__name__):
        assert L.load_llama(probe_env.model).model_params.use_extra_bufts is False
        assert L.load_llama(probe_env.model).model_params.use_extra_bufts is False  # decided once per process
    (record,) = caplog.records
    message = record.getMessage()
    assert message.startswith("no folder for the llama.cpp probe cache (Could not determine home directory.)")
    assert L.PROBE_CACHE_ENV in message and "\n" not in message


def test_bad_model_paths_are_one_clear_error(tmp_path, probe_env):
    with pytest.raises(L.ModelFileNotFound, match="GGUF model file not found: .*missing.gguf"):
        L.load_llama(tmp_path / "missing.gguf")
    assert issubclass(L.ModelFileNotFound, FileNotFoundError) and issubclass(L.ModelFileError, ValueError)
    (tmp_path / "notes.txt").write_text("hello")
    with pytest.raises(L.ModelFileError, match="not a GGUF model file"):
        L.load_llama(tmp_path / "notes.txt")
    with pytest.raises(L.ModelFileError, match="a folder"):
        L.load_llama(tmp_path)
    assert FakeLlama.loads == []  # llama.cpp never saw them


def test_a_file_llama_cpp_refuses_is_a_model_file_error(probe_env, monkeypatch):
    class Refusing(FakeLlama):
        def __init__(self, model_path, **kwargs):
            super().__init__(model_path, **kwargs)
            raise ValueError(f"Failed to load model from file: {model_path}")

    monkeypatch.setattr(L, "_llama_base", lambda: Refusing)
    monkeypatch.setenv(L.FAST_ENV, "0")
    with pytest.raises(L.ModelFileError, match="llama.cpp cannot load .* as a model: Failed to load model"):
        L.load_llama(probe_env.model)


@pytest.mark.parametrize("bad", ["missing.gguf", "notes.gguf", "junk.gguf"])
def test_the_cli_says_one_line_and_exits_2_for_a_bad_gguf(tmp_path, bad):
    (tmp_path / "notes.gguf").write_text("not a model")
    (tmp_path / "junk.gguf").write_bytes(b"GGUF" + b"\xff" * 64)
    env = {**os.environ, L.PROBE_CACHE_ENV: str(tmp_path / "probe.json"), L.FAST_ENV: "0",
           "HALLUSCOPE_HOME": str(tmp_path)}
    for argv in (["evaluate", "--program", "direct", "--task", "qa", "--limit", "1", "--no-mlflow", "--no-progress",
                  "--lm", f"local:{tmp_path / bad}"], ["lm-server", "--model", str(tmp_path / bad)],
                 ["optimize", "--program", "spans", "--lang", "en", "--no-mlflow", "--lm", f"local:{tmp_path / bad}"]):
        p = subprocess.run([sys.executable, "-m", "halluscope", *argv], capture_output=True, text=True, env=env,
                           cwd=tmp_path, timeout=300)
        errors = [line for line in p.stderr.splitlines() if "error" in line]
        assert p.returncode == 2, p.stderr
        assert len(errors) == 1 and errors[0].startswith(f"halluscope {argv[0]}: error: ") and bad in errors[0], \
            p.stderr
        assert "Traceback" not in p.stderr


# -- the supervisor ----------------------------------------------------------------------------------------------

SUPERVISED = """
import os, signal, sys, time
from halluscope.cli.supervisor import supervise

def target():
    mode = sys.argv[1]
    if mode == "term":
        signal.signal(signal.SIGTERM, lambda s, f: sys.exit(42))
    print("child", os.getpid(), flush=True)
    if mode == "segv":
        os.kill(os.getpid(), signal.SIGSEGV)
    if mode == "code":
        return 7
    if mode == "stdin":
        print(sys.stdin.read().upper(), end="")
        return 0
    if mode in ("term", "sleep"):
        time.sleep(60)

sys.exit(supervise(target))
"""


def supervised(tmp_path, mode: str, **kw) -> subprocess.Popen:
    script = tmp_path / "supervised.py"
    script.write_text(SUPERVISED)
    return subprocess.Popen([sys.executable, str(script), mode], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, **kw)


def test_the_supervisor_names_a_native_crash_in_one_line(tmp_path, monkeypatch):
    monkeypatch.setenv(L.PROBE_CACHE_ENV, str(tmp_path / "probe.json"))
    p = supervised(tmp_path, "segv")
    out, err = p.communicate(timeout=60)
    assert p.returncode == 128 + signal.SIGSEGV
    child = int(out.split()[1])
    assert child != p.pid  # the target ran in a child process
    assert "Fatal Python error: Segmentation fault" in err  # faulthandler in the child: where it crashed
    last = err.strip().splitlines()[-1]
    assert last == (f"halluscope: the native runtime (llama.cpp) crashed with signal 11 (SIGSEGV); run it again "
                    f"with HALLUSCOPE_LLAMA_FAST=0 (llama.cpp's safe parameters), or delete {tmp_path / 'probe.json'} "
                    f"to probe llama.cpp again; if it persists, report it with the lines above")


def test_the_supervisor_passes_exit_status_and_stdio_through(tmp_path):
    p = supervised(tmp_path, "code")
    out, err = p.communicate(timeout=60)
    assert p.returncode == 7 and err == ""
    p = supervised(tmp_path, "stdin")
    out, err = p.communicate("hello", timeout=60)
    assert p.returncode == 0 and out.splitlines()[-1] == "HELLO"


def test_the_supervisor_forwards_sigterm(tmp_path):
    p = supervised(tmp_path, "term")
    assert p.stdout.readline().startswith("child")
    p.send_signal(signal.SIGTERM)  # to the supervisor only: the child gets it through it
    p.wait(timeout=60)
    assert p.returncode == 42  # the child's handler ran and its status came through
    p = supervised(tmp_path, "sleep")
    assert p.stdout.readline().startswith("child")
    p.send_signal(signal.SIGTERM)  # a child without a handler dies from it: so does the supervisor, silently
    _, err = p.communicate(timeout=60)
    assert p.returncode == -signal.SIGTERM and err == ""


def test_the_console_script_is_the_supervisor():
    import tomllib

    scripts = tomllib.loads((Path(__file__).resolve().parent.parent / "pyproject.toml").read_text())["project"][
        "scripts"]
    assert scripts["halluscope"] == "halluscope.cli.supervisor:main"


@pytest.mark.embedded
@pytest.mark.parametrize("fast", [False, True])
def test_the_parameter_reaches_llama_cpp(tmp_path, fast):
    """The real ``llama_cpp.Llama`` (not a fake): with the fast path off, llama.cpp never considers its repacking
    buffer type (CPU_REPACK) for the weights; with it on it does (and says which tensors it cannot use it for)."""
    code = ("from halluscope.lm.llamacpp import load_llama; from halluscope.lm.models import smollm2_path\n"
            f"llm = load_llama(smollm2_path(), fast={fast}, n_ctx=256, verbose=True)\n"
            "assert llm.model_params.use_extra_bufts is " + str(fast) + "\n"
            "print(llm.create_completion('The capital of France is', max_tokens=3, temperature=0)['usage'])\n")
    p = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300,
                       env={**os.environ, L.PROBE_CACHE_ENV: str(tmp_path / "probe.json")})
    assert p.returncode == 0, p.stderr[-2000:]
    assert "'completion_tokens': 3" in p.stdout
    assert ("CPU_REPACK" in p.stderr) is fast
    assert not (tmp_path / "probe.json").exists()  # fast= given: no probe
