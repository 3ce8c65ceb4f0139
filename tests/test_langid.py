"""``--lang auto`` (#34): the offline language identifier of core/langid.py."""

from __future__ import annotations

import json
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


def _detect(capsys, argv):
    from halluscope.cli import main

    assert main(["detect", "--format", "json", *argv]) == 0
    out = capsys.readouterr()
    return json.loads(out.out.splitlines()[-1]), out.err


def test_detect_lang_auto_is_the_default_and_picks_the_artifact_of_the_answers_language(capsys):
    row, err = _detect(capsys, ["--answer", "Die Gemeinde liegt etwa 56 Kilometer nordöstlich von Segovia.",
                                "--context", "Die Gemeinde liegt etwa 56 km nordöstlich von Segovia."])
    assert "--lang auto: 'de' (confidence" in err and "; --lang de" in err and "grounded/de/iou" in err
    assert row["ok"] and row["verdict"] == "correct"
    row, err = _detect(capsys, ["--lang", "auto", "--answer", "The Golden Gate Bridge in Los Angeles opened in 1947.",
                                "--question", "When did the Golden Gate Bridge open?", "--context",
                                "The Golden Gate Bridge in San Francisco opened in 1937."])
    assert "--lang auto: 'en'" in err and row["label"] is True and row["hard_labels"]
    row, err = _detect(capsys, ["--answer", "1937", "--context", "It opened in 1937."])
    assert "--lang auto: unsure; the cross-lingual artifact (--lang all)" in err and row["ok"]


def test_detect_lang_auto_on_a_file_takes_the_rows_language(tmp_path, capsys):
    from halluscope.cli import main

    rows = [{"id": str(i), "question": "Quels prix Marie Curie a-t-elle reçus ?",
             "answer": f"Marie Curie a reçu le prix Nobel de chimie en {1900 + i}.",
             "context": "Marie Curie a reçu le prix Nobel de chimie en 1911."} for i in range(5)]
    src = tmp_path / "in.jsonl"
    src.write_text("".join(json.dumps(r, ensure_ascii=False) + "\n" for r in rows), encoding="utf-8")
    assert main(["detect", "--input", str(src), "--output", str(tmp_path / "out.jsonl")]) == 0
    assert "--lang auto: 'fr' in 5 of 5 rows; --lang fr" in capsys.readouterr().err
