"""``direct -O demo_sets=K`` (K verdict predictors, each with its own demos, their calibrated verdicts averaged in
logit) and ``--optimizer pairs`` (contrastive labelled demos: both answers of one source, a different set per
predictor)."""

from __future__ import annotations

import json
import math

import dspy
import pytest

from halluscope.artifacts import store as A
from halluscope.core.decisions import contextual_probability, with_logprob_decisions
from halluscope.lm.scripted import scripted_lm
from halluscope.optimize.cv import OptimizerConfig
from halluscope.optimize.optimizers import contrastive_demo_sets
from halluscope.optimize.run import FINISHED, OptimizeConfig, run_optimize
from halluscope.programs.halluclean.program import DirectAsk, build_direct_routing, combine_verdicts
from halluscope.programs.registry import get_program


def _cases(n_questions: int = 8) -> list[dspy.Example]:
    """Both answers of each question: the right one ("Paris") and the hallucinated one ("Berlin")."""
    out = []
    for q in range(n_questions):
        for bad in (False, True):
            out.append(dspy.Example(id=f"{q}{'h' if bad else 'r'}", source_id=str(q), question=f"Where is item {q}?",
                                    answer=("Berlin" if bad else "Paris") + f" holds item {q}.",
                                    context=f"Item {q} is in Paris.", task="qa", label=bad)
                       .with_inputs("question", "answer", "context", "task"))
    return out


def _shown(call) -> list[dict]:
    """The demos a request shows (a decision output's demos are JSON in the system message), else []."""
    system = call.system or ""
    if "[{" not in system:
        return []
    return json.loads(system[system.index("[{"):system.rindex("}]") + 2])


def _p_yes(call) -> float:
    """P(Yes): a baseline the content-free request gets, moved up by a wrong answer; each demo set shifts the
    baseline by its own amount (what one set of demos does to a small model)."""
    text = call.inputs.get("input", "")
    shift = 0.01 * len("".join(d.get("input", "") for d in _shown(call))) % 0.2
    base = 0.6 + shift
    if "(empty)" in text:
        return base
    return base + (0.1 if "Berlin" in text else -0.05)


def _lm(p_yes=_p_yes):
    return scripted_lm(lambda call: {k: "Yes" for k in call.outputs},
                       logprobs=lambda call: {k: {"Yes": p_yes(call), "No": 1 - p_yes(call)} for k in call.outputs})


def _adapter():
    return with_logprob_decisions(dspy.JSONAdapter())


# ------------------------------------------------------------------------------------------------------
# combine_verdicts (pure)
# ------------------------------------------------------------------------------------------------------


def test_combine_verdicts_averages_logits_from_each_cut():
    assert combine_verdicts([]) is None
    assert combine_verdicts([(0.7, 0.5)]) == pytest.approx(0.7)
    assert combine_verdicts([(0.7, 0.5), (0.3, 0.5)]) == pytest.approx(0.5)
    # a verdict at its own cut adds nothing: (0.6, cut 0.6) leaves the other's lean
    assert combine_verdicts([(0.6, 0.6), (0.8, 0.5)]) == pytest.approx(1 / (1 + math.exp(-math.log(4) / 2)))
    # two weak Yes and one strong No: the mean logit decides, not the vote count
    assert combine_verdicts([(0.55, 0.5), (0.55, 0.5), (0.1, 0.5)]) < 0.5
    # certainty stays finite
    assert 0.5 < combine_verdicts([(1.0, 0.5), (0.2, 0.5)]) < 1.0


# ------------------------------------------------------------------------------------------------------
# contrastive_demo_sets (pure)
# ------------------------------------------------------------------------------------------------------


def test_demo_sets_are_pairs_of_one_source_and_disjoint_across_predictors():
    cases = _cases(8)
    sets, info = contrastive_demo_sets(cases, per_set=4, n_sets=3, seed=0)
    assert info == {"paired": True, "pair_by": "source_id", "pairs_available": 8, "per_set": 4, "sets": 3,
                    "reused": False}
    sources = []
    for demo_set in sets:
        assert len(demo_set) == 4
        by_source = {}
        for ex in demo_set:
            by_source.setdefault(ex.source_id, []).append(ex.label)
        assert all(sorted(labels) == [False, True] for labels in by_source.values())  # both answers of a source
        assert [cases.index(ex) for ex in demo_set] == sorted(cases.index(ex) for ex in demo_set)  # file order
        sources += list(by_source)
    assert len(sources) == len(set(sources)) == 6  # no source in two sets
    again, _ = contrastive_demo_sets(cases, per_set=4, n_sets=3, seed=0)
    assert [[e.id for e in s] for s in again] == [[e.id for e in s] for s in sets]
    other, _ = contrastive_demo_sets(cases, per_set=4, n_sets=3, seed=1)
    assert [[e.id for e in s] for s in other] != [[e.id for e in s] for s in sets]


def test_too_few_sources_are_dealt_again_and_said():
    sets, info = contrastive_demo_sets(_cases(3), per_set=4, n_sets=2, seed=0)
    assert info["reused"] is True and info["pairs_available"] == 3
    assert all(len(s) == 4 for s in sets)


def test_a_source_with_one_label_is_not_a_pair_and_the_pair_field_can_be_named():
    cases = _cases(4)
    lone = dspy.Example(id="x", source_id="9", question="q", answer="a", context="c", task="qa", label=True)
    sets, info = contrastive_demo_sets(cases + [lone], per_set=2, n_sets=4, seed=0)
    assert info["pairs_available"] == 4 and all(ex.id != "x" for s in sets for ex in s)
    renamed = [ex.copy(topic=ex.source_id).without("source_id") for ex in cases]
    sets, info = contrastive_demo_sets(renamed, per_set=2, n_sets=2, seed=0, pair_by="topic")
    assert info["paired"] and info["pair_by"] == "topic"
    assert all(len({ex.topic for ex in s}) == 1 for s in sets)


def test_without_a_pair_field_each_set_has_as_many_hallucinated_as_correct_cases():
    cases = [ex.without("source_id") for ex in _cases(5)]
    sets, info = contrastive_demo_sets(cases, per_set=4, n_sets=2, seed=0)
    assert info["paired"] is False and info["pair_by"] is None and info["reused"] is False
    for demo_set in sets:
        assert sorted(ex.label for ex in demo_set) == [False, False, True, True]
    assert len({ex.id for s in sets for ex in s}) == 8  # no case shown twice


@pytest.mark.parametrize("per_set, n_sets, cases, message", [
    (3, 1, None, "even number of labelled demos per set"),
    (0, 1, None, "even number of labelled demos per set"),
    (2, 0, None, "n_sets must be at least 1"),
    (2, 1, [ex for ex in _cases(3) if ex.label], "both labels"),
])
def test_demo_sets_refuse_bad_settings_in_one_line(per_set, n_sets, cases, message):
    with pytest.raises(ValueError, match=message):
        contrastive_demo_sets([ex.without("source_id") for ex in (cases or _cases(3))], per_set, n_sets)


# ------------------------------------------------------------------------------------------------------
# DirectAsk with several demo sets
# ------------------------------------------------------------------------------------------------------


def test_one_demo_set_is_the_program_as_before():
    program = build_direct_routing(task="qa", calibrate="content_free")
    assert [name for name, _ in program.named_predictors()] == ["ask"]
    assert program.demo_sets == 1


def test_each_predictor_shows_its_own_demos_and_the_calibrated_verdicts_are_averaged():
    cases = _cases(8)
    program = build_direct_routing(task="qa", calibrate="content_free", demo_sets=3)
    assert [name for name, _ in program.named_predictors()] == ["ask", "ask_2", "ask_3"]
    assert all(m.fields == {"verdict": {"threshold": 0.5}} for m in program.members)
    sets, _ = contrastive_demo_sets(cases[4:], per_set=2, n_sets=3, seed=0)
    for member, demos in zip(program.members, sets):
        member.demos = [ex.copy(verdict="Yes" if ex.label else "No") for ex in demos]
    program.ask_3.fields = {"verdict": {"threshold": 0.6}}  # a cut ReAnchor fitted counts from that cut
    lm = _lm()
    for case in cases[:2]:
        n0 = len(lm.engine.calls)
        with dspy.context(lm=lm, adapter=_adapter()):
            pred = program(**case.inputs())
        calls = lm.engine.calls[n0:]
        assert len(calls) == 6  # per predictor: the content-free request and the case
        shown = [tuple(d["input"] for d in _shown(c)) for c in calls]
        assert len(set(shown)) == 3 and all(len(s) == 2 for s in shown)  # three different demo sets
        probs = []
        for cf, real in zip(calls[0::2], calls[1::2]):
            assert "(empty)" in cf.inputs["input"] and "(empty)" not in real.inputs["input"]
            assert _shown(cf) == _shown(real)  # the content-free twin shows the same demos
            probs.append(contextual_probability(_p_yes(real), _p_yes(cf)))
        expected = combine_verdicts(list(zip(probs, [0.5, 0.5, 0.6])))
        assert pred.score == pytest.approx(expected)
        assert pred.label == (expected >= 0.5) and pred.verdict == ("Yes" if expected >= 0.5 else "No")
        assert not pred.failures
    # the wrong answer leans Yes, the right one No, whatever each set does to the baseline
    with dspy.context(lm=lm, adapter=_adapter()):
        assert [program(**c.inputs()).label for c in cases[:4]] == [c.label for c in cases[:4]]


def test_a_predictor_that_does_not_parse_is_counted_and_the_others_decide():
    program = build_direct_routing(task="qa", calibrate="content_free", demo_sets=2)
    program.ask_2.demos = [_cases(1)[0].copy(verdict="No")]

    def responder(call):
        if _shown(call):  # ask_2 (the one with a demo) writes garbage for the case itself
            return "not json" if "(empty)" not in call.inputs["input"] else {k: "Yes" for k in call.outputs}
        return {k: "Yes" for k in call.outputs}

    lm = scripted_lm(responder, logprobs=lambda call: {k: {"Yes": _p_yes(call), "No": 1 - _p_yes(call)}
                                                       for k in call.outputs})
    case = _cases(2)[3]
    with dspy.context(lm=lm, adapter=_adapter()):
        pred = program(**case.inputs())
    assert pred.failures == {"parse": 1}
    first = [c for c in lm.engine.calls if not _shown(c)]
    assert pred.score == pytest.approx(contextual_probability(_p_yes(first[1]), _p_yes(first[0])))
    assert pred.label is True

    all_bad = scripted_lm(lambda call: "not json")
    with dspy.context(lm=all_bad, adapter=_adapter()):
        pred = program(**case.inputs())
    assert pred.label is False and pred.score == 0.5 and pred.verdict is None
    assert pred.failures["parse"] == 2


def test_demo_sets_is_checked_by_the_registry():
    with pytest.raises(ValueError, match="demo_sets"):
        get_program("direct").check_options({"demo_sets": 0})
    with pytest.raises(ValueError, match="demo_sets must be a whole number"):
        DirectAsk(demo_sets=0)
    assert get_program("direct").check_options({"demo_sets": 3})["demo_sets"] == 3


# ------------------------------------------------------------------------------------------------------
# --optimizer pairs through optimize
# ------------------------------------------------------------------------------------------------------


def _config(tmp_path, **kw) -> OptimizeConfig:
    base = dict(program="direct+routing", metric="accuracy", folds=2, fold_groups="source_id", mlflow=False,
                compiled_dir=tmp_path / "compiled", report_dir=tmp_path / "reports",
                program_options={"task": "qa", "calibrate": "content_free", "demo_sets": 2},
                optimizer=OptimizerConfig(name="pairs", max_labeled_demos=4))
    base.update(kw)
    return OptimizeConfig(**base)


def test_pairs_gives_each_predictor_its_own_pairs_from_the_training_part_and_the_artifact_keeps_them(tmp_path):
    cases = _cases(8)
    lm = _lm()
    res = run_optimize(_config(tmp_path), cases, task_lm=lm)
    assert res.status == FINISHED, res.error
    members = res.final.members
    demo_sources = [{d.source_id for d in m.demos} for m in members]
    assert all(len(m.demos) == 4 for m in members)
    assert all(len(s) == 2 for s in demo_sources) and not demo_sources[0] & demo_sources[1]
    assert all(d.verdict == ("Yes" if d.label else "No") for m in members for d in m.demos)
    for fold in res.cv.folds:  # each fold's demos come from its own training part
        assert fold.compile_info["pairs"]["paired"] and fold.compile_info["pairs"]["pair_by"] == "source_id"
    loaded = A.load_compiled("direct+routing", lang="all", metric="accuracy", root=tmp_path / "compiled").program
    assert [[d["answer"] for d in m.demos] for m in loaded.members] == [[d.answer for d in m.demos] for m in members]
    assert res.cv.mean("compiled")["accuracy"]["mean"] == 1.0  # every held-out case decided right from its calibrated P(Yes)


def test_pairs_then_reanchor_fits_each_predictors_cut(tmp_path):
    cfg = _config(tmp_path, optimizer=OptimizerConfig(name="pairs+reanchor", max_labeled_demos=2), folds=1)
    res = run_optimize(cfg, _cases(6), task_lm=_lm())
    assert res.status == FINISHED, res.error
    assert all(m.fields["verdict"].get("threshold") is not None for m in res.final.members)


def test_pairs_needs_an_even_number_of_labelled_demos():
    with pytest.raises(ValueError, match="must be even and at least 2, not 0"):
        OptimizerConfig(name="pairs")
    with pytest.raises(ValueError, match="not 3"):
        OptimizerConfig(name="pairs", max_labeled_demos=3)
    assert "both answers of 2 source_id groups" in OptimizerConfig(name="pairs", max_labeled_demos=4).describe()


def test_cli_pairs_without_labelled_demos_exits_2_in_one_line(capsys):
    from halluscope.cli.optimize import build_parser, validate_args

    p = build_parser()
    with pytest.raises(SystemExit) as e:
        validate_args(p, p.parse_args(["--program", "direct", "--metric", "f1", "--task", "qa", "--optimizer", "pairs"]))
    assert e.value.code == 2
    err = capsys.readouterr().err
    assert "must be even and at least 2" in err and "Traceback" not in err
