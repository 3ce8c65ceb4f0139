"""User files as evidence: TXT, Markdown, PDF (``pypdf``) and DOCX (``python-docx``), ranked by BM25.

``make_retriever("files:docs/")`` or ``"files:a.pdf,b.docx,notes.md"`` (a folder is read recursively, in
sorted order). Files are read once, when the retriever is built, cut into ≤ 256-token passages and indexed
in memory with the knowledge base's BM25 code (:mod:`halluscope.retrievers.bm25`).

Bad files never stop the others: a file that is too large (over ``max_mb``, default 20 MB), empty, binary,
of an unsupported type, an encrypted or unreadable PDF, a PDF without extractable text (a scan), a broken
DOCX, or a document over the extraction bounds (:class:`ExtractionLimits`) is **skipped, counted and reported** — :attr:`FileRetriever.skipped` lists ``(path, reason)`` and
:meth:`FileRetriever.report` says it in one line. Only when *no* file is usable does building the retriever
raise :class:`NoUsableFilesError` (naming every file and why).

Extraction is bounded (:class:`ExtractionLimits`), because a small file can expand hugely: a DOCX is a zip, and a
146 KB one whose members inflate to gigabytes cost 75 s of CPU and 1.2 GB of memory before these bounds (issue
#24). A DOCX is refused before anything is decompressed when its members' uncompressed sizes add up to more than
``max_uncompressed_bytes`` or it has more than ``max_zip_members`` members (Python's ``zipfile``, which
python-docx reads through, never inflates a member past its declared size, so the declared sizes bound the
memory); a PDF's streams are decoded under pypdf's output limits set to the same byte bound, and a PDF with more
than ``max_pages`` pages is refused before any page is read. Both stop when ``max_seconds`` have passed (checked
between pages, paragraphs and tables). Over a size bound: :class:`DocumentTooLarge`; over the time bound:
:class:`DocumentTooSlow` (both :class:`FileSkipped`).
"""

from __future__ import annotations

import time
import zipfile
from contextlib import nullcontext
from dataclasses import dataclass, fields
from pathlib import Path

from halluscope.core.contract import Evidence
from halluscope.retrievers.bm25 import BM25Index, content_hash, passages_of

__all__ = ["TEXT_SUFFIXES", "SUFFIXES", "ExtractionLimits", "FileSkipped", "DocumentTooLarge", "DocumentTooSlow",
           "NoUsableFilesError", "read_document", "collect_files", "FileRetriever"]

TEXT_SUFFIXES = {".txt", ".md", ".markdown", ".text", ".rst"}
SUFFIXES = TEXT_SUFFIXES | {".pdf", ".docx"}
DEFAULT_MAX_MB = 20.0


class FileSkipped(Exception):
    """A file that cannot be used as evidence; the message says why."""


class DocumentTooLarge(FileSkipped):
    """A document over a size bound of :class:`ExtractionLimits` (uncompressed bytes, zip members, pages)."""


class DocumentTooSlow(FileSkipped):
    """A document whose text took longer than :attr:`ExtractionLimits.max_seconds` to extract."""


@dataclass(frozen=True)
class ExtractionLimits:
    """Bounds on reading one PDF/DOCX (see the module docstring)."""

    max_uncompressed_bytes: int = 50_000_000  # DOCX: all zip members together; PDF: each decoded stream
    max_zip_members: int = 2_000
    max_pages: int = 1_000
    max_seconds: float = 60.0

    def __post_init__(self):
        for name in ("max_uncompressed_bytes", "max_zip_members", "max_pages", "max_seconds"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, (int, float)) or not value > 0:
                raise ValueError(f"ExtractionLimits.{name}: must be a number > 0, got {value!r}")


DEFAULT_LIMITS = ExtractionLimits()


class _Deadline:
    def __init__(self, seconds: float, what: str):
        self.seconds, self.what, self.end = seconds, what, time.monotonic() + seconds

    def check(self) -> None:
        if time.monotonic() > self.end:
            raise DocumentTooSlow(f"{self.what}: text extraction took over {self.seconds:g} s (the limit); "
                                  f"upload a shorter excerpt")


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


def _pdf_configuration(limits: ExtractionLimits):
    """pypdf's decompression limits set to ``limits`` while reading (pypdf 7 has them; an older one: its defaults)."""
    try:
        from pypdf import Configuration, apply_configuration
    except ImportError:  # an older pypdf: its own module-level defaults apply
        return nullcontext()
    n = int(limits.max_uncompressed_bytes)
    wanted = {name: n for name in (
        "maximum_declared_stream_length", "array_based_stream_maximum_output_length", "jbig2_maximum_output_length",
        "lzw_maximum_output_length", "run_length_maximum_output_length", "zlib_maximum_output_length",
        "brotli_maximum_output_length", "image_maximum_buffer_size")}
    wanted.update(stream_decoding_work_maximum_length=4 * n, xfa_decoding_work_maximum_length=4 * n)
    known = {f.name for f in fields(Configuration)}
    return apply_configuration(**{k: v for k, v in wanted.items() if k in known})


def _read_pdf(path: Path, limits: ExtractionLimits = DEFAULT_LIMITS) -> str:
    # pypdf and python-docx are imported only when a file of their type is read (most folders have none)
    from pypdf import PdfReader
    from pypdf.errors import PdfReadError  # (idem)

    deadline = _Deadline(limits.max_seconds, "PDF")
    try:
        with _pdf_configuration(limits):
            reader = PdfReader(str(path))
            if reader.is_encrypted:
                try:
                    ok = reader.decrypt("")
                except Exception as e:  # noqa: BLE001 - pypdf raises several kinds here
                    raise FileSkipped(f"encrypted PDF (cannot decrypt without a password: {type(e).__name__})") from None
                if not ok:
                    raise FileSkipped("encrypted PDF (a password is needed)")
            n_pages = len(reader.pages)
            if n_pages > limits.max_pages:
                raise DocumentTooLarge(f"PDF with {n_pages} pages, over the {limits.max_pages}-page limit; upload "
                                       f"the pages that matter")
            parts = []
            for page in reader.pages:
                deadline.check()
                parts.append((page.extract_text() or "").strip())
            deadline.check()
            text = "\n\n".join(parts)
    except FileSkipped:
        raise
    except (PdfReadError, Exception) as e:  # noqa: BLE001 - any parser failure is an unreadable PDF
        if type(e).__name__ == "LimitReachedError":  # pypdf's decompression bounds (pypdf.errors, pypdf >= 6)
            raise DocumentTooLarge(f"PDF over the extraction limits ({str(e)[:160]}); the limit is "
                                   f"{limits.max_uncompressed_bytes} uncompressed bytes per stream") from None
        raise FileSkipped(f"unreadable PDF ({type(e).__name__}: {str(e)[:120]})") from None
    if not text.strip():
        raise FileSkipped("PDF without extractable text (a scan? run OCR first)")
    return text


def _check_docx_zip(path: Path, limits: ExtractionLimits) -> None:
    """Refuse a DOCX whose zip would inflate past the bounds, before anything is decompressed: the members'
    declared uncompressed sizes (``zipfile`` never inflates a member past its declared size) and their count."""
    try:
        with zipfile.ZipFile(path) as zf:
            members = zf.infolist()
    except (zipfile.BadZipFile, OSError, ValueError) as e:
        raise FileSkipped(f"unreadable DOCX (not a zip file: {str(e)[:120]})") from None
    if len(members) > limits.max_zip_members:
        raise DocumentTooLarge(f"DOCX with {len(members)} zip members, over the {limits.max_zip_members}-member "
                               f"limit")
    total = sum(m.file_size for m in members)
    if total > limits.max_uncompressed_bytes:
        size = path.stat().st_size
        raise DocumentTooLarge(f"DOCX that inflates to {total} bytes ({total / max(size, 1):.0f} times its "
                               f"{size} bytes), over the {limits.max_uncompressed_bytes}-byte limit on "
                               f"uncompressed content")


def _read_docx(path: Path, limits: ExtractionLimits = DEFAULT_LIMITS) -> str:
    import docx  # python-docx: only when a .docx file is read (it pulls in lxml)

    deadline = _Deadline(limits.max_seconds, "DOCX")
    _check_docx_zip(path, limits)
    try:
        document = docx.Document(str(path))
    except Exception as e:  # noqa: BLE001 - a broken zip, a .doc renamed, ...
        raise FileSkipped(f"unreadable DOCX ({type(e).__name__}: {str(e)[:120]})") from None
    deadline.check()
    parts = []
    for i, p in enumerate(document.paragraphs):
        if i % 256 == 0:
            deadline.check()
        if p.text.strip():
            parts.append(p.text)
    for table in document.tables:
        deadline.check()
        for row in table.rows:
            cells = [c.text.strip() for c in row.cells if c.text.strip()]
            if cells:
                parts.append(" | ".join(cells))
    deadline.check()
    return "\n\n".join(parts)


def read_document(path: str | Path, max_mb: float = DEFAULT_MAX_MB,
                  limits: ExtractionLimits = DEFAULT_LIMITS) -> str:
    """The text of one TXT/Markdown/PDF/DOCX file; raises :class:`FileSkipped` with the reason otherwise
    (:class:`DocumentTooLarge` / :class:`DocumentTooSlow` for a document over the extraction ``limits``)."""
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
        text = _read_pdf(path, limits)
    elif suffix == ".docx":
        text = _read_docx(path, limits)
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
        limits: bounds on reading each PDF/DOCX (:class:`ExtractionLimits`; a file over them is skipped).
    """

    source = "file"

    def __init__(self, files: str | Path | list, max_mb: float = DEFAULT_MAX_MB, max_tokens: int = 256,
                 limits: ExtractionLimits = DEFAULT_LIMITS):
        self.paths = collect_files(files)
        self.max_mb = float(max_mb)
        self.limits = limits
        self.skipped: list[tuple[str, str]] = []
        docs: list[tuple[str, str]] = []
        for path in self.paths:
            try:
                docs.append((str(path), read_document(path, self.max_mb, self.limits)))
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
