"""Evidence files uploaded to ``halluscope serve`` (``POST /v1/evidence``), read on the server.

The page sends each file as ``{"filename": "report.pdf", "content_base64": "..."}`` (base64 in JSON: no
multipart parser is needed) and gets its text back, which it then sends as an evidence passage to
``/v1/detect``. Reading is :func:`halluscope.retrievers.files.read_document` (TXT, Markdown, PDF via pypdf,
DOCX via python-docx) on a private temporary copy that is deleted at once; nothing is kept. Every problem is
an :class:`EvidenceFileError` with an HTTP status and a message naming the file: an unsupported type (415),
a file over the size limit (413), a PDF/DOCX over the extraction bounds (:class:`~halluscope.retrievers.files.
ExtractionLimits`: uncompressed bytes — a zip-bomb DOCX is refused before anything is inflated — zip members,
pages: 413; extraction time: 422), bad base64, an empty, binary, encrypted, unreadable or text-less file, or a
text over the evidence limit (422).
"""

from __future__ import annotations

import base64
import binascii
import tempfile
from pathlib import Path, PurePosixPath

from halluscope.retrievers.files import (DEFAULT_LIMITS, SUFFIXES, DocumentTooLarge, ExtractionLimits, FileSkipped,
                                        read_document)

__all__ = ["EvidenceFileError", "SUFFIXES", "read_uploaded"]


class EvidenceFileError(Exception):
    """An uploaded evidence file that cannot be used; ``status`` is the HTTP status to answer with."""

    def __init__(self, status: int, message: str):
        super().__init__(message)
        self.status, self.message = status, message


def read_uploaded(filename: str, content_base64: str, *, max_bytes: int, max_chars: int,
                  extraction: ExtractionLimits = DEFAULT_LIMITS) -> dict:
    """``{"filename", "type", "bytes", "chars", "text"}`` of one uploaded file (its text stripped); a PDF/DOCX is
    read within ``extraction``'s bounds.

    ``filename`` only gives the type (its suffix) and the name reported back; the path in it is dropped."""
    name = PurePosixPath(str(filename).replace("\\", "/")).name.strip() or "(unnamed)"
    suffix = PurePosixPath(name).suffix.lower()
    if suffix not in SUFFIXES:
        raise EvidenceFileError(415, f"{name}: unsupported file type {suffix or '(none)'}; supported: "
                                     f"{', '.join(sorted(SUFFIXES))}")
    if len(content_base64) > (max_bytes + 2) // 3 * 4 + 4:  # before decoding: no large allocation for nothing
        raise EvidenceFileError(413, f"{name}: too large: about {len(content_base64) * 3 // 4} bytes, the limit "
                                     f"is {max_bytes} bytes per file")
    try:
        data = base64.b64decode(content_base64, validate=True)
    except (binascii.Error, ValueError):
        raise EvidenceFileError(422, f"content_base64: the content of {name} is not valid base64") from None
    if len(data) > max_bytes:
        raise EvidenceFileError(413, f"{name}: too large: {len(data)} bytes, the limit is {max_bytes} bytes per file")
    if not data:
        raise EvidenceFileError(422, f"{name}: empty file")
    with tempfile.TemporaryDirectory(prefix="halluscope-upload-") as tmp:
        path = Path(tmp) / f"upload{suffix}"
        path.write_bytes(data)
        try:
            text = read_document(path, max_mb=max_bytes / 1024 / 1024 + 1,  # the size is checked above
                                 limits=extraction)
        except DocumentTooLarge as e:
            raise EvidenceFileError(413, f"{name}: {e}") from None
        except FileSkipped as e:  # DocumentTooSlow included
            raise EvidenceFileError(422, f"{name}: {e}") from None
    text = text.strip()
    if len(text) > max_chars:
        raise EvidenceFileError(422, f"{name}: its text has {len(text)} characters, over the {max_chars}-character "
                                     f"evidence limit; upload a shorter excerpt")
    return {"filename": name, "type": suffix[1:], "bytes": len(data), "chars": len(text), "text": text}
