"""SIGTERM handled as Ctrl-C, so a job killed by a scheduler (``kill``, ``timeout``, a batch system) stops the way an
interrupted one does: what was done is still reported and every file written so far is whole."""

from __future__ import annotations

import signal
import threading

__all__ = ["stop_on_sigterm"]


class stop_on_sigterm:
    """Inside this context SIGTERM raises ``KeyboardInterrupt`` in the main thread (as Ctrl-C does); the previous
    handler is restored on exit. Outside the main thread (where Python cannot install handlers) it does nothing."""

    def __enter__(self):
        self.previous = None
        if threading.current_thread() is threading.main_thread():
            self.previous = signal.signal(signal.SIGTERM, self._raise)
        return self

    @staticmethod
    def _raise(_signum, _frame):
        raise KeyboardInterrupt

    def __exit__(self, *exc):
        if self.previous is not None:
            signal.signal(signal.SIGTERM, self.previous)
        return False
