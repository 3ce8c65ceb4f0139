"""SpanDetector with a scripted LM: every branch of the program and its offset mapping."""

from __future__ import annotations

import dspy
import pytest

from halluscope.lm.scripted import scripted_lm
from halluscope.programs.registry import get_program
from halluscope.programs.spans.program import SpanDetector

ANSWER = "\nDie spanische Provinz heißt Álava. Álava liegt im Baskenland."


def run(program, responder, adapter=None, **inputs):
    lm = scripted_lm(responder)
    with dspy.context(lm=lm, adapter=adapter or dspy.JSONAdapter()):
        pred = program(**{"question": "Wo?", "answer": ANSWER, "lang": "de", "context": "ctx", **inputs})
    return pred, lm.engine.calls


@pytest.mark.parametrize("adapter", [dspy.JSONAdapter(), dspy.ChatAdapter()])
def test_quotes_map_to_distinct_occurrences_in_order(adapter):
    first = ANSWER.index("Álava")
    second = ANSWER.index("Álava", first + 1)
    pred, calls = run(SpanDetector(), {"spans": [{"text": "Álava", "probability": 0.9},
                                                 {"text": "Álava", "probability": 0.6}]}, adapter)
    assert len(calls) == 1
    assert pred.spans == [{"start": first, "end": first + 5, "prob": 0.9},
                          {"start": second, "end": second + 5, "prob": 0.6}]
    assert pred.hard_labels == [[first, first + 5], [second, second + 5]]
    assert pred.label is True and pred.score == 0.9
    assert pred.failures == {}


def test_inputs_reach_the_model_and_context_can_be_switched_off():
    _, calls = run(SpanDetector(), {"spans": []})
    assert calls[0].inputs["context"] == "ctx"
    assert calls[0].inputs["language"] == "de"
    assert calls[0].inputs["answer"] == ANSWER  # the program passes the answer unchanged; offsets index it
    _, calls = run(SpanDetector(use_context=False), {"spans": []})
    assert calls[0].inputs["context"] == ""


def test_no_spans_means_clean_answer():
    pred, _ = run(SpanDetector(), {"spans": []})
    assert pred.spans == [] and pred.hard_labels == [] and pred.label is False and pred.score == 0.0


def test_unmatched_quotes_are_dropped_and_counted_fuzzy_ones_kept():
    start = ANSWER.index("Baskenland")
    pred, _ = run(SpanDetector(), {"spans": [
        {"text": "im baskenland", "probability": 0.8},  # re-cased: repaired match
        {"text": "Madrid ist die Hauptstadt", "probability": 0.7},  # not in the answer
    ]})
    assert pred.hard_labels == [[start - 3, start + len("Baskenland")]]
    assert pred.failures == {"unmatched": 1}


def test_probabilities_outside_unit_interval_are_counted_invalid():
    pred, _ = run(SpanDetector(), {"spans": [{"text": "Provinz", "probability": 3.5},
                                             {"text": "spanische", "probability": -1},
                                             {"text": "Álava", "probability": 0.8}]})
    probs = {ANSWER[s["start"]:s["end"]]: s["prob"] for s in pred.spans}
    assert probs == {"Álava": 0.8}  # the valid span is kept; 3.5 and -1 are not guessed
    assert pred.failures == {"invalid_span": 2}


def test_unparseable_output_is_a_counted_failure_not_a_crash():
    pred, calls = run(SpanDetector(), lambda call: {"spans": "this is not a list"})
    assert pred.failures == {"parse": 1}
    assert pred.spans == [] and pred.label is False
    assert "error" in pred
    assert len(calls) >= 1


def test_empty_answer_makes_no_call():
    pred, calls = run(SpanDetector(), {"spans": [{"text": "x", "probability": 1}]}, answer="   ")
    assert calls == []
    assert pred.spans == [] and pred.rationale.startswith("empty answer")


def test_chain_of_thought_variant_keeps_the_reasoning():
    pred, calls = run(SpanDetector(reasoning=True), {"reasoning": "Álava is in the Basque Country.",
                                                     "spans": [{"text": "Provinz", "probability": 0.7}]})
    assert "reasoning" in calls[0].outputs
    assert pred.rationale == "Álava is in the Basque Country."
    assert len(pred.hard_labels) == 1


def test_non_latin_and_long_answers_give_valid_offsets():
    zh = "埃菲尔铁塔位于柏林。它建于1889年。"
    pred, _ = run(SpanDetector(), {"spans": [{"text": "柏林", "probability": 0.95}]}, answer=zh, lang="zh")
    s = pred.spans[0]
    assert zh[s["start"]:s["end"]] == "柏林"
    ar = "برج إيفل يقع في برلين."
    pred, _ = run(SpanDetector(), {"spans": [{"text": "برلين", "probability": 0.9}]}, answer=ar, lang="ar")
    s = pred.spans[0]
    assert ar[s["start"]:s["end"]] == "برلين"
    long = ("Lorem ipsum dolor sit amet. " * 720) + "The tower is in Berlin."
    assert len(long) > 20000
    pred, _ = run(SpanDetector(), {"spans": [{"text": "in Berlin", "probability": 0.9}]}, answer=long)
    s = pred.spans[0]
    assert long[s["start"]:s["end"]] == "in Berlin" and s["end"] <= len(long)


def test_registered_builder_options():
    spec = get_program("spans")
    assert spec.level == "span" and spec.uses_lm
    prog = spec.build(reasoning=True, use_context=False)
    assert isinstance(prog.extract, dspy.ChainOfThought) and prog.use_context is False
    assert isinstance(spec.build().extract, dspy.Predict)


def test_gold_examples_become_labeled_demos_with_quoted_spans():
    from halluscope.programs.spans.program import gold_demo_fields

    answer = "Die spanische Provinz heißt Álava."
    i = answer.index("Álava")
    gold = dspy.Example(id="g", question="Wo liegt X?", answer=answer, lang="de", context="",
                        hard_labels=[[i, i + 5]]).with_inputs("question", "answer", "lang", "context")
    fields = gold_demo_fields(gold)
    assert fields["language"] == "de"
    assert [(s.text, s.probability) for s in fields["spans"]] == [("Álava", 1.0)]
    compiled = dspy.LabeledFewShot(k=1).compile(SpanDetector(), trainset=[gold.copy(**fields)])
    lm = scripted_lm({"spans": []})
    with dspy.context(lm=lm, adapter=dspy.ChatAdapter()):
        compiled(question="q", answer="Paris liegt in Italien.", lang="de", context="")
    # the demo reaches the prompt as a worked example (a user/assistant turn before the real question)
    assert len(lm.engine.calls) == 1
    turns = [m["content"] if isinstance(m["content"], str) else str(m["content"]) for m in lm.history[-1]["messages"]]
    demo_user = [t for t in turns if "Wo liegt X?" in t]
    demo_reply = [t for t in turns if "Álava" in t and "[[ ## spans ## ]]" in t and "Wo liegt X?" not in t]
    assert demo_user and demo_reply
