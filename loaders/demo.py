"""The built-in demo set: a tiny hand-written, Mu-SHROOM-format data root so every command runs
without the real data.

It is *not* Mu-SHROOM: numbers measured on it mean nothing beyond "the pipeline runs". Each item has
a question, an answer with deliberate, clearly wrong facts (``hallucinated``), a short *true*
context (native language and English), 2-3 annotators whose spans differ slightly, and gold labels
derived from the annotations exactly as the task defines them:

* ``soft_labels``: per character, the share of annotators whose spans cover it, as maximal runs;
* ``hard_labels``: characters with probability ``> 0.5``, adjacent runs merged.

All offsets are computed from substrings (each marked substring must occur exactly once in its
answer), never typed by hand. Tokens are a whitespace split with the leading whitespace kept (for
Chinese, one token per character, ASCII runs kept together), so ``"".join(tokens) == answer``; the
made-up logits are low on tokens that overlap a hard label.
"""

from __future__ import annotations

import hashlib
import json
import os
import random
import re
import shutil
import zlib
from dataclasses import asdict, dataclass, field
from pathlib import Path

from halluscope.core.contract import hard_labels_from_soft
from halluscope.core.fileio import file_lock, write_text_atomic
from halluscope.core import paths

__all__ = [
    "DemoItem",
    "DEMO_ITEMS",
    "DEMO_LANGS",
    "DEMO_VERSION",
    "DEMO_NOTICE",
    "DEMO_MODEL_ID",
    "demo_records",
    "write_demo_data",
    "demo_data_dir",
]

DEMO_MODEL_ID = "halluscope-demo/hand-written"
_GENERATOR_VERSION = "1"

A1, A2, A3 = "annotator_demo_a", "annotator_demo_b", "annotator_demo_c"


@dataclass(frozen=True)
class DemoItem:
    """One hand-written item. ``annotations`` maps annotator -> the substrings they marked;
    ``hallucinated`` lists the substrings the majority marks (what ``hard_labels`` must point at)."""

    id: str
    lang: str
    question: str
    answer: str
    context: str
    context_en: str
    wikipedia_url: str
    annotations: dict[str, tuple[str, ...]] = field(default_factory=dict)
    hallucinated: tuple[str, ...] = ()


DEMO_ITEMS: tuple[DemoItem, ...] = (
    # ----------------------------------------------------------------- English
    DemoItem(
        "demo-en-1", "en",
        "What is the capital of Australia?",
        "The capital of Australia is Sydney.",
        "Canberra is the capital city of Australia. The site was chosen in 1908 as a compromise "
        "between Sydney and Melbourne, the two largest cities.",
        "",
        "https://en.wikipedia.org/wiki/Canberra",
        {A1: ("Sydney",), A2: ("Sydney",), A3: ("is Sydney",)},
        ("Sydney",),
    ),
    DemoItem(
        "demo-en-2", "en",
        "Who wrote the novel Pride and Prejudice?",
        "Pride and Prejudice was written by Charlotte Brontë and published in 1813.",
        "Pride and Prejudice is a novel by Jane Austen, first published in 1813.",
        "",
        "https://en.wikipedia.org/wiki/Pride_and_Prejudice",
        {A1: ("Charlotte Brontë",), A2: ("Charlotte Brontë",), A3: ("Brontë",)},
        ("Charlotte Brontë",),
    ),
    DemoItem(
        "demo-en-3", "en",
        "What is the boiling point of water at sea level in degrees Fahrenheit?",
        "At sea level, water boils at 212 degrees Fahrenheit.",
        "At standard atmospheric pressure (sea level), pure water boils at 100 °C, which is 212 °F.",
        "",
        "https://en.wikipedia.org/wiki/Boiling_point",
        {A1: (), A2: (), A3: ()},
        (),
    ),
    DemoItem(
        "demo-en-4", "en",
        "Who was the first person to walk on the Moon?",
        "Apollo 11 landed on the Moon on July 20, 1969, and Buzz Aldrin was the first person to "
        "step onto the surface.",
        "Apollo 11 landed on the Moon on July 20, 1969. Commander Neil Armstrong was the first "
        "person to step onto the lunar surface; Buzz Aldrin joined him about 19 minutes later.",
        "",
        "https://en.wikipedia.org/wiki/Apollo_11",
        {A1: ("Buzz Aldrin",), A2: ("Buzz Aldrin was the first person",), A3: ("Buzz Aldrin",)},
        ("Buzz Aldrin",),
    ),
    DemoItem(
        "demo-en-5", "en",
        "What is the chemical symbol for gold?",
        "The chemical symbol for gold is Ag, and its atomic number is 79.\n",
        "Gold is a chemical element with the symbol Au (from Latin aurum) and atomic number 79.",
        "",
        "https://en.wikipedia.org/wiki/Gold",
        {A1: ("Ag",), A2: ("Ag",), A3: ("Ag,",)},
        ("Ag",),
    ),
    DemoItem(
        "demo-en-6", "en",
        "How tall is Mount Everest and where is it?",
        "Mount Everest is 8,849 metres tall and lies on the border between Nepal and India.",
        "Mount Everest lies on the border between Nepal and China (the Tibet Autonomous Region). "
        "Its elevation of 8,848.86 m was established in 2020 by Chinese and Nepali authorities.",
        "",
        "https://en.wikipedia.org/wiki/Mount_Everest",
        {A1: ("India",), A2: ("India",), A3: ("Nepal and India",)},
        ("India",),
    ),
    DemoItem(
        "demo-en-7", "en",
        "Who painted the Mona Lisa and where is it displayed?",
        "The Mona Lisa was painted by Michelangelo and is displayed in the Uffizi Gallery in "
        "Florence.",
        "The Mona Lisa is a portrait painted by the Italian artist Leonardo da Vinci. It has been "
        "on permanent display at the Louvre in Paris since 1797.",
        "",
        "https://en.wikipedia.org/wiki/Mona_Lisa",
        {
            A1: ("Michelangelo", "Uffizi Gallery in Florence"),
            A2: ("Michelangelo", "Uffizi Gallery"),
            A3: ("Michelangelo", "the Uffizi Gallery in Florence"),
        },
        ("Michelangelo", "Uffizi Gallery in Florence"),
    ),
    # ----------------------------------------------------------------- German
    DemoItem(
        "demo-de-1", "de",
        "Was ist die Hauptstadt von Deutschland?",
        "\nDie Hauptstadt von Deutschland ist München.",
        "Berlin ist die Hauptstadt und ein Land der Bundesrepublik Deutschland sowie ihre "
        "bevölkerungsreichste Stadt.",
        "Berlin is the capital of Germany, one of its federal states and its most populous city.",
        "https://de.wikipedia.org/wiki/Berlin",
        {A1: ("München",), A2: ("München.",), A3: ("ist München",)},
        ("München",),
    ),
    DemoItem(
        "demo-de-2", "de",
        "Wer komponierte die Oper „Die Zauberflöte“?",
        "Die Zauberflöte wurde von Ludwig van Beethoven komponiert und 1791 in Wien uraufgeführt.",
        "Die Zauberflöte ist eine Oper von Wolfgang Amadeus Mozart. Die Uraufführung fand am "
        "30. September 1791 im Freihaustheater auf der Wieden in Wien statt.",
        "The Magic Flute is an opera by Wolfgang Amadeus Mozart. It premiered on 30 September 1791 "
        "at the Freihaustheater auf der Wieden in Vienna.",
        "https://de.wikipedia.org/wiki/Die_Zauberflöte",
        {A1: ("Ludwig van Beethoven",), A2: ("Beethoven",), A3: ("Ludwig van Beethoven",)},
        ("Ludwig van Beethoven",),
    ),
    DemoItem(
        "demo-de-3", "de",
        "Wo mündet der Rhein?",
        "Der Rhein entspringt in der Schweiz und mündet in das Schwarze Meer.",
        "Der Rhein entspringt im Kanton Graubünden in den Schweizer Alpen und mündet in den "
        "Niederlanden in die Nordsee.",
        "The Rhine rises in the canton of Graubünden in the Swiss Alps and flows into the North "
        "Sea in the Netherlands.",
        "https://de.wikipedia.org/wiki/Rhein",
        {A1: ("Schwarze Meer",), A2: ("das Schwarze Meer",), A3: ("Schwarze Meer",)},
        ("Schwarze Meer",),
    ),
    DemoItem(
        "demo-de-4", "de",
        "Wie viele Bundesländer hat Deutschland?",
        "Deutschland hat 16 Bundesländer.",
        "Die Bundesrepublik Deutschland ist ein Bundesstaat, der aus 16 Ländern besteht.",
        "The Federal Republic of Germany is a federal state made up of 16 states (Länder).",
        "https://de.wikipedia.org/wiki/Land_(Deutschland)",
        {A1: (), A2: ()},
        (),
    ),
    DemoItem(
        "demo-de-5", "de",
        "Wann fiel die Berliner Mauer?",
        "Die Berliner Mauer fiel am 9. November 1991.",
        "Die Berliner Mauer fiel in der Nacht vom 9. auf den 10. November 1989.",
        "The Berlin Wall fell on the night of 9 to 10 November 1989.",
        "https://de.wikipedia.org/wiki/Berliner_Mauer",
        {A1: ("1991",), A2: ("9. November 1991",), A3: ("1991.",)},
        ("1991",),
    ),
    DemoItem(
        "demo-de-6", "de",
        "Wer war der erste Bundeskanzler der Bundesrepublik Deutschland?",
        "Der erste Bundeskanzler war Willy Brandt, der von 1949 bis 1963 regierte.",
        "Konrad Adenauer (CDU) war von 1949 bis 1963 der erste Bundeskanzler der Bundesrepublik "
        "Deutschland.",
        "Konrad Adenauer (CDU) was the first Chancellor of the Federal Republic of Germany, from "
        "1949 to 1963.",
        "https://de.wikipedia.org/wiki/Konrad_Adenauer",
        # Two annotators: the comma gets 1/2 = 0.5, which is *not* > 0.5.
        {A1: ("Willy Brandt",), A2: ("Willy Brandt,",)},
        ("Willy Brandt",),
    ),
    DemoItem(
        "demo-de-7", "de",
        "Wie hoch ist der höchste Berg Deutschlands?",
        "Der höchste Berg Deutschlands ist die Zugspitze mit einer Höhe von 3.798 Metern.",
        "Die Zugspitze ist mit 2962 m ü. NHN der höchste Gipfel Deutschlands.",
        "At 2,962 m above sea level, the Zugspitze is the highest peak in Germany.",
        "https://de.wikipedia.org/wiki/Zugspitze",
        {A1: ("3.798 Metern",), A2: ("3.798",), A3: ("3.798",)},
        ("3.798",),
    ),
    # ----------------------------------------------------------------- French
    DemoItem(
        "demo-fr-1", "fr",
        "Quelle est la capitale du Canada ?",
        "La capitale du Canada est Toronto.",
        "Ottawa est la capitale du Canada. Elle est située dans la province de l'Ontario, sur la "
        "rivière des Outaouais.",
        "Ottawa is the capital of Canada. It lies in the province of Ontario, on the Ottawa River.",
        "https://fr.wikipedia.org/wiki/Ottawa",
        {A1: ("Toronto",), A2: ("Toronto",), A3: ("Toronto.",)},
        ("Toronto",),
    ),
    DemoItem(
        "demo-fr-2", "fr",
        "Qui a écrit « Les Misérables » ?",
        "« Les Misérables » est un roman d'Émile Zola publié en 1862.",
        "Les Misérables est un roman de Victor Hugo publié en 1862.",
        "Les Misérables is a novel by Victor Hugo, published in 1862.",
        "https://fr.wikipedia.org/wiki/Les_Misérables",
        {A1: ("Émile Zola",), A2: ("d'Émile Zola",), A3: ("Zola",)},
        ("Émile Zola",),
    ),
    DemoItem(
        "demo-fr-3", "fr",
        "En quelle année a eu lieu la prise de la Bastille ?",
        "La prise de la Bastille a eu lieu le 14 juillet 1789.",
        "La prise de la Bastille a eu lieu à Paris le mardi 14 juillet 1789.",
        "The storming of the Bastille took place in Paris on Tuesday, 14 July 1789.",
        "https://fr.wikipedia.org/wiki/Prise_de_la_Bastille",
        # Correct answer; one annotator marked a span anyway: soft labels but no hard labels.
        {A1: (), A2: (), A3: ("14 juillet",)},
        (),
    ),
    DemoItem(
        "demo-fr-4", "fr",
        "Quel est le plus long fleuve de France ?",
        "Le plus long fleuve de France est la Seine, qui se jette dans la mer Méditerranée.",
        "La Loire est le plus long fleuve coulant entièrement en France, avec 1 006 km. La Seine "
        "se jette dans la Manche entre Le Havre et Honfleur.",
        "The Loire, 1,006 km long, is the longest river flowing entirely within France. The Seine "
        "flows into the English Channel between Le Havre and Honfleur.",
        "https://fr.wikipedia.org/wiki/Loire_(fleuve)",
        {
            A1: ("Seine", "mer Méditerranée"),
            A2: ("la Seine", "la mer Méditerranée"),
            A3: ("Seine", "Méditerranée"),
        },
        ("Seine", "mer Méditerranée"),
    ),
    # ----------------------------------------------------------------- Chinese
    DemoItem(
        "demo-zh-1", "zh",
        "中国的首都是哪里？",
        "中国的首都是上海。",
        "北京是中华人民共和国的首都，也是全国的政治和文化中心。",
        "Beijing is the capital of the People's Republic of China and the country's political and "
        "cultural centre.",
        "https://zh.wikipedia.org/wiki/北京市",
        {A1: ("上海",), A2: ("上海。",), A3: ("首都是上海",)},
        ("上海",),
    ),
    DemoItem(
        "demo-zh-2", "zh",
        "《红楼梦》的作者是谁？",
        "《红楼梦》的作者是罗贯中，成书于清代。",
        "《红楼梦》是中国古典长篇章回小说，一般认为前八十回的作者是清代作家曹雪芹。",
        "Dream of the Red Chamber is a classic Chinese novel; its first eighty chapters are "
        "generally attributed to the Qing-dynasty writer Cao Xueqin.",
        "https://zh.wikipedia.org/wiki/红楼梦",
        {A1: ("罗贯中",), A2: ("罗贯中",), A3: ("作者是罗贯中",)},
        ("罗贯中",),
    ),
    DemoItem(
        "demo-zh-3", "zh",
        "水的化学式是什么？",
        "水的化学式是H2O。",
        "水是由氢和氧两种元素组成的无机物，化学式为H2O。",
        "Water is an inorganic compound of hydrogen and oxygen with the chemical formula H2O.",
        "https://zh.wikipedia.org/wiki/水",
        {A1: (), A2: ()},
        (),
    ),
    DemoItem(
        "demo-zh-4", "zh",
        "第一届现代奥林匹克运动会在哪里举行？",
        "第一届现代奥林匹克运动会于1896年在巴黎举行。",
        "1896年夏季奥林匹克运动会是第一届现代奥林匹克运动会，于1896年4月在希腊雅典举行。",
        "The 1896 Summer Olympics, the first modern Olympic Games, were held in Athens, Greece, in "
        "April 1896.",
        "https://zh.wikipedia.org/wiki/1896年夏季奥林匹克运动会",
        {A1: ("巴黎",), A2: ("在巴黎",), A3: ("巴黎",)},
        ("巴黎",),
    ),
    # ----------------------------------------------------------------- Arabic
    DemoItem(
        "demo-ar-1", "ar",
        "ما هي عاصمة مصر؟",
        "عاصمة مصر هي الإسكندرية.",
        "القاهرة هي عاصمة جمهورية مصر العربية وأكبر مدنها، وتقع على ضفاف نهر النيل.",
        "Cairo is the capital and largest city of Egypt; it lies on the banks of the Nile.",
        "https://ar.wikipedia.org/wiki/القاهرة",
        {A1: ("الإسكندرية",), A2: ("الإسكندرية",), A3: ("هي الإسكندرية",)},
        ("الإسكندرية",),
    ),
    DemoItem(
        "demo-ar-2", "ar",
        "من كتب ثلاثية القاهرة؟",
        "كتب ثلاثية القاهرة الكاتب المصري طه حسين.",
        "ثلاثية القاهرة هي ثلاث روايات للكاتب المصري نجيب محفوظ، وهي: بين القصرين وقصر الشوق والسكرية.",
        "The Cairo Trilogy is a set of three novels by the Egyptian writer Naguib Mahfouz: Palace "
        "Walk, Palace of Desire and Sugar Street.",
        "https://ar.wikipedia.org/wiki/نجيب_محفوظ",
        {A1: ("طه حسين",), A2: ("طه حسين",), A3: ("حسين",)},
        ("طه حسين",),
    ),
    DemoItem(
        "demo-ar-3", "ar",
        "كم عدد أيام السنة الكبيسة؟",
        "عدد أيام السنة الكبيسة 366 يومًا.",
        "السنة الكبيسة في التقويم الميلادي تتكون من 366 يومًا بدلًا من 365 يومًا، إذ يضاف يوم 29 فبراير.",
        "A leap year in the Gregorian calendar has 366 days instead of 365, because 29 February is "
        "added.",
        "https://ar.wikipedia.org/wiki/سنة_كبيسة",
        {A1: (), A2: (), A3: ()},
        (),
    ),
    DemoItem(
        "demo-ar-4", "ar",
        "في أي عام هبط الإنسان على سطح القمر لأول مرة؟",
        "هبط الإنسان على سطح القمر لأول مرة عام 1972.",
        "في 20 يوليو 1969 هبطت المركبة القمرية لمهمة أبولو 11 على سطح القمر، وكان نيل أرمسترونغ أول "
        "إنسان يمشي عليه.",
        "On 20 July 1969 the lunar module of the Apollo 11 mission landed on the Moon, and Neil "
        "Armstrong became the first person to walk on it.",
        "https://ar.wikipedia.org/wiki/أبولو_11",
        {A1: ("1972",), A2: ("عام 1972",), A3: ("1972.",)},
        ("1972",),
    ),
)

#: Languages of the demo set, in the order of :data:`loaders.mushroom.LANGS`.
DEMO_LANGS: tuple[str, ...] = tuple(sorted({it.lang for it in DEMO_ITEMS}))

#: Changes whenever the generator or the items change, so :func:`demo_data_dir` rewrites.
DEMO_VERSION: str = (
    _GENERATOR_VERSION
    + "-"
    + hashlib.sha256(
        json.dumps([asdict(it) for it in DEMO_ITEMS], ensure_ascii=False, sort_keys=True).encode()
    ).hexdigest()[:12]
)

DEMO_NOTICE: str = (
    f"!!! USING THE BUILT-IN DEMO SET ({len(DEMO_ITEMS)} items, {', '.join(DEMO_LANGS)}) — not "
    "Mu-SHROOM; scores are meaningless. Pass --data-dir or set HALLUSCOPE_DATA_DIR to the "
    "Mu-SHROOM data root (e.g. ../shared/data/mushroom) !!!"
)


# --------------------------------------------------------------------------- record building


def _locate(answer: str, sub: str, item_id: str) -> list[int]:
    n = answer.count(sub)
    if n != 1:
        raise ValueError(f"{item_id}: marked substring {sub!r} occurs {n} times in the answer")
    start = answer.index(sub)
    return [start, start + len(sub)]


def _soft_from_annotations(annotations: dict[str, list[list[int]]], text_len: int) -> list[dict]:
    """Share of annotators covering each character, as maximal runs of equal non-zero share."""
    n = len(annotations)
    if n == 0:
        return []
    counts = [0] * text_len
    for spans in annotations.values():
        covered = set()
        for s, e in spans:
            covered.update(range(s, e))
        for i in covered:
            counts[i] += 1
    out: list[dict] = []
    i = 0
    while i < text_len:
        j = i
        while j < text_len and counts[j] == counts[i]:
            j += 1
        if counts[i]:
            out.append({"start": i, "end": j, "prob": counts[i] / n})
        i = j
    return out


_CJK_TOKEN = re.compile(r"\s*(?:[A-Za-z0-9]+|\S)")
_WS_TOKEN = re.compile(r"\s*\S+")


def _tokenize(text: str, lang: str) -> list[str]:
    tokens = (_CJK_TOKEN if lang == "zh" else _WS_TOKEN).findall(text)
    rest = text[len("".join(tokens)):]
    if rest:  # trailing whitespace
        tokens.append(rest)
    assert "".join(tokens) == text
    return tokens


def _logits(item_id: str, tokens: list[str], hard: list[list[int]]) -> list[float]:
    rng = random.Random(zlib.crc32(item_id.encode("utf-8")))
    out, pos = [], 0
    for tok in tokens:
        start, end = pos, pos + len(tok)
        pos = end
        bad = any(start < e and s < end for s, e in hard)
        out.append(round(rng.uniform(0.5, 4.0) if bad else rng.uniform(9.0, 15.0), 4))
    return out


def _record(item: DemoItem) -> dict:
    annotations = {
        ann: [_locate(item.answer, sub, item.id) for sub in subs]
        for ann, subs in item.annotations.items()
    }
    soft = _soft_from_annotations(annotations, len(item.answer))
    hard = hard_labels_from_soft(soft)
    got = [item.answer[s:e] for s, e in hard]
    if got != list(item.hallucinated):
        raise ValueError(f"{item.id}: majority spans {got} != declared {list(item.hallucinated)}")
    tokens = _tokenize(item.answer, item.lang)
    return {
        "id": item.id,
        "lang": item.lang.upper(),  # the official files use upper case ("DE")
        "model_input": item.question,
        "model_output_text": item.answer,
        "model_id": DEMO_MODEL_ID,
        "soft_labels": soft,
        "hard_labels": hard,
        "model_output_logits": _logits(item.id, tokens, hard),
        "model_output_tokens": tokens,
        "wikipedia_url": item.wikipedia_url,
        "annotations": annotations,
    }


def demo_records() -> list[dict]:
    """The demo items as official Mu-SHROOM records (dicts), in :data:`DEMO_ITEMS` order."""
    return [_record(it) for it in DEMO_ITEMS]


def _write_text(path: Path, text: str) -> None:
    write_text_atomic(path, text)


def write_demo_data(root: str | os.PathLike) -> Path:
    """Write the demo set as a Mu-SHROOM data root under ``root`` and return ``root``.

    Layout: ``root/val/mushroom.<lang>-val.v2.extra.jsonl`` and
    ``root/context/val/{native,translated-en}/<lang>/<id>.context.txt``.
    """
    root = Path(root)
    by_lang: dict[str, list[dict]] = {}
    for item, rec in zip(DEMO_ITEMS, demo_records()):
        by_lang.setdefault(item.lang, []).append(rec)
        native = item.context
        english = item.context_en or item.context
        _write_text(root / "context" / "val" / "native" / item.lang / f"{item.id}.context.txt", native)
        _write_text(
            root / "context" / "val" / "translated-en" / item.lang / f"{item.id}.context.txt", english
        )
    for lang, recs in by_lang.items():
        _write_text(
            root / "val" / f"mushroom.{lang}-val.v2.extra.jsonl",
            "".join(json.dumps(r, ensure_ascii=False) + "\n" for r in recs),
        )
    return root


def demo_data_dir(root: str | os.PathLike | None = None) -> Path:
    """``root`` (default :func:`halluscope.core.paths.demo_data_dir`: ``<home>/demo_data``), written on first use.

    Idempotent: rewritten only when its ``VERSION`` file differs from :data:`DEMO_VERSION` (the
    generator or the items changed); stale ``val/`` and ``context/`` are removed first. The check-and-write runs
    under an inter-process lock (``<root>/.write.lock``), so concurrent first runs (several ``optimize.py`` in a
    fresh home folder) write the set once, one after the other, and never remove each other's files.
    """
    out = Path(root) if root is not None else paths.demo_data_dir()
    version_file = out / "VERSION"
    if _read_version(version_file) != DEMO_VERSION:
        try:
            with file_lock(out / ".write.lock"):
                if _read_version(version_file) != DEMO_VERSION:  # not written meanwhile by a concurrent process
                    for sub in ("val", "context"):
                        shutil.rmtree(out / sub, ignore_errors=True)
                    write_demo_data(out)
                    _write_text(version_file, DEMO_VERSION + "\n")  # last: a partial write is redone
        except OSError as e:  # a read-only working folder without $HALLUSCOPE_HOME: one line that says what to do
            where = f"set ${paths.HOME_ENV} to a writable folder" if root is None else "choose a writable folder"
            raise OSError(f"cannot write the built-in demo set to {out} ({e.strerror or e}): {where}, or pass "
                          f"--data-dir (or ${paths.MUSHROOM_DATA_ENV}) for real data") from e
    return out


def _read_version(version_file: Path) -> str | None:
    try:
        return version_file.read_text(encoding="utf-8").strip()
    except OSError:
        return None
