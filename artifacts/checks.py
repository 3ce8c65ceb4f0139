"""Every number of an artifact checked at load: finite, in range, nested no deeper than a bound.

The content hash catches accidental damage, not a deliberate edit: someone who edits ``program.json`` can
rewrite the hash too. Before these checks an artifact whose weights or feature means were ``NaN`` loaded with
exit 0 and called every answer correct (every score NaN, no failure counted), and an ``Infinity`` intercept
or NaN/Inf tree leaves flagged everything; a 200,000-deep ``program.json`` raised ``RecursionError`` (issue
#35, items 9 and 11). :func:`checked_state` reads ``program.json`` (and :func:`checked_json` the manifest) so
that any of these is one line naming the file and the JSON path of the first bad number:

* every number is finite (``NaN``, ``Infinity``, ``1e999`` refused) and at most :data:`MAX_MAGNITUDE` in size;
* a ``scale`` list (a standardiser's divisors) holds numbers > 0;
* in ``program.json`` (``probabilities=True``), a number under a key named ``threshold``, ``floor`` or ``prob``
  (a probability cut) is in [0, 1] (tree nodes keep their feature thresholds in lists, which this rule leaves
  alone; the manifest's build options may hold other thresholds, e.g. a length);
* nesting is at most :data:`halluscope.core.safejson.MAX_JSON_DEPTH` levels.

``error`` is the exception class to raise (the store passes its ``ArtifactIntegrityError``: this module
imports nothing from the store).
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

from halluscope.core.safejson import JSONLimitError, loads

__all__ = ["MAX_MAGNITUDE", "PROBABILITY_KEYS", "number_problem", "checked_json", "checked_state"]

#: The largest absolute value of any number in an artifact (weights, means, counts: far below it).
MAX_MAGNITUDE = 1e12
#: Keys whose (scalar) number is a probability cut, in [0, 1].
PROBABILITY_KEYS = ("threshold", "floor", "prob")


def number_problem(value: Any, *, probabilities: bool = True) -> str | None:
    """``"<json path>: <why>"`` for the first number of ``value`` out of range (module docstring), else None;
    ``probabilities=False`` leaves out the [0, 1] rule for probability keys."""
    stack: list[tuple[Any, str, str]] = [(value, "", "")]
    while stack:
        v, path, key = stack.pop()
        if isinstance(v, bool) or v is None or isinstance(v, str):
            continue
        if isinstance(v, (int, float)):
            if isinstance(v, float) and not math.isfinite(v):
                return f"{path or '(top)'}: {v!r} is not a finite number"
            if abs(v) > MAX_MAGNITUDE:
                return f"{path or '(top)'}: {v!r} is out of range (|x| <= {MAX_MAGNITUDE:g})"
            if probabilities and key in PROBABILITY_KEYS and not 0.0 <= v <= 1.0:
                return f"{path}: {v!r} is out of range for a {key} (0 to 1)"
            continue
        if isinstance(v, dict):
            stack.extend((x, f"{path}.{k}", str(k)) for k, x in reversed(list(v.items())))
        elif isinstance(v, (list, tuple)):
            if key == "scale":
                bad = next((i for i, x in enumerate(v) if isinstance(x, (int, float)) and not isinstance(x, bool)
                            and math.isfinite(x) and x <= 0), None)
                if bad is not None:
                    return f"{path}[{bad}]: {v[bad]!r} is out of range for a scale (> 0)"
            stack.extend((x, f"{path}[{i}]", "") for i, x in reversed(list(enumerate(v))))
    return None


def checked_json(text: str | bytes, where: str | Path, *, error: type[Exception] = ValueError,
                 probabilities: bool = False) -> Any:
    """The JSON ``text`` of the artifact file ``where``, every number checked (:func:`number_problem`); ``error``
    (one line) otherwise."""
    try:
        value = loads(text, where=str(where))
    except JSONLimitError as e:
        raise error(f"{e}; refusing to load") from None
    except ValueError as e:
        raise error(f"{where} is not valid JSON ({e}); refusing to load") from None
    problem = number_problem(value, probabilities=probabilities)
    if problem:
        raise error(f"{where}: {problem}; refusing to load (an edited or corrupt artifact: recompile, or load "
                    f"another version)")
    return value


def checked_state(data: bytes, where: str | Path, *, error: type[Exception] = ValueError) -> dict:
    """``program.json``'s state (a JSON object), every number checked by :func:`checked_json`."""
    state = checked_json(data, where, error=error, probabilities=True)
    if not isinstance(state, dict):
        raise error(f"{where} is not a JSON object; refusing to load")
    return state
