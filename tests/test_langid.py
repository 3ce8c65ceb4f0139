"""``--lang auto`` (#34): the offline language identifier of core/langid.py."""

from __future__ import annotations

import socket

import pytest

from halluscope.core.langid import LANGUAGES, MIN_CHARS, identify


@pytest.mark.parametrize("text,lang", [
    ("What is the capital of France? Paris is the capital of France.", "en"),
    ("Die Gemeinde liegt etwa 56 Kilometer nordöstlich von Segovia.", "de"),
    ("Marie Curie a reçu le prix Nobel de physique en 1903.", "fr"),
    ("El río Amazonas tiene una longitud de unos 6400 km.", "es"),
    ("巴黎是法国的首都，也是法国最大的城市。", "zh"),
    ("पेरिस फ्रांस की राजधानी है और सबसे बड़ा शहर है।", "hi"),
    ("Helsinki on Suomen pääkaupunki ja suurin kaupunki.", "fi"),
])
def test_identifies_the_language_with_its_confidence(text, lang):
    code, conf = identify(text)
    assert code == lang and 0.5 <= conf <= 1.0


def test_too_little_text_or_not_text_is_unsure():
    assert identify("1937.") == (None, 0.0)
    assert identify("Ok" * (MIN_CHARS // 4)) == (None, 0.0)
    assert identify(None) == (None, 0.0)  # type: ignore[arg-type]


def test_unsure_below_the_confidence_asked_for():
    code, conf = identify("Paris is the capital of France.", min_confidence=1.01)
    assert code is None and conf > 0.5


def test_chooses_among_its_languages_only_and_downloads_nothing(monkeypatch):
    def refuse(*a, **k):
        raise AssertionError("the language identifier tried to open a network connection")

    monkeypatch.setattr(socket, "create_connection", refuse)
    monkeypatch.setattr(socket.socket, "connect", refuse)
    assert identify("Kjersti Bøe tok sølvmedaljen i stafett sammen med lagvenninnene.")[0] in LANGUAGES
    assert {"ar", "de", "en", "es", "fi", "fr", "hi", "it", "sv", "zh", "ca", "cs", "eu", "fa"} <= set(LANGUAGES)
