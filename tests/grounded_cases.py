"""The hand-written case suite of ``grounded`` (#19): evidence, question and answer, with the words that must be
flagged and the words that must not, in four languages. ``label_correct`` cases must come out with no flagged
word at all (the response label "correct").

Each case names what it checks (``kind``): numbers verbatim and in another format than the evidence (not
flagged), a substituted name, place, number and date (flagged), a negation the evidence does not have
(flagged), a paraphrased correct sentence and a fully correct answer (label correct).

#34: every case is asked with and without its question and must get the same verdict both ways (a wrong answer
labelled hallucinated, a correct one labelled correct with no word shown as doubtful); the answers of
:data:`NO_EVIDENCE_CASES` come without evidence and must be unverifiable with nothing hard.
"""

from __future__ import annotations

EN_EVIDENCE = ("The Eiffel Tower is a wrought-iron lattice tower on the Champ de Mars in Paris, France. It was built "
               "from 1887 to 1889 by the company of the engineer Gustave Eiffel. The tower is 330 metres tall and "
               "weighs about 10,100 tonnes. It was opened on 31 March 1889 as the entrance to the World's Fair.")
EN_Q = "What do you know about the Eiffel Tower?"

DE_EVIDENCE = ("Cilleruelo de San Mamés ist eine Gemeinde in der Provinz Segovia in Kastilien und León. Die Gemeinde "
               "liegt etwa 56 km nordöstlich der Provinzhauptstadt Segovia auf einer Höhe von 980 Metern. Sie hat "
               "eine Fläche von 9,73 km². Im Jahr 2024 hatte die Gemeinde 35 Einwohner.")
DE_Q = "Wo liegt die spanische Gemeinde Cilleruelo de San Mamés?"

FR_EVIDENCE = ("Marie Curie est née le 7 novembre 1867 à Varsovie. Elle a reçu le prix Nobel de physique en 1903 avec "
               "Pierre Curie et Henri Becquerel, puis le prix Nobel de chimie en 1911. Elle est morte le 4 juillet "
               "1934 à Passy.")
FR_Q = "Quels prix Marie Curie a-t-elle reçus ?"

ES_EVIDENCE = ("El río Amazonas tiene una longitud de unos 6.400 kilómetros y atraviesa Perú, Colombia y Brasil. "
               "Su cuenca ocupa una superficie de unos 7 millones de km². Desemboca en el océano Atlántico.")
ES_Q = "¿Qué longitud tiene el río Amazonas?"

GG_EVIDENCE = ("The Golden Gate Bridge is a suspension bridge spanning the Golden Gate strait in San Francisco, "
               "California. It opened in 1937, and its main span is 1,280 metres long.")
GG_Q = "When did the Golden Gate Bridge open?"

#: (id, lang, kind, evidence, question, answer, flagged words, unflagged words, label_correct)
CASES = [
    # English
    ("en-verbatim", "en", "numbers verbatim", EN_EVIDENCE, EN_Q,
     "The Eiffel Tower was built from 1887 to 1889 and is 330 metres tall.",
     [], ["1887", "1889", "330", "metres", "Eiffel", "Tower"], True),
    ("en-format", "en", "numbers format-variant", EN_EVIDENCE, EN_Q,
     "The Eiffel Tower is 330 m tall and weighs about 10100 tonnes.",
     [], ["330", "m", "10100", "tonnes"], True),
    ("en-place", "en", "substituted place", EN_EVIDENCE, EN_Q,
     "The Eiffel Tower is a wrought-iron lattice tower on the Champ de Mars in Berlin, Germany.",
     ["Berlin"], ["Eiffel", "Tower", "wrought"], False),   # "Mars", next to "Berlin", may join its span
    ("en-number", "en", "substituted number", EN_EVIDENCE, EN_Q,
     "The tower is 450 metres tall and weighs about 10,100 tonnes.",
     ["450"], ["10,100", "tower"], False),
    ("en-date", "en", "substituted date", EN_EVIDENCE, EN_Q,
     "The Eiffel Tower was opened on 31 March 1899 as the entrance to the World's Fair.",
     ["1899"], ["Eiffel", "March", "Fair"], False),
    ("en-name", "en", "substituted name", EN_EVIDENCE, EN_Q,
     "It was built from 1887 to 1889 by the company of the engineer Thomas Edison.",
     ["Edison"], ["1887", "1889", "engineer"], False),
    ("en-negation", "en", "negation flipped", EN_EVIDENCE, EN_Q,
     "The Eiffel Tower was not built by the company of Gustave Eiffel.",
     ["not"], ["Gustave"], False),
    ("en-unit-format", "en", "numbers format-variant",
     "The Eiffel Tower in Paris was completed in 1889. It is 330 m tall.", "Tell me about the Eiffel Tower.",
     "The Eiffel Tower is 330 metres tall and was completed in 1889 in Paris.",
     [], ["330", "metres", "1889", "Paris"], True),   # the unit abbreviated in the evidence, spelled out here
    ("en-paraphrase", "en", "paraphrased correct sentence", EN_EVIDENCE, EN_Q,
     "The Eiffel Tower in Paris was built by the company of Gustave Eiffel from 1887 to 1889.",
     [], ["Paris", "Gustave", "1887"], True),
    ("en-swap-city-year", "en", "substituted place", GG_EVIDENCE, GG_Q,
     "The Golden Gate Bridge in Los Angeles opened in 1947.",
     ["Los", "Angeles", "1947"], ["Golden", "Gate", "Bridge"], False),
    ("en-gg-negation", "en", "negation flipped", GG_EVIDENCE, GG_Q,
     "The Golden Gate Bridge did not open in 1937.",
     ["not"], ["1937", "Golden"], False),
    ("en-gg-date", "en", "substituted date", GG_EVIDENCE, GG_Q,
     "The Golden Gate Bridge opened on 27 May 1947.",
     ["1947"], ["Golden", "Bridge"], False),
    ("en-gg-copied-numbers", "en", "numbers verbatim", GG_EVIDENCE, GG_Q,
     "The Golden Gate Bridge in San Francisco opened in 1937, and its main span is 1,280 metres long.",
     [], ["1937", "1,280", "San", "Francisco"], True),
    # German
    ("de-format", "de", "numbers format-variant", DE_EVIDENCE, DE_Q,
     "Die Gemeinde liegt etwa 56 Kilometer nordöstlich von Segovia und hat eine Fläche von 9.73 km².",
     [], ["56", "Kilometer", "9.73", "Segovia"], True),
    ("de-place", "de", "substituted place", DE_EVIDENCE, DE_Q,
     "Cilleruelo de San Mamés ist eine Gemeinde in der Provinz Álava.",
     ["Álava"], ["Cilleruelo", "Provinz"], False),
    ("de-number", "de", "substituted number", DE_EVIDENCE, DE_Q,
     "Im Jahr 2024 hatte die Gemeinde 350 Einwohner.",
     ["350"], ["2024", "Einwohner"], False),
    ("de-negation", "de", "negation flipped", DE_EVIDENCE, DE_Q,
     "Cilleruelo de San Mamés ist keine Gemeinde in der Provinz Segovia.",
     ["keine"], ["Segovia"], False),
    ("de-correct", "de", "fully correct answer", DE_EVIDENCE, DE_Q,
     "Cilleruelo de San Mamés ist eine Gemeinde in der Provinz Segovia in Kastilien und León.",
     [], ["Segovia", "Provinz", "León"], True),
    # French
    ("fr-verbatim", "fr", "fully correct answer", FR_EVIDENCE, FR_Q,
     "Marie Curie a reçu le prix Nobel de physique en 1903 et le prix Nobel de chimie en 1911.",
     [], ["1903", "1911", "Nobel", "chimie"], True),
    ("fr-date", "fr", "substituted date", FR_EVIDENCE, FR_Q,
     "Elle a reçu le prix Nobel de chimie en 1921.",
     ["1921"], ["Nobel", "chimie"], False),
    ("fr-name", "fr", "substituted name", FR_EVIDENCE, FR_Q,
     "Elle a reçu le prix Nobel de physique en 1903 avec Albert Einstein.",
     ["Einstein"], ["1903", "physique"], False),
    ("fr-format", "fr", "numbers format-variant", FR_EVIDENCE, FR_Q,
     "Marie Curie est née à Varsovie le 7 novembre 1867 et est morte le 4 juillet 1934.",
     [], ["7", "novembre", "1867", "1934"], True),
    # Spanish
    ("es-format", "es", "numbers format-variant", ES_EVIDENCE, ES_Q,
     "El río Amazonas tiene una longitud de unos 6400 km.",
     [], ["6400", "km", "Amazonas"], True),
    ("es-number", "es", "substituted number", ES_EVIDENCE, ES_Q,
     "El río Amazonas tiene una longitud de unos 4.500 kilómetros.",
     ["4.500"], ["Amazonas", "kilómetros"], False),
    ("es-place", "es", "substituted place", ES_EVIDENCE, ES_Q,
     "El río Amazonas atraviesa Perú, Colombia y Argentina.",
     ["Argentina"], ["Perú", "Colombia"], False),
    ("es-correct", "es", "fully correct answer", ES_EVIDENCE, ES_Q,
     "El río Amazonas atraviesa Perú, Colombia y Brasil y desemboca en el océano Atlántico.",
     [], ["Brasil", "Atlántico"], True),
]

#: answers given without any evidence (#34): each must come out unverifiable, with nothing hard; (id, lang, question,
#: answer)
NO_EVIDENCE_CASES = [
    ("en-no-evidence", "en", "What is the capital of France?", "Paris is the capital of France."),
    ("en-no-evidence-wrong", "en", "", "The Golden Gate Bridge in Los Angeles opened in 1947."),
    ("de-no-evidence", "de", "", "Berlin ist die Hauptstadt von Deutschland."),
    ("fr-no-evidence", "fr", "Où est né Marie Curie ?", "Marie Curie est née à Varsovie en 1867."),
]
