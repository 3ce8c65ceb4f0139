"""``halluscope detect`` for people (#23 item 1): ``--format text`` with rich, brackets without colour, long
answers wrapped whole, JSON when stdout is not a terminal, a closed stdout refused before any work."""

from __future__ import annotations

import io
import json
import re

import pytest
from rich.console import Console

from halluscope.cli import main
from halluscope.cli.render import choose_format, marked_answer, render_detection, verdict_text
from halluscope.core.contract import Detection, Evidence, Span, Unit, display_marks

ANSWER = "The capital of Spain is Barcelona, founded in 1492."
ANSI = re.compile(r"\x1b\[[0-9;]*m")


def _row(answer: str = ANSWER) -> dict:
    b, y = answer.index("Barcelona"), answer.index("1492")
    det = Detection(answer=answer, spans=[Span(b, b + 9, 0.9), Span(y, y + 4, 0.3)], label=True, score=0.9,
                    units=[Unit("word", b, b + 9, "Barcelona", "unsupported", 0.9, "not in the evidence"),
                           Unit("num", y, y + 4, "1492", "doubtful", 0.3)],
                    notes={"no_logits": 1}, evidence=[Evidence("Madrid is the capital.", "context")])
    return {"id": "answer", "ok": True, **det.to_dict()}


def test_brackets_mark_hard_and_soft_spans_without_colour():
    row = _row()
    text = marked_answer(row["answer"], display_marks(row), colour=False).plain
    assert text == "The capital of Spain is [[Barcelona]], founded in {{1492}}."
    # #34: a unit the detector calls supported is never shown as doubtful, whatever its probability
    row["units"][1]["label"] = "supported"
    assert marked_answer(row["answer"], display_marks(row), colour=False).plain == \
        "The capital of Spain is [[Barcelona]], founded in 1492."


def test_colour_marks_spans_by_probability_and_keeps_the_answer_whole():
    row = _row()
    text = marked_answer(row["answer"], display_marks(row), colour=True)
    assert text.plain == ANSWER
    styles = {ANSWER[s.start:s.end]: str(s.style) for s in text.spans}
    assert "red" in styles["Barcelona"] and "yellow" in styles["1492"]


def _render(row, width: int = 60, **console_kw) -> str:
    buf = io.StringIO()
    render_detection(Console(file=buf, width=width, **console_kw), row)
    return buf.getvalue()


def test_the_verdict_never_says_no_hallucination_above_flagged_spans():
    # a response head may judge the answer correct overall while words stay flagged: the verdict says both
    row = {**_row(), "label": False, "score": 0.3}
    assert verdict_text(row) == "likely correct overall (response level), but 1 span flagged: check it"
    assert "no hallucination found" not in _render(row, width=200)
    assert verdict_text({**row, "hard_labels": [[0, 1], [2, 3]]}).endswith("but 2 spans flagged: check them")
    assert verdict_text({**row, "hard_labels": [], "soft_labels": []}) == "no hallucination found"
    assert verdict_text({**row, "label": True}) == "HALLUCINATED"
    # labelled hallucinated with no span to show: the verdict line says where the label came from
    whole = Detection(answer=ANSWER, label=True, score=0.9, units=[Unit("word", 24, 33, "Barcelona", "supported", 0.4)],
                      evidence=[Evidence("x")])
    line = verdict_text({"id": "a", "ok": True, **whole.to_dict()})
    assert line.startswith("HALLUCINATED: the response score 0.90") and "as a whole" in line


def test_the_verdict_says_cannot_verify_without_evidence_and_doubtful_parts_when_correct():
    det = Detection(answer="Paris is the capital of France.", label=False, score=0.5, notes={"no_evidence": 1})
    row = {"id": "a", "ok": True, **det.to_dict()}
    assert verdict_text(row).startswith("CANNOT VERIFY: no evidence was given")
    out = _render(row, width=200)
    assert "CANNOT VERIFY" in out and "[[" not in out and "{{" not in out
    det = Detection(answer=ANSWER, spans=[Span(24, 33, 0.5)], label=False, score=0.2,
                    units=[Unit("word", 24, 33, "Barcelona", "doubtful", 0.5)], evidence=[Evidence("x")])
    row = {"id": "a", "ok": True, **det.to_dict()}
    assert verdict_text(row) == "no hallucination found; 1 doubtful part marked: check it"
    assert "{{Barcelona}}" in _render(row, width=200)


def test_text_view_off_a_terminal_has_no_escape_codes_and_says_everything():
    out = _render(_row(), width=200)
    assert not ANSI.search(out)
    assert "HALLUCINATED" in out and "score 0.90" in out
    assert "1 hallucinated span (p > 0.5) · 2 marked spans (p > 0) · 1 of 2 units flagged" in out
    assert "[[Barcelona]]" in out and "{{1492}}" in out
    assert "0.90" in out and "not in the evidence" in out  # the top unit with its probability and reason
    assert "evidence: 1 context passage" in out and "left out: no_logits" in out
    assert "failures" not in out  # a missing optional signal is no failure


def test_no_color_on_a_terminal_uses_brackets(monkeypatch):
    monkeypatch.setenv("NO_COLOR", "1")
    out = _render(_row(), force_terminal=True)
    assert "[[Barcelona]]" in out and "\x1b[41m" not in out and not re.search(r"\x1b\[[0-9;]*4[13]m", out)


def test_colour_on_a_terminal_highlights_instead_of_brackets(monkeypatch):
    monkeypatch.delenv("NO_COLOR", raising=False)
    out = _render(_row(), force_terminal=True, color_system="standard")
    assert ANSI.search(out) and "[[Barcelona]]" not in out and "Barcelona" in ANSI.sub("", out)


def test_a_very_long_answer_wraps_and_is_never_cut():
    answer = ANSWER + " " + " ".join(f"word{i}" for i in range(400)) + " " + "x" * 150 + " END"
    out = _render(_row(answer))
    assert max(len(line) for line in out.splitlines()) <= 60
    body = re.sub(r"\s+", "", out)
    assert re.sub(r"\s+", "", answer.replace("Barcelona", "[[Barcelona]]").replace("1492", "{{1492}}")) in body


def test_json_is_the_default_off_a_terminal():
    class Tty(io.StringIO):
        def isatty(self):
            return True

    assert choose_format(None, io.StringIO()) == "json"
    assert choose_format(None, Tty()) == "text"
    assert choose_format(None, None) == "json"
    assert choose_format("jsonl", Tty()) == "jsonl"


GROUNDED = ["detect", "--lang", "de", "--program", "grounded", "--answer",
            "Die Hauptstadt von Frankreich ist Lyon.", "--context", "Die Hauptstadt von Frankreich ist Paris."]


def test_detect_prints_json_to_a_pipe_and_text_when_asked(capsys):
    assert main(GROUNDED) == 0  # the committed grounded artifact for de; no LM
    row = json.loads(capsys.readouterr().out)
    assert row["ok"] and row["notes"] == {"no_logits": 1} and "no_logits" not in row["failures"]
    assert row["evidence"] == [{"text": "Die Hauptstadt von Frankreich ist Paris.", "source": "context", "id": "",
                                "score": 0.0}]
    assert main([*GROUNDED, "--format", "text"]) == 0
    out = capsys.readouterr().out
    assert "[[Lyon]]" in out and "left out: no_logits" in out and not ANSI.search(out)


def test_detect_with_a_closed_stdout_is_refused_before_any_work(monkeypatch, capsys):
    monkeypatch.setattr("sys.stdout", None)
    with pytest.raises(SystemExit) as e:
        main(GROUNDED)
    assert e.value.code == 2
    assert "stdout is closed" in capsys.readouterr().err


@pytest.mark.parametrize("encoding", ["ascii", "latin-1"])
def test_detect_on_a_stdout_that_cannot_encode_the_answer_still_writes_it(monkeypatch, encoding):
    """A non-UTF-8 locale or a Windows pipe: JSON escapes what the stream cannot encode (the row reads back
    exactly), the text view shows it as escapes; before, the first umlaut or CJK character was a traceback."""
    answer = "长城位于日本, die Brücke ist grün."
    argv = ["detect", "--lang", "de", "--program", "grounded", "--answer", answer, "--context", "Die Brücke ist rot."]
    raw = io.BytesIO()
    monkeypatch.setattr("sys.stdout", io.TextIOWrapper(raw, encoding=encoding, write_through=True))
    assert main(argv) == 0
    assert json.loads(raw.getvalue().decode(encoding))["answer"] == answer
    raw.seek(0), raw.truncate()
    assert main([*argv, "--format", "text"]) == 0
    text = raw.getvalue().decode(encoding)
    assert "\\u957f\\u57ce" in text and "rationale:" in text  # 长城 as escapes; the view written to its end


def test_an_answer_python_decoded_in_an_ascii_locale_is_read_as_utf8(capsys):
    """LC_ALL=C without locale coercion (PYTHONCOERCECLOCALE=0, a system with no C.UTF-8): Python hands the
    arguments' UTF-8 bytes over as surrogates; the answer is read as the UTF-8 it is, so the offsets point into
    the text the user typed."""
    typed = "Die Brücke ist grün."
    as_python_saw_it = typed.encode("utf-8").decode("ascii", "surrogateescape")
    assert as_python_saw_it != typed
    assert main(["detect", "--lang", "de", "--program", "grounded", "--answer", as_python_saw_it,
                 "--context", "Die Brücke ist rot."]) == 0
    row = json.loads(capsys.readouterr().out)
    assert row["answer"] == typed
    assert [typed[s["start"]:s["end"]] for s in row["spans"]][-1:] == ["grün"]
