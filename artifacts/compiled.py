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
from pathlib import Path
from typing import Iterable

import dspy

from halluscope.core.contract import Detection, Evidence, describe_failed, failed_kinds, failure_reason
from halluscope.core.fileio import read_jsonl, write_text_atomic
from halluscope.core.parallel import map_items
from halluscope.core.redact import redact
from halluscope.core.tasks import HALLUCLEAN_TASKS

__all__ = ["CompiledDetector", "detect", "detect_jsonl", "read_answers"]


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
    keyed by task)."""
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
    rows = []
    for lineno, rec in read_jsonl(path):
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
        rows.append(row)
    return rows


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
    (atomically: a temp file, then ``os.replace``). Returns counts: items, ok, failed, with spans, seconds."""
    rows = read_answers(in_path)
    extra_inputs = tuple(extra_inputs)
    default_lang = lang or (detector.lang if isinstance(detector, CompiledDetector) else "")

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
    results = map_items(one, rows, threads=threads, progress=progress, desc="detect", unit="answer")
    reasons = [r.pop("_failed", None) for r in results]
    out = write_text_atomic(out_path, "".join(json.dumps(r, ensure_ascii=False, default=str) + "\n" for r in results))
    ok = [r for r in results if r.get("ok")]
    kinds = failed_kinds(reasons)
    return {"items": len(results), "ok": len(ok), "failed": len(results) - len(ok),
            "with_spans": sum(1 for r in ok if r.get("spans")), "seconds": round(time.perf_counter() - t0, 2),
            "output": str(out), "failed_kinds": kinds, "failed_why": describe_failed(kinds)}
