"""JointCQ's criteria-guided filtering, the DSPy way: the paper keeps a synthesised training sample for the
claim-query generator only when its claims are entailed by the QA pair, decontextualised and together cover the
answer, and its queries are relevant, concise and usable as a search. Here:

* :class:`CriteriaJudge` asks those questions with two small signatures (:class:`ClaimCriteria`,
  :class:`QueryCriteria`); coverage is deterministic (:func:`coverage`, the alignment of
  :mod:`halluscope.programs.jointcq.align`).
* :func:`criteria_metric` turns them into a DSPy metric; with a ``trace`` (bootstrapping) it is a strict
  pass/fail, so ``BootstrapFewShot``/``MIPROv2`` keep a demonstration only when it meets every criterion.
* :func:`compile_claim_queries` compiles the claim-query stage (:class:`ClaimQueryStage`, the program's
  ``generate`` predictor alone) with that metric; :func:`fit_claim_queries` is JointCQ's ``ProgramSpec.fit``
  hook, so ``optimize.py --program jointcq`` does exactly this on each training fold and scores the held-out
  fold with the task metric (``f1``, ``iou``...). The verifier keeps its zero-shot prompt.
* :func:`export_filtered_pairs` writes the surviving pairs as chat fine-tuning JSONL (``{"messages": [...]}``)
  for users who want to fine-tune a generator instead.
"""

from __future__ import annotations

import json
import threading
from collections import Counter
from pathlib import Path
from typing import Any, Callable, Iterable, Sequence

import dspy
from dspy.utils.exceptions import AdapterParseError

from halluscope.programs.jointcq.align import MAX_TOKENS, align_claim, pair_fields
from halluscope.signatures.halluclean import parse_verdict
from halluscope.signatures.jointcq import ClaimCriteria, ClaimsAndQueries, QueryCriteria
from halluscope.core.text import segment

__all__ = ["ClaimQueryStage", "CriteriaJudge", "coverage", "criteria_metric", "compile_claim_queries",
           "fit_claim_queries", "chat_record", "export_filtered_pairs"]


class ClaimQueryStage(dspy.Module):
    """The claim-query stage alone (one ``ClaimsAndQueries`` predictor), the student that
    :func:`compile_claim_queries` compiles; ``forward`` returns ``pairs`` as ``{claim, query}`` dicts."""

    def __init__(self, generate: dspy.Predict | None = None):
        super().__init__()
        self.generate = generate if generate is not None else dspy.Predict(ClaimsAndQueries)

    def forward(self, question: str = "", answer: str = "", **_):
        try:
            pairs = self.generate(question=question or "", answer=answer or "",
                                  config={"max_tokens": MAX_TOKENS["generate"]}).pairs or []
        except AdapterParseError:
            pairs = []
        out = [dict(zip(("claim", "query"), pair_fields(p))) for p in pairs]
        return dspy.Prediction(pairs=[p for p in out if p["claim"]])


def _yes(value: Any) -> bool:
    return parse_verdict(value) is True


class CriteriaJudge(dspy.Module):
    """The paper's filtering criteria as LM-judged checks: :class:`ClaimCriteria` (entailed by the QA pair,
    decontextualised) and :class:`QueryCriteria` (relevant, concise, usable as a search); an unparseable
    judgement fails the check. ``lm`` (default: the configured LM) judges."""

    CLAIM_CHECKS = ("entailed", "decontextualised")
    QUERY_CHECKS = ("relevant", "concise", "searchable")

    def __init__(self, lm: dspy.BaseLM | None = None):
        super().__init__()
        self.lm = lm
        self.claim_check = dspy.Predict(ClaimCriteria)
        self.query_check = dspy.Predict(QueryCriteria)
        self._lock = threading.Lock()
        self.stats: Counter = Counter()  # pairs checked / passed, failures per check, unparseable judgements

    def check(self, question: str, answer: str, claim: str, query: str) -> dict:
        """``{check: bool, ..., "passed": all of them}`` for one pair; a judgement that does not parse fails its
        checks (counted in ``stats["unparsed_judgements"]``), and so do the query checks of an empty query."""
        out: dict[str, Any] = {}
        unparsed = 0
        with dspy.context(**({"lm": self.lm} if self.lm is not None else {})):
            try:
                c = self.claim_check(question=question, answer=answer, claim=claim,
                                     config={"max_tokens": MAX_TOKENS["criteria"]})
                out.update({k: _yes(getattr(c, k, None)) for k in self.CLAIM_CHECKS})
            except AdapterParseError:
                unparsed += 1
                out.update({k: False for k in self.CLAIM_CHECKS})
            if query.strip():
                try:
                    q = self.query_check(claim=claim, query=query, config={"max_tokens": MAX_TOKENS["criteria"]})
                    out.update({k: _yes(getattr(q, k, None)) for k in self.QUERY_CHECKS})
                except AdapterParseError:
                    unparsed += 1
                    out.update({k: False for k in self.QUERY_CHECKS})
            else:
                out.update({k: False for k in self.QUERY_CHECKS})
        out["passed"] = all(out[k] for k in (*self.CLAIM_CHECKS, *self.QUERY_CHECKS))
        with self._lock:
            self.stats["pairs_checked"] += 1
            self.stats["pairs_passed"] += out["passed"]
            self.stats["unparsed_judgements"] += unparsed
            self.stats.update(f"failed_{k}" for k in (*self.CLAIM_CHECKS, *self.QUERY_CHECKS) if not out[k])
        return out

    def forward(self, question: str = "", answer: str = "", claim: str = "", query: str = ""):
        return dspy.Prediction(**self.check(question, answer, claim, query))


def coverage(answer: str, claims: Sequence[str], lang: str = "en", threshold: float = 0.5) -> float:
    """Share of the answer's sentences that at least one claim aligns to (:func:`align_claim`): the
    deterministic half of "the claims together cover the answer's facts". 1.0 for an answer without sentences."""
    sentences = segment(answer or "", lang or "en")
    if not sentences:
        return 1.0
    hit = {align_claim(c, sentences, "", threshold).sentence for c in claims} - {None}
    return len(hit) / len(sentences)


def _judged(example, prediction, judge: "CriteriaJudge", min_coverage: float, allow_empty: bool) -> dict:
    """The criteria applied to one prediction: its pairs, each pair's checks, the coverage, the criteria score and
    whether everything passed (what :func:`criteria_metric` and :func:`criteria_feedback_metric` report)."""
    get = example.get if hasattr(example, "get") else (lambda k, d=None: getattr(example, k, d))
    question, answer = get("question", "") or "", get("answer", "") or ""
    pairs = [dict(zip(("claim", "query"), pair_fields(p))) for p in (getattr(prediction, "pairs", None) or [])]
    pairs = [p for p in pairs if p["claim"]]
    if not pairs:
        return {"pairs": [], "results": [], "coverage": None, "score": 1.0 if allow_empty else 0.0,
                "passed_all": allow_empty}
    results = [judge.check(question, answer, p["claim"], p["query"]) for p in pairs]
    share = sum(r["passed"] for r in results) / len(results)
    cov = coverage(answer, [p["claim"] for p in pairs], get("lang", "en") or "en")
    covered = cov >= min_coverage
    return {"pairs": pairs, "results": results, "coverage": cov, "score": share if covered else 0.0,
            "passed_all": share == 1.0 and covered}


def criteria_metric(base: Callable | None = None, *, judge: CriteriaJudge | None = None, min_coverage: float = 1.0,
                    base_threshold: float = 1.0, allow_empty: bool = False) -> Callable:
    """A DSPy metric ``metric(example, prediction, trace=None)`` for the claim-query stage (or the whole
    program: both return ``pairs``).

    Criteria score of a prediction = (share of its pairs passing every :class:`CriteriaJudge` check) × (1 if
    :func:`coverage` ≥ ``min_coverage`` else 0); a prediction without pairs scores ``1.0`` only with
    ``allow_empty`` (an answer without facts), else 0. With ``base`` (a task metric such as
    ``metrics.adapters.get_metric("f1")``) the value is ``base × criteria``.

    While an optimizer bootstraps (``trace`` is not None) it returns a bool: every pair passes, coverage holds
    and ``base`` (when given) reaches ``base_threshold`` — so BootstrapFewShot/MIPROv2 keep a demonstration only
    when it meets the paper's filtering criteria.
    """
    judge = judge if judge is not None else CriteriaJudge()

    def metric(example, prediction, trace=None):
        j = _judged(example, prediction, judge, min_coverage, allow_empty)
        b = float(base(example, prediction)) if base is not None else 1.0
        if trace is not None:
            return bool(j["passed_all"] and b >= base_threshold)
        return b * j["score"]

    metric.__name__ = "jointcq_criteria" + (f"*{getattr(base, '__name__', 'base')}" if base else "")
    return metric


def criteria_feedback_metric(*, judge: CriteriaJudge | None = None, min_coverage: float = 1.0,
                             allow_empty: bool = False) -> Callable:
    """GEPA's five-argument metric for the claim-query stage: the :func:`criteria_metric` score with, as textual
    feedback, each pair that failed a check (the claim and query quoted, the checks named) and a coverage below
    ``min_coverage`` (the share of the answer's sentences no claim covers), so the reflection LM reads *why*."""
    judge = judge if judge is not None else CriteriaJudge()

    def metric(gold, pred, trace=None, pred_name=None, pred_trace=None):
        j = _judged(gold, pred, judge, min_coverage, allow_empty)
        if not j["pairs"]:
            said = ("No claim was extracted (the answer states no fact)." if allow_empty else
                    "No claim was extracted, but the answer states facts: extract each one as a claim with a query.")
            return dspy.Prediction(score=j["score"], feedback=said)
        lines = []
        for pair, result in zip(j["pairs"], j["results"]):
            failed = [k for k in (*CriteriaJudge.CLAIM_CHECKS, *CriteriaJudge.QUERY_CHECKS) if not result[k]]
            if failed:
                lines.append(f"The claim '{pair['claim']}' with the query '{pair['query']}' is not "
                             f"{', '.join(failed)}.")
        if j["coverage"] < min_coverage:
            lines.append(f"The claims cover {j['coverage']:.0%} of the answer's sentences; every sentence with a fact "
                         f"needs a claim.")
        if not lines:
            lines.append("Every claim and query meets the criteria and the claims cover the answer.")
        return dspy.Prediction(score=j["score"], feedback=" ".join(lines))

    metric.__name__ = "jointcq_criteria_feedback"
    return metric


def compile_claim_queries(program: dspy.Module, trainset: Sequence, *, optimizer: str = "bootstrap",
                          metric: Callable | None = None, max_bootstrapped_demos: int = 4, max_labeled_demos: int = 0,
                          prompt_lm: dspy.BaseLM | None = None, auto: str | None = "light", seed: int = 0,
                          feedback_metric: Callable | None = None, max_metric_calls: int | None = None
                          ) -> dspy.Module:
    """Compile ``program``'s claim-query stage (its ``generate`` predictor) on ``trainset`` (examples with
    question/answer inputs) with ``metric`` (default :func:`criteria_metric`), so only demonstrations passing the
    criteria are kept; the compiled predictor (demos, and instructions with MIPROv2 or GEPA) replaces
    ``program.generate`` in place. ``optimizer``: ``"bootstrap"`` (BootstrapFewShot), ``"mipro"`` (MIPROv2) or
    ``"gepa"`` (GEPA with ``feedback_metric``, default :func:`criteria_feedback_metric`; ``prompt_lm`` reflects,
    default the configured LM; budget ``max_metric_calls``, else ``auto``)."""
    if optimizer not in ("bootstrap", "mipro", "gepa"):
        raise ValueError(f"optimizer must be 'bootstrap', 'mipro' or 'gepa', not {optimizer!r}")
    metric = metric or criteria_metric()
    trainset = [ex if not isinstance(ex, dspy.Example) or ex._input_keys else ex.with_inputs("question", "answer")
                for ex in trainset]
    student = ClaimQueryStage(program.generate.deepcopy())
    if optimizer == "bootstrap":
        opt = dspy.BootstrapFewShot(metric=metric, max_bootstrapped_demos=max_bootstrapped_demos,
                                    max_labeled_demos=max_labeled_demos)
        compiled = opt.compile(student, trainset=list(trainset))
    elif optimizer == "gepa":
        budget = {"max_metric_calls": max_metric_calls} if max_metric_calls else {"auto": auto or "light"}
        opt = dspy.GEPA(metric=feedback_metric or criteria_feedback_metric(),
                        reflection_lm=prompt_lm or dspy.settings.lm, seed=seed, use_mlflow=False, **budget)
        compiled = opt.compile(student, trainset=list(trainset))
    else:
        opt = dspy.MIPROv2(metric=metric, prompt_model=prompt_lm, max_bootstrapped_demos=max_bootstrapped_demos,
                           max_labeled_demos=max_labeled_demos, auto=auto, seed=seed, verbose=False)
        compiled = opt.compile(student, trainset=list(trainset), seed=seed)
    program.generate = compiled.generate
    return program


def fit_claim_queries(module: dspy.Module, trainset: list, metric_name: str = "", *,
                      optimizer: str = "bootstrap", reflection_lm: dspy.BaseLM | None = None,
                      max_metric_calls: int | None = None, auto: str | None = "light", seed: int = 0) -> dict:
    """JointCQ's ``ProgramSpec.fit`` hook: :func:`compile_claim_queries` with ``optimizer`` (BootstrapFewShot by
    default; ``optimize.py --program jointcq --optimizer mipro`` passes ``"mipro"``; ``--optimizer gepa`` passes
    ``"gepa"`` with the run's budget and reflection LM, and GEPA reads :func:`criteria_feedback_metric`) and :func:`criteria_metric`
    (at most ``module.filter_demos`` demonstrations, coverage ≥ ``module.filter_coverage``), judged by the task LM.
    The gold labels and ``metric_name`` are not used here (the paper's filter needs no labels); the optimize run
    scores each held-out fold with the task metric. Returns what was kept and why."""
    judge = CriteriaJudge()
    cover = float(getattr(module, "filter_coverage", 1.0))
    metric = criteria_metric(judge=judge, min_coverage=cover)
    compile_claim_queries(module, trainset, optimizer=optimizer, metric=metric,
                          max_bootstrapped_demos=int(getattr(module, "filter_demos", 2)),
                          feedback_metric=criteria_feedback_metric(judge=judge, min_coverage=cover),
                          prompt_lm=reflection_lm, max_metric_calls=max_metric_calls, auto=auto, seed=seed)
    return {"criteria_optimizer": optimizer, "criteria_demos_kept": len(module.generate.demos),
            "criteria_metric": metric.__name__, **{f"criteria_{k}": v for k, v in sorted(judge.stats.items())}}


def chat_record(question: str, answer: str, pairs: Sequence[dict], system: str | None = None) -> dict:
    """One chat fine-tuning record: system = the ClaimsAndQueries instructions, user = the question and answer,
    assistant = the pairs as a JSON list of ``{"claim", "query"}``."""
    system = system if system is not None else " ".join((ClaimsAndQueries.instructions or "").split())
    return {"messages": [
        {"role": "system", "content": system},
        {"role": "user", "content": f"Question: {question}\nAnswer: {answer}"},
        {"role": "assistant", "content": json.dumps([{"claim": p["claim"], "query": p["query"]} for p in pairs],
                                                    ensure_ascii=False)},
    ]}


def export_filtered_pairs(examples: Iterable, out: str | Path, *, generator: dspy.Module | None = None,
                          judge: CriteriaJudge | None = None, min_coverage: float = 1.0,
                          keep: str = "sample") -> dict:
    """Generate claim-query pairs for ``examples`` (mappings or ``dspy.Example`` with question/answer, or with
    ready ``pairs``), filter them by the criteria and write the survivors to ``out`` as chat JSONL
    (:func:`chat_record`, one sample a line).

    ``keep="sample"`` (the paper's filtering) writes a sample only when every pair passes and :func:`coverage`
    reaches ``min_coverage``; ``keep="pair"`` writes a sample with just its passing pairs (when any).
    Returns counts: samples seen/kept, pairs seen/kept, per-check failures, generation failures."""
    if keep not in ("sample", "pair"):
        raise ValueError(f"keep must be 'sample' or 'pair', not {keep!r}")
    judge = judge if judge is not None else CriteriaJudge()
    generator = generator if generator is not None else ClaimQueryStage()
    stats: Counter = Counter()
    out = Path(out)
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = out.with_name(out.name + ".tmp")
    with tmp.open("w", encoding="utf-8") as f:
        for ex in examples:
            get = ex.get if hasattr(ex, "get") else (lambda k, d=None, _e=ex: getattr(_e, k, d))
            question, answer = get("question", "") or "", get("answer", "") or ""
            stats["samples"] += 1
            given = get("pairs", None)
            if given is None:
                try:
                    given = generator(question=question, answer=answer).pairs
                except Exception:  # noqa: BLE001 - one failed generation skips one sample
                    stats["generate_failed"] += 1
                    continue
            pairs = [dict(zip(("claim", "query"), pair_fields(p))) for p in (given or [])]
            pairs = [p for p in pairs if p["claim"]]
            if not pairs:
                stats["no_pairs"] += 1
                continue
            passing = []
            for p in pairs:
                stats["pairs"] += 1
                r = judge.check(question, answer, p["claim"], p["query"])
                for k in (*CriteriaJudge.CLAIM_CHECKS, *CriteriaJudge.QUERY_CHECKS):
                    if not r[k]:
                        stats[f"failed_{k}"] += 1
                if r["passed"]:
                    passing.append(p)
            stats["pairs_passed"] += len(passing)
            covered = coverage(answer, [p["claim"] for p in pairs], get("lang", "en") or "en") >= min_coverage
            if not covered:
                stats["failed_coverage"] += 1
            chosen = (pairs if len(passing) == len(pairs) and covered else []) if keep == "sample" else passing
            if chosen:
                f.write(json.dumps(chat_record(question, answer, chosen), ensure_ascii=False) + "\n")
                stats["samples_kept"] += 1
                stats["pairs_kept"] += len(chosen)
    tmp.replace(out)
    return dict(stats)
