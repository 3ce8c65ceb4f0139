"""File helpers: JSON-lines reading with errors that name the file and line, and atomic writes."""

from __future__ import annotations

import json
import os
import tempfile
from pathlib import Path

__all__ = ["read_jsonl", "write_text_atomic", "create_unique_dir"]


def read_jsonl(path: str | Path) -> list[tuple[int, dict]]:
    """``(line_number, record)`` for each non-blank line of ``path``.

    A line that is not JSON, or not a JSON object, raises ``ValueError`` naming the file and the line.
    """
    out: list[tuple[int, dict]] = []
    with open(path, encoding="utf-8") as f:
        for lineno, line in enumerate(f, start=1):
            if not line.strip():
                continue
            try:
                rec = json.loads(line)
            except json.JSONDecodeError as e:
                raise ValueError(f"{path}: line {lineno}: malformed JSON ({e.msg})") from e
            if not isinstance(rec, dict):
                raise ValueError(f"{path}: line {lineno}: expected a JSON object, got {type(rec).__name__}")
            out.append((lineno, rec))
    return out


def write_text_atomic(path: str | Path, text: str) -> Path:
    """Write ``text`` to ``path`` atomically: a temp file in the same folder, fsync, then ``os.replace``.
    Readers see the old file or the new one, never a partial one; parent folders are created."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            f.write(text)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        try:
            os.unlink(tmp)
        except OSError:
            pass
        raise
    return path


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
