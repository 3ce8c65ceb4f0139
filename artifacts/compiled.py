"""The production path: a compiled detector, and detection on one answer or a JSONL file of answers.

Python::

    from halluscope import configure, load_compiled, detect
    configure("local")
    detector = load_compiled("spans", lang="de", metric="iou")      # best version, verified: a CompiledDetector
    det = detect(detector, "Die spanische Provinz heißt Álava.", question="...")   # a contract Detection
    detect_jsonl(detector, "answers.jsonl", "spans.jsonl")

Input JSONL rows need ``answer`` (or Mu-SHROOM's ``model_output_text``); ``question`` (or ``model_input``),
``context``, ``lang`` and ``id`` are optional. Each output row is ``{"id", "ok", ...Detection.to_dict()}``
(``spans``, ``soft_labels``, ``hard_labels``, ``label``, ``score``, ...); a failed item is
``{"id", "ok": false, "error"}`` and is counted; so is a detection without usable output
(:func:`halluscope.core.contract.item_failure`), written with its contract fields and ``"ok": false``.
"""

from __future__ import annotations

import json
import os
import time
from dataclasses import dataclass
from itertools import islice
from pathlib import Path
from typing import Iterable

import dspy
from tqdm import tqdm

from halluscope.core.contract import Detection, Evidence, describe_failed, failed_kinds, failure_reason
from halluscope.core.fileio import atomic_writer, iter_jsonl
from halluscope.core.parallel import map_items
from halluscope.core.redact import redact
from halluscope.core.tasks import HALLUCLEAN_TASKS

__all__ = ["CompiledDetector", "detect", "detect_jsonl", "read_answers", "iter_answers"]

#: Rows detected at a time per thread by :func:`detect_jsonl` (the rest of the file stays on disk).
BATCH = 32
#: The longest answer :func:`detect` takes. Detection runs in time linear in the length (grounded: about 30 s and
#: 0.5 GB for 1,000,000 characters on one core); a longer one is refused in one line: split it (issue #35).
MAX_ANSWER_CHARS = 1_000_000


@dataclass(frozen=True)
class CompiledDetector:
    """A verified compiled program with the manifest it was written with (see :mod:`halluscope.artifacts.store`).

    Call it like :func:`detect`: ``detector(answer, question=..., context=...)`` returns a ``Detection``."""

    program: dspy.Module
    manifest: dict
    path: Path

    @property
    def version(self) -> int:
        return int(self.manifest["version"])

    @property
    def name(self) -> str:
        return str(self.manifest.get("program", ""))

    @property
    def lang(self) -> str:
        return str(self.manifest.get("lang", "") or "")

    @property
    def metric(self) -> str:
        return str(self.manifest.get("metric", ""))

    @property
    def content_hash(self) -> str:
        return str(self.manifest.get("content_hash", ""))

    def __call__(self, answer: str, **kwargs) -> Detection:
        return detect(self, answer, **kwargs)


def detect(detector: CompiledDetector | dspy.Module, answer: str, *, question: str = "", context: str = "",
           lang: str | None = None, task: str | None = None, **extra) -> Detection:
    """Run a compiled detector (or any registered program's module) on one answer; return its ``Detection``.

    ``lang`` defaults to the artifact's language. ``task`` routes response-level programs (HalluClean: qa,
    dialogue, ...); it defaults to the artifact's key when that names a HalluClean task (such artifacts are
    keyed by task). An answer over :data:`MAX_ANSWER_CHARS` characters is a ``ValueError``."""
    if len(answer or "") > MAX_ANSWER_CHARS:
        raise ValueError(f"the answer has {len(answer):,} characters, over detect's limit of {MAX_ANSWER_CHARS:,} "
                         f"(MAX_ANSWER_CHARS); split it into parts and detect each")
    if callable(getattr(detector, "detector_for", None)):  # the run policy's AutoDetector: it picks per answer
        return detector(answer, question=question, context=context, lang=lang, task=task, **extra)
    program = detector.program if isinstance(detector, CompiledDetector) else detector
    key = detector.lang if isinstance(detector, CompiledDetector) else ""
    lang = lang or key
    if task is None and lang in HALLUCLEAN_TASKS:
        task = lang
    pred = program(question=question or "", answer=answer or "", lang=lang, context=context or "",
                   task=task or "", **extra)
    det = pred.get("detection") if hasattr(pred, "get") else None
    if not isinstance(det, Detection):
        det = Detection(answer=answer, spans=[(s["start"], s["end"], s.get("prob", 1.0)) for s in pred.spans],
                        label=bool(pred.get("label", False)), score=pred.get("score", 0.0))
    if not det.evidence and (context or "").strip():  # the program named no passages: it had the context
        det.evidence = [Evidence(text=context, source="context")]
    return det


def read_answers(path: str | os.PathLike) -> list[dict]:
    """Rows of a JSONL file normalised to ``{"id", "question", "answer", "context", "lang", ...}``."""
    return list(iter_answers(path))


def iter_answers(path: str | os.PathLike):
    """:func:`read_answers` one row at a time (the file is never held whole)."""
    for lineno, rec in iter_jsonl(path):
        answer = rec.get("answer", rec.get("model_output_text"))
        if not isinstance(answer, str):
            raise ValueError(f"{path}: line {lineno}: no 'answer' (or 'model_output_text') string")
        for name in ("lang", "question", "model_input", "context", "task"):
            if rec.get(name) is not None and not isinstance(rec[name], str):
                raise ValueError(f"{path}: line {lineno}: field {name!r}: expected a string, got "
                                 f"{type(rec[name]).__name__} {rec[name]!r}")
        row = dict(rec)
        row.update(id=str(rec.get("id", lineno)), answer=answer,
                   question=rec.get("question", rec.get("model_input")) or "",
                   context=rec.get("context") or "", lang=(rec.get("lang") or "").lower() or None)
        yield row


def detect_jsonl(
    detector: CompiledDetector | dspy.Module,
    in_path: str | os.PathLike,
    out_path: str | os.PathLike,
    *,
    lang: str | None = None,
    task: str | None = None,
    threads: int = 1,
    progress: bool = True,
    extra_inputs: Iterable[str] = (),
) -> dict:
    """Detect on every answer of a JSONL file; write one contract row per answer to ``out_path``
    (atomically: a temp file, then ``os.replace``). Returns counts: items, ok, failed, with spans, seconds, and
    ``duplicate_ids`` (rows whose id an earlier row already had: kept, each written, and counted).

    The file is streamed, never held whole: a first pass checks every row (a bad row fails the file before any
    detection, naming its line) and counts the ids; the second detects ``BATCH`` rows at a time and appends their
    results to the temp file (issue #35: a 27 MB input used to peak at 3.2 GB)."""
    extra_inputs = tuple(extra_inputs)
    default_lang = lang or (detector.lang if isinstance(detector, CompiledDetector) else "")
    seen: set[str] = set()
    n_rows = duplicates = 0
    for row in iter_answers(in_path):  # the check pass: only the ids are kept
        n_rows += 1
        duplicates += row["id"] in seen
        seen.add(row["id"])
    del seen

    def one(row):
        try:
            extra = {k: row.get(k) for k in extra_inputs}
            det = detect(detector, row["answer"], question=row["question"], context=row["context"],
                         lang=row["lang"] or default_lang, task=row.get("task") or task, **extra)
            reason = failure_reason(det.failures)
            if reason:  # written, but a failed item: its LM output was unusable (unreadable, truncated, LM error)
                return {"id": row["id"], "ok": False, "error": f"unusable output: {reason}", "_failed": reason,
                        **det.to_dict()}
            return {"id": row["id"], "ok": True, **det.to_dict()}
        except Exception as e:  # one bad item never stops the file
            return {"id": row["id"], "ok": False, "error": redact(f"{type(e).__name__}: {str(e)[:300]}"),
                    "_failed": f"error:{type(e).__name__}"}

    t0 = time.perf_counter()
    reasons: list[str | None] = []
    n_ok = with_spans = 0
    batch_size = BATCH * max(1, int(threads))
    bar = tqdm(total=n_rows, desc="detect", unit="answer", disable=not progress)
    try:
        with atomic_writer(out_path) as f:
            rows = iter_answers(in_path)
            while batch := list(islice(rows, batch_size)):
                for r in map_items(one, batch, threads=threads):
                    reason = r.pop("_failed", None)
                    reasons.append(reason)
                    if r.get("ok"):
                        n_ok += 1
                        with_spans += bool(r.get("spans"))
                    f.write(json.dumps(r, ensure_ascii=False, default=str) + "\n")
                bar.update(len(batch))
    finally:
        bar.close()
    kinds = failed_kinds(reasons)
    return {"items": len(reasons), "ok": n_ok, "failed": len(reasons) - n_ok, "with_spans": with_spans,
            "seconds": round(time.perf_counter() - t0, 2), "output": str(Path(out_path)), "failed_kinds": kinds,
            "failed_why": describe_failed(kinds), "duplicate_ids": duplicates}
