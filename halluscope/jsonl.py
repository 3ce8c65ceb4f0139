"""Reading JSON-lines files, with errors that name the file and the line."""

from __future__ import annotations

import json
from pathlib import Path

__all__ = ["read_jsonl"]


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
