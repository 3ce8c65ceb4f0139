"""Loaders for the five HalluClean evaluation sets (``../shared/data/halluclean``), in the common schema.

Every case is a ``dspy.Example`` with ``id``, ``task``, ``lang`` ("en"), ``question``, ``answer``,
``context`` (inputs: ``question, answer, lang, context, task``), gold ``label`` (bool, True =
hallucinated) and ``reference`` (the gold correct text, for revision metrics; ``None`` when the task has
none), plus metadata (``source_id``, ``variant``, ...).

How each file maps onto the schema
----------------------------------
=================== ============== =============================== ===================== ==================
task (file)          question       answer                          context               label / reference
=================== ============== =============================== ===================== ==================
qa (QA)              question       right / hallucinated answer     knowledge             variant / right_answer
dialogue (DA)        dialogue hist. right / hallucinated response   knowledge             variant / right_response
summarization (SUM)  "" (none)      right / hallucinated summary    document              variant / right_summary
mwp (MWP)            the problem    "" (nothing to check but it)    ""                    unanswerable / None
self_contradiction   prefix (the    ``orig``, the first sentence    ``alt``: *the other   tag == "strong" /
(SC)                 text so far)                                   text* to compare with None
=================== ============== =============================== ===================== ==================

QA, DA and SUM items give two cases each (the right variant, label False, then the hallucinated one,
label True). MWP and SC items are one case each; MWP's positive class is "unanswerable" (answering it
would be a hallucination), SC's is "the two sentences contradict each other". For SC, ``context`` holds
the *other sentence*, not reference knowledge, and the item's ``target`` prompt ("Please tell me about
...") is kept as metadata (``target``); the routing of :mod:`programs.halluclean` shows it as such.

``limit`` counts *cases* and keeps both classes: cases are interleaved right, hallucinated, right, ...
(for QA/DA/SUM that is the item order; for MWP/SC negatives and positives alternate, in file order,
the rest of the larger class following when the smaller runs out).
"""

from __future__ import annotations

import json
import logging
from pathlib import Path

import dspy

from halluscope.core import paths
from halluscope.loaders.dataset_registry import ArgRole, DatasetSpec, register_dataset
from halluscope.core.tasks import HALLUCLEAN_TASKS, TASK_ALIASES, canonical_task

logger = logging.getLogger(__name__)

__all__ = [
    "HALLUCLEAN_TASKS",
    "HALLUCLEAN_FILES",
    "TASK_ALIASES",
    "INPUT_FIELDS",
    "HALLUCLEAN_DEMO_NOTICE",
    "canonical_task",
    "resolve_halluclean_dir",
    "load_halluclean",
    "halluclean_demo",
    "load_halluclean_or_demo",
]

HALLUCLEAN_FILES: dict[str, str] = {
    "qa": "QA",
    "dialogue": "DA",
    "summarization": "SUM",
    "mwp": "MWP",
    "self_contradiction": "SC",
}  # file name = f"{HALLUCLEAN_FILES[task]}.{split}.json"
INPUT_FIELDS = ("question", "answer", "lang", "context", "task")
ENV_VAR = paths.HALLUCLEAN_DATA_ENV

HALLUCLEAN_DEMO_NOTICE = (
    "!! HalluClean data not found: using the BUILT-IN DEMO cases (2 hand-written cases per task). !!\n"
    "!! Numbers on them only show that the pipeline runs. Pass --data-dir ../shared/data/halluclean. !!"
)


def resolve_halluclean_dir(data_dir: str | Path | None = None) -> Path | None:
    """The folder holding ``QA.dev.json`` etc.: ``data_dir`` (the folder itself or its parent with a
    ``halluclean/`` subfolder), else ``$HALLUSCOPE_HALLUCLEAN_DIR`` likewise, else ``None``. A ``data_dir`` given but missing raises."""
    if data_dir is not None:
        p = Path(data_dir).expanduser()
        if not p.is_dir():
            raise FileNotFoundError(f"HalluClean data folder not found: {p}")
        return p / "halluclean" if (p / "halluclean").is_dir() else p
    p = paths.env_path(ENV_VAR)
    if p is not None:
        for q in (p / "halluclean", p):
            if any((q / f"{name}.dev.json").is_file() for name in HALLUCLEAN_FILES.values()):
                return q
    return None


# -- per-task record -> cases ---------------------------------------------------------------------

def _need(rec: dict, keys: tuple[str, ...], where: str) -> None:
    missing = [k for k in keys if k not in rec]
    if missing:
        raise ValueError(f"{where}: missing field(s) {missing}; has {sorted(rec)}")


def _text(rec: dict, key: str, where: str) -> str:
    """The text of field ``key`` ("" when missing or null); a number is its text; anything else (a list, an
    object, a boolean) raises ``ValueError`` naming the item and the field."""
    v = rec.get(key)
    if v is None:
        return ""
    if isinstance(v, str):
        return v
    if isinstance(v, (int, float)) and not isinstance(v, bool):
        return str(v)
    raise ValueError(f"{where}: field {key!r}: expected text, got {type(v).__name__} {_short(v)}")


def _short(v, n: int = 60) -> str:
    r = repr(v)
    return r if len(r) <= n else r[:n] + "..."


def _pair_cases(task: str, rec: dict, where: str, q: str, ctx: str, right: str, hallu: str,
                sid: str) -> list[dict]:
    _need(rec, (right, hallu), where)
    base = {"task": task, "lang": "en", "question": _text(rec, q, where) if q else "",
            "context": _text(rec, ctx, where), "reference": _text(rec, right, where), "source_id": sid}
    return [
        {**base, "id": f"{task}-{sid}-right", "answer": _text(rec, right, where), "label": False,
         "variant": "right"},
        {**base, "id": f"{task}-{sid}-hallucinated", "answer": _text(rec, hallu, where), "label": True,
         "variant": "hallucinated"},
    ]


def _mwp_label(rec: dict, where: str) -> bool:
    lab = rec.get("label")
    if isinstance(lab, str) and lab.strip().lower() in ("yes", "no"):
        return lab.strip().lower() == "yes"
    if isinstance(rec.get("answerable"), bool):
        return not rec["answerable"]
    raise ValueError(f"{where}: needs label 'yes'/'no' or a boolean 'answerable'")


def _cases(task: str, rec: dict, where: str, default_id: str | None = None) -> list[dict]:
    """The cases of one record; ``where`` names it in errors, ``default_id`` (else ``where``) is its
    ``source_id`` when it has no ``id``."""
    if not isinstance(rec, dict):
        raise ValueError(f"{where}: expected a JSON object, got {type(rec).__name__}")
    sid = rec.get("id", default_id or where)
    if task == "qa":
        _need(rec, ("question",), where)
        return _pair_cases(task, rec, where, "question", "knowledge", "right_answer", "hallucinated_answer",
                           sid)
    if task == "dialogue":
        return _pair_cases(task, rec, where, "dialogue_history", "knowledge", "right_response",
                           "hallucinated_response", sid)
    if task == "summarization":
        _need(rec, ("document",), where)
        return _pair_cases(task, rec, where, "", "document", "right_summary", "hallucinated_summary", sid)
    if task == "mwp":
        _need(rec, ("question",), where)
        label = _mwp_label(rec, where)
        return [{"id": f"mwp-{sid}", "task": task, "lang": "en", "question": _text(rec, "question", where),
                 "answer": "", "context": "", "label": label, "reference": None, "source_id": sid,
                 "variant": "unanswerable" if label else "answerable",
                 "source": rec.get("source"), "category": rec.get("category")}]
    if task == "self_contradiction":
        _need(rec, ("prefix", "orig", "alt", "tag"), where)
        label = str(rec["tag"]).strip().lower() == "strong"
        return [{"id": f"sc-{sid}", "task": task, "lang": "en", "question": _text(rec, "prefix", where),
                 "answer": _text(rec, "orig", where), "context": _text(rec, "alt", where), "label": label,
                 "reference": None, "source_id": sid, "variant": "contradiction" if label else "consistent",
                 "target": _text(rec, "target", where), "link": rec.get("link")}]
    raise AssertionError(task)


def _interleave(cases: list[dict]) -> list[dict]:
    neg = [c for c in cases if not c["label"]]
    pos = [c for c in cases if c["label"]]
    out = []
    for i in range(max(len(neg), len(pos))):
        if i < len(neg):
            out.append(neg[i])
        if i < len(pos):
            out.append(pos[i])
    return out


def _to_examples(cases: list[dict], limit: int | None) -> list[dspy.Example]:
    if limit is not None:
        if limit < 0:
            raise ValueError(f"limit must be >= 0, not {limit}")
        cases = cases[:limit]
    return [dspy.Example(**c).with_inputs(*INPUT_FIELDS) for c in cases]


def _read_json(path: Path):
    """The JSON document in ``path``: UTF-8, a leading byte-order mark accepted. Text that is not UTF-8 or not
    JSON raises a one-line ``ValueError`` naming the file, the line and the column."""
    raw = path.read_bytes()
    body = raw[3:] if raw.startswith(b"\xef\xbb\xbf") else raw
    try:
        text = body.decode("utf-8")
    except UnicodeDecodeError as e:
        line = body.count(b"\n", 0, e.start) + 1
        col = e.start - (body.rfind(b"\n", 0, e.start) + 1) + 1
        raise ValueError(f"{path}: line {line}: not UTF-8 text (byte 0x{body[e.start]:02x} at column {col}); "
                         f"save the file as UTF-8") from None
    try:
        return json.loads(text)
    except json.JSONDecodeError as e:
        raise ValueError(f"{path}: line {e.lineno}: malformed JSON ({e.msg} at column {e.colno})") from None


def load_halluclean(
    data_dir: str | Path,
    task: str,
    limit: int | None = None,
    split: str = "dev",
) -> list[dspy.Example]:
    """The cases of one HalluClean task (see the module docstring), at most ``limit`` of them, balanced.

    ``data_dir`` is the folder with the JSON files or its parent (``../shared/data``); files are UTF-8 (a
    byte-order mark is accepted). A missing file raises ``FileNotFoundError`` naming it; text that is not UTF-8
    or not JSON raises a one-line ``ValueError`` naming the file, line and column, and a malformed record one
    naming the file, the item and the field.
    """
    task = canonical_task(task)
    root = Path(data_dir).expanduser()
    if (root / "halluclean").is_dir():
        root = root / "halluclean"
    path = root / f"{HALLUCLEAN_FILES[task]}.{split}.json"
    if not path.is_file():
        have = sorted(p.name for p in root.glob("*.json")) if root.is_dir() else []
        raise FileNotFoundError(
            f"HalluClean {task!r} file not found: {path} (folder has: {', '.join(have) or 'nothing'})"
        )
    data = _read_json(path)
    if isinstance(data, dict):  # SC: id -> record
        records = [({"id": k, **v} if isinstance(v, dict) else v) for k, v in data.items()]
    elif isinstance(data, list):
        records = data
    else:
        raise ValueError(f"{path}: expected a JSON list or object, got {type(data).__name__}")
    cases: list[dict] = []
    for i, rec in enumerate(records):
        cases.extend(_cases(task, rec, f"{path}: item {i}", default_id=f"{path.name} item {i}"))
    if task in ("mwp", "self_contradiction"):
        cases = _interleave(cases)
    return _to_examples(cases, limit)


# -- the built-in demo ----------------------------------------------------------------------------

_DEMO_RECORDS: dict[str, list[dict]] = {
    "qa": [{
        "id": "demo-1",
        "knowledge": "Canberra is the capital city of Australia. It was chosen in 1908 as a compromise "
                     "between Sydney and Melbourne.",
        "question": "What is the capital of Australia?",
        "right_answer": "Canberra",
        "hallucinated_answer": "The capital of Australia is Sydney, chosen in 1908.",
    }],
    "dialogue": [{
        "id": "demo-1",
        "knowledge": "Inception is directed by Christopher Nolan. Inception stars Leonardo DiCaprio.",
        "dialogue_history": "[Human]: Can you recommend a film with Leonardo DiCaprio? "
                            "[Assistant]: Inception is a great one. [Human]: Who directed it?",
        "right_response": "Inception was directed by Christopher Nolan.",
        "hallucinated_response": "Inception was directed by Steven Spielberg in 1995.",
    }],
    "summarization": [{
        "id": "demo-1",
        "document": "The city council voted on Tuesday to build a new public library in the old market "
                    "square. Construction will start next spring and is expected to take two years. "
                    "The library will have a children's wing and a rooftop garden.",
        "right_summary": "The council approved a new library in the old market square, to be built over "
                         "two years from next spring.",
        "hallucinated_summary": "The council approved a new library in the old market square, costing "
                                "50 million dollars and opening next month.",
    }],
    "mwp": [
        {"id": "demo-1", "question": "Anna has 3 apples and buys 5 more. How many apples does she have now?",
         "answer": 8, "answerable": True, "label": "no"},
        {"id": "demo-2", "question": "Tom buys some pencils for 2 dollars each. How much does he spend?",
         "answer": None, "answerable": False, "label": "yes"},
    ],
    "self_contradiction": {
        "demo-ok": {"target": "Please tell me about the Eiffel Tower.",
                    "prefix": "The Eiffel Tower is a wrought-iron tower in Paris.",
                    "orig": "It was completed in 1889 for the World's Fair.",
                    "alt": "It opened to the public in 1889.", "tag": "ok"},
        "demo-strong": {"target": "Please tell me about the Eiffel Tower.",
                        "prefix": "The Eiffel Tower is a wrought-iron tower in Paris.",
                        "orig": "It is about 330 metres tall.",
                        "alt": "It is about 120 metres tall.", "tag": "strong"},
    },
}


def halluclean_demo(task: str, limit: int | None = None, notice: bool = True) -> list[dspy.Example]:
    """Two hand-written cases of ``task`` (one right, one hallucinated), in the same schema as the data.

    Logs :data:`HALLUCLEAN_DEMO_NOTICE` as a warning unless ``notice=False``: demo numbers mean nothing.
    """
    task = canonical_task(task)
    if notice:
        logger.warning(HALLUCLEAN_DEMO_NOTICE)
    data = _DEMO_RECORDS[task]
    records = [{"id": k, **v} for k, v in data.items()] if isinstance(data, dict) else data
    cases: list[dict] = []
    for i, rec in enumerate(records):
        cases.extend(_cases(task, rec, f"demo item {i}"))
    if task in ("mwp", "self_contradiction"):
        cases = _interleave(cases)
    out = _to_examples(cases, limit)
    for ex in out:
        ex["demo"] = True
    return out


def load_halluclean_or_demo(
    data_dir: str | Path | None, task: str, limit: int | None = None
) -> tuple[list[dspy.Example], bool]:
    """``(examples, is_demo)``: the real data when :func:`resolve_halluclean_dir` finds it, else the demo."""
    root = resolve_halluclean_dir(data_dir)
    if root is None:
        return halluclean_demo(task, limit), True
    return load_halluclean(root, task, limit), False


# -- the dataset: registered here, where it is defined --------------------------------------------------

def _load_halluclean_dataset(data_dir=None, *, lang=None, task=None, split="dev", context=None, limit=None,
                             columns=None):
    root = resolve_halluclean_dir(data_dir)
    if root is None:  # no data configured: the demo cases stand in (halluclean_demo logs the notice)
        return halluclean_demo(task, limit), f"halluclean-demo/{task}"
    return load_halluclean(root, task, limit=limit, split=split), f"halluclean/{task}"


register_dataset(DatasetSpec(
    name="halluclean",
    description="the five HalluClean evaluation sets: response-level labels; built-in demo cases stand in "
                "when no data is configured (--data-dir or $HALLUSCOPE_HALLUCLEAN_DIR)",
    loader=_load_halluclean_dataset, level="response", splits=("dev",), default_split="dev",
    task=ArgRole("the HalluClean task", choices=HALLUCLEAN_TASKS, canonical=canonical_task, required=True),
))
