"""A local knowledge base: BM25 over ≤ 256-token passages of a document collection, indexed once on disk.

Build an index from a **folder** of documents (``.txt``/``.md`` and also ``.pdf``/``.docx``, read as in
:mod:`halluscope.retrievers.files`; the document id is the path relative to the folder) or a **JSONL** file of
documents (one ``{"id": ..., "text": ...}`` object a line; a line without them is an error naming the line):

    halluscope index build docs/ --out indexes/docs          # or corpus.jsonl
    halluscope evaluate --program medico -O sources=kb -O kb=indexes/docs ...

The index folder holds bm25s's own ``.npy``/JSON files, ``passages.jsonl`` and ``meta.json`` (with the
corpus **content hash**: documents, chunk size, tokenizer version). :func:`build_index` reuses an index whose
hash matches instead of rebuilding it, and writes a new one into a temporary folder that replaces the old one
only when complete. ``make_retriever("kb:INDEX_DIR")`` loads it; a missing or incomplete index is a clear
error that says how to build one.
"""

from __future__ import annotations

import json
import os
import shutil
import tempfile
from dataclasses import dataclass
from pathlib import Path

from halluscope.core.contract import Evidence
from halluscope.core.retrieval import register_retriever
from halluscope.core.fileio import read_jsonl
from halluscope.retrievers.bm25 import BM25Index, content_hash, passages_of
from halluscope.retrievers.files import FileSkipped, collect_files, read_document

__all__ = ["BuildResult", "read_corpus", "build_index", "KBRetriever"]


def read_corpus(source: str | Path, max_mb: float = 20.0) -> tuple[list[tuple[str, str]], list[tuple[str, str]]]:
    """``(documents, skipped)`` of a folder or a JSONL file: documents are ``(id, text)``, skipped files are
    ``(path, reason)`` (folders only: unreadable, empty, binary or too large files)."""
    source = Path(source)
    if not source.exists():
        raise FileNotFoundError(f"knowledge-base source {source} does not exist")
    docs: list[tuple[str, str]] = []
    skipped: list[tuple[str, str]] = []
    if source.is_file() and source.suffix.lower() in (".jsonl", ".ndjson"):
        seen: set[str] = set()
        for lineno, rec in read_jsonl(source):
            if "text" not in rec or not isinstance(rec["text"], str):
                raise ValueError(f"{source}: line {lineno}: a document needs a string 'text' field")
            doc_id = str(rec.get("id", f"line{lineno}"))
            if doc_id in seen:
                raise ValueError(f"{source}: line {lineno}: duplicate document id {doc_id!r}")
            seen.add(doc_id)
            if rec["text"].strip():
                docs.append((doc_id, rec["text"]))
            else:
                skipped.append((f"{source}:{lineno}", "empty text"))
        return docs, skipped
    base = source if source.is_dir() else source.parent
    for path in collect_files(source):
        try:
            docs.append((str(path.relative_to(base)), read_document(path, max_mb)))
        except FileSkipped as e:
            skipped.append((str(path), str(e)))
    return docs, skipped


@dataclass
class BuildResult:
    folder: Path
    documents: int
    passages: int
    skipped: list[tuple[str, str]]
    hash: str
    reused: bool


def build_index(source: str | Path, out: str | Path, *, max_tokens: int = 256, max_mb: float = 20.0,
                force: bool = False) -> BuildResult:
    """Index ``source`` into the folder ``out``; an index there with the same content hash is reused."""
    docs, skipped = read_corpus(source, max_mb)
    if not docs:
        raise ValueError(f"knowledge-base source {source}: no usable documents"
                         + (" (" + "; ".join(f"{p}: {w}" for p, w in skipped[:10]) + ")" if skipped else ""))
    digest = content_hash(docs, max_tokens)
    out = Path(out)
    meta_path = out / "meta.json"
    if not force and meta_path.is_file():
        try:
            meta = json.loads(meta_path.read_text(encoding="utf-8"))
        except (OSError, json.JSONDecodeError):
            meta = {}
        if meta.get("hash") == digest:
            BM25Index.load(out)  # still loads: reuse it
            return BuildResult(out, meta.get("documents", len(docs)), meta.get("passages", 0), skipped, digest, True)
    passages = passages_of(docs, max_tokens)
    index = BM25Index(passages, meta={"hash": digest, "source": str(source), "documents": len(docs),
                                      "max_tokens": max_tokens})
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(dir=out.parent, prefix=f".{out.name}.", suffix=".tmp"))
    try:
        index.save(tmp)
        if out.exists():
            old = out.with_name(f".{out.name}.old.{os.getpid()}")
            os.replace(out, old)
            os.replace(tmp, out)
            shutil.rmtree(old, ignore_errors=True)
        else:
            os.replace(tmp, out)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return BuildResult(out, len(docs), len(passages), skipped, digest, False)


class KBRetriever:
    """Passages of a knowledge-base index built by :func:`build_index`, best BM25 score first."""

    source = "kb"

    def __init__(self, index_dir: str | Path):
        if not str(index_dir).strip():
            raise ValueError("kb: no index folder given (e.g. -O kb=indexes/docs; build one with "
                             "halluscope index build SOURCE --out DIR)")
        self.index_dir = Path(index_dir)
        self.index = BM25Index.load(self.index_dir)

    def retrieve(self, query: str, *, k: int = 5, context: str = "") -> list[Evidence]:
        return self.index.evidence(query, k, self.source)

    def cache_key(self) -> str:
        return f"kb?hash={self.index.meta.get('hash', '')}"


register_retriever("kb", KBRetriever)  # make_retriever("kb:ARG") builds KBRetriever(ARG)
