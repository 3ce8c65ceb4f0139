"""``halluscope compare``'s grid and cost–quality frontier: the Pareto front, the points per language, the PNGs
written and logged to MLflow (local SQLite store)."""

from __future__ import annotations

import json

from mlflow.tracking import MlflowClient

from halluscope.optimize.compare import COMPARE_EXPERIMENT, frontier_points, grid_cells, pareto_front
from halluscope.optimize.tracking import track_run


def _row(program, lang, score, calls, n=10, kind="evaluate", sd=None, tokens=None, **kw):
    return {"run_id": f"{program}-{lang}", "status": "FINISHED", "kind": kind, "program": program, "lang": lang,
            "optimizer": kw.get("optimizer", "-"), "opt_metric": "iou", "lm": "m", "source": "mushroom/x",
            "n": n, "score": score, "sd": sd, "zero_shot": kw.get("zero_shot"), "zero_shot_sd": None,
            "lm_calls": calls, "lm_tokens": tokens}


def test_pareto_front():
    pts = [{"cost": 0, "score": 0.4}, {"cost": 0, "score": 0.3}, {"cost": 1, "score": 0.35},
           {"cost": 1, "score": 0.5}, {"cost": 3, "score": 0.5}, {"cost": 5, "score": 0.7}]
    assert [(p["cost"], p["score"]) for p in pareto_front(pts)] == [(0, 0.4), (1, 0.5), (5, 0.7)]
    assert pareto_front([]) == []


def test_points_and_cells_take_the_latest_run_per_program_and_language():
    rows = [_row("spans", "de", 0.1, 20, tokens=2000), _row("spans", "de", 0.9, 10),  # older run: ignored
            _row("mark-all", "de", 0.4, 0), _row("mark-all", "en", 0.2, 0),
            _row("spans", "de", 0.3, 500, kind="optimize", sd=0.05, optimizer="MIPROv2(auto=light)",
                 zero_shot=0.2),
            {**_row("logits", "de", 0.5, 0), "status": "FAILED"}]
    pts = frontier_points(rows)
    assert sorted((p["label"], p["cost"], p["score"]) for p in pts["de"]) == [
        ("mark-all (m)", 0.0, 0.4), ("spans (m)", 2.0, 0.1)]  # optimize and failed runs are not on it
    assert [p["cost"] for p in frontier_points(rows, "tokens")["de"]] == [200.0]  # only runs with tokens
    cells = grid_cells(rows)
    assert cells[("spans MIPROv2 [iou] (m)", "de")] == (0.3, 0.05)
    assert cells[("spans zero-shot, CV (m)", "de")] == (0.2, None)
    assert cells[("spans (m)", "de")] == (0.1, None) and ("logits (m)", "de") not in cells


def test_compare_writes_grid_and_frontier_and_logs_them(tmp_path, monkeypatch, capsys):
    from halluscope.cli import main

    monkeypatch.chdir(tmp_path)
    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    for program, lang, iou, calls, tokens in [("mark-all", "de", 0.40, 0, 0), ("logits", "de", 0.29, 0, 0),
                                              ("spans", "de", 0.08, 20, 4000), ("mark-all", "en", 0.2, 0, 0),
                                              ("spans", "en", 0.1, 20, 3000)]:
        track_run("evaluate", program, lang, {"program": program, "source": f"mushroom/{lang}/val"},
                  {"iou": iou, "n": 20, "lm_calls": calls, "lm_input_tokens": tokens, "lm_output_tokens": 0},
                  tracking_uri=uri, strict=True)
    out = tmp_path / "views"
    rc = main(["compare", "--tracking-uri", uri, "--out-dir", str(out), "--plot", str(out / "bars.png"),
               "--cost", "tokens"])
    assert rc == 0
    for name in ("iou-grid.png", "iou-frontier.png", "bars.png"):
        assert (out / name).stat().st_size > 5000, name
    err = capsys.readouterr().err
    assert "frontier: " in err and "logged to MLflow" in err
    client = MlflowClient(uri)
    exp = client.get_experiment_by_name(COMPARE_EXPERIMENT)
    (run,) = client.search_runs([exp.experiment_id])
    logged = {f.path for f in client.list_artifacts(run.info.run_id, "compare")}
    assert logged == {"compare/iou-grid.png", "compare/iou-frontier.png", "compare/bars.png", "compare/runs.json"}
    # compare's own run is not one of the compared runs
    rc = main(["compare", "--tracking-uri", uri, "--no-plot", "--json"])
    rows = json.loads(capsys.readouterr().out)
    assert rc == 0 and len(rows) == 5 and {r["kind"] for r in rows} == {"evaluate"}
