"""MEDICO: multi-source evidence fusion for hallucination detection and preservation-bounded correction.

Pipeline for a question q and an answer o (one :class:`Medico` call):

1. **Retrieve** ``k`` pieces from every configured source (``sources="context,kb,files,kg,search"``): the item's
   given context, a knowledge-base index (``kb=INDEX_DIR``), user files (``files=docs/``), a triples file
   (``kg=triples.tsv``), a web search API (``search=URL``, off unless given). A source that cannot be built
   (missing index, no usable file, bad triples line, search not configured) or fails while retrieving (search
   timeout or HTTP 500) is **counted** (``failures["source_<name>"]``) and **named with its reason** in the
   prediction's ``failed_sources``; detection goes on with the sources that worked. Files that were skipped
   inside a working ``files`` source are listed in ``source_notes``.
2. **Rerank** the pooled pieces by BM25 relevance to q + o (``rerank="bm25"``; ``"none"`` keeps source order;
   ``"lm"`` asks the LM to order the ``rerank_pool`` BM25-best pieces, :class:`LMRerank`) and keep the top ``top_l``.
3. **Fuse**: ``fuse="concat"`` numbers the pieces (``[1] (kb) ...``); ``fuse="summary"`` asks the LM for a
   query-focused summary (:class:`signatures.medico.Fuse`; a summary that fails falls back to concat).
4. **Detect** (:class:`signatures.medico.Detect`): verdict (True = hallucinated) and a rationale. ``score`` is
   the verdict's likelihood p(True) (see the last line), ``label`` is ``score > 0.5``, or ``score`` against the
   verdict threshold ReAnchor fitted (#34: label and score agree), ``rationale`` the rationale, ``evidence`` the pieces used, and ``spans`` the parts of the answer the rationale quotes in double quotes (mapped to offsets with
   :func:`halluscope.core.text.map_substrings`; quotes of the evidence simply do not map), each with the score.
5. **Ensemble** (when a combiner has been fitted, see :func:`fit_combiner`): one detection per source with that
   source's evidence alone plus the fused one give the features p_s(True); a logistic regression over them
   gives ``score``, and ``label = score > 0.5``. The per-source likelihoods are in ``source_p``.
6. **Correct** (when flagged and ``correct``): up to ``max_rounds`` rounds of chain-of-thought correction —
   :class:`~signatures.medico.IdentifySpans` names the hallucinated spans, :class:`~signatures.medico.Revise`
   rewrites them. A revision whose preservation Prev(o, o′) = max(1 − Lev(o, o′)/len(o), 0) (character
   Levenshtein against the original answer, rapidfuzz) is below ``delta`` is rejected (so is an empty or
   unchanged one); an accepted revision is re-detected, and the detector's "not hallucinated" approves it and
   ends the loop. Every round is recorded in ``rounds`` (``round``, ``spans``, ``revision``, ``preservation``,
   ``accepted``, ``approved``, ``reason``); ``correction`` is ``"approved"``, ``"max_rounds"``,
   ``"not_flagged"`` or ``"disabled"``; ``revision`` is the last accepted revision (``None`` when none).

Likelihood p(True) and the ensemble combiner: :mod:`halluscope.programs.medico.ensemble`.
"""

from __future__ import annotations

import copy
import logging
import re

import dspy
from dspy.utils.exceptions import AdapterParseError
from rapidfuzz.distance import Levenshtein

import halluscope.retrievers  # noqa: F401  (registers the kb/files/kg/search retrievers)
from halluscope.core.contract import Detection, Evidence, Span, to_prediction
from halluscope.core.decisions import calibrated_by, content_free_prior, decision_evidence, noul_probability
from halluscope.programs.medico.ensemble import (combine, fit_combiner, logprob_probability, medico_report,
                                                 verdict_probability)
from halluscope.programs.registry import ProgramSpec, number, register_program, text, whole
from halluscope.core.retrieval import Retriever, make_retriever, retriever_names
from halluscope.retrievers.bm25 import BM25Index, Passage
from halluscope.retrievers.files import FileRetriever
from halluscope.signatures.medico import Detect, Fuse, IdentifySpans, Rerank, Revise
from halluscope.core.text import map_substrings

__all__ = ["SOURCES", "Medico", "LMRerank", "apply_ranking", "preservation", "quoted",
           # re-exported from medico_ensemble
           "verdict_probability", "logprob_probability", "fit_combiner", "medico_report"]

log = logging.getLogger(__name__)

SOURCES = ("context", "kb", "files", "kg", "search")
# Per-stage output budgets (tokens): small models ramble until max_tokens.
MAX_TOKENS = {"rerank": 48, "summarize": 256, "detect": 160, "identify": 96, "revise": 192}
_QUOTES = re.compile(r'"([^"\n]+)"|“([^”\n]+)”|„([^“”\n]+)[“”]|«\s*([^»\n]+?)\s*»|「([^」\n]+)」')


def preservation(original: str, revision: str) -> float:
    """Prev(o, o′) = max(1 − Lev(o, o′)/len(o), 0), character Levenshtein; 1.0 for two empty texts."""
    if not original:
        return 1.0 if not revision else 0.0
    return max(1.0 - Levenshtein.distance(original, revision) / len(original), 0.0)


def quoted(text: str) -> list[str]:
    """The strings quoted in ``text`` ("...", “...”, „...“, «...», 「...」), in order."""
    return [next(g for g in m.groups() if g) for m in _QUOTES.finditer(text or "")]


def _as_bool(value) -> bool | None:
    if isinstance(value, bool):
        return value
    s = str(value or "").strip().lower()
    if s in ("true", "yes", "1", "hallucinated"):
        return True
    if s in ("false", "no", "0", "supported"):
        return False
    return None


def apply_ranking(n: int, ranking) -> list[int]:
    """0-based order of ``n`` pieces from an LM's 1-based ``ranking``: the valid numbers first, in the LM's order,
    repeats dropped; the pieces it left out follow in their previous order (``top_l`` cuts the tail)."""
    first: list[int] = []
    for r in ranking or []:
        try:
            i = int(r) - 1
        except (TypeError, ValueError):
            continue
        if 0 <= i < n and i not in first:
            first.append(i)
    return first + [i for i in range(n) if i not in first]


class LMRerank(dspy.Module):
    """The LM-scored rerank option (``rerank="lm"``): one listwise call (:class:`signatures.medico.Rerank`) shows
    the numbered pieces (each cut to ``passage_chars``) and reads back their numbers, most useful first;
    :func:`apply_ranking` turns that into an order. Returns ``Prediction(order, parsed)``; an output that does
    not parse leaves the order as it was (``parsed=False``)."""

    def __init__(self, passage_chars: int = 400):
        super().__init__()
        self.passage_chars = int(passage_chars)
        self.rank = dspy.Predict(Rerank)

    def forward(self, question: str, answer: str, pieces: list[Evidence]) -> dspy.Prediction:
        passages = "\n".join(f"[{i}] ({e.source}) {' '.join(e.text.split())[: self.passage_chars]}"
                              for i, e in enumerate(pieces, 1))
        try:
            ranking = self.rank(question=question, answer=answer, passages=passages,
                                config={"max_tokens": MAX_TOKENS["rerank"]}).ranking
        except AdapterParseError:
            return dspy.Prediction(order=list(range(len(pieces))), parsed=False)
        return dspy.Prediction(order=apply_ranking(len(pieces), ranking), parsed=True)


class Medico(dspy.Module):
    """MEDICO (see the module docstring).

    Args:
        sources: comma-separated evidence sources, any registered retriever (context, kb, files, kg, search or a
            plugin's: the retriever registry); none = no evidence.
        kb: knowledge-base index folder (halluscope index build SOURCE --out DIR) for the kb source.
        files: a folder or comma-separated files (TXT, Markdown, PDF, DOCX) for the files source.
        kg: a triples file (TSV or N-Triples) for the kg source.
        search: the search API URL for the search source (key from $HALLUSCOPE_SEARCH_KEY); empty = off.
        search_timeout: seconds to wait for the search server; a slower answer fails the source (counted).
        k: pieces retrieved per source.
        top_l: pieces kept after reranking the pool.
        rerank: bm25 (relevance to question + answer), lm (the LM orders the rerank_pool BM25-best pieces, one
            call per pool) or none (source order).
        rerank_pool: pieces shown to the LM reranker (rerank=lm).
        fuse: concat (numbered pieces) or summary (an LM query-focused summary).
        correct: run the span-then-revise correction loop on flagged answers.
        max_rounds: most correction rounds.
        delta: lowest preservation Prev(o, o') a revision may have; lower ones are rejected.
        tau: temperature of the likelihood p(True): sigmoid((log p_T - log p_F)/tau) from token log-probabilities,
            else the verdict fallback sigmoid(+-1/tau).
        ensemble: use the fitted logistic-regression combiner when there is one.
        files_max_mb: size limit per user file in MB.
        max_evidence_chars: most characters of fused evidence shown to the LM.
        retry_temperature: temperature of a revision retried after a rejected round (a fresh sample).
        calibrate: ``"content_free"``: contextual calibration of the Detect verdict (Zhao et al. 2021), as
            ``direct`` has it: each judgement is also asked with the answer emptied (the same question and
            evidence), P(True) is divided by that request's and renormalised, and the verdict is P(True) >= 0.5
            (a cut point ReAnchor may refit). One more request per judgement; one that fails leaves that
            judgement uncalibrated (``failures["content_free"]``).
    """

    def __init__(self, sources: str = "context", kb: str = "", files: str = "", kg: str = "", search: str = "",
                 search_timeout: float = 10.0,
                 k: int = 5, top_l: int = 5, rerank: str = "bm25", rerank_pool: int = 10, fuse: str = "concat", correct: bool = True,
                 max_rounds: int = 5, delta: float = 0.5, tau: float = 1.0, ensemble: bool = True,
                 files_max_mb: float = 20.0, max_evidence_chars: int = 6000, retry_temperature: float = 0.7,
                 calibrate: str | None = None):
        super().__init__()
        if calibrate not in (None, "content_free"):
            raise ValueError(f"medico: calibrate must be content_free or null, not {calibrate!r}")
        self.calibrate = calibrate
        names = [s.strip() for s in (sources.split(",") if isinstance(sources, str) else sources) if s.strip()]
        known = retriever_names()  # the retriever registry: the built-in SOURCES and any plugin's retrievers
        unknown = [s for s in names if s not in known and s != "none"]
        if unknown or not names:
            raise ValueError(f"medico: unknown evidence source(s) {unknown or '(none given)'}; "
                             f"choose from {', '.join(known)}")
        if fuse not in ("concat", "summary"):
            raise ValueError(f"medico: fuse must be 'concat' or 'summary', not {fuse!r}")
        if rerank not in ("bm25", "lm", "none"):
            raise ValueError(f"medico: rerank must be 'bm25', 'lm' or 'none', not {rerank!r}")
        self.sources = [s for s in dict.fromkeys(names) if s != "none"]  # "none": zero evidence
        self.k, self.top_l, self.rerank, self.fuse = int(k), int(top_l), rerank, fuse
        self.rerank_pool = int(rerank_pool)
        self.correct, self.max_rounds, self.delta = bool(correct), int(max_rounds), float(delta)
        self.tau, self.ensemble = float(tau), bool(ensemble)
        self.max_evidence_chars, self.retry_temperature = int(max_evidence_chars), float(retry_temperature)
        self.retrievers: dict[str, Retriever] = {}
        self.source_errors: dict[str, str] = {}
        self.source_notes: dict[str, str] = {}
        settings = {"kb": kb, "files": files, "kg": kg, "search": search, "search_timeout": float(search_timeout)}
        for name in self.sources:
            try:
                self.retrievers[name] = self._make_retriever(name, settings, files_max_mb)
            except (OSError, ValueError, RuntimeError) as e:
                self.source_errors[name] = f"{type(e).__name__}: {e}"
                log.warning("medico: evidence source %r is off (%s); detection goes on without it",
                            name, self.source_errors[name])
        files_r = self.retrievers.get("files")
        if isinstance(files_r, FileRetriever) and files_r.skipped:
            self.source_notes["files"] = files_r.report()
            log.warning("medico: %s", self.source_notes["files"])
        self._warned: set[str] = set()  # sources whose retrieval failure was logged (once each)
        if rerank == "lm":  # only then: the predictors (and so the saved state) of other settings stay as they were
            self.reranker = LMRerank()
        self.summarize = dspy.Predict(Fuse)
        self.detect = dspy.Predict(Detect)
        if calibrate:  # the calibrated P(True) decides from the start (ReAnchor may refit the cut point)
            self.detect.fields = {"verdict": {"threshold": 0.5}}
        self.identify = dspy.Predict(IdentifySpans)
        self.revise = dspy.Predict(Revise)
        self.combiner: dict = {"fitted": False}

    @staticmethod
    def _make_retriever(name: str, settings: dict, files_max_mb: float) -> Retriever:
        """The source ``name`` from the retriever registry (:func:`halluscope.core.retrieval.make_retriever`), its
        argument from MEDICO's own option of that name (``kb``, ``files``, ``kg``, ``search``)."""
        if name == "files" and not str(settings["files"]).strip():
            raise ValueError("files: no file or folder given (e.g. -O files=docs/)")
        options = {"files": {"max_mb": files_max_mb}, "search": {"timeout": settings["search_timeout"]}}
        arg = str(settings.get(name) or "") if name in ("kb", "files", "kg", "search") else ""
        return make_retriever(f"{name}:{arg}" if arg else name, **options.get(name, {}))

    # -- state: predictors + the fitted combiner (JSON) ------------------------------------------------------
    def dump_state(self, json_mode=True):
        state = super().dump_state(json_mode=json_mode)
        state["combiner"] = copy.deepcopy(self.combiner)
        return state

    def load_state(self, state, **kwargs):
        state = dict(state)
        combiner = state.pop("combiner", None)
        super().load_state(state, **kwargs)
        if combiner is not None:
            self.combiner = dict(combiner)
        return self

    # -- retrieval, rerank, fusion -------------------------------------------------------------------------
    def gather(self, question: str, answer: str, context: str) -> tuple[dict[str, list[Evidence]], dict[str, str]]:
        """Evidence per working source and ``{source: reason}`` for the sources that failed."""
        failed = dict(self.source_errors)
        found: dict[str, list[Evidence]] = {}
        query = question.strip() or answer
        for name, retriever in self.retrievers.items():
            try:
                found[name] = list(retriever.retrieve(query, k=self.k, context=context))
            except Exception as e:  # noqa: BLE001 - any source may fail; the others still count
                failed[name] = f"{type(e).__name__}: {str(e)[:300]}"
                if name not in self._warned:  # once per source, not once per item
                    self._warned.add(name)
                    log.warning("medico: evidence source %r failed (%s); counted as failures['source_%s'] "
                                "of each item it fails on", name, failed[name], name)
        return found, failed

    def select(self, pieces: list[Evidence], question: str, answer: str,
               failures: dict | None = None) -> list[Evidence]:
        """The pool deduplicated and reranked (BM25 against question + answer; with ``rerank="lm"`` the LM then
        orders the ``rerank_pool`` best, a ranking that does not parse counts ``failures["rerank"]`` and keeps
        the BM25 order), top ``top_l``."""
        seen, pool = set(), []
        for e in pieces:
            key = " ".join(e.text.split())
            if key and key not in seen:
                seen.add(key)
                pool.append(e)
        if self.rerank in ("bm25", "lm") and len(pool) > 1:
            index = BM25Index([Passage(str(i), e.source, e.text) for i, e in enumerate(pool)])
            scores = index.scores(f"{question} {answer}")
            order = sorted(range(len(pool)), key=lambda i: (-scores[i], i))
            pool = [pool[i] for i in order]
        head, tail = pool[: max(self.rerank_pool, 1)], pool[max(self.rerank_pool, 1):]
        if self.rerank == "lm" and len(head) > 1:
            ranked = self.reranker(question=question, answer=answer, pieces=head)
            if not ranked.parsed and failures is not None:
                failures["rerank"] = failures.get("rerank", 0) + 1
            pool = [head[i] for i in ranked.order] + tail
        return pool[: max(self.top_l, 0)]

    def render(self, pieces: list[Evidence]) -> str:
        text = "\n".join(f"[{i}] ({e.source}) {' '.join(e.text.split())}" for i, e in enumerate(pieces, 1))
        return text[: self.max_evidence_chars]

    def fuse_evidence(self, question: str, answer: str, pieces: list[Evidence], failures: dict) -> str:
        text = self.render(pieces)
        if self.fuse == "summary" and text:
            try:
                summary = (self.summarize(question=question, answer=answer, evidence=text,
                                          config={"max_tokens": MAX_TOKENS["summarize"]}).summary or "").strip()
            except AdapterParseError:
                summary = ""
            if summary:
                return summary
            failures["fuse"] = failures.get("fuse", 0) + 1
        return text

    # -- detection ----------------------------------------------------------------------------------------
    def judge(self, question: str, answer: str, evidence: str, failures: dict) -> tuple[bool | None, str]:
        """(verdict, rationale); an output that does not parse is ``(None, "")`` and ``failures["parse"]``."""
        return self.judge_p(question, answer, evidence, failures)[:2]

    def judge_p(self, question: str, answer: str, evidence: str,
                failures: dict) -> tuple[bool | None, str, float, str]:
        """(verdict, rationale, p(True), how p was obtained: "decision" (the calibrated verdict's P(True), read by
        :mod:`halluscope.core.decisions`), "logprobs" or "verdict")."""
        config = {"max_tokens": MAX_TOKENS["detect"], "logprobs": True, "top_logprobs": 5}
        priors = {}
        if self.calibrate:
            prior = content_free_prior(self.detect, "verdict", question=question, answer="", evidence=evidence,
                                       config=config)
            if isinstance(prior, float):
                priors = {"verdict": prior}
            else:
                failures["content_free"] = failures.get("content_free", 0) + 1
        try:
            # a verdict calibrated by ReAnchor (or by ``calibrate``): P(True) it was decoded from
            with decision_evidence() as decided, calibrated_by(priors):
                out = self.detect(question=question, answer=answer, evidence=evidence, config=config)
        except AdapterParseError:
            failures["parse"] = failures.get("parse", 0) + 1
            return None, "", 0.5, "verdict"
        verdict = _as_bool(out.verdict)
        p_decision = noul_probability(decided, self.detect, "verdict")
        if verdict is not None and p_decision is not None:
            return verdict, str(out.rationale or ""), p_decision, "decision"
        p = logprob_probability(out.get("logprobs"), self.tau) if verdict is not None else None
        if p is None:
            return verdict, str(out.rationale or ""), verdict_probability(verdict, self.tau), "verdict"
        return verdict, str(out.rationale or ""), p, "logprobs"

    def source_features(self, question: str, answer: str, context: str) -> dict[str, float]:
        """p(True) per configured source (its own evidence only; a failed or empty source: 0.5) and fused."""
        found, _ = self.gather(question, answer, context)
        failures: dict = {}
        feats = {}
        for name in self.sources:
            pieces = self.select(found.get(name, []), question, answer, failures)
            feats[name] = self.judge_p(question, answer, self.render(pieces), failures)[2] if pieces else 0.5
        pieces = self.select([e for n in self.sources for e in found.get(n, [])], question, answer, failures)
        evidence = self.fuse_evidence(question, answer, pieces, failures)
        feats["fused"] = self.judge_p(question, answer, evidence, failures)[2]
        return feats

    def combine(self, feats: dict[str, float]) -> float:
        return combine(self.combiner, feats)

    # -- correction ---------------------------------------------------------------------------------------
    def correct_answer(self, question: str, answer: str, evidence: str, rationale: str,
                       failures: dict) -> tuple[str | None, list[dict], str]:
        rounds: list[dict] = []
        current, why = answer, rationale
        status = "max_rounds"
        for r in range(1, self.max_rounds + 1):
            retry = bool(rounds) and not rounds[-1]["accepted"]
            sample = {"rollout_id": r, "temperature": self.retry_temperature} if retry else {}
            rec: dict = {"round": r, "spans": [], "revision": "", "preservation": 0.0, "accepted": False,
                         "approved": False, "reason": ""}
            try:
                spans = [str(s) for s in (self.identify(question=question, answer=current, evidence=evidence,
                                                        rationale=why, config={**sample, "max_tokens": MAX_TOKENS["identify"]}
                                                        ).spans or []) if str(s).strip()]
                rec["spans"] = spans
                revision = (self.revise(question=question, answer=current, evidence=evidence, spans=spans,
                                        config={**sample, "max_tokens": MAX_TOKENS["revise"]}).revision or "").strip()
            except AdapterParseError:
                failures["revise_parse"] = failures.get("revise_parse", 0) + 1
                rec["reason"] = "output did not parse"
                rounds.append(rec)
                continue
            rec["revision"] = revision
            rec["preservation"] = round(preservation(answer, revision), 6)
            if not revision:
                rec["reason"] = "empty revision"
            elif " ".join(revision.split()) == " ".join(current.split()):
                rec["reason"] = "unchanged"
            elif rec["preservation"] < self.delta:
                rec["reason"] = f"preservation {rec['preservation']:.3f} below delta {self.delta:g}"
            else:
                rec["accepted"] = True
                verdict, new_why = self.judge(question, revision, evidence, failures)
                rec["approved"] = verdict is False
                rec["reason"] = "approved" if rec["approved"] else "still flagged"
                current, why = revision, new_why or why
            rounds.append(rec)
            if rec["approved"]:
                status = "approved"
                break
        return (current if current != answer else None), rounds, status

    # -- the program --------------------------------------------------------------------------------------
    def forward(self, question: str = "", answer: str = "", lang: str = "en", context: str = "", task: str = "", **_):
        question, answer, context = question or "", answer or "", context or ""
        if not answer.strip():
            return to_prediction(Detection(answer=answer, rationale="empty answer: nothing to check"),
                                 rounds=[], correction="not_flagged", failed_sources={}, source_p={})
        found, failed = self.gather(question, answer, context)
        failures: dict[str, int] = {f"source_{name}": 1 for name in failed}
        pieces = self.select([e for n in self.sources for e in found.get(n, [])], question, answer, failures)
        evidence = self.fuse_evidence(question, answer, pieces, failures)
        verdict, rationale, score, likelihood = self.judge_p(question, answer, evidence, failures)
        source_p: dict[str, float] = {"fused": round(score, 6)}
        if self.ensemble and self.combiner.get("fitted"):
            for name in self.sources:
                own = self.select(found.get(name, []), question, answer, failures)
                source_p[name] = round(self.judge_p(question, answer, self.render(own), failures)[2] if own else 0.5, 6)
            score = self.combine(source_p)
            label = score > 0.5
        else:
            # one verdict per output (#34): the label is the score against its threshold, never the bare verdict
            # beside a score that says otherwise (a "True" read with p(True) = 0.36 is not labelled hallucinated);
            # a decision read against a fitted verdict threshold (ReAnchor) is that comparison already
            label = bool(verdict) if likelihood == "decision" else score > 0.5
        quotes = quoted(rationale) if label else []
        mapped, stats = map_substrings(answer, [(q, score) for q in quotes])
        revision, rounds, status = None, [], "disabled" if not self.correct else "not_flagged"
        if label and self.correct:
            revision, rounds, status = self.correct_answer(question, answer, evidence, rationale, failures)
        det = Detection(answer=answer, spans=[Span(s.start, s.end, s.prob) for s in mapped], label=label,
                        score=score, rationale=rationale, revision=revision, failures=failures, evidence=pieces)
        return to_prediction(det, verdict=verdict, likelihood=likelihood, source_p=source_p, rounds=rounds, correction=status,
                             failed_sources=failed, source_notes=dict(self.source_notes),
                             unmatched_quotes=stats.unmatched)


register_program(ProgramSpec(
    name="medico",
    build=Medico,
    description="MEDICO: multi-source evidence (context, kb, files, kg, search), rerank, fuse, detect with a "
                "rationale, logistic-regression ensemble, preservation-bounded span-then-revise correction",
    level="response",
    default_metric="f1",
    report=medico_report,
    fit=fit_combiner,
    endpoint_options=("search",),
    option_types={"search_timeout": number(0, lo_open=True), "k": whole(1), "top_l": whole(1),
                  "rerank": text("bm25", "lm", "none"), "rerank_pool": whole(1), "fuse": text("concat", "summary"),
                  "max_rounds": whole(1), "delta": number(0, 1), "tau": number(0, lo_open=True),
                  "files_max_mb": number(0, lo_open=True), "max_evidence_chars": whole(1),
                  "retry_temperature": number(0, 2),
                  "calibrate": text("content_free", nullable=True, what="a calibration of the verdict's P(True)")},
    # where evidence comes from and how much of it; `search` (an endpoint) and the reranker/fusion/correction
    # choices stay as compiled
    load_options=("sources", "kb", "files", "kg", "k", "top_l", "rerank_pool", "files_max_mb",
                  "max_evidence_chars", "search_timeout"),
))
