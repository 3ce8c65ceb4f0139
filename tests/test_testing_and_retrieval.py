"""The scripted test LM (no parsing of DSPy's prompt wording) and the evidence seam (Retriever)."""

from __future__ import annotations

import threading

import dspy
import pytest

from halluscope.core.contract import Evidence
from halluscope.core.retrieval import (CachedRetriever, ContextRetriever, Retriever, make_retriever,
                                  register_retriever, retriever_names)
from halluscope.lm.scripted import scripted_lm


class Echo(dspy.Signature):
    """Echo the text and count its words."""

    text: str = dspy.InputField()
    shout: str = dspy.OutputField()
    words: int = dspy.OutputField()
    tags: list[str] = dspy.OutputField()


@pytest.mark.parametrize("adapter", [dspy.JSONAdapter(), dspy.ChatAdapter()])
def test_scripted_lm_sees_signature_and_values_and_answers_in_the_adapters_format(adapter):
    lm = scripted_lm(lambda c: {"shout": c.inputs["text"].upper(), "words": len(c.inputs["text"].split())})
    with dspy.context(lm=lm, adapter=adapter):
        pred = dspy.Predict(Echo)(text="two words")
    assert pred.shout == "TWO WORDS" and pred.words == 2
    assert pred.tags == []  # unnamed output: the type's default
    call = lm.engine.calls[0]
    assert set(call.outputs) == {"shout", "words", "tags"} and call.outputs["words"] == "int"
    assert call.inputs == {"text": "two words"}
    assert call.chat_format is (not isinstance(adapter, dspy.JSONAdapter))
    assert call.has("two words")


def test_scripted_lm_keeps_threads_apart():
    lm = scripted_lm({"shout": lambda c: c.inputs["text"] + "!"})
    results = {}

    def run(i):
        with dspy.context(lm=lm, adapter=dspy.JSONAdapter()):
            results[i] = dspy.Predict(Echo)(text=f"item {i}").shout

    threads = [threading.Thread(target=run, args=(i,)) for i in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert results == {i: f"item {i}!" for i in range(8)}
    assert len(lm.engine.calls) == 8


def test_engine_without_an_adapter_call_in_its_thread_says_why():
    out = []

    def probe():  # a fresh thread has formatted no adapter call: the engine cannot know the signature
        try:
            scripted_lm({}).engine.complete(None)
        except RuntimeError as e:
            out.append(str(e))

    t = threading.Thread(target=probe)
    t.start()
    t.join()
    assert out and "SignatureTap" in out[0]


CONTEXT = ("Canberra is the capital of Australia.\n\nSydney is the largest city in Australia.\n\n"
           "The Great Barrier Reef lies off Queensland.")


def test_context_retriever_ranks_paragraphs_by_query_overlap():
    r = ContextRetriever()
    assert isinstance(r, Retriever)
    ev = r.retrieve("What is the capital of Australia?", k=2, context=CONTEXT)
    assert [e.id for e in ev] == ["context#0", "context#1"]
    assert ev[0].text.startswith("Canberra") and ev[0].source == "context"
    assert ev[0].score > ev[1].score > 0
    assert r.retrieve("anything", context="") == []
    assert r.retrieve("capital", k=0, context=CONTEXT) == []


def test_context_retriever_cuts_long_paragraphs_at_word_boundaries():
    text = " ".join(f"word{i}" for i in range(200))
    ev = ContextRetriever(max_chars=100).retrieve("word5", k=50, context=text)
    assert all(len(e.text) <= 100 for e in ev)
    assert " ".join(e.text for e in sorted(ev, key=lambda e: int(e.id.split("#")[1]))) == text
    with pytest.raises(ValueError, match="max_chars"):
        ContextRetriever(max_chars=0)


def test_make_retriever_specs_and_errors(tmp_path):
    assert "context" in retriever_names()
    assert make_retriever("context:50").max_chars == 50
    with pytest.raises(ValueError, match="unknown retriever 'web'; choose one of: .*context"):
        make_retriever("web")
    with pytest.raises(ValueError, match="passage length"):
        make_retriever("context:big")
    with pytest.raises(TypeError):
        make_retriever(42)


def test_cached_retriever_serves_repeats_from_disk(tmp_path):
    calls = []

    class Counting:
        source = "kb"

        def retrieve(self, query, *, k=5, context=""):
            calls.append(query)
            return [Evidence(text=f"about {query}", source="kb", id="d1", score=1.5)]

        def cache_key(self):
            return "counting/1"

    register_retriever("counting", lambda arg: Counting())
    r = make_retriever("counting", cache=True, cache_dir=tmp_path)
    assert isinstance(r, CachedRetriever)
    first = r.retrieve("x", k=3)
    again = CachedRetriever(Counting(), tmp_path).retrieve("x", k=3)  # a new process would see the same
    assert first == again == [Evidence(text="about x", source="kb", id="d1", score=1.5)]
    assert calls == ["x"]
    r.retrieve("x", k=4)
    r.retrieve("x", k=3, context="other")
    assert calls == ["x", "x", "x"]
