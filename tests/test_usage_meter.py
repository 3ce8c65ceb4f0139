"""optimize.run.UsageMeter: LM calls and tokens from DSPy's history, the program's calls told from the
optimizer's by the module stack (never by prompt wording)."""

from __future__ import annotations

import dspy

from halluscope.optimize.cv import OptimizerConfig
from halluscope.optimize.run import FINISHED, OptimizeConfig, UsageMeter, run_optimize
from halluscope.programs.registry import get
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
    with dspy.context(lm=lm, adapter=dspy.JSONAdapter(), callbacks=[*(dspy.settings.get("callbacks") or []), meter]):
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
    assert get("spans").uses_lm
    task = sum(1 for c in lm.engine.calls if program_outputs & set(c.outputs))
    other = len(lm.engine.calls) - task
    assert task > 0 and other > 0  # MIPROv2 proposed instructions through the same LM
    assert (res.usage["lm_task_calls"], res.usage["lm_prompt_calls"]) == (task, other)
    assert res.usage["lm_calls"] == len(lm.engine.calls)
