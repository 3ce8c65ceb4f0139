"""Signal 3: the generating model's own token logits (Mu-SHROOM ``model_output_tokens``/``model_output_logits``).

Tokens are aligned with the answer's characters by :func:`halluscope.programs.baselines.program.token_offsets`; each
token's logit becomes a z-score within the answer (``(mean - logit) / sd``: positive = less sure than the
model's average token). A unit gets

* ``gen_low``: the largest such score of the tokens overlapping it (its least confident piece),
* ``gen_first``: the score of the token where the unit starts (where the model chose the word),

both clipped to [-4, 4]. The lists are read as the ``logits`` baseline reads them
(:func:`halluscope.programs.baselines.program.token_logit_lists`): a list or a string holding one as JSON or as a Python
repr (the official Catalan file); lists of different lengths aligned on their common prefix (``"logit_length_mismatch"``);
a logit that is not a finite number leaves its token out (``"nonfinite_logits"``, how many). When the data
carries no logits (``"no_logits"``), tokens or logits that are neither lists nor strings holding lists
(``"malformed_logits"``), lists too different in length to be the same tokens (``"logits_length"``), or no
token can be aligned (``"unaligned_tokens"``), every unit gets 0 and ``gen_missing`` = 1, and the caller counts
the failure. Units that no aligned token covers (tokens past a truncated answer) get the same fallback and are
counted as ``"unaligned_units"``.
"""

from __future__ import annotations

import math

from halluscope.programs.baselines.program import token_logit_lists, token_offsets
from halluscope.programs.grounded.signals.base import Signal, register_signal, window_mean
from halluscope.programs.grounded.units import AnswerUnit

__all__ = ["GEN_FEATURES", "GEN", "gen_features", "GenLogitsSignal", "ITEM_LEVEL_FAILURES"]

GEN_FEATURES = ("gen_low", "gen_first", "gen_missing")


def _clip(x: float, lo: float = -4.0, hi: float = 4.0) -> float:
    return lo if x < lo else hi if x > hi else x


def _plain(value):
    """An array (numpy, from a columnar input) as a list; anything else as it is."""
    return value.tolist() if hasattr(value, "tolist") and not isinstance(value, (str, bytes)) else value


def gen_features(answer: str, units: list[AnswerUnit], tokens, logits) -> tuple[list[dict[str, float]], dict[str, int]]:
    """``(features per unit, failures)``; failures is ``{}`` or counts such as ``{"no_logits": 1}`` (see the
    module docstring); on an item-level failure every unit has the fallback features."""
    fallback = [{"gen_low": 0.0, "gen_first": 0.0, "gen_missing": 1.0} for _ in units]
    toks, vals, failures = token_logit_lists(_plain(tokens), _plain(logits))
    if not toks:
        return fallback, failures or {"no_logits": 1}
    nonfinite = sum(v is None for v in vals)
    if nonfinite:
        failures["nonfinite_logits"] = nonfinite
    offsets = token_offsets(answer, toks)
    pairs = [(o, v) for o, v in zip(offsets, vals) if o is not None and v is not None]
    if not pairs:
        return fallback, {**failures, "unaligned_tokens": 1}
    xs = [v for _, v in pairs]
    mean = sum(xs) / len(xs)
    sd = math.sqrt(sum((v - mean) ** 2 for v in xs) / len(xs)) or 1.0
    zs = [((s, e), (mean - v) / sd) for (s, e), v in pairs]
    out = []
    unaligned = 0
    j0 = 0
    for u in units:
        low, first = None, None
        while j0 < len(zs) and zs[j0][0][1] <= u.start:  # tokens entirely before the unit
            j0 += 1
        j = j0
        while j < len(zs) and zs[j][0][0] < u.end:
            (s, e), z = zs[j]
            if e > u.start:
                low = z if low is None else max(low, z)
                if first is None:
                    first = z
            j += 1
        if low is None:  # no token covers the unit (e.g. past a truncated token list)
            out.append({"gen_low": 0.0, "gen_first": 0.0, "gen_missing": 1.0})
            unaligned += 1
        else:
            out.append({"gen_low": _clip(low), "gen_first": _clip(first), "gen_missing": 0.0})
    if unaligned:
        failures["unaligned_units"] = unaligned
    return out, failures


# -- the signal ---------------------------------------------------------------------------------------

GEN = GEN_FEATURES + ("win_gen",)
#: failures of :func:`gen_features` that leave the whole item without generator logits
ITEM_LEVEL_FAILURES = frozenset({"no_logits", "malformed_logits", "logits_length", "unaligned_tokens"})


@register_signal
class GenLogitsSignal(Signal):
    """The generating model's token logits (cost none; the data carries them): :data:`GEN_FEATURES` and the window
    mean of ``gen_low``. Plain text without logits: the note ``no_logits``, the columns imputed."""

    name, columns, cost, order = "genlogits", GEN, "none", 50
    missing = ITEM_LEVEL_FAILURES
    notes = frozenset({"no_logits"})
    weights = {"gen_low": 0.2}

    def compute(self, item) -> dict[str, list[float]]:
        g, fails = gen_features(item.answer, item.units, item.tokens, item.logits)
        if not (fails.keys() & ITEM_LEVEL_FAILURES):
            item.used.append("genlogits")
        for k, v in fails.items():
            item.failures[k] = item.failures.get(k, 0) + v
        cols = {k: [f[k] for f in g] for k in GEN_FEATURES}
        cols["win_gen"] = window_mean(cols["gen_low"], item.window)
        return cols
