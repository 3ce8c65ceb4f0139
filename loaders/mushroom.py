"""Mu-SHROOM (SemEval-2025 Task 3) loader: JSONL files -> ``dspy.Example`` in the common schema.

Data layout (the "data root", e.g. ``../shared/data/mushroom``)::

    <root>/val/mushroom.<lang>-val.v2.extra.jsonl
    <root>/context/val/{native,translated-en}/<lang>/<id>.context.txt

Every example carries

* inputs: ``question`` (``model_input``), ``answer`` (``model_output_text``, *unchanged*: gold
  offsets index into it, so it is never stripped), ``lang`` (lower-case ISO code), ``context``
  (``""`` when none);
* gold labels: ``hard_labels`` (``[[start, end], ...]``), ``soft_labels``
  (``[{"start", "end", "prob"}, ...]``), ``annotations`` (annotator -> spans, ``{}`` when absent) and
  ``label`` (``True`` when ``hard_labels`` is non-empty; ``None`` for unlabelled test items);
* metadata: ``id``, ``task`` (``"mushroom"``), and when present ``model_id``,
  ``model_output_tokens``, ``model_output_logits``, ``wikipedia_url``.

Why the ``json`` module and not ``datasets.load_dataset("json", ...)``: Arrow infers ``annotations``
(a mapping with a different set of annotator ids on each line) as one struct whose fields are the
union of *all* annotator ids in the file, so every item gains phantom annotators with value ``None``
(e.g. ``val-de-1`` comes back with 4 annotators instead of 3). That silently changes the annotator
count soft labels are computed from. Arrow also cannot tell us which line of a file is malformed,
and it caches under ``~/.cache``. The files are tiny (about 50 lines), so plain ``json`` is both
correct and fast.
"""

from __future__ import annotations

import json
import logging
import math
import os
import re
import warnings
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

import dspy

from halluscope.core.fileio import read_jsonl, write_text_atomic
from halluscope.core.literals import TextValueError, parse_text_list

from halluscope.core.contract import hard_labels_from_soft
from halluscope.core import paths
from halluscope.loaders.dataset_registry import ArgRole, DatasetArgumentError, DatasetSpec, register_dataset
from halluscope.loaders.demo import DEMO_NOTICE, demo_data_dir

__all__ = [
    "LANGS",
    "VAL_LANGS",
    "SPLITS",
    "CONTEXT_VARIANTS",
    "ENV_VAR",
    "INPUT_FIELDS",
    "MushroomDataWarning",
    "resolve_data_dir",
    "candidate_files",
    "load_mushroom",
    "load_gold_records",
    "last_load_stats",
    "write_submission",
]

#: The 14 Mu-SHROOM languages.
LANGS: tuple[str, ...] = (
    "ar", "ca", "cs", "de", "en", "es", "eu", "fa", "fi", "fr", "hi", "it", "sv", "zh",
)
#: The 10 languages that have a labelled validation split.
VAL_LANGS: tuple[str, ...] = ("ar", "de", "en", "es", "fi", "fr", "hi", "it", "sv", "zh")
SPLITS: tuple[str, ...] = ("val", "test")
CONTEXT_VARIANTS: tuple[str, ...] = ("none", "native", "translated-en")
#: Environment variable naming the Mu-SHROOM data root.
ENV_VAR = paths.MUSHROOM_DATA_ENV
#: The input fields of every example (``Example.with_inputs``).
INPUT_FIELDS: tuple[str, ...] = ("question", "answer", "lang", "context")

_FILE_LANG_RE = re.compile(r"mushroom\.([a-z]{2})-", re.IGNORECASE)
_ID_LANG_RE = re.compile(r"^[a-z]+-([a-z]{2})-", re.IGNORECASE)


class MushroomDataWarning(UserWarning):
    """A recoverable data problem (skipped item, missing context file)."""


# Counters of the most recent load_mushroom call; read them with last_load_stats().
_LAST_STATS: dict[str, Any] = {}


def last_load_stats() -> dict[str, Any]:
    """Counters of the most recent :func:`load_mushroom` call (a copy).

    Keys: ``files`` (paths read), ``items`` (examples returned), ``skipped_no_output`` (items
    without ``model_output_text``), ``missing_context`` (items whose context file was missing and
    got ``""``), ``context`` (the variant).
    """
    return dict(_LAST_STATS)


def resolve_data_dir(data_dir: str | os.PathLike | None = None) -> Path | None:
    """The Mu-SHROOM data root: ``data_dir`` if given, else ``$HALLUSCOPE_DATA_DIR``, else ``None``.

    ``None`` means "no real data configured: use the built-in demo set"
    (:func:`loaders.demo.demo_data_dir`). Existence is not checked here; :func:`load_mushroom`
    raises a ``FileNotFoundError`` naming what it looked for.
    """
    if data_dir is not None and str(data_dir) != "":
        return Path(data_dir).expanduser()
    env = os.environ.get(ENV_VAR, "").strip()
    if env:
        return Path(env).expanduser()
    return None


def _check_lang(lang: str | None) -> str | None:
    if lang is None:
        return None
    code = str(lang).strip().lower()
    if code not in LANGS:
        raise ValueError(f"unknown Mu-SHROOM language {lang!r}; choose one of: {', '.join(LANGS)}")
    return code


def _check_split(split: str) -> str:
    if split not in SPLITS:
        raise ValueError(f"unknown split {split!r}; choose one of: {', '.join(SPLITS)}")
    return split


def candidate_files(root: str | os.PathLike, lang: str, split: str = "val") -> list[Path]:
    """The paths tried, in order, for ``lang``/``split`` under a data root (or a flat folder)."""
    root = Path(root)
    names = [f"mushroom.{lang}-{stem}.{ext}" for stem in _SPLIT_STEMS[split]
             for ext in ("extra.jsonl", "jsonl")]  # the labelled (.extra) file first
    return [root / split / n for n in names] + [root / n for n in names]


#: File-name stems of each split: the official release names (``mushroom.<lang>-val.v2.extra.jsonl``,
#: ``mushroom.<lang>-tst.v1.extra.jsonl`` labelled, ``mushroom.<lang>-tst.v1.jsonl`` unlabelled) and older ones.
_SPLIT_STEMS = {"val": ("val.v2", "val.v1"), "test": ("tst.v1", "test.v2", "test.v1", "tst.v2")}


def _find_file(root: Path, lang: str, split: str) -> Path | None:
    for p in candidate_files(root, lang, split):
        if p.is_file():
            return p
    return None


def _record_lang(rec: Mapping, path: Path) -> str:
    """Lower-case language of a record: its ``lang`` field, else the file name, else the id."""
    lang = rec.get("lang")
    if isinstance(lang, str) and lang.strip():
        return lang.strip().lower()
    m = _FILE_LANG_RE.search(path.name)
    if m:
        return m.group(1).lower()
    m = _ID_LANG_RE.match(str(rec.get("id", "")))
    if m:
        return m.group(1).lower()
    return ""


def _hard(spans: Any) -> list[list[int]]:
    return [[int(s), int(e)] for s, e in (spans or [])]


def _soft(labels: Any) -> list[dict]:
    return [
        {"start": int(d["start"]), "end": int(d["end"]), "prob": float(d["prob"])}
        for d in (labels or [])
    ]


def _gold(rec: Mapping) -> tuple[list, list, dict, bool | None]:
    """``(hard_labels, soft_labels, annotations, label)``; unlabelled records give ``[], [], {}, None``."""
    has_hard = rec.get("hard_labels") is not None
    has_soft = rec.get("soft_labels") is not None
    if not has_hard and not has_soft:
        return [], [], {}, None
    # A file with only one of the two label kinds: derive the other (contract rules).
    hard = _hard(rec["hard_labels"]) if has_hard else None
    if has_soft:
        soft = _soft(rec["soft_labels"])
    else:
        soft = [{"start": s, "end": e, "prob": 1.0} for s, e in hard]
    if hard is None:
        hard = hard_labels_from_soft(soft)
    annotations = {str(k): _hard(v) for k, v in (rec.get("annotations") or {}).items()}
    return hard, soft, annotations, bool(hard)


#: The gold of one record by the rules above (public: the generic loader reads span columns by them too).
gold_from_record = _gold


def _whole(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) or (
        isinstance(value, float) and math.isfinite(value) and value == int(value))


def _check_offsets(start: Any, end: Any, n: int, what: str) -> None:
    if not (_whole(start) and _whole(end)):
        raise ValueError(f"{what}: expected offsets that are whole numbers, got [{start!r}, {end!r}]")
    if not 0 <= start < end <= n:
        raise ValueError(f"{what}: expected 0 <= start < end <= {n} (the answer's length), got [{start!r}, {end!r}]")


def check_gold(rec: Mapping, where: str) -> None:
    """Refuse malformed gold in one record (``ValueError`` naming ``where`` and the field): ``hard_labels`` a list
    of ``[start, end]`` with whole-number offsets ``0 <= start < end <= len(model_output_text)``; ``soft_labels``
    a list of ``{"start", "end", "prob"}`` with such offsets and ``0 <= prob <= 1``."""
    text = rec.get("model_output_text")
    n = len(text) if isinstance(text, str) else 0
    hard = rec.get("hard_labels")
    if hard is not None:
        if not isinstance(hard, list):
            raise ValueError(f"{where}: field 'hard_labels': expected a list of [start, end], got "
                             f"{type(hard).__name__}")
        for i, span in enumerate(hard):
            what = f"{where}: field 'hard_labels'[{i}]"
            if not isinstance(span, (list, tuple)) or len(span) != 2:
                raise ValueError(f"{what}: expected [start, end], got {span!r}")
            _check_offsets(span[0], span[1], n, what)
    soft = rec.get("soft_labels")
    if soft is not None:
        if not isinstance(soft, list):
            raise ValueError(f"{where}: field 'soft_labels': expected a list of {{start, end, prob}}, got "
                             f"{type(soft).__name__}")
        for i, d in enumerate(soft):
            what = f"{where}: field 'soft_labels'[{i}]"
            if not isinstance(d, Mapping) or not {"start", "end", "prob"} <= set(d):
                raise ValueError(f"{what}: expected {{\"start\", \"end\", \"prob\"}}, got {d!r}")
            _check_offsets(d["start"], d["end"], n, what)
            p = d["prob"]
            if isinstance(p, bool) or not isinstance(p, (int, float)) or not (0.0 <= p <= 1.0):
                raise ValueError(f"{what}: expected 0 <= prob <= 1, got {p!r}")


def _json_list(value: Any, where: str) -> list:
    """A list, or a string holding one as JSON or as a Python repr (the official Catalan test file writes tokens
    and logits as ``"['El', ' gat']"``); read by :func:`halluscope.core.literals.parse_text_list`, never evaluated."""
    if isinstance(value, str):
        try:
            value = parse_text_list(value)
        except TextValueError as e:
            raise ValueError(f"{where}: expected a list, or a string holding one as JSON or a Python literal "
                             f"({e})") from None
    if not isinstance(value, list):
        raise ValueError(f"{where}: expected a list, got {type(value).__name__}")
    return value


def _safe_file_id(item_id: Any) -> bool:
    """Whether ``item_id`` can name ``<id>.context.txt`` inside the context folder (no path parts)."""
    text = str(item_id)
    return bool(text) and not text.startswith(".") and not any(c in text for c in ("/", "\\", "\0", ":"))


def _context_root(path_or_dir: Path, split: str, context_dir: str | os.PathLike | None) -> Path:
    if context_dir is not None:
        return Path(context_dir)
    if path_or_dir.is_dir():
        return path_or_dir / "context"
    # A file: <root>/<split>/<file> or <root>/<file>.
    parent = path_or_dir.parent
    root = parent.parent if parent.name == split else parent
    return root / "context"


def load_gold_records(
    path: str | os.PathLike, lang: str | None = None, split: str = "val"
) -> list[dict]:
    """The raw JSON records of a Mu-SHROOM file, in file order (for scoring).

    ``path`` is a JSONL file, or a data root / flat folder together with ``lang``.
    """
    split = _check_split(split)
    p = Path(path)
    if p.is_dir():
        code = _check_lang(lang)
        if code is None:
            raise ValueError("load_gold_records: pass lang=... when path is a directory")
        found = _find_file(p, code, split)
        if found is None:
            tried = ", ".join(str(c) for c in candidate_files(p, code, split))
            raise FileNotFoundError(f"no Mu-SHROOM {split} file for {code!r}; tried: {tried}")
        p = found
    elif not p.is_file():
        raise FileNotFoundError(f"no such Mu-SHROOM file: {p}")
    return [rec for _, rec in read_jsonl(p)]


def load_mushroom(
    path_or_dir: str | os.PathLike,
    lang: str | None = None,
    split: str = "val",
    context: str = "none",
    context_dir: str | os.PathLike | None = None,
    limit: int | None = None,
) -> list[dspy.Example]:
    """Load Mu-SHROOM items as ``dspy.Example`` s (inputs: question, answer, lang, context).

    Args:
        path_or_dir: a JSONL file, or the data root (containing ``<split>/`` and ``context/``), or a
            folder directly holding ``mushroom.<lang>-<split>.v2[.extra].jsonl`` files.
        lang: keep only this language (validated against :data:`LANGS`). With a directory and
            ``lang=None``, every language whose file exists is loaded, in :data:`LANGS` order.
        split: ``"val"`` or ``"test"`` (test items without labels get ``label=None``).
        context: ``"none"``, ``"native"`` or ``"translated-en"``; files are read from
            ``<context_dir or root/context>/<split>/<variant>/<lang>/<id>.context.txt``.
        context_dir: overrides ``<root>/context``.
        limit: keep the first ``limit`` items (file order; across languages in ``LANGS`` order).

    Raises:
        FileNotFoundError: no data file (the message lists every path tried), or a missing
            context folder for a language.
        ValueError: bad ``lang``/``split``/``context``/``limit``, or a malformed line (file and
            line number named).

    Items without ``model_output_text`` are skipped with a :class:`MushroomDataWarning`; a missing
    context file gives ``context=""`` with a warning. Both are counted in :func:`last_load_stats`.
    """
    code = _check_lang(lang)
    split = _check_split(split)
    if context not in CONTEXT_VARIANTS:
        raise ValueError(f"unknown context {context!r}; choose one of: {', '.join(CONTEXT_VARIANTS)}")
    if limit is not None and (isinstance(limit, bool) or int(limit) < 0):
        raise ValueError(f"limit must be a non-negative integer or None, got {limit!r}")

    src = Path(path_or_dir).expanduser()
    if src.is_dir():
        if code is not None:
            found = _find_file(src, code, split)
            if found is None:
                tried = "\n  ".join(str(c) for c in candidate_files(src, code, split))
                raise FileNotFoundError(
                    f"no Mu-SHROOM {split} file for language {code!r} under {src}; tried:\n  {tried}"
                )
            files = [found]
        else:
            files = [f for f in (_find_file(src, c, split) for c in LANGS) if f is not None]
            if not files:
                raise FileNotFoundError(
                    f"no Mu-SHROOM {split} files under {src}; tried, for each language in "
                    f"{', '.join(LANGS)}: "
                    + ", ".join(str(c) for c in candidate_files(src, "<lang>", split))
                )
    elif src.is_file():
        files = [src]
    else:
        raise FileNotFoundError(f"no such Mu-SHROOM file or directory: {src}")

    stats: dict[str, Any] = {
        "files": [str(f) for f in files],
        "items": 0,
        "skipped_no_output": 0,
        "missing_context": 0,
        "context": context,
    }
    _LAST_STATS.clear()
    _LAST_STATS.update(stats)

    # 1. Records, in file order, filtered by language and limited.
    max_items = None if limit is None else int(limit)
    rows: list[tuple[dict, str, Path, int]] = []  # record, language, file, line
    seen: dict[str, int] = {}  # id -> first line
    seen_in: dict[str, Path] = {}  # id -> its file
    for path in files:
        if max_items is not None and len(rows) >= max_items:
            break
        for lineno, rec in read_jsonl(path):
            if max_items is not None and len(rows) >= max_items:
                break
            item_lang = _record_lang(rec, path)
            if code is not None and item_lang != code:
                continue
            if "id" not in rec:
                raise ValueError(f"{path}: line {lineno}: record has no 'id'")
            if context != "none" and not _safe_file_id(rec["id"]):  # ids name the context files
                raise ValueError(f"{path}: line {lineno}: field 'id': expected a file-name-safe id (no '/', '\\', "
                                 f"leading '.'), got {rec['id']!r}; it would name a context file outside the "
                                 f"context folder")
            if not isinstance(rec.get("model_output_text"), str):
                stats["skipped_no_output"] += 1
                warnings.warn(
                    f"Mu-SHROOM item {rec['id']!r} ({path.name}, line {lineno}) has no "
                    "model_output_text; skipped",
                    MushroomDataWarning,
                    stacklevel=2,
                )
                continue
            where = f"{path}: line {lineno}: item {rec['id']!r}"
            check_gold(rec, where)
            first = seen.setdefault(str(rec["id"]), lineno)
            if first != lineno and seen_in.get(str(rec["id"])) == path:
                raise ValueError(f"{where}: duplicate id (first on line {first}); ids must be unique")
            seen_in.setdefault(str(rec["id"]), path)
            rows.append((rec, item_lang, path, lineno))

    # 2. Contexts: a missing folder is an error, a missing file is "" (warned, counted).
    ctx_by_lang: dict[str, Path] = {}
    if context != "none":
        ctx_root = _context_root(src, split, context_dir)
        for lang_code in dict.fromkeys(row[1] for row in rows):
            folder = ctx_root / split / context / lang_code
            if not folder.is_dir():
                raise FileNotFoundError(
                    f"context folder not found: {folder} (context={context!r}; expected "
                    f"<context_dir or root/context>/{split}/{context}/{lang_code}/<id>.context.txt)"
                )
            ctx_by_lang[lang_code] = folder

    examples: list[dspy.Example] = []
    for rec, item_lang, path, lineno in rows:
        ctx = ""
        if context != "none":
            f = ctx_by_lang[item_lang] / f"{rec['id']}.context.txt"
            if f.is_file():
                ctx = f.read_text(encoding="utf-8")
            else:
                stats["missing_context"] += 1
                warnings.warn(
                    f"no {context} context for Mu-SHROOM item {rec['id']!r}: {f} (using \"\")",
                    MushroomDataWarning,
                    stacklevel=2,
                )
        hard, soft, annotations, label = _gold(rec)
        fields: dict[str, Any] = {
            "id": str(rec["id"]),
            "task": "mushroom",
            "lang": item_lang,
            "question": rec.get("model_input") or "",
            "answer": rec["model_output_text"],
            "context": ctx,
            "hard_labels": hard,
            "soft_labels": soft,
            "annotations": annotations,
            "label": label,
        }
        for key in ("model_id", "model_output_tokens", "model_output_logits", "wikipedia_url"):
            if rec.get(key) is not None:
                fields[key] = rec[key]
        for key in ("model_output_tokens", "model_output_logits"):  # lists, or strings holding them (JSON or repr)
            if key in fields:
                fields[key] = _json_list(fields[key], f"{path}: line {lineno}: field {key!r}")
        examples.append(dspy.Example(**fields).with_inputs(*INPUT_FIELDS))

    stats["items"] = len(examples)
    _LAST_STATS.clear()
    _LAST_STATS.update(stats)
    return examples


def _get(obj: Any, key: str) -> Any:
    if isinstance(obj, Mapping):
        return obj.get(key)
    try:
        return getattr(obj, key)
    except (AttributeError, KeyError):
        return None


def _submission_labels(det: Any, item_id: str) -> tuple[list[list[int]], list[dict]]:
    hard = _get(det, "hard_labels")
    soft = _get(det, "soft_labels")
    if hard is None and soft is None:
        raise ValueError(f"prediction for {item_id!r} has neither hard_labels nor soft_labels")
    soft_out = _soft(soft) if soft is not None else [
        {"start": int(s), "end": int(e), "prob": 1.0} for s, e in hard
    ]
    hard_out = _hard(hard) if hard is not None else hard_labels_from_soft(soft_out)
    return hard_out, soft_out


def write_submission(
    path: str | os.PathLike, ids: Iterable[str], detections_or_predictions: Iterable[Any]
) -> Path:
    """Write the official submission JSONL (``{"id", "hard_labels", "soft_labels"}`` a line).

    Each prediction may be a ``dspy.Prediction``, a :class:`halluscope.core.contract.Detection` or a
    dict with ``hard_labels`` and/or ``soft_labels`` (a missing one is derived from the other).
    The file is written atomically: a temp file in the same folder, then ``os.replace``.
    """
    ids = [str(i) for i in ids]
    dets = list(detections_or_predictions)
    if len(ids) != len(dets):
        raise ValueError(f"write_submission: {len(ids)} ids but {len(dets)} predictions")
    lines = []
    for item_id, det in zip(ids, dets):
        hard, soft = _submission_labels(det, item_id)
        lines.append(
            json.dumps({"id": item_id, "hard_labels": hard, "soft_labels": soft}, ensure_ascii=False)
        )
    out = write_text_atomic(path, "".join(line + "\n" for line in lines))
    return out


logger = logging.getLogger(__name__)


# -- the dataset: registered here, where it is defined --------------------------------------------------

def _load_mushroom_dataset(data_dir=None, *, lang=None, task=None, split="val", context="none", limit=None,
                           columns=None):
    root = resolve_data_dir(data_dir)
    if root is None:  # no data configured: the demo set stands in, in English unless a language is named
        logger.warning(DEMO_NOTICE)
        root, lang, source = demo_data_dir(), lang or "en", "demo"
    else:
        if lang is None and Path(root).is_dir():
            raise DatasetArgumentError(f"argument --lang: required with a Mu-SHROOM data folder ({root}); "
                                       f"choose from {', '.join(LANGS)}")
        source = "mushroom"
    # "all": every language with a file in the folder (one cross-lingual artifact, keyed "all")
    examples = load_mushroom(root, lang=None if lang == "all" else lang, split=split, context=context or "none",
                             limit=limit)
    return examples, f"{source}/{lang or 'all'}/{split}/context={context or 'none'}"


def _write_mushroom_submission(path, ids, predictions):
    """The official Mu-SHROOM submission file; a failed prediction (``None``) is submitted as no spans."""
    return write_submission(path, list(ids), [p if p is not None else {"hard_labels": [], "soft_labels": []}
                                              for p in predictions])


register_dataset(DatasetSpec(
    name="mushroom",
    description="Mu-SHROOM (SemEval-2025 Task 3): span-level gold in 14 languages; the built-in demo set "
                "stands in when no data is configured (--data-dir or $HALLUSCOPE_DATA_DIR)",
    loader=_load_mushroom_dataset, level="span", splits=SPLITS, default_split="val",
    lang=ArgRole("the Mu-SHROOM language, or all (every language in the folder); required with a data folder, "
                 "en for the demo set", choices=(*LANGS, "all")),
    submission=_write_mushroom_submission,
))
