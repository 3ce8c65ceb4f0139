"""``grounded``: units, support signals, generator logits, the combiner, the program, its fit hook through
optimize and its JSON artifact. No LM anywhere (the LM-as-scorer signal is tested with a stub)."""

from __future__ import annotations

import json
import math
import random

import dspy
import numpy as np
import pytest

from halluscope.metrics.mushroom import spearman
from halluscope.programs.baselines import program as baselines
from halluscope.programs.grounded.signals import genlogits
from halluscope.programs.grounded.combiner import (Combiner, char_probs, choose_threshold, gold_vector, rescale,
                                                   spearman_vectors)
from halluscope.programs.grounded.program import build_grounded, fit_grounded, unit_targets
from halluscope.programs.grounded.features import feature_names, item_features
from halluscope.programs.grounded.signals.genlogits import gen_features
from halluscope.programs.grounded.signals.support import IdfTable, TextIndex, lcp_ratio, support_features
from halluscope.programs.grounded.units import normalize, normalize_number, tokens_of, units_of
from halluscope.programs.registry import get_program, program_names

# ---------------------------------------------------------------------------------------------------
# units
# ---------------------------------------------------------------------------------------------------


def test_units_words_numbers_and_offsets():
    text = "Álava hat 1.000,5 Einwohner (Stand 12.05.1995)."
    us = units_of(text)
    assert [u.text for u in us] == ["Álava", "hat", "1.000,5", "Einwohner", "Stand", "12.05.1995"]
    assert [u.kind for u in us] == ["word", "word", "num", "word", "word", "num"]
    assert all(text[u.start:u.end] == u.text for u in us)
    assert us[0].norm == "alava" and us[2].norm == "10005" and us[5].norm == "12051995"


def test_units_cjk_one_per_character_and_mixed_scripts():
    us = units_of("东京是日本的首都, Tokyo 2020。")
    assert [u.text for u in us][:7] == list("东京是日本的首")
    assert {u.kind for u in us[:8]} == {"cjk"}
    assert [(u.text, u.kind) for u in us[8:]] == [("Tokyo", "word"), ("2020", "num")]
    assert [u.kind for u in units_of("とうきょう")] == ["cjk"] * 5  # kana too


def test_units_keep_combining_marks_inside_words():
    hindi = "भारत की राजधानी नई दिल्ली है"
    us = units_of(hindi)
    assert [u.text for u in us] == hindi.split()


@pytest.mark.parametrize("text", ["", "   ", "...!?", "—", "«»", "。！", "\n\t-"])
def test_punctuation_only_text_has_no_units(text):
    assert units_of(text) == []


def test_normalize_nfkc_case_diacritics_and_digits():
    assert normalize("ＡＢＣ") == "abc"  # full-width -> ASCII (NFKC)
    assert normalize("Straße") == "strasse"  # casefold
    assert normalize("Ålava Ñandú") == "alava nandu"
    assert normalize("١٩٩٥") == "1995"  # Arabic-Indic digits
    assert normalize("१९४७") == "1947"  # Devanagari digits
    assert normalize_number("1,000") == normalize_number("1.000") == normalize_number("1 000".replace(" ", "")) == "1000"


def test_tokens_of_matches_units_norms():
    text = "Der Fluss Ébre (910 km) fließt nach Tortosa; 东京 und ١٢٣ Straße."
    assert tokens_of(text) == [u.norm for u in units_of(text)]
    assert tokens_of("") == []


# ---------------------------------------------------------------------------------------------------
# support
# ---------------------------------------------------------------------------------------------------


def _support(answer, context, question=""):
    us = units_of(answer)
    return {u.text: f for u, f in zip(us, support_features(us, TextIndex.of(context), TextIndex.of(question)))}


def test_support_case_nfkc_diacritics_and_numbers():
    f = _support("ALAVA had 1,000 people in ＢＩＬＢＡＯ", "Álava ... 1000 inhabitants ... Bilbao")
    assert f["ALAVA"]["ctx_exact"] == 1.0 and f["ＢＩＬＢＡＯ"]["ctx_exact"] == 1.0
    assert f["1,000"]["ctx_exact"] == 1.0  # number formats normalised to digits
    assert f["people"]["ctx_exact"] == 0.0 and f["had"]["ctx_exact"] == 0.0


def test_support_prefix_stems_for_rich_morphology():
    f = _support("Espanjan pääkaupunki", "Espanja on maa. Pääkaupungissa asuu paljon ihmisiä.")
    assert f["Espanjan"]["ctx_exact"] == 0.0
    assert f["Espanjan"]["ctx_prefix"] == pytest.approx(7 / 8)
    assert 0.5 < f["pääkaupunki"]["ctx_prefix"] < 1.0
    assert lcp_ratio("abc", ["abd"]) == 0.0  # below the minimum stem length
    assert lcp_ratio("ab", ["ab"]) == 1.0  # a short word matching whole counts
    assert lcp_ratio("word", []) == 0.0


def test_support_fuzzy_near_matches_and_question():
    f = _support("Tschaikowsky wrote it", "Pyotr Tchaikovsky composed the ballet.", question="Who wrote it?")
    assert f["Tschaikowsky"]["ctx_exact"] == 0.0 and f["Tschaikowsky"]["ctx_fuzzy"] > 0.7
    assert f["wrote"]["q_exact"] == 1.0 and f["wrote"]["ctx_fuzzy"] < 0.7
    assert f["it"]["q_fuzzy"] == 1.0  # short units: exact only


def test_support_phrases_and_cjk_ngrams():
    f = _support("the capital city", "Paris is the capital of France.")
    assert f["the"]["ctx_phrase"] == 1.0 and f["capital"]["ctx_phrase"] == 1.0 and f["city"]["ctx_phrase"] == 0.0
    us = units_of("东京是首都")
    feats = support_features(us, TextIndex.of("东京是日本的首都。"), TextIndex.of(""))
    # a character in a trigram of the context scores 1, in a bigram only 0.5 ("是首都" is not in it)
    assert [x["ctx_phrase"] for x in feats] == [1.0, 1.0, 1.0, 0.5, 0.5]
    feats = support_features(units_of("大阪是首都"), TextIndex.of("东京是日本的首都。"), TextIndex.of(""))
    assert feats[0]["ctx_phrase"] == 0.0 and feats[4]["ctx_phrase"] == 0.5


def test_support_without_evidence_is_all_zero():
    us = units_of("Some answer")
    for f in support_features(us, TextIndex.of(""), TextIndex.of("")):
        assert set(f.values()) == {0.0}


def test_idf_table_scaled_and_round_trips_as_json():
    t = IdfTable.build(["a b c", "a b", "a", "d"], min_df=1)
    assert t.idf("a") < t.idf("b") < t.idf("c") < t.idf("zzz") == 1.0
    back = IdfTable.from_dict(json.loads(json.dumps(t.to_dict())))
    assert back.idf("b") == t.idf("b") and back.n_docs == 4
    assert IdfTable().idf("x") == 0.5  # no evidence: neutral
    assert "c" not in IdfTable.build(["a b c", "a b", "a"]).df  # min_df 2: rare units stored as unseen


# ---------------------------------------------------------------------------------------------------
# generator logits
# ---------------------------------------------------------------------------------------------------

ANSWER = "Paris is in Germany."
TOKENS = ["Paris", " is", " in", " Germany", "."]
LOGITS = [9.0, 8.0, 8.5, 2.0, 9.5]


def test_gen_features_reuse_the_logits_baseline_alignment():
    assert genlogits.token_offsets is baselines.token_offsets
    us = units_of(ANSWER)
    feats, fails = gen_features(ANSWER, us, TOKENS, LOGITS)
    assert fails == {}
    lows = [f["gen_low"] for f in feats]
    assert max(lows) == lows[3]  # "Germany", the least confident token
    assert all(f["gen_missing"] == 0.0 for f in feats)
    assert all(-4.0 <= f["gen_low"] <= 4.0 for f in feats)


@pytest.mark.parametrize("tokens,logits,failures", [
    (TOKENS, None, {"no_logits": 1}),
    (None, LOGITS, {"no_logits": 1}),
    ([], [], {"no_logits": 1}),
    (TOKENS, "", {"no_logits": 1}),
    (TOKENS, LOGITS * 3, {"logits_length": 1}),  # too different to be the same tokens
    (TOKENS, "[1, ", {"malformed_logits": 1}),
    ("not a list", LOGITS, {"malformed_logits": 1}),
    (TOKENS, 3.0, {"malformed_logits": 1}),
    (TOKENS, json.dumps({"a": 1}), {"malformed_logits": 1}),
    (["xyz", "qqq"], [1.0, 2.0], {"unaligned_tokens": 1}),
    (TOKENS, [float("nan")] * 5, {"nonfinite_logits": 5, "unaligned_tokens": 1}),
    (TOKENS, ["a", "b", "c", "d", "e"], {"nonfinite_logits": 5, "unaligned_tokens": 1}),
])
def test_gen_features_fallbacks_are_counted(tokens, logits, failures):
    us = units_of(ANSWER)
    feats, fails = gen_features(ANSWER, us, tokens, logits)
    assert fails == failures
    assert feats == [{"gen_low": 0.0, "gen_first": 0.0, "gen_missing": 1.0}] * len(us)


def test_gen_features_read_lists_as_the_logits_baseline_does():
    """JSON-string lists (the official Catalan file) and lists of slightly different lengths (an end-of-text
    logit, a dropped last token) are aligned as the logits baseline aligns them, and counted."""
    assert genlogits.token_logit_lists is baselines.token_logit_lists
    us = units_of(ANSWER)
    full, _ = gen_features(ANSWER, us, TOKENS, LOGITS)
    enc, fails = gen_features(ANSWER, us, json.dumps(TOKENS), json.dumps(LOGITS))
    assert fails == {} and enc == full
    longer, fails = gen_features(ANSWER, us, TOKENS, LOGITS + [-3.0])  # an end-of-text logit
    assert fails == {"logit_length_mismatch": 1} and longer == full
    shorter, fails = gen_features(ANSWER, us, TOKENS, LOGITS[:-1])  # the "." has no logit
    assert fails == {"logit_length_mismatch": 1}
    assert [f["gen_missing"] for f in shorter] == [0.0, 0.0, 0.0, 0.0]
    assert max(range(len(us)), key=lambda i: shorter[i]["gen_low"]) == 3  # "Germany" still the least sure
    np_feats, fails = gen_features(ANSWER, us, np.array(TOKENS), np.array(LOGITS))  # a columnar input
    assert fails == {} and np_feats == full


def test_gen_features_leave_out_and_count_nonfinite_logits():
    us = units_of(ANSWER)
    feats, fails = gen_features(ANSWER, us, TOKENS, [9.0, float("nan"), 8.5, 2.0, "x"])
    assert fails == {"nonfinite_logits": 2, "unaligned_units": 1}  # "is" lost its only token
    assert [f["gen_missing"] for f in feats] == [0.0, 1.0, 0.0, 0.0]
    assert feats[3]["gen_low"] == max(f["gen_low"] for f in feats)


def test_grounded_detector_uses_string_encoded_and_unequal_logits(tmp_path):
    """The whole detector: string-encoded lists feed the generator-logit features instead of failing."""
    prog = get_program("grounded").make(lm=False, evidence_free=True)  # no context: the words are scored all the same
    base = prog(answer=ANSWER, question="", context="", model_output_tokens=TOKENS, model_output_logits=LOGITS)
    enc = prog(answer=ANSWER, question="", context="", model_output_tokens=json.dumps(TOKENS),
               model_output_logits=json.dumps(LOGITS + [0.0]))
    assert "malformed_logits" not in enc.failures and "logits_length" not in enc.failures
    assert enc.failures.get("logit_length_mismatch") == 1
    assert enc.soft_labels == base.soft_labels


def test_gen_features_truncated_tokens_count_unaligned_units():
    us = units_of(ANSWER)
    feats, fails = gen_features(ANSWER, us, TOKENS[:2], LOGITS[:2])
    assert fails == {"unaligned_units": 2}
    assert [f["gen_missing"] for f in feats] == [0.0, 0.0, 1.0, 1.0]


# ---------------------------------------------------------------------------------------------------
# features
# ---------------------------------------------------------------------------------------------------


def test_item_features_columns_and_nonfinite_values_are_counted():
    names_ = feature_names(lm=True)
    rows = [{"lm_delta": float("nan"), "lm_lp": float("inf"), "lm_missing": 0.0}] * 4
    f = item_features(ANSWER, "Where in Europe is Paris?", "Paris is the capital of France.", names=names_,
                      tokens=TOKENS, logits=LOGITS, lm_rows=rows)
    assert f.X.shape == (4, len(names_)) and np.isfinite(f.X).all()
    assert f.failures["nonfinite_features"] >= 8
    col = dict(zip(names_, f.X.T))
    assert list(col["unsup"]) == [0.0, 0.0, 0.0, 1.0]  # Germany is in neither the context nor the question
    assert list(col["is_cap"]) == [0.0, 0.0, 0.0, 1.0]


def test_item_features_without_evidence_or_units():
    f = item_features("Berlin.", names=feature_names())
    assert f.failures == {"no_evidence": 1, "no_logits": 1}
    assert f.X[0][feature_names().index("no_context")] == 1.0
    empty = item_features("?!", "q", "ctx", names=feature_names())
    assert empty.units == [] and empty.X.shape == (0, len(feature_names()))
    wrong_rows = item_features(ANSWER, names=feature_names(lm=True), lm_rows=[{"lm_delta": 1.0}])
    assert set(wrong_rows.X[:, feature_names(lm=True).index("lm_missing")]) == {1.0}


# ---------------------------------------------------------------------------------------------------
# combiner
# ---------------------------------------------------------------------------------------------------


def test_combiner_fits_predicts_and_round_trips_as_plain_json():
    rng = np.random.default_rng(0)
    X = rng.normal(size=(400, 3))
    y = (X[:, 0] - 0.5 * X[:, 1] > 0).astype(float)
    c = Combiner(["a", "b", "c"])
    info = c.fit(X, y, l2=1.0)
    assert info["converged"]
    p = c.predict(X)
    assert ((p > 0.5) == (y > 0.5)).mean() > 0.9
    assert c.weights[1] > 0 > c.weights[2] and abs(c.weights[3]) < abs(c.weights[1])
    back = Combiner.from_dict(json.loads(json.dumps(c.to_dict())))
    assert np.allclose(back.predict(X), p)
    bad = np.array([[np.nan, np.inf, -np.inf], [1.0, 2.0, 3.0]])
    assert np.isfinite(c.predict(bad)).all()
    assert c.predict(np.zeros((0, 3))).shape == (0,)
    with pytest.raises(ValueError, match="3 features need 4 weights"):
        Combiner(["a", "b", "c"], weights=[0.0, 1.0])


def test_combiner_soft_targets_give_calibrated_probabilities():
    X = np.repeat([[0.0], [1.0]], 200, axis=0)
    y = np.concatenate([np.full(200, 0.2), np.full(200, 0.8)])
    c = Combiner(["x"])
    c.fit(X, y, l2=0.0)
    assert c.predict(np.array([[0.0], [1.0]])) == pytest.approx([0.2, 0.8], abs=0.01)


def test_char_probs_gaps_take_the_smaller_neighbour():
    cp = char_probs(12, [(1, 3), (4, 6), (8, 10)], [0.9, 0.8, 0.1])
    assert list(cp[:7]) == [0.0, 0.9, 0.9, 0.8, 0.8, 0.8, 0.1]
    assert list(cp[10:]) == [0.0, 0.0]
    assert list(char_probs(3, [(0, 3)], [float("nan")])) == [0.0, 0.0, 0.0]


def test_rescale_maps_threshold_to_half_and_keeps_order():
    assert rescale(0.3, 0.3) == pytest.approx(0.5)
    xs = [0.0, 0.1, 0.29, 0.31, 0.7, 1.0]
    ys = [rescale(x, 0.3) for x in xs]
    assert ys == sorted(ys) and ys[2] < 0.5 < ys[3] and ys[-1] == pytest.approx(1.0)
    assert rescale(0.05, 0.3, floor=0.1) == 0.0 and rescale(float("nan"), 0.3) == 0.0


def test_spearman_vectors_equals_the_official_item_score():
    rng = random.Random(1)
    for _ in range(200):
        n = rng.randint(1, 30)
        gold = [{"start": s, "end": s + rng.randint(1, 5), "prob": rng.choice([0.2, 0.5, 1.0])}
                for s in sorted(rng.sample(range(n), min(n, rng.randint(0, 3))))]
        pred = [{"start": s, "end": s + rng.randint(1, 5), "prob": rng.random()}
                for s in sorted(rng.sample(range(n), min(n, rng.randint(0, 4))))]
        assert spearman_vectors(gold_vector(gold, n), gold_vector(pred, n)) == pytest.approx(
            spearman(gold, pred, n), abs=1e-12)
    assert spearman_vectors(np.zeros(0), np.zeros(0)) == 1.0


def test_choose_threshold_separates_marked_units():
    items = []
    for k in range(6):
        probs = [0.1, 0.2, 0.9 - k * 0.01, 0.15]
        items.append({"text_len": 20, "spans": [(0, 4), (5, 9), (10, 14), (15, 19)], "probs": probs,
                      "hard_labels": [[10, 14]], "soft_labels": [{"start": 10, "end": 14, "prob": 1.0}]})
    ch = choose_threshold(items)
    assert 0.2 <= ch["threshold"] < 0.85 and ch["iou"] == pytest.approx(1.0) and ch["corr"] == pytest.approx(1.0)
    assert 0.0 <= ch["floor"] <= ch["threshold"]
    assert choose_threshold([{"text_len": 0, "spans": [], "probs": [], "hard_labels": [], "soft_labels": []}])[
        "threshold"] == 0.5


# ---------------------------------------------------------------------------------------------------
# the program
# ---------------------------------------------------------------------------------------------------

FACTS = [("Hauptstadt von Frankreich", "Paris", "Lyon"), ("Hauptstadt von Spanien", "Madrid", "Sevilla"),
         ("Hauptstadt von Italien", "Rom", "Mailand"), ("längste Fluss Deutschlands", "Rhein", "Main"),
         ("höchste Berg Deutschlands", "Zugspitze", "Brocken"), ("Hauptstadt von Schweden", "Stockholm", "Malmö"),
         ("Hauptstadt von Finnland", "Helsinki", "Turku"), ("größte Stadt Bayerns", "München", "Augsburg")]


def fixture_records(n: int = 16) -> list[dict]:
    """Mu-SHROOM-shaped German items: the context states the fact; half the answers name the wrong entity
    (gold span = that word, soft prob 1.0 or 0.67); tokens and logits (lower on the wrong entity)."""
    out = []
    for i in range(n):
        topic, right, wrong = FACTS[i % len(FACTS)]
        bad = i % 2 == 0
        name = wrong if bad else right
        answer = f"Die {topic} ist {name}, sagt man."
        start = answer.index(name)
        words = answer.split(" ")
        tokens = [words[0]] + [" " + w for w in words[1:]]
        logits = [8.0 + (i % 3) * 0.1 if name not in t else (3.0 if bad else 8.5) for t in tokens]
        prob = 1.0 if i % 4 == 0 else 2 / 3
        out.append({
            "id": f"val-de-{i}", "lang": "de", "model_id": "fixture", "model_input": f"Was ist die {topic}?",
            "model_output_text": answer, "model_output_tokens": tokens, "model_output_logits": logits,
            "hard_labels": [[start, start + len(name)]] if bad else [],
            "soft_labels": [{"start": start, "end": start + len(name), "prob": prob}] if bad else [],
            "annotations": {"a1": [[start, start + len(name)]] if bad else [], "a2": [], "a3": []},
            "context": f"Die {topic} ist {right}. {right} ist bekannt. Viele Menschen besuchen {right}.",
        })
    return out


def fixture_examples(n: int = 16) -> list[dspy.Example]:
    return [dspy.Example(id=r["id"], lang="de", question=r["model_input"], answer=r["model_output_text"],
                         context=r["context"], task="mushroom", model_output_tokens=r["model_output_tokens"],
                         model_output_logits=r["model_output_logits"], hard_labels=r["hard_labels"],
                         soft_labels=r["soft_labels"]).with_inputs("question", "answer", "lang", "context", "task")
            for r in fixture_records(n)]


def inputs(ex) -> dict:
    return {k: ex.get(k) for k in ("question", "answer", "lang", "context", "task", "model_output_tokens",
                                   "model_output_logits")}


def test_registered_without_lm_with_a_fit_hook_and_documented_options():
    assert "grounded" in program_names()
    spec = get_program("grounded")
    assert spec.uses_lm is False and spec.fit is fit_grounded and spec.level == "span"
    assert set(spec.extra_inputs) == {"model_output_tokens", "model_output_logits"}
    assert {"support", "idf", "genlogits", "lm", "window", "l2"} <= set(spec.options)
    assert all(spec.option_help[k] for k in spec.options)
    assert spec.options["lm"] is False


def test_hand_set_weights_mark_the_unsupported_word():
    det = get_program("grounded").make()(question="Was ist die Hauptstadt von Frankreich?",
                                 answer="Die Hauptstadt von Frankreich ist Lyon.",
                                 context="Paris ist die Hauptstadt von Frankreich.").detection
    answer = det.answer
    assert [answer[s:e] for s, e in det.hard_labels] == ["Lyon"]
    assert det.label is True and 0.5 < det.score <= 1.0
    labels = {u.text: u.label for u in det.units}
    assert labels["Lyon"] == "unsupported" and labels["Hauptstadt"] == labels["Frankreich"] == "supported"


def test_bad_inputs_fall_back_with_counted_failures_and_valid_offsets():
    prog = get_program("grounded").make()
    p = prog(answer="...!?", question="q", context="ctx")
    assert p.hard_labels == [] and p.soft_labels == [] and p.failures == {"no_units": 1}
    p = prog(answer="", question="q")
    assert p.hard_labels == [] and p.failures == {}  # an empty answer is not a failure
    p = prog(answer=None)
    assert p.hard_labels == []
    p = prog(answer="Lyon liegt an der Rhône.", question="", context="",
             model_output_tokens="not a list", model_output_logits="[1, 2]")
    # no context is an absent optional input (a note); logits given but malformed are a failure
    assert p.notes == {"no_evidence": 1} and p.failures["malformed_logits"] == 1 and "no_evidence" not in p.failures
    p = prog(answer="Lyon liegt an der Rhône.", context="Lyon liegt an der Rhône.")  # plain text: no logits
    assert p.notes == {"no_logits": 1} and p.failures == {}
    assert [(e.source, e.text) for e in p.detection.evidence] == [("context", "Lyon liegt an der Rhône.")]
    rng = random.Random(0)
    alphabet = "ab É1,.- 东京\u0301।"
    for _ in range(200):
        answer = "".join(rng.choice(alphabet) for _ in range(rng.randint(0, 25)))
        p = prog(answer=answer, context="ab 东 1", question="É",
                 model_output_tokens=list(answer[:5]), model_output_logits=[rng.random() for _ in range(5)])
        for s, e in p.hard_labels:
            assert 0 <= s < e <= len(answer)
        for d in p.soft_labels:
            assert 0 <= d["start"] < d["end"] <= len(answer) and 0.0 <= d["prob"] <= 1.0


def test_unit_targets_are_the_annotators_share():
    answer = "Die Stadt ist Lyon."
    us = units_of(answer)
    t = unit_targets(answer, us, [{"start": 14, "end": 18, "prob": 2 / 3}], [[14, 18]])
    assert t == [0.0, 0.0, 0.0, pytest.approx(2 / 3)]
    assert unit_targets(answer, us, [], [[0, 3]]) == [1.0, 0.0, 0.0, 0.0]


def test_fit_learns_the_fixture_and_the_state_round_trips_as_plain_json():
    exs = fixture_examples()
    m = get_program("grounded").make()
    info = fit_grounded(m, exs, "iou")
    assert info["n_items"] == 16 and info["n_units"] > 16 and info["converged"]
    assert info["train_iou"] == pytest.approx(1.0)
    assert 0.0 <= info["floor"] <= info["threshold"] <= 1.0 and len(info["train_hash"]) == 64
    assert info["weights"]["unsup"] > 0
    state = json.loads(json.dumps(m.dump_state()))  # plain JSON, nothing else
    fresh = get_program("grounded").make().load_state(state)
    for ex in exs:
        a, b = m(**inputs(ex)), fresh(**inputs(ex))
        assert a.hard_labels == b.hard_labels == ex.hard_labels
        assert a.soft_labels == b.soft_labels
    # a state made with other options, another version or an invalid threshold is refused
    with pytest.raises(ValueError, match="features"):
        get_program("grounded").make(genlogits=False).load_state(state)
    bad = json.loads(json.dumps(state))
    bad["grounded"]["version"] = 99
    with pytest.raises(ValueError, match="version"):
        get_program("grounded").make().load_state(bad)
    bad = json.loads(json.dumps(state))
    bad["grounded"]["threshold"] = float("nan")
    with pytest.raises(ValueError, match="threshold"):
        get_program("grounded").make().load_state(bad)
    with pytest.raises(ValueError, match="no 'grounded' entry"):
        get_program("grounded").make().load_state({})


def test_fit_refuses_unlabelled_data():
    ex = dspy.Example(answer="x", question="q").with_inputs("answer", "question")
    with pytest.raises(ValueError, match="span labels"):
        fit_grounded(get_program("grounded").make(), [ex], "iou")


def test_fit_metric_corr_chooses_the_floor_first():
    m = get_program("grounded").make()
    info = fit_grounded(m, fixture_examples(), "corr")
    assert info["threshold_metric"] == "corr" and info["train_corr"] == pytest.approx(1.0)


def _write_mushroom(root, records):
    val = root / "val"
    val.mkdir(parents=True)
    lines = [json.dumps({k: v for k, v in r.items() if k != "context"}, ensure_ascii=False) for r in records]
    (val / "mushroom.de-val.v2.extra.jsonl").write_text("\n".join(lines) + "\n", encoding="utf-8")
    ctx = root / "context" / "val" / "native" / "de"
    ctx.mkdir(parents=True)
    for r in records:
        (ctx / f"{r['id']}.context.txt").write_text(r["context"], encoding="utf-8")
    return root


def test_optimize_cli_fits_with_kfold_cv_writes_json_and_load_compiled_serves_it(tmp_path, monkeypatch, capsys):
    """``python optimize.py --program grounded --metric iou --lang de``: the fit hook, k-fold CV, a JSON-only
    artifact that load_compiled restores with the same predictions. No LM is set up."""
    monkeypatch.delenv("HALLUSCOPE_DATA_DIR", raising=False)
    import halluscope.cli.optimize as cmd
    from halluscope.artifacts.store import load_compiled

    def no_lm(*a, **k):
        raise AssertionError("grounded needs no LM")

    monkeypatch.setattr(cmd, "setup_lm", no_lm)
    data = _write_mushroom(tmp_path / "data", fixture_records(16))
    rc = cmd.main(["--program", "grounded", "--metric", "iou", "--lang", "de", "--data-dir", str(data),
                   "--folds", "4", "--compiled-dir", str(tmp_path / "compiled"),
                   "--report-dir", str(tmp_path / "reports"), "--no-mlflow"])
    out = capsys.readouterr().out
    assert rc == 0, out
    assert "4-fold cross-validation" in out and "fit hook" in out
    loaded = load_compiled("grounded", lang="de", metric="iou", root=tmp_path / "compiled")
    m = loaded.manifest
    assert m["optimizer"]["name"] == "fit" and len(m["cv"]["folds"]) == 4 and m["data"]["n"] == 16
    assert m["cv"]["mean"]["compiled"]["iou"]["mean"] > m["cv"]["mean"]["zero_shot"]["iou"]["mean"] - 1e-9
    assert m["cv"]["mean"]["compiled"]["iou"]["mean"] > 0.9
    program_json = loaded.path / "program.json"
    state = json.loads(program_json.read_text(encoding="utf-8"))  # JSON, not a pickle
    assert state["grounded"]["fitted"]["n_items"] == 16
    assert loaded.program.threshold == state["grounded"]["threshold"]
    for ex in fixture_examples(16):
        assert loaded.program(**inputs(ex)).hard_labels == ex.hard_labels


def test_lm_option_without_a_scorer_falls_back_and_counts(monkeypatch):
    prog = get_program("grounded").make(lm=True)

    class Broken:
        def unit_features(self, *a, **k):
            raise RuntimeError("no model")

    prog.signal("lm")._scorer = Broken()
    p = prog(answer="Die Hauptstadt ist Lyon.", context="Paris ist die Hauptstadt.", question="Hauptstadt?")
    assert p.failures["lm_error"] == 1 and p.failures["lm_missing"] == 1
    assert [d for d in p.units if d["text"] == "Lyon"][0]["label"] == "unsupported"
    assert math.isfinite(p.score)


def test_items_without_logits_get_the_training_means_for_the_logit_features():
    m = get_program("grounded").make()
    fit_grounded(m, fixture_examples(), "iou")
    ex = fixture_examples()[0]
    no_logits = {**inputs(ex), "model_output_tokens": None, "model_output_logits": None}
    feats, probs = m.unit_probs(**{k: v for k, v in no_logits.items() if k != "task"})
    X = m.impute_missing(feats)
    for name in ("gen_low", "gen_first", "gen_missing", "win_gen"):
        j = m.features.index(name)
        assert set(X[:, j]) == {m.combiner.mean[j]}
    (s, e), = ex.hard_labels
    top = max(zip(feats.units, probs), key=lambda up: up[1])[0]
    assert (top.start, top.end) == (s, e)  # support alone still ranks the wrong entity first
    with_logits_feats, _ = m.unit_probs(**{k: v for k, v in inputs(ex).items() if k != "task"})
    assert np.array_equal(m.impute_missing(with_logits_feats), with_logits_feats.X)  # nothing imputed


# ---------------------------------------------------------------------------------------------------
# the LM as a scorer (a deterministic stub backend: no model)
# ---------------------------------------------------------------------------------------------------


class StubBackend:
    """Byte-level tokens; log p(token) = -0.1 when the byte already occurred in the prompt's evidence part
    (before "Question:"), else -3.0. Deterministic, and the evidence visibly raises supported bytes."""

    name = "stub@0"

    def __init__(self):
        self.evaluated = 0

    def tokenize(self, text):
        return list(text.encode("utf-8"))

    def detokenize(self, tokens):
        return bytes(tokens)

    def logprobs(self, tokens, start):
        self.evaluated += 1
        text = bytes(tokens[:start])
        evidence = text.split(b"Question:")[0] if text.startswith(b"Evidence:") else b""
        return [-0.1 if bytes([t]) in evidence[9:] else -3.0 for t in tokens[start:]]


def test_lm_scorer_rows_cache_and_evidence_selection(tmp_path):
    from halluscope.programs.grounded.signals.lmscore import LMScorer, select_evidence, token_char_offsets

    be = StubBackend()
    sc = LMScorer(cache_dir=tmp_path, backend=be, max_evidence_tokens=50)
    answer = "Paris is big"
    rows = sc.unit_features("Where?", answer, "The city of Paris. Unrelated words here.", units_of(answer))
    assert [r["lm_missing"] for r in rows] == [0.0, 0.0, 0.0]
    # "Paris" letters all occur in the evidence: delta = -0.1 - -3.0 = 2.9; "big" has no "g" in it
    assert rows[0]["lm_delta"] == pytest.approx(2.9) and rows[0]["lm_lp"] == pytest.approx(-3.0)
    assert rows[2]["lm_delta"] < rows[0]["lm_delta"]
    assert sc.calls == 1 and be.evaluated == 2 and sc.tokens > 0
    spent = sc.seconds
    assert spent > 0
    again = sc.unit_features("Where?", answer, "The city of Paris. Unrelated words here.", units_of(answer))
    assert again == rows and sc.cache_hits == 1 and be.evaluated == 2  # served from the disk cache
    assert sc.seconds == spent  # a cache hit is not counted as evaluation time
    # the most relevant sentences, in order, within the budget
    ctx = "Berlin is in Germany. Paris is the capital of France. The Seine flows through Paris."
    assert select_evidence("Paris, France", ctx, 60) == "Paris is the capital of France."
    assert select_evidence("Paris", ctx, 200) == "Paris is the capital of France. The Seine flows through Paris."
    assert select_evidence("x", "", 100) == ""
    assert token_char_offsets("héllo", [b"h", "é".encode(), b"llo"]) == [(0, 1), (1, 2), (2, 5)]
    assert token_char_offsets("ab", [b"x", b"b"]) == [None, (1, 2)]


def test_lm_scorer_evidence_is_budgeted_in_tokens_of_its_own_script(tmp_path):
    """A Chinese character is three byte-tokens for the stub (SmolLM2: two or three): the evidence must still
    fit ``max_evidence_tokens``, not a character budget that was meant for English."""
    from halluscope.programs.grounded.signals.lmscore import LMScorer

    be = StubBackend()
    sc = LMScorer(cache_dir=tmp_path, backend=be, max_evidence_tokens=40)
    zh = "巴黎是法国的首都。" * 20 + "柏林是德国的首都。" * 20
    ev = sc.evidence_for("巴黎", zh, "zh")
    assert ev and len(be.tokenize(ev)) <= 40
    en = "Paris is the capital of France. " * 20
    ev_en = sc.evidence_for("Paris", en, "en")
    assert 0 < len(be.tokenize(ev_en)) <= 40
    assert sc.evidence_for("Paris", "   ", "en") == ""


def test_token_logprobs_from_rows_is_the_log_softmax_of_the_target():
    import numpy as np

    from halluscope.programs.grounded.signals.lmscore import token_logprobs_from_rows

    rows = np.array([[0.0, 0.0], [2.0, 0.0], [1000.0, 0.0]])  # the last would overflow a naive softmax
    out = token_logprobs_from_rows(rows, [1, 0, 1])
    assert out[0] == pytest.approx(np.log(0.5))
    assert out[1] == pytest.approx(2.0 - np.log(np.exp(2.0) + 1.0))
    assert out[2] == pytest.approx(-1000.0) and all(np.isfinite(out))
    assert rows[2, 0] == 1000.0 and rows[1, 0] == 2.0  # the caller's logits are not overwritten
    assert token_logprobs_from_rows(np.zeros((0, 2)), []) == []
    # float32 arithmetic agrees with a float64 log-softmax on logits of a real vocabulary's size
    big = np.random.default_rng(0).normal(0, 4, (5, 49152)).astype(np.float32)
    ref = big.astype(np.float64)
    ref = ref[np.arange(5), [0, 7, 9, 11, 49151]] - np.log(np.exp(ref).sum(axis=1))
    assert token_logprobs_from_rows(big, [0, 7, 9, 11, 49151]) == pytest.approx(list(ref), abs=1e-5)


def test_plan_budget_shrinks_the_evidence_first_then_cuts_the_answer():
    from halluscope.programs.grounded.signals.lmscore import plan_budget

    assert plan_budget(0, 300, 50, 5, 5000) == (300, 5000)  # no bound
    assert plan_budget(640, 300, 10, 5, 100) == (300, 100)  # fits: 5 + 300 + 2 * (10 + 100) = 525
    # room = 640 - 20 - 5 = 615; two passes over 200 answer tokens leave 215 for the evidence
    assert plan_budget(640, 300, 10, 5, 200) == (215, 200)
    # a long answer: the evidence keeps a quarter of the room (153), the answer gets the rest of it halved
    ev, n = plan_budget(640, 300, 10, 5, 650)
    assert (ev, n) == (153, 231) and 5 + ev + 2 * (10 + n) <= 640
    assert plan_budget(640, 100, 10, 5, 650) == (100, 257)  # a smaller evidence cap leaves more to the answer
    assert plan_budget(640, 300, 400, 5, 50) == (0, 0)  # the question alone is over the budget: nothing scored
    for q, a in [(0, 0), (3, 1), (37, 999), (200, 120)]:
        ev, n = plan_budget(500, 300, q, 4, a)
        assert ev >= 0 and 0 <= n <= a and (n == 0 or 4 + ev + 2 * (q + n) <= 500)


def test_lm_scorer_item_budget_cuts_a_long_answer_and_counts_it(tmp_path):
    """Both passes stay within ``max_item_tokens``; units past the scored tokens get the fallback; the detector
    counts ``lm_answer_cut``; the budget is part of the cache key."""
    from halluscope.programs.grounded.signals.lmscore import LMScorer

    class Counting(StubBackend):
        def __init__(self):
            super().__init__()
            self.lengths = []

        def logprobs(self, tokens, start):
            self.lengths.append(len(tokens))
            return super().logprobs(tokens, start)

    answer = "Paris is big. " + "and more words follow here " * 10  # 284 byte-tokens
    context = "Paris is the capital of France. " * 30
    be = Counting()
    sc = LMScorer(cache_dir=tmp_path, backend=be, max_evidence_tokens=300, max_item_tokens=400)
    info = {}
    rows = sc.unit_features("Where?", answer, context, units_of(answer), info=info)
    assert sum(be.lengths) <= 400 and len(be.lengths) == 2
    assert info["answer_tokens_cut"] > 0 and sc.answers_cut == 1
    assert rows[0]["lm_missing"] == 0.0 and rows[-1]["lm_missing"] == 1.0  # the tail is not scored
    unbounded = LMScorer(cache_dir=tmp_path, backend=be, max_evidence_tokens=300, max_item_tokens=0)
    info = {}
    rows = unbounded.unit_features("Where?", answer, context, units_of(answer), info=info)
    assert unbounded.calls == 1 and info["answer_tokens_cut"] == 0  # another key: evaluated, not a cache hit
    assert all(r["lm_missing"] == 0.0 for r in rows)

    with pytest.raises(ValueError, match=r"option 'lm_item_tokens' of program 'grounded': expected a whole number in \[0, 1000000\], got -1"):
        get_program("grounded").make(lm=True, lm_item_tokens=-1)
    prog = get_program("grounded").make(lm=True, lm_item_tokens=400)
    prog.signal("lm")._scorer = LMScorer(cache_dir=tmp_path / "p", backend=StubBackend(), max_item_tokens=400)
    feats = prog.item_features(question="Where?", answer=answer, context=context)
    assert feats.failures.get("lm_answer_cut") == 1 and "lm_missing" not in feats.failures
    short = prog.item_features(question="Where?", answer="Paris is big.", context=context)
    assert "lm_answer_cut" not in short.failures


def test_lm_signal_through_the_program_with_a_stub(tmp_path):
    from halluscope.programs.grounded.signals.lmscore import LMScorer

    prog = get_program("grounded").make(lm=True)
    prog.signal("lm")._scorer = LMScorer(cache_dir=tmp_path, backend=StubBackend())
    assert "lm_delta" in prog.features
    fit_grounded(prog, fixture_examples(8), "iou")
    p = prog(**inputs(fixture_examples(8)[0]))
    assert "lm_missing" not in p.failures and p.hard_labels
    state = json.loads(json.dumps(prog.dump_state()))
    assert "lm_delta" in state["grounded"]["features"]


# ---------------------------------------------------------------------------------------------------
# halluscope detect: grounded is the default with the embedded model
# ---------------------------------------------------------------------------------------------------


def _compile(tmp_path, lang):
    from halluscope.optimize.run import FINISHED, OptimizeConfig, run_optimize

    recs = fixture_examples(16)
    config = OptimizeConfig(program="grounded", metric="iou", lang=lang, source="fixture", folds=2,
                            program_options={"genlogits": False},  # detect --answer carries no logits
                            compiled_dir=tmp_path / "compiled", report_dir=tmp_path / "reports", mlflow=False)
    res = run_optimize(config, recs)
    assert res.status == FINISHED, res.error
    return res


def test_detect_defaults_to_grounded_and_falls_back_to_the_cross_lingual_artifact(tmp_path, capsys, monkeypatch):
    from halluscope import cli
    import halluscope.cli.detect as detect_cmd

    monkeypatch.delenv("HALLUSCOPE_LM", raising=False)
    _compile(tmp_path, "de")
    _compile(tmp_path, "all")
    answer, question = "Die Hauptstadt von Frankreich ist Lyon, sagt man.", "Was ist die Hauptstadt von Frankreich?"
    context = "Die Hauptstadt von Frankreich ist Paris. Paris ist bekannt."
    base = ["detect", "--answer", answer, "--question", question, "--context", context,
            "--compiled-dir", str(tmp_path / "compiled")]

    def no_lm(args, needed=True):
        assert not needed, "grounded needs no LM"

    monkeypatch.setattr(detect_cmd, "setup_lm", no_lm)
    assert cli.main(base + ["--lang", "de"]) == 0
    out, err = capsys.readouterr()
    assert "program grounded (the default with the embedded model" in err and "compiled/grounded/de/iou/v0001" in err
    row = json.loads(out)
    assert [answer[s:e] for s, e in row["hard_labels"]] == ["Lyon"]

    assert cli.main(base + ["--lang", "ca"]) == 0  # Catalan: no artifact of its own
    out, err = capsys.readouterr()
    assert "no artifact for 'ca', using the cross-lingual one" in err and "compiled/grounded/all/iou/v0001" in err
    assert json.loads(out)["ok"] is True

    from halluscope.artifacts.policy import choose

    root = tmp_path / "compiled"
    assert choose(lang="de", lm="openai/gpt-4o-mini", root=root).program == "spans"  # a capable LM: spans
    c = choose(lang="de", program="grounded", root=root)
    assert (c.program, c.key, c.why) == ("grounded", "de", "")  # exactly what was asked: nothing to say


def test_detect_default_without_grounded_artifacts_is_the_unfitted_grounded(tmp_path):
    """No artifact anywhere: the embedded model is never handed the LM span detector; the unfitted grounded
    program serves, and says so (the run policy, halluscope.artifacts.policy)."""
    from halluscope.artifacts.policy import choose

    c = choose(lang="de", root=tmp_path)
    assert (c.program, c.key, c.fitted) == ("grounded", "de", False) and "unfitted" in c.why
    c = choose(task="qa", root=tmp_path)
    assert (c.program, c.key, c.fitted) == ("grounded", "qa", False)


# ---------------------------------------------------------------------------------------------------
# signal 4: other detectors as features (system combination)
# ---------------------------------------------------------------------------------------------------

def _oracle_spans_lm(fail_on: str = ""):
    """A scripted LM for the ``spans`` program that quotes the wrong entity of the fixture answers (the name
    that differs from the question's fact) — a strong detector — and fails for answers containing ``fail_on``."""
    from halluscope.lm.scripted import scripted_lm

    wrong = {w for _, _, w in FACTS}

    def responder(call):
        answer = call.inputs.get("answer", "")
        if fail_on and fail_on in answer:
            raise RuntimeError("the LM is unreachable")
        hits = [w for w in wrong if w in answer]
        return {"spans": [{"text": w, "probability": 0.9} for w in hits]}
    return scripted_lm(responder)


def test_detectors_option_validated_and_needs_an_lm_only_when_set():
    spec = get_program("grounded")
    assert spec.needs_lm({}) is False and spec.needs_lm({"detectors": "spans"}) is True
    with pytest.raises(ValueError, match="not a span detector to combine; choose from"):
        spec.make(detectors="grounded")
    with pytest.raises(ValueError, match="halluclean"):  # response-level programs are not span detectors
        spec.make(detectors="halluclean")
    with pytest.raises(ValueError, match="twice"):
        spec.make(detectors="spans,spans")
    m = spec.make(detectors="spans")
    assert m.features[-3:] == ["det_spans", "win_det_spans", "det_spans_missing"]
    assert [n for n, _ in m.named_predictors()] == ["detectors[0].extract"]  # what an optimiser sees


def test_another_detector_as_a_feature_is_fitted_saved_and_imputed_when_it_fails():
    exs = fixture_examples(16)
    with dspy.context(lm=_oracle_spans_lm(fail_on="Turku"), adapter=dspy.JSONAdapter()):
        alone = get_program("grounded").make(support=False, idf=False, genlogits=False, numbers=False, align=False)
        fit_grounded(alone, exs[:12], "iou")
        m = get_program("grounded").make(support=False, idf=False, genlogits=False, numbers=False, align=False, detectors="spans")
        info = fit_grounded(m, exs[:12], "iou")
        assert info["weights"]["det_spans"] > 1.0  # the combiner learnt to trust the oracle detector
        bad = exs[12]  # "Brocken" instead of "Zugspitze": the detector quotes it
        p = m(**inputs(bad))
        start = bad.answer.index("Brocken")
        assert p.hard_labels == [[start, start + len("Brocken")]]
        assert alone(**inputs(bad)).hard_labels != p.hard_labels  # without the detector: only position/shape
        # the detector fails on one item: counted, its columns imputed, the item still gets a prediction
        turku = next(ex for ex in exs if "Turku" in ex.answer)
        q = m(**inputs(turku))
        assert q.failures.get("detector_failed:spans") == 1 and q.soft_labels is not None
        # the sub-detector's state travels with the combiner (JSON), and a program without it refuses it
        state = json.loads(json.dumps(m.dump_state()))
        assert state["grounded"]["detectors"] == ["spans"] and state["detectors[0].extract"]["signature"]
        again = get_program("grounded").make(support=False, idf=False, genlogits=False, numbers=False, align=False, detectors="spans").load_state(state)
        assert again(**inputs(bad)).hard_labels == p.hard_labels
        with pytest.raises(ValueError, match="features"):
            get_program("grounded").make(support=False, idf=False, genlogits=False, numbers=False, align=False).load_state(state)


def test_optimize_compiles_the_fused_detectors_prompts_then_fits_the_combiner(tmp_path, monkeypatch, capsys):
    """With -O detectors=spans and a chosen optimizer, the spans stage inside grounded is compiled (its demos
    bootstrapped) and the combiner is fitted after it, on the compiled detector's outputs (issue 9)."""
    from halluscope.artifacts.store import load_compiled
    from halluscope.cli.optimize import build_parser, run
    from halluscope.lm.scripted import scripted_lm

    for var in ("HALLUSCOPE_DATA_DIR", "MLFLOW_TRACKING_URI"):
        monkeypatch.delenv(var, raising=False)

    def quote_last_word(call):
        words = call.inputs.get("answer", "").strip().rstrip(".").split()
        return {"spans": [{"text": words[-1], "probability": 0.9}] if words else []}

    lm = scripted_lm(quote_last_word)
    p = build_parser()
    args = p.parse_args(["--program", "grounded", "-O", "detectors=spans", "--optimizer", "bootstrap", "--lang", "de",
                         "--metric", "iou", "--folds", "2", "--max-bootstrapped-demos", "1", "--max-labeled-demos",
                         "0", "--compiled-dir", str(tmp_path / "compiled"), "--report-dir", str(tmp_path / "reports"),
                         "--no-mlflow", "--quiet"])
    assert run(args, p, task_lm=lm, prompt_lm=lm) == 0
    art = load_compiled("grounded", lang="de", metric="iou", root=tmp_path / "compiled")
    assert "then fit" in art.manifest["optimizer"]["description"]
    assert len(art.program.detectors[0].extract.demos) == 1  # the spans stage was compiled
    assert art.program.fitted and "det_spans" in art.program.features  # and the combiner fitted on its outputs
    assert art.manifest["task_lm"]["model"] == "scripted/test"


def test_a_state_fitted_before_the_19_signals_loads_and_computes_its_own_features():
    """An artifact written before numbers/align/encoder existed (its feature list has none of them) loads into
    today's default program and computes exactly its own features (#19)."""
    exs = fixture_examples()
    old = get_program("grounded").make(numbers=False, align=False, encoder=False)
    fit_grounded(old, exs, "iou")
    state = json.loads(json.dumps(old.dump_state()))
    fresh = get_program("grounded").make().load_state(state)
    assert fresh.features == old.features and not ({"ctx_value", "al_subst", "al_sim"} & set(fresh.features))
    for ex in exs:
        assert fresh(**inputs(ex)).soft_labels == old(**inputs(ex)).soft_labels
