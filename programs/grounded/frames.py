"""Framed answers: HalluClean QA's right answers said in a sentence, and wrong ones said the same way.

Why: in HaluEval / HalluClean QA the right answers are short spans ("Paris") and the hallucinated ones whole
sentences, so answer length alone separates them (AUC 0.967) and a response head fitted on that data learns "long =
hallucinated" — it calls a correct, fully supported sentence like "The Eiffel Tower is in Paris and was completed
in 1889." hallucinated. A frame puts an item's answer into a fixed, neutral sentence; the same frame around a
*wrong* answer (another item's right answer, one the item's question and evidence do not contain) gives its
hallucinated twin of the same length and wording. Both are deterministic functions of the item.

Two sets of frames, disjoint, so that a head fitted with one set is checked on sentences it never saw:

* :data:`CHECK_FRAMES` — the length-controlled check (``bench_grounded.py length``): only ever scored.
* :data:`TRAIN_FRAMES` — the augmentation (``-O head_frames=true``): the framed right answers (label correct)
  and their framed wrong twins (label hallucinated) are added to the response head's *training* rows, with the
  item's own group key, so cross-validation holds them out with the item.

The ``evidence_sentence`` frame is the evidence sentence that holds the right answer, verbatim; its wrong twin is
that sentence with the answer replaced by the wrong one (a substitution, the commonest hallucination).
"""

from __future__ import annotations

import re

from halluscope.programs.grounded.signals.align import evidence_sentences

__all__ = ["FRAMES", "CHECK_FRAMES", "TRAIN_FRAMES", "frame_answer", "wrong_answers", "framed_examples"]

#: name -> template ({answer}: the answer without its final full stop; {question}: the question, ending in "?")
FRAMES = {
    "answer_is": "The answer is {answer}.",
    "is_the_answer": "{answer} is the answer to this question.",
    "restates_question": "The answer to the question \"{question}\" is {answer}.",
    "passage_says": "According to the passage, the answer is {answer}.",
    "asks_it_is": "The question asks: {question} It is {answer}.",
    "evidence_sentence": None,  # the evidence sentence holding the answer (see frame_answer)
}
#: the length-controlled check: scored, never fitted on
CHECK_FRAMES = ("answer_is", "is_the_answer", "restates_question")
#: the augmentation of the response head's training rows (``head_frames``)
TRAIN_FRAMES = ("passage_says", "asks_it_is", "evidence_sentence")


def _clean_answer(answer: str) -> str:
    return re.sub(r"\s+", " ", (answer or "").strip()).rstrip(".").strip()


def _clean_question(question: str) -> str:
    q = re.sub(r"\s+", " ", (question or "").strip()).rstrip(" ?.")
    return f"{q}?" if q else ""


def evidence_sentence(context: str, answer: str) -> str | None:
    """The first sentence of ``context`` that holds ``answer`` (case-insensitive), or None."""
    a = _clean_answer(answer).lower()
    if not a:
        return None
    return next((s for s in evidence_sentences(context or "") if a in s.lower()), None)


def frame_answer(frame: str, question: str, answer: str, context: str = "", substitute: str | None = None) -> str | None:
    """``answer`` to ``question`` put into the frame named ``frame`` (:data:`FRAMES`); None when the frame does
    not apply (``evidence_sentence``: no evidence sentence holds the answer; an empty answer). With
    ``substitute``, the frame around that answer instead: for ``evidence_sentence``, the answer's sentence with
    the answer replaced by ``substitute`` (its first occurrence)."""
    if frame not in FRAMES:
        raise ValueError(f"unknown frame {frame!r}; known: {', '.join(FRAMES)}")
    a = _clean_answer(answer)
    if not a:
        return None
    if FRAMES[frame] is None:
        sent = evidence_sentence(context, a)
        if sent is None:
            return None
        if substitute is None:
            return sent
        sub = _clean_answer(substitute)
        return re.sub(re.escape(a), lambda _: sub, sent, count=1, flags=re.IGNORECASE) if sub else None
    said = _clean_answer(substitute) if substitute is not None else a
    if not said:
        return None
    return FRAMES[frame].format(answer=said, question=_clean_question(question))


def wrong_answers(items: list[dict]) -> list[str | None]:
    """A wrong answer for each item (``question``, ``context``, ``answer`` = its right answer): the right answer of
    the next item in order (cyclically) that differs from the item's own and that neither its question nor its
    evidence contains (case-insensitive), so that the evidence cannot support it; None if there is none."""
    rights = [_clean_answer(it.get("answer", "")) for it in items]
    out: list[str | None] = []
    n = len(items)
    for i, it in enumerate(items):
        seen = f"{it.get('question', '')}\n{it.get('context', '')}".lower()
        pick = None
        for k in range(1, n):
            cand = rights[(i + k) % n]
            if cand and cand.lower() != rights[i].lower() and cand.lower() not in seen:
                pick = cand
                break
        out.append(pick)
    return out


def framed_examples(examples, frames=TRAIN_FRAMES, task: str = "qa") -> list[dict]:
    """Framed variants of the right answers of ``task`` among ``examples`` (HalluClean cases: dicts or
    ``dspy.Example``; a right answer is a case with label False): for each item and frame, the framed right
    answer (``label`` False) and the same frame around the item's wrong answer (:func:`wrong_answers`, ``label``
    True). Each variant keeps the item's question, evidence and ``source_id`` (so it shares the item's group key),
    with ``variant`` = ``frame:<name>:right|wrong``. Items a frame does not apply to are skipped."""
    get = lambda ex, k, d="": (ex.get(k, d) if hasattr(ex, "get") else getattr(ex, k, d)) or d  # noqa: E731
    rights = [ex for ex in examples if get(ex, "task") == task and get(ex, "label", False) is False
              and _clean_answer(get(ex, "answer"))]
    items = [{"question": get(ex, "question"), "context": get(ex, "context"), "answer": get(ex, "answer")}
             for ex in rights]
    wrongs = wrong_answers(items)
    out = []
    for ex, it, wrong in zip(rights, items, wrongs):
        base = {"task": get(ex, "task"), "lang": get(ex, "lang", "en"), "question": it["question"],
                "context": it["context"], "source_id": get(ex, "source_id", None)}
        sid = str(get(ex, "id", "")).removesuffix("-right")
        for name in frames:
            right = frame_answer(name, it["question"], it["answer"], it["context"])
            if right is None:
                continue
            out.append({**base, "id": f"{sid}-frame-{name}-right", "answer": right, "label": False,
                        "reference": it["answer"], "variant": f"frame:{name}:right", "frame": name})
            bad = frame_answer(name, it["question"], it["answer"], it["context"], substitute=wrong) if wrong else None
            if bad is not None and bad != right:
                out.append({**base, "id": f"{sid}-frame-{name}-wrong", "answer": bad, "label": True,
                            "reference": it["answer"], "variant": f"frame:{name}:wrong", "frame": name})
    return out
