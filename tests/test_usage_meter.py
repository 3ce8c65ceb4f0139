"""lm.usage.UsageMeter (re-exported by optimize.run): LM calls, cache hits and tokens counted call by call (exact
past DSPy's history cap), the program's calls told from the optimizer's by the module stack (never by prompt
wording)."""

from __future__ import annotations

import dspy
from dspy.clients import base_lm
from dspy.clients.cache import Cache

from halluscope.lm.models import history_since, usage_of
from halluscope.optimize.cv import OptimizerConfig
from halluscope.optimize.run import FINISHED, OptimizeConfig, UsageMeter, run_optimize
from halluscope.programs.registry import get_program
from halluscope.lm.scripted import scripted_lm


class Ask(dspy.Signature):
    """Answer."""

    question: str = dspy.InputField()
    answer: str = dspy.OutputField()


class Program(dspy.Module):
    def __init__(self):
        super().__init__()
        self.ask = dspy.Predict(Ask)

    def forward(self, question):
        return self.ask(question=question)


class Proposer(dspy.Module):  # stands in for an optimizer's own modules
    def __init__(self):
        super().__init__()
        self.ask = dspy.Predict(Ask)

    def forward(self, question):
        return self.ask(question=question)


def test_meter_splits_program_calls_from_other_calls_by_the_module_stack():
    lm = scripted_lm({"answer": "yes"})
    meter = UsageMeter(lm, program_type=Program)
    program, copy_of_program, proposer = Program(), Program(), Proposer()
    with meter.counting(lm=lm, adapter=dspy.JSONAdapter()):  # a DSPy callback and usage tracker
        program(question="a")
        copy_of_program(question="b")  # a copy (as optimizers make) is the program too
        proposer(question="c")
        proposer(question="d")
        proposer(question="e")
    u = meter.usage()
    assert u["lm_calls"] == 5 and u["engine_calls"] == 5
    assert (u["lm_task_calls"], u["lm_prompt_calls"]) == (2, 3)
    assert u["lm_task_new_calls"] + u["lm_prompt_new_calls"] == u["lm_new_calls"] == 5
    assert u["lm_input_tokens"] > 0

    plain = UsageMeter(lm)  # no program type: no split
    assert "lm_task_calls" not in plain.usage()


def test_meter_counts_are_exact_past_dspys_history_cap(monkeypatch, tmp_path):
    """DSPy keeps its last 10,000 calls (here 3): a count read from that history stops there, the meter's does not
    (#21: an optimize run reported "10000, all from the cache")."""
    monkeypatch.setattr(base_lm, "MAX_HISTORY_SIZE", 3)
    monkeypatch.setattr(dspy, "cache", Cache(enable_disk_cache=True, enable_memory_cache=True,
                                             disk_cache_dir=str(tmp_path / "cache")))
    lm = scripted_lm({"answer": "yes"}, cache=True)
    meter = UsageMeter(lm, program_type=Program)
    program, proposer = Program(), Proposer()
    questions = ["a", "b", "c", "d", "e", "a", "b", "c"]  # 5 new requests, then 3 from the cache
    kept = list(base_lm.GLOBAL_HISTORY)
    base_lm.GLOBAL_HISTORY.clear()
    try:
        with meter.counting(lm=lm, adapter=dspy.JSONAdapter(), disable_history=False, max_history_size=3):
            for q in questions:
                program(question=q)
            proposer(question="f")  # new, the optimizer's
            proposer(question="a")  # the same request as the program's first: from the cache
        from_history = usage_of(history_since("0000"))  # every entry DSPy still holds
    finally:
        base_lm.GLOBAL_HISTORY[:] = kept
    u = meter.usage()
    assert len(lm.engine.calls) == u["engine_calls"] == 6
    assert (u["lm_calls"], u["lm_new_calls"], u["lm_cache_hits"]) == (10, 6, 4)
    assert (u["lm_task_calls"], u["lm_task_new_calls"], u["lm_prompt_calls"], u["lm_prompt_new_calls"]) == (8, 5, 2, 1)
    assert u["lm_calls_by_model"] == {lm.model: 10}
    # the tokens are the scripted engine's own figures for the 6 requests that reached it, none for the cache hits
    assert u["lm_input_tokens"] == sum(len(c.system + c.user) // 4 for c in lm.engine.calls) > 0
    assert u["lm_output_tokens"] > 0
    assert from_history.calls == len(lm.history) == 3  # what a count read from the history saw


def test_counting_turns_dspys_history_off_and_passes_usage_on_to_an_outer_tracker():
    """Each history entry keeps its whole reply (token alternatives included): a ReAnchor run replays the program
    thousands of times and grew to 22.7 GB (#21). While the meter counts, DSPy records no history; a usage tracker
    that was active before (``dspy.track_usage()``) still gets every reply's usage."""
    lm = scripted_lm({"answer": "yes"})
    meter = UsageMeter(lm)
    before = len(base_lm.GLOBAL_HISTORY)
    with dspy.track_usage() as outer:
        with meter.counting(lm=lm, adapter=dspy.JSONAdapter()):
            Program()(question="a")
            Program()(question="b")
    assert meter.usage()["lm_calls"] == meter.usage()["lm_new_calls"] == 2
    assert len(base_lm.GLOBAL_HISTORY) == before and lm.history == []
    totals = outer.get_total_tokens()[lm.model]
    assert totals["prompt_tokens"] == meter.usage()["lm_input_tokens"] > 0
    assert totals["completion_tokens"] == meter.usage()["lm_output_tokens"] > 0


def _responder(call):
    if "spans" in call.outputs:
        words = str(call.inputs.get("answer", "")).strip().rstrip(".").split()
        return {"spans": [{"text": words[-1], "probability": 0.9}] if words else []}
    return {"proposed_instruction": "Quote every wrong name, number or date in the answer.",
            "observations": "Short factual answers.", "summary": "Short factual answers.",
            "program_description": "Finds wrong spans.", "module_description": "Extracts wrong spans."}


def test_run_optimize_counts_task_and_proposal_calls_as_the_engine_saw_them(tmp_path):
    examples = []
    for i in range(6):
        answer = f"Answer number {i} says Paris."
        hard = [[len(answer) - 6, len(answer) - 1]] if i % 3 else []
        examples.append(dspy.Example(id=f"x-{i}", lang="de", question=f"q{i}?", answer=answer, context="",
                                     hard_labels=hard, soft_labels=[{"start": s, "end": e, "prob": 1.0}
                                                                    for s, e in hard],
                                     label=bool(hard)).with_inputs("question", "answer", "lang", "context"))
    lm = scripted_lm(_responder)
    config = OptimizeConfig(program="spans", metric="iou", lang="de", source="fixture", folds=1,
                            optimizer=OptimizerConfig(candidates=2, trials=2), compiled_dir=tmp_path / "c",
                            report_dir=tmp_path / "r", mlflow=False)
    with dspy.context(lm=lm, adapter=dspy.JSONAdapter()):
        res = run_optimize(config, examples, task_lm=lm)
    assert res.status == FINISHED
    program_outputs = {"spans"}
    assert get_program("spans").uses_lm
    task = sum(1 for c in lm.engine.calls if program_outputs & set(c.outputs))
    other = len(lm.engine.calls) - task
    assert task > 0 and other > 0  # MIPROv2 proposed instructions through the same LM
    assert (res.usage["lm_task_calls"], res.usage["lm_prompt_calls"]) == (task, other)
    assert res.usage["lm_calls"] == len(lm.engine.calls)
    assert lm.history == []  # DSPy's history was off during the run (#21)


def test_with_track_usage_on_each_outermost_module_call_still_gets_its_usage_while_the_meter_counts():
    """MLflow tracing turns on DSPy's ``track_usage``: DSPy then gives the outermost module call's prediction its
    LM usage through a usage tracker of its own, which the meter replaces while it counts; the meter gives it the
    same usage (what MLflow's module spans read)."""

    class Outer(dspy.Module):
        def __init__(self):
            super().__init__()
            self.inner = Program()
            self.other = Program()

        def forward(self, question):
            self.inner(question=question)
            return self.other(question=question + "?")

    lm = scripted_lm({"answer": "yes"})
    with dspy.context(lm=lm, adapter=dspy.JSONAdapter(), track_usage=True):
        expected = Outer()(question="a").get_lm_usage()  # DSPy's own tracker
        meter = UsageMeter(lm)
        with meter.counting():
            pred = Outer()(question="a")
    assert expected[lm.model]["prompt_tokens"] > 0 and expected[lm.model]["completion_tokens"] > 0
    assert pred.get_lm_usage() == expected  # both calls of the outermost module, as DSPy counts them
    assert meter.usage()["lm_calls"] == 2
    assert meter.usage()["lm_input_tokens"] == expected[lm.model]["prompt_tokens"]


def test_the_meter_survives_dspys_parallel_executor_and_counts_every_thread():
    """``dspy.Evaluate`` with several threads (MIPROv2 under ``--threads``, GEPA's trace capture) deep-copies the
    usage tracker into each worker: the meter must come through (it did not: every item scored as a failure)."""
    import copy

    from halluscope.lm.scripted import TwoCallProgram, scripted_lm
    from halluscope.lm.usage import UsageMeter

    meter = UsageMeter()
    assert copy.deepcopy(meter) is meter
    lm = scripted_lm({"answer": "yes"})
    devset = [dspy.Example(question=f"q{i}", label=True).with_inputs("question") for i in range(6)]
    evaluate = dspy.Evaluate(devset=devset, metric=lambda gold, pred, trace=None: float(pred.label),
                             num_threads=3, display_progress=False)
    with dspy.context(lm=lm, adapter=dspy.JSONAdapter()), meter.counting():
        result = evaluate(TwoCallProgram())
    assert result.score == 100.0  # no item lost to a failed copy
    assert meter.lm_usage().calls == 12 == len(lm.engine.calls)
