"""A Choice decision of more than two labels asks the backend for more token alternatives (#21 round five).

A small model's top-20 alternatives at a label's position often hold only the first label, so the others got
probability 0 and no fitted weight could move the decision. The decisions adapter now asks for as many
alternatives as the backend returns (``core.decisions.max_top_logprobs``) for such a Choice only; Boolean and
two-label requests are the ones they always were (20), so DSPy's cached requests keep hitting."""

from __future__ import annotations

import dataclasses
import json
import math
from types import SimpleNamespace
from typing import Literal

import dspy
import httpx
import pytest
from dspy.lm15 import TopLogprob

from halluscope.core.decisions import (TOP_LOGPROBS, max_top_logprobs, top_logprobs_for, with_logprob_decisions)
from halluscope.lm.models import LlamaCppEngine
from halluscope.lm.openai_client import OpenAICompatEngine
from halluscope.lm.scripted import ScriptedEngine, scripted_lm

LABELS = ["correct", "hallucinated", "unverifiable"]


class Verify(dspy.Signature):
    """Is the claim correct, hallucinated or unverifiable?"""

    claim: str = dspy.InputField()
    label: Literal["correct", "hallucinated", "unverifiable"] = dspy.OutputField(desc="the verdict")


class Check(dspy.Signature):
    """Is the claim true?"""

    claim: str = dspy.InputField()
    answer: bool = dspy.OutputField(desc="Yes or No")


class Pick(dspy.Signature):
    """Which one?"""

    claim: str = dspy.InputField()
    side: Literal["left", "right"] = dspy.OutputField(desc="left or right")


# 25 tokens more likely than "hallucinated" (the answer's own words): it is the 27th alternative
CROWDED = {"correct": 0.40, **{f"word{i}": 0.02 for i in range(25)}, "hallucinated": 0.01, "unverifiable": 0.005}


def _verify_lm(max_alternatives: int):
    lm = scripted_lm({"label": "correct", "answer": "Yes", "side": "left"},
                     logprobs=lambda call: {"label": CROWDED, "answer": {"Yes": 0.8, "No": 0.2},
                                            "side": {"left": 0.6, "right": 0.4}})
    lm.engine.max_top_logprobs = max_alternatives
    return lm


def _decide(lm, signature, fields):
    predict = dspy.Predict(signature)
    predict.fields = fields
    with dspy.context(lm=lm, adapter=with_logprob_decisions(dspy.JSONAdapter())):
        return predict(claim="Berlin is in France.")


def test_how_many_alternatives_each_backend_gives_and_each_decision_asks_for():
    three = {"label": ("choice", LABELS)}
    assert max_top_logprobs(SimpleNamespace(engine=LlamaCppEngine)) == LlamaCppEngine.max_top_logprobs > 20
    assert max_top_logprobs(SimpleNamespace(engine=OpenAICompatEngine)) == 20
    assert max_top_logprobs(dspy.LM("openai/gpt-4o-mini")) == 20  # hosted through LiteLLM: OpenAI's maximum
    assert max_top_logprobs(SimpleNamespace(engine=SimpleNamespace(max_top_logprobs=5))) == 20  # never below 20
    embedded = SimpleNamespace(engine=LlamaCppEngine)
    assert top_logprobs_for(embedded, three) == LlamaCppEngine.max_top_logprobs
    assert top_logprobs_for(embedded, {"verdict": ("noul", ["Yes", "No"])}) == TOP_LOGPROBS == 20
    assert top_logprobs_for(embedded, {"side": ("choice", ["left", "right"])}) == 20
    assert top_logprobs_for(embedded, {"verdict": ("noul", ["Yes", "No"]), **three}) == LlamaCppEngine.max_top_logprobs
    assert top_logprobs_for(SimpleNamespace(engine=OpenAICompatEngine), three) == 20


def test_a_label_beyond_the_20th_alternative_gets_its_probability_and_the_weights_move_the_decision():
    weights = {"label": {"weights": {"correct": 0.02, "hallucinated": 1.0, "unverifiable": 1.0}}}
    capped, wide = _verify_lm(20), _verify_lm(300)
    # capped at 20 (a remote backend): "hallucinated" is not among them, P = 0, no weight can pick it
    assert _decide(capped, Verify, weights).label == "correct"
    assert capped.engine.calls[-1].top_logprobs == 20
    # the embedded engine's 300: every label has its probability, and the fitted weights decide
    assert _decide(wide, Verify, weights).label == "hallucinated"  # 0.40 * 0.02 < 0.01
    assert wide.engine.calls[-1].top_logprobs == 300
    with dspy.context(lm=wide, adapter=with_logprob_decisions(dspy.JSONAdapter())):
        from halluscope.core.decisions import decision_evidence

        predict = dspy.Predict(Verify)
        predict.fields = {"label": {"weights": dict.fromkeys(LABELS, 1.0)}}
        with decision_evidence() as log:
            predict(claim="x")
    probs = log[-1][2]["probabilities"]
    assert probs == pytest.approx({"correct": 0.40 / 0.415, "hallucinated": 0.01 / 0.415,
                                   "unverifiable": 0.005 / 0.415})


def test_boolean_and_two_label_requests_ask_for_20_alternatives_on_the_embedded_engine_too():
    lm = _verify_lm(300)
    assert _decide(lm, Check, {"answer": {"threshold": 0.5}}).answer is True
    assert _decide(lm, Pick, {"side": {"weights": {"left": 1.0, "right": 1.0}}}).side == "left"
    assert [c.top_logprobs for c in lm.engine.calls] == [20, 20]
    # what DSPy's cache key hashes: the request's kwargs, as before this change
    assert [(h["kwargs"]["logprobs"], h["kwargs"]["top_logprobs"]) for h in lm.history] == [(True, 20), (True, 20)]


def test_a_boolean_request_hits_a_cache_entry_written_with_20_alternatives(tmp_path):
    """The disk cache written before this change holds Boolean requests asked with top_logprobs=20: the same
    program now asks the same request, so it is served from the cache, not the engine."""
    from dspy.clients.cache import Cache

    cache = Cache(enable_disk_cache=True, enable_memory_cache=False, disk_cache_dir=str(tmp_path / "c"))
    old = dspy.cache
    dspy.cache = cache
    try:
        first = scripted_lm({"answer": "Yes"}, logprobs=lambda call: {"answer": {"Yes": 0.8, "No": 0.2}}, cache=True)
        first.engine.max_top_logprobs = 20  # what every engine returned before
        assert _decide(first, Check, {"answer": {"threshold": 0.5}}).answer is True
        second = scripted_lm({"answer": "No"}, logprobs=lambda call: {"answer": {"Yes": 0.1, "No": 0.9}}, cache=True)
        second.engine.max_top_logprobs = 300
        assert _decide(second, Check, {"answer": {"threshold": 0.5}}).answer is True  # the cached P(Yes) 0.8
        assert len(first.engine.calls) == 1 and not second.engine.calls
    finally:
        dspy.cache = old


def test_an_openai_compatible_server_is_asked_for_20_alternatives_at_most():
    bodies = []
    reply = json.dumps({"label": "correct"})

    def server(request: httpx.Request) -> httpx.Response:
        body = json.loads(request.content)
        bodies.append(body)
        top = [{"token": t, "logprob": math.log(p)} for t, p in list(CROWDED.items())[: body["top_logprobs"]]]
        content = [{"token": '{"label": "', "logprob": -0.01, "top_logprobs": []},
                   {"token": "correct", "logprob": math.log(0.4), "top_logprobs": top},
                   {"token": '"}', "logprob": -0.01, "top_logprobs": []}]
        return httpx.Response(200, json={"id": "c", "object": "chat.completion", "model": "m", "choices": [
            {"index": 0, "message": {"role": "assistant", "content": reply}, "finish_reason": "stop",
             "logprobs": {"content": content}}], "usage": {"prompt_tokens": 5, "completion_tokens": 3,
                                                         "total_tokens": 8}})

    engine = OpenAICompatEngine("http://127.0.0.1:9/v1", "m", retries=0, transport=httpx.MockTransport(server))
    lm = dspy.LM("openai/m", engine=engine, num_retries=0, cache=False)
    weights = {"label": {"weights": {"correct": 0.02, "hallucinated": 1.0, "unverifiable": 1.0}}}
    assert _decide(lm, Verify, weights).label == "correct"  # "hallucinated" is not among the server's 20
    lm("x", logprobs=True, top_logprobs=300)  # asked directly for more: the engine still sends 20
    assert [b["top_logprobs"] for b in bodies] == [20, 20]


@pytest.mark.embedded
def test_the_embedded_model_gives_each_label_of_a_three_label_choice_a_probability(tmp_path):
    from halluscope.core.decisions import decision_evidence
    from halluscope.lm.models import make_lm

    lm = make_lm("local", cache=False, max_tokens=64)
    predict = dspy.Predict(Verify)
    predict.fields = {"label": {"weights": dict.fromkeys(LABELS, 1.0)}}
    with dspy.context(lm=lm, adapter=with_logprob_decisions(dspy.JSONAdapter())), decision_evidence() as log:
        predict(claim="The Eiffel Tower is in Berlin.")
    assert lm.history[-1]["kwargs"]["top_logprobs"] == LlamaCppEngine.max_top_logprobs
    probs = log[-1][2]["probabilities"]
    assert set(probs) == set(LABELS) and all(p > 0 for p in probs.values()), probs


# ------------------------------------------------------------------------------------------------------
# Contextual calibration of a Choice (per-label division by a content-free request's probabilities)
# ------------------------------------------------------------------------------------------------------


def test_contextual_choice_divides_each_label_by_its_content_free_probability():
    from halluscope.core.decisions import contextual_choice, contextual_probability

    probs = {"correct": 0.90, "hallucinated": 0.08, "unverifiable": 0.02}
    prior = {"correct": 0.95, "hallucinated": 0.04, "unverifiable": 0.01}
    ratio = {"correct": 0.90 / 0.95, "hallucinated": 2.0, "unverifiable": 2.0}
    total = sum(ratio.values())
    assert contextual_choice(probs, prior) == pytest.approx({k: v / total for k, v in ratio.items()})
    # a flat prior changes nothing; two labels: the Boolean formula
    assert contextual_choice(probs, dict.fromkeys(probs, 1 / 3)) == pytest.approx(probs)
    assert contextual_choice({"Yes": 0.93, "No": 0.07}, {"Yes": 0.81, "No": 0.19})["Yes"] == pytest.approx(
        contextual_probability(0.93, 0.81))
    # a label the content-free input gave 0 (or was not read) stays finite; a label missing from the prior is kept
    out = contextual_choice(probs, {"correct": 0.99, "hallucinated": 0.0})
    assert all(0 < v < 1 for v in out.values()) and sum(out.values()) == pytest.approx(1.0)
    assert out["hallucinated"] > 0.99


def test_calibrated_by_a_choice_prior_changes_the_probabilities_before_the_weights():
    from halluscope.core.decisions import calibrated_by, choice_probabilities, decision_evidence

    lm = _verify_lm(300)
    predict = dspy.Predict(Verify)
    predict.fields = {"label": {"weights": dict.fromkeys(LABELS, 1.0)}}
    prior = {"correct": 0.97, "hallucinated": 0.01, "unverifiable": 0.02}
    with dspy.context(lm=lm, adapter=with_logprob_decisions(dspy.JSONAdapter())):
        with decision_evidence() as raw_log:
            assert predict(claim="x").label == "correct"
        with decision_evidence() as log, calibrated_by({"label": prior}):
            pred = predict(claim="x")
    raw = choice_probabilities(raw_log, predict, "label")
    got = choice_probabilities(log, predict, "label")
    assert raw == pytest.approx({"correct": 0.40 / 0.415, "hallucinated": 0.01 / 0.415, "unverifiable": 0.005 / 0.415})
    ratio = {k: raw[k] / prior[k] for k in LABELS}
    assert got == pytest.approx({k: v / sum(ratio.values()) for k, v in ratio.items()})
    assert pred.label == "hallucinated"  # P / prior: hallucinated 2.41, correct 0.99: the calibrated argmax
    assert choice_probabilities(log, object(), "label") is None


def test_the_engine_keeps_wide_alternatives_only_where_a_value_starts():
    """Hundreds of alternatives at every position filled DSPy's history (a ReAnchor run grew to 22.7 GB): only the
    positions right after ':' / '"' / ']]' keep them, the rest keep the best 20; the label there is still read."""
    from halluscope.lm.models import narrow_alternatives

    def alts(best: str, n: int) -> list[dict]:
        return [{"token": best, "logprob": -0.1}] + [{"token": f"t{i}", "logprob": -1.0 - i} for i in range(n - 1)]

    tokens = ['{"', "label", '":', ' "', "correct", '",', ' "', "rationale", '":', ' "', "fine", '"}']
    content = [{"token": t, "logprob": -0.1, "top_logprobs": alts(t, 300)} for t in tokens]
    content[4]["top_logprobs"].append({"token": "hall", "logprob": -6.0})  # the rare label, far below the 20th
    narrowed = narrow_alternatives({"content": content})["content"]
    wide = [i for i, e in enumerate(narrowed) if len(e["top_logprobs"]) > 20]
    # after '{"', '":', ' "' (twice each for two fields) and '",': the value and key starts
    assert wide == [1, 3, 4, 7, 9, 10]
    assert all(len(e["top_logprobs"]) == 20 for i, e in enumerate(narrowed) if i not in wide)
    assert narrowed[2]["top_logprobs"][0] == {"token": '":', "logprob": -0.1}  # the best ones are the ones kept
    assert {"token": "hall", "logprob": -6.0} in narrowed[4]["top_logprobs"]
    assert [e["token"] for e in narrowed] == tokens  # the generated tokens themselves are untouched
    assert narrow_alternatives(None) is None and narrow_alternatives({"content": []}) == {"content": []}


class _OldWideEngine(ScriptedEngine):
    """Replies as the embedded engine did before it narrowed its alternatives: 300 at every position."""

    def complete(self, request):
        reply = super().complete(request)
        pad = tuple(TopLogprob(f"w{i}", -20.0 - i) for i in range(300))  # prefixes of no label
        wide = tuple(dataclasses.replace(t, top=((t.top or (TopLogprob(t.token, t.logprob),)) + pad)[:300])
                     for t in reply.logprobs or ())
        return dataclasses.replace(reply, logprobs=wide or None)


def _alternatives_per_position(record: dict) -> tuple[list[int], list[int]]:
    """A cached reply's alternatives per position: in its response and in its output (DSPy keeps both)."""
    return ([len(p["top"]) for p in record["responses"][0]["logprobs"]],
            [len(p["top_logprobs"]) for p in record["outputs"][0]["logprobs"]["content"]])


def test_a_reply_cached_with_wide_alternatives_everywhere_is_narrowed_when_read_and_decides_the_same(tmp_path):
    """Replies cached before the engine narrowed its own keep 300 alternatives at every position, and DSPy copies
    them on every cache hit (#21: the finch ReAnchor run replays them thousands of times). The cache narrows them
    when it reads them, as the engine does now: the memory cache keeps the narrow copy, the disk entry and its key
    stay as they are, and the decision reads the same probabilities (the label's position keeps all 300)."""
    from dspy.clients.cache import Cache

    from halluscope.core.decisions import decision_evidence
    from halluscope.lm.models import ReplyCache

    def decide(lm):
        with dspy.context(lm=lm, adapter=with_logprob_decisions(dspy.JSONAdapter())):
            predict = dspy.Predict(Verify)
            predict.fields = {"label": {"weights": dict.fromkeys(LABELS, 1.0)}}
            with decision_evidence() as log:
                label = predict(claim="Berlin is in France.").label
        return label, log[-1][2]["probabilities"]

    old = dspy.cache
    try:
        dspy.cache = Cache(enable_disk_cache=True, enable_memory_cache=False, disk_cache_dir=str(tmp_path / "c"))
        scripted_lm({})  # installs the signature tap the engines read
        first = dspy.LM("scripted/test", cache=True, engine=_OldWideEngine(
            {"label": "correct"}, logprobs=lambda call: {"label": CROWDED}, max_top_logprobs=300))
        wide_label, wide_probs = decide(first)
        [key] = list(dspy.cache.disk_cache)
        assert _alternatives_per_position(dspy.cache.disk_cache[key]) == ([300, 300, 300], [300, 300, 300])
        dspy.cache.disk_cache.close()

        dspy.cache = ReplyCache(enable_disk_cache=True, enable_memory_cache=True, disk_cache_dir=str(tmp_path / "c"))
        second = dspy.LM("scripted/test", cache=True, engine=_OldWideEngine({"label": "unverifiable"},
                                                                             max_top_logprobs=300))
        assert decide(second) == (wide_label, wide_probs) == ("correct", pytest.approx(
            {"correct": 0.40 / 0.415, "hallucinated": 0.01 / 0.415, "unverifiable": 0.005 / 0.415}))
        assert decide(second)[1] == wide_probs  # exactly, from the narrowed copy in memory too
        assert not second.engine.calls  # both from the cache: the request's key did not change
        # '{"label": "' | 'correct' | '"}': only the label's position keeps its 300 (plus "hallucinated" below them)
        assert _alternatives_per_position(dspy.cache.memory_cache[key]) == ([20, 300, 20], [20, 300, 20])
        assert _alternatives_per_position(dspy.cache.disk_cache[key]) == ([300, 300, 300], [300, 300, 300])
    finally:
        dspy.cache = old


def test_narrow_cached_reply_leaves_other_values_alone():
    from halluscope.lm.models import narrow_cached_reply

    for value in (None, "text", {"choices": []}, {"responses": [], "outputs": ["plain text"]}):
        assert narrow_cached_reply(value) is False
    record = {"responses": [{"logprobs": [{"token": "a", "logprob": -0.1, "top": [{"token": "a", "logprob": -0.1}]}]}],
              "outputs": [{"text": "a"}]}
    assert narrow_cached_reply(record) is False and len(record["responses"][0]["logprobs"][0]["top"]) == 1
