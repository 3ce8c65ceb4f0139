"""User files as evidence: TXT, Markdown, PDF (``pypdf``) and DOCX (``python-docx``), ranked by BM25.

``make_retriever("files:docs/")`` or ``"files:a.pdf,b.docx,notes.md"`` (a folder is read recursively, in
sorted order). Files are read once, when the retriever is built, cut into ≤ 256-token passages and indexed
in memory with the knowledge base's BM25 code (:mod:`halluscope.retrievers.bm25`).

Bad files never stop the others: a file that is too large (over ``max_mb``, default 20 MB), empty, binary,
of an unsupported type, an encrypted or unreadable PDF, a PDF without extractable text (a scan), or a broken
DOCX is **skipped, counted and reported** — :attr:`FileRetriever.skipped` lists ``(path, reason)`` and
:meth:`FileRetriever.report` says it in one line. Only when *no* file is usable does building the retriever
raise :class:`NoUsableFilesError` (naming every file and why).
"""

from __future__ import annotations

from pathlib import Path

from halluscope.contract import Evidence
from halluscope.retrievers.bm25 import BM25Index, content_hash, passages_of

__all__ = ["TEXT_SUFFIXES", "SUFFIXES", "FileSkipped", "NoUsableFilesError", "read_document", "collect_files",
           "FileRetriever"]

TEXT_SUFFIXES = {".txt", ".md", ".markdown", ".text", ".rst"}
SUFFIXES = TEXT_SUFFIXES | {".pdf", ".docx"}
DEFAULT_MAX_MB = 20.0


class FileSkipped(Exception):
    """A file that cannot be used as evidence; the message says why."""


class NoUsableFilesError(ValueError):
    """None of the given files could be read."""


def _read_text_file(path: Path) -> str:
    data = path.read_bytes()
    if b"\x00" in data[:8192]:
        raise FileSkipped("binary file (NUL bytes), not text")
    for enc in ("utf-8-sig", "utf-16") if data[:2] in (b"\xff\xfe", b"\xfe\xff") else ("utf-8-sig",):
        try:
            return data.decode(enc)
        except UnicodeDecodeError:
            continue
    raise FileSkipped("not valid UTF-8 text (binary or another encoding)")


def _read_pdf(path: Path) -> str:
    # pypdf and python-docx are imported only when a file of their type is read (most folders have none)
    from pypdf import PdfReader
    from pypdf.errors import PdfReadError  # (idem)

    try:
        reader = PdfReader(str(path))
        if reader.is_encrypted:
            try:
                ok = reader.decrypt("")
            except Exception as e:  # noqa: BLE001 - pypdf raises several kinds here
                raise FileSkipped(f"encrypted PDF (cannot decrypt without a password: {type(e).__name__})") from None
            if not ok:
                raise FileSkipped("encrypted PDF (a password is needed)")
        text = "\n\n".join((page.extract_text() or "").strip() for page in reader.pages)
    except FileSkipped:
        raise
    except (PdfReadError, Exception) as e:  # noqa: BLE001 - any parser failure is an unreadable PDF
        raise FileSkipped(f"unreadable PDF ({type(e).__name__}: {str(e)[:120]})") from None
    if not text.strip():
        raise FileSkipped("PDF without extractable text (a scan? run OCR first)")
    return text


def _read_docx(path: Path) -> str:
    import docx  # python-docx: only when a .docx file is read (it pulls in lxml)

    try:
        document = docx.Document(str(path))
    except Exception as e:  # noqa: BLE001 - a broken zip, a .doc renamed, ...
        raise FileSkipped(f"unreadable DOCX ({type(e).__name__}: {str(e)[:120]})") from None
    parts = [p.text for p in document.paragraphs if p.text.strip()]
    for table in document.tables:
        for row in table.rows:
            cells = [c.text.strip() for c in row.cells if c.text.strip()]
            if cells:
                parts.append(" | ".join(cells))
    return "\n\n".join(parts)


def read_document(path: str | Path, max_mb: float = DEFAULT_MAX_MB) -> str:
    """The text of one TXT/Markdown/PDF/DOCX file; raises :class:`FileSkipped` with the reason otherwise."""
    path = Path(path)
    if not path.is_file():
        raise FileSkipped("no such file")
    suffix = path.suffix.lower()
    if suffix not in SUFFIXES:
        raise FileSkipped(f"unsupported file type {suffix or '(none)'}; supported: {', '.join(sorted(SUFFIXES))}")
    size = path.stat().st_size
    if size > max_mb * 1024 * 1024:
        raise FileSkipped(f"too large: {size / 1024 / 1024:.1f} MB is over the {max_mb:g} MB limit per file "
                          f"(raise it with files_max_mb / max_mb)")
    if size == 0:
        raise FileSkipped("empty file")
    if suffix == ".pdf":
        text = _read_pdf(path)
    elif suffix == ".docx":
        text = _read_docx(path)
    else:
        text = _read_text_file(path)
    if not text.strip():
        raise FileSkipped("no text in it")
    return text


def collect_files(spec: str | Path | list) -> list[Path]:
    """The files named by ``spec``: a folder (recursively, sorted, hidden files left out), a file, or a
    comma-separated list / Python list of them. A path that does not exist raises ``FileNotFoundError``."""
    items = spec if isinstance(spec, (list, tuple)) else [s for s in str(spec).split(",") if s.strip()]
    if not items:
        raise ValueError("files: no file or folder given (e.g. -O files=docs/ or -O files=a.pdf,b.docx)")
    out: list[Path] = []
    for item in items:
        p = Path(str(item).strip()).expanduser()
        if p.is_dir():
            out.extend(sorted(f for f in p.rglob("*") if f.is_file()
                              and not any(part.startswith(".") for part in f.relative_to(p).parts)))
        elif p.exists():
            out.append(p)
        else:
            raise FileNotFoundError(f"files: {p} does not exist")
    return out


class FileRetriever:
    """BM25 over the passages of user files; see the module docstring for what is skipped and reported.

    Args:
        files: a folder, a file, or a comma-separated list (or list) of files and folders.
        max_mb: size limit per file, in MB (larger files are skipped with a message).
        max_tokens: passage length in tokens.
    """

    source = "file"

    def __init__(self, files: str | Path | list, max_mb: float = DEFAULT_MAX_MB, max_tokens: int = 256):
        self.paths = collect_files(files)
        self.max_mb = float(max_mb)
        self.skipped: list[tuple[str, str]] = []
        docs: list[tuple[str, str]] = []
        for path in self.paths:
            try:
                docs.append((str(path), read_document(path, self.max_mb)))
            except FileSkipped as e:
                self.skipped.append((str(path), str(e)))
        if not docs:
            raise NoUsableFilesError("files: no usable file among " + (
                "; ".join(f"{p}: {why}" for p, why in self.skipped) or "(none found)"))
        self.read = [d for d, _ in docs]
        self.index = BM25Index(passages_of(docs, max_tokens))
        self.hash = content_hash(docs, max_tokens)

    def report(self) -> str:
        """One line: how many files were read and which were skipped, and why."""
        line = f"files: {len(self.read)} read ({len(self.index)} passages)"
        if self.skipped:
            line += f", {len(self.skipped)} skipped: " + "; ".join(f"{p}: {why}" for p, why in self.skipped)
        return line

    def retrieve(self, query: str, *, k: int = 5, context: str = "") -> list[Evidence]:
        return self.index.evidence(query, k, self.source)

    def cache_key(self) -> str:
        return f"files?sha256={self.hash}"
