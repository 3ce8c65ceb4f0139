"""The one extension registry: programs, datasets, retrievers and optimizers are found by kind and name.

    register(kind, name, spec)   # add (or replace) an extension
    get(kind, name)              # the spec, KeyError naming the registered ones otherwise
    names(kind)                  # the registered names, in registration order

What a spec is depends on the kind: a :class:`halluscope.programs.registry.ProgramSpec`, a
:class:`halluscope.loaders.dataset_registry.DatasetSpec`, a retriever factory ``factory(arg) -> Retriever`` (for the spec
string ``name:arg``), an :class:`halluscope.optimize.cv.OptimizerSpec`. Each kind's package keeps a typed front
over this registry, named alike, which checks the spec: ``halluscope.programs`` (``get_program``, ``program_names``,
``register_program``), ``halluscope.loaders`` (``get_dataset``, ``dataset_names``, ``register_dataset``),
``halluscope.retrievers`` (``get_retriever``, ``retriever_names``, ``register_retriever``; ``make_retriever`` builds
one from a spec string) and ``halluscope.optimize`` (``get_optimizer``, ``optimizer_names``, ``register_optimizer``).
``get_X(name)`` is ``get(KIND, name)`` with the type checked; each built-in registers in the module defining it.

The first :func:`get` or :func:`names` of a kind loads its extensions: the package that holds its built-ins
(:data:`KINDS`; importing it registers them) and then every installed plugin that declares an entry point in the
group ``halluscope.<kind>``, so a plugin package registers without ``--import``::

    [project.entry-points."halluscope.programs"]
    my-detector = "my_package.detector:SPEC"      # an object: registered under the entry point's name
    my-others = "my_package.registers_on_import"  # a module: importing it registers what it defines

A plugin that fails to load is logged as a warning naming it and the error, and the others still load.
This module imports no other halluscope layer: the built-ins' packages are named, and imported on first use.
"""

from __future__ import annotations

import importlib
import logging
import threading
import types
from importlib.metadata import entry_points
from typing import Any

__all__ = ["KINDS", "register", "get", "names", "table", "entry_point_group"]

logger = logging.getLogger(__name__)

#: kind -> the package whose import registers the built-in extensions of that kind
KINDS: dict[str, str] = {
    "programs": "halluscope.programs",
    "datasets": "halluscope.loaders",
    "retrievers": "halluscope.retrievers",
    "optimizers": "halluscope.optimize.optimizers",
    "signals": "halluscope.programs.grounded.signals",
}

_REGISTRY: dict[str, dict[str, Any]] = {kind: {} for kind in KINDS}
_LOADED: set[str] = set()  # kinds whose built-ins and plugins are loaded
_LOADING: set[str] = set()
_LOCK = threading.RLock()


def entry_point_group(kind: str) -> str:
    """The entry-point group a plugin declares extensions of ``kind`` in: ``halluscope.<kind>``."""
    return f"halluscope.{_kind(kind)}"


def _kind(kind: str) -> str:
    if kind not in KINDS:
        raise ValueError(f"unknown extension kind {kind!r}; the kinds are: {', '.join(KINDS)}")
    return kind


def register(kind: str, name: str, spec: Any) -> Any:
    """Add ``spec`` as the extension ``name`` of ``kind`` (a registered name is replaced); returns ``spec``."""
    _REGISTRY[_kind(kind)][name] = spec  # no lock: a module registering while another thread loads must not wait
    return spec


def _load(kind: str) -> None:
    """The built-ins of ``kind``, then its installed plugins (entry points), once per process."""
    if kind in _LOADED:
        return
    with _LOCK:
        if kind in _LOADED or kind in _LOADING:  # loading in this thread: an import below asked (a partial view)
            return
        _LOADING.add(kind)
        earlier = dict(_REGISTRY[kind])  # registered before the first lookup: they win over what loads now
        try:
            importlib.import_module(KINDS[kind])
            for ep in entry_points(group=entry_point_group(kind)):
                try:
                    obj = ep.load()
                except Exception as e:  # one broken plugin never hides the others
                    logger.warning("plugin %s = %r (entry point group %s) failed to load: %s: %s", ep.name,
                                   ep.value, ep.group, type(e).__name__, str(e)[:300])
                    continue
                if not isinstance(obj, types.ModuleType):
                    register(kind, ep.name, obj)
        finally:
            _LOADING.discard(kind)
        _REGISTRY[kind].update(earlier)
        _LOADED.add(kind)


def table(kind: str) -> dict[str, Any]:
    """The live ``{name: spec}`` mapping of ``kind`` as registered so far (nothing is loaded): the kind's typed
    front keeps it as its table (``halluscope.programs.registry.REGISTRY``), so what one registers the other sees."""
    return _REGISTRY[_kind(kind)]


def get(kind: str, name: str) -> Any:
    """The extension ``name`` of ``kind``; ``KeyError`` naming the registered ones otherwise."""
    _load(_kind(kind))
    try:
        return _REGISTRY[kind][name]
    except (KeyError, TypeError):
        raise KeyError(f"unknown {kind[:-1]} {name!r}; choose one of: {', '.join(names(kind))}") from None


def names(kind: str) -> list[str]:
    """The registered names of ``kind``, in registration order (built-ins first, then plugins)."""
    _load(_kind(kind))
    return list(_REGISTRY[kind])
