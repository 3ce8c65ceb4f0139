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
``max_uncompressed_bytes`` or it has more than ``max_zip_members`` members; then its members are inflated here
1 MB at a time, counting the bytes that actually come out (a header may lie: #35), into an uncompressed copy that
python-docx reads. A PDF's streams are decoded under pypdf's output limits set to the same byte bound, and a PDF
with more than ``max_pages`` pages is refused before any page is read. Each PDF/DOCX is read in a forked child
process that is killed when ``max_seconds`` have passed, so one heavy page cannot run past the deadline. Over a
size bound: :class:`DocumentTooLarge`; over the time bound: :class:`DocumentTooSlow` (both :class:`FileSkipped`).
"""

from __future__ import annotations

import io
import time
import zipfile
import zlib
from contextlib import nullcontext
from dataclasses import dataclass, fields
from pathlib import Path

from halluscope.core.contract import Evidence
from halluscope.core.retrieval import register_retriever
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

    def expired(self) -> DocumentTooSlow:
        return DocumentTooSlow(f"{self.what}: text extraction took over {self.seconds:g} s (the limit); "
                               f"upload a shorter excerpt")

    def check(self) -> None:
        if time.monotonic() > self.end:
            raise self.expired()


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
    """Refuse a DOCX whose zip declares more than the bounds, before anything is decompressed: the members'
    declared uncompressed sizes and their count. (Declared sizes can lie: :func:`_docx_package` then counts the
    bytes that actually come out.)"""
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


_READ_CHUNK = 1 << 20


def _docx_package(path: Path, limits: ExtractionLimits) -> io.BytesIO:
    """The DOCX re-packed in memory, uncompressed, from members *we* inflated 1 MB at a time, counting the bytes
    that actually come out (not the sizes the zip declares): python-docx then reads only those bytes.

    ``zipfile`` bounds a member by its *declared* size, but reads a whole member with a single ``decompress``
    call without an output bound: a 3.6 MB DOCX declaring 10 KB for a 1.5 GB ``document.xml`` was inflated whole
    (2.27 GB peak RSS) before "Bad CRC-32" refused it (issue #35, item 1). Read here in bounded chunks, such a
    member stops at its declared size and fails its checksum, in a few MB; a member compressed with anything but
    deflate (DOCX writers use nothing else; ``zipfile``'s bzip2/LZMA readers have no output bound) is refused."""
    out = io.BytesIO()
    total = 0
    try:
        with zipfile.ZipFile(path) as zf, zipfile.ZipFile(out, "w", zipfile.ZIP_STORED) as dst:
            for info in zf.infolist():
                if info.compress_type not in (zipfile.ZIP_STORED, zipfile.ZIP_DEFLATED):
                    raise FileSkipped(f"unreadable DOCX (member {info.filename!r} uses zip compression method "
                                      f"{info.compress_type}; DOCX members are deflated or stored)")
                if info.is_dir():
                    continue
                with zf.open(info) as src, dst.open(info.filename, "w", force_zip64=True) as sink:
                    while chunk := src.read(_READ_CHUNK):
                        total += len(chunk)
                        if total > limits.max_uncompressed_bytes:
                            raise DocumentTooLarge(
                                f"DOCX that inflates to more than {limits.max_uncompressed_bytes} bytes, over the "
                                f"{limits.max_uncompressed_bytes}-byte limit on uncompressed content")
                        sink.write(chunk)
    except zipfile.BadZipFile as e:  # "Bad CRC-32 for file ...": the data is not what the header declares
        raise FileSkipped(f"unreadable DOCX ({str(e)[:120]}: a member's data does not match the size and checksum "
                          f"its zip header declares)") from None
    except (OSError, EOFError, ValueError, NotImplementedError, zlib.error) as e:
        raise FileSkipped(f"unreadable DOCX ({type(e).__name__}: {str(e)[:120]})") from None
    out.seek(0)
    return out


def _read_docx(path: Path, limits: ExtractionLimits = DEFAULT_LIMITS) -> str:
    import docx  # python-docx: only when a .docx file is read (it pulls in lxml)

    deadline = _Deadline(limits.max_seconds, "DOCX")
    _check_docx_zip(path, limits)
    package = _docx_package(path, limits)
    deadline.check()
    try:
        document = docx.Document(package)
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


# -- PDF/DOCX text in a worker process with a hard deadline ------------------------------------------------------
#
# pypdf checks nothing while it parses one page: a 51 KB one-page PDF whose content stream inflates to 15 MB kept
# ``page.extract_text()`` busy for 218 s (CLI, limit 60 s) and 178 s behind ``/v1/evidence`` (limit 20 s), since
# the time bound was checked between pages only (issue #35, item 2). A thread cannot be stopped; a process can:
# each PDF/DOCX is read in a forked child process that is killed at ``max_seconds`` (a fork costs milliseconds).

_KINDS = {".pdf": "PDF", ".docx": "DOCX"}
_ERRORS = {"FileSkipped": FileSkipped, "DocumentTooLarge": DocumentTooLarge, "DocumentTooSlow": DocumentTooSlow}


def _worker(conn, suffix: str, path: str, limits: ExtractionLimits) -> None:
    try:
        text = (_read_pdf if suffix == ".pdf" else _read_docx)(Path(path), limits)
        conn.send(("ok", text))
    except FileSkipped as e:
        conn.send((type(e).__name__ if type(e).__name__ in _ERRORS else "FileSkipped", str(e)))
    except BaseException as e:  # noqa: BLE001 - MemoryError, a parser bug: an unreadable file, said in one line
        conn.send(("FileSkipped", f"unreadable {_KINDS[suffix]} ({type(e).__name__}: {str(e)[:120]})"))
    finally:
        conn.close()


def _context():
    """``fork`` where there is one (Linux, macOS): the child starts at once, and never re-imports the caller's
    ``__main__`` (``spawn``/``forkserver`` do, which re-runs a script without an ``if __name__ == "__main__"``
    guard). The readers are imported before the fork, so the child takes no import lock another thread might
    hold. Elsewhere, and inside a daemonic worker process: None, and the document is read in this process (the
    deadline is checked between pages)."""
    import multiprocessing as mp

    if "fork" not in mp.get_all_start_methods() or mp.current_process().daemon:  # a daemon may have no children
        return None
    return mp.get_context("fork")


def _extract_in_worker(suffix: str, path: Path, limits: ExtractionLimits) -> str:
    """The text of a PDF/DOCX read in a child process that is killed when ``limits.max_seconds`` have passed
    (:class:`DocumentTooSlow`); the child's own errors come back as the same :class:`FileSkipped` kinds."""
    ctx = _context()
    if ctx is None:
        return (_read_pdf if suffix == ".pdf" else _read_docx)(path, limits)
    if suffix == ".pdf":
        import pypdf  # noqa: F401 - imported before the fork (see _context)
    else:
        import docx  # noqa: F401 - (idem)
    receive, send = ctx.Pipe(duplex=False)
    child = ctx.Process(target=_worker, args=(send, suffix, str(path), limits), daemon=True,
                        name="halluscope-extract")
    try:
        child.start()
    except OSError:  # no process to spare (EAGAIN, ENOMEM): read it here, as without fork
        send.close()
        receive.close()
        return (_read_pdf if suffix == ".pdf" else _read_docx)(path, limits)
    send.close()
    try:
        if not receive.poll(limits.max_seconds):
            raise _Deadline(limits.max_seconds, _KINDS[suffix]).expired()
        try:
            kind, payload = receive.recv()
        except EOFError:
            child.join(5)
            raise FileSkipped(f"unreadable {_KINDS[suffix]} (the process reading it ended without a result, exit "
                              f"code {child.exitcode}: out of memory?)") from None
    finally:
        receive.close()
        if child.is_alive():
            child.kill()
        child.join(5)
    if kind == "ok":
        return payload
    raise _ERRORS[kind](payload)


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
    if suffix in (".pdf", ".docx"):
        text = _extract_in_worker(suffix, path, limits)
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


register_retriever("files", FileRetriever)  # make_retriever("files:ARG") builds FileRetriever(ARG)
