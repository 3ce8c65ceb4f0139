"""A knowledge graph as evidence: triples linearised into sentences with templates, retrieved like passages.

Input is a triples file:

* **TSV** (``.tsv``/``.txt``/anything not ``.nt``): ``subject<TAB>predicate<TAB>object`` a line;
* **N-Triples** (``.nt``): ``<subject> <predicate> <object> .`` with IRIs, blank nodes or literals
  (``"text"``, ``"text"@en``, ``"3"^^<...#integer>``).

Blank lines and lines starting with ``#`` are ignored. A line with the wrong number of fields (not three in a
TSV; not subject, predicate, object and the final ``.`` in N-Triples) is an **error** naming the file and
the line (:class:`TripleFormatError`): a broken graph file is a broken input, not something to skip silently.

Each triple becomes one sentence, ``"S P O."``: IRIs are shortened to their local name (after ``#`` or the
last ``/``), underscores become spaces and camelCase is split (``birthPlace`` → ``birth place``). A template
per predicate (``{"born_in": "{s} was born in {o}."}``) overrides the default. The sentences of one subject
are kept as separate passages, so the best matching facts come first.
"""

from __future__ import annotations

import re
from pathlib import Path
from urllib.parse import unquote

from halluscope.core.contract import Evidence
from halluscope.core.retrieval import register_retriever
from halluscope.retrievers.bm25 import BM25Index, Passage, content_hash

__all__ = ["TripleFormatError", "read_triples", "linearize", "KGRetriever", "DEFAULT_TEMPLATE"]

DEFAULT_TEMPLATE = "{s} {p} {o}."
_NT_TERM = re.compile(r'\s*(<[^>]*>|_:\S+|"(?:[^"\\]|\\.)*"(?:@[\w-]+|\^\^<[^>]*>)?)')


class TripleFormatError(ValueError):
    """A line of a triples file with the wrong arity or syntax."""


def _nt_terms(line: str) -> list[str] | None:
    terms, pos = [], 0
    while True:
        m = _NT_TERM.match(line, pos)
        if not m:
            break
        terms.append(m.group(1))
        pos = m.end()
    rest = line[pos:].strip()
    return terms if rest == "." else None


def read_triples(path: str | Path) -> list[tuple[str, str, str, int]]:
    """``(subject, predicate, object, line)`` of a TSV or N-Triples file (raw terms, see :func:`linearize`)."""
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"kg: triples file {path} does not exist")
    ntriples = path.suffix.lower() == ".nt"
    out = []
    with open(path, encoding="utf-8") as f:
        for lineno, line in enumerate(f, start=1):
            line = line.rstrip("\n\r")
            if not line.strip() or line.lstrip().startswith("#"):
                continue
            if ntriples:
                terms = _nt_terms(line)
                if terms is None or len(terms) != 3:
                    n = "?" if terms is None else len(terms)
                    raise TripleFormatError(f"{path}: line {lineno}: expected '<subject> <predicate> <object> .', "
                                            f"found {n} terms: {line[:120]!r}")
            else:
                terms = line.split("\t")
                if len(terms) != 3 or not all(t.strip() for t in terms):
                    raise TripleFormatError(f"{path}: line {lineno}: expected 3 tab-separated fields "
                                            f"(subject, predicate, object), found {len(terms)}: {line[:120]!r}")
            out.append((terms[0].strip(), terms[1].strip(), terms[2].strip(), lineno))
    if not out:
        raise TripleFormatError(f"{path}: no triples in it")
    return out


def _label(term: str) -> str:
    """A readable name for an N-Triples term or a TSV field."""
    if term.startswith("<") and term.endswith(">"):
        iri = term[1:-1].rstrip("/")
        term = unquote(re.split(r"[#/]", iri)[-1] or iri)
        term = re.sub(r"(?<=[a-z])([A-Z])(?=[a-z])", lambda m: " " + m.group(1).lower(), term)
    elif term.startswith('"'):
        m = re.match(r'"((?:[^"\\]|\\.)*)"', term)
        term = re.sub(r"\\(.)", lambda e: {"n": " ", "t": " "}.get(e.group(1), e.group(1)), m.group(1)) if m else term
    elif term.startswith("_:"):
        term = term[2:]
    return term.replace("_", " ").strip()


def linearize(s: str, p: str, o: str, templates: dict[str, str] | None = None) -> str:
    """One sentence for a triple: the predicate's template (by raw or readable name), else ``"S P O."``."""
    templates = templates or {}
    template = templates.get(p) or templates.get(_label(p)) or DEFAULT_TEMPLATE
    return template.format(s=_label(s), p=_label(p), o=_label(o))


class KGRetriever:
    """BM25 over the linearised triples of a TSV or N-Triples file (see the module docstring).

    Args:
        path: the triples file.
        templates: ``{predicate: "{s} ... {o}."}`` sentence templates (raw predicate or its readable name).
    """

    source = "kg"

    def __init__(self, path: str | Path, templates: dict[str, str] | None = None):
        if not str(path).strip():
            raise ValueError("kg: no triples file given (e.g. -O kg=triples.tsv)")
        self.path = Path(path)
        triples = read_triples(self.path)
        passages = [Passage(f"{self.path.name}:{line}", _label(s), linearize(s, p, o, templates))
                    for s, p, o, line in triples]
        self.index = BM25Index(passages)
        self.hash = content_hash([(p.id, p.text) for p in passages], 0)

    def retrieve(self, query: str, *, k: int = 5, context: str = "") -> list[Evidence]:
        return self.index.evidence(query, k, self.source)

    def cache_key(self) -> str:
        return f"kg?sha256={self.hash}"


register_retriever("kg", KGRetriever)  # make_retriever("kg:ARG") builds KGRetriever(ARG)
