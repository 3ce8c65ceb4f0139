"""Issue #10: property-based fuzzing of the paths malformed LM output and malformed input go through — span mapping,
the contract, the loaders, the logits baseline and the metrics. Every generated case must end in a result with
valid offsets (0 <= start < end <= len(answer), probabilities in [0, 1]) or in the one documented error
(``ValueError`` naming the file for a bad data file); anything else is a crash.

Together the tests below run more than 10,000 generated cases (the ``max_examples`` add up to 10,900);
``derandomize=True`` makes every CI run try the same cases, and no example database is written.
"""

from __future__ import annotations

import json
import math
import warnings

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from halluscope.core.contract import Detection, Span, hard_labels_from_soft, normalize_spans
from halluscope.metrics.adapters import METRICS, aggregate
from halluscope.programs.baselines.program import LogitBaseline
from halluscope.core.text import map_substrings, salvage_quotes

FUZZ = dict(deadline=None, derandomize=True, database=None,
            suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much,
                                   HealthCheck.function_scoped_fixture])

texts = st.text(alphabet=st.characters(codec="utf-8", exclude_categories=("Cs",)), max_size=80)
junk = st.one_of(st.none(), st.booleans(), st.integers(-10**6, 10**6), st.floats(allow_nan=True, allow_infinity=True),
                 texts, st.lists(st.integers(-5, 100), max_size=3), st.dictionaries(texts, st.integers(), max_size=2))
probs = st.one_of(st.none(), st.floats(allow_nan=True, allow_infinity=True), st.integers(-3, 3), texts, st.booleans())


def assert_valid_spans(spans, n: int) -> None:
    for s in spans:
        start, end, p = (s.start, s.end, s.prob) if isinstance(s, Span) else (s["start"], s["end"], s["prob"])
        assert isinstance(start, int) and isinstance(end, int) and 0 <= start < end <= n, (start, end, n)
        assert isinstance(p, float) and math.isfinite(p) and 0.0 <= p <= 1.0, p


def assert_valid_hard(hard, n: int) -> None:
    for start, end in hard:
        assert 0 <= start < end <= n


# -- span mapping: quotes as an LM writes them, right or wrong --------------------------------------


@st.composite
def answer_and_quotes(draw):
    answer = draw(texts)
    quotes = []
    for _ in range(draw(st.integers(0, 6))):
        if answer and draw(st.booleans()):  # a real substring, perhaps re-cased or padded
            i = draw(st.integers(0, len(answer) - 1))
            j = draw(st.integers(i + 1, len(answer)))
            q = answer[i:j]
            q = draw(st.sampled_from([q, q.upper(), f" {q}. ", q[:-1] + "x"]))
        else:
            q = draw(st.one_of(texts, st.none()))
        quotes.append((q, draw(probs)))
    return answer, quotes


@settings(max_examples=3000, **FUZZ)
@given(answer_and_quotes(), st.floats(0.0, 1.0))
def test_map_substrings_always_gives_valid_spans(case, threshold):
    answer, quotes = case
    spans, stats = map_substrings(answer, quotes, threshold=threshold)
    assert_valid_spans(spans, len(answer))
    assert len(spans) + stats.unmatched + stats.invalid == len(quotes)


@st.composite
def raw_lm_output(draw):
    """What an LM may send back for ``spans``: JSON with good and bad items, truncated JSON, prose, NaN."""
    items = draw(st.lists(st.one_of(
        st.fixed_dictionaries({"text": texts, "probability": probs.filter(lambda p: not isinstance(p, str))}),
        st.dictionaries(st.sampled_from(["text", "probability", "prob", "span"]), junk, max_size=3),
        junk), max_size=6))
    body = json.dumps({"spans": items}, default=str, allow_nan=True)
    cut = draw(st.integers(0, len(body)))
    return draw(st.sampled_from([body, body[:cut], f"Sure! {body} hope it helps", draw(texts), "{" + body]))


@settings(max_examples=2000, **FUZZ)
@given(raw_lm_output(), texts)
def test_salvaged_lm_output_maps_to_valid_spans(raw, answer):
    salvaged = salvage_quotes(raw, "spans")
    if salvaged is None:
        return
    quotes, invalid = salvaged
    assert invalid >= 0 and all(isinstance(q, str) for q, _ in quotes)
    spans, _ = map_substrings(answer, quotes)
    assert_valid_spans(spans, len(answer))


# -- the contract ---------------------------------------------------------------------------------


@settings(max_examples=2000, **FUZZ)
@given(texts, st.lists(st.tuples(junk, junk, probs), max_size=6), junk)
def test_detection_normalises_any_spans(answer, raw_spans, score):
    det = Detection(answer=answer, spans=raw_spans, score=score)
    n = len(answer)
    assert_valid_spans(det.spans, n)
    assert_valid_spans(det.soft_labels, n)
    assert_valid_hard(det.hard_labels, n)
    assert 0.0 <= det.score <= 1.0
    again = Detection.from_dict(json.loads(det.to_json()))
    assert again.spans == det.spans
    assert_valid_hard(hard_labels_from_soft(det.soft_labels), n)
    assert normalize_spans(det.spans, n) == det.spans


# -- the logits baseline on arbitrary token/logit lists -------------------------------------------


@settings(max_examples=1200, **FUZZ)
@given(texts, st.one_of(st.lists(texts, max_size=8), texts, junk),
       st.one_of(st.lists(st.one_of(st.floats(allow_nan=True, allow_infinity=True), junk), max_size=9), texts, junk),
       st.floats(-3, 3))
def test_logit_baseline_never_crashes(answer, tokens, logits, shift):
    pred = LogitBaseline(shift=shift)(answer=answer, model_output_tokens=tokens, model_output_logits=logits)
    assert_valid_spans(pred.spans, len(answer))
    assert_valid_hard(pred.hard_labels, len(answer))


# -- the loaders on malformed files -----------------------------------------------------------------


@st.composite
def mushroom_line(draw):
    answer = draw(texts)
    rec = {"id": draw(st.one_of(st.text(alphabet="abc-123", min_size=1, max_size=6), junk)),
           "lang": "DE", "model_input": draw(st.one_of(texts, junk)), "model_output_text": draw(st.one_of(texts, junk))}
    n = len(answer)
    if draw(st.booleans()):
        rec["hard_labels"] = draw(st.one_of(st.lists(st.lists(st.one_of(st.integers(-2, n + 2), junk), min_size=2,
                                                               max_size=2), max_size=3), junk))
    if draw(st.booleans()):
        rec["soft_labels"] = draw(st.one_of(st.lists(st.fixed_dictionaries(
            {"start": st.integers(-2, n + 2), "end": st.integers(-2, n + 2), "prob": probs}), max_size=3), junk))
    if draw(st.booleans()):
        rec["model_output_logits"] = draw(st.one_of(st.lists(st.floats(), max_size=4), texts, junk))
    line = json.dumps(rec, default=str, allow_nan=True).encode("utf-8")
    return draw(st.sampled_from([line, line[: draw(st.integers(0, len(line)))], b"\xef\xbb\xbf" + line,
                                 line.replace(b"a", b"\xff", 1), b"[1, 2]", b""]))


@settings(max_examples=1200, **FUZZ)
@given(st.lists(mushroom_line(), min_size=1, max_size=4))
def test_mushroom_loader_loads_valid_items_or_names_the_problem(tmp_path_factory, lines):
    from halluscope.loaders.mushroom import load_mushroom

    f = tmp_path_factory.mktemp("fuzz") / "mushroom.de-val.v2.jsonl"
    f.write_bytes(b"\n".join(lines) + b"\n")
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            examples = load_mushroom(f)
    except ValueError as e:
        assert str(f) in str(e) and "\n" not in str(e)
        return
    for ex in examples:
        n = len(ex.answer)
        assert_valid_hard(ex.hard_labels, n)
        assert_valid_spans(ex.soft_labels, n) if all(isinstance(d["prob"], float) for d in ex.soft_labels) else None
        for d in ex.soft_labels:
            assert 0 <= d["start"] < d["end"] <= n and 0.0 <= d["prob"] <= 1.0


@settings(max_examples=500, **FUZZ)
@given(st.lists(st.one_of(st.dictionaries(st.sampled_from(["id", "answer", "question", "lang", "context",
                                                            "model_output_text"]), junk, max_size=5),
                          junk), min_size=1, max_size=4))
def test_detect_input_reader_accepts_or_names_the_line(tmp_path_factory, rows):
    from halluscope.artifacts.compiled import read_answers

    f = tmp_path_factory.mktemp("fuzz") / "in.jsonl"
    f.write_text("".join(json.dumps(r, default=str) + "\n" for r in rows))
    try:
        out = read_answers(f)
    except ValueError as e:
        assert str(f) in str(e) and "line" in str(e)
        return
    assert all(isinstance(r["answer"], str) and isinstance(r["question"], str) for r in out)


@st.composite
def halluclean_qa_file(draw):
    def rec():
        fields = ["knowledge", "question", "right_answer", "hallucinated_answer"]
        return st.dictionaries(st.sampled_from(fields + ["id", "extra"]), st.one_of(texts, junk), max_size=6)
    recs = draw(st.lists(st.one_of(rec(), junk), max_size=4))
    body = json.dumps(recs, default=str, allow_nan=True).encode("utf-8")
    return draw(st.sampled_from([body, body[: draw(st.integers(0, len(body)))], b"\xef\xbb\xbf" + body,
                                 body.replace(b"e", b"\xff", 1), b"{}", b"", b"null"]))


@settings(max_examples=600, **FUZZ)
@given(halluclean_qa_file())
def test_halluclean_loader_loads_valid_cases_or_names_the_file(tmp_path_factory, body):
    from halluscope.loaders.halluclean import load_halluclean

    folder = tmp_path_factory.mktemp("fuzz")
    f = folder / "QA.dev.json"
    f.write_bytes(body)
    try:
        examples = load_halluclean(folder, task="qa")
    except ValueError as e:
        assert str(f) in str(e) and "\n" not in str(e), str(e)
        return
    for ex in examples:
        assert isinstance(ex.answer, str) and isinstance(ex.question, str) and isinstance(ex.label, bool)


# -- the metrics on malformed predictions ---------------------------------------------------------


@st.composite
def gold_and_prediction(draw):
    import dspy

    answer = draw(st.text(min_size=0, max_size=30))
    n = len(answer)
    spans = draw(st.lists(st.tuples(st.integers(0, n), st.integers(0, n), st.floats(0, 1)), max_size=3))
    gold = Detection(answer=answer, spans=[Span(s, e, p) for s, e, p in spans if s < e])
    ex = dspy.Example(id="x", answer=answer, hard_labels=gold.hard_labels, soft_labels=gold.soft_labels,
                      label=bool(gold.hard_labels)).with_inputs("answer")
    pred = draw(st.one_of(
        st.none(), junk,
        st.fixed_dictionaries({"hard_labels": st.one_of(st.lists(st.lists(st.one_of(st.integers(-3, n + 3), junk),
                                                                          max_size=3), max_size=3), junk),
                               "soft_labels": st.one_of(st.lists(st.dictionaries(
                                   st.sampled_from(["start", "end", "prob"]), junk, max_size=3), max_size=3), junk),
                               "label": junk}),
        st.builds(lambda d: d.to_dict() | {"answer": answer},
                  st.builds(Detection, st.just(answer), st.lists(st.tuples(st.integers(-2, n + 2),
                                                                           st.integers(-2, n + 2), probs),
                                                                 max_size=3)))))
    return ex, pred


@settings(max_examples=1000, **FUZZ)
@given(st.lists(gold_and_prediction(), min_size=1, max_size=4), st.sampled_from(sorted(METRICS)))
def test_metrics_score_anything_in_the_unit_interval(pairs, metric):
    examples = [ex for ex, _ in pairs]
    preds = [p for _, p in pairs]
    value = aggregate(metric, examples, preds)
    assert isinstance(value, float) and math.isfinite(value) and -1.0 <= value <= 1.0 + 1e-9


def test_the_fuzz_budget_is_at_least_ten_thousand_cases():
    import sys

    module = sys.modules[__name__]
    total = sum(f._hypothesis_internal_use_settings.max_examples for name, f in vars(module).items()
                if name.startswith("test_") and hasattr(f, "_hypothesis_internal_use_settings"))
    assert total >= 10_000, total
