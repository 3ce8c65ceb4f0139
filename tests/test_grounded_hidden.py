"""#19 item 3: the hidden-state scorer of ``grounded`` (programs/grounded/hidden.py) with a deterministic fake
model, and one ``embedded`` test with the real SmolLM2-135M."""

from __future__ import annotations

import hashlib

import numpy as np
import pytest

from halluscope.programs.grounded.program import build_grounded, fit_grounded
from halluscope.programs.grounded.features import HIDDEN, feature_names, item_features
from halluscope.programs.grounded.signals.hidden import (HiddenScorer, ItemHidden, Probe, RidgeStats, oof_probe_scores, plan_single,
                                                 token_stats, unit_hidden)
from halluscope.programs.grounded.signals.lmscore import token_char_offsets
from halluscope.programs.grounded.units import units_of

from tests.test_grounded import fixture_examples, inputs

D = 8


class FakeBackend:
    """Words (with their leading space) split into pieces of at most 3 characters are the tokens; a token's hidden
    vector is a fixed function of its text, except that dimension 0 is 5.0 for the pieces of a word the evidence in
    the prompt does not contain (so a probe can learn "unsupported" from it); log-probability -len(piece), entropy 1."""

    name = "fake@0"

    def __init__(self):
        self.vocab: dict[bytes, int] = {}
        self.pieces: dict[int, bytes] = {}
        self.forwards = 0

    def tokenize(self, text: str) -> list[int]:
        out, word = [], ""
        for ch in text:
            if ch == " " and word:
                out += self._word(word)
                word = ""
            word += ch
        if word:
            out += self._word(word)
        return out

    def _word(self, w: str) -> list[int]:
        ids = []
        for k in range(0, len(w), 3):
            b = w[k:k + 3].encode("utf-8")
            if b not in self.vocab:
                self.vocab[b] = len(self.vocab) + 1
                self.pieces[self.vocab[b]] = b
            ids.append(self.vocab[b])
        return ids

    def detokenize(self, tokens: list[int]) -> bytes:
        return b"".join(self.pieces[t] for t in tokens)

    def forward(self, tokens, start):
        self.forwards += 1
        prompt = self.detokenize(tokens[:start]).decode()
        evidence = prompt.split("Evidence:", 1)[-1].split("\nQuestion:", 1)[0].lower()
        text = self.detokenize(tokens[start:]).decode()
        H = np.zeros((len(tokens) - start, D), np.float32)
        for i, t in enumerate(tokens[start:]):
            h = hashlib.sha256(self.pieces[t]).digest()
            H[i, 1:] = [b / 255.0 for b in h[:D - 1]]
        # dimension 0: the word the piece belongs to is absent from the evidence
        offs = token_char_offsets(text, [self.pieces[t] for t in tokens[start:]])
        for i, o in enumerate(offs):
            a, b = o
            left = text.rfind(" ", 0, a + 1) + 1
            right = text.find(" ", b)
            w = text[left:right if right >= 0 else len(text)].strip(" .,").lower()
            H[i, 0] = 0.0 if (w and w in evidence) else 5.0
        n = len(tokens) - start
        lp = -np.array([len(self.pieces[t]) for t in tokens[start:]], np.float32)
        return H, lp, np.ones(n, np.float32)


def test_unit_hidden_means_the_tokens_overlapping_each_unit_by_character_offsets():
    answer = "Paris, 1889."
    units = units_of(answer)  # Paris | 1889
    offsets = [(0, 3), (3, 5), (5, 6), None, (7, 11), (11, 12)]
    H = np.arange(12, dtype=np.float32).reshape(6, 2)
    lp = np.array([-1, -3, -9, -9, -2, -9], np.float32)
    ent = np.array([1, 3, 9, 9, 5, 9], np.float32)
    out = unit_hidden(units, offsets, H, lp, ent)
    assert [u.text for u in units] == ["Paris", "1889"]
    np.testing.assert_allclose(out.vectors[0], H[:2].mean(axis=0))  # "Par" + "is"; "," does not overlap
    np.testing.assert_allclose(out.vectors[1], H[4])
    np.testing.assert_allclose(out.lp, [-2.0, -2.0])
    np.testing.assert_allclose(out.ent, [2.0, 5.0])
    assert out.covered.tolist() == [True, True]
    none = unit_hidden(units, [None] * 6, H, lp, ent)  # no token maps: NaN rows, not covered
    assert none.covered.tolist() == [False, False] and np.isnan(none.vectors).all()


def test_plan_single_gives_way_evidence_first_then_the_answer():
    assert plan_single(0, 160, 20, 500) == (160, 500)          # no bound
    assert plan_single(384, 160, 20, 100) == (160, 100)        # everything fits
    ev, ans = plan_single(384, 160, 20, 300)                   # evidence shrinks to make room
    assert ev + ans + 20 <= 384 and ans == 300 - (300 - ans) and ev >= (384 - 20) // 4
    ev, ans = plan_single(384, 160, 20, 2000)                  # then the answer is cut
    assert ev == (384 - 20) // 4 and ans == 384 - 20 - ev
    assert plan_single(10, 160, 20, 5) == (0, 0)


def test_token_stats_are_the_log_softmax_and_entropy():
    rows = np.array([[0.0, 0.0], [np.log(3.0), 0.0]], np.float32)
    lp, ent = token_stats(rows, [1, 0])
    np.testing.assert_allclose(lp, [np.log(0.5), np.log(0.75)], atol=1e-6)
    np.testing.assert_allclose(ent, [np.log(2.0), -(0.75 * np.log(0.75) + 0.25 * np.log(0.25))], atol=1e-6)


def test_scorer_maps_answer_tokens_to_units_and_caches_on_disk(tmp_path):
    be = FakeBackend()
    sc = HiddenScorer(backend=be, cache_dir=tmp_path)
    answer = "The tower stands in Berlin."
    units = units_of(answer)
    ctx = "The Eiffel tower stands in Paris. It was built in 1889."
    out = sc.units("Where is the tower?", answer, ctx, units)
    assert out.covered.all() and out.vectors.shape == (len(units), D)
    by_text = {u.text: v for u, v in zip(units, out.vectors)}
    assert by_text["Berlin"][0] == 5.0 and by_text["tower"][0] == 0.0  # the fake's "not in the evidence" mark
    # " Berlin." is the tokens " Be", "rli", "n." (log-probabilities -3, -3, -2): all three overlap "Berlin"
    np.testing.assert_allclose(out.lp[[u.text for u in units].index("Berlin")], -8 / 3, rtol=1e-6)
    again = HiddenScorer(backend=be, cache_dir=tmp_path).units("Where is the tower?", answer, ctx, units)
    assert be.forwards == 1  # the second scorer read the cache
    np.testing.assert_allclose(again.vectors, out.vectors, atol=1e-2)  # stored in float16
    np.testing.assert_allclose(again.lp, out.lp)


def test_probe_fits_a_linear_signal_round_trips_and_scores_out_of_fold():
    rng = np.random.default_rng(0)
    items = [rng.normal(size=(20, 6)) for _ in range(10)]
    w = np.array([1.0, -2.0, 0, 0, 0, 0])
    ys = [v @ w * 0.1 + 0.5 for v in items]
    p = Probe.fit(np.vstack(items), np.concatenate(ys), alpha=1.0)
    s = p.score(items[0])
    assert np.corrcoef(s, ys[0])[0, 1] > 0.99
    q = Probe.from_dict(p.to_dict())
    np.testing.assert_allclose(q.score(items[0]), s, atol=1e-4)
    assert np.isnan(Probe().score(items[0])).all()  # unfitted: NaN, the detector imputes
    oof = oof_probe_scores(items, ys, alpha=1.0, k=5)
    assert all(np.isfinite(o).all() for o in oof)
    assert np.corrcoef(np.concatenate(oof), np.concatenate(ys))[0, 1] > 0.95
    # out of fold: an item whose vectors carry a label no other item has is not fitted to it
    spiked = [v.copy() for v in items]
    ys2 = [y.copy() for y in ys]
    spiked[0][:, 5] = 100.0
    ys2[0][:] = 9.0
    oof2 = oof_probe_scores(spiked, ys2, alpha=1.0, k=5)
    assert np.abs(oof2[0] - 9.0).min() > 5.0
    # pooled rows (other languages' units) join every fold's training part: here they teach the spike
    extra = (np.vstack([np.eye(6)[5] * 100.0] * 20), np.full(20, 9.0))
    oof3 = oof_probe_scores(spiked, ys2, alpha=1.0, k=5, extra=extra)
    assert np.abs(oof3[0] - 9.0).max() < np.abs(oof2[0] - 9.0).min()


def test_probe_from_summed_statistics_equals_the_ridge_fit_on_the_rows():
    rng = np.random.default_rng(1)
    V = rng.normal(size=(300, 8)) * rng.uniform(0.5, 5, size=8) + rng.normal(size=8)
    y = V @ rng.normal(size=8) + rng.normal(size=300)
    V[7, 2] = np.nan  # a unit without tokens: left out of the fit
    alpha = 3.0
    ok = np.isfinite(V).all(axis=1)
    Z = (V[ok] - V[ok].mean(0)) / V[ok].std(0)
    want = np.linalg.solve(Z.T @ Z + alpha * np.eye(8), Z.T @ (y[ok] - y[ok].mean()))
    np.testing.assert_allclose(Probe.fit(V, y, alpha).coef, want, rtol=1e-8, atol=1e-10)
    # statistics of disjoint blocks add up to those of all rows
    a, b = RidgeStats.of(V[:100], y[:100]), RidgeStats.of(V[100:], y[100:])
    both = Probe.fit_stats(a + b, alpha)
    np.testing.assert_allclose(both.coef, want, rtol=1e-8, atol=1e-10)
    assert abs(both.intercept - y[ok].mean()) < 1e-9
    assert not Probe.fit_stats(RidgeStats.of(V[:1], y[:1]), alpha).fitted  # one row: nothing to fit


def test_item_features_hidden_columns_and_fallback():
    answer = "Paris 1889"
    units = units_of(answer)
    names = feature_names(hidden=True)
    assert all(h in names for h in HIDDEN)
    hid = ItemHidden(np.ones((2, 3), np.float32), np.array([-1.0, np.nan], np.float32),
                     np.array([2.0, np.nan], np.float32), np.array([True, False]))
    f = item_features(answer, "", "Paris", names=names, hidden=hid)
    col = {n: f.X[:, names.index(n)].tolist() for n in HIDDEN}
    assert col["hs_lp"] == [-1.0, 0.0] and col["hs_ent"] == [2.0, 0.0] and col["hs_missing"] == [0.0, 1.0]
    assert f.hidden is hid.vectors and "hidden" in f.signals
    g = item_features(answer, "", "Paris", names=names, hidden=None)  # scorer off or failed
    assert g.hidden is None and g.X[:, names.index("hs_missing")].tolist() == [1.0, 1.0] and "hidden" not in g.signals


def _fake_program(tmp_path, **kw):
    prog = build_grounded(hidden=True, genlogits=False, **kw)
    prog.signal("hidden")._scorer = HiddenScorer(backend=FakeBackend(), cache_dir=tmp_path)
    return prog


def test_fit_learns_the_probe_state_round_trips_and_an_artifact_switches_the_signal_on(tmp_path):
    train = fixture_examples(16)
    prog = _fake_program(tmp_path)
    info = fit_grounded(prog, train, "iou")
    assert prog.probe.fitted and info["hidden_probe"]["dim"] == D
    # dimension 0 marks words absent from the evidence (the hallucinated names among them): the probe leans on it
    assert info["hidden_probe"]["oof_corr"] > 0.1 and prog.probe.coef[0] == max(prog.probe.coef)
    ex = train[1]
    pred = prog(**inputs(ex))
    assert "hidden" in pred.rationale
    state = prog.dump_state()
    assert set(state["grounded"]["hidden"]) == {"model", "item_tokens", "evidence_tokens", "probe"}
    # a program built without the option: the artifact's feature list switches the signal on (lazily: no scorer yet)
    fresh = build_grounded(genlogits=False)
    fresh.load_state(state)
    assert fresh.signal("hidden") is not None and fresh.signal("hidden")._scorer is None
    fresh.signal("hidden")._scorer = HiddenScorer(backend=FakeBackend(), cache_dir=tmp_path)
    again = fresh(**inputs(ex))
    assert [(s.start, s.end, s.prob) for s in again.spans] == [(s.start, s.end, s.prob) for s in pred.spans]


def test_pooled_probe_adds_the_units_of_every_fully_cached_other_language(tmp_path):
    import json

    from halluscope.loaders.mushroom import load_mushroom
    from tests.test_grounded import fixture_records

    root = tmp_path / "mushroom"
    for lang in ("fr", "sv", "de"):  # de is the training language: never pooled
        f = root / "val" / f"mushroom.{lang}-val.v2.jsonl"
        f.parent.mkdir(parents=True, exist_ok=True)
        # each language's answers end in its own word, so no two languages share a cached forward pass
        recs = [dict(r, id=f"val-{lang}-{i}", lang=lang, model_output_text=f"{r['model_output_text']} {lang}")
                for i, r in enumerate(fixture_records(6))]
        f.write_text("".join(json.dumps(r) + "\n" for r in recs), "utf-8")
        for r in recs:  # the retrieved contexts, in the folder layout the loader reads
            c = root / "context" / "val" / "native" / lang / f"{r['id']}.context.txt"
            c.parent.mkdir(parents=True, exist_ok=True)
            c.write_text(r["context"], "utf-8")
    prog = _fake_program(tmp_path / "cache", hidden_pool=str(root))
    sc = prog.hidden_scorer()
    covered = 0
    for ex in load_mushroom(root, lang="fr", split="val", context="native"):  # every fr item cached
        r = sc.units(ex.get("question", ""), ex.answer, ex.get("context", ""), units_of(ex.answer), "fr")
        covered += int(r.covered.sum())
    sv = load_mushroom(root, lang="sv", split="val", context="native")[0]  # one sv item of six: sv stays out
    sc.units(sv.get("question", ""), sv.answer, sv.get("context", ""), units_of(sv.answer), "sv")
    forwards = sc.backend.forwards
    train = fixture_examples(16)
    info = fit_grounded(prog, train, "iou")["hidden_probe"]
    assert info["pooled_langs"] == ["fr"] and info["pooled_units"] == covered > 0
    alone = _fake_program(tmp_path / "cache")
    assert fit_grounded(alone, fixture_examples(16), "iou")["hidden_probe"]["pooled_units"] == 0
    assert not np.allclose(alone.probe.coef, prog.probe.coef)  # the pooled rows changed the fit
    # only the training items' distinct passes ran the model: the pool reads the cache, never runs the model
    assert sc.backend.forwards - forwards == len({(ex.question, ex.answer, ex.context) for ex in train})


def test_program_without_the_signal_never_builds_the_scorer(tmp_path):
    prog = build_grounded(genlogits=False)
    fit_grounded(prog, fixture_examples(8), "iou")
    prog(**inputs(fixture_examples(2)[0]))
    assert prog.signal("hidden") is None and not any(n.startswith("hs_") for n in prog.features)


class Broken:
    name = "broken"

    def tokenize(self, text):
        raise FileNotFoundError("GGUF model file not found: /nowhere.gguf")


def test_missing_model_is_a_counted_note_and_the_columns_are_imputed(tmp_path):
    train = fixture_examples(16)
    prog = _fake_program(tmp_path)
    fit_grounded(prog, train, "iou")
    prog.signal("hidden")._scorer = HiddenScorer(backend=Broken(), cache_dir=tmp_path / "b")
    pred = prog(**inputs(train[0]))
    assert pred.notes.get("scorer_missing") == 1 and not pred.failures.get("scorer_missing")
    assert "hidden" not in pred.rationale.split("signals used:")[-1]
    feats = prog.item_features(**{k: v for k, v in inputs(train[0]).items() if k != "task"})
    X = prog.impute_missing(feats)
    j = prog.features.index("hs_missing")
    assert np.allclose(X[:, j], prog.combiner.mean[j])  # the training mean: the signal adds nothing


@pytest.mark.embedded
def test_real_smollm2_hidden_states_cover_an_answer(tmp_path):
    pytest.importorskip("llama_cpp")
    sc = HiddenScorer(cache_dir=tmp_path)
    answer = "The Eiffel Tower was completed in 1889 in Berlin."
    units = units_of(answer)
    out = sc.units("When was the Eiffel Tower completed?", answer,
                   "The Eiffel Tower in Paris was completed in 1889.", units)
    assert out.covered.all() and out.vectors.shape == (len(units), 576)
    assert np.isfinite(out.vectors).all() and (out.lp <= 0).all() and (out.ent >= 0).all()
    # the model copies "1889" from the evidence: likelier than the invented "Berlin"
    texts = [u.text for u in units]
    assert out.lp[texts.index("1889")] > out.lp[texts.index("Berlin")]
