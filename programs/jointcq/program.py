"""JointCQ: joint claim + query generation, search, claim verification, claim-to-answer alignment.

Pipeline for a question q and an answer a (one :class:`JointCQ` call):

1. **Generate** (:class:`~halluscope.signatures.jointcq.ClaimsAndQueries`, ONE inference): decontextualised
   factual claims of the answer, each with its search query. An empty list is a valid "nothing to check"
   result (label False), not an error.
2. **Search** through a :class:`~halluscope.core.retrieval.Retriever` built from the ``retriever`` spec
   (``"context"``: the item's own context; ``"kb:INDEX_DIR"``: a BM25 knowledge base; any spec
   :func:`~halluscope.core.retrieval.make_retriever` knows): **one search call per claim**, ``top_k`` snippets.
   ``use_queries=False`` is the paper's "w/o queries" ablation (the claim itself is the query). A search that
   raises makes that claim unverifiable (``failures["search"]``, claim status ``search_failed``); no snippet
   at all makes it unverifiable without an LM call (status ``no_evidence``).
3. **Verify** (:class:`~halluscope.signatures.jointcq.VerifyClaim`, one inference per claim with evidence, or
   one batched :class:`~halluscope.signatures.jointcq.VerifyClaims` call with ``batch_verify``). Labels are
   parsed leniently (:func:`~halluscope.programs.jointcq.align.parse_label`); an output outside the three
   labels is unverifiable and counted (``failures["label"]``, status ``label_unparsed``); output that does not
   parse at all likewise (``failures["verify_parse"]``, status ``verify_failed``).
4. **Align** every claim to the answer sentence (:func:`halluscope.core.text.segment`) it is most similar to,
   kept when the similarity reaches ``align_threshold``, and within that sentence to the words the claim
   asserts (:mod:`~halluscope.programs.jointcq.align`). A claim that aligns to no sentence is counted
   (``counts["unaligned"]``) and kept as response-level evidence.
5. **Aggregate**: a sentence is hallucinated if any aligned claim is; the response if any
   sentence is (or, with ``unaligned_counts``, any unaligned claim); unverifiable and failed claims count as
   not hallucinated.

Alignment similarity: content-word containment — the share of the claim's content words (function words and
the question's words dropped) that the sentence contains, exactly or, for words of 4+ letters without digits,
with rapidfuzz ``ratio`` >= 85 — threshold ``align_threshold`` (0.5, the paper's); why that one (and not
rapidfuzz ``token_set_ratio``) is in :mod:`halluscope.programs.jointcq.align`, with the other deterministic parts.

Contract mapping
----------------
Units: the answer's sentences (kind ``"sentence"``, label hallucinated/correct/unverifiable/unchecked, score =
the largest aligned claim score) and the claims (kind ``"claim"``, offsets = the aligned sentence, ``0, 0``
when unaligned; label of the three; rationale = the verifier's). Claim scores:
hallucinated 1.0, correct 0.0, unverifiable/failed ``unverifiable_score`` (below 0.5: not hallucinated).
Spans: for each aligned claim, the words it asserts at the claim score and the rest of its sentence at half of
it (``narrow_spans``; otherwise the whole sentence at the claim score), overlaps combined by maximum.
``label``/``score``: the response. ``evidence``: every snippet the verifier saw.

Counting
--------
Each prediction carries ``calls`` (predictor invocations per stage: ``generate``, ``verify``; their sum is the
paper's "model inferences per sample"), ``lm_requests`` (LM requests actually issued, adapter retries and
cache hits included), ``search_calls`` (retriever calls made) and ``judgements`` (claims labelled, the failed
ones included), and ``counts`` (claims per ``label_*`` and ``status_*``, ``unaligned``, ``query_fallback``,
``repeated_claims_dropped``: a claim the generator repeated is checked once).
:func:`jointcq_report` aggregates them for ``halluscope evaluate`` (paper: 4.93 inferences per sample, 1 search
call per judgement).

Criteria-guided filtering
-------------------------
:mod:`halluscope.programs.jointcq.demo_filter`: the claim and query criteria as LM-judged signatures combined into a
DSPy metric; the registered ``fit`` hook compiles the claim-query stage with it (BootstrapFewShot keeps a
demonstration only when it passes), so ``optimize.py --program jointcq`` trains on filtered data the DSPy way;
:func:`~halluscope.programs.jointcq.demo_filter.export_filtered_pairs` writes the passing pairs as fine-tuning JSONL.
"""

from __future__ import annotations

import threading
from collections import Counter
from dataclasses import asdict, dataclass, field
from functools import lru_cache
from typing import Any

import dspy
from dspy.utils.callback import BaseCallback
from dspy.utils.exceptions import AdapterParseError

import halluscope.retrievers  # noqa: F401  (registers the kb/files/kg/search retriever specs)
from halluscope.core.contract import Detection, Evidence, Span, Unit, to_prediction
from halluscope.core.decisions import calibrated_by, choice_probabilities, content_free_prior, decision_evidence
from halluscope.core.parallel import try_map
from halluscope.core.redact import error_text
from halluscope.programs.jointcq.align import (HALLUCINATED, LABELS, MAX_TOKENS, UNVERIFIABLE, Alignment, aggregate,
                                               align_claim, claim_score, claim_spans, pair_fields, parse_label,
                                               render_snippets)
from halluscope.programs.jointcq.demo_filter import fit_claim_queries
from halluscope.programs.registry import ProgramSpec, number, register_program, text, whole
from halluscope.core.retrieval import Retriever, make_retriever
from halluscope.signatures.jointcq import ClaimsAndQueries, VerifyClaim, VerifyClaimDecision, VerifyClaims
from halluscope.core.text import segment

__all__ = ["ClaimRecord", "JointCQ", "jointcq_report", "CALIBRATIONS"]

# The ``calibrate`` option's values (None: off), i.e. which input of the verifier the content-free request of
# contextual calibration (Zhao et al. 2021) empties: "content_free" the claim (the prior of these snippets),
# "no_evidence" the snippets (the prior of this claim, so that what is left is what the evidence adds).
CALIBRATIONS = ("content_free", "no_evidence")


class _LMRequests(BaseCallback):
    """Counts LM requests (``on_lm_start``) made while it is installed (thread-safe)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self.n = 0

    def on_lm_start(self, call_id, instance, inputs):
        with self._lock:
            self.n += 1


@lru_cache(maxsize=16)
def _retriever(spec: str) -> Retriever:
    return make_retriever(spec)


@dataclass
class ClaimRecord:
    """Everything about one claim: its query, search and verification outcome and its alignment."""

    claim: str
    query: str
    searched_with: str = ""
    label: str = UNVERIFIABLE
    recognised: bool = True
    score: float = 0.0
    rationale: str = ""
    status: str = "ok"  # ok | search_failed | no_evidence | verify_failed | label_unparsed
    probabilities: dict[str, float] | None = None  # the verifier's label probabilities (decisions), calibrated
    uncalibrated: bool = False  # with ``calibrate``: its content-free request failed (counted as a failure)
    evidence: list[Evidence] = field(default_factory=list)
    sentence: int | None = None
    similarity: float = 0.0
    spans: list[tuple[int, int]] = field(default_factory=list)

    def to_dict(self) -> dict:
        d = asdict(self)
        d["evidence"] = [e.id or e.text[:80] for e in self.evidence]
        d["spans"] = [list(s) for s in self.spans]
        return d


class JointCQ(dspy.Module):
    """JointCQ (see the module docstring).

    Args:
        retriever: evidence spec for make_retriever: "context" (the item's own context), "kb:INDEX_DIR", ...;
            an artifact may not set "search:URL" (refused on load without --trust-artifact-endpoints).
        top_k: snippets fetched per claim (one search call per claim).
        use_queries: search with the generated queries; false = the "w/o queries" ablation (claims as queries).
        batch_verify: verify all claims in one call (VerifyClaims) instead of one call per claim.
        align_threshold: lowest claim-sentence similarity (share of the claim's content words in it, 0-1) to align.
        narrow_spans: mark the words a claim asserts (the rest of its sentence at half the score); false = the
            whole sentence.
        unaligned_counts: a hallucinated claim that aligns to no sentence still makes the response hallucinated.
        unverifiable_score: hallucination probability of an unverifiable or failed claim (below 0.5).
        max_evidence_chars: most characters of snippets shown to the verifier per claim.
        num_threads: claims searched and verified in parallel.
        filter_demos: optimize (the fit hook): most criteria-filtered demonstrations kept for the claim-query stage.
        filter_coverage: optimize: lowest share of answer sentences the claims must cover for a demonstration.
        decisions: the verifier's label is a Choice (``VerifyClaimDecision``) that ``dspy.ReAnchor`` calibrates
            (``--optimizer reanchor``: per-label weights on the label probabilities read from the backend's token
            log-probabilities); needs the per-claim verifier (``batch_verify`` false).
        calibrate: contextual calibration of the verifier's label probabilities (implies ``decisions``): each
            verification is also asked once with its claim emptied (``"content_free"``) or its snippets emptied
            (``"no_evidence"``), and each label's probability is divided by that request's and renormalised
            before the label is chosen (the most probable, unless ReAnchor fitted weights). One more request per
            verified claim; a content-free request that fails leaves that claim uncalibrated
            (``failures["content_free"]``).
    """

    def __init__(self, retriever: str = "context", top_k: int = 10, use_queries: bool = True,
                 batch_verify: bool = False, align_threshold: float = 0.5, narrow_spans: bool = True,
                 unaligned_counts: bool = True, unverifiable_score: float = 0.3, max_evidence_chars: int = 3000,
                 num_threads: int = 4, filter_demos: int = 2, filter_coverage: float = 1.0,
                 decisions: bool = False, calibrate: str | None = None):
        super().__init__()
        if calibrate not in (None, *CALIBRATIONS):
            raise ValueError(f"jointcq: calibrate must be one of {', '.join(CALIBRATIONS)} or null, not {calibrate!r}")
        decisions = bool(decisions or calibrate)
        if decisions and batch_verify:
            raise ValueError("jointcq: decisions needs batch_verify=false (ReAnchor fits the per-claim verifier's label; "
                             "the batched verifier's labels sit inside a list)")
        if not isinstance(retriever, str):
            raise ValueError(f"jointcq: retriever is a spec string such as 'context' or 'kb:DIR', not {retriever!r}")
        if int(top_k) < 1:
            raise ValueError(f"jointcq: top_k must be at least 1, not {top_k}")
        if not 0.0 <= float(align_threshold) <= 1.0:
            raise ValueError(f"jointcq: align_threshold must be in [0, 1], not {align_threshold}")
        if not 0.0 <= float(unverifiable_score) <= 0.5:
            raise ValueError(f"jointcq: unverifiable_score must be in [0, 0.5] (not hallucinated), "
                             f"not {unverifiable_score}")
        _retriever(retriever)  # a bad spec or a missing index is an error now, not a failure per claim
        self.retriever_spec = retriever
        self.top_k, self.use_queries, self.batch_verify = int(top_k), bool(use_queries), bool(batch_verify)
        self.align_threshold, self.narrow_spans = float(align_threshold), bool(narrow_spans)
        self.unaligned_counts, self.unverifiable_score = bool(unaligned_counts), float(unverifiable_score)
        self.max_evidence_chars, self.num_threads = int(max_evidence_chars), max(1, int(num_threads))
        if int(filter_demos) < 0 or not 0.0 <= float(filter_coverage) <= 1.0:
            raise ValueError(f"jointcq: filter_demos must be >= 0 and filter_coverage in [0, 1], not "
                             f"{filter_demos}, {filter_coverage}")
        self.filter_demos, self.filter_coverage = int(filter_demos), float(filter_coverage)
        self.generate = dspy.Predict(ClaimsAndQueries)
        self.calibrate = calibrate
        self.verify = dspy.Predict(VerifyClaimDecision if decisions else VerifyClaim)
        if calibrate:  # the calibrated probabilities decide from the start (ReAnchor may refit the weights)
            self.verify.fields = {"label": {"weights": dict.fromkeys(LABELS, 1.0)}}
        self.verify_batch = dspy.Predict(VerifyClaims)

    @property
    def retriever(self) -> Retriever:
        return _retriever(self.retriever_spec)

    # -- stages ---------------------------------------------------------------------------------------------
    def claims_and_queries(self, question: str, answer: str, failures: Counter) -> tuple[list[tuple[str, str]], int]:
        """(claim, query) pairs of ONE generate call, and how many repeated claims were dropped (small models
        repeat a claim; each copy would cost a search and a verification). Unparseable output is counted and
        yields none."""
        try:
            pairs = self.generate(question=question, answer=answer,
                                  config={"max_tokens": MAX_TOKENS["generate"]}).pairs or []
        except AdapterParseError:
            failures["generate_parse"] += 1
            return [], 0
        out, seen, repeated = [], set(), 0
        for item in pairs if isinstance(pairs, list) else []:
            claim, query = pair_fields(item)
            key = " ".join(claim.casefold().split())
            if not claim:
                failures["empty_claim"] += 1
            elif key in seen:
                repeated += 1
            else:
                seen.add(key)
                out.append((claim, query))
        return out, repeated

    def search(self, rec: ClaimRecord, context: str) -> None:
        """One search call for one claim (its query, or the claim itself without queries). A search that
        raises sets ``status="search_failed"``; no snippet ``status="no_evidence"`` (both: unverifiable)."""
        rec.searched_with = rec.query if self.use_queries and rec.query else rec.claim
        try:
            found = self.retriever.retrieve(rec.searched_with, k=self.top_k, context=context)
            rec.evidence = list(found)[: self.top_k]
        except Exception as e:  # noqa: BLE001 - a failed search makes this claim unverifiable, nothing more
            rec.status, rec.rationale = "search_failed", f"search failed: {error_text(e)}"
            return
        if not rec.evidence:
            rec.status, rec.rationale = "no_evidence", "no evidence found"

    @staticmethod
    def _set_label(rec: ClaimRecord, raw: Any, rationale: Any) -> None:
        rec.label, rec.recognised = parse_label(raw)
        rec.rationale = str(rationale or "").strip()
        if not rec.recognised:
            rec.status = "label_unparsed"
            rec.rationale = rec.rationale or f"verifier output {str(raw)[:80]!r} is none of {', '.join(LABELS)}"

    def verify_one(self, rec: ClaimRecord) -> None:
        """One VerifyClaim call (with ``calibrate``, after its content-free request); output that does not parse
        sets ``status="verify_failed"`` (unverifiable). The label probabilities read, if any, are kept."""
        snippets = render_snippets(rec.evidence, self.max_evidence_chars)
        config = {"max_tokens": MAX_TOKENS["verify"]}
        priors = {}
        if self.calibrate:
            empty = {"claim": ""} if self.calibrate == "content_free" else {"snippets": ""}
            prior = content_free_prior(self.verify, "label", **{"claim": rec.claim, "snippets": snippets, **empty},
                                       config=config)
            rec.uncalibrated = not isinstance(prior, dict)
            priors = {} if rec.uncalibrated else {"label": prior}
        with decision_evidence() as log, calibrated_by(priors):
            try:
                out = self.verify(claim=rec.claim, snippets=snippets, config=config)
            except AdapterParseError as e:
                rec.status, rec.rationale = "verify_failed", f"verifier output did not parse: {str(e)[:200]}"
                return
        rec.probabilities = choice_probabilities(log, self.verify, "label")
        self._set_label(rec, out.label, out.rationale)

    def verify_all(self, recs: list[ClaimRecord]) -> None:
        """One VerifyClaims call for every claim with evidence; a claim the output skips is unverifiable
        (``status="label_unparsed"``), an output that does not parse fails them all (``verify_failed``)."""
        per = max(200, self.max_evidence_chars // max(1, len(recs)))
        text = "\n\n".join(f"Claim {i}: {r.claim}\nSnippets:\n{render_snippets(r.evidence, per)}"
                           for i, r in enumerate(recs, 1))
        try:
            out = self.verify_batch(claims=text, config={"max_tokens": MAX_TOKENS["verify_batch"]})
            verdicts = out.verdicts or []
        except AdapterParseError as e:
            for r in recs:
                r.status, r.rationale = "verify_failed", f"verifier output did not parse: {str(e)[:200]}"
            return
        by_index: dict[int, Any] = {}
        for v in verdicts if isinstance(verdicts, list) else []:
            idx = v.get("index") if isinstance(v, dict) else getattr(v, "index", None)
            try:
                by_index.setdefault(int(idx), v)
            except (TypeError, ValueError):
                continue
        for i, r in enumerate(recs, 1):
            v = by_index.get(i)
            if v is None:
                r.status, r.recognised, r.rationale = "label_unparsed", False, "the batched verifier gave no verdict"
                continue
            get = v.get if isinstance(v, dict) else (lambda k, _v=v: getattr(_v, k, None))
            self._set_label(r, get("label"), get("rationale"))

    def check_claims(self, recs: list[ClaimRecord], context: str, calls: Counter) -> None:
        """Search (one call per claim) and verify (per claim, or one batched call) on ``num_threads`` threads.
        Errors other than unparseable output (the LM unreachable) propagate: the item fails, the run goes on."""
        try_map(lambda r: self.search(r, context), recs, threads=self.num_threads)
        ready = [r for r in recs if r.status == "ok"]
        if not ready:
            return
        if self.batch_verify:
            calls["verify"] += 1
            self.verify_all(ready)
            return
        calls["verify"] += len(ready)
        if self.calibrate:
            calls["content_free"] += len(ready)
        for ok, err in try_map(self.verify_one, ready, threads=self.num_threads):
            if not ok:
                raise err

    def align(self, recs: list[ClaimRecord], sentences: list, question: str) -> None:
        for r in recs:
            r.score = claim_score(r.label, self.unverifiable_score)
            al = align_claim(r.claim, sentences, question, self.align_threshold)
            r.sentence, r.similarity, r.spans = al.sentence, round(al.similarity, 6), list(al.spans)

    # -- forward -------------------------------------------------------------------------------------------
    def forward(self, question: str = "", answer: str = "", lang: str = "en", context: str = "", task: str = "", **_):
        question, answer, context = question or "", answer or "", context or ""
        sentences = segment(answer, lang or "en")
        if not sentences:
            return to_prediction(Detection(answer=answer, rationale="empty answer: nothing to check"),
                                 claims=[], pairs=[], calls={}, lm_requests=0, search_calls=0, judgements=0,
                                 counts={})
        failures, calls = Counter(), Counter()
        meter = _LMRequests()
        with dspy.context(callbacks=[*(dspy.settings.get("callbacks") or []), meter]):
            calls["generate"] += 1
            pairs, repeated = self.claims_and_queries(question, answer, failures)
            recs = [ClaimRecord(claim=c, query=q) for c, q in pairs]
            self.check_claims(recs, context, calls)
        self.align(recs, sentences, question)
        counts = _counts(recs, self.use_queries)
        if repeated:
            counts["repeated_claims_dropped"] = repeated
        if uncalibrated := sum(r.uncalibrated for r in recs):
            failures["content_free"] += uncalibrated
        for status, name in (("search_failed", "search"), ("verify_failed", "verify_parse"),
                             ("label_unparsed", "label")):
            if counts.get(f"status_{status}"):
                failures[name] += counts[f"status_{status}"]
        return to_prediction(
            self.detection(answer, question, sentences, recs, failures),
            claims=[r.to_dict() for r in recs],
            pairs=[{"claim": c, "query": q} for c, q in pairs],
            calls=dict(calls),
            lm_requests=meter.n,
            search_calls=sum(1 for r in recs if r.searched_with),  # retrieve() calls made, failed ones included
            judgements=len(recs),
            counts=counts,
        )

    def detection(self, answer: str, question: str, sentences: list, recs: list[ClaimRecord],
                  failures: Counter) -> Detection:
        """The common contract: sentence and claim units, spans, response label and score, evidence."""
        labels, scores, response, score = aggregate(
            len(sentences), [(r.sentence, r.label, r.score) for r in recs], self.unaligned_counts)
        spans: set[Span] = set()
        for r in recs:
            spans |= set(claim_spans(sentences, Alignment(r.sentence, r.similarity, tuple(r.spans)), r.score,
                                     self.narrow_spans))
        units = [Unit("sentence", s.start, s.end, s.text, labels[i], scores[i]) for i, s in enumerate(sentences)]
        for r in recs:
            start, end = (sentences[r.sentence].start, sentences[r.sentence].end) if r.sentence is not None else (0, 0)
            units.append(Unit("claim", start, end, r.claim, r.label, r.score, r.rationale))
        evidence = list({(e.source, e.id, e.text): e for r in recs for e in r.evidence}.values())
        if not recs:
            rationale = "no factual claim: nothing to check"
        else:
            flagged = [r for r in recs if r.label == HALLUCINATED]
            rationale = "\n".join(f"{r.claim} -> {r.label}" + (f": {r.rationale}" if r.rationale else "")
                                  for r in (flagged or recs))
        return Detection(answer=answer, spans=list(spans), label=response, score=score, units=units,
                         rationale=rationale, failures=dict(failures), evidence=evidence)


def _counts(recs: list[ClaimRecord], use_queries: bool) -> dict[str, int]:
    """Per-prediction counts: claims per label and per status, unaligned claims, claims searched with the claim
    itself because the generator wrote no query (``query_fallback``)."""
    c: Counter = Counter()
    for r in recs:
        c[f"label_{r.label}"] += 1
        c[f"status_{r.status}"] += 1
        c["unaligned"] += r.sentence is None
        c["query_fallback"] += bool(use_queries and not r.query)
    return {k: v for k, v in c.items() if v}


def jointcq_report(examples: list, predictions: list) -> dict:
    """Efficiency and claim statistics of an evaluation (``ProgramSpec.report``): model inferences (predictor
    calls) and LM requests per sample, search calls per judgement (paper: 4.93 and 1), claims per sample,
    unaligned claims, label counts, label/search failures. Over the items that produced a prediction."""
    preds = [p for p in predictions if p is not None]
    if not preds:
        return {}
    calls, counts = Counter(), Counter()
    lm_requests = search = judged = 0
    for p in preds:
        calls.update(getattr(p, "calls", None) or {})
        counts.update(getattr(p, "counts", None) or {})
        lm_requests += int(getattr(p, "lm_requests", 0) or 0)
        search += int(getattr(p, "search_calls", 0) or 0)
        judged += int(getattr(p, "judgements", 0) or 0)
    n = len(preds)
    out: dict[str, Any] = {
        "jointcq_inferences_per_sample": sum(calls.values()) / n,
        "jointcq_lm_requests_per_sample": lm_requests / n,
        "jointcq_claims_per_sample": judged / n,
        "jointcq_search_calls_per_judgement": (search / judged) if judged else None,
        "jointcq_samples_without_claims": sum(1 for p in preds if not (getattr(p, "judgements", 0) or 0)),
    }
    for k, v in sorted(calls.items()):
        out[f"jointcq_{k}_calls_per_sample"] = v / n
    for k, v in sorted(counts.items()):
        out[f"jointcq_{k}"] = v
    return out


register_program(ProgramSpec(
    name="jointcq",
    build=JointCQ,
    description="JointCQ: claims + search queries in one call, one search per claim, claim verification "
                "(correct/hallucinated/unverifiable), claims aligned to sentences and asserted words",
    level="span",
    default_metric="iou",
    report=jointcq_report,
    fit=fit_claim_queries,
    # "search:URL" sends $HALLUSCOPE_SEARCH_KEY to URL: an artifact may not choose it (halluscope.artifacts.store)
    endpoint_options=("retriever",),
    option_types={"top_k": whole(1), "align_threshold": number(0, 1), "unverifiable_score": number(0, 0.5),
                  "max_evidence_chars": whole(1), "num_threads": whole(1), "filter_demos": whole(0),
                  "filter_coverage": number(0, 1),
                  "calibrate": text(*CALIBRATIONS, nullable=True, what="a calibration of the verifier's labels")},
))
