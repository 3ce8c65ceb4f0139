"""``load_detector(lang="auto")``: the Python import gets what ``detect --lang auto`` gets, answer by answer.

A Python user who does not know an answer's language (or serves many) calls ``load_detector()``; each answer's
language is identified offline and served the detector the run policy gives that language, loaded once. These run
the bundled ``grounded`` artifacts (no LM) from an empty home.
"""

from __future__ import annotations

import pytest

import halluscope
from halluscope.artifacts.policy import AutoDetector, Detector, load_detector

EVIDENCE_EN = "The Golden Gate Bridge in San Francisco opened in 1937."
EVIDENCE_DE = "Die Golden Gate Bridge ist eine Hängebrücke in San Francisco, eröffnet 1937."


def test_no_language_is_auto_and_each_answer_gets_its_own(empty_home):
    auto = load_detector()
    assert isinstance(auto, AutoDetector) and isinstance(load_detector(lang="auto"), AutoDetector)
    en = auto("The Golden Gate Bridge in Los Angeles opened in 1947.", context=EVIDENCE_EN)
    assert "'en'" in auto.last_why and "artifact for 'en'" in auto.last_why
    assert en.verdict == "hallucinated"
    flagged = {en.answer[s:e] for s, e in en.hard_labels}
    assert {"Los Angeles", "1947"} <= flagged
    de = halluscope.detect(auto, "Die Golden Gate Bridge steht in Los Angeles.", context=EVIDENCE_DE)
    assert "'de'" in auto.last_why and "artifact for 'de'" in auto.last_why
    assert any("Los Angeles" in de.answer[s:e] for s, e in de.hard_labels)
    # each language's detector is loaded once and is the one load_detector(lang=...) gives
    first = auto.detector_for("Die Brücke steht in Los Angeles und ist sehr lang.")[0]
    assert isinstance(first, Detector) and first.lang == "de"
    assert auto.detector_for("Die Brücke wurde 1937 in San Francisco eröffnet.")[0] is first
    assert first.path == load_detector(lang="de").path


def test_unsure_is_the_cross_lingual_artifact_and_a_given_language_wins(empty_home):
    auto = load_detector()
    det, code = auto.detector_for("Álava")  # a name says nothing about its language
    assert code is None and det.lang == "all"
    assert "unsure" in auto.why or auto.last_why.startswith("language unsure")
    same = auto("Die Golden Gate Bridge steht in Los Angeles.", context=EVIDENCE_DE, lang="de")
    assert "as given" in auto.last_why and same.verdict == "hallucinated"


def test_a_version_needs_a_language(empty_home):
    with pytest.raises(ValueError, match="version= needs a language"):
        load_detector(version=1)
