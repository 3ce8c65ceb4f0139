"""An optimize run in MLflow: a parent run with one child run per fold and one for the final compile, the
examples logged as an MLflow dataset (name, split, content hash); ``compare`` lists only parent runs."""

from __future__ import annotations

from mlflow.tracking import MlflowClient

from halluscope.optimize.run import data_hash, run_optimize
from halluscope.tracking.runs import runs_table
from tests.test_optimize_stages import PROGRAM, _config, _examples, fit_program  # noqa: F401  (fixture)


def test_optimize_run_is_a_parent_with_fold_and_final_children(tmp_path, fit_program):  # noqa: F811
    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    examples = _examples(8)
    res = run_optimize(_config(tmp_path, mlflow=True, tracking_uri=uri, dataset="fixture-set", split="val"),
                       examples)
    assert res.status == "FINISHED" and res.mlflow_run_id

    client = MlflowClient(uri)
    exp = client.get_experiment_by_name(f"halluscope/{PROGRAM}/de")
    runs = client.search_runs([exp.experiment_id])
    parent = client.get_run(res.mlflow_run_id)
    children = [r for r in runs if r.data.tags.get("mlflow.parentRunId") == res.mlflow_run_id]
    assert len(runs) == 1 + len(children) == 4  # parent + 2 folds + final compile
    assert "mlflow.parentRunId" not in parent.data.tags

    folds = sorted((r for r in children if r.data.tags["halluscope.kind"] == "optimize.fold"),
                   key=lambda r: int(r.data.params["fold"]))
    assert [r.info.run_name for r in folds] == ["fold 1", "fold 2"]
    for r, f in zip(folds, res.cv.folds):
        assert r.data.metrics["zero_shot/f1"] == f.zero_shot["f1"]
        assert r.data.metrics["compiled/f1"] == f.compiled["f1"]
        assert r.data.metrics["n_heldout"] == f.n_heldout == 4
        assert parent.data.metrics[f"fold{f.fold}/compiled/f1"] == f.compiled["f1"]
        (ds,) = r.inputs.dataset_inputs
        heldout = [ex for ex in examples if ex.id in set(f.heldout_ids)]
        assert ds.dataset.digest == data_hash(heldout)[:16]
        assert {t.key: t.value for t in ds.tags}["mlflow.data.context"] == f"val/fold{f.fold}-heldout"
    (final,) = [r for r in children if r.data.tags["halluscope.kind"] == "optimize.final"]
    assert final.info.run_name == "final compile"
    assert final.data.metrics["threshold"] == res.final_info["threshold"]

    # the whole set as a dataset of the parent run: name, split and the content hash the manifest records
    (ds,) = parent.inputs.dataset_inputs
    assert ds.dataset.name == "fixture-set/de"
    assert {t.key: t.value for t in ds.tags}["mlflow.data.context"] == "val"
    full_hash = res.artifact.manifest["data"]["data_hash"]
    assert ds.dataset.digest == full_hash[:16] and f'"content_hash": "{full_hash}"' in ds.dataset.profile

    rows = runs_table(uri, metric="f1")
    assert [r["run_id"] for r in rows] == [res.mlflow_run_id]  # children are shown inside their parent
