"""Issue #10, input and output validation: loader errors name file, line, field and expectation; gold data is
checked; malformed LM output keeps what is valid; outputs are written safely."""

from __future__ import annotations

import json

import pytest


def test_detect_input_with_a_non_string_lang_is_one_clear_error(tmp_path):
    from halluscope.detector import read_answers

    f = tmp_path / "in.jsonl"
    f.write_text(json.dumps({"id": "a", "answer": "x"}) + "\n" + json.dumps({"id": "b", "answer": "y", "lang": 7}) + "\n")
    with pytest.raises(ValueError) as e:
        read_answers(f)
    msg = str(e.value)
    assert str(f) in msg and "line 2" in msg and "'lang'" in msg and "string" in msg
