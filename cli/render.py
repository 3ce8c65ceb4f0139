"""``halluscope detect --format text``: a detection for people, drawn with `rich`.

The answer with its marked spans as :func:`halluscope.core.contract.display_marks` decides them (the web page shows
the same: colour on a terminal; ``[[hallucinated]]`` and ``{{possibly}}`` brackets when colour is off: a pipe,
``NO_COLOR``, ``TERM=dumb``; a unit the detector calls supported is never marked, nothing is marked on an
unverifiable answer), the verdict (hallucinated, correct, or cannot verify, with its reason) and score, the counts labelled as
:func:`halluscope.core.contract.describe_counts` labels them (the web page shows the same line), the top units with
their probability and reason, the signals used (evidence passages by source, optional signals left out) and
any failures. Long answers wrap at the terminal's width (80 columns off a terminal); nothing is cut.
"""

from __future__ import annotations

import codecs
import json
from typing import IO

from rich.console import Console
from rich.markup import escape
from rich.table import Table
from rich.text import Text

from halluscope.core.contract import NOTE_TEXT, counts, describe_counts, display_marks

__all__ = ["FORMATS", "choose_format", "make_console", "marked_answer", "render_detection", "write_row"]

FORMATS = ("json", "jsonl", "text")
HARD_STYLE, SOFT_STYLE = "bold white on red3", "black on yellow"
HARD_BRACKETS, SOFT_BRACKETS = ("[[", "]]"), ("{{", "}}")


def choose_format(requested: str | None, stream: IO | None) -> str:
    """``requested``, else ``text`` on a terminal and ``json`` otherwise (a pipe, a file, a closed stdout)."""
    if requested:
        return requested
    try:
        return "text" if stream is not None and stream.isatty() else "json"
    except (ValueError, OSError):  # a closed stream
        return "json"


def make_console(stream: IO) -> Console:
    """A console on ``stream``: colour only on a terminal and without ``NO_COLOR`` (rich reads both)."""
    return Console(file=stream, highlight=False, soft_wrap=False, emoji=False)


def colour_on(console: Console) -> bool:
    return console.color_system is not None and not console.no_color


def marked_answer(answer: str, marks: list[dict], *, colour: bool) -> Text:
    """The answer with its ``marks`` (:func:`halluscope.core.contract.display_marks`) shown: red for
    ``hallucinated``, yellow for ``possibly``; without colour, ``[[ ]]`` and ``{{ }}``."""
    text = Text(overflow="fold")
    pos = 0
    for m in sorted(marks, key=lambda r: r["start"]):
        start, end = max(pos, int(m["start"])), int(m["end"])
        if start >= end:
            continue
        text.append(answer[pos:start])
        hard = m["kind"] == "hallucinated"
        if colour:
            text.append(answer[start:end], style=HARD_STYLE if hard else SOFT_STYLE)
        else:
            left, right = HARD_BRACKETS if hard else SOFT_BRACKETS
            text.append(f"{left}{answer[start:end]}{right}")
        pos = end
    text.append(answer[pos:])
    if not colour:  # adjacent runs of one kind read as one: [[Los]][[ Angeles]] -> [[Los Angeles]]
        text = Text(text.plain.replace("]][[", "").replace("}}{{", ""), overflow="fold")
    return text


def _signals(row: dict) -> str:
    evidence = row.get("evidence") or []
    by_source: dict[str, int] = {}
    for e in evidence:
        by_source[e.get("source") or "?"] = by_source.get(e.get("source") or "?", 0) + 1
    used = ", ".join(f"{n} {src} passage{'' if n == 1 else 's'}" for src, n in by_source.items())
    parts = [f"evidence: {used}" if used else "evidence: none"]
    for note in row.get("notes") or {}:
        parts.append(f"left out: {note} ({NOTE_TEXT.get(note, 'an optional signal was not given')})")
    return "; ".join(parts)


def verdict_text(row: dict) -> str:
    """The response-level verdict in words, from the row's ``verdict`` (the contract settles it: a labelled-correct
    answer holds no hard span): ``HALLUCINATED`` (with the reason when no span shows it), ``CANNOT VERIFY:
    <reason>``, or correct, saying how many doubtful parts are marked. A row from before the contract settled verdicts (label False beside hard spans) still says
    both, never "no hallucination found" above highlighted spans."""
    verdict = row.get("verdict") or ("hallucinated" if row.get("label") else "correct")
    if row.get("label", verdict == "hallucinated"):
        if not row.get("hard_labels") and row.get("verdict_reason"):  # no span to show: say where it came from
            return f"HALLUCINATED: {row['verdict_reason']}"
        return "HALLUCINATED"
    if verdict == "unverifiable":
        return f"CANNOT VERIFY: {row.get('verdict_reason') or 'no evidence was given'}"
    flagged = len(row.get("hard_labels") or [])
    if flagged:
        return (f"likely correct overall (response level), but {flagged} span{'' if flagged == 1 else 's'} "
                f"flagged: check {'it' if flagged == 1 else 'them'}")
    doubtful = sum(1 for m in display_marks(row) if m["kind"] == "possibly")
    if doubtful:
        return (f"no hallucination found; {doubtful} doubtful part{'' if doubtful == 1 else 's'} marked: check "
                f"{'it' if doubtful == 1 else 'them'}")
    return "no hallucination found"


def render_detection(console: Console, row: dict, *, top: int = 5, header: str = "") -> None:
    """Draw one output row (``{"id", "ok", ...Detection.to_dict()}``) on ``console``."""
    if header:
        console.print(Text(header, style="bold"))
    if not row.get("ok", True):
        console.print(Text(f"failed: {row.get('error', 'unknown error')}", style="bold red", overflow="fold"))
        return
    colour = colour_on(console)
    verdict = verdict_text(row)
    line = Text(overflow="fold")
    unverifiable = row.get("verdict") == "unverifiable"
    style = ("bold red" if row.get("label") else
             "bold yellow" if row.get("hard_labels") or unverifiable else "bold green")
    line.append(f"{verdict}", style=style if colour else "")
    line.append(f"   score {float(row.get('score', 0.0)):.2f}")
    console.print(line)
    console.print(Text(describe_counts(counts(row)), overflow="fold"))
    console.print()
    legend = ("red: hallucinated (p > 0.5), yellow: doubtful (0 < p <= 0.5)" if colour
              else "[[hallucinated]] (p > 0.5), {{doubtful}} (0 < p <= 0.5)")
    if unverifiable:
        legend = "nothing marked: there was no evidence to check it against"
    console.print(Text(f"answer — {legend}", style="dim" if colour else ""))
    console.print(marked_answer(row.get("answer", ""), display_marks(row), colour=colour))
    units = sorted(row.get("units") or [], key=lambda u: -float(u.get("score", 0.0)))
    if units:
        console.print()
        shown = units[:top]
        console.print(Text(f"top {len(shown)} of {len(units)} units by probability", style="bold" if colour else ""))
        table = Table(show_edge=False, box=None, pad_edge=False)
        table.add_column("p", justify="right", no_wrap=True)
        table.add_column("unit", overflow="fold")
        table.add_column("reason", overflow="fold")
        for u in shown:
            reason = u.get("rationale") or u.get("label") or ""
            table.add_row(f"{float(u.get('score', 0.0)):.2f}", escape(f"{u.get('kind', '')}: {u.get('text', '')}"),
                          escape(str(reason)))
        console.print(table)
    if row.get("rationale"):
        console.print()
        console.print(Text(f"rationale: {row['rationale']}", overflow="fold"))
    console.print(Text(f"signals: {_signals(row)}", overflow="fold"))
    failures = row.get("failures") or {}
    if failures:
        console.print(Text("failures: " + ", ".join(f"{k}: {v}" for k, v in failures.items()),
                           style="yellow" if colour else "", overflow="fold"))
    if row.get("revision") and row.get("revision") != row.get("answer"):
        console.print(Text(f"revision: {row['revision']}", overflow="fold"))


def write_row(stream: IO, row: dict, fmt: str, *, header: str = "") -> None:
    """One output row on ``stream`` in ``fmt`` (``json``/``jsonl``: one JSON line; ``text``: for people)."""
    if fmt == "text":
        render_detection(make_console(stream), row, header=header)
    else:  # a stream that cannot encode every character (not UTF-8) gets JSON's own escapes: still the same row
        stream.write(json.dumps(row, ensure_ascii=not writes_utf8(stream), default=str) + "\n")
    stream.flush()


def writes_utf8(stream: IO) -> bool:
    """Whether ``stream`` encodes text as UTF-8 (a stream without an ``encoding``, like ``io.StringIO``, counts)."""
    encoding = getattr(stream, "encoding", None)
    if not encoding:
        return True
    try:
        return codecs.lookup(encoding).name == "utf-8"
    except LookupError:
        return False
