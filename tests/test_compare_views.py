"""``halluscope compare``'s grid and cost–quality frontier: the Pareto front, the points per language, the PNGs
written and logged to MLflow (local SQLite store)."""

from __future__ import annotations

import json

from mlflow.tracking import MlflowClient

from halluscope.tracking.views import COMPARE_EXPERIMENT, frontier_points, grid_cells, pareto_front
from halluscope.tracking.runs import track_run


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


def test_frontier_keeps_settings_apart():
    """Runs of one program and LM that differ in options, optimizer setting or artifact version are separate
    frontier points, labelled with the difference; the same setting twice is still the latest run only."""
    from halluscope.tracking.views import run_setting

    defaults = json.dumps({"reasoning": False, "use_context": True, "fuzzy_threshold": 0.85})
    reasoning = json.dumps({"reasoning": True, "use_context": True, "fuzzy_threshold": 0.85})
    rows = [{**_row("spans", "de", 0.30, 40), "run_id": "r1", "options": reasoning},
            {**_row("spans", "de", 0.20, 20), "run_id": "r2", "options": defaults},
            {**_row("spans", "de", 0.10, 20), "run_id": "r3", "options": defaults},  # older, same setting
            {**_row("spans", "de", 0.25, 20), "run_id": "r4", "artifact_version": "3", "content_hash": "ab" * 32},
            {**_row("spans", "de", 0.22, 20), "run_id": "r5", "artifact_version": "4", "content_hash": "cd" * 32},
            {**_row("spans", "de", 0.21, 20), "run_id": "r6", "optimizer": "MIPROv2(auto=light)"},
            {**_row("spans", "de", 0.27, 20), "run_id": "r7", "optimizer": "BootstrapFewShot(max_labeled_demos=4)"}]
    pts = {p["label"]: p for p in frontier_points(rows)["de"]}
    assert sorted(pts) == ["spans (m)", "spans [BootstrapFewShot(max_labeled_demos=4)] (m)",
                           "spans [MIPROv2(auto=light)] (m)", "spans [reasoning=true] (m)",
                           "spans [v0003; #abababab] (m)", "spans [v0004; #cdcdcdcd] (m)"]
    assert pts["spans (m)"]["run_id"] == "r2" and pts["spans [reasoning=true] (m)"]["cost"] == 4.0
    assert pts["spans [v0003; #abababab] (m)"]["setting"] == "v0003; #abababab"
    # an unknown program shows all its options; a long setting is cut but stays distinct
    assert run_setting({"program": "gone", "options": '{"k": 1}'}) == "k=1"
    long_a = run_setting({"program": "gone", "options": json.dumps({f"opt{i}": "x" * 10 for i in range(6)})})
    long_b = run_setting({"program": "gone", "options": json.dumps({f"opt{i}": "y" * 10 for i in range(6)})})
    assert len(long_a) <= 90 and long_a != long_b and " …" in long_a  # cut between two options


def test_compare_reads_each_runs_setting_from_mlflow(tmp_path, monkeypatch):
    """``add_run_settings`` reads the options the evaluate command logs: two runs of spans with different
    options are two points of the frontier that ``halluscope compare`` draws."""
    from halluscope.tracking.views import add_run_settings
    from halluscope.tracking.runs import runs_table

    monkeypatch.chdir(tmp_path)
    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    for reasoning, iou, calls in [(False, 0.2, 20), (True, 0.3, 40), (False, 0.25, 20)]:
        options = json.dumps({"fuzzy_threshold": 0.85, "reasoning": reasoning, "use_context": True}, sort_keys=True)
        track_run("evaluate", "spans", "de", {"program": "spans", "lm": "m", "options": options,
                                              "source": "mushroom/de/val"},
                  {"iou": iou, "n": 20, "lm_calls": calls}, tracking_uri=uri, strict=True)
    rows = runs_table(uri, metric="iou")
    assert len(frontier_points(rows)["de"]) == 1  # without the settings the runs collapse into one point
    pts = frontier_points(add_run_settings(rows, uri))["de"]
    assert sorted((p["setting"], p["score"], p["cost"]) for p in pts) == [("", 0.25, 1.0),
                                                                          ("reasoning=true", 0.3, 2.0)]


def test_legend_labels_say_in_words_what_a_run_lacks(tmp_path):
    """No "(-)" or "(none)": a run without an LM or a known optimizer says so (#23 item 9)."""
    from halluscope.tracking.runs import _short_lm, runs_table

    assert _short_lm(None) == _short_lm("none") == _short_lm("-") == "no LM"
    assert _short_lm('{"model": "openai/gpt-4o-mini"}') == "gpt-4o-mini"
    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    track_run("evaluate", "grounded", "de", {"program": "grounded", "lm": "none"}, {"iou": 0.4, "lm_calls": 0, "n": 4},
              tracking_uri=uri, strict=True)
    rows = runs_table(uri, metric="iou")
    labels = [p["label"] for p in frontier_points(rows)["de"]] + [k[0] for k in grid_cells(rows)]
    assert labels and all("(no LM)" in label for label in labels)
    optimize = _row("spans", "de", 0.3, 5, kind="optimize", optimizer="?", zero_shot=0.2)
    assert ("spans unknown optimizer [iou] (m)", "de") in grid_cells([optimize])
    assert not any("(-)" in label or "(none)" in label for label in labels)
