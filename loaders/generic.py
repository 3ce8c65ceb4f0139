"""One loader for anything HuggingFace ``datasets`` can open, mapped onto the common example schema.

The source is a local file (``.jsonl``/``.json``/``.ndjson``, ``.csv``/``.tsv``, ``.parquet``/``.pq``), a local
folder of such files, or a HuggingFace Hub dataset name (``owner/name``; needs the network). Columns are
mapped onto the fields of the common schema; a field whose column has the field's own name needs no
mapping::

    from halluscope.loaders.generic import load_generic
    examples = load_generic("answers.csv", {"answer": "response", "label": "is_hallucinated"})

    halluscope evaluate --dataset generic --data-dir answers.csv --column answer=response \\
        --column label=is_hallucinated --program mark-all

Fields
------
========================= ========================================================================================
field                     what it becomes (column missing: the default)
========================= ========================================================================================
``answer`` (required)     the text to check (a column named ``answer`` or ``model_output_text``)
``question``              the question/prompt (``question`` or ``model_input``; default ``""``)
``context``               reference text given to the detector (default ``""``; ``context="none"`` drops it)
``id``                    the item id (default ``<file stem>-<row number>``)
``lang``                  the language (default: the ``lang`` argument, else ``""``)
``task``                  the task, e.g. a HalluClean task (default: the ``task`` argument, else ``""``)
``hard_labels``           gold spans ``[[start, end], ...]`` (character offsets into ``answer``, end excluded)
``soft_labels``           gold ``[{"start", "end", "prob"}, ...]``; either span column is derived from the other
``label``                 gold response label, True = hallucinated (default: ``bool(hard_labels)`` for span
                          data, else ``None`` = unlabelled)
``reference``             the gold correct text, for revision metrics (default ``None``)
========================= ========================================================================================

Span columns may hold lists or their JSON text (as in a CSV). Label encodings (case and surrounding
spaces ignored): hallucinated = ``True``, ``1``, ``"1"``, ``"true"``, ``"t"``, ``"yes"``, ``"y"``,
``"hallucinated"``, ``"hallucination"``, ``"incorrect"``, ``"unfaithful"``; not hallucinated = ``False``, ``0``,
``"0"``, ``"false"``, ``"f"``, ``"no"``, ``"n"``, ``"correct"``, ``"not hallucinated"`` (also with ``_`` or
``-``), ``"faithful"``, ``"factual"``; unlabelled = null, NaN or ``""``. Anything else is an error naming the
row. (A column with the opposite sense, e.g. ``answerable``, needs converting first.)

``lang``/``task`` arguments: with a ``lang``/``task`` column they keep only the rows with that value (case
ignored); without one they set it on every row. The dataset is span-level when the rows carry span labels,
else response-level. Every other column is kept on the example as metadata (e.g. ``model_output_logits``
for the logits baseline); an ``annotations`` mapping loses the ``None`` entries Arrow adds when annotator
ids differ between rows. Examples are ``dspy.Example`` s with inputs ``question, answer, lang, context,
task``, like the HalluClean loader's.
"""

from __future__ import annotations

import csv
import json
import logging
import math
import os
import re
from collections.abc import Iterable, Mapping
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import dspy

from halluscope.loaders.halluclean import INPUT_FIELDS
from halluscope.core.fileio import iter_jsonl
from halluscope.core.safejson import check_regular_file
from halluscope.core.literals import parse_text_value
from halluscope.loaders.mushroom import check_gold, gold_from_record
from halluscope.loaders.dataset_registry import ArgRole, DatasetArgumentError, DatasetSpec, register_dataset

logger = logging.getLogger(__name__)

__all__ = [
    "FIELDS",
    "REQUIRED_FIELDS",
    "DEFAULT_COLUMNS",
    "LOCAL_FORMATS",
    "HALLUCINATED_VALUES",
    "CORRECT_VALUES",
    "ColumnError",
    "parse_column_mapping",
    "decode_label",
    "open_rows",
    "load_generic",
    "load_generic_dataset",
]

#: The fields of the common schema a column can be mapped to.
FIELDS: tuple[str, ...] = ("id", "question", "answer", "context", "lang", "task",
                           "hard_labels", "soft_labels", "label", "reference")
REQUIRED_FIELDS: tuple[str, ...] = ("answer",)
#: Columns tried, in order, for a field that is not mapped explicitly.
DEFAULT_COLUMNS: dict[str, tuple[str, ...]] = {
    **{f: (f,) for f in FIELDS},
    "question": ("question", "model_input"),
    "answer": ("answer", "model_output_text"),
}
#: File suffix -> ``datasets`` builder.
LOCAL_FORMATS: dict[str, str] = {".jsonl": "json", ".json": "json", ".ndjson": "json", ".csv": "csv",
                                 ".tsv": "csv", ".parquet": "parquet", ".pq": "parquet"}
HALLUCINATED_VALUES = frozenset({"1", "true", "t", "yes", "y", "hallucinated", "hallucination", "incorrect",
                                 "unfaithful"})
CORRECT_VALUES = frozenset({"0", "false", "f", "no", "n", "correct", "not hallucinated", "not_hallucinated",
                            "not-hallucinated", "faithful", "factual"})


class ColumnError(DatasetArgumentError):
    """A column mapping that does not fit the data (a missing column, an unknown field)."""


# -- arguments ------------------------------------------------------------------------------------------

def parse_column_mapping(pairs: Iterable[str] | Mapping[str, str] | None) -> dict[str, str]:
    """``["answer=response", "label=gold"]`` (or a mapping) -> ``{"answer": "response", "label": "gold"}``.

    Raises :class:`ColumnError` for a pair without ``=``, an unknown field or a field mapped twice."""
    if pairs is None:
        return {}
    items = list(pairs.items()) if isinstance(pairs, Mapping) else []
    if not isinstance(pairs, Mapping):
        for pair in pairs:
            field, sep, column = str(pair).partition("=")
            if not sep or not field.strip() or not column.strip():
                raise ColumnError(f"argument --column: {pair!r} is not FIELD=COLUMN "
                                  f"(fields: {', '.join(FIELDS)})")
            items.append((field, column))
    out: dict[str, str] = {}
    for field, column in items:
        field, column = str(field).strip(), str(column).strip()
        if field not in FIELDS:
            raise ColumnError(f"argument --column: unknown field {field!r}; map one of: {', '.join(FIELDS)}")
        if field in out and out[field] != column:
            raise ColumnError(f"argument --column: field {field!r} mapped twice ({out[field]!r} and {column!r})")
        out[field] = column
    return out


# -- values ---------------------------------------------------------------------------------------------

def _missing(v: Any) -> bool:
    return v is None or (isinstance(v, float) and math.isnan(v))


def _text(v: Any) -> str:
    return "" if _missing(v) else v if isinstance(v, str) else str(v)


def decode_label(value: Any) -> bool | None:
    """A gold label in one of the accepted encodings (module docstring) -> True (hallucinated), False or
    None (unlabelled). ``ValueError`` for anything else."""
    if _missing(value):
        return None
    if isinstance(value, bool):
        return value
    if isinstance(value, (int, float)):
        if value in (0, 1):
            return bool(value)
        raise ValueError(f"{value!r} is not a label (numbers: 0 or 1)")
    s = str(value).strip().lower()
    if s == "":
        return None
    if s in HALLUCINATED_VALUES:
        return True
    if s in CORRECT_VALUES:
        return False
    raise ValueError(f"{value!r} is not a label; hallucinated: {', '.join(sorted(HALLUCINATED_VALUES))}; "
                     f"not hallucinated: {', '.join(sorted(CORRECT_VALUES))}")


def _spans(v: Any) -> Any:
    """A span column's value: a list, or its text as JSON or a Python repr (a CSV; pandas writes lists so, read by
    :func:`halluscope.core.literals.parse_text_value`, never evaluated); missing -> None."""
    if _missing(v):
        return None
    if isinstance(v, str):
        s = v.strip()
        return parse_text_value(s) if s else None
    return _plain(v)


def _plain(v: Any) -> Any:
    """Nested tuples and arrays (a columnar source) as lists, recursively."""
    if hasattr(v, "tolist") and not isinstance(v, (str, bytes)):
        v = v.tolist()
    if isinstance(v, (list, tuple)):
        return [_plain(x) for x in v]
    if isinstance(v, Mapping):
        return {k: _plain(x) for k, x in v.items()}
    return v


def _clean_meta(name: str, v: Any) -> Any:
    if name == "annotations" and isinstance(v, Mapping):  # Arrow's union of annotator ids: drop the phantoms
        return {k: a for k, a in v.items() if a is not None}
    return v


# -- opening --------------------------------------------------------------------------------------------

_TEXT_FORMATS = {".jsonl", ".ndjson", ".json", ".csv", ".tsv"}


def check_text_file(path: Path) -> None:
    """Refuse a local JSON/JSONL/CSV/TSV file that is not UTF-8 text, or a JSONL line that is not a JSON object,
    with a ``ValueError`` naming the file and the line, before ``datasets`` reads it (it would name neither)."""
    suffix = path.suffix.lower()
    if suffix in (".jsonl", ".ndjson"):
        for _ in iter_jsonl(path):
            pass
        return
    with open(path, "rb") as f:
        for lineno, raw in enumerate(f, start=1):
            if lineno == 1 and raw.startswith(b"\xef\xbb\xbf"):
                raw = raw[3:]
            nul = raw.find(b"\x00")
            if nul >= 0:
                raise ValueError(f"{path}: line {lineno}: a NUL byte at column {nul + 1}: a binary file, not "
                                 f"{suffix[1:].upper()} text")
            try:
                raw.decode("utf-8")
            except UnicodeDecodeError as e:
                raise ValueError(f"{path}: line {lineno}: not UTF-8 text (byte 0x{raw[e.start]:02x} at column "
                                 f"{e.start + 1}); save the file as UTF-8") from None


def row_lines(source: str | os.PathLike) -> list[int] | None:
    """The line each data row of a local JSONL/CSV/TSV file starts on (for error messages); None for other
    sources. A CSV record may span several lines (a quoted newline): its first line is given."""
    p = Path(str(source)).expanduser()
    suffix = p.suffix.lower()
    if not p.is_file() or suffix not in (".jsonl", ".ndjson", ".csv", ".tsv"):
        return None
    if suffix in (".jsonl", ".ndjson"):
        return [lineno for lineno, _ in iter_jsonl(p)]
    with open(p, encoding="utf-8-sig", newline="") as f:
        reader = csv.reader(f, delimiter="\t" if suffix == ".tsv" else ",")
        starts, previous_end = [], 0
        for record in reader:
            if record:  # pandas skips blank lines too
                starts.append(previous_end + 1)
            previous_end = reader.line_num
    return starts[1:]  # the header is no row


def _unreadable(path: Path, fmt: str, error: Exception) -> ValueError:
    """A one-line error for a local file ``datasets`` could not read (its own messages run to many lines)."""
    if fmt == "json" and path.suffix.lower() == ".json":
        try:  # a malformed JSON document: say where
            json.loads(path.read_text(encoding="utf-8-sig"))
        except json.JSONDecodeError as e:
            return ValueError(f"{path}: line {e.lineno}: malformed JSON ({e.msg} at column {e.colno})")
        except (OSError, UnicodeError, RecursionError):
            pass
    cause = error.__cause__ or error
    first = (str(cause).strip().splitlines() or [""])[0][:300]
    return ValueError(f"{path}: cannot be read as {fmt} ({type(cause).__name__}: {first})")


@contextmanager
def _quiet_datasets():
    """No progress bars, info or error lines from ``datasets`` while a file is opened (they would fill the log; a
    file it cannot read is reported by :func:`_unreadable` in one line)."""
    # `datasets` is imported where it is used: it pulls in pyarrow and pandas (about a second), which no other
    # command needs.
    import datasets
    from datasets.utils import logging as ds_logging  # (idem)

    was_disabled = datasets.are_progress_bars_disabled()
    level = ds_logging.get_verbosity()
    datasets.disable_progress_bars()
    ds_logging.set_verbosity(ds_logging.CRITICAL)  # a file it cannot read is our one-line error, not its log
    try:
        yield
    finally:
        ds_logging.set_verbosity(level)
        if not was_disabled:
            datasets.enable_progress_bars()


_HUB_NAME = re.compile(r"^[A-Za-z0-9][\w.-]*(/[\w.-]+)?$")


def _is_hub_name(source: str) -> bool:
    """``owner/name`` or ``name``, not a file name with a known suffix (a missing local file, then)."""
    return bool(_HUB_NAME.match(source)) and Path(source).suffix.lower() not in LOCAL_FORMATS


def open_rows(source: str | os.PathLike, *, split: str | None = None,
              cache_dir: str | os.PathLike | None = None) -> tuple[list[dict], list[str], str]:
    """``(rows, columns, where)`` of a local file/folder or a Hub dataset, one split of it.

    ``split=None`` takes the only split (a local file is one split, ``train``); with several, it must be
    named. A missing local path raises ``FileNotFoundError``; an unknown suffix or split ``ValueError``.
    """
    import datasets  # heavy (pyarrow, pandas): imported only when a generic dataset is opened

    text = str(source)
    p = Path(text).expanduser()
    cache = None if cache_dir is None else str(cache_dir)
    with _quiet_datasets():
        if p.is_file():
            fmt = LOCAL_FORMATS.get(p.suffix.lower())
            if fmt is None:
                raise ValueError(f"{p}: unknown file type {p.suffix!r}; the generic loader reads "
                                 f"{', '.join(LOCAL_FORMATS)}")
            kwargs = {"delimiter": "\t"} if p.suffix.lower() == ".tsv" else {}
            where = str(p)
            if p.suffix.lower() in _TEXT_FORMATS:
                check_text_file(p)  # names the line of a binary or malformed file
            try:
                data = datasets.load_dataset(fmt, data_files=str(p), cache_dir=cache, **kwargs)
            except Exception as e:  # noqa: BLE001 - pyarrow/pandas/datasets raise many kinds for a bad file
                raise _unreadable(p, fmt, e) from None
        elif p.is_dir():
            where = str(p)
            data = datasets.load_dataset(str(p), cache_dir=cache)
        elif p.exists():  # a FIFO, a device, a socket: reading it would hang or never end
            check_regular_file(p, "data file")
        elif not _is_hub_name(text):
            raise FileNotFoundError(f"no such data file or folder: {p}")
        else:
            where = f"hub:{text}"
            try:
                data = datasets.load_dataset(text, cache_dir=cache)
            except Exception as e:  # offline, unknown name, gated...
                raise FileNotFoundError(f"{text!r} is no local file or folder, and the HuggingFace Hub could not "
                                        f"open it ({type(e).__name__}: {str(e)[:300]})") from None
    splits = list(data)
    if split is None:
        if len(splits) != 1:
            raise DatasetArgumentError(f"argument --split: {where} has the splits {', '.join(splits)}; "
                                       f"name one")
        split = splits[0]
    elif split not in data:
        raise DatasetArgumentError(f"argument --split: {where} has no split {split!r} (it has "
                                   f"{', '.join(splits)})")
    table = data[split]
    return table.to_list(), list(table.column_names), where if len(splits) == 1 else f"{where}[{split}]"


# -- rows -> examples ---------------------------------------------------------------------------------------

def _resolve_columns(columns: Mapping[str, str], have: list[str], where: str) -> dict[str, str]:
    """``{field: column}`` for every field that has a column: the explicit mapping, else the defaults."""
    have_set = set(have)
    listing = ", ".join(have) or "(none)"
    out: dict[str, str] = {}
    for field, column in columns.items():
        if column not in have_set:
            raise ColumnError(f"argument --column: {where} has no column {column!r} (mapped to {field!r}); "
                              f"its columns are: {listing}")
        out[field] = column
    for field in FIELDS:
        if field not in out:
            found = next((c for c in DEFAULT_COLUMNS[field] if c in have_set), None)
            if found is not None:
                out[field] = found
    for field in REQUIRED_FIELDS:
        if field not in out:
            looked = " or ".join(repr(c) for c in DEFAULT_COLUMNS[field])
            raise ColumnError(f"argument --column: {where} has no column for the required field {field!r} "
                              f"(looked for {looked}; map one with --column {field}=COLUMN); its columns are: "
                              f"{listing}")
    return out


def _field_text(value: Any, field: str, cols: dict[str, str], at: str, notes: dict, *, required: bool = False) -> str:
    """A text field's value: a string as it is; null/NaN "" (refused for the answer, which is the text to check);
    a number as its text, counted in ``notes`` (said in one warning line); a list, mapping or boolean refused
    (before #35 all of these became text silently: ``null`` -> "", ``[1, 2]`` -> "[1, 2]")."""
    if isinstance(value, str):
        return value
    if _missing(value):
        if required:
            raise ValueError(f"{at}: column {cols[field]!r}: {'null' if value is None else 'NaN'}, not an answer: "
                             f"every row needs the text to check")
        return ""
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        key = f"{field}s that are numbers (read as text)"
        notes[key] = notes.get(key, 0) + 1
        return str(value)
    raise ValueError(f"{at}: column {cols[field]!r}: expected text, got {type(value).__name__} "
                     f"{str(_plain(value))[:60]!r}")


def _case(row: dict, index: int, cols: dict[str, str], *, stem: str, where: str, lang: str | None,
          task: str | None, context: str | None, line: int | None = None, notes: dict | None = None) -> dict:
    used = set(cols.values())
    notes = {} if notes is None else notes
    get = lambda f: row.get(cols[f]) if f in cols else None  # noqa: E731
    item_id = _text(get("id")) or f"{stem}-{index}"
    at = f"{where}: row {index} ({f'line {line}, ' if line else ''}id {item_id!r})"
    case: dict[str, Any] = {
        "id": item_id,
        "question": _field_text(get("question"), "question", cols, at, notes),
        "answer": _field_text(get("answer"), "answer", cols, at, notes, required=True),
        "context": "" if context == "none" else _field_text(get("context"), "context", cols, at, notes),
        "lang": _text(get("lang")).strip().lower() if "lang" in cols else (lang or ""),
        "task": _text(get("task")).strip() if "task" in cols else (task or ""),
    }
    label = None
    if "label" in cols:
        try:
            label = decode_label(get("label"))
        except ValueError as e:
            raise ValueError(f"{at}: column {cols['label']!r}: {e}") from None
        if label is None:  # null, NaN or "": unlabelled (scored by no label metric), counted and said
            notes["unlabelled rows (null, NaN or empty label)"] = notes.get(
                "unlabelled rows (null, NaN or empty label)", 0) + 1
    if "hard_labels" in cols or "soft_labels" in cols:
        which = " / ".join(repr(cols[f]) for f in ("hard_labels", "soft_labels") if f in cols)
        try:
            gold = {"hard_labels": _spans(get("hard_labels")), "soft_labels": _spans(get("soft_labels"))}
            # offsets inside the answer, start < end, probabilities in [0, 1]: else refused, never scored
            check_gold({"model_output_text": case["answer"], **gold}, f"{at}: column {which}")
            hard, soft, _, span_label = gold_from_record(gold)
        except ValueError as e:
            if str(e).startswith(at):
                raise
            raise ValueError(f"{at}: column {which}: not span labels ({e})") from None
        except (TypeError, KeyError) as e:
            raise ValueError(f"{at}: column {which}: not span labels ({type(e).__name__}: {e})") from None
        if span_label is not None:
            case["hard_labels"], case["soft_labels"] = hard, soft
            if label is None:
                label = span_label
        else:
            case["hard_labels"] = case["soft_labels"] = None
    case["label"] = label
    case["reference"] = None if _missing(get("reference")) else _text(get("reference"))
    for name, value in row.items():  # the other columns: metadata
        if name not in used and name not in case:
            case[name] = _clean_meta(name, value)
    return case


def load_generic(
    source: str | os.PathLike,
    columns: Mapping[str, str] | Iterable[str] | None = None,
    *,
    split: str | None = None,
    lang: str | None = None,
    task: str | None = None,
    context: str | None = None,
    limit: int | None = None,
    cache_dir: str | os.PathLike | None = None,
) -> list[dspy.Example]:
    """The rows of ``source`` as ``dspy.Example`` s in the common schema (see the module docstring).

    ``columns``: ``{field: column}`` (or ``["field=column", ...]``). ``lang``/``task`` filter by (or fill in)
    those fields; ``context="none"`` blanks the context; ``limit`` keeps the first rows after filtering.
    Raises :class:`ColumnError` naming the source, the column and the columns there are.
    """
    mapping = parse_column_mapping(columns)
    if limit is not None and (isinstance(limit, bool) or int(limit) < 0):
        raise ValueError(f"limit must be a non-negative integer or None, got {limit!r}")
    rows, have, where = open_rows(source, split=split, cache_dir=cache_dir)
    lines = row_lines(source)
    if lines is not None and len(lines) != len(rows):  # a reader that skipped or merged rows: no line numbers
        lines = None
    cols = _resolve_columns(mapping, have, where)
    stem = Path(str(source)).stem if Path(str(source)).expanduser().exists() else str(source).rsplit("/", 1)[-1]
    want_lang = lang.strip().lower() if lang else None
    want_task = task.strip().lower() if task else None
    cases, notes, first_row = [], {}, {}
    for i, row in enumerate(rows):
        if limit is not None and len(cases) >= int(limit):
            break
        line = lines[i] if lines is not None and i < len(lines) else None
        row_notes: dict = {}
        case = _case(row, i, cols, stem=stem, where=where, lang=want_lang, task=task, context=context,
                     line=line, notes=row_notes)
        if want_lang and "lang" in cols and case["lang"] != want_lang:
            continue
        if want_task and "task" in cols and case["task"].lower() != want_task:
            continue
        if case["id"] in first_row:  # two items with one id: scores, predictions and traces would mix them
            raise ValueError(f"{where}: row {i} ({f'line {line}, ' if line else ''}id {case['id']!r}): the id of "
                             f"row {first_row[case['id']]} again; ids must be unique")
        first_row[case["id"]] = i
        for k, n in row_notes.items():
            notes[k] = notes.get(k, 0) + n
        cases.append(case)
    if notes:  # converted or unlabelled, not refused: said once
        logger.warning("%s: %s", where, "; ".join(
            f"{n} {k}" for k, n in sorted(notes.items())) + " (counted, not refused)")
    return [dspy.Example(**c).with_inputs(*INPUT_FIELDS) for c in cases]


def load_generic_dataset(data_dir=None, *, lang=None, task=None, split=None, context=None, limit=None,
                         columns=None) -> tuple[list[dspy.Example], str]:
    """The registry's uniform loader: ``data_dir`` is the file, folder or Hub name."""
    if data_dir is None or str(data_dir) == "":
        raise DatasetArgumentError("argument --data-dir: --dataset generic needs the data: a local "
                                   f"{'/'.join(LOCAL_FORMATS)} file, a folder of them, or a HuggingFace Hub name")
    examples = load_generic(data_dir, columns, split=split, lang=lang, task=task, context=context, limit=limit)
    p = Path(str(data_dir)).expanduser()
    parts = ["generic", p.name if p.exists() else str(data_dir).replace("/", "_"), split,
             lang and f"lang={lang}", task and f"task={task}"]
    return examples, "/".join(x for x in parts if x)


register_dataset(DatasetSpec(
    name="generic",
    description="any local .json/.jsonl/.csv/.tsv/.parquet file (or folder, or HuggingFace Hub name) given as "
                "--data-dir, its columns mapped onto the common schema with --column FIELD=COLUMN",
    loader=load_generic_dataset, level="auto",
    lang=ArgRole("keep the rows of this language (with a lang column), else set it on every row"),
    task=ArgRole("keep the rows of this task (with a task column), else set it on every row"),
    columns=True,
))
