"""File helpers: JSON-lines reading with errors that name the file and line, and atomic writes."""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import tempfile
from pathlib import Path

from halluscope.core.safejson import check_regular_file, loads as json_loads

try:
    import fcntl
except ImportError:  # Windows
    fcntl = None

__all__ = ["file_sha256", "read_jsonl", "iter_jsonl", "write_text_atomic", "atomic_writer", "create_unique_dir", "file_lock",
           "UnsafeFolderError", "private_dir"]


def read_jsonl(path: str | os.PathLike) -> list[tuple[int, dict]]:
    """``(line_number, record)`` for each non-blank line of ``path`` (UTF-8; a leading byte-order mark is accepted).

    A line that is not UTF-8, not JSON, or not a JSON object raises ``ValueError`` naming the file and the line.
    """
    return list(iter_jsonl(path))


def iter_jsonl(path: str | os.PathLike):
    """:func:`read_jsonl` one line at a time (a large file is never held whole). ``path`` must be a regular file
    (a FIFO or a device is refused before it is opened) and a line nested deeper than
    :data:`halluscope.core.safejson.MAX_JSON_DEPTH` is refused naming the line."""
    check_regular_file(path)
    with open(path, "rb") as f:
        for lineno, raw in enumerate(f, start=1):
            if lineno == 1 and raw.startswith(b"\xef\xbb\xbf"):
                raw = raw[3:]
            try:
                line = raw.decode("utf-8")
            except UnicodeDecodeError as e:
                raise ValueError(f"{path}: line {lineno}: not UTF-8 text (byte 0x{raw[e.start]:02x} at column "
                                 f"{e.start + 1}); save the file as UTF-8") from None
            if not line.strip():
                continue
            try:
                rec = json_loads(line, where=f"{path}: line {lineno}")
            except json.JSONDecodeError as e:
                raise ValueError(f"{path}: line {lineno}: malformed JSON ({e.msg} at column {e.colno})") from None
            if not isinstance(rec, dict):
                raise ValueError(f"{path}: line {lineno}: expected a JSON object, got {type(rec).__name__}")
            yield lineno, rec


def write_text_atomic(path: str | Path, text: str) -> Path:
    """Write ``text`` to ``path`` atomically: a temp file in the same folder, fsync, then ``os.replace``.
    Readers see the old file or the new one, never a partial one; parent folders are created."""
    with atomic_writer(path) as f:
        f.write(text)
    return Path(path)


@contextlib.contextmanager
def atomic_writer(path: str | Path):
    """A text file to write in a ``with`` block, streamed: a temp file in the same folder, then fsync and
    ``os.replace`` when the block ends without an error (removed otherwise), as :func:`write_text_atomic`."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            yield f
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        try:
            os.unlink(tmp)
        except OSError:
            pass
        raise


def create_unique_dir(root: str | Path, name: str) -> Path:
    """A new folder ``root/name`` created exclusively (``name-2``, ``name-3``, ... when taken), so two runs started
    at the same moment never share (and overwrite) one. ``root`` is created if needed."""
    root = Path(root)
    root.mkdir(parents=True, exist_ok=True)
    for i in range(1, 10_000):
        candidate = root / (name if i == 1 else f"{name}-{i}")
        try:
            candidate.mkdir()
            return candidate
        except FileExistsError:
            continue
    raise FileExistsError(f"could not create a new folder {name}-N under {root}")


@contextlib.contextmanager
def file_lock(path: str | Path):
    """An exclusive inter-process lock on the file ``path`` (created, with its folder) for the ``with`` block:
    processes that take the same lock run the block one at a time. Where ``fcntl`` is missing (Windows) it does
    not lock."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "a+") as f:
        if fcntl is not None:
            fcntl.flock(f, fcntl.LOCK_EX)
        try:
            yield
        finally:
            if fcntl is not None:
                fcntl.flock(f, fcntl.LOCK_UN)


class UnsafeFolderError(ValueError):
    """A folder whose contents are trusted as code (DSPy's reply cache unpickles what it reads) that another user
    could write to."""


def private_dir(path: str | Path, what: str = "folder") -> Path:
    """``path`` created private to this user (mode 0700) when it does not exist; an existing one is refused
    (:class:`UnsafeFolderError`, one line) when it, or a folder or file directly in it or one level further
    down (DSPy's cache shards ``000/cache.db``), is owned by another user or writable by group or others.

    Why: DSPy's disk cache stores replies as pickles and unpickles what it reads; rewriting two rows of its
    ``cache.db`` made the next ``evaluate`` run ``os.system`` (issue #35, item 10). Whoever can write the cache
    can run code as the user, so only the user may. On a system without ``os.getuid`` (Windows) the folder is
    only created."""
    path = Path(path)
    path.mkdir(mode=0o700, parents=True, exist_ok=True)
    if not hasattr(os, "getuid"):
        return path
    uid = os.getuid()
    entries = [path]
    for child in path.iterdir():
        entries.append(child)
        if child.is_dir() and not child.is_symlink():
            entries.extend(child.iterdir())
    for entry in entries:
        st = entry.stat() if entry == path else entry.lstat()  # the folder itself may be a link to elsewhere
        mode = st.st_mode & 0o777
        if st.st_uid != uid:
            raise UnsafeFolderError(f"the {what} {entry} belongs to another user (uid {st.st_uid}); its contents are "
                                    f"loaded as code (pickles), so it must be yours: use another folder")
        if mode & 0o022 and not entry.is_symlink():
            who = "group and others" if mode & 0o022 == 0o022 else "others" if mode & 0o002 else "its group"
            raise UnsafeFolderError(f"the {what} {entry} is writable by {who} (mode {mode:04o}); its contents are "
                                    f"loaded as code (pickles), so only you may write it: chmod -R go-w {path}")
    return path


_HASHES: dict[tuple[str, int, int], str] = {}


def file_sha256(path: str | os.PathLike) -> str:
    """SHA-256 of a file, read in 4 MiB chunks and remembered per (resolved path, size, modification time) within
    the process, so a model file hashed for a cache key is read once."""
    p = Path(path)
    st = p.stat()
    key = (str(p.resolve()), st.st_size, st.st_mtime_ns)
    if key not in _HASHES:
        h = hashlib.sha256()
        with open(p, "rb") as f:
            for chunk in iter(lambda: f.read(1 << 22), b""):
                h.update(chunk)
        _HASHES[key] = h.hexdigest()
    return _HASHES[key]
