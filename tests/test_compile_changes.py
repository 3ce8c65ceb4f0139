"""What a compile changed, beside whether cross-validation backs it (optimize/changes.py, #21 round eight)."""

from __future__ import annotations

import dspy

from halluscope.cli.optimize import format_summary
from halluscope.optimize.changes import format_changes, state_changes, unsupported_changes
from halluscope.optimize.cv import OptimizerConfig
from halluscope.optimize.run import FINISHED, OptimizeConfig, run_optimize
from halluscope.lm.scripted import scripted_lm
from tests.test_reanchor_gepa import _examples  # even items hallucinated ("Berlin" where the context says Paris)


def _state(instructions="Is there a hallucination?", demos=(), threshold=0.5, **other):
    return {"ask": {"demos": list(demos), "signature": {"instructions": instructions,
                                                        "fields": [{"prefix": "Input:", "description": "the text"}]},
                    "fields": {"verdict": {"threshold": threshold}}},
            "metadata": {"dependency_versions": {"dspy": "3.4.1"}}, **other}


def test_identical_states_change_nothing_and_metadata_is_ignored():
    other = _state()
    other["metadata"] = {"dependency_versions": {"dspy": "9"}}
    assert state_changes(_state(), other) == []
    assert not unsupported_changes([], 0.5, 0.5)


def test_each_kind_of_change_is_listed_and_shown():
    after = _state("This is the new instruction. The story of the Shiver of the Shadows.", demos=[{"answer": "x"}],
                   threshold=0.62, combiner={"w": [1]})
    after["ask"]["signature"]["fields"][0]["prefix"] = "Text:"
    changes = state_changes(_state(combiner={"w": [0]}), after)
    assert [c["what"] for c in changes] == ["instructions", "field", "demos", "fitted", "state"]
    assert changes[0]["after"].startswith("This is the new instruction")
    assert changes[2] == {"predictor": "ask", "what": "demos", "before": 0, "after": 1}
    assert changes[3]["before"] == {"threshold": 0.5} and changes[3]["after"] == {"threshold": 0.62}
    lines = format_changes(changes)
    assert lines[0] == ("ask: instructions 'Is there a hallucination?' -> 'This is the new instruction. The story of "
                        "the Shiver of the Shadows.'")
    assert lines[2] == "ask: 0 -> 1 demos" and lines[4] == "combiner: fitted state (see program.json)"
    # the same number of demos, other ones, is a change too
    swapped = state_changes(_state(demos=[{"answer": "a"}]), _state(demos=[{"answer": "b"}]))
    assert format_changes(swapped) == ["ask: 1 -> 1 demos (other demos)"]
    # a predictor that only one state has
    assert format_changes(state_changes(_state(), {**_state(), "ask_2": _state()["ask"]})) == ["ask_2: predictor added"]


def test_changes_are_unsupported_unless_cross_validation_shows_a_gain():
    changes = state_changes(_state(), _state("other"))
    assert unsupported_changes(changes, 0.5, 0.5)  # equal: no gain
    assert unsupported_changes(changes, 0.4, 0.5)
    assert not unsupported_changes(changes, 0.6, 0.5)
    assert not unsupported_changes(changes, None, 0.5)  # no cross-validation: nothing to say


def _lm(p_yes):
    return scripted_lm(lambda call: {k: "Yes" for k in call.outputs},
                       logprobs=lambda call: {k: {"Yes": p_yes(call), "No": 1 - p_yes(call)} for k in call.outputs})


def _run(tmp_path, lm):
    cfg = OptimizeConfig(program="direct", metric="accuracy", folds=2, mlflow=False,
                         compiled_dir=tmp_path / "compiled", report_dir=tmp_path / "reports",
                         optimizer=OptimizerConfig(name="reanchor"))
    res = run_optimize(cfg, _examples(), task_lm=lm)
    assert res.status == FINISHED, res.error
    return res


def test_a_supported_change_is_in_the_manifest_and_the_summary(tmp_path):
    res = _run(tmp_path, _lm(lambda call: 0.93 if "Berlin" in call.inputs.get("input", "") else 0.81))
    changes = res.manifest["changes"]
    assert [(c["predictor"], c["what"], c["field"]) for c in changes] == [("ask", "fitted", "verdict")]
    assert res.artifact.manifest["changes"] == changes  # written with the artifact
    text = format_summary(res, compiled_dir=tmp_path / "compiled")
    assert "the compile changed: ask: fitted verdict" in text and "NOTE" not in text
    # the same artifact, had the folds shown no gain: the summary says the change is not backed
    res.artifact.manifest["cv"]["mean"]["compiled"]["accuracy"]["mean"] = \
        res.artifact.manifest["cv"]["mean"]["zero_shot"]["accuracy"]["mean"]
    text = format_summary(res, compiled_dir=tmp_path / "compiled")
    assert "NOTE: cross-validation shows no gain" in text and "not supported by held-out data" in text


def test_a_compile_that_changes_nothing_says_so(tmp_path):
    res = _run(tmp_path, _lm(lambda call: 0.9))  # P(Yes) carries nothing: no cut point beats "flag all"
    assert res.manifest["changes"] == []
    text = format_summary(res, compiled_dir=tmp_path / "compiled")
    assert "the compile changed nothing: the artifact is the zero-shot program" in text and "NOTE" not in text
