"""FINCH-ZK: fine-grained cross-model consistency detection and targeted correction (zero knowledge).

Pipeline for one (question, answer):

1. **Sampling** (:class:`Sampler`): ``n_samples`` answers to the question from a set of sampler LMs under
   seven prompt variations (identity, zero-shot CoT, long answer; rephrase, expand-before, expand-after,
   break-down, the last four written by the configured LM). Sample ``i`` uses variant ``i mod |V|`` and
   model ``i mod |M|`` of orders shuffled once with ``seed`` (:func:`round_robin`). Samples run in
   parallel; a failing sample is dropped and counted in ``failures["sampler"]``.
2. **Segmentation** of the answer into blocks (:func:`halluscope.core.text.segment`, pysbd, offsets kept).
3. **Judging** every block against every sample: one call per sample rating all blocks (``batch_judge``,
   the default: |samples| calls) or one call per (block, sample) pair (|blocks| x |samples| calls).
4. **Scoring** exactly as the paper (:func:`block_score`, :func:`block_label`, :func:`response_score`,
   :func:`response_label`): weighted mean of the ratings (weights contradiction 4, accurate 2, neutral 1,
   unknown 0; scores 1, 0, 0.5), block label by ``tau``, response label = any contradicted block.
5. **Correction** (``correct=True``): for each contradicted block an error summary and a corrected block,
   reconstruction replacing only those blocks (:func:`reconstruct`), then cross-model reflection by the
   ``improver`` LM with representative samples.

Contract mapping: units are the blocks (kind "block", label accurate/neutral/contradiction, score); spans
are the blocks with their score as probability (hard labels: blocks scoring > 0.5); ``label`` = any
contradiction; ``score`` = mean block score; ``rationale`` = the conflicts summarised; ``revision`` = the
reflected answer when something was flagged and ``correct`` is on.

The deterministic scoring is in :mod:`.scoring`, the sampling in :mod:`.sampling`, the signatures in
:mod:`halluscope.signatures.finch`; this module is the program and its registration.

Sampler specs (:func:`~halluscope.programs.finch.sampling.sampler_lm`)
----------------------------------
A sampler is a ``dspy.LM``, or a string ``"<lm spec>?key=value&key=value"`` where ``<lm spec>`` is anything
:func:`halluscope.lm.models.make_lm` accepts (``local``, ``openai/gpt-4o-mini``, ``hosted_vllm/...``) or ``self``
(the LM configured when the program runs) and the keys are LM options (``temperature``, ``seed``,
``max_tokens``, ``api_base``, ...; numbers and true/false are converted), or a dict ``{"lm": spec, **options}``.
The default is four settings of the configured LM: ``self?temperature=0.7&seed=1``, ``...1.0&seed=2``,
``...0.7&seed=3``, ``...1.0&seed=4``. A list of real models, e.g.
``["openai/gpt-4o-mini?temperature=0.7", "anthropic/claude-3-5-haiku-latest", "ollama_chat/llama3.1"]``,
gives true cross-model sampling.

Parallelism: stages run their calls in a thread pool (``num_threads``) with DSPy's settings propagated to
every thread (each task runs in a copy of the caller's ``contextvars`` context). With the embedded model
all LMs share one llama.cpp engine behind one lock, so the calls simply take turns; with API models they
overlap.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import asdict, dataclass
from typing import Any, Sequence

import dspy

from halluscope.core.contract import Detection, Span, Unit, to_prediction
from halluscope.core.decisions import calibrated_by, content_free_prior
from halluscope.core.parallel import try_map
from halluscope.core.redact import error_text
from halluscope.core.text import segment
from halluscope.programs.finch.sampling import DEFAULT_SAMPLERS, Sample, Sampler, representatives, sampler_lm
from halluscope.programs.finch.scoring import (DEFAULT_TAU, block_label, block_score, number_blocks, reconstruct,
                                               response_label, response_score)
from halluscope.programs.registry import ProgramSpec, free, number, register_program, text, whole
from halluscope.signatures.finch import (CorrectBlock, ErrorSummary, JudgeBlock, JudgeBlockDecision, JudgeBlocks,
                                         RATINGS, Reflect, Verdict, parse_rating)

__all__ = ["FinchZK", "CALIBRATIONS"]

# The ``calibrate`` option's values (None: off), i.e. which inputs of the judge the content-free request of
# contextual calibration (Zhao et al. 2021) empties: "content_free" the block and the answer (the prior of this
# sample: one request per sample), "no_evidence" the sample (the prior of this block: one request per block).
CALIBRATIONS = ("content_free", "no_evidence")

# -- the program --------------------------------------------------------------------------------------


@dataclass
class _Vote:
    rating: str
    explanation: str
    sample: int


def _as_bool(x: Any) -> bool:
    return x if isinstance(x, bool) else str(x).strip().lower() in ("1", "true", "yes", "on")


def _as_opt_int(x: Any) -> int | None:
    return None if x in (None, "", "none", "None") else int(x)


class FinchZK(dspy.Module):
    """FINCH-ZK as a DSPy program (see the module docstring).

    Optimizable predictors: ``judge`` (:class:`JudgeBlocks` with ``batch_judge``, else :class:`JudgeBlock`)
    and, with ``correct``, ``summarize``, ``correct_block`` and ``reflect``. The sampler's predictors are
    frozen (``sampler._compiled = True``) so optimizers leave the paper's prompt variations alone.

    Args:
        samplers: sampler LM specs (see the module docstring), a list or one comma-separated string; default:
            four temperature/seed settings of the configured LM (``DEFAULT_SAMPLERS``).
        n_samples: samples per item (round-robin over variants and samplers).
        batch_judge: rate all blocks against one sample per call (|samples| calls) instead of one call per
            (block, sample) pair.
        correct: run the correction stage when a block is contradicted.
        improver: LM spec for cross-model reflection; None = the configured LM.
        tau: label threshold (accurate <= tau, contradiction >= 1 - tau).
        seed: seed of the round-robin shuffle.
        use_context: prepend the item's context to the sampling prompts (off: zero knowledge, as the paper).
        num_threads: threads per stage.
        reflect_samples: samples shown to the improver.
        sample_max_tokens / variant_max_tokens / judge_max_tokens / correct_max_tokens: per-stage
            ``max_tokens`` (None = the LM's own).
        decisions: the judge's rating is a Choice (:class:`JudgeBlockDecision`, one call per (block, sample)
            pair: ``batch_judge`` is then off) that ``dspy.ReAnchor`` calibrates (``--optimizer reanchor``).
        calibrate: contextual calibration of the judge's rating probabilities (implies ``decisions``): each
            rating's probability is divided by the one a content-free request gave (see :data:`CALIBRATIONS`)
            and renormalised before the rating is chosen (the most probable, unless ReAnchor fitted weights).
            A content-free request that fails leaves its ratings uncalibrated (``failures["content_free"]``).

    These parameters are the registered program's build options (``spec.options`` reads their defaults from
    here); values from a command line are converted (``"false"``, ``"4"``, ``"none"``).
    """

    def __init__(
        self,
        samplers: Sequence | str | None = DEFAULT_SAMPLERS,
        n_samples: int = 10,
        batch_judge: bool = True,
        correct: bool = True,
        improver: Any = None,
        tau: float = DEFAULT_TAU,
        seed: int = 0,
        use_context: bool = False,
        num_threads: int = 4,
        reflect_samples: int = 3,
        sample_max_tokens: int | None = None,
        variant_max_tokens: int | None = None,
        judge_max_tokens: int | None = None,
        correct_max_tokens: int | None = None,
        decisions: bool = False,
        calibrate: str | None = None,
    ):
        super().__init__()
        if calibrate in ("", "none", "None"):
            calibrate = None
        if calibrate not in (None, *CALIBRATIONS):
            raise ValueError(f"finch: calibrate must be one of {', '.join(CALIBRATIONS)} or null, not {calibrate!r}")
        self.calibrate = calibrate
        if isinstance(samplers, str):
            samplers = [s.strip() for s in samplers.split(",") if s.strip()]
        tau = float(tau)
        block_label(0.0, tau)  # validates tau
        self.n_samples = int(n_samples)
        self.decisions = _as_bool(decisions) or bool(calibrate)
        self.batch_judge = _as_bool(batch_judge) and not self.decisions
        self.correct = _as_bool(correct)
        self.improver = None if improver in ("", "none", "None") else improver
        self.tau = tau
        self.use_context = _as_bool(use_context)
        self.num_threads = int(num_threads)
        self.reflect_samples = int(reflect_samples)
        self.judge_max_tokens = _as_opt_int(judge_max_tokens)
        self.correct_max_tokens = _as_opt_int(correct_max_tokens)
        self.sampler = Sampler(
            samplers=list(samplers) if samplers else list(DEFAULT_SAMPLERS),
            n_samples=self.n_samples,
            seed=int(seed),
            num_threads=self.num_threads,
            max_tokens=_as_opt_int(sample_max_tokens),
            variant_max_tokens=_as_opt_int(variant_max_tokens),
        )
        self.sampler._compiled = True  # frozen: not among the optimizable predictors
        self.judge = dspy.Predict(JudgeBlockDecision if self.decisions else JudgeBlocks if self.batch_judge
                                  else JudgeBlock)
        if calibrate:  # the calibrated probabilities decide from the start (ReAnchor may refit the weights)
            self.judge.fields = {"rating": {"weights": dict.fromkeys(RATINGS, 1.0)}}
        if self.correct:
            self.summarize = dspy.Predict(ErrorSummary)
            self.correct_block = dspy.Predict(CorrectBlock)
            self.reflect = dspy.Predict(Reflect)

    # -- judging ----------------------------------------------------------------------------------
    def _judge(self, question, answer, texts, samples, failures, calls, errors) -> list[list[_Vote]]:
        """Votes per block: one per sample (unknown when missing/unparseable/failed)."""
        votes: list[list[_Vote]] = [[] for _ in texts]
        cfg = {"max_tokens": self.judge_max_tokens} if self.judge_max_tokens else {}
        if self.batch_judge:
            numbered = number_blocks(texts)

            def one(s: Sample):
                return self.judge(question=question, blocks=numbered, sample=s.answer, config=cfg).ratings or []

            calls["judge"] += len(samples)
            for s, (ok, out) in zip(samples, try_map(one, samples, threads=self.num_threads)):
                got: dict[int, _Vote] = {}
                if not ok:
                    failures["judge"] += 1
                    errors.append(f"judge sample {s.index}: {error_text(out)}")
                else:
                    for v in out:
                        idx = getattr(v, "block", None)
                        if isinstance(idx, int) and 1 <= idx <= len(texts) and idx - 1 not in got:
                            got[idx - 1] = _Vote(parse_rating(v.rating), (v.explanation or "").strip(), s.index)
                for b in range(len(texts)):
                    votes[b].append(got.get(b, _Vote("unknown", "", s.index)))
        else:
            pairs = [(b, s) for b in range(len(texts)) for s in samples]
            priors = self._priors(question, answer, texts, samples, cfg, failures, calls)

            def one(pair):
                b, s = pair
                prior = priors.get(s.index if self.calibrate == "content_free" else b)
                with calibrated_by({"rating": prior} if prior else {}):
                    out = self.judge(question=question, answer=answer, block=texts[b], sample=s.answer, config=cfg)
                return Verdict(explanation=str(out.explanation or ""), rating=str(out.rating or "")) \
                    if self.decisions else out.verdict

            calls["judge"] += len(pairs)
            for (b, s), (ok, out) in zip(pairs, try_map(one, pairs, threads=self.num_threads)):
                if ok and out is not None:
                    votes[b].append(_Vote(parse_rating(out.rating), (out.explanation or "").strip(), s.index))
                else:
                    if not ok:
                        failures["judge"] += 1
                        errors.append(f"judge block {b + 1} sample {s.index}: {error_text(out)}")
                    votes[b].append(_Vote("unknown", "", s.index))
        unknown = sum(v.rating == "unknown" for bv in votes for v in bv)
        if unknown:
            failures["unknown_rating"] += unknown
        return votes

    def _priors(self, question, answer, texts, samples, cfg, failures, calls) -> dict[int, dict[str, float]]:
        """The content-free rating probabilities of ``calibrate``: by sample index ("content_free": block and
        answer emptied) or by block index ("no_evidence": sample emptied); {} without ``calibrate``. A request
        that fails (no parse, no probability) is left out and counted in ``failures["content_free"]``."""
        if not self.calibrate:
            return {}
        if self.calibrate == "content_free":
            keys = [s.index for s in samples]
            requests = [dict(answer="", block="", sample=s.answer) for s in samples]
        else:
            keys = list(range(len(texts)))
            requests = [dict(answer=answer, block=t, sample="") for t in texts]
        calls["content_free"] += len(requests)
        got = try_map(lambda r: content_free_prior(self.judge, "rating", question=question, config=cfg, **r),
                      requests, threads=self.num_threads)
        priors = {k: p for k, (ok, p) in zip(keys, got) if ok and isinstance(p, dict)}
        if len(priors) < len(keys):
            failures["content_free"] += len(keys) - len(priors)
        return priors

    # -- correction -------------------------------------------------------------------------------
    @staticmethod
    def _conflicts(votes: list[_Vote], samples: Sequence[Sample]) -> list[str]:
        by_index = {s.index: s for s in samples}
        out = []
        for v in votes:
            if v.rating != "contradiction":
                continue
            text = v.explanation or f"another answer says: {by_index[v.sample].answer[:300]}"
            if text not in out:
                out.append(text)
        return out

    def _correct(self, question, answer, lang, blocks, flagged, conflicts, samples, failures, calls, errors):
        cfg = {"max_tokens": self.correct_max_tokens} if self.correct_max_tokens else {}

        def fix(b: int):
            summary = (self.summarize(question=question, block=blocks[b].text, conflicts=conflicts[b],
                                      config=cfg).summary or "").strip()
            fixed = self.correct_block(question=question, answer=answer, block=blocks[b].text,
                                       error_summary=summary, conflicts=conflicts[b], language=lang,
                                       config=cfg).corrected_block
            return summary, (fixed or "").strip()

        calls["summary"] += len(flagged)
        calls["correct"] += len(flagged)
        summaries, replacements = {}, {}
        for b, (ok, out) in zip(flagged, try_map(fix, flagged, threads=self.num_threads)):
            if not ok:
                failures["correct"] += 1
                errors.append(f"correct block {b + 1}: {error_text(out)}")
                continue
            summary, fixed = out
            summaries[b] = summary
            if fixed:
                replacements[b] = fixed
            else:
                failures["correct"] += 1
                errors.append(f"correct block {b + 1}: blank correction, block kept")
        corrected = reconstruct(answer, blocks, replacements)

        reps = [s.answer for s in representatives(samples, self.reflect_samples)]
        improver = sampler_lm(self.improver) if self.improver is not None else None
        calls["reflect"] += 1
        try:
            with dspy.context(**({"lm": improver} if improver is not None else {})):
                out = self.reflect(question=question, answer=corrected, samples=reps, language=lang, config=cfg)
            revision = (out.improved_answer or "").strip() or corrected
            changes = (out.changes or "").strip()
            if not (out.improved_answer or "").strip():
                failures["reflect"] += 1
        except Exception as e:  # noqa: BLE001 - the block-level correction still stands
            failures["reflect"] += 1
            errors.append(f"reflect: {error_text(e)}")
            revision, changes = corrected, ""
        return summaries, corrected, revision, changes

    # -- forward ----------------------------------------------------------------------------------
    def forward(self, question: str = "", answer: str = "", lang: str = "en", context: str = "", **_):
        answer = answer or ""
        question = question or ""
        lang = lang or "en"
        blocks = segment(answer, lang)
        if not blocks:
            return to_prediction(Detection(answer=answer, rationale="empty answer: nothing to check"),
                                 samples=[], ratings=[], calls={}, errors=[], corrected_answer=None, changes="")
        failures, calls, errors = Counter(), Counter(), []
        samples: list[Sample] = []
        if question.strip():
            sampled = self.sampler(question=question, context=context if self.use_context else "")
            samples = sampled.samples
            failures.update(sampled.failures)
            calls.update(sampled.calls)
            errors += sampled.errors
        else:
            failures["no_question"] += 1
        texts = [b.text for b in blocks]
        votes = self._judge(question, answer, texts, samples, failures, calls, errors) if samples else [
            [] for _ in blocks]

        scores = [block_score(v.rating for v in bv) for bv in votes]
        labels = [block_label(s, self.tau) for s in scores]
        conflicts = [self._conflicts(bv, samples) for bv in votes]
        flagged = [i for i, lab in enumerate(labels) if lab == "contradiction"]

        summaries: dict[int, str] = {}
        corrected = revision = None
        changes = ""
        if self.correct and flagged:
            summaries, corrected, revision, changes = self._correct(
                question, answer, lang, blocks, flagged, conflicts, samples, failures, calls, errors)

        units = [
            Unit("block", b.start, b.end, b.text, labels[i], scores[i],
                 rationale=summaries.get(i) or "; ".join(conflicts[i][:3]))
            for i, b in enumerate(blocks)
        ]
        if not samples:
            rationale = ("no question: nothing to sample against" if not question.strip()
                         else f"no sample to compare against: all {self.n_samples} samples failed")
        elif flagged:
            rationale = "\n".join(
                f"Block {i + 1} ({scores[i]:.2f}): " + (summaries.get(i) or "; ".join(conflicts[i][:3]))
                for i in flagged)
        else:
            rationale = f"no block contradicted by the {len(samples)} samples"
        det = Detection(
            answer=answer,
            spans=[Span(b.start, b.end, scores[i]) for i, b in enumerate(blocks)],
            label=response_label(labels),
            score=response_score(scores),
            units=units,
            rationale=rationale,
            revision=revision,
            failures=dict(failures),
        )
        return to_prediction(
            det,
            samples=[s.to_dict() for s in samples],
            ratings=[[asdict(v) for v in bv] for bv in votes],
            calls=dict(calls),
            errors=errors,
            corrected_answer=corrected,
            changes=changes,
        )


# -- registration -------------------------------------------------------------------------------------


def report(examples: list, predictions: list) -> dict:
    """Mean LM requests per item made by the program (total and per stage, cache hits included) over the
    items that produced a prediction. (Failures are already summed by the evaluation runner.)"""
    preds = [p for p in predictions if p is not None]
    out: dict[str, float] = {}
    if not preds:
        return out
    calls: Counter = Counter()
    for p in preds:
        calls.update(getattr(p, "calls", None) or {})
    out["finch_lm_calls_per_item"] = sum(calls.values()) / len(preds)
    for k, v in sorted(calls.items()):
        out[f"finch_{k}_calls_per_item"] = v / len(preds)
    return out


register_program(ProgramSpec(
    name="finch",
    build=FinchZK,
    description="FINCH-ZK: cross-model consistency of answer blocks with sampled answers, targeted correction",
    level="span",
    default_metric="iou",
    report=report,
    endpoint_options=("samplers", "improver"),
    option_types={
        "samplers": free("a list of sampler LM specs or one comma-separated string"),
        "n_samples": whole(1), "improver": text(nullable=True, what="an LM spec"),
        "tau": number(0, 0.5, hi_open=True), "seed": whole(0), "num_threads": whole(1), "reflect_samples": whole(0),
        "calibrate": text(*CALIBRATIONS, nullable=True, what="a calibration of the judge's ratings"),
        **{f"{stage}_max_tokens": whole(1, nullable=True) for stage in ("sample", "variant", "judge", "correct")},
    },
))
