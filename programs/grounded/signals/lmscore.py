"""Signal 2: the embedded LM as a scorer, not a generator.

For each answer token the log-probability given *evidence + question + answer prefix* and given *question +
answer prefix* alone is read from one prompt evaluation each (no generation). Their difference says how much
the evidence supports the token: a token the evidence makes likelier (a name copied from it) gets a positive
``delta``; a token the evidence does not help with gets about 0; one that contradicts it may go negative.
Per unit (:mod:`.units`): ``lm_delta`` = the mean delta of the tokens overlapping the unit, ``lm_lp`` = their mean
log-probability without the evidence (how predictable the word is anyway), ``lm_missing`` = 0; a unit no token
covers gets the fallback (0, 0, 1).

Only the evidence sentences most relevant to the answer go into the prompt (:func:`select_evidence`: sentences
ranked by the answer's content units they contain, up to ``max_evidence_tokens``), because the embedded
model evaluates prompts at roughly 150-300 tokens/s on 2 cores. ``max_item_tokens`` bounds the cost of an item
(both passes together, default 640: under 3 s at 230 tokens/s): when the question and two passes over the answer
leave less room, the evidence shrinks first (to no less than a quarter of the room), then only the answer's first
tokens are scored and the units after them get the fallback (:func:`plan_budget`; counted as ``lm_answer_cut``).
This matters for answers in scripts that SmolLM2's byte-level tokenizer splits finely: a Chinese answer of ~250
characters is ~650 tokens.

The model sits behind a small :class:`Backend` (tokenize, detokenize, log-probabilities of a token sequence),
so tests use a deterministic stub; :class:`LlamaBackend` runs any local GGUF through llama-cpp-python with
``logits_all=True``. Remote servers that return prompt log-probabilities (``echo`` + ``logprobs`` on the
completions endpoint: vLLM, llama.cpp's ``llama-server`` with ``n_probs``, text-generation-inference with
``decoder_input_details``) could serve the same interface; only the local backend is implemented here.

Results are cached on disk (one JSON file per item, keyed by the model file's hash and the prompts), so a
benchmark or a refit does not evaluate the same item twice.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import threading
import time
from pathlib import Path
from typing import Protocol

import numpy as np

from halluscope.core import paths
from halluscope.core.fileio import file_sha256
from halluscope.lm.llamacpp import check_gguf, load_llama
from halluscope.lm.models import smollm2_path
from halluscope.programs.grounded.signals.base import Signal, register_signal, window_mean
from halluscope.programs.grounded.units import AnswerUnit, tokens_of, units_of
from halluscope.programs.registry import text as text_option, whole
from halluscope.core.text import segment

__all__ = ["Backend", "LlamaBackend", "LMScorer", "plan_budget", "select_evidence", "evidence_in_tokens", "token_char_offsets",
           "unit_rows", "lm_prompt", "LMSignal", "LM"]

logger = logging.getLogger(__name__)

FALLBACK = {"lm_delta": 0.0, "lm_lp": 0.0, "lm_missing": 1.0}


def lm_prompt(question: str, evidence: str | None = None) -> str:
    """The one prompt the embedded LM reads an answer after (this scorer, with and without the evidence, and the
    hidden-state scorer of :mod:`.hidden`): ``Evidence: …\nQuestion: …\nAnswer:``, or without ``evidence``
    (None) ``Question: …\nAnswer:``; the answer's tokens follow after a space."""
    if evidence is None:
        return f"Question: {question}\nAnswer:"
    return f"Evidence: {evidence}\nQuestion: {question}\nAnswer:"


class Backend(Protocol):
    """What the scorer needs from a model."""

    name: str  # identifies the model in cache keys (e.g. the GGUF file's hash)

    def tokenize(self, text: str) -> list[int]: ...

    def detokenize(self, tokens: list[int]) -> bytes: ...

    def logprobs(self, tokens: list[int], start: int) -> list[float]:
        """``log p(tokens[i] | tokens[:i])`` for every ``i >= start``."""
        ...


class LlamaBackend:
    """A local GGUF through llama-cpp-python (``logits_all=True``: one forward pass gives every position's
    logits). Default: the embedded SmolLM2-135M-Instruct."""

    def __init__(self, model_path: str | os.PathLike | None = None, n_ctx: int = 2048, n_threads: int | None = None):
        # llama_cpp and the model file are heavy: loaded only when the LM signal is switched on.
        path = check_gguf(model_path if model_path else smollm2_path())  # missing: a FileNotFoundError
        self.name = f"{path.name}@{file_sha256(path)[:12]}"
        self.n_ctx = n_ctx
        self.llm = load_llama(path, n_ctx=n_ctx, n_threads=n_threads or max(1, os.cpu_count() or 1),
                              logits_all=True, seed=0)
        self._lock = threading.Lock()
        self.tokens_evaluated = 0

    def tokenize(self, text: str) -> list[int]:
        return self.llm.tokenize(text.encode("utf-8"), add_bos=False, special=False)

    def detokenize(self, tokens: list[int]) -> bytes:
        return self.llm.detokenize(tokens)

    def logprobs(self, tokens: list[int], start: int) -> list[float]:
        if len(tokens) > self.n_ctx:  # keep the end (the answer); the prompt's beginning goes
            start = max(1, start - (len(tokens) - self.n_ctx))
            tokens = list(tokens)[-self.n_ctx:]
        tokens = list(tokens)
        start = max(1, start)
        if start >= len(tokens):
            return []
        with self._lock:
            self.llm.reset()
            self.llm.eval(tokens)
            self.tokens_evaluated += len(tokens)
            # only the rows that predict tokens[start:], read before the next call reuses the buffer
            return token_logprobs_from_rows(self.llm.scores[start - 1:len(tokens) - 1], tokens[start:])


def token_logprobs_from_rows(rows: np.ndarray, targets: list[int]) -> list[float]:
    """log softmax(rows[i])[targets[i]] for each row: the log-probability the model gave each next token.

    Works in float32 on a private copy (the logits are float32 anyway; the sums are float64): for a Chinese answer of
    ~650 tokens over SmolLM2's 49,152-token vocabulary that is 0.06 s instead of 1.1 s in float64, and agrees with it
    to 1e-6."""
    if len(targets) == 0:
        return []
    rows = np.array(rows, dtype=np.float32)  # a copy: the exponentials are written into it
    m = rows.max(axis=1, keepdims=True)
    picked = rows[np.arange(len(targets)), np.asarray(targets)] - m[:, 0]
    np.subtract(rows, m, out=rows)
    np.exp(rows, out=rows)
    lse = np.log(rows.sum(axis=1, dtype=np.float64))
    return [float(x) for x in picked.astype(np.float64) - lse]


def plan_budget(max_item_tokens: int, max_evidence_tokens: int, question_tokens: int, evidence_overhead: int,
                answer_tokens: int) -> tuple[int, int]:
    """``(evidence tokens, answer tokens to score)`` so that both passes, ``(evidence_overhead + evidence +
    question + answer) + (question + answer)``, fit in ``max_item_tokens`` (0 = no bound). The evidence gives way
    first, down to a quarter of the room the question leaves; then the answer is cut."""
    max_evidence_tokens, answer_tokens = max(0, max_evidence_tokens), max(0, answer_tokens)
    if max_item_tokens <= 0:
        return max_evidence_tokens, answer_tokens
    room = max_item_tokens - 2 * question_tokens - evidence_overhead
    if room <= 0:
        return 0, 0
    evidence = max(min(max_evidence_tokens, room // 4), min(max_evidence_tokens, room - 2 * answer_tokens))
    return evidence, min(answer_tokens, (room - evidence) // 2)


def select_evidence(answer: str, context: str, budget_chars: int, lang: str = "en") -> str:
    """The context sentences sharing the most content units (4+ characters or digits, CJK characters) with
    the answer, kept in their original order, until ``budget_chars`` characters are used."""
    if not context.strip() or budget_chars <= 0:
        return ""
    wanted = {t for t in tokens_of(answer) if len(t) >= 4 or t.isdigit() or not t.isascii()}
    sents = segment(context, lang) or []
    scored = []
    for k, s in enumerate(sents):
        toks = set(tokens_of(s.text))
        scored.append((-len(wanted & toks), k, s.text))
    chosen, used = [], 0
    for neg, k, text in sorted(scored):
        if neg == 0 and chosen:
            break
        if used + len(text) > budget_chars:
            if not chosen:  # one sentence longer than the budget: its beginning
                chosen.append((k, text[:budget_chars]))
            continue
        chosen.append((k, text))
        used += len(text) + 1
    return " ".join(t for _, t in sorted(chosen))


def evidence_in_tokens(backend, answer: str, context: str, budget: int, lang: str = "en") -> str:
    """:func:`select_evidence` within ``budget`` *tokens* of ``backend`` (anything with ``tokenize`` /
    ``detokenize``): the character budget comes from this context's own characters per token (a Chinese character
    is two or three tokens for SmolLM2's tokenizer, an English word about one), and the selection is cut to the
    token budget exactly."""
    sample = context[:2000]
    per_token = len(sample) / max(1, len(backend.tokenize(sample)))
    evidence = select_evidence(answer, context, int(budget * per_token), lang)
    toks = backend.tokenize(evidence)
    if len(toks) > budget:
        evidence = backend.detokenize(toks[:budget]).decode("utf-8", "ignore")
    return evidence


def token_char_offsets(answer: str, pieces: list[bytes]) -> list[tuple[int, int] | None]:
    """Character offsets of consecutive token byte ``pieces`` in ``answer`` (None where they stop matching)."""
    data = answer.encode("utf-8")
    char_of_byte = []
    for ci, ch in enumerate(answer):
        char_of_byte.extend([ci] * len(ch.encode("utf-8")))
    out, pos = [], 0
    for b in pieces:
        i = data.find(b, pos, pos + len(b) + 8) if b else -1  # a few bytes of slack, as the logits baseline
        if i == -1:
            out.append(None)
            continue
        out.append((char_of_byte[i], char_of_byte[i + len(b) - 1] + 1))
        pos = i + len(b)
    return out


def unit_rows(units: list[AnswerUnit], offsets, with_ev: list[float], without: list[float]) -> list[dict]:
    """Per-unit features from per-token log-probabilities (see the module docstring)."""
    rows = []
    for u in units:
        d, lp = [], []
        for o, a, b in zip(offsets, with_ev, without):
            if o is not None and o[0] < u.end and o[1] > u.start:
                d.append(a - b)
                lp.append(b)
        if d:
            rows.append({"lm_delta": float(np.clip(np.mean(d), -10, 10)), "lm_lp": float(np.clip(np.mean(lp), -20, 0)),
                         "lm_missing": 0.0})
        else:
            rows.append(dict(FALLBACK))
    return rows


class LMScorer:
    """Per-unit LM features of an item, cached on disk. ``backend`` defaults to :class:`LlamaBackend`."""

    def __init__(self, model_path: str | None = None, cache_dir: str | os.PathLike | None = None,
                 max_evidence_tokens: int = 300, backend: Backend | None = None, max_item_tokens: int = 640):
        self._model_path = model_path
        self._backend = backend
        self.cache_dir = Path(cache_dir) if cache_dir else paths.cache_dir() / "grounded-lm"
        self.max_evidence_tokens = int(max_evidence_tokens)
        self.max_item_tokens = int(max_item_tokens)
        self.answers_cut = 0  # evaluated items whose answer was longer than the budget
        self.calls = 0  # items actually evaluated (cache misses)
        self.cache_hits = 0
        self.tokens = 0  # tokens evaluated by the model
        self.seconds = 0.0  # wall time of the evaluations (cache misses; model loading excluded)

    @property
    def backend(self) -> Backend:
        if self._backend is None:
            # a pass never exceeds the item budget: a context that size keeps llama.cpp's per-position logits
            # (n_ctx x 49,152 floats, twice) small
            n_ctx = 2048 if self.max_item_tokens <= 0 else min(2048, max(256, self.max_item_tokens))
            self._backend = LlamaBackend(self._model_path, n_ctx=n_ctx)
        return self._backend

    def _key(self, name: str, *parts: str) -> str:
        h = hashlib.sha256(json.dumps([name, self.max_evidence_tokens, self.max_item_tokens, *parts])
                           .encode("utf-8")).hexdigest()
        return h[:40]

    def evidence_for(self, answer: str, context: str, lang: str = "en", budget: int | None = None) -> str:
        """The evidence sentences most relevant to the answer within ``max_evidence_tokens`` *tokens*: the
        character budget comes from this context's own characters per token (a Chinese character is two or
        three tokens for SmolLM2's tokenizer, an English word about one), and the selection is cut to the
        token budget exactly. ``budget`` (tokens) defaults to ``max_evidence_tokens``."""
        budget = self.max_evidence_tokens if budget is None else min(int(budget), self.max_evidence_tokens)
        if not context.strip() or budget <= 0:
            return ""
        return evidence_in_tokens(self.backend, answer, context, budget, lang)

    def token_logprobs(self, question: str, answer: str, context: str, lang: str = "en") -> dict:
        """``{"pieces": [hex bytes], "with": [...], "without": [...], "tokens": n, "answer_tokens_cut": k}`` for
        the answer's scored tokens (all of them, or the first ones when the item budget cuts ``k``)."""
        be = self.backend  # loads the model on first use: not counted in ``seconds``
        t0 = time.perf_counter()
        ans = be.tokenize(" " + answer)  # the prompt ends with "Answer:"; the answer follows after a space
        pre_without = be.tokenize(lm_prompt(question))
        q_len = len(pre_without)
        overhead = len(be.tokenize(lm_prompt(question, ""))) - q_len
        ev_budget, n_ans = plan_budget(self.max_item_tokens, self.max_evidence_tokens, q_len, overhead, len(ans))
        evidence = self.evidence_for(answer, context, lang, budget=ev_budget)
        key = self._key(be.name, question, answer, evidence)
        path = self.cache_dir / key[:2] / f"{key}.json"
        try:
            cached = json.loads(path.read_text(encoding="utf-8"))
            self.cache_hits += 1
            return cached
        except (OSError, ValueError):
            pass
        cut, ans = len(ans) - n_ans, ans[:n_ans]
        out = {"pieces": [be.detokenize([t]).hex() for t in ans], "tokens": 0, "evidence_chars": len(evidence),
               "answer_tokens_cut": cut}
        for name, pre in (("with", be.tokenize(lm_prompt(question, evidence))),
                          ("without", pre_without)):
            lps = be.logprobs(pre + ans, len(pre))
            out[name] = [float(x) for x in lps[-len(ans):]] if ans else []
            out["tokens"] += len(pre) + len(ans)
        self.calls += 1
        self.answers_cut += cut > 0
        self.tokens += out["tokens"]
        self.seconds += time.perf_counter() - t0
        try:
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text(json.dumps(out), encoding="utf-8")
        except OSError as e:  # a read-only cache is not an error for the item
            logger.warning("grounded: could not write the LM cache %s: %s", path, e)
        return out

    def unit_features(self, question: str, answer: str, context: str, units: list[AnswerUnit],
                      lang: str = "en", info: dict | None = None) -> list[dict]:
        """One row per unit; ``info``, when given, receives ``answer_tokens_cut`` (0 unless the budget cut it)."""
        res = self.token_logprobs(question or "", answer, context or "", lang)
        if info is not None:
            info["answer_tokens_cut"] = int(res.get("answer_tokens_cut", 0))
        pieces = [bytes.fromhex(p) for p in res["pieces"]]
        offsets = token_char_offsets(" " + answer, pieces)  # shifted back by the leading space
        offsets = [None if o is None or o[1] <= 1 else (max(0, o[0] - 1), o[1] - 1) for o in offsets]
        n = min(len(offsets), len(res["with"]), len(res["without"]))
        return unit_rows(units, offsets[:n], res["with"][:n], res["without"][:n])


# -- the signal ---------------------------------------------------------------------------------------

LM = ("lm_delta", "lm_lp", "win_lm_delta", "lm_missing")


@register_signal
class LMSignal(Signal):
    """The embedded LM as a scorer (cost lm; opt-in, ``-O lm=true``): each unit's tokens' log-probability with vs.
    without the evidence (``lm_delta``, its window mean), without it (``lm_lp``), and ``lm_missing``. About 1-3 s
    per item on 2 cores (bounded by ``item_tokens``), cached on disk. BENCHMARKS.md measured it as a wash on
    SmolLM2-135M (IoU −0.003, Corr +0.004 over six languages). The model missing or failing: ``lm_missing``
    (``lm_error``), the columns imputed; an answer cut by the budget counts ``lm_answer_cut``."""

    name, columns, cost, order = "lm", LM, "lm", 60
    option_types = {"model": text_option(what="a GGUF file path, or \"\" for the embedded model"), "cache_dir": text_option(),
                    "evidence_tokens": whole(0), "item_tokens": whole(0)}
    missing = frozenset({"lm_missing", "lm_error"})
    weights = {"lm_delta": -0.3}

    @classmethod
    def defaults(cls) -> dict:
        return {"model": "", "cache_dir": "", "evidence_tokens": 300, "item_tokens": 640}

    def __init__(self, **options):
        super().__init__(**options)
        self._scorer = None

    def scorer(self) -> LMScorer:
        """The scorer (the model file is loaded on its first item)."""
        if self._scorer is None:
            o = self.options
            self._scorer = LMScorer(model_path=o["model"] or None, cache_dir=o["cache_dir"] or None,
                                    max_evidence_tokens=o["evidence_tokens"], max_item_tokens=o["item_tokens"])
        return self._scorer

    def run(self, item) -> None:
        st = item.state["lm"] = {"rows": None, "error": None, "info": {}, "ran": True}
        if item.answer.strip():
            try:
                st["rows"] = self.scorer().unit_features(item.question or "", item.answer, item.raw_context or "",
                                                         units_of(item.answer), lang=item.lang or "en",
                                                         info=st["info"])
            except Exception as e:  # noqa: BLE001 — the LM signal falls back, the item goes on
                st["error"] = f"lm_error:{type(e).__name__}"

    def compute(self, item) -> dict[str, list[float]]:
        n = len(item.units)
        rows = (item.state.get("lm") or {}).get("rows")
        if rows is None or len(rows) != n:
            rows = [FALLBACK] * n
        else:
            item.used.append("lm")
        cols = {k: [float(r[k]) for r in rows] for k in ("lm_delta", "lm_lp", "lm_missing")}
        cols["win_lm_delta"] = window_mean(cols["lm_delta"], item.window)
        return cols

    def late_failures(self, item) -> dict[str, int]:
        st = item.state.get("lm") or {}
        return {"lm_missing": int(st.get("rows") is None and bool(item.answer.strip())),
                "lm_error": int(bool(st.get("error"))),
                "lm_answer_cut": int(bool(st.get("info", {}).get("answer_tokens_cut")))}
