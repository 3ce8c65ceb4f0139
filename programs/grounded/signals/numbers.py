"""Numbers, dates and units of measure in a text, normalised so that format variants count as support (#19).

Pure functions, no model:

* :func:`parse_number` — the values a written number can mean: thousands separators and decimal commas per
  language (``1.000,5`` in German, ``1,000.5`` in English, ``1 000`` in French or Swedish, the Arabic
  separators), both readings when the language does not decide (``1,000`` is 1000 or 1.0);
* :func:`mentions` — every number mention of a text with its character span and its *values*: the number,
  the number times a scale word after it (``1.5 million``, ``2 Millionen``, ``3万``), the parts of dates,
  times and ranges (``12.05.1995`` -> 12, 5, 1995; ``1887-1889`` and ``1887 to 1889`` -> 1887, 1889), and the
  written numbers of the Mu-SHROOM languages where a small table is enough (``four``, ``vier``, ``quatre``...);
* :func:`unit_of` — the canonical unit of measure of a word (``kilometres``, ``Kilometer``, ``km``,
  ``chilometri`` -> ``km``), :func:`month_of` — the month of a month name (``March``, ``März``, ``mars`` -> 3);
* :class:`ValueIndex` — the values, months and units of an evidence text; :func:`value_support` — for each
  unit of an answer, the share of its values (a number's readings, a date's parts, a month, a unit of measure,
  a written number) that the evidence holds: 1.0 = supported in some format, 0.0 = none held or not a value.

Values are compared as canonical strings (``"1000"``, ``"1000.5"``, ``"m3"`` for a month, ``"u:km"`` for a unit).
"""

from __future__ import annotations

import re
from bisect import bisect_left, bisect_right
from dataclasses import dataclass, field

from halluscope.programs.grounded.signals.base import Signal, register_signal
from halluscope.programs.grounded.units import AnswerUnit, normalize

__all__ = ["parse_number", "mentions", "Mention", "unit_of", "month_of", "written_number", "ValueIndex",
           "value_support", "canon", "DECIMAL_COMMA", "value_kind", "specific"]

#: languages whose decimal separator is the comma (thousands: "." or a space)
DECIMAL_COMMA = {"de", "es", "fr", "it", "fi", "sv", "ca", "cs", "eu", "pt", "nl", "da", "no", "pl", "ru", "tr"}
#: languages whose decimal separator is the point (thousands: ",")
DECIMAL_POINT = {"en", "zh", "hi", "ja", "ko", "he"}

_SPACE = "[ \u00a0\u202f\u2009]"
# a number in running text: digits with inner separators, or groups of three after spaces (1 000 000)
_LETTER = r"A-Za-z\u00c0-\u024f\u0370-\u052f\u0600-\u06ff\u0900-\u097f"   # letters (not CJK) a number must not touch
_NUMBER = re.compile(rf"(?<![{_LETTER}\d])(?:\d{{1,3}}(?:{_SPACE}\d{{3}})+(?![\d])|\d+(?:[.,'’\u066b\u066c]\d+)*)"
                     rf"(?![{_LETTER}\d])")
_COMPOUND = re.compile(r"\d+(?:\s*[-–—/:]\s*\d+)+")


def canon(x: float) -> str:
    """A value as a canonical string: integers without a point, others to at most 6 decimals."""
    if abs(x - round(x)) < 1e-9:
        return str(int(round(x)))
    return f"{x:.6f}".rstrip("0").rstrip(".")


def parse_number(text: str, lang: str = "") -> list[float]:
    """The values ``text`` (a number without spaces, or with space-separated groups of three) can mean.

    ``"1.000,5"`` -> [1000.5]; ``"1,000"`` -> [1000.0, 1.0] (en: [1000.0]; de: [1.0]); ``"1 000"`` -> [1000.0];
    ``"9,73"`` -> [9.73]; ``"12.05"`` -> [12.05]; an empty list when it is not a number."""
    s = normalize(text or "")
    s = re.sub(_SPACE, "", s).replace("\u066c", "").replace("\u066b", ".").replace("’", "'")
    if not s or not re.fullmatch(r"\d+(?:[.,']\d+)*", s):
        return []
    seps = [c for c in s if c in ".,'"]
    if not seps:
        return [float(s)]
    kinds = set(seps)
    groups = re.split(r"[.,']", s)
    if "'" in kinds:  # Swiss thousands: 1'000'000
        kinds.discard("'")
        s = s.replace("'", "")
        if not kinds:
            return [float(s)]
        seps = [c for c in s if c in ".,"]
        groups = re.split(r"[.,]", s)
    if len(kinds) == 2:  # both: the last one is the decimal separator
        dec = seps[-1]
        thou = "," if dec == "." else "."
        if s.count(dec) != 1 or s.rfind(thou) > s.rfind(dec):
            return []
        return [float(s.replace(thou, "").replace(dec, "."))]
    sep = seps[0]
    grouped = all(len(g) == 3 for g in groups[1:]) and 1 <= len(groups[0]) <= 3
    out = []
    if len(seps) > 1:  # 1.000.000 / 1,000,000: only thousands (12.05.1995 is a date: no value)
        return [float("".join(groups))] if grouped else []
    as_decimal = float(groups[0] + "." + groups[1])
    as_thousands = float(groups[0] + groups[1])
    lang = (lang or "").lower()
    if not grouped:
        return [as_decimal]
    if (sep == "," and lang in DECIMAL_POINT) or (sep == "." and lang in DECIMAL_COMMA):
        out = [as_thousands]
    elif (sep == "," and lang in DECIMAL_COMMA) or (sep == "." and lang in DECIMAL_POINT):
        out = [as_decimal]
    else:
        out = [as_thousands, as_decimal]
    return out


# -- written numbers, scale words, months, units -------------------------------------------------------

_WRITTEN = {
    "en": "zero one two three four five six seven eight nine ten eleven twelve thirteen fourteen fifteen sixteen "
          "seventeen eighteen nineteen twenty",
    "de": "null eins zwei drei vier funf sechs sieben acht neun zehn elf zwolf dreizehn vierzehn funfzehn sechzehn "
          "siebzehn achtzehn neunzehn zwanzig",
    "fr": "zero un deux trois quatre cinq six sept huit neuf dix onze douze treize quatorze quinze seize dix-sept "
          "dix-huit dix-neuf vingt",
    "es": "cero uno dos tres cuatro cinco seis siete ocho nueve diez once doce trece catorce quince dieciseis "
          "diecisiete dieciocho diecinueve veinte",
    "it": "zero uno due tre quattro cinque sei sette otto nove dieci undici dodici tredici quattordici quindici "
          "sedici diciassette diciotto diciannove venti",
    "ca": "zero u dos tres quatre cinc sis set vuit nou deu onze dotze tretze catorze quinze setze disset divuit "
          "dinou vint",
    "sv": "noll ett tva tre fyra fem sex sju atta nio tio elva tolv tretton fjorton femton sexton sjutton arton "
          "nitton tjugo",
    "fi": "nolla yksi kaksi kolme nelja viisi kuusi seitseman kahdeksan yhdeksan kymmenen",
    "cs": "nula jedna dva tri ctyri pet sest sedm osm devet deset",
    "eu": "zero bat bi hiru lau bost sei zazpi zortzi bederatzi hamar",
}
#: normalised word -> value (a word that is a number in one language and a common word in another, such as
#: French "un"/Spanish "uno" or Swedish "ett", is only read as a number in its own language)
_WRITTEN_BY_LANG = {lang: {w: float(i) for i, w in enumerate(words.split())} for lang, words in _WRITTEN.items()}
_EXTRA = {"en": {"thirty": 30, "forty": 40, "fifty": 50, "sixty": 60, "seventy": 70, "eighty": 80, "ninety": 90,
                 "hundred": 100, "dozen": 12, "once": 1, "twice": 2},
          "de": {"ein": 1, "eine": 1, "einen": 1, "einer": 1, "dreissig": 30, "vierzig": 40, "funfzig": 50,
                 "hundert": 100, "zwei": 2},
          "fr": {"une": 1, "trente": 30, "quarante": 40, "cinquante": 50, "cent": 100},
          "es": {"una": 1, "un": 1, "treinta": 30, "cuarenta": 40, "cincuenta": 50, "cien": 100},
          "it": {"una": 1, "un": 1, "trenta": 30, "quaranta": 40, "cinquanta": 50, "cento": 100},
          "sv": {"en": 1, "ett": 1, "hundra": 100},
          "fi": {"kahta": 2, "kolmea": 3, "neljaa": 4, "viitta": 5, "kuutta": 6, "sata": 100}}
for _l, _d in _EXTRA.items():
    _WRITTEN_BY_LANG.setdefault(_l, {}).update({k: float(v) for k, v in _d.items()})
# the words "one"/"a" are too common to count as a value: "one of the", "un des"
for _l, _w in (("en", "one"), ("de", "eins"), ("de", "ein"), ("de", "eine"), ("de", "einen"), ("de", "einer"),
               ("fr", "un"), ("fr", "une"), ("es", "un"), ("es", "una"), ("es", "uno"), ("it", "un"), ("it", "una"),
               ("it", "uno"), ("ca", "u"), ("sv", "en"), ("sv", "ett"), ("fi", "yksi"), ("cs", "jedna"),
               ("eu", "bat"), ("en", "once")):
    _WRITTEN_BY_LANG.get(_l, {}).pop(_w, None)

_SCALES = {
    1e3: ("thousand", "thousands", "tausend", "mille", "mil", "mila", "tusen", "tuhatta", "tuhat", "tisic", "tisice",
          "千", "ألف", "آلاف", "هزار", "हज़ार", "हजार"),
    1e4: ("万", "萬"),
    1e5: ("lakh", "lakhs", "लाख"),
    1e6: ("million", "millions", "millionen", "mio", "millones", "millon", "milioni", "milione", "miljoner",
          "miljon", "miljoonaa", "miljoona", "milionu", "miliony", "milion", "milioi", "milio", "m", "mn",
          "مليون", "ملايين", "میلیون", "मिलियन", "百万"),
    1e7: ("crore", "crores", "करोड़", "करोड"),
    1e8: ("亿", "億"),
    1e9: ("billion", "billions", "milliarden", "milliarde", "milliard", "milliards", "mrd", "miliardi", "miliardo",
          "miljarder", "miljard", "miljardia", "miljardi", "miliard", "miliardu", "miliardy", "mil millones",
          "bn", "مليار", "میلیارد", "अरब", "十亿"),
    1e12: ("trillion", "billionen", "billones", "bilioni", "biljoner", "biljoonaa"),
}
_SCALE_OF = {normalize(w): v for v, ws in _SCALES.items() for w in ws}

_MONTHS = {
    1: "january jan januar janvier enero gennaio januari tammikuu tammikuuta gener leden ledna urtarrila "
       "يناير جانفي كانون ژانویه जनवरी",
    2: "february feb februar fevrier febrero febbraio februari helmikuu helmikuuta febrer unor unora otsaila "
       "فبراير فيفري شباط فوریه फ़रवरी फरवरी",
    3: "march mar marz mars marzo maaliskuu maaliskuuta marc brezen brezna martxoa مارس آذار मार्च",
    4: "april apr avril abril aprile huhtikuu huhtikuuta abril duben dubna apirila أبريل إبريل نيسان آوریل अप्रैल",
    5: "may mai mayo maggio maj toukokuu toukokuuta maig kveten kvetna maiatza مايو ماي أيار مه मई",
    6: "june jun juni juin junio giugno kesakuu kesakuuta juny cerven cervna ekaina يونيو جوان حزيران ژوئن जून",
    7: "july jul juli juillet julio luglio heinakuu heinakuuta juliol cervenec cervence uztaila يوليو جويلية "
       "تموز ژوئیه जुलाई",
    8: "august aug aout agosto augusti elokuu elokuuta agost srpen srpna abuztua أغسطس أوت آب اوت अगस्त",
    9: "september sep sept septembre septiembre settembre syyskuu syyskuuta setembre zari zari iraila سبتمبر "
       "أيلول سپتامبر सितंबर सितम्बर",
    10: "october oct oktober octobre octubre ottobre lokakuu lokakuuta octubre rijen rijna urria أكتوبر "
        "تشرين اکتبر अक्टूबर",
    11: "november nov novembre noviembre marraskuu marraskuuta novembre listopad listopadu azaroa نوفمبر "
        "نوامبر नवंबर नवम्बर",
    12: "december dec dezember decembre diciembre dicembre joulukuu joulukuuta desembre prosinec prosince "
        "abendua ديسمبر دسامبر दिसंबर दिसम्बर",
}
_MONTH_OF = {}
for _m, _ws in _MONTHS.items():
    for _w in _ws.split():
        _MONTH_OF.setdefault(normalize(_w), _m)
# too ambiguous as words: "may" (modal verb), "mar"/"sep"/"dec"/"jun"/"jul" abbreviations that are words
for _w in ("may", "mar", "marc", "sep", "juny", "gener"):
    _MONTH_OF.pop(_w, None)
_MONTH_OF.update({"may": 5})  # kept for English dates ("5 May 1990"); counted as a month only near a number
_AMBIGUOUS_MONTHS = {"may"}
_ZH_MONTH = re.compile(r"(\d{1,2})月")

_UNITS = {
    "km": ("km", "kilometre", "kilometres", "kilometer", "kilometers", "kilometern", "kilometro", "kilometros",
           "kilometri", "chilometro", "chilometri", "kilometria", "kilometrin", "kilometrilla", "kilometrit",
           "kilometru", "kilometrů", "kilometry", "كم", "كيلومتر", "کیلومتر", "किलोमीटर", "公里", "千米"),
    "m": ("m", "metre", "metres", "meter", "meters", "metern", "metro", "metros", "metri", "metria", "metrin",
          "metrů", "metru", "metry", "مترا", "متر", "मीटर", "米"),
    "cm": ("cm", "centimetre", "centimetres", "centimeter", "centimeters", "centimetro", "centimetros",
           "centimetri", "senttimetria", "厘米", "公分"),
    "mm": ("mm", "millimetre", "millimetres", "millimeter", "millimeters", "milimetro", "millimetri", "毫米"),
    "km2": ("km2", "km²", "square kilometres", "square kilometers", "quadratkilometer", "quadratkilometern",
            "kilometres carres", "kilometros cuadrados", "chilometri quadrati", "neliokilometria", "平方公里"),
    "mi": ("mi", "mile", "miles", "meile", "meilen", "milla", "millas", "miglia", "mailia", "英里"),
    "ft": ("ft", "foot", "feet", "fuss", "pies", "piedi", "jalkaa", "英尺"),
    "kg": ("kg", "kilogram", "kilograms", "kilogramme", "kilogrammes", "kilogramm", "kilogramos", "chilogrammi",
           "kilogrammaa", "kilo", "kilos", "公斤", "千克"),
    "g": ("gram", "grams", "gramm", "gramme", "grammes", "gramos", "grammi", "克"),
    "t": ("tonne", "tonnes", "ton", "tons", "tonnen", "toneladas", "tonnellate", "tonnia", "吨"),
    "l": ("litre", "litres", "liter", "liters", "litros", "litri", "litraa", "升"),
    "%": ("%", "percent", "per cent", "prozent", "pour cent", "por ciento", "per cento", "procent", "prosenttia",
          "prosentti", "procento", "procent", "portzentua", "٪", "درصد", "प्रतिशत", "百分之"),
    "°c": ("°c", "celsius", "grad", "grados", "gradi", "astetta", "摄氏度", "度"),
    "h": ("h", "hour", "hours", "stunde", "stunden", "heure", "heures", "hora", "horas", "ora", "ore",
          "timme", "timmar", "tuntia", "tunti", "小时"),
    "min": ("min", "minute", "minutes", "minuten", "minutos", "minuti", "minuter", "minuuttia", "分钟"),
    "yr": ("year", "years", "jahr", "jahre", "jahren", "an", "ans", "annees", "ano", "anos", "anno", "anni",
           "ar", "vuotta", "vuosi", "rok", "let", "roku", "年"),
    "$": ("$", "usd", "dollar", "dollars", "dolares", "dollari", "dollaria", "美元"),
    "€": ("€", "eur", "euro", "euros", "euroa", "欧元"),
}
_UNIT_OF = {}
for _u, _ws in _UNITS.items():
    for _w in _ws:
        _UNIT_OF.setdefault(normalize(_w), _u)
# words that are units only right after a number (otherwise too common): "an" (fr), "ar" (sv), "let" (cs),
# "m", "h", "t", "g", "min", "ton", "grad", "ora", "ore", "ano", "an", "度", "年", "米", "克", "升"
_UNIT_NEEDS_NUMBER = {normalize(w) for w in ("an", "ar", "let", "m", "h", "min", "ton", "grad", "ora", "ore", "ano",
                                              "度", "年", "米", "克", "升", "kilo", "kilos", "rok", "roku", "mi", "ft")}


def written_number(word: str, lang: str = "") -> float | None:
    """The value of a written number (``"four"`` -> 4.0) in ``lang`` (or in any language when ``lang`` is not in
    the tables), else None. ``one``/``un``/``ein`` are not read as numbers (too often an article)."""
    w = normalize(word or "")
    table = _WRITTEN_BY_LANG.get((lang or "").lower())
    if table is not None:
        return table.get(w)
    for t in _WRITTEN_BY_LANG.values():
        if w in t:
            return t[w]
    return None


def month_of(word: str) -> int | None:
    """The month (1-12) of a month name or abbreviation in one of the Mu-SHROOM languages, else None."""
    return _MONTH_OF.get(normalize(word or "").rstrip("."))


def unit_of(word: str, after_number: bool = True) -> str | None:
    """The canonical unit of measure of ``word`` (``"kilometres"`` -> ``"km"``), else None; short or ambiguous
    forms (``m``, ``an``, ``年``) only when ``after_number``."""
    w = normalize(word or "")
    u = _UNIT_OF.get(w)
    if u is None:
        return None
    if w in _UNIT_NEEDS_NUMBER and not after_number:
        return None
    return u


def value_kind(values: list[str]) -> str:
    """"year" (one integer value 1000-2100), "num" otherwise (the kind of a number for slot comparison)."""
    for v in values:
        try:
            x = float(v)
        except ValueError:
            continue
        if x.is_integer() and 1000 <= x <= 2100:
            return "year"
    return "num"


# -- mentions ---------------------------------------------------------------------------------------------

@dataclass
class Mention:
    """A value mention ``text[start:end]``: ``values`` it can mean (canonical strings), ``parts`` (the numbers a
    date, time or range is made of), ``kind`` "num", "date", "range", "month", "unit" or "written"."""

    start: int
    end: int
    kind: str
    values: list[str]
    parts: list[str] = field(default_factory=list)


_WORDISH = re.compile(r"[^\W\d_]+|[%°$€٪]|\d+(?:[.,'’\u066b\u066c]\d+)*", re.UNICODE)


def _next_words(text: str, end: int, n: int = 2) -> list[tuple[int, int, str]]:
    out = []
    for m in _WORDISH.finditer(text, end):
        gap = text[end:m.start()]
        if len(gap) > 2 or any(c in ".;:!?\n" for c in gap):
            break
        out.append((m.start(), m.end(), m.group(0)))
        end = m.end()
        if len(out) >= n:
            break
    return out


def mentions(text: str, lang: str = "") -> list[Mention]:
    """Every number, date, range, written number, month name and unit of measure in ``text``, in order."""
    text = text or ""
    out: list[Mention] = []
    taken = []
    # compound numbers first: dates, times, ranges, fractions (12.05.1995, 1887-1889, 10:30, 3/4)
    for m in re.finditer(rf"(?<![{_LETTER}\d])(?:\d{{1,4}}(?:([./-])\d{{1,2}}\1\d{{1,4}})|\d+(?:\s*[-–—/:]\s*\d+)+)"
                         rf"(?![{_LETTER}\d])", text):
        s = m.group(0)
        parts = [canon(float(normalize(p))) for p in re.findall(r"\d+", s) if normalize(p).isdigit()]
        kind = "date" if re.fullmatch(r"\d{1,4}([./-])\d{1,2}\1\d{1,4}", s) else "range"
        vals = list(parts)
        if kind == "date":
            nums = [int(p) for p in parts]
            vals += [f"m{x}" for x in nums[:2] if 1 <= x <= 12]
        out.append(Mention(m.start(), m.end(), kind, vals, parts))
        taken.append((m.start(), m.end()))
    # `taken` comes from one finditer: sorted and disjoint, so a position is looked up by bisection (a scan of
    # every compound per match, and a copy of the text before every word, made long answers quadratic: #35)
    taken_starts = [a for a, _ in taken]

    def in_taken(pos: int) -> bool:
        k = bisect_right(taken_starts, pos) - 1
        return k >= 0 and pos < taken[k][1]

    for m in _NUMBER.finditer(text):
        if in_taken(m.start()):
            continue
        vals = parse_number(m.group(0), lang)
        if not vals:  # e.g. 1.2.3: its digit groups
            parts = [canon(float(p)) for p in re.findall(r"\d+", normalize(m.group(0)))]
            out.append(Mention(m.start(), m.end(), "range", parts, parts))
            continue
        end = m.end()
        scaled = []
        for a, b, w in _next_words(text, end, 2):
            nw = normalize(w)
            key = next((k for k in (nw, nw[:2], nw[:1]) if k in _SCALE_OF), None)
            if key:
                scaled = [canon(v * _SCALE_OF[key]) for v in vals]
                end = a + len(key) if key != nw else b
                break
        values = [canon(v) for v in vals] + scaled
        out.append(Mention(m.start(), end, "num", values, [canon(v) for v in vals]))
    # words: written numbers, month names, units of measure, Chinese "5月"
    nums_end = {mm.end for mm in out}
    for m in _WORDISH.finditer(text):
        w = m.group(0)
        if w[0].isdigit() or in_taken(m.start()):
            continue
        w_end = m.end()
        if text[w_end:w_end + 1].isdigit():  # "km2", "km²" are units; "C7H6O4" holds none
            if unit_of(w + text[w_end]) is None:
                continue
            w, w_end = w + text[w_end], w_end + 1
        nw = normalize(w)
        p = m.start()  # the last character before the word that is no space (text[:p].rstrip()[-1], without a copy)
        while p > 0 and text[p - 1].isspace():
            p -= 1
        prev_char = text[p - 1] if p > 0 else ""
        after_num = bool(prev_char) and (prev_char.isdigit() or any(e in nums_end for e in
                                                                    (m.start() - 1, m.start(), m.start() + 1)))
        val = written_number(w, lang)
        if val is not None:
            out.append(Mention(m.start(), w_end, "written", [canon(val)], [canon(val)]))
            continue
        mo = month_of(w)
        if mo is not None and (nw not in _AMBIGUOUS_MONTHS or prev_char.isdigit() or
                               re.match(r"\s*\d", text[m.end():])):
            out.append(Mention(m.start(), w_end, "month", [f"m{mo}"], []))
            continue
        u = unit_of(w, after_number=after_num)
        if u is not None:
            out.append(Mention(m.start(), w_end, "unit", [f"u:{u}"], []))
    for m in _ZH_MONTH.finditer(text):
        x = int(normalize(m.group(1)))
        if 1 <= x <= 12:
            out.append(Mention(m.end() - 1, m.end(), "month", [f"m{x}"], []))
    # CJK units/scale characters right after a number: 公里, 米, 万
    for m in re.finditer(r"(\d)\s*(平方公里|公里|千米|厘米|毫米|米|公斤|千克|吨|英里|小时|分钟|美元|欧元|%)", text):
        u = unit_of(m.group(2), after_number=True)
        if u:
            out.append(Mention(m.start(2), m.end(2), "unit", [f"u:{u}"], []))
    out.sort(key=lambda x: (x.start, x.end))
    return [m for k, m in enumerate(out) if k == 0 or (m.start, m.end) != (out[k - 1].start, out[k - 1].end)]


@dataclass
class ValueIndex:
    """The values of an evidence text (numbers in every reading, the parts of dates and ranges, months, units)."""

    values: set[str] = field(default_factory=set)

    @classmethod
    def of(cls, text: str, lang: str = "") -> "ValueIndex":
        vals: set[str] = set()
        for m in mentions(text or "", lang):
            vals.update(m.values)
            vals.update(m.parts)
        return cls(vals)

    @property
    def empty(self) -> bool:
        return not self.values


def unit_mentions(units: list[AnswerUnit], ments: list[Mention]) -> list[Mention | None]:
    """For each unit, the first mention (in list order) that overlaps it, or None.

    Mentions sorted by start (as :func:`mentions` returns them) are looked up by bisection, O(log n) a unit:
    those starting before the unit ends are a prefix of the list, and the first of them that ends after the unit
    starts is where the running maximum of their ends first passes the unit's start. (Scanning every mention for
    every unit made a 50,000-character answer take a second, and grew quadratically: #35.)"""
    if any(ments[k].start > ments[k + 1].start for k in range(len(ments) - 1)):  # unsorted: the plain scan
        return [next((m for m in ments if m.start < u.end and u.start < m.end), None) for u in units]
    starts = [m.start for m in ments]
    max_end, running = [], float("-inf")
    for m in ments:
        running = max(running, m.end)
        max_end.append(running)
    out: list[Mention | None] = []
    for u in units:
        hi = bisect_left(starts, u.end)  # ments[:hi] start before the unit ends
        k = bisect_right(max_end, u.start)  # the first mention ending after the unit starts (max_end is sorted)
        out.append(ments[k] if k < hi else None)
    return out


def specific(value: str) -> bool:
    """Whether a value says something when found *somewhere* in the evidence: months, units of measure,
    decimals, and integers from 100 (small integers, written numbers and the parts of football scores occur in
    almost any text: they count as support only in the aligned evidence sentence, :mod:`.align`)."""
    try:
        x = float(value)
    except ValueError:
        return True
    return not (x.is_integer() and x < 100)


def mention_support(m: Mention | None, idx: ValueIndex) -> float:
    """The share of a mention's meaning the evidence holds: 1.0 when one of its :func:`specific` values is
    there (for a date or range: the share of its specific parts that are), 0.0 otherwise, when it has no
    specific value, or when there is no mention."""
    if m is None or idx.empty:
        return 0.0
    if m.kind in ("date", "range"):
        parts = [p for p in m.parts if specific(p)]
        return sum(p in idx.values for p in parts) / len(parts) if parts else 0.0
    return 1.0 if any(v in idx.values for v in m.values if specific(v)) else 0.0


def value_support(answer: str, units: list[AnswerUnit], idx: ValueIndex, lang: str = "",
                  ments: list[Mention] | None = None) -> list[float]:
    """Per unit of ``answer``: :func:`mention_support` of the value mention it belongs to (0.0 for units that
    are no value)."""
    ments = mentions(answer, lang) if ments is None else ments
    return [mention_support(m, idx) for m in unit_mentions(units, ments)]


# -- the signal ---------------------------------------------------------------------------------------

NUMBERS = ("ctx_value",)


@register_signal
class NumbersSignal(Signal):
    """Value support (#19, cost none, on by default): ``ctx_value`` — the unit's value (a number in any format, a
    date's or a range's parts, a month, a unit of measure) is in the context; with it on, ``unsup`` of
    :mod:`.support` also counts value support in the context and the question (``9,73 km²`` supports ``9.73 square
    kilometres``)."""

    name, columns, cost, order = "numbers", NUMBERS, "none", 20
    compute_order = 5  # before support, whose unsup reads the values

    def compute(self, item) -> dict[str, list[float]]:
        ments = mentions(item.answer, item.lang)
        ctx_value = value_support(item.answer, item.units, ValueIndex.of(item.context, item.lang), item.lang, ments)
        item.state["numbers"] = {"q_value": value_support(item.answer, item.units,
                                                          ValueIndex.of(item.question or "", item.lang), item.lang,
                                                          ments)}
        item.used.append("numbers")
        return {"ctx_value": ctx_value}
