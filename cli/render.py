"""``halluscope detect --format text``: a detection for people, drawn with `rich`.

The answer with its marked spans (colour on a terminal; ``[[hallucinated]]`` and ``{{possibly}}`` brackets
when colour is off: a pipe, ``NO_COLOR``, ``TERM=dumb``), the verdict and score, the counts labelled as
:func:`halluscope.core.contract.describe_counts` labels them (the web page shows the same line), the top units with
their probability and reason, the signals used (evidence passages by source, optional signals left out) and
any failures. Long answers wrap at the terminal's width (80 columns off a terminal); nothing is cut.
"""

from __future__ import annotations

import json
from typing import IO

from rich.console import Console
from rich.markup import escape
from rich.table import Table
from rich.text import Text

from halluscope.core.contract import NOTE_TEXT, counts, describe_counts

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


def marked_answer(answer: str, soft_labels: list[dict], hard_labels: list[list[int]], *, colour: bool) -> Text:
    """The answer with its spans marked: each soft-label run coloured by its probability (p > 0.5 red, else
    yellow) or, without colour, hard spans in ``[[ ]]`` and the other marked runs in ``{{ }}``."""
    text = Text(overflow="fold")
    if colour:
        pos = 0
        for run in sorted(soft_labels, key=lambda r: r["start"]):
            start, end = max(pos, int(run["start"])), int(run["end"])
            if start >= end:
                continue
            text.append(answer[pos:start])
            text.append(answer[start:end], style=HARD_STYLE if run["prob"] > 0.5 else SOFT_STYLE)
            pos = end
        text.append(answer[pos:])
        return text
    # brackets: each character's class (2 = inside a hard span, 1 = marked with p <= 0.5), runs bracketed
    cls = [0] * len(answer)
    for run in soft_labels:
        for i in range(max(0, int(run["start"])), min(len(answer), int(run["end"]))):
            cls[i] = 1
    for start, end in hard_labels:
        for i in range(max(0, int(start)), min(len(answer), int(end))):
            cls[i] = 2
    out, i = [], 0
    while i < len(answer):
        j = i + 1
        while j < len(answer) and cls[j] == cls[i]:
            j += 1
        left, right = {0: ("", ""), 1: SOFT_BRACKETS, 2: HARD_BRACKETS}[cls[i]]
        out.append(f"{left}{answer[i:j]}{right}")
        i = j
    text.append("".join(out))
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
    """The response-level verdict in words. The response label and the word-level spans can disagree (a response
    head fitted on response labels may judge an answer correct overall while some words stay flagged): the
    verdict then says both, never "no hallucination found" above highlighted spans."""
    if row.get("label"):
        return "HALLUCINATED"
    flagged = len(row.get("hard_labels") or [])
    if flagged:
        return (f"likely correct overall (response level), but {flagged} span{'' if flagged == 1 else 's'} "
                f"flagged: check {'it' if flagged == 1 else 'them'}")
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
    style = "bold red" if row.get("label") else ("bold yellow" if row.get("hard_labels") else "bold green")
    line.append(f"{verdict}", style=style if colour else "")
    line.append(f"   score {float(row.get('score', 0.0)):.2f}")
    console.print(line)
    console.print(Text(describe_counts(counts(row)), overflow="fold"))
    console.print()
    legend = ("red: hallucinated (p > 0.5), yellow: possibly (0 < p <= 0.5)" if colour
              else "[[hallucinated]] (p > 0.5), {{possibly}} (0 < p <= 0.5)")
    console.print(Text(f"answer — {legend}", style="dim" if colour else ""))
    console.print(marked_answer(row.get("answer", ""), row.get("soft_labels") or [], row.get("hard_labels") or [],
                                colour=colour))
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
    else:
        stream.write(json.dumps(row, ensure_ascii=False, default=str) + "\n")
    stream.flush()
