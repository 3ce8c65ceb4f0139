"""The README's Python API example runs as written, with a scripted LM standing in for the embedded model,
against the committed German artifact (compiled/spans/de/iou/v0001)."""

from __future__ import annotations

import contextlib
import io
import re
from pathlib import Path

import dspy

import halluscope
import halluscope.lm.models
from halluscope.lm.scripted import scripted_lm

ROOT = Path(__file__).resolve().parent.parent


def _api_example() -> str:
    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    section = readme.split("## Python API", 1)[1]
    return re.search(r"```python\n(.*?)```", section, re.S).group(1)


def test_readme_python_api_example_runs(monkeypatch):
    lm = scripted_lm(lambda c: {"spans": [{"text": "Álava", "probability": 0.9}]} if "spans" in c.outputs else {})
    configured = []

    def fake_configure(spec, **kwargs):  # what configure("local") does, with the scripted LM instead
        configured.append(spec)
        dspy.configure(lm=lm, adapter=dspy.JSONAdapter())
        return lm

    monkeypatch.setattr(halluscope.lm.models, "configure", fake_configure)
    monkeypatch.setattr(halluscope, "configure", fake_configure, raising=False)
    monkeypatch.chdir(ROOT)  # compiled/ is found under the working directory
    monkeypatch.delenv("HALLUSCOPE_HOME", raising=False)
    monkeypatch.delenv("HALLUSCOPE_COMPILED_DIR", raising=False)
    out = io.StringIO()
    namespace: dict = {}
    with contextlib.redirect_stdout(out):
        exec(compile(_api_example(), "README.md", "exec"), namespace)  # noqa: S102 - our own README
    assert configured == ["local"]
    assert isinstance(namespace["detector"], halluscope.CompiledDetector)
    assert namespace["detector"].version == 1 and namespace["detector"].lang == "de"
    det = namespace["detection"]
    start = det.answer.index("Álava")
    assert det.hard_labels == [[start, start + len("Álava")]] and det.label is True
    assert len(lm.engine.calls) == 1
    printed = out.getvalue().splitlines()
    assert printed[0].startswith("program grounded (the default with the embedded model") and "'de'" in printed[0]
    assert printed[1].startswith("language 'en' (confidence") and "artifact for 'en'" in printed[1]  # load_detector()
    auto_det = namespace["auto"]("The bridge opened in 1947.", context="The Golden Gate Bridge opened in 1937.")
    assert auto_det.answer[slice(*auto_det.hard_labels[0])] == "1947"
    assert printed[2].startswith("1 ") and printed[3].startswith(f"[[{start}, {start + 5}]] True")
    assert "'hard_labels': [[0, 5]]" in printed[4]  # mark-all marks the whole answer
