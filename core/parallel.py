"""Map a function over items on threads, in order, with an optional progress bar.

Each task runs in a copy of the caller's ``contextvars`` context, so ``dspy.context`` overrides (LM,
adapter, trace) hold inside the threads. :func:`map_items` lets exceptions propagate; :func:`try_map`
returns ``(ok, result_or_exception)`` per item, for callers that count failures instead of stopping.
"""

from __future__ import annotations

import contextvars
from concurrent.futures import ThreadPoolExecutor
from functools import partial
from typing import Any, Callable, Iterable

from tqdm import tqdm

__all__ = ["map_items", "try_map"]


def map_items(fn: Callable, items: Iterable, *, threads: int = 1, progress: bool = False, desc: str = "",
              unit: str = "item") -> list:
    """``[fn(x) for x in items]``, in order, on up to ``threads`` threads."""
    items = list(items)
    bar = tqdm(total=len(items), desc=desc, unit=unit, disable=not progress)

    def run(x):
        try:
            return fn(x)
        finally:
            bar.update(1)

    try:
        if threads <= 1 or len(items) <= 1:
            return [run(x) for x in items]
        with ThreadPoolExecutor(max_workers=min(threads, len(items))) as pool:
            futures = [pool.submit(contextvars.copy_context().run, run, x) for x in items]
            return [f.result() for f in futures]
    finally:
        bar.close()


def _capture(fn: Callable, item: Any) -> tuple[bool, Any]:
    try:
        return True, fn(item)
    except Exception as e:  # noqa: BLE001 - the caller counts failures instead of crashing
        return False, e


def try_map(fn: Callable, items: Iterable, *, threads: int = 1, **kwargs) -> list[tuple[bool, Any]]:
    """``[(ok, fn(x) or the exception it raised)]`` for each item, in order (see :func:`map_items`)."""
    return map_items(partial(_capture, fn), items, threads=threads, **kwargs)
