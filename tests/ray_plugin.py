"""A program for the Ray engine's tests, imported by each actor through ``RayOptions.imports``.

``crash-once:<path>`` answers kill the worker process the first time (``os._exit``, as an OOM kill would),
leaving ``<path>`` behind as proof; ``raise`` answers raise. Every other answer gets one span over its first
three characters. It is registered only where it is imported (the tests restore the registry afterwards).
"""

from __future__ import annotations

import os
from pathlib import Path

import dspy

from halluscope.contract import Detection, to_prediction
from halluscope.programs.registry import ProgramSpec, register

NAME = "test-crash-once"


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


register(ProgramSpec(name=NAME, build=build, description="test: kills its worker once", uses_lm=False))
