"""Programs for the Ray engine's tests, imported by each actor through ``RayOptions.imports``.

``crash-once:<path>`` answers kill the worker process the first time (``os._exit``, as an OOM kill would),
leaving ``<path>`` behind as proof; ``raise`` answers raise. Every other answer gets one span over its first
three characters. ``test-garbage`` answers like an LM program whose LM answered garbage: a detection that
records a parse failure (``failures={"parse": 1}``), no exception. ``test-lm`` asks a scripted LM once per answer (an LM the actor has without configuring
one: the gate and the LM-usage columns see its calls). They are registered only where this module is imported
(the tests restore the registry afterwards).
"""

from __future__ import annotations

import os
from pathlib import Path

import dspy

from halluscope.core.contract import Detection, to_prediction
from halluscope.programs.registry import ProgramSpec, register_program
from halluscope.lm.scripted import scripted_lm

NAME = "test-crash-once"
LM_NAME = "test-lm"


class CrashOnce(dspy.Module):
    def forward(self, answer: str = "", **_):
        if answer.startswith("crash-once:"):
            marker = Path(answer.split(":", 1)[1])
            if not marker.exists():
                marker.write_text(str(os.getpid()), encoding="utf-8")
                os._exit(1)
        if answer == "raise":
            raise RuntimeError("the program failed on purpose")
        return to_prediction(Detection(answer=answer, spans=[(0, 3, 0.9)], label=True, score=0.9))


def build() -> CrashOnce:
    """:class:`CrashOnce` (no options)."""
    return CrashOnce()


register_program(ProgramSpec(name=NAME, build=build, description="test: kills its worker once", uses_lm=False))


class AskOnce(dspy.Module):
    def __init__(self):
        super().__init__()
        self.ask = dspy.Predict("answer -> verdict: bool")
        self.lm = scripted_lm({"verdict": True})

    def forward(self, answer: str = "", **_):
        with dspy.context(lm=self.lm, adapter=dspy.ChatAdapter()):
            verdict = self.ask(answer=answer).verdict
        return to_prediction(Detection(answer=answer, label=bool(verdict), score=1.0 if verdict else 0.0))


def build_lm() -> AskOnce:
    """:class:`AskOnce` (no options)."""
    return AskOnce()


register_program(ProgramSpec(name=LM_NAME, build=build_lm, description="test: one scripted LM call per answer",
                     uses_lm=False))


GARBAGE_NAME = "test-garbage"


class Garbage(dspy.Module):
    def forward(self, answer: str = "", **_):
        return to_prediction(Detection(answer=answer, failures={"parse": 1}))


def build_garbage() -> Garbage:
    """:class:`Garbage` (no options)."""
    return Garbage()


register_program(ProgramSpec(name=GARBAGE_NAME, build=build_garbage, description="test: every output unreadable",
                     uses_lm=False))
