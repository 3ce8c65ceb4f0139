"""JSON from files nobody vouches for: bounded nesting, finite numbers on request, regular files only.

``json.loads`` on a 200,000-deep ``[[[[...`` raises ``RecursionError`` (a traceback, not an input error), and a
value nested a few hundred levels deep passes it but breaks the recursive code that walks it later. A file
argument that is a FIFO blocks ``open`` until something writes to it, and ``/dev/zero`` is one endless line.
:func:`loads` and :func:`check_regular_file` turn each of these into a ``ValueError`` of one line naming the
file (and line, where there is one), before anything large is allocated (issue #35, item 11).
"""

from __future__ import annotations

import json
import math
import os
import stat
from typing import Any

__all__ = ["MAX_JSON_DEPTH", "JSONLimitError", "loads", "depth_over", "check_regular_file", "check_finite"]

#: The deepest nesting accepted: real data (a Mu-SHROOM row, a DSPy program state) is under 12 levels deep.
MAX_JSON_DEPTH = 100


class JSONLimitError(ValueError):
    """JSON nested too deep, or holding a number that is not finite where only finite numbers are allowed."""


def depth_over(value: Any, limit: int = MAX_JSON_DEPTH) -> bool:
    """Whether ``value`` (lists and dicts) nests deeper than ``limit`` levels; iterative, stops at the first."""
    stack = [(value, 1)]
    while stack:
        v, d = stack.pop()
        if isinstance(v, dict):
            v = v.values()
        elif not isinstance(v, list):
            continue
        if d > limit:
            return True
        stack.extend((x, d + 1) for x in v if isinstance(x, (list, dict)))
    return False


def _no_constant(name: str):
    raise JSONLimitError(f"{name} is not a finite number")


def _finite_float(text: str) -> float:
    x = float(text)
    if not math.isfinite(x):  # 1e999 parses as inf
        raise JSONLimitError(f"{text} is not a finite number")
    return x


def loads(text: str | bytes, *, where: str = "JSON", max_depth: int = MAX_JSON_DEPTH, finite: bool = False) -> Any:
    """``json.loads(text)``, refused (:class:`JSONLimitError`, one line starting with ``where``) when it nests
    deeper than ``max_depth`` or, with ``finite=True``, holds ``NaN``, ``Infinity`` or a number too large for a
    float. Malformed JSON is ``json.JSONDecodeError`` as usual (also a ``ValueError``)."""
    kwargs = {"parse_constant": _no_constant, "parse_float": _finite_float} if finite else {}
    try:
        value = json.loads(text, **kwargs)
    except RecursionError:
        raise JSONLimitError(f"{where}: JSON nested deeper than {max_depth} levels (refused)") from None
    except JSONLimitError as e:
        raise JSONLimitError(f"{where}: {e} (NaN and infinities are refused here)") from None
    if depth_over(value, max_depth):
        raise JSONLimitError(f"{where}: JSON nested deeper than {max_depth} levels (refused)")
    return value


def check_finite(value: Any, where: str = "value") -> None:
    """Refuse (:class:`JSONLimitError`) a float anywhere in ``value`` that is NaN or infinite, naming its path."""
    stack = [(value, "")]
    while stack:
        v, path = stack.pop()
        if isinstance(v, float) and not math.isfinite(v):
            raise JSONLimitError(f"{where}{path}: {v!r} is not a finite number")
        if isinstance(v, dict):
            stack.extend((x, f"{path}.{k}") for k, x in v.items())
        elif isinstance(v, (list, tuple)):
            stack.extend((x, f"{path}[{i}]") for i, x in enumerate(v))


def check_regular_file(path: str | os.PathLike, what: str = "input") -> None:
    """Refuse (``ValueError``, one line) a ``path`` that is not a regular file (after symlinks): a FIFO would
    block the read, a device such as ``/dev/zero`` never ends, a folder cannot be read as data. A missing file
    is ``FileNotFoundError`` as ``open`` would raise it."""
    st = os.stat(path)  # follows symlinks: a link to /dev/zero is a character device
    if stat.S_ISREG(st.st_mode):
        return
    kind = ("a folder" if stat.S_ISDIR(st.st_mode) else "a FIFO (named pipe)" if stat.S_ISFIFO(st.st_mode)
            else "a character device" if stat.S_ISCHR(st.st_mode) else "a block device" if stat.S_ISBLK(st.st_mode)
            else "a socket" if stat.S_ISSOCK(st.st_mode) else "not a regular file")
    raise ValueError(f"{path}: {kind}, not a regular file; the {what} must be a regular file")
