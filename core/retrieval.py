"""The evidence seam: a :class:`Retriever` turns a query into ranked :class:`~halluscope.core.contract.Evidence`.

Retrievers are configured like LMs: by a spec string (``"context"`` here; the knowledge-base, file, graph
and search retrievers register their own names in their modules) through :func:`make_retriever`, which builds one
from the factory :func:`get_retriever` finds (the front of the ``retrievers`` kind of
:mod:`halluscope.core.extensions`, re-exported by :mod:`halluscope.retrievers`), and cached on disk like
LM calls by wrapping them in :class:`CachedRetriever`. Programs take a retriever (or a spec) as a build
option, so the same detector runs on the item's own context in a benchmark and on a knowledge base in
production.

A retriever is any object with ``source`` (a short name that goes into each Evidence) and
``retrieve(query, *, k, context="") -> list[Evidence]`` returning at most ``k`` pieces, best first.
``context`` is the item's own reference text (Mu-SHROOM's retrieved context, HaluEval's knowledge); a
retriever that does not use it ignores it.
"""

from __future__ import annotations

import hashlib
import json
import re
from pathlib import Path
from typing import Any, Callable, Protocol, runtime_checkable

import diskcache

from halluscope.core import extensions, paths
from halluscope.core.contract import Evidence

__all__ = ["Retriever", "ContextRetriever", "CachedRetriever", "register_retriever", "get_retriever",
           "retriever_names", "make_retriever"]


@runtime_checkable
class Retriever(Protocol):
    source: str

    def retrieve(self, query: str, *, k: int = 5, context: str = "") -> list[Evidence]:
        """At most ``k`` pieces of evidence for ``query``, most relevant first."""
        ...


_WORD = re.compile(r"\w+", re.UNICODE)


def _words(text: str) -> set[str]:
    return {w.casefold() for w in _WORD.findall(text)}


def _passages(text: str, max_chars: int) -> list[str]:
    """Paragraphs of ``text``; a paragraph longer than ``max_chars`` is cut at word boundaries."""
    out = []
    for para in re.split(r"\n\s*\n", text):
        para = para.strip()
        while len(para) > max_chars:
            cut = para.rfind(" ", 0, max_chars)
            cut = cut if cut > max_chars // 2 else max_chars
            out.append(para[:cut].strip())
            para = para[cut:].strip()
        if para:
            out.append(para)
    return out


class ContextRetriever:
    """The item's given context as evidence: its paragraphs (at most ``max_chars`` each), ranked by the
    share of the query's words they contain (ties keep document order). No context, no evidence."""

    source = "context"

    def __init__(self, max_chars: int = 1200) -> None:
        if max_chars < 1:
            raise ValueError(f"max_chars must be at least 1, not {max_chars}")
        self.max_chars = max_chars

    def retrieve(self, query: str, *, k: int = 5, context: str = "") -> list[Evidence]:
        passages = _passages(context or "", self.max_chars)
        q = _words(query or "")
        scored = [(len(q & _words(p)) / len(q) if q else 0.0, i, p) for i, p in enumerate(passages)]
        scored.sort(key=lambda t: (-t[0], t[1]))
        return [Evidence(text=p, source=self.source, id=f"context#{i}", score=round(s, 6))
                for s, i, p in scored[: max(k, 0)]]

    def cache_key(self) -> str:
        return f"context?max_chars={self.max_chars}"


class CachedRetriever:
    """``retriever`` with its results kept in a disk cache (default ``<cache dir>/retrieval``), keyed by the
    retriever's ``cache_key()`` (or its class name), the query, ``k`` and the context's hash."""

    def __init__(self, retriever: Retriever, cache_dir: str | Path | None = None) -> None:
        self.inner = retriever
        self.source = retriever.source
        folder = Path(cache_dir) if cache_dir is not None else paths.cache_dir().parent / "retrieval"
        self.cache = diskcache.Cache(str(folder))

    def _key(self, query: str, k: int, context: str) -> str:
        ident = getattr(self.inner, "cache_key", lambda: type(self.inner).__name__)()
        blob = json.dumps([ident, query, k, hashlib.sha256(context.encode()).hexdigest()], ensure_ascii=False)
        return hashlib.sha256(blob.encode()).hexdigest()

    def retrieve(self, query: str, *, k: int = 5, context: str = "") -> list[Evidence]:
        key = self._key(query, k, context or "")
        hit = self.cache.get(key)
        if hit is not None:
            return [Evidence(**e) for e in json.loads(hit)]
        found = self.inner.retrieve(query, k=k, context=context)
        self.cache.set(key, json.dumps([e.to_dict() for e in found], ensure_ascii=False))
        return found


def register_retriever(prefix: str, factory: Callable[[str], Retriever]) -> None:
    """Make ``make_retriever("<prefix>")`` and ``make_retriever("<prefix>:<arg>")`` call ``factory(arg)``."""
    extensions.register("retrievers", prefix, factory)


def get_retriever(name: str) -> Callable[[str], Retriever]:
    """The factory registered as ``name`` (a built-in, or a plugin's through its ``halluscope.retrievers`` entry
    point): ``get_retriever("files")("docs/")`` is a :class:`~halluscope.retrievers.files.FileRetriever` over
    ``docs/``. ``KeyError`` naming the registered ones otherwise. To build a retriever from a spec string
    (``"files:docs/"``), call :func:`make_retriever`, which looks the prefix up here."""
    try:
        factory = extensions.get("retrievers", name)
    except KeyError:
        raise KeyError(f"unknown retriever {name!r}; choose one of: {', '.join(retriever_names())}") from None
    if not callable(factory):
        raise TypeError(f"retriever {name!r} is registered as a {type(factory).__name__}, not a factory")
    return factory


def retriever_names() -> list[str]:
    """The registered retriever prefixes (the built-ins of :mod:`halluscope.retrievers` and installed plugins'
    ``halluscope.retrievers`` entry points, loaded on first use), sorted."""
    return sorted(extensions.names("retrievers"))


def make_retriever(spec: str | Retriever, *, cache: bool = False, cache_dir: str | Path | None = None,
                   **options: Any) -> Retriever:
    """A retriever built from a spec string ``NAME[:ARG]`` (``"context"``, ``"context:800"`` = 800-character
    passages): the factory :func:`get_retriever` returns for ``NAME``, called with ``ARG``; or a ready retriever; ``cache=True`` wraps it in :class:`CachedRetriever`. ``options`` go to the factory as keywords
    (``make_retriever("files:docs/", max_mb=5)``; a factory that takes none refuses them)."""
    if isinstance(spec, str):
        prefix, _, arg = spec.partition(":")
        names = retriever_names()  # loads the built-in retrievers and plugins on first use
        if prefix not in names:
            raise ValueError(f"unknown retriever {spec!r}; choose one of: {', '.join(names)}")
        retriever = get_retriever(prefix)(arg, **options)
    elif isinstance(spec, Retriever):
        retriever = spec
    else:
        raise TypeError(f"a retriever spec is a string or an object with source and retrieve(), not {spec!r}")
    return CachedRetriever(retriever, cache_dir) if cache else retriever


def _context_factory(arg: str) -> ContextRetriever:
    if not arg:
        return ContextRetriever()
    try:
        return ContextRetriever(max_chars=int(arg))
    except ValueError:
        raise ValueError(f"retriever 'context:{arg}': the argument is a passage length in characters") from None


register_retriever("context", _context_factory)
