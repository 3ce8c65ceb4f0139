"""MEDICO: multi-source evidence fusion for hallucination detection and preservation-bounded correction.

Pipeline for a question q and an answer o (one :class:`Medico` call):

1. **Retrieve** ``k`` pieces from every configured source (``sources="context,kb,files,kg,search"``): the item's
   given context, a knowledge-base index (``kb=INDEX_DIR``), user files (``files=docs/``), a triples file
   (``kg=triples.tsv``), a web search API (``search=URL``, off unless given). A source that cannot be built
   (missing index, no usable file, bad triples line, search not configured) or fails while retrieving (search
   timeout or HTTP 500) is **counted** (``failures["source_<name>"]``) and **named with its reason** in the
   prediction's ``failed_sources``; detection goes on with the sources that worked. Files that were skipped
   inside a working ``files`` source are listed in ``source_notes``.
2. **Rerank** the pooled pieces by BM25 relevance to q + o (``rerank="bm25"``; ``"none"`` keeps source order)
   and keep the top ``top_l``.
3. **Fuse**: ``fuse="concat"`` numbers the pieces (``[1] (kb) ...``); ``fuse="summary"`` asks the LM for a
   query-focused summary (:class:`signatures.medico.Fuse`; a summary that fails falls back to concat).
4. **Detect** (:class:`signatures.medico.Detect`): verdict (True = hallucinated) and a rationale. ``label`` is
   the verdict, ``score`` its likelihood p(True) (below), ``rationale`` the rationale, ``evidence`` the pieces
   used, and ``spans`` the parts of the answer the rationale quotes in double quotes (mapped to offsets with
   :func:`halluscope.text.map_substrings`; quotes of the evidence simply do not map), each with the score.
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

Likelihood p(True)
------------------
Every detection asks the LM for token log-probabilities (``logprobs=True``, 5 alternatives). Where the LM returns
them (OpenAI-compatible servers and other providers that report ``logprobs``), p(True) = σ((log p_T − log p_F)/τ)
with p_T / p_F the probability mass of the true-like / false-like alternatives of the verdict's first token
(:func:`logprob_probability`; a side absent from the alternatives gets the rest of the mass). Where the LM returns
none — the embedded llama.cpp engine and the scripted test LM today — the documented **fallback** is used:
p(True) = σ(±1/τ), the verdict as ±1 divided by the temperature ``tau`` through a logistic (τ = 1: 0.731 / 0.269;
small τ → 1 / 0); an undecided (unparseable) verdict is 0.5. ``likelihood`` in the prediction says which one
the fused detection used. The ensemble combiner is fitted on these features, so it learns how much to trust
each source's verdict.
"""

from __future__ import annotations

import copy
import math
import re

import dspy
import numpy as np
from dspy.utils.exceptions import AdapterParseError
from rapidfuzz.distance import Levenshtein

import halluscope.retrievers  # noqa: F401  (registers the kb/files/kg/search retrievers)
from halluscope.contract import Detection, Evidence, Span, to_prediction
from halluscope.programs.registry import ProgramSpec, register
from halluscope.retrieval import ContextRetriever, Retriever
from halluscope.retrievers.bm25 import BM25Index, Passage
from halluscope.retrievers.files import FileRetriever
from halluscope.retrievers.kb import KBRetriever
from halluscope.retrievers.kg import KGRetriever
from halluscope.retrievers.search import SearchRetriever
from halluscope.signatures.medico import Detect, Fuse, IdentifySpans, Revise
from halluscope.text import map_substrings

__all__ = ["SOURCES", "Medico", "preservation", "verdict_probability", "logprob_probability", "quoted", "fit_combiner", "medico_report"]

SOURCES = ("context", "kb", "files", "kg", "search")
# Per-stage output budgets (tokens): small models ramble until max_tokens.
MAX_TOKENS = {"summarize": 256, "detect": 160, "identify": 96, "revise": 192}
_QUOTES = re.compile(r'"([^"\n]+)"|“([^”\n]+)”|„([^“”\n]+)[“”]|«\s*([^»\n]+?)\s*»|「([^」\n]+)」')


def preservation(original: str, revision: str) -> float:
    """Prev(o, o′) = max(1 − Lev(o, o′)/len(o), 0), character Levenshtein; 1.0 for two empty texts."""
    if not original:
        return 1.0 if not revision else 0.0
    return max(1.0 - Levenshtein.distance(original, revision) / len(original), 0.0)


def verdict_probability(verdict: bool | None, tau: float = 1.0) -> float:
    """p(True) from a verdict alone (the fallback, see the module docstring): σ(±1/τ); ``None`` → 0.5."""
    if verdict is None:
        return 0.5
    z = (1.0 if verdict else -1.0) / max(float(tau), 1e-6)
    return 1.0 / (1.0 + math.exp(-max(min(z, 50.0), -50.0)))


def _entries(logprobs) -> list[dict]:
    content = logprobs.get("content") if isinstance(logprobs, dict) else getattr(logprobs, "content", None)
    out = []
    for e in content or []:
        e = e if isinstance(e, dict) else {"token": getattr(e, "token", ""), "logprob": getattr(e, "logprob", None),
                                           "top_logprobs": getattr(e, "top_logprobs", None) or []}
        out.append(e)
    return out


def _side(token: str) -> str | None:
    t = str(token or "").strip().strip('"').lower()
    if t and "true".startswith(t[:4]) and t[0] == "t":
        return "T"
    if t and "false".startswith(t[:5]) and t[0] == "f":
        return "F"
    return None


def logprob_probability(logprobs, tau: float = 1.0) -> float | None:
    """p(True) from the token log-probabilities of a Detect output, or ``None`` when they are missing.

    The verdict token is the first true-like or false-like token after the text ``verdict`` (ChatAdapter's
    ``[[ ## verdict ## ]]`` or JSON's ``"verdict":``). p_T and p_F are the summed probabilities of its
    true-like and false-like alternatives (the chosen token included); a side without any alternative gets
    ``1 − `` the other. Returns σ((log p_T − log p_F)/τ)."""
    entries = _entries(logprobs)
    text = ""
    for e in entries:
        tok = str(e.get("token") or "")
        if "verdict" in text.lower() and _side(tok) and e.get("logprob") is not None:
            mass = {"T": 0.0, "F": 0.0}
            alts = [(tok, e["logprob"])] + [(a.get("token") if isinstance(a, dict) else getattr(a, "token", ""),
                                             a.get("logprob") if isinstance(a, dict) else getattr(a, "logprob", None))
                                            for a in (e.get("top_logprobs") or [])]
            seen = set()
            for t, lp in alts:
                side = _side(t)
                if side and lp is not None and t not in seen:
                    seen.add(t)
                    mass[side] += math.exp(float(lp))
            if mass["T"] <= 0:
                mass["T"] = max(1.0 - mass["F"], 1e-9)
            if mass["F"] <= 0:
                mass["F"] = max(1.0 - mass["T"], 1e-9)
            z = (math.log(mass["T"]) - math.log(mass["F"])) / max(float(tau), 1e-6)
            return 1.0 / (1.0 + math.exp(-max(min(z, 50.0), -50.0)))
        text += tok
    return None


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


def _sigmoid(z):
    return 1.0 / (1.0 + np.exp(-np.clip(z, -50, 50)))


class Medico(dspy.Module):
    """MEDICO (see the module docstring).

    Args:
        sources: comma-separated evidence sources, any of context, kb, files, kg, search; none = no evidence.
        kb: knowledge-base index folder (halluscope index build SOURCE --out DIR) for the kb source.
        files: a folder or comma-separated files (TXT, Markdown, PDF, DOCX) for the files source.
        kg: a triples file (TSV or N-Triples) for the kg source.
        search: the search API URL for the search source (key from $HALLUSCOPE_SEARCH_KEY); empty = off.
        k: pieces retrieved per source.
        top_l: pieces kept after reranking the pool.
        rerank: bm25 (relevance to question + answer) or none (source order).
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
    """

    def __init__(self, sources: str = "context", kb: str = "", files: str = "", kg: str = "", search: str = "",
                 k: int = 5, top_l: int = 5, rerank: str = "bm25", fuse: str = "concat", correct: bool = True,
                 max_rounds: int = 5, delta: float = 0.5, tau: float = 1.0, ensemble: bool = True,
                 files_max_mb: float = 20.0, max_evidence_chars: int = 6000, retry_temperature: float = 0.7):
        super().__init__()
        names = [s.strip() for s in (sources.split(",") if isinstance(sources, str) else sources) if s.strip()]
        unknown = [s for s in names if s not in SOURCES and s != "none"]
        if unknown or not names:
            raise ValueError(f"medico: unknown evidence source(s) {unknown or '(none given)'}; "
                             f"choose from {', '.join(SOURCES)}")
        if fuse not in ("concat", "summary"):
            raise ValueError(f"medico: fuse must be 'concat' or 'summary', not {fuse!r}")
        if rerank not in ("bm25", "none"):
            raise ValueError(f"medico: rerank must be 'bm25' or 'none', not {rerank!r}")
        self.sources = [s for s in dict.fromkeys(names) if s != "none"]  # "none": zero evidence
        self.k, self.top_l, self.rerank, self.fuse = int(k), int(top_l), rerank, fuse
        self.correct, self.max_rounds, self.delta = bool(correct), int(max_rounds), float(delta)
        self.tau, self.ensemble = float(tau), bool(ensemble)
        self.max_evidence_chars, self.retry_temperature = int(max_evidence_chars), float(retry_temperature)
        self.retrievers: dict[str, Retriever] = {}
        self.source_errors: dict[str, str] = {}
        self.source_notes: dict[str, str] = {}
        settings = {"kb": kb, "files": files, "kg": kg, "search": search}
        for name in self.sources:
            try:
                self.retrievers[name] = self._make_retriever(name, settings, files_max_mb)
            except (OSError, ValueError, RuntimeError) as e:
                self.source_errors[name] = f"{type(e).__name__}: {e}"
        files_r = self.retrievers.get("files")
        if isinstance(files_r, FileRetriever) and files_r.skipped:
            self.source_notes["files"] = files_r.report()
        self.summarize = dspy.Predict(Fuse)
        self.detect = dspy.Predict(Detect)
        self.identify = dspy.Predict(IdentifySpans)
        self.revise = dspy.Predict(Revise)
        self.combiner: dict = {"fitted": False}

    @staticmethod
    def _make_retriever(name: str, settings: dict, files_max_mb: float) -> Retriever:
        if name == "context":
            return ContextRetriever()
        if name == "kb":
            return KBRetriever(settings["kb"])
        if name == "files":
            if not str(settings["files"]).strip():
                raise ValueError("files: no file or folder given (e.g. -O files=docs/)")
            return FileRetriever(settings["files"], max_mb=files_max_mb)
        if name == "kg":
            return KGRetriever(settings["kg"])
        return SearchRetriever(settings["search"])

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
        return found, failed

    def select(self, pieces: list[Evidence], question: str, answer: str) -> list[Evidence]:
        """The pool deduplicated and reranked (BM25 against question + answer), top ``top_l``."""
        seen, pool = set(), []
        for e in pieces:
            key = " ".join(e.text.split())
            if key and key not in seen:
                seen.add(key)
                pool.append(e)
        if self.rerank == "bm25" and len(pool) > 1:
            index = BM25Index([Passage(str(i), e.source, e.text) for i, e in enumerate(pool)])
            scores = index.scores(f"{question} {answer}")
            order = sorted(range(len(pool)), key=lambda i: (-scores[i], i))
            pool = [pool[i] for i in order]
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
        """(verdict, rationale, p(True), how p was obtained: "logprobs" or "verdict")."""
        try:
            out = self.detect(question=question, answer=answer, evidence=evidence,
                              config={"max_tokens": MAX_TOKENS["detect"], "logprobs": True, "top_logprobs": 5})
        except AdapterParseError:
            failures["parse"] = failures.get("parse", 0) + 1
            return None, "", 0.5, "verdict"
        verdict = _as_bool(out.verdict)
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
            pieces = self.select(found.get(name, []), question, answer)
            feats[name] = self.judge_p(question, answer, self.render(pieces), failures)[2] if pieces else 0.5
        pieces = self.select([e for n in self.sources for e in found.get(n, [])], question, answer)
        evidence = self.fuse_evidence(question, answer, pieces, failures)
        feats["fused"] = self.judge_p(question, answer, evidence, failures)[2]
        return feats

    def combine(self, feats: dict[str, float]) -> float:
        c = self.combiner
        x = np.array([feats.get(f, 0.5) for f in c["features"]], dtype=float)
        return float(_sigmoid(float(np.dot(c["weights"], x)) + float(c["bias"])))

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
        pieces = self.select([e for n in self.sources for e in found.get(n, [])], question, answer)
        evidence = self.fuse_evidence(question, answer, pieces, failures)
        verdict, rationale, score, likelihood = self.judge_p(question, answer, evidence, failures)
        source_p: dict[str, float] = {"fused": round(score, 6)}
        if self.ensemble and self.combiner.get("fitted"):
            for name in self.sources:
                own = self.select(found.get(name, []), question, answer)
                source_p[name] = round(self.judge_p(question, answer, self.render(own), failures)[2] if own else 0.5, 6)
            score = self.combine(source_p)
            label = score > 0.5
        else:
            label = bool(verdict)
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


# -- the ensemble combiner: logistic regression (BCE), fitted through ProgramSpec.fit ------------------------

def _fit_logistic(x: np.ndarray, y: np.ndarray, l2: float = 0.01, steps: int = 2000, lr: float = 0.5):
    """Weights and bias minimising mean binary cross-entropy + ``l2``/2·|w|² (full-batch gradient descent)."""
    w, b = np.zeros(x.shape[1]), 0.0
    for _ in range(steps):
        p = _sigmoid(x @ w + b)
        w -= lr * (x.T @ (p - y) / len(y) + l2 * w)
        b -= lr * float(np.mean(p - y))
    return w, b


def fit_combiner(module: Medico, trainset: list, metric_name: str = "f1") -> dict:
    """``ProgramSpec.fit``: the per-source likelihood features of every labelled training example, then a
    logistic regression (BCE) on them; stored in ``module.combiner`` (saved as JSON with the program's state).
    Examples without a gold label are skipped."""
    rows, ys = [], []
    features = [*module.sources, "fused"]
    for ex in trainset:
        if ex.get("label") is None:
            continue
        f = module.source_features(ex.get("question") or "", ex.get("answer") or "", ex.get("context") or "")
        rows.append([f[name] for name in features])
        ys.append(1.0 if ex.get("label") else 0.0)
    if not rows:
        raise ValueError("medico fit: no training example has a gold label")
    x, y = np.array(rows, dtype=float), np.array(ys, dtype=float)
    w, b = _fit_logistic(x, y)
    pred = _sigmoid(x @ w + b) > 0.5
    module.combiner = {"fitted": True, "features": features, "weights": [round(float(v), 6) for v in w],
                       "bias": round(float(b), 6), "tau": module.tau, "n": len(ys), "positives": int(y.sum())}
    return {"n": len(ys), "positives": int(y.sum()), "features": features, "weights": module.combiner["weights"],
            "bias": module.combiner["bias"], "train_accuracy": round(float(np.mean(pred == (y > 0.5))), 6)}


def medico_report(examples: list, predictions: list) -> dict:
    """Correction and source statistics of an evaluation: flagged answers, cumulative approval rate after each
    round (over flagged answers), mean preservation of accepted revisions, failed sources per name."""
    flagged = [p for p in predictions if p is not None and getattr(p, "label", False)]
    rounds = [getattr(p, "rounds", None) or [] for p in flagged]
    out: dict = {"flagged": len(flagged)}
    max_r = max((len(r) for r in rounds), default=0)
    for r in range(1, max_r + 1):
        approved = sum(1 for rs in rounds if any(x["approved"] and x["round"] <= r for x in rs))
        out[f"approved_after_round_{r}"] = round(approved / len(flagged), 6) if flagged else 0.0
    prev = [x["preservation"] for rs in rounds for x in rs if x.get("accepted")]
    out["mean_preservation"] = round(float(np.mean(prev)), 6) if prev else None
    out["rejected_by_preservation"] = sum(1 for rs in rounds for x in rs if "below delta" in x.get("reason", ""))
    for p in predictions:
        for name in (getattr(p, "failed_sources", None) or {}) if p is not None else {}:
            out[f"failed_source_{name}"] = out.get(f"failed_source_{name}", 0) + 1
    return out


register(ProgramSpec(
    name="medico",
    build=Medico,
    description="MEDICO: multi-source evidence (context, kb, files, kg, search), rerank, fuse, detect with a "
                "rationale, logistic-regression ensemble, preservation-bounded span-then-revise correction",
    level="response",
    default_metric="f1",
    report=medico_report,
    fit=fit_combiner,
    endpoint_options=("search",),
))
