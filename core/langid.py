"""Which language an answer is in, offline: ``--lang auto`` (#34).

:func:`identify` returns ``(code, confidence)``: an ISO 639-1 code (``"en"``, ``"de"``, ``"zh"``, ...) and the
identifier's normalised probability, or ``(None, confidence)`` when it is unsure (a text too short, or a top
probability below ``min_confidence``); a caller then falls back to the ``all`` artifact.

The identifier is `langid.py <https://github.com/saffsd/langid.py>`_ (BSD licence, 97 languages): a naive Bayes
model over byte n-grams that ships *inside* its package (about 5 MB installed, with numpy as its only dependency)
and is decoded on first use (about 2.5 s, once per process); nothing is downloaded at run time. It chooses among
:data:`LANGUAGES` (43 widely written languages, the 14 of Mu-SHROOM among them), not all 97: minority languages
close to a common one (Galician, Marathi, Nepali, Uyghur) took answers that were Spanish, Hindi or Arabic.
Give it the question with the answer when there is one: an answer that is only names ("FC Zenit-2 Saint
Petersburg") says little about its language, and the question usually does (BENCHMARKS.md, "Verdicts", `--lang auto`).
"""

from __future__ import annotations

import threading

__all__ = ["identify", "MIN_CONFIDENCE", "MIN_CHARS", "LANGUAGES"]

#: the languages :func:`identify` chooses among (ISO 639-1)
LANGUAGES = ("ar", "bg", "bn", "ca", "cs", "da", "de", "el", "en", "es", "et", "eu", "fa", "fi", "fr", "he", "hi",
             "hr", "hu", "id", "it", "ja", "ko", "lt", "lv", "ms", "nl", "no", "pl", "pt", "ro", "ru", "sk", "sl",
             "sr", "sv", "ta", "th", "tr", "uk", "ur", "vi", "zh")
#: below this normalised probability the language is "unsure" (None)
MIN_CONFIDENCE = 0.5
#: texts with fewer letters than this are "unsure" (a name, a number, "Yes.")
MIN_CHARS = 12

_IDENTIFIER = None
_LOCK = threading.Lock()


def _identifier():
    global _IDENTIFIER
    with _LOCK:
        if _IDENTIFIER is None:
            try:
                from langid.langid import LanguageIdentifier, model
            except ImportError as e:  # a dependency of the package: say which
                raise RuntimeError("--lang auto needs the 'langid' package (pip install langid)") from e
            ident = LanguageIdentifier.from_modelstring(model, norm_probs=True)
            ident.set_languages(list(LANGUAGES))
            _IDENTIFIER = ident
        return _IDENTIFIER


def identify(text: str, *, min_confidence: float = MIN_CONFIDENCE) -> tuple[str | None, float]:
    """``(language code, confidence)`` of ``text``; the code is None when the text has fewer than
    :data:`MIN_CHARS` letters or the confidence is below ``min_confidence``."""
    text = text if isinstance(text, str) else ""
    if sum(ch.isalpha() for ch in text) < MIN_CHARS:
        return None, 0.0
    code, prob = _identifier().classify(text)
    prob = float(prob)
    return (str(code) if prob >= min_confidence else None), prob
