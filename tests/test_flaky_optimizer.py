"""MIPROv2 with a flaky LM (#24 item 9): 30% garbage replies, or 30% HTTP 500 with no retries, must not abort the
fold; instruction proposals are retried and, past the budget, counted like failed items."""

from __future__ import annotations

import random

import dspy
import pytest
from dspy import lm15
from dspy.lm15 import Message, Response, Usage

from halluscope.lm.models import GuardedJSONAdapter
from halluscope.metrics.adapters import get_metric
from halluscope.optimize.cv import CompileError, FailureCounter, OptimizerConfig, compile_program
from halluscope.optimize.proposals import robust_proposals
from halluscope.programs.registry import get_program
from halluscope.lm.scripted import ScriptedEngine, _install_tap
from tests.test_optimize import _ex, _responder


class FlakyEngine(ScriptedEngine):
    """The scripted engine, but a seeded share ``rate`` of calls answers garbage (``mode="garbage"``) or raises
    an HTTP 500 (``mode="500"``)."""

    def __init__(self, responder, mode: str, rate: float, seed: int = 1):
        super().__init__(responder)
        self.mode, self.rate, self.rng, self.bad = mode, rate, random.Random(seed), 0

    def complete(self, request):
        with self._lock:
            bad = self.rng.random() < self.rate
            self.bad += bad
        if not bad:
            return super().complete(request)
        if self.mode == "500":
            raise lm15.ServerError("injected failure", status=500)
        return Response(id=None, model="flaky", message=Message.assistant("@@ not an answer @@"), finish_reason="stop",
                        usage=Usage(input_tokens=1, output_tokens=1, total_tokens=2))


def flaky_lm(mode: str, rate: float) -> dspy.LM:
    _install_tap()
    return dspy.LM(f"scripted/flaky-{mode}-{rate}", engine=FlakyEngine(_responder, mode, rate), cache=False,
                   num_retries=0)  # like --lm-retries 0


@pytest.fixture(autouse=True)
def _restore():
    lm, adapter = dspy.settings.lm, dspy.settings.adapter
    yield
    dspy.configure(lm=lm, adapter=adapter)


@pytest.mark.parametrize("mode", ["garbage", "500"])
def test_a_flaky_lm_does_not_abort_mipro(mode):
    lm = flaky_lm(mode, 0.3)
    dspy.configure(lm=lm, adapter=GuardedJSONAdapter())
    examples = [_ex(i, i % 3 != 0) for i in range(12)]
    program, info = compile_program(get_program("spans").make(), examples, get_metric("iou"),
                                    OptimizerConfig(candidates=3, trials=3, seed=0), task_lm=lm,
                                    failures=FailureCounter(), max_failed_share=0.5)
    assert lm.engine.bad > 5  # the LM really was flaky
    assert info["proposals"] == 3 and info["proposal_attempts"] > info["proposals"]  # some proposals were retried
    assert info["proposal_failures"] <= 1 and 0.0 <= info["val_score"] <= 1.0
    if mode == "500":
        assert info["lm_errors"] > 0  # counted, not fatal


def test_proposals_that_always_fail_are_counted_and_fail_the_compile():
    good = flaky_lm("garbage", 0.0)
    bad = flaky_lm("garbage", 1.0)
    dspy.configure(lm=good, adapter=GuardedJSONAdapter())
    examples = [_ex(i, i % 3 != 0) for i in range(8)]
    with pytest.raises(CompileError, match="3 of 3 instruction proposals of the compile failed"):
        compile_program(get_program("spans").make(), examples, get_metric("iou"),
                        OptimizerConfig(candidates=3, trials=2, seed=0), task_lm=good, prompt_lm=bad,
                        failures=FailureCounter(), max_failed_share=0.5)


def test_robust_proposals_restores_dspys_proposer():
    from dspy.teleprompt import mipro_optimizer_v2

    before = mipro_optimizer_v2.GroundedProposer
    with robust_proposals(2) as stats:
        assert mipro_optimizer_v2.GroundedProposer is not before and stats.proposals == 0
    assert mipro_optimizer_v2.GroundedProposer is before
