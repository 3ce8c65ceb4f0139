"""evaluate's LM usage is counted call by call (lm.usage.UsageMeter), not read from DSPy's history (#21): exact for
any number of calls, on any number of threads, for every LM a program calls (FINCH-ZK's sampler LMs), and with
DSPy's history off while the program runs."""

from __future__ import annotations

import json

import dspy
from dspy.clients import base_lm
from dspy.clients.cache import Cache

from halluscope.evaluation.runner import run_eval
from halluscope.evaluation.scale import EvalWorker
from halluscope.lm.scripted import TwoCallProgram as TwoCalls, scripted_lm
from halluscope.lm.usage import UsageMeter


def _examples(n: int) -> list[dspy.Example]:
    return [dspy.Example(id=str(i), question=f"Question number {i}?" + " Why?" * (i % 3), answer="a", context="",
                         label=i % 2 == 0).with_inputs("question", "answer", "context") for i in range(n)]


def _engine_tokens(lm) -> tuple[int, int]:
    """The scripted engine's own token figures for every request it answered (see lm/scripted.py)."""
    calls = lm.engine.calls
    return sum(len(c.system + c.user) // 4 for c in calls), sum(len(c.reply) // 4 for c in calls)


def test_evaluate_counts_every_call_and_token_of_a_scripted_run():
    lm = scripted_lm({"answer": "yes"})
    with dspy.context(lm=lm, adapter=dspy.JSONAdapter()):
        res = run_eval(TwoCalls(), _examples(5), progress=False)
    assert len(lm.engine.calls) == 10
    assert (res.usage.calls, res.usage.cache_hits) == (10, 0)
    assert (res.usage.input_tokens, res.usage.output_tokens) == _engine_tokens(lm)
    assert res.usage.input_tokens > 0 and res.usage.output_tokens > 0
    assert res.usage.by_model == {lm.model: 10}
    assert res.summary()["lm_calls"] == 10 and res.summary()["lm_calls_per_item"] == 2.0
    assert lm.history == []  # DSPy's history was off while the program ran


def test_evaluate_counts_exactly_past_dspys_history_cap(monkeypatch, tmp_path):
    """DSPy keeps its last 10,000 calls (here 4): a count read from that history stopped there. Cache hits (the
    second pass) are counted apart, as before."""
    monkeypatch.setattr(base_lm, "MAX_HISTORY_SIZE", 4)
    monkeypatch.setattr(dspy, "cache", Cache(enable_disk_cache=True, enable_memory_cache=True,
                                             disk_cache_dir=str(tmp_path / "cache")))
    lm = scripted_lm({"answer": "yes"}, cache=True)
    examples = _examples(6)
    kept = list(base_lm.GLOBAL_HISTORY)
    base_lm.GLOBAL_HISTORY.clear()
    try:
        with dspy.context(lm=lm, adapter=dspy.JSONAdapter(), max_history_size=4):
            first = run_eval(TwoCalls(), examples, progress=False)
            second = run_eval(TwoCalls(), examples, progress=False)  # every request again: all from the cache
        recorded = list(base_lm.GLOBAL_HISTORY)
    finally:
        base_lm.GLOBAL_HISTORY[:] = kept
    assert len(lm.engine.calls) == 12
    assert (first.usage.calls, first.usage.cache_hits) == (12, 0)
    assert (first.usage.input_tokens, first.usage.output_tokens) == _engine_tokens(lm)
    assert (second.usage.calls, second.usage.cache_hits) == (12, 12)
    assert (second.usage.input_tokens, second.usage.output_tokens) == (0, 0)
    assert recorded == [] and lm.history == []  # nothing recorded: no reply kept in memory


def test_evaluate_on_threads_counts_what_it_counts_on_one_thread():
    counts = []
    for threads in (1, 4):
        lm = scripted_lm({"answer": "yes"})
        with dspy.context(lm=lm, adapter=dspy.JSONAdapter()):
            res = run_eval(TwoCalls(), _examples(9), threads=threads, progress=False)
        assert res.usage.calls == len(lm.engine.calls) == 18
        counts.append((res.usage.to_dict(), res.usage.by_model))
    assert counts[0] == counts[1]


def test_evaluate_counts_finch_samplers_that_are_lms_of_their_own_on_finchs_threads():
    """FINCH-ZK samples with other LM objects (``dspy.context(lm=sampler)`` inside its own threads): the meter sees
    them through DSPy's callbacks, which the threads inherit."""
    from halluscope.programs.finch.program import FinchZK

    from tests.test_reanchor_gepa import _finch_lm  # the judge answers "accurate", samples say Paris

    judge = _finch_lm()
    sampler = scripted_lm({"answer": "Item holds are in Paris."}, model="scripted/sampler")
    program = FinchZK(samplers=[sampler], n_samples=3, correct=False, num_threads=3)
    examples = [dspy.Example(id=str(i), question=f"Where is item {i}?", answer=f"Paris holds item {i}.",
                             context="", label=False).with_inputs("question", "answer", "context")
                for i in range(2)]
    with dspy.context(lm=judge, adapter=dspy.JSONAdapter()):
        res = run_eval(program, examples, threads=2, progress=False)
    assert res.failed_items == 0
    assert len(sampler.engine.calls) == 6 and len(judge.engine.calls) > 0
    assert res.usage.by_model == {"scripted/sampler": 6, judge.model: len(judge.engine.calls)}
    assert res.usage.calls == 6 + len(judge.engine.calls)
    tokens = [_engine_tokens(judge), _engine_tokens(sampler)]
    assert (res.usage.input_tokens, res.usage.output_tokens) == tuple(map(sum, zip(*tokens)))


def test_evaluate_inside_an_optimize_meter_counts_each_call_once_in_both():
    """An optimize run evaluates held-out folds inside its own meter: both meters count every call once, and a
    prediction's own usage (``track_usage``, what MLflow's spans read) is not doubled."""
    lm = scripted_lm({"answer": "yes"})
    outer = UsageMeter(lm)
    with dspy.context(lm=lm, adapter=dspy.JSONAdapter(), track_usage=True):
        expected = TwoCalls().ask(question="q").get_lm_usage()
        with outer.counting():
            res = run_eval(TwoCalls(), _examples(3), threads=2, progress=False)
            single = TwoCalls().ask(question="q")
    assert res.usage.calls == 6 and res.usage.input_tokens > 0
    assert outer.usage()["lm_calls"] == 7 == len(lm.engine.calls) - 1
    inner_tokens = res.usage.input_tokens + single.get_lm_usage()[lm.model]["prompt_tokens"]
    assert outer.usage()["lm_input_tokens"] == inner_tokens
    assert single.get_lm_usage() == expected


def test_ray_eval_worker_counts_its_item_with_a_meter_without_history():
    """The Ray actors count each item with a meter in their own process (here called in this one, without Ray)."""
    from halluscope.programs import registry

    lm = scripted_lm({"spans": [{"text": "Paris", "probability": 0.9}]})
    worker = EvalWorker("spans", {})
    ex = dspy.Example(id="0", question="Where is it?", answer="Paris holds it.", context="", lang="en",
                      hard_labels=[]).with_inputs("question", "answer", "context", "lang")
    row = {"_pos": 0, "inputs": ",".join(ex.inputs().keys()), "example": json.dumps(ex.toDict())}
    with dspy.context(lm=lm, adapter=dspy.JSONAdapter()):
        out = worker.one(row)
    assert out["ok"], out["error"]
    assert registry.get_program("spans").uses_lm
    assert out["lm_calls"] == len(lm.engine.calls) > 0 and out["lm_cache_hits"] == 0
    assert (out["lm_input_tokens"], out["lm_output_tokens"]) == _engine_tokens(lm)
    assert lm.history == []
