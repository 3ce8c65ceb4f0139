"""Issue #10, input and output validation: loader errors name file, line, field and expectation; gold data is
checked; malformed LM output keeps what is valid; outputs are written safely."""

from __future__ import annotations

import json

import pytest


def test_detect_input_with_a_non_string_lang_is_one_clear_error(tmp_path):
    from halluscope.artifacts.compiled import read_answers

    f = tmp_path / "in.jsonl"
    f.write_text(json.dumps({"id": "a", "answer": "x"}) + "\n" + json.dumps({"id": "b", "answer": "y", "lang": 7}) + "\n")
    with pytest.raises(ValueError) as e:
        read_answers(f)
    msg = str(e.value)
    assert str(f) in msg and "line 2" in msg and "'lang'" in msg and "string" in msg


# -- Mu-SHROOM: official split names, string-encoded token/logit lists, unequal lengths ------------------


def _write_jsonl(path, rows):
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("".join(json.dumps(r, ensure_ascii=False) + "\n" for r in rows), encoding="utf-8")
    return path


def _row(i=1, lang="CA", **kw):
    row = {"id": f"tst-{lang.lower()}-{i}", "lang": lang, "model_input": "q", "model_output_text": "Hola món",
           "hard_labels": [[0, 4]], "soft_labels": [{"start": 0, "end": 4, "prob": 1.0}]}
    row.update(kw)
    return row


@pytest.mark.parametrize("name, labelled", [
    ("test/mushroom.ca-tst.v1.extra.jsonl", True),  # the official labelled test file
    ("mushroom.ca-tst.v1.extra.jsonl", True),  # a flat folder
    ("test/mushroom.ca-tst.v1.jsonl", False),  # the unlabelled one
    ("test/mushroom.ca-test.v2.jsonl", True),  # the name we looked for before
])
def test_test_split_found_by_official_names(tmp_path, name, labelled):
    from halluscope.loaders.mushroom import load_mushroom

    row = _row() if labelled else {k: v for k, v in _row().items() if k not in ("hard_labels", "soft_labels")}
    _write_jsonl(tmp_path / name, [row])
    [ex] = load_mushroom(tmp_path, lang="ca", split="test")
    assert ex.id == "tst-ca-1" and ex.label is (True if labelled else None)


def test_string_encoded_tokens_and_logits_are_accepted(tmp_path):
    from halluscope.loaders.mushroom import load_mushroom

    f = _write_jsonl(tmp_path / "mushroom.ca-tst.v1.extra.jsonl", [_row(
        model_output_tokens=json.dumps(["Hola", " món"]), model_output_logits=json.dumps([-1.5, -7.0]))])
    [ex] = load_mushroom(f, split="test")
    assert ex.model_output_tokens == ["Hola", " món"] and ex.model_output_logits == [-1.5, -7.0]
    bad = _write_jsonl(tmp_path / "bad" / "mushroom.ca-tst.v1.extra.jsonl", [_row(model_output_logits="[1, ")])
    with pytest.raises(ValueError) as e:
        load_mushroom(bad, split="test")
    assert "line 1" in str(e.value) and "model_output_logits" in str(e.value)


def test_logit_baseline_aligns_tokens_and_logits_of_different_lengths():
    from halluscope.programs.baselines.program import LogitBaseline

    answer = "The capital is Paris and more"
    tokens = ["The", " capital", " is", " Paris", " and", " more"]
    logits = [-0.5, -0.4, -0.3, -9.0, -0.5, -0.4]
    full = LogitBaseline()(answer=answer, model_output_tokens=tokens, model_output_logits=logits)
    # one extra logit (an end-of-text token) and one missing: aligned on the common prefix, counted
    longer = LogitBaseline()(answer=answer, model_output_tokens=tokens, model_output_logits=logits + [-3.0])
    shorter = LogitBaseline()(answer=answer, model_output_tokens=tokens[:-1] + [" more"],
                              model_output_logits=logits[:-1])
    for pred in (longer, shorter):
        assert pred.hard_labels, pred
        assert pred.failures.get("logit_length_mismatch") == 1
    assert [15, 20] in [list(h) for h in full.hard_labels] and [15, 20] in [list(h) for h in longer.hard_labels]
    # string-encoded lists (the official Catalan file) work too
    enc = LogitBaseline()(answer=answer, model_output_tokens=json.dumps(tokens), model_output_logits=json.dumps(logits))
    assert enc.hard_labels == full.hard_labels


# -- loader errors: one line naming file, line, field and expectation ----------------------------------


def _load_error(tmp_path, rows=None, raw: bytes | None = None) -> str:
    from halluscope.loaders.mushroom import load_mushroom

    f = tmp_path / "mushroom.de-val.v2.jsonl"
    if raw is not None:
        f.write_bytes(raw)
    else:
        _write_jsonl(f, rows)
    with pytest.raises(ValueError) as e:
        load_mushroom(f)
    msg = str(e.value)
    assert "\n" not in msg and str(f) in msg
    return msg


def test_non_utf8_file_is_one_clear_error(tmp_path):
    good = json.dumps(_row(lang="DE")).encode()
    msg = _load_error(tmp_path, raw=good + b"\n" + json.dumps(_row(2, lang="DE")).encode().replace(b"q", b"\xff") + b"\n")
    assert "line 2" in msg and "UTF-8" in msg


def test_utf8_bom_is_accepted(tmp_path):
    from halluscope.loaders.mushroom import load_mushroom

    f = tmp_path / "mushroom.de-val.v2.jsonl"
    f.write_bytes(b"\xef\xbb\xbf" + json.dumps(_row(lang="DE")).encode() + b"\n")
    [ex] = load_mushroom(f)
    assert ex.id == "tst-de-1"


@pytest.mark.parametrize("field, value, expect", [
    ("hard_labels", "[[0, 4]]", "hard_labels"),
    ("hard_labels", [[0, 99]], "0 <= start < end <="),
    ("hard_labels", [[-1, 3]], "0 <= start < end <="),
    ("hard_labels", [[4, 2]], "0 <= start < end <="),
    ("hard_labels", [[0.5, 3]], "whole number"),
    ("hard_labels", [[float("nan"), 3]], "whole number"),
    ("soft_labels", "x", "soft_labels"),
    ("soft_labels", [{"start": 0, "end": 4, "prob": 7}], "0 <= prob <= 1"),
    ("soft_labels", [{"start": 0, "end": 4, "prob": float("nan")}], "0 <= prob <= 1"),
    ("soft_labels", [{"start": 0, "end": 4}], "prob"),
])
def test_bad_gold_is_refused_naming_the_item(tmp_path, field, value, expect):
    msg = _load_error(tmp_path, [_row(lang="DE", **{field: value})])
    assert "line 1" in msg and field in msg and "tst-de-1" in msg and expect in msg


def test_duplicate_ids_are_refused(tmp_path):
    msg = _load_error(tmp_path, [_row(1, lang="DE"), _row(2, lang="DE"), _row(1, lang="DE")])
    assert "line 3" in msg and "duplicate" in msg and "line 1" in msg



# -- malformed LM output: keep the valid spans, count the invalid ones ---------------------------------


def test_invalid_probabilities_are_counted_not_silently_changed():
    from halluscope.core.text import map_substrings

    text = "alpha beta gamma delta epsilon"
    spans, stats = map_substrings(text, [("alpha", 0.9), ("beta", -1), ("gamma", float("nan")), ("delta", None),
                                         ("epsilon", 7), ("gamma", "high"), ("epsilon", "0.4")])
    assert [(text[s.start:s.end], s.prob) for s in spans] == [("alpha", 0.9), ("delta", 1.0), ("epsilon", 0.4)]
    assert stats.invalid == 4  # -1, NaN, 7 and "high" are not guessed


def test_one_malformed_span_keeps_the_valid_ones():
    import dspy

    from halluscope.programs.registry import get_program
    from halluscope.lm.scripted import scripted_lm

    lm = scripted_lm({"spans": [{"text": "Paris", "probability": 0.9}, {"text": 5}, {"probability": 0.3},
                                {"text": "capital", "probability": -1}]})
    with dspy.context(lm=lm, adapter=dspy.JSONAdapter()):
        out = get_program("spans").make()(question="q", answer="The capital is Paris.", lang="en")
    assert [list(h) for h in out.hard_labels] == [[15, 20]]
    assert out.failures.get("invalid_span") == 3 and "parse" not in out.failures


def test_salvage_quotes_from_raw_output():
    from halluscope.core.text import salvage_quotes

    raw = 'Sure! {"spans": [{"text": "a", "probability": 0.5}, {"text": null}, "b", {"text": "c"}]} trailing'
    assert salvage_quotes(raw, "spans") == ([("a", 0.5), ("c", None)], 2)
    assert salvage_quotes("not json at all", "spans") is None
    assert salvage_quotes('{"spans": 3}', "spans") is None


# -- an over-long prompt is cut, said and counted ----------------------------------------------------


class _ByteTokenizer:
    """One token per byte: enough for the engine's prompt budgeting."""

    def tokenize(self, data: bytes, add_bos=False, special=False):
        return list(data)

    def detokenize(self, toks):
        return bytes(toks)


def test_an_over_long_prompt_is_cut_with_a_warning(tmp_path, caplog):
    import logging

    from halluscope.lm.models import LlamaCppEngine

    gguf = tmp_path / "fake.gguf"
    gguf.write_bytes(b"x")
    engine = LlamaCppEngine(gguf, n_ctx=200)
    engine._llm = _ByteTokenizer()
    messages = [{"role": "system", "content": "Check it."}, {"role": "user", "content": "A" * 1000 + "END"}]
    with caplog.at_level(logging.WARNING, logger="halluscope.lm.models"):
        fitted, truncated = engine._fit(messages, max_tokens=50)
    assert truncated and "[... truncated ...]" in fitted[1]["content"] and fitted[1]["content"].endswith("END")
    assert any("truncated" in r.getMessage() and "n_ctx=200" in r.getMessage() for r in caplog.records)
