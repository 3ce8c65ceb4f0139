"""FINCH-ZK: fine-grained cross-model consistency detection and targeted correction (zero knowledge).

Pipeline for one (question, answer):

1. **Sampling** (:class:`Sampler`): ``n_samples`` answers to the question from a set of sampler LMs under
   seven prompt variations (identity, zero-shot CoT, long answer; rephrase, expand-before, expand-after,
   break-down, the last four written by the configured LM). Sample ``i`` uses variant ``i mod |V|`` and
   model ``i mod |M|`` of orders shuffled once with ``seed`` (:func:`round_robin`). Samples run in
   parallel; a failing sample is dropped and counted in ``failures["sampler"]``.
2. **Segmentation** of the answer into blocks (:func:`halluscope.text.segment`, pysbd, offsets kept).
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

Sampler specs (:func:`sampler_lm`)
----------------------------------
A sampler is a ``dspy.LM``, or a string ``"<lm spec>?key=value&key=value"`` where ``<lm spec>`` is anything
:func:`halluscope.lm.make_lm` accepts (``local``, ``openai/gpt-4o-mini``, ``hosted_vllm/...``) or ``self``
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

import random
from collections import Counter
from dataclasses import asdict, dataclass
from typing import Any, Callable, Iterable, Mapping, Sequence
from urllib.parse import parse_qsl

import dspy

from halluscope.contract import Detection, Span, Unit, to_prediction
from halluscope.lm import make_lm
from halluscope.parallel import try_map
from halluscope.redact import error_text
from halluscope.text import segment
from halluscope.programs.registry import ProgramSpec, free, number, register, text, whole
from halluscope.signatures.finch import (
    BreakDown,
    CorrectBlock,
    ErrorSummary,
    ExpandAfter,
    ExpandBefore,
    JudgeBlock,
    JudgeBlockDecision,
    JudgeBlocks,
    Reflect,
    Rephrase,
    SampleAnswer,
    Verdict,
    parse_rating,
)

__all__ = [
    "VARIANTS",
    "STATIC_VARIANTS",
    "LM_VARIANTS",
    "RATING_WEIGHTS",
    "RATING_SCORES",
    "NO_VOTE_SCORE",
    "DEFAULT_TAU",
    "DEFAULT_SAMPLERS",
    "round_robin",
    "block_score",
    "block_label",
    "response_score",
    "response_label",
    "reconstruct",
    "number_blocks",
    "representatives",
    "parse_sampler_spec",
    "sampler_lm",
    "Sample",
    "Sampler",
    "FinchZK",
]

# -- constants ----------------------------------------------------------------------------------------

VARIANTS = ("identity", "cot", "long", "rephrase", "expand_before", "expand_after", "break_down")
STATIC_VARIANTS = {
    "identity": "{question}",
    "cot": "{question}\n\nLet's think step by step, then state the answer.",
    "long": "{question}\n\nGive a long, detailed answer that includes all the relevant facts.",
}
LM_VARIANTS = ("rephrase", "expand_before", "expand_after", "break_down")

RATING_WEIGHTS = {"contradiction": 4.0, "accurate": 2.0, "neutral": 1.0, "unknown": 0.0}
RATING_SCORES = {"contradiction": 1.0, "accurate": 0.0, "neutral": 0.5, "unknown": 0.0}
NO_VOTE_SCORE = 0.5  # a block without a single known rating: no evidence either way, i.e. neutral
DEFAULT_TAU = 0.33
_EPS = 1e-9  # thresholds are inclusive up to float rounding: 1 - 0.33 is 0.6699999999999999

DEFAULT_SAMPLERS = (
    "self?temperature=0.7&seed=1",
    "self?temperature=1.0&seed=2",
    "self?temperature=0.7&seed=3",
    "self?temperature=1.0&seed=4",
)

# -- deterministic parts ------------------------------------------------------------------------------


def round_robin(variants: Sequence, models: Sequence, n: int, seed: int = 0) -> list[tuple[Any, Any]]:
    """The paper's assignment of ``n`` samples to (variant, model) pairs.

    One ``random.Random(seed)`` shuffles a copy of ``variants``, then a copy of ``models``; sample ``i``
    gets ``(variants[i % |V|], models[i % |M|])`` of the shuffled orders.
    """
    if n < 0:
        raise ValueError(f"n must be >= 0, got {n}")
    if n and (not variants or not models):
        raise ValueError("round_robin needs at least one variant and one model")
    rng = random.Random(seed)
    v, m = list(variants), list(models)
    rng.shuffle(v)
    rng.shuffle(m)
    return [(v[i % len(v)], m[i % len(m)]) for i in range(n)]


def block_score(ratings: Iterable[str]) -> float:
    """Weighted mean of the rating scores (contradiction 1, accurate 0, neutral 0.5) with weights 4/2/1.

    Ratings go through :func:`signatures.finch.parse_rating`; unknown ones have weight 0. A block with no
    known rating (none, or all unknown) scores :data:`NO_VOTE_SCORE` (0.5, i.e. neutral).
    """
    total = weighted = 0.0
    for r in ratings:
        label = parse_rating(r)
        w = RATING_WEIGHTS[label]
        total += w
        weighted += w * RATING_SCORES[label]
    return weighted / total if total else NO_VOTE_SCORE


def block_label(score: float, tau: float = DEFAULT_TAU) -> str:
    """``"accurate"`` if ``score <= tau``, ``"contradiction"`` if ``score >= 1 - tau``, else ``"neutral"``.

    Both thresholds are inclusive (with a 1e-9 tolerance for float rounding). ``tau`` must be in [0, 0.5).
    """
    if not 0.0 <= tau < 0.5:
        raise ValueError(f"tau must be in [0, 0.5), got {tau}")
    if score <= tau + _EPS:
        return "accurate"
    if score >= 1.0 - tau - _EPS:
        return "contradiction"
    return "neutral"


def response_score(block_scores: Sequence[float]) -> float:
    """Mean block score; 0.0 when there is no block."""
    return sum(block_scores) / len(block_scores) if block_scores else 0.0


def response_label(block_labels: Iterable[str]) -> bool:
    """Non-factual (True) when any block is a contradiction."""
    return any(lab == "contradiction" for lab in block_labels)


def _bounds(b: Any) -> tuple[int, int]:
    if hasattr(b, "start") and hasattr(b, "end"):
        return int(b.start), int(b.end)
    return int(b[0]), int(b[1])


def reconstruct(answer: str, blocks: Sequence, replacements: Mapping[int, str]) -> str:
    """``answer`` with ``blocks[i]`` replaced by ``replacements[i]``; every other character unchanged.

    ``blocks`` are objects with ``start``/``end`` (e.g. :class:`halluscope.text.Segment`) or pairs, sorted
    and non-overlapping, within ``answer``. Raises ``ValueError`` otherwise or for an unknown index.
    """
    spans = [_bounds(b) for b in blocks]
    prev = 0
    for s, e in spans:
        if s < prev or e < s or e > len(answer):
            raise ValueError(f"blocks must be sorted, non-overlapping and inside the answer: {spans}")
        prev = e
    bad = [i for i in replacements if not 0 <= i < len(spans)]
    if bad:
        raise ValueError(f"replacement for unknown block index {bad}")
    out, cursor = [], 0
    for i, (s, e) in enumerate(spans):
        if i in replacements:
            out.append(answer[cursor:s])
            out.append(replacements[i])
            cursor = e
    out.append(answer[cursor:])
    return "".join(out)


def number_blocks(texts: Sequence[str]) -> str:
    """The batch judge's view of the blocks: ``[1] first\\n[2] second ...`` (newlines inside a block flattened)."""
    return "\n".join(f"[{i}] {' '.join(t.split())}" for i, t in enumerate(texts, 1))


def representatives(samples: Sequence["Sample"], k: int) -> list["Sample"]:
    """Up to ``k`` samples for reflection: the first sample of each distinct model (cross-model evidence),
    then the remaining samples, in sample order."""
    chosen, seen = [], set()
    for s in samples:
        if s.model not in seen:
            seen.add(s.model)
            chosen.append(s)
    chosen += [s for s in samples if s not in chosen]
    return chosen[: max(0, k)]


# -- sampler LMs --------------------------------------------------------------------------------------


def _convert(value: str) -> Any:
    low = value.strip().lower()
    if low in ("true", "false"):
        return low == "true"
    if low in ("none", "null"):
        return None
    for cast in (int, float):
        try:
            return cast(value)
        except ValueError:
            pass
    return value


def parse_sampler_spec(spec: str) -> tuple[str, dict]:
    """``"local?temperature=0.7&seed=1"`` -> ``("local", {"temperature": 0.7, "seed": 1})``."""
    name, _, query = str(spec).strip().partition("?")
    return name.strip(), {k: _convert(v) for k, v in parse_qsl(query, keep_blank_values=True)}


def sampler_lm(spec: Any, base: dspy.BaseLM | None = None) -> dspy.BaseLM:
    """The LM for one sampler spec (see the module docstring). ``self`` specs copy ``base`` (default: the
    configured ``dspy.settings.lm``); other specs are built by :func:`halluscope.lm.make_lm`."""
    if isinstance(spec, dspy.BaseLM):
        return spec
    if isinstance(spec, Mapping):
        options = dict(spec)
        name = str(options.pop("lm", "self"))
    else:
        name, options = parse_sampler_spec(spec)
    if name in ("", "self"):
        base = base if base is not None else dspy.settings.lm
        if base is None:
            raise RuntimeError("sampler spec 'self' needs a configured LM (dspy.configure(lm=...))")
        return base.copy(**options) if options else base
    return make_lm(name, **options)


def _spec_name(spec: Any) -> str:
    if isinstance(spec, dspy.BaseLM):
        return f"{spec.model}?{'&'.join(f'{k}={v}' for k, v in sorted(spec.kwargs.items()) if k in ('temperature', 'seed'))}"
    return str(spec) if not isinstance(spec, Mapping) else "&".join(f"{k}={v}" for k, v in spec.items())


# -- sampling -----------------------------------------------------------------------------------------


@dataclass
class Sample:
    """One sampled answer: its round-robin index, prompt variant, sampler and text."""

    index: int
    variant: str
    model: str
    prompt: str
    answer: str

    def to_dict(self) -> dict:
        return asdict(self)


class Sampler(dspy.Module):
    """``n_samples`` answers from ``samplers`` (LM specs) under the seven prompt variations.

    The LM-written variations (rephrase, expand-before, expand-after, break-down) are made once per item by
    the configured LM, only for the variants the plan uses; one that fails falls back to the question
    itself (``failures["variant"]``). Each sample is made under ``dspy.context(lm=<its sampler LM>)``; a
    sample whose LM cannot be built, whose call fails or whose answer is blank is dropped
    (``failures["sampler"]``). When a (variant, sampler) pair repeats, the repeat gets a ``rollout_id`` so
    the cache does not hand back the same answer.
    """

    def __init__(
        self,
        samplers: Sequence = DEFAULT_SAMPLERS,
        n_samples: int = 10,
        seed: int = 0,
        variants: Sequence[str] = VARIANTS,
        num_threads: int = 4,
        max_tokens: int | None = None,
        variant_max_tokens: int | None = None,
    ):
        super().__init__()
        unknown = [v for v in variants if v not in VARIANTS]
        if unknown or not variants:
            raise ValueError(f"unknown or no prompt variants {unknown}; choose from {VARIANTS}")
        if not samplers:
            raise ValueError("at least one sampler LM spec is required")
        self.samplers = list(samplers)
        self.n_samples = int(n_samples)
        self.seed = seed
        self.variants = tuple(variants)
        self.num_threads = num_threads
        self.max_tokens = max_tokens
        self.variant_max_tokens = variant_max_tokens
        self.rephrase = dspy.Predict(Rephrase)
        self.expand_before = dspy.Predict(ExpandBefore)
        self.expand_after = dspy.Predict(ExpandAfter)
        self.break_down = dspy.Predict(BreakDown)
        self.answer = dspy.Predict(SampleAnswer)

    def plan(self) -> list[tuple[str, int]]:
        """``(variant, sampler index)`` for each sample (:func:`round_robin`)."""
        return round_robin(self.variants, range(len(self.samplers)), self.n_samples, self.seed)

    @staticmethod
    def _config(max_tokens: int | None, **extra) -> dict:
        return {**({"max_tokens": max_tokens} if max_tokens else {}), **extra}

    def _variant_prompt(self, variant: str, question: str) -> str:
        cfg = self._config(self.variant_max_tokens)
        if variant == "rephrase":
            text = self.rephrase(question=question, config=cfg).rephrased_question
            return (text or "").strip()
        if variant == "expand_before":
            text = (self.expand_before(question=question, config=cfg).background or "").strip()
            return f"{text}\n\n{question}" if text else ""
        if variant == "expand_after":
            text = (self.expand_after(question=question, config=cfg).details or "").strip()
            return f"{question}\n\n{text}" if text else ""
        if variant == "break_down":
            subs = [str(s).strip() for s in (self.break_down(question=question, config=cfg).sub_questions or [])]
            subs = [s for s in subs if s]
            if not subs:
                return ""
            return question + "\n\nFirst answer these sub-questions, then the question:\n" + "\n".join(
                f"- {s}" for s in subs)
        raise ValueError(variant)

    def forward(self, question: str, context: str = "") -> dspy.Prediction:
        failures, calls, errors = Counter(), Counter(), []
        plan = self.plan()
        prompts = {v: STATIC_VARIANTS[v].format(question=question) for v in STATIC_VARIANTS}
        needed = sorted({v for v, _ in plan if v in LM_VARIANTS}, key=VARIANTS.index)
        calls["variants"] += len(needed)
        for v, (ok, out) in zip(needed, try_map(lambda v: self._variant_prompt(v, question), needed,
                                                threads=self.num_threads)):
            if ok and out:
                prompts[v] = out
            else:
                prompts[v] = question
                failures["variant"] += 1
                errors.append(f"variant {v}: " + (error_text(out) if not ok else "empty"))
        prefix = f"Context:\n{context.strip()}\n\n" if context and context.strip() else ""

        lms: dict[int, Any] = {}
        for m in sorted({m for _, m in plan}):
            try:
                lms[m] = sampler_lm(self.samplers[m])
            except Exception as e:  # noqa: BLE001 - a sampler that cannot be built is a failed sampler
                lms[m] = e
        seen: Counter = Counter()
        jobs = []
        for i, (v, m) in enumerate(plan):
            repeat = seen[(v, m)]
            seen[(v, m)] += 1
            jobs.append((i, v, m, repeat))

        def run(job):
            i, v, m, repeat = job
            lm = lms[m]
            if isinstance(lm, Exception):
                raise lm
            extra = {"rollout_id": repeat} if repeat else {}
            with dspy.context(lm=lm):
                out = self.answer(request=prefix + prompts[v], config=self._config(self.max_tokens, **extra))
            text = (out.answer or "").strip()
            if not text:
                raise ValueError("blank sample")
            return Sample(i, v, _spec_name(self.samplers[m]), prefix + prompts[v], text)

        samples = []
        calls["samples"] += sum(1 for _, _, m, _ in jobs if not isinstance(lms[m], Exception))
        for job, (ok, out) in zip(jobs, try_map(run, jobs, threads=self.num_threads)):
            if ok:
                samples.append(out)
            else:
                failures["sampler"] += 1
                errors.append(f"sample {job[0]} ({_spec_name(self.samplers[job[2]])}): {error_text(out)}")
        return dspy.Prediction(samples=samples, failures=failures, calls=calls, errors=errors)


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
    ):
        super().__init__()
        if isinstance(samplers, str):
            samplers = [s.strip() for s in samplers.split(",") if s.strip()]
        tau = float(tau)
        block_label(0.0, tau)  # validates tau
        self.n_samples = int(n_samples)
        self.decisions = _as_bool(decisions)
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

            def one(pair):
                b, s = pair
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


register(ProgramSpec(
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
        **{f"{stage}_max_tokens": whole(1, nullable=True) for stage in ("sample", "variant", "judge", "correct")},
    },
))
