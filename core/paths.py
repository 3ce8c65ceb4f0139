"""Default locations, each decided here once.

Everything halluscope writes or looks up by default lives under one *home* folder: ``$HALLUSCOPE_HOME`` when
set, else the current working directory (never next to the installed package). Each location can also be
given explicitly on the command line or in Python; these are only the defaults.

========================  =====================================  ==================================
what                      default                                environment variable
========================  =====================================  ==================================
compiled artifacts        ``<home>/compiled``                    ``HALLUSCOPE_COMPILED_DIR``
outputs (predictions...)  ``<home>/outputs``                     —
DSPy disk cache           ``<home>/.cache/dspy``                 ``HALLUSCOPE_CACHE_DIR``
MLflow store              ``sqlite:///<home>/mlruns/mlflow.db``  ``MLFLOW_TRACKING_URI``
built-in demo data        ``<home>/demo_data``                   —
Mu-SHROOM data root       none (demo data is used)               ``HALLUSCOPE_DATA_DIR``
HalluClean data folder    none (demo cases are used)             ``HALLUSCOPE_HALLUCLEAN_DIR``
========================  =====================================  ==================================
"""

from __future__ import annotations

import os
from pathlib import Path

__all__ = [
    "HOME_ENV", "COMPILED_ENV", "CACHE_ENV", "MUSHROOM_DATA_ENV", "HALLUCLEAN_DATA_ENV",
    "home", "compiled_dir", "outputs_dir", "cache_dir", "user_cache_dir", "tracking_dir", "demo_data_dir", "env_path",
    "default_tracking_uri", "resolve_tracking_uri", "sqlite_path", "home_hint",
    "OFFLINE_ENV", "set_offline_defaults", "source_checkout", "install_hint", "optimize_command",
]

HOME_ENV = "HALLUSCOPE_HOME"
COMPILED_ENV = "HALLUSCOPE_COMPILED_DIR"
CACHE_ENV = "HALLUSCOPE_CACHE_DIR"
MUSHROOM_DATA_ENV = "HALLUSCOPE_DATA_DIR"
HALLUCLEAN_DATA_ENV = "HALLUSCOPE_HALLUCLEAN_DIR"

#: Work offline and send nothing anywhere: litellm reads the cost map it ships with (fetching it at import hangs
#: offline), MLflow and other tools send no telemetry. The one place these settings are named.
OFFLINE_ENV = {
    "LITELLM_LOCAL_MODEL_COST_MAP": "True",
    "MLFLOW_DISABLE_TELEMETRY": "true",
    "DO_NOT_TRACK": "true",
}


def set_offline_defaults() -> None:
    """Set :data:`OFFLINE_ENV` in this process where the user has not set them (before litellm/MLflow load)."""
    for name, value in OFFLINE_ENV.items():
        os.environ.setdefault(name, value)


def env_path(name: str) -> Path | None:
    """The path in environment variable ``name`` (``~`` expanded), or None when unset or empty."""
    value = os.environ.get(name, "").strip()
    return Path(value).expanduser() if value else None


def home() -> Path:
    """``$HALLUSCOPE_HOME``, else the current working directory."""
    return env_path(HOME_ENV) or Path.cwd()


def compiled_dir() -> Path:
    return env_path(COMPILED_ENV) or home() / "compiled"


def user_cache_dir() -> Path:
    """Where derived files that can be rebuilt are cached (the encoder's converted weights, 83 MB):
    ``$HALLUSCOPE_HOME/.cache`` when ``$HALLUSCOPE_HOME`` is set, else ``$XDG_CACHE_HOME/halluscope`` (default
    ``~/.cache/halluscope``), never the current folder, which a command run from any folder leaves as it was."""
    set_home = env_path(HOME_ENV)
    if set_home is not None:
        return set_home / ".cache"
    xdg = os.environ.get("XDG_CACHE_HOME", "").strip()
    return (Path(xdg).expanduser() if xdg else Path.home() / ".cache") / "halluscope"


def bundled_compiled_dir() -> Path | None:
    """The folder of the compiled artifacts that ship inside the package (``halluscope.compiled``'s package data),
    or None when the package has none (nothing is imported)."""
    import importlib.util  # noqa: PLC0415 - only where the bundled store is looked up

    try:
        spec = importlib.util.find_spec("halluscope.compiled")
    except (ImportError, ValueError):
        return None
    for loc in (spec.submodule_search_locations or []) if spec else []:
        if Path(loc).is_dir():
            return Path(loc)
    return None


def outputs_dir() -> Path:
    return home() / "outputs"


def cache_dir() -> Path:
    return env_path(CACHE_ENV) or home() / ".cache" / "dspy"


def tracking_dir() -> Path:
    return home() / "mlruns"


def default_tracking_uri(create: bool = True) -> str:
    """The project's SQLite MLflow store under :func:`tracking_dir` (its folder made unless ``create`` is false)."""
    store = tracking_dir()
    if create:
        store.mkdir(parents=True, exist_ok=True)
    return f"sqlite:///{store / 'mlflow.db'}"


def resolve_tracking_uri(tracking_uri: str | None = None, *, create: bool = True) -> str:
    """``tracking_uri``, else ``$MLFLOW_TRACKING_URI``, else the project's SQLite store (:func:`default_tracking_uri`;
    ``create=False``: a reader that must not make its folder)."""
    return tracking_uri or os.environ.get("MLFLOW_TRACKING_URI") or default_tracking_uri(create)


def sqlite_path(uri: str) -> Path | None:
    """The database file of a ``sqlite:///PATH[?query]`` tracking URI; None for any other store."""
    return Path(uri[len("sqlite:///"):].split("?", 1)[0]) if uri.startswith("sqlite:///") else None


def home_hint() -> str:
    """Where the default outputs live, for an error about a folder the user did not choose."""
    return f"the default is under {home()} (${HOME_ENV}, else the working folder)"


def demo_data_dir() -> Path:
    return home() / "demo_data"


def source_checkout() -> Path | None:
    """The source checkout this package runs from (an editable install: the folder whose ``pyproject.toml`` names
    the project ``halluscope`` and holds this module's folder), else None (an installed wheel)."""
    root = Path(__file__).resolve().parents[1]
    try:
        text = (root / "pyproject.toml").read_text(encoding="utf-8")
    except OSError:
        return None
    return root if 'name = "halluscope"' in text else None


def install_hint(extra: str) -> str:
    """How to install the optional extra ``extra`` where this package runs: ``pip install -e "<checkout>[extra]"``
    from a source checkout, ``pip install "halluscope[extra]"`` for an installed wheel."""
    root = source_checkout()
    return f'pip install -e "{root}[{extra}]"' if root is not None else f'pip install "halluscope[{extra}]"'


def optimize_command() -> str:
    """The optimize command as it is typed where this package runs: ``python optimize.py`` in a source checkout
    (the README's), ``halluscope optimize`` for an installed wheel (which has no optimize.py)."""
    return "python optimize.py" if source_checkout() is not None else "halluscope optimize"
