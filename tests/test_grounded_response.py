"""Issue #19 (items 4 and 5): the tree combiner stored as JSON data, the response head of ``grounded``, its fit on
response labels (``optimize.py --dataset halluclean --task qa``) and ``detect --task``."""

from __future__ import annotations

import json

import dspy
import numpy as np
import pytest

from halluscope.programs.grounded.combiner import TreeCombiner, combiner_from_dict
from halluscope.programs.grounded.program import fit_grounded, response_rows
from halluscope.programs.grounded.response import (choose_response_threshold, content_mask, group_folds,
                                                   pair_ranking, units_decision)
from halluscope.programs.grounded.signals.support import IdfTable
from halluscope.programs.grounded.units import units_of
from halluscope.programs.registry import get_program
from tests.test_grounded import fixture_examples, inputs

FAST = {"align": False, "encoder": False}  # the sentence encoder is not what these tests are about


# -- the tree combiner ---------------------------------------------------------------------------------------

def test_tree_combiner_predicts_as_scikit_learn_and_survives_json():
    from sklearn.ensemble import HistGradientBoostingClassifier

    rng = np.random.default_rng(0)
    X = rng.random((400, 3))
    y = np.clip(X[:, 0] + 0.2 * X[:, 1] * X[:, 2] + 0.1 * rng.standard_normal(400), 0, 1)  # soft targets
    tc = TreeCombiner(["a", "b", "c"])
    tc.fit(X, y)
    ref = HistGradientBoostingClassifier(**tc.params, l2_regularization=1.0, early_stopping=False, random_state=0)
    w = np.r_[y, 1 - y]
    keep = w > 0  # the combiner drops the rows of weight 0 (a unit no annotator / every annotator marked)
    ref.fit(np.vstack([X, X])[keep], np.r_[np.ones(400), np.zeros(400)].astype(int)[keep], sample_weight=w[keep])
    Z = rng.random((200, 3))
    assert np.allclose(tc.predict(Z), ref.predict_proba(Z)[:, 1], atol=1e-9)
    back = combiner_from_dict(json.loads(json.dumps(tc.to_dict())))
    assert isinstance(back, TreeCombiner) and np.array_equal(back.predict(Z), tc.predict(Z))
    # an interaction a logistic regression cannot express: p rises with a only where b is high
    assert tc.predict([[0.9, 0.1, 0.1]])[0] > tc.predict([[0.1, 0.1, 0.1]])[0]


def test_tree_combiner_refuses_a_malformed_tree():
    good = TreeCombiner(["a"], trees=[{"feature": [0, 0, 0], "threshold": [0.5, 0, 0], "missing_left": [1, 0, 0],
                                       "left": [1, 0, 0], "right": [2, 0, 0], "leaf": [0, 1, 1],
                                       "value": [0, -1.0, 1.0]}])
    assert good.predict([[0.2], [0.8]]).round(3).tolist() == [round(1 / (1 + np.e), 3), round(1 / (1 + np.e ** -1), 3)]
    bad = good.to_dict()
    bad["trees"][0]["right"] = [7, 0, 0]
    with pytest.raises(ValueError, match="outside its tree"):
        combiner_from_dict(bad)
    with pytest.raises(ValueError, match="unknown combiner kind"):
        combiner_from_dict({**bad, "kind": "pickle"})


def test_old_logreg_state_without_kind_still_loads():
    d = {"features": ["a"], "weights": [0.0, 1.0], "mean": [0.0], "scale": [1.0]}  # the pre-#19 layout
    assert combiner_from_dict(d).kind == "logreg"


def test_grounded_with_trees_fits_saves_and_reloads(tmp_path):
    exs = fixture_examples(16)
    m = get_program("grounded").make(combiner="trees", **FAST)
    info = fit_grounded(m, exs, "iou")
    assert info["trees"] > 0 and m.combiner.kind == "trees"
    state = json.loads(json.dumps(m.dump_state()))
    assert state["grounded"]["combiner"]["kind"] == "trees"
    again = get_program("grounded").make(combiner="trees", **FAST).load_state(state)
    for ex in exs[:4]:
        assert again(**inputs(ex)).soft_labels == m(**inputs(ex)).soft_labels
    wrong = [ex for ex in exs if ex.hard_labels]
    pred = m(**inputs(wrong[0]))
    assert pred.hard_labels  # the substituted city is flagged
    with pytest.raises(ValueError, match="option 'combiner' of program 'grounded': expected one of 'logreg', 'trees'"):
        get_program("grounded").make(combiner="forest")


# -- the response decision without a head --------------------------------------------------------------------

def test_an_answer_whose_content_units_are_all_supported_is_labelled_correct():
    m = get_program("grounded").make(**FAST)
    m.idf_table = IdfTable(n_docs=10, df={"the": 10, "is": 10, "of": 10, "a": 10})
    m.threshold = 0.3  # low enough that the unsupported function words cross it
    ctx = "Paris capital France. The city has museums."
    pred = m(answer="Paris is the capital of France", context=ctx, question="")
    # the unsupported function words crossed the unit threshold, but with every content unit supported they are no
    # claim the detector stands behind (#34): held at 0.5, no hard span, label correct
    by = {u["text"]: u["score"] for u in pred.units}
    assert max(by["is"], by["the"], by["of"]) == 0.5 and by["Paris"] < 0.5
    assert pred.hard_labels == [] and all(u["label"] == "supported" for u in pred.units)
    assert pred.label is False and pred.score <= 0.5
    wrong = m(answer="Lyon is the capital of France", context=ctx, question="")
    assert wrong.label is True  # a content unit (Lyon) lacks support


def test_content_mask_and_units_decision():
    units = units_of("the 1887 Eiffel of")
    mask = content_mask(units, [0.0, 0.0, 0.9, 0.1])
    assert mask.tolist() == [False, True, True, False]  # numbers always count
    assert units_decision([0.9, 0.2, 0.4, 0.95], mask) == 0.4
    assert units_decision([0.9, 0.7], np.array([False, False])) == 0.9  # no content unit: every unit


# -- response head helpers -----------------------------------------------------------------------------------

def test_group_folds_keep_twins_together_and_threshold_and_pairs():
    groups = [f"g{i // 2}" for i in range(20)]
    labels = [i % 2 == 1 for i in range(20)]
    folds = group_folds(groups, labels, 5, seed=3)
    assert sorted(i for f in folds for i in f) == list(range(20))
    for f in folds:
        assert {groups[i] for i in f}.isdisjoint({groups[i] for g in folds if g is not f for i in g})
    y = np.array([0, 0, 0, 1, 1, 1], dtype=bool)
    s = np.array([0.1, 0.2, 0.6, 0.5, 0.7, 0.9])
    t = choose_response_threshold(y, s, "f1")
    assert 0.2 < t <= 0.5  # F1 takes 0.5 (and the 0.6 false positive) over losing a hallucination
    assert choose_response_threshold(y, s, "accuracy") > 0.6 or choose_response_threshold(y, s, "accuracy") <= 0.5
    assert pair_ranking(["a", "a", "b", "b"], np.array([0, 1, 0, 1], bool), np.array([0.1, 0.9, 0.5, 0.5])) == 0.75


# -- fitting on response labels ------------------------------------------------------------------------------

CITIES = [("France", "Paris", "Lyon"), ("Spain", "Madrid", "Seville"), ("Italy", "Rome", "Milan"),
          ("Sweden", "Stockholm", "Malmo"), ("Finland", "Helsinki", "Turku"), ("Norway", "Oslo", "Bergen"),
          ("Poland", "Warsaw", "Krakow"), ("Austria", "Vienna", "Graz"), ("Greece", "Athens", "Patras"),
          ("Portugal", "Lisbon", "Porto"), ("Hungary", "Budapest", "Debrecen"), ("Ireland", "Dublin", "Cork")]


def qa_records():
    """HalluClean-shaped QA items (HaluEval): the hallucinated answer names another city and adds a claim."""
    return [{"id": str(i), "knowledge": f"The capital of {c} is {right}. {right} is the largest city of {c}.",
             "question": f"What is the capital of {c}?", "right_answer": f"{right}",
             "hallucinated_answer": f"The capital of {c} is {wrong}, founded by Romans in 1204."}
            for i, (c, right, wrong) in enumerate(CITIES)]


def qa_examples():
    out = []
    for r in qa_records():
        for ans, lab in ((r["right_answer"], False), (r["hallucinated_answer"], True)):
            out.append(dspy.Example(id=r["id"], task="qa", lang="en", question=r["question"], answer=ans,
                                    context=r["knowledge"], label=lab, reference=r["right_answer"])
                       .with_inputs("question", "answer", "lang", "context", "task"))
    return out


def test_fit_on_response_labels_fits_a_head_that_decides_the_label():
    exs = qa_examples()
    m = get_program("grounded").make(units_from="none", **FAST)
    info = fit_grounded(m, exs, "f1")
    assert info["level"] == "response" and info["units_from"].startswith("hand-set")
    assert m.head is not None and info["response"]["held_out"]["folds"] == 5
    assert info["response"]["held_out"]["auc"] > 0.9  # held-out answers, not the fitted ones
    right = m(question="What is the capital of Chile?", answer="Santiago", context="The capital of Chile is Santiago.")
    wrong = m(question="What is the capital of Chile?", answer="The capital of Chile is Valparaiso, founded by "
                                                              "Romans in 1204.", context="The capital of Chile is Santiago.")
    assert right.label is False and wrong.label is True and wrong.score > right.score
    assert "response head" in wrong.rationale
    state = json.loads(json.dumps(m.dump_state()))
    again = get_program("grounded").make(units_from="none", **FAST).load_state(state)
    assert again.head is not None and again.head.threshold == m.head.threshold
    assert again(question="q", answer="Valparaiso 1204", context="Santiago").score == \
        m(question="q", answer="Valparaiso 1204", context="Santiago").score
    bad = json.loads(json.dumps(state))
    bad["grounded"]["response"]["model"]["features"] = bad["grounded"]["response"]["model"]["features"][:-1]
    with pytest.raises(ValueError):
        get_program("grounded").make(units_from="none", **FAST).load_state(bad)


def test_response_fit_takes_the_unit_part_from_the_committed_span_artifact():
    exs = qa_examples()
    from halluscope.artifacts.store import load_compiled

    m = get_program("grounded").make()
    info = fit_grounded(m, exs, "f1", load_compiled=load_compiled)
    assert info["units_from"].startswith("compiled/grounded/en/iou/v")

    base = load_compiled("grounded", lang="en", metric="iou").program
    assert m.features == base.features and m.threshold == base.threshold
    X, y, groups, _ = response_rows(m, exs)
    assert X.shape == (len(exs), len(m.response_features)) and len(set(groups)) == len(CITIES)


def test_fit_refuses_data_with_neither_kind_of_label():
    ex = dspy.Example(answer="x", question="q").with_inputs("answer", "question")
    with pytest.raises(ValueError, match="span labels .* or response labels"):
        fit_grounded(get_program("grounded").make(), [ex], "f1")
    one_class = [ex for ex in qa_examples() if ex.label]
    with pytest.raises(ValueError, match="hallucinated and correct"):
        fit_grounded(get_program("grounded").make(units_from="none", **FAST), one_class, "f1")


def test_optimize_on_a_halluclean_task_and_detect_with_task(tmp_path, capsys):
    from halluscope import cli

    data = tmp_path / "halluclean"
    data.mkdir()
    (data / "QA.dev.json").write_text(json.dumps(qa_records()))
    compiled = tmp_path / "compiled"
    rc = cli.main(["optimize", "--program", "grounded", "--dataset", "halluclean", "--task", "qa", "--metric", "f1",
                   "--data-dir", str(data), "--folds", "2", "--compiled-dir", str(compiled), "--report-dir",
                   str(tmp_path / "reports"), "--no-mlflow", "-O", "align=false", "-O", "encoder=false"])
    assert rc == 0, capsys.readouterr()
    manifest = json.loads((compiled / "grounded" / "qa" / "f1" / "v0001" / "manifest.json").read_text())
    assert manifest["cv"]["k"] == 2 and "f1" in manifest["cv"]["mean"]["compiled"]
    capsys.readouterr()
    rc = cli.main(["detect", "--task", "qa", "--compiled-dir", str(compiled), "--question", "What is the capital "
                   "of Chile?", "--context", "The capital of Chile is Santiago.", "--answer",
                   "The capital of Chile is Valparaiso, founded by Romans in 1204."])
    out, err = capsys.readouterr()
    assert rc == 0, err
    assert "program grounded" in err and "grounded/qa/f1/v0001" in err
    row = json.loads(out)
    assert row["ok"] is True and row["label"] is True


@pytest.mark.parametrize("task", ["qa", "dialogue", "summarization"])
def test_committed_per_task_artifacts_load_and_carry_a_head(task):
    from halluscope.artifacts.store import load_compiled

    det = load_compiled("grounded", lang=task, metric="f1")
    m = det.program
    assert m.head is not None and 0.0 < m.head.threshold < 1.0
    held = m.head.info["held_out"]
    assert held["folds"] == 5 and held["n"] >= 170  # fitted on the whole dev set, scored on held-out folds
    assert det.manifest["cv"]["k"] == 5 and det.manifest["final"]["units_from"].startswith("compiled/grounded/en/iou")
    if task == "qa":  # HaluEval QA: a short right answer vs an invented, longer one
        q, ctx = "Which city is the capital of Chile?", "Santiago is the capital and largest city of Chile."
        right = m(question=q, answer="Santiago", context=ctx)
        wrong = m(question=q, answer="The capital of Chile is Valparaiso, which was founded by Portuguese "
                                     "sailors in 1623.", context=ctx)
        assert right.label is False and wrong.label is True


def test_span_fit_with_response_data_also_fits_a_pooled_head(tmp_path):
    data = tmp_path / "halluclean"
    data.mkdir()
    (data / "QA.dev.json").write_text(json.dumps(qa_records()))
    m = get_program("grounded").make(response_data=str(data), response_tasks="qa", **FAST)
    info = fit_grounded(m, fixture_examples(16), "iou")
    assert info["n_items"] == 16 and m.head is not None  # the unit part on the span labels, then the head
    resp = info["response"]
    assert resp["tasks"] == ["qa"] and resp["n"] == 2 * len(CITIES) and len(resp["data_hash"]) == 64
    assert resp["threshold_metric"] == "balanced_accuracy" and "pooled" in m.head.info["data"]
    state = json.loads(json.dumps(m.dump_state()))
    again = get_program("grounded").make(response_data=str(data), response_tasks="qa", **FAST).load_state(state)
    ex = fixture_examples(2)[0]
    assert again(**inputs(ex)).score == m(**inputs(ex)).score
