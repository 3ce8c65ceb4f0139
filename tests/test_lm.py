"""The LM layer: the llama.cpp engine (with a fake model), schema limiting, LM specs, cache folders."""

from __future__ import annotations

import threading
from pathlib import Path

import dspy
import pytest

from halluscope.lm import models as lmmod
from halluscope.lm.models import (LlamaCppEngine, SchemaJSONAdapter, response_schema, configure, limit_schema, make_lm,
                           schema_bounds,
                           usage_of)


class FakeLlama:
    """Tokenizes one token per character; records every completion request."""

    def __init__(self, reply='{"answer": "4"}', finish="stop"):
        self.reply = reply
        self.finish = finish
        self.requests = []
        self.active = 0
        self.max_active = 0
        self._lock = threading.Lock()

    def tokenize(self, data: bytes, add_bos=False, special=False):
        return list(data.decode("utf-8", "ignore"))

    def detokenize(self, toks):
        return "".join(toks).encode("utf-8")

    def create_chat_completion(self, messages, **kwargs):
        with self._lock:
            self.active += 1
            self.max_active = max(self.max_active, self.active)
        import time

        time.sleep(0.01)
        self.requests.append({"messages": messages, **kwargs})
        with self._lock:
            self.active -= 1
        n_in = sum(len(m["content"]) for m in messages)
        return {
            "id": "x",
            "choices": [{"message": {"content": self.reply}, "finish_reason": self.finish}],
            "usage": {"prompt_tokens": n_in, "completion_tokens": 3, "total_tokens": n_in + 3},
        }


@pytest.fixture
def gguf(tmp_path) -> Path:
    p = tmp_path / "tiny.gguf"
    p.write_bytes(b"GGUF-not-really")
    return p


def engine_with(gguf, fake, **kw) -> LlamaCppEngine:
    eng = LlamaCppEngine(gguf, **kw)
    eng._llm = fake
    return eng


def test_engine_passes_sampling_params_and_reports_usage(gguf):
    fake = FakeLlama()
    eng = engine_with(gguf, fake, n_ctx=4096)
    lm = dspy.LM("llamacpp/test-params", engine=eng, cache=False, temperature=0.7, max_tokens=64)
    out = lm("What is 2+2?", stop=["\n\n"], seed=5, top_p=0.9)
    assert out == ['{"answer": "4"}']
    req = fake.requests[-1]
    assert req["temperature"] == 0.7 and req["max_tokens"] == 64
    assert req["stop"] == ["\n\n"] and req["seed"] == 5 and req["top_p"] == 0.9
    assert req["messages"][-1] == {"role": "user", "content": "What is 2+2?"}
    assert eng.stats.calls == 1 and eng.stats.output_tokens == 3
    assert eng.stats.input_tokens == len("What is 2+2?")
    assert lm.history[-1]["usage"]["completion_tokens"] == 3


class FakeLogprobLlama(FakeLlama):
    """Also answers ``logprobs=True`` requests, as llama-cpp-python's chat completion does (OpenAI shape)."""

    def create_chat_completion(self, messages, **kwargs):
        out = super().create_chat_completion(messages, **kwargs)
        if kwargs.get("logprobs"):
            out["choices"][0]["logprobs"] = {"content": [
                {"token": '{"', "logprob": -0.1, "top_logprobs": []},
                {"token": "true", "logprob": -0.4, "top_logprobs": [{"token": "true", "logprob": -0.4},
                                                                    {"token": "false", "logprob": -1.2},
                                                                    {"token": "bad", "logprob": float("nan")}]},
                {"token": "x", "logprob": None}]}
        return out


def test_engine_returns_token_logprobs_from_a_second_instance_when_asked(gguf):
    plain, with_lp = FakeLlama(), FakeLogprobLlama()
    eng = engine_with(gguf, plain, n_ctx=8192)
    eng._llm_logprobs = with_lp
    lm = dspy.LM("llamacpp/test-logprobs", engine=eng, cache=False, max_tokens=4000)
    out = lm("Is Paris in France?", logprobs=True, top_logprobs=5)
    req = with_lp.requests[-1]
    assert not plain.requests and req["logprobs"] is True and req["top_logprobs"] == 5
    assert req["max_tokens"] == eng.logprobs_n_ctx // 2  # bounded by that instance's smaller context
    content = out[0]["logprobs"]["content"]
    assert [(c["token"], c["logprob"]) for c in content] == [('{"', -0.1), ("true", -0.4)]  # None skipped
    assert [(t["token"], t["logprob"]) for t in content[1]["top_logprobs"]] == [("true", -0.4), ("false", -1.2)]
    lm("Is Paris in France?")  # without logprobs: the ordinary instance, no logprobs asked
    assert len(plain.requests) == 1 and "logprobs" not in plain.requests[-1]


def test_engine_returns_up_to_its_max_top_logprobs_alternatives(gguf):
    """The embedded engine computes the whole distribution: it returns up to ``max_top_logprobs`` alternatives
    (a three-label Choice asks for that many, #21 round five), never more; 20 asked stay 20."""
    with_lp = FakeLogprobLlama()
    eng = engine_with(gguf, FakeLlama())
    eng._llm_logprobs = with_lp
    lm = dspy.LM("llamacpp/test-top", engine=eng, cache=False)
    for asked in (20, 300, 5000):
        lm("Is Paris in France?", logprobs=True, top_logprobs=asked)
    assert [r["top_logprobs"] for r in with_lp.requests] == [20, 300, LlamaCppEngine.max_top_logprobs]
    assert LlamaCppEngine.max_top_logprobs == 300


def test_engine_constrains_json_adapter_output_to_the_signature_schema(gguf):
    fake = FakeLlama(reply='{"answer": "4"}')
    eng = engine_with(gguf, fake)
    lm = dspy.LM("llamacpp/test-schema", engine=eng, cache=False)
    with dspy.context(lm=lm, adapter=dspy.JSONAdapter()):
        pred = dspy.Predict("question -> answer")(question="2+2?")
    assert pred.answer == "4"
    rf = fake.requests[-1]["response_format"]
    assert rf["type"] == "json_object"
    assert rf["schema"]["properties"]["answer"]["type"] == "string"
    assert rf["schema"]["required"] == ["answer"]


def test_engine_truncates_overlong_prompts_deliberately_and_counts_them(gguf):
    fake = FakeLlama()
    eng = engine_with(gguf, fake, n_ctx=400)
    lm = dspy.LM("llamacpp/test-trunc", engine=eng, cache=False, max_tokens=100)
    long = "A" * 150 + "B" * 1000 + "C" * 150
    lm(long)
    sent = fake.requests[-1]["messages"][-1]["content"]
    assert eng.stats.truncated == 1
    assert "[... truncated ...]" in sent
    assert sent.startswith("A" * 100) and sent.endswith("C" * 100)  # head and tail kept
    # prompt + max_tokens fit the context (the fake counts one token per character)
    assert len(sent) + 100 <= 400
    lm("short")
    assert eng.stats.truncated == 1


def test_engine_serialises_calls_with_one_lock(gguf):
    fake = FakeLlama()
    eng = engine_with(gguf, fake)
    lm = dspy.LM("llamacpp/test-lock", engine=eng, cache=False)
    threads = [threading.Thread(target=lm, args=(f"q{i}",)) for i in range(6)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert eng.stats.calls == 6
    assert fake.max_active == 1


def test_engine_maps_unknown_finish_reasons_and_counts_errors(gguf):
    fake = FakeLlama(finish="weird")
    eng = engine_with(gguf, fake)
    lm = dspy.LM("llamacpp/test-finish", engine=eng, cache=False)
    assert lm("x") == ['{"answer": "4"}']

    def boom(messages, **kw):
        raise RuntimeError("llama failed")

    fake.create_chat_completion = boom
    with pytest.raises(Exception):
        lm("y")
    assert eng.stats.errors == 1


def test_limit_schema_bounds_arrays_and_nested_strings_only():
    schema = {
        "type": "object",
        "properties": {
            "reasoning": {"type": "string"},
            "label": {"type": "string", "enum": ["Yes", "No"]},
            "spans": {"type": "array", "items": {"$ref": "#/$defs/Q"}},
        },
        "$defs": {"Q": {"type": "object", "properties": {"text": {"type": "string"}, "p": {"type": "number"}}}},
    }
    out = limit_schema(schema, 3, 50)
    assert out["properties"]["spans"]["maxItems"] == 3
    assert "maxLength" not in out["properties"]["reasoning"]  # top-level text is bounded by max_tokens
    assert "maxLength" not in out["properties"]["label"]
    assert out["$defs"]["Q"]["properties"]["text"]["maxLength"] == 50
    assert "maxItems" not in schema["properties"]["spans"]  # the input is not modified


def test_schema_bounds_fit_a_full_list_in_the_output_budget():
    assert schema_bounds(None, 8, 200) == (8, 200)  # no budget: as configured
    assert schema_bounds(4096, 8, 200) == (8, 200)
    for budget in (32, 64, 128, 256, 512, 1024):
        items, chars = schema_bounds(budget, 8, 200)
        assert 1 <= items <= 8 and 8 <= chars <= 200
        # a list at its bounds (each string plus quotes/comma) stays within ~2 characters per token
        assert items * (chars + 16) <= 2 * budget or chars == 8, (budget, items, chars)
    assert schema_bounds(256, 8, 200) == (4, 112)


def test_schema_adapter_sends_bounds_scaled_to_the_call_budget():
    class Sig(dspy.Signature):
        """Quote the false parts."""
        answer: str = dspy.InputField()
        quotes: list[str] = dspy.OutputField()

    def sent(max_tokens):
        kwargs = {"max_tokens": max_tokens}
        SchemaJSONAdapter()._prepare_response_format(None, kwargs, Sig)
        schema = kwargs["response_format"]["json_schema"]["schema"]
        return schema["properties"]["quotes"], kwargs["extra_body"]["max_tokens"]

    small, budget = sent(256)
    assert (small["maxItems"], small["items"]["maxLength"], budget) == (4, 112, 256)
    large, _ = sent(4096)
    assert (large["maxItems"], large["items"]["maxLength"]) == (8, 200)


def test_response_schema_shapes():
    s = {"type": "object"}
    assert response_schema(None) is None
    assert response_schema({"type": "text"}) is None
    assert response_schema({"type": "json_object"}) == {"type": "json_object"}
    assert response_schema({"type": "json_schema", "json_schema": {"name": "X", "schema": s}}) == {
        "type": "json_object", "schema": s}
    assert response_schema({"type": "json_schema", "schema": s, "name": "X"}) == {"type": "json_object", "schema": s}


def test_make_lm_local_path_errors_and_model_identity(gguf, tmp_path):
    with pytest.raises(FileNotFoundError, match="missing.gguf"):
        make_lm(f"local:{tmp_path / 'missing.gguf'}")
    lm = make_lm(f"local:{gguf}", n_ctx=1024)
    assert lm.model.startswith("llamacpp/tiny@") and lm.model.endswith("-ctx1024")
    assert lmmod.file_sha256(gguf)[:12] in lm.model
    # the same file shares one engine (one model, one lock); another context size does not
    assert make_lm(f"local:{gguf}", n_ctx=1024).engine is lm.engine
    assert make_lm(f"local:{gguf}", n_ctx=2048).engine is not lm.engine
    other = tmp_path / "other.gguf"
    other.write_bytes(b"different bytes")
    assert make_lm(f"local:{other}", n_ctx=1024).model.split("@")[1] != lm.model.split("@")[1]
    with pytest.raises(ValueError):
        make_lm("")
    assert make_lm(f"local:{gguf}", n_ctx=1024, timeout=30).engine is lm.engine  # --lm-timeout: for servers only


def test_make_lm_remote_spec_and_api_base():
    lm = make_lm("openai/some-model", api_base="http://127.0.0.1:9/v1/")
    assert lm.model == "openai/some-model"
    # an OpenAI-compatible server gets halluscope's own client: the engine holds the URL, the model name it sends
    # and the retries; DSPy itself does not retry (num_retries=0) and holds no api_base/api_key
    assert isinstance(lm.engine, lmmod.OpenAICompatEngine)
    assert (lm.engine.base_url, lm.engine.model, lm.num_retries) == ("http://127.0.0.1:9/v1", "some-model", 0)
    assert "api_base" not in lm.kwargs and "api_key" not in lm.kwargs
    assert lmmod.server_base(lm) == "http://127.0.0.1:9/v1"
    other = make_lm("ollama_chat/llama3", api_base="http://127.0.0.1:11434")  # not OpenAI-compatible: DSPy's path
    assert other.kwargs["api_base"] == "http://127.0.0.1:11434"


def test_configure_picks_adapter_and_cache_folder_per_server(gguf, tmp_path, monkeypatch):
    lm = configure(f"local:{gguf}", cache_dir=tmp_path / "c1", n_ctx=1024)
    assert isinstance(dspy.settings.adapter, dspy.JSONAdapter)
    assert dspy.settings.lm is lm
    configure("openai/x", cache_dir=tmp_path / "c2", api_base="http://127.0.0.1:9/v1")
    # the adapter classes, wrapped to read decision outputs from log-probabilities (halluscope.core.decisions, #21)
    assert type(dspy.settings.adapter).__mro__[2] is SchemaJSONAdapter  # a server gets each stage's schema, budget
    configure("openai/x", cache_dir=tmp_path / "c2", api_base="http://127.0.0.1:9/v1", adapter="chat")
    assert type(dspy.settings.adapter).__mro__[2] is lmmod.GuardedChatAdapter  # DSPy's chat adapter, refusing cut output
    made = [p.name for p in (tmp_path / "c2").iterdir()]
    assert len(made) == 1 and made[0].startswith("server-")
    with pytest.raises(ValueError, match="adapter"):
        configure(lm, cache_dir=tmp_path / "c3", adapter="xml")


def test_usage_of_counts_cache_hits_apart():
    entries = [
        {"usage": {"prompt_tokens": 10, "completion_tokens": 2}, "model": "a"},
        {"usage": {}, "model": "a"},
        {"usage": {"input_tokens": 5, "output_tokens": 1}, "model": "b"},
    ]
    u = usage_of(entries)
    assert (u.calls, u.cache_hits, u.input_tokens, u.output_tokens) == (3, 1, 15, 3)
    assert u.by_model == {"a": 2, "b": 1}
    assert u.to_dict()["lm_cache_hits"] == 1


def test_llama_threads_default_to_the_cpus_the_process_may_run_on(monkeypatch):
    import os

    from halluscope.lm import models

    monkeypatch.setattr(os, "sched_getaffinity", lambda pid: {3}, raising=False)  # as under taskset -c 3
    assert models.usable_cpus() == 1

    def no_affinity(pid):
        raise OSError("not supported")

    monkeypatch.setattr(os, "sched_getaffinity", no_affinity, raising=False)
    monkeypatch.setattr(os, "cpu_count", lambda: 6)
    assert models.usable_cpus() == 6
