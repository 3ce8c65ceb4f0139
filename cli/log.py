"""Where the library's log messages go on the command line (light: imports no command and no model code)."""

from __future__ import annotations

import logging
import sys

__all__ = ["setup_logging"]


class _StderrHandler(logging.StreamHandler):
    """Writes to whatever ``sys.stderr`` is at the time (a test's capture, a redirected stream)."""

    def __init__(self):
        super().__init__()
        self.setFormatter(_Formatter())

    @property
    def stream(self):
        return sys.stderr

    @stream.setter
    def stream(self, _value):
        pass


class _Formatter(logging.Formatter):
    def format(self, record: logging.LogRecord) -> str:
        text = record.getMessage()
        return f"{record.levelname.lower()}: {text}" if record.levelno >= logging.WARNING else text


def setup_logging(level: int = logging.INFO) -> None:
    """Show the library's log messages (``halluscope.*`` loggers: demo-data notices, warnings, progress) on
    stderr, once per process. The library itself only logs; the command line decides where it goes."""
    root = logging.getLogger("halluscope")
    if not any(isinstance(h, _StderrHandler) for h in root.handlers):
        root.addHandler(_StderrHandler())
    root.setLevel(level)
