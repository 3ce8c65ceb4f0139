"""Values stored as text: a field that holds a list or a mapping written as JSON *or* as a Python repr.

Data files do not always store structured fields as JSON. The Mu-SHROOM Catalan test file writes
``model_output_tokens`` as ``"['El', ' gat', ...]"`` and ``model_output_logits`` as ``"[-0.12, -3.4, ...]"``
(Python's ``repr`` of a list, single quotes), and a CSV written by pandas stores a list column the same way
(``"[{'start': 0, 'end': 4, 'prob': 1.0}]"``). :func:`parse_text_value` reads both, safely:

1. ``json.loads`` first (the common case, and the only reading of ``null``/``true``/``false``);
2. else the text is parsed by :func:`ast.parse` (parsing only, nothing is executed) and the syntax tree is
   walked by :func:`_literal`, which accepts **literals only**: strings, numbers, ``True``/``False``/``None``,
   lists, tuples (read as lists) and dicts of them, a sign before a number, the names ``nan``/``inf``
   (``repr`` of a non-finite float) and a numpy scalar's repr around a number (``np.float32(-1.5)``, as numpy 2
   writes a list of its scalars). A name, a call of anything else, an attribute, an operator, a comprehension, a
   lambda: :class:`TextValueError`. There is no ``eval``.

Texts over :data:`MAX_TEXT_CHARS` or nested deeper than Python's parser allows are refused the same way, so a
hostile field costs at most one bounded parse.
"""

from __future__ import annotations

import ast
import json
import math
from typing import Any

__all__ = ["MAX_TEXT_CHARS", "TextValueError", "parse_text_value", "parse_text_list"]

#: The longest text read as a value (a Mu-SHROOM answer's logits are a few kilobytes).
MAX_TEXT_CHARS = 5_000_000

_NAMES = {"nan": math.nan, "NaN": math.nan, "inf": math.inf, "Infinity": math.inf, "None": None,
          "True": True, "False": False, "null": None, "true": True, "false": False}
# Constructors whose repr wraps a number: numpy scalars (numpy 2 writes [np.float32(-1.5), ...]) and float('nan').
_NUMBER_CALLS = {f"{mod}.{kind}" for mod in ("np", "numpy")
                 for kind in ("float16", "float32", "float64", "int8", "int16", "int32", "int64", "float_", "int_")}
_NUMBER_CALLS |= {"float", "int"}


class TextValueError(ValueError):
    """A text that is neither JSON nor a Python literal of plain values."""


def _dotted(node: ast.expr) -> str | None:
    if isinstance(node, ast.Name):
        return node.id
    if isinstance(node, ast.Attribute):
        base = _dotted(node.value)
        return None if base is None else f"{base}.{node.attr}"
    return None


def _literal(node: ast.expr) -> Any:
    """The value of a literal-only syntax tree (see the module docstring); TextValueError for anything else."""
    if isinstance(node, ast.Constant):
        if isinstance(node.value, (str, int, float, bool)) or node.value is None:
            return node.value
        raise TextValueError(f"{type(node.value).__name__} values are not read")
    if isinstance(node, (ast.List, ast.Tuple)):
        return [_literal(e) for e in node.elts]
    if isinstance(node, ast.Dict):
        if any(k is None for k in node.keys):  # {**other}
            raise TextValueError("'**' in a mapping is not a literal")
        return {_key(k): _literal(v) for k, v in zip(node.keys, node.values)}
    if isinstance(node, ast.UnaryOp) and isinstance(node.op, (ast.USub, ast.UAdd)):
        value = _literal(node.operand)
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            raise TextValueError("a sign before something that is not a number")
        return -value if isinstance(node.op, ast.USub) else value
    if isinstance(node, ast.Name):
        if node.id in _NAMES:
            return _NAMES[node.id]
        raise TextValueError(f"the name {node.id!r} is not a literal")
    if isinstance(node, ast.Call):
        name = _dotted(node.func)
        if name in _NUMBER_CALLS and len(node.args) == 1 and not node.keywords:
            arg = node.args[0]
            value = _literal(arg)
            if isinstance(value, str) and name == "float" and value.strip().lower() in ("nan", "inf", "-inf"):
                return float(value)
            if isinstance(value, bool) or not isinstance(value, (int, float)):
                raise TextValueError(f"{name}(...) around something that is not a number")
            return float(value) if "float" in name else value
        raise TextValueError(f"a call of {name or 'an expression'} is not a literal")
    raise TextValueError(f"{type(node).__name__} is not a literal")


def _key(node: ast.expr) -> Any:
    key = _literal(node)
    if isinstance(key, (list, dict)):
        raise TextValueError("a list or mapping as a mapping key")
    return key


def parse_text_value(text: str) -> Any:
    """The value a text holds: JSON, else a Python literal of plain values (never evaluated; module docstring).

    Raises :class:`TextValueError` (a ``ValueError``) saying why when the text is neither."""
    if not isinstance(text, str):
        raise TextValueError(f"expected text, got {type(text).__name__}")
    if len(text) > MAX_TEXT_CHARS:
        raise TextValueError(f"{len(text)} characters, over the {MAX_TEXT_CHARS}-character limit")
    try:
        return json.loads(text)
    except (json.JSONDecodeError, RecursionError) as e:
        json_error = e
    try:
        tree = ast.parse(text.strip(), mode="eval")
    except (SyntaxError, ValueError, RecursionError, MemoryError):
        # report JSON's reason: it names the column, and JSON is what we document
        reason = getattr(json_error, "msg", type(json_error).__name__)
        raise TextValueError(f"neither JSON nor a Python literal ({reason})") from None
    try:
        return _literal(tree.body)
    except RecursionError:
        raise TextValueError("nested too deeply") from None


def parse_text_list(text: str) -> list:
    """:func:`parse_text_value` of a text that must hold a list (a tuple reads as a list)."""
    value = parse_text_value(text)
    if not isinstance(value, list):
        raise TextValueError(f"expected a list, got {type(value).__name__}")
    return value
