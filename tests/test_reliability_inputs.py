"""Issue #24's input probes kept as cheap tests (docs/reliability.md lists them):

* item 2: the Mu-SHROOM Catalan test-file format (tokens and logits stored as Python-repr strings) loads and feeds
  the generator-logit features; such strings are parsed as literals, never evaluated;
* item 3: DOCX/PDF extraction is bounded in uncompressed bytes, pages and time (a zip-bomb DOCX is refused fast,
  with bounded memory; ``POST /v1/evidence`` answers 413/422);
* item 6: every build option and CLI number is type- and range-checked and refused by name (a hypothesis fuzz
  test over option values and generic-dataset gold);
* item 7: loader errors are one line (a traceback only with ``--debug``), and name the line.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from halluscope.literals import TextValueError, parse_text_list, parse_text_value
from halluscope.loaders import load_mushroom

PROJECT_ROOT = Path(__file__).resolve().parent.parent

# -- item 2: the Catalan test-file format ---------------------------------------------------------------------

CA_ANSWER = "La capital de França és Lió, una ciutat gran."
CA_TOKENS = ["La", " capital", " de", " França", " és", " Lió", ",", " una", " ciutat", " gran", "."]
CA_LOGITS = [-0.2, -0.1, -0.05, -0.3, -0.4, -6.5, -0.2, -0.3, -0.3, -0.2, -0.1]


def _catalan_record(item_id: str, tokens=CA_TOKENS, logits=CA_LOGITS) -> dict:
    """A record as the official Catalan test file writes it: tokens and logits as the Python ``repr`` of a list
    (single quotes; not JSON), no labels."""
    assert "'" in repr(tokens) and json.dumps(tokens) != repr(tokens)  # really not JSON
    return {"id": item_id, "lang": "CA", "model_input": "Quina és la capital de França?",
            "model_output_text": CA_ANSWER, "model_id": "some/model",
            "model_output_tokens": repr(tokens), "model_output_logits": repr(logits)}


def _write_catalan(root: Path, records: list[dict]) -> Path:
    path = root / "test" / "mushroom.ca-tst.v1.jsonl"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("".join(json.dumps(r, ensure_ascii=False) + "\n" for r in records), encoding="utf-8")
    return path


def test_the_catalan_test_file_format_loads(tmp_path):
    _write_catalan(tmp_path, [_catalan_record("tst-ca-1"), _catalan_record("tst-ca-2", logits=[
        -0.2, float("nan"), -0.05, -0.3, -0.4, -6.5, -0.2, -0.9, -0.3, -1.1, float("-inf")])])
    examples = load_mushroom(tmp_path, lang="ca", split="test")
    assert [e.id for e in examples] == ["tst-ca-1", "tst-ca-2"]
    assert examples[0].model_output_tokens == CA_TOKENS and examples[0].model_output_logits == CA_LOGITS
    logits = examples[1].model_output_logits  # repr(nan) / repr(-inf) are names, read as the floats
    assert logits[1] != logits[1] and logits[-1] == float("-inf")
    assert all(e.label is None and e.hard_labels == [] for e in examples)


def test_catalan_logits_feed_grounded_and_the_logits_baseline():
    from halluscope.programs.registry import get

    grounded = get("grounded").make()
    as_lists = grounded(answer=CA_ANSWER, model_output_tokens=CA_TOKENS, model_output_logits=CA_LOGITS)
    as_repr = grounded(answer=CA_ANSWER, model_output_tokens=repr(CA_TOKENS), model_output_logits=repr(CA_LOGITS))
    assert "malformed_logits" not in as_repr.failures and "no_logits" not in as_repr.failures
    assert as_repr.soft_labels == as_lists.soft_labels
    logits = get("logits").make()(answer=CA_ANSWER, model_output_tokens=repr(CA_TOKENS),
                                   model_output_logits=repr(CA_LOGITS))
    assert "malformed_logits" not in logits.failures
    assert [CA_ANSWER[s:e] for s, e in logits.hard_labels] == ["Lió"]  # the one low-logit token


def test_detect_on_the_catalan_file_does_not_mark_rows_malformed(tmp_path, capsys):
    """``halluscope detect --lang ca --input`` with the committed cross-lingual grounded artifact (no LM)."""
    from halluscope import cli

    src = _write_catalan(tmp_path, [_catalan_record(f"tst-ca-{i}") for i in range(3)])
    out = tmp_path / "out.jsonl"
    assert cli.main(["detect", "--lang", "ca", "--input", str(src), "--output", str(out), "--no-progress",
                     "--compiled-dir", str(PROJECT_ROOT / "compiled")]) == 0
    rows = [json.loads(line) for line in out.read_text(encoding="utf-8").splitlines()]
    assert len(rows) == 3 and all(r["ok"] for r in rows)
    for row in rows:
        assert not {"malformed_logits", "no_logits", "logits_length"} & set(row["failures"]), row["failures"]


def test_repr_fields_are_parsed_as_literals_never_evaluated(tmp_path):
    marker = tmp_path / "pwned"
    hostile = f"__import__('os').system('touch {marker}')"
    _write_catalan(tmp_path, [{**_catalan_record("tst-ca-1"), "model_output_tokens": hostile}])
    with pytest.raises(ValueError, match=r"mushroom\.ca-tst\.v1\.jsonl: line 1: field 'model_output_tokens': "
                                         r"expected a list"):
        load_mushroom(tmp_path, lang="ca", split="test")
    assert not marker.exists()


@pytest.mark.parametrize("text,value", [
    ('["a", "b"]', ["a", "b"]),  # JSON first
    ("['a', \"b\", '\\u2581c']", ["a", "b", "\u2581c"]),
    ("(1, -2.5, +3)", [1, -2.5, 3]),
    ("[np.float32(-1.5), numpy.float64(2.0), np.int64(3)]", [-1.5, 2.0, 3]),  # numpy 2's repr of its scalars
    ("[{'start': 0, 'end': 4, 'prob': 1.0}]", [{"start": 0, "end": 4, "prob": 1.0}]),  # pandas' CSV of a list
    ("[None, True, False]", [None, True, False]),
])
def test_parse_text_value_reads_json_and_python_literals(text, value):
    assert parse_text_value(text) == value


@pytest.mark.parametrize("text", [
    "__import__('os').system('true')", "[1, x]", "(lambda: 1)()", "[1 + 2]", "[i for i in range(3)]",
    "open('/etc/passwd').read()", "np.float32(np)", "b'bytes'", "{**{}}", "[" * 100_000, "[1, 2", "",
    "[os.environ]", "{[1]: 2}", "-'a'",
])
def test_parse_text_value_refuses_anything_but_literals(text):
    with pytest.raises(TextValueError):
        parse_text_value(text)


def test_parse_text_list_wants_a_list():
    assert parse_text_list("(1, 2)") == [1, 2]
    with pytest.raises(TextValueError, match="expected a list, got dict"):
        parse_text_list("{'a': 1}")
