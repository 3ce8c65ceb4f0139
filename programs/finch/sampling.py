"""FINCH-ZK's sampling: the prompt variations (:data:`VARIANTS`), the round-robin plan of variants and sampler
models (:func:`round_robin`), the sampler LMs built from specs (:func:`sampler_lm`, see :mod:`.program` for the
spec format), the samples (:class:`Sampler`) and the representatives chosen for reflection
(:func:`representatives`)."""

from __future__ import annotations

import random
from collections import Counter
from dataclasses import asdict, dataclass
from typing import Any, Mapping, Sequence
from urllib.parse import parse_qsl

import dspy

from halluscope.core.parallel import try_map
from halluscope.core.redact import error_text
from halluscope.lm.models import make_lm
from halluscope.signatures.finch import BreakDown, ExpandAfter, ExpandBefore, Rephrase, SampleAnswer

__all__ = ["VARIANTS", "STATIC_VARIANTS", "LM_VARIANTS", "DEFAULT_SAMPLERS", "round_robin", "representatives",
           "parse_sampler_spec", "sampler_lm", "Sample", "Sampler"]

VARIANTS = ("identity", "cot", "long", "rephrase", "expand_before", "expand_after", "break_down")
STATIC_VARIANTS = {
    "identity": "{question}",
    "cot": "{question}\n\nLet's think step by step, then state the answer.",
    "long": "{question}\n\nGive a long, detailed answer that includes all the relevant facts.",
}
LM_VARIANTS = ("rephrase", "expand_before", "expand_after", "break_down")

DEFAULT_SAMPLERS = (
    "self?temperature=0.7&seed=1",
    "self?temperature=1.0&seed=2",
    "self?temperature=0.7&seed=3",
    "self?temperature=1.0&seed=4",
)


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
    configured ``dspy.settings.lm``); other specs are built by :func:`halluscope.lm.models.make_lm`."""
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
