"""``grounded -O unit_pool=<Mu-SHROOM folder>``: the unit combiner of one language also fitted on the other
languages' validation items (#19)."""

from __future__ import annotations

import json

import numpy as np
import pytest

from halluscope.loaders.mushroom import load_mushroom
from halluscope.programs.grounded.program import build_grounded, fit_grounded
from halluscope.programs.grounded.units import units_of
from halluscope.programs.registry import OptionError, get_program
from tests.test_grounded import fixture_examples, fixture_records


def _pool_folder(tmp_path, langs=("fr", "sv", "de")):
    """A Mu-SHROOM folder (val items + native contexts) holding ``langs``; fr's wrong answers are marked on the
    whole answer, so pooling fr visibly moves the fit."""
    root = tmp_path / "mushroom"
    for lang in langs:
        recs = []
        for i, r in enumerate(fixture_records(6)):
            r = dict(r, id=f"val-{lang}-{i}", lang=lang)
            if lang == "fr" and r["hard_labels"]:
                r["hard_labels"] = [[0, len(r["model_output_text"])]]
                r["soft_labels"] = [{"start": 0, "end": len(r["model_output_text"]), "prob": 1.0}]
            recs.append(r)
        f = root / "val" / f"mushroom.{lang}-val.v2.jsonl"
        f.parent.mkdir(parents=True, exist_ok=True)
        f.write_text("".join(json.dumps(r) + "\n" for r in recs), "utf-8")
        for r in recs:
            c = root / "context" / "val" / "native" / lang / f"{r['id']}.context.txt"
            c.parent.mkdir(parents=True, exist_ok=True)
            c.write_text(r["context"], "utf-8")
    return root


def test_unit_pool_adds_the_other_languages_units_with_the_chosen_total_weight(tmp_path):
    root = _pool_folder(tmp_path)
    train = fixture_examples(16)  # German: de is the training language and is never pooled
    alone, pooled = build_grounded(), build_grounded(unit_pool=str(root))
    a, p = fit_grounded(alone, train, "iou"), fit_grounded(pooled, train, "iou")
    expected = sum(len(units_of(ex.answer)) for lang in ("fr", "sv")
                   for ex in load_mushroom(root, lang=lang, split="val", context="native"))
    assert p["unit_pool"]["langs"] == ["fr", "sv"] and p["unit_pool"]["units"] == expected
    assert "unit_pool" not in a
    # the pool as a whole weighs as much as the training units (unit_pool_weight 1)
    assert p["unit_pool"]["unit_weight"] * expected == pytest.approx(p["n_units"])
    assert not np.allclose(alone.combiner.weights, pooled.combiner.weights)
    assert p["n_items"] == a["n_items"] == 16  # the threshold is chosen on the training items alone
    heavier = build_grounded(unit_pool=str(root), unit_pool_weight=3.0)
    h = fit_grounded(heavier, train, "iou")
    assert h["unit_pool"]["unit_weight"] == pytest.approx(3 * p["unit_pool"]["unit_weight"])
    assert not np.allclose(heavier.combiner.weights, pooled.combiner.weights)
    # the program's own IDF table is the training language's, not the last pooled language's
    assert alone.idf_table.to_dict() == pooled.idf_table.to_dict()


def test_unit_pool_refuses_a_training_set_of_several_languages_and_the_hidden_signal(tmp_path):
    root = _pool_folder(tmp_path, langs=("fr",))
    mixed = fixture_examples(8) + [ex.copy(lang="fr") for ex in fixture_examples(8)]
    with pytest.raises(ValueError, match=r"unit_pool fits one language.*\['de', 'fr'\]"):
        fit_grounded(build_grounded(unit_pool=str(root)), mixed, "iou")
    with pytest.raises(ValueError, match="unit_pool and hidden"):
        build_grounded(unit_pool=str(root), hidden=True)
    with pytest.raises(OptionError, match="unit_pool_weight"):
        get_program("grounded").make(unit_pool=str(root), unit_pool_weight=0)


def test_a_pool_folder_without_other_languages_leaves_the_fit_alone(tmp_path):
    root = _pool_folder(tmp_path, langs=("de",))
    train = fixture_examples(16)
    alone, pooled = build_grounded(), build_grounded(unit_pool=str(root))
    fit_grounded(alone, train, "iou")
    info = fit_grounded(pooled, train, "iou")
    assert info["unit_pool"] == {"langs": [], "units": 0}
    assert np.allclose(alone.combiner.weights, pooled.combiner.weights)


def test_fit_units_false_keeps_the_untrained_unit_part_and_scores_it():
    from halluscope.programs.grounded.program import hand_set_combiner

    train = fixture_examples(16)
    untrained = build_grounded()
    kept = build_grounded(fit_units=False)
    info = fit_grounded(kept, train, "iou")
    assert info["units_fitted"] is False
    assert np.array_equal(kept.combiner.weights, untrained.combiner.weights)
    assert np.array_equal(kept.combiner.weights, hand_set_combiner(kept.features).weights)
    assert kept.idf_table.to_dict() == untrained.idf_table.to_dict()  # the table the hand-set weights were set with
    assert (kept.threshold, kept.floor) == (untrained.threshold, untrained.floor) == (0.5, 0.0)
    assert 0.0 <= info["train_iou"] <= 1.0  # the untrained unit part, scored on the training items
    ex = train[1]
    args = dict(question=ex.question, answer=ex.answer, context=ex.context, lang="de",
                model_output_tokens=ex.model_output_tokens, model_output_logits=ex.model_output_logits)
    assert [s.prob for s in kept(**args).detection.spans] == [s.prob for s in untrained(**args).detection.spans]
    fitted = build_grounded()
    fit_grounded(fitted, train, "iou")
    assert not np.allclose(fitted.combiner.weights, untrained.combiner.weights)
    # a refit with fit_units=false starts again from the untrained unit part, not from an earlier fit
    fitted.fit_units = False
    fit_grounded(fitted, train, "iou")
    assert np.array_equal(fitted.combiner.weights, untrained.combiner.weights) and fitted.threshold == 0.5
    with pytest.raises(ValueError, match="unit_pool needs fit_units"):
        build_grounded(unit_pool="x", fit_units=False)
