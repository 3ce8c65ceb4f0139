"""Issue #20: ``halluscope evaluate --artifact`` scores a compiled artifact (not the unfitted program) on any data,
loaded with detect's checks, and records its version and hash so ``compare`` shows it as its own point."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import dspy
import pytest

from halluscope.artifacts.store import load_compiled
from halluscope.cli import main as cli_main

COMPILED = Path(__file__).resolve().parent.parent / "compiled"


@pytest.fixture(autouse=True)
def env(monkeypatch, tmp_path):
    monkeypatch.delenv("HALLUSCOPE_DATA_DIR", raising=False)
    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    monkeypatch.setenv("HALLUSCOPE_HOME", str(tmp_path / "home"))
    lm, adapter = dspy.settings.lm, dspy.settings.adapter
    yield
    dspy.configure(lm=lm, adapter=adapter)


def _summary(out: Path) -> dict:
    return json.loads(next(out.rglob("*.summary.json")).read_text())["summary"]


def store_best(lang: str):
    from halluscope.artifacts.store import best_version, list_versions

    return best_version(list_versions("grounded", lang, "iou", root=COMPILED))


def test_evaluate_artifact_scores_the_compiled_program_and_records_it(tmp_path, capsys):
    from halluscope.loaders.mushroom import load_mushroom
    from halluscope.loaders.demo import demo_data_dir
    from halluscope.tracking.views import add_run_settings, run_setting
    from halluscope.tracking.runs import runs_table
    from halluscope.programs.registry import get_program
    from halluscope.evaluation.runner import run_eval

    uri = f"sqlite:///{tmp_path / 'm.db'}"
    common = ["--lang", "de", "--no-progress", "--tracking-uri", uri]
    assert cli_main(["evaluate", "--program", "grounded", *common, "--out-dir", str(tmp_path / "zero")]) == 0
    assert cli_main(["evaluate", "--artifact", "--program", "grounded", "--compiled-dir", str(COMPILED), *common,
                     "--out-dir", str(tmp_path / "compiled")]) == 0
    err = capsys.readouterr().err
    served_here = store_best("de").name  # v0002, or v0004 where the encoder extra is installed
    assert "scoring the compiled artifact" in err and f"grounded/de/iou/{served_here}" in err
    zero, fitted = _summary(tmp_path / "zero"), _summary(tmp_path / "compiled")
    assert fitted["n"] == zero["n"] > 0
    assert fitted["iou"] != pytest.approx(zero["iou"])  # the artifact, not the unfitted program
    # ... and exactly what the artifact detect serves scores on the same items
    detector = load_compiled("grounded", lang="de", metric="iou", root=COMPILED)
    examples = load_mushroom(demo_data_dir(), lang="de", context="native")  # as the CLI loads it
    ref = run_eval(detector.program, examples, progress=False, extra_inputs=get_program("grounded").extra_inputs)
    assert fitted["iou"] == pytest.approx(ref.scores["iou"]) and fitted["corr"] == pytest.approx(ref.scores["corr"])

    # a path to the version folder (here a copy outside compiled/) gives the same score
    served = f"v{detector.version:04d}"  # the version scored above, whichever is served
    copy = tmp_path / "elsewhere" / served
    shutil.copytree(COMPILED / "grounded" / "de" / "iou" / served, copy)
    assert cli_main(["evaluate", "--artifact", str(copy), *common, "--out-dir", str(tmp_path / "path")]) == 0
    assert _summary(tmp_path / "path")["iou"] == pytest.approx(fitted["iou"])

    # recorded: the version and the hash, so compare keeps it apart from the unfitted program
    rows = add_run_settings([r for r in runs_table(uri, metric="iou") if r["kind"] == "evaluate"], uri)
    settings = {run_setting(r) for r in rows}
    assert len(settings) == 2 and "" in settings  # the unfitted program and the artifact: two points
    # (the two artifact runs, by name and by path: one; the #19 artifact's label starts with its non-default options,
    # "align=true," and on to "rules=true" or, for the encoder's version, a hash of the long rest)
    assert any(s.startswith("align=true,") for s in settings), settings
    from mlflow.tracking import MlflowClient

    params = [MlflowClient(uri).get_run(r["run_id"]).data.params for r in rows]
    recorded = [p for p in params if "content_hash" in p]
    assert len(recorded) == 2 and {p["content_hash"] for p in recorded} == {detector.content_hash}
    assert {p["artifact_version"] for p in recorded} == {str(detector.version)}


def test_a_tampered_or_missing_artifact_is_refused_in_one_line(tmp_path, capsys):
    bad = tmp_path / "v0001"
    shutil.copytree(COMPILED / "grounded" / "de" / "iou" / "v0001", bad)
    man = json.loads((bad / "manifest.json").read_text())
    man["metric"] = "corr"  # edited without re-hashing
    (bad / "manifest.json").write_text(json.dumps(man))
    for argv, words in [(["--artifact", str(bad)], "content hash mismatch"),
                        (["--artifact", str(tmp_path / "nope")], "is not a version folder"),
                        (["--artifact", "--program", "grounded", "--compiled-dir", str(COMPILED), "--version", "9"],
                         "no version v0009"),
                        (["--artifact", str(bad), "-O", "window=2"], "not with --artifact"),
                        (["--version", "1"], "--version: goes with --artifact")]:
        with pytest.raises(SystemExit) as e:
            cli_main(["evaluate", "--lang", "de", "--no-mlflow", "--out-dir", str(tmp_path / "o"), *argv])
        err = capsys.readouterr().err
        assert e.value.code == 2 and words in err and "Traceback" not in err, (argv, err)
        assert len([ln for ln in err.splitlines() if "error" in ln]) == 1


def _mushroom_file(path: Path, ids: list[str]) -> Path:
    rows = [{"id": i, "lang": "EN", "model_input": "What did Petra van Staveren win a gold medal for?",
             "model_output_text": "Petra van Stoveren won a silver medal in the 2008 Summer Olympics in Beijing.",
             "model_id": "m", "soft_labels": [{"start": 25, "end": 31, "prob": 0.9}], "hard_labels": [[25, 31]]}
            for i in ids]
    path.write_text("".join(json.dumps(r) + "\n" for r in rows), encoding="utf-8")
    return path


def test_evaluate_artifact_warns_when_the_items_are_those_it_was_fitted_on(tmp_path, capsys):
    """#34: the served English artifact was compiled on val-en-1..50; scoring those items says so, with the
    cross-validated score beside; other items do not warn. --context none scores the words without evidence."""
    common = ["--artifact", "--program", "grounded", "--lang", "en", "--compiled-dir", str(COMPILED), "--context",
              "none", "--no-progress", "--no-mlflow"]
    data = _mushroom_file(tmp_path / "fitted.jsonl", ["val-en-1", "val-en-2", "other-1"])
    assert cli_main(["evaluate", *common, "--data-dir", str(data), "--out-dir", str(tmp_path / "a")]) == 0
    err = capsys.readouterr().err
    assert "warning: in-sample scores: 2 of 3 scored items are items it was compiled on" in err
    assert "its cross-validated iou is 0.3" in err and "(5 folds)" in err
    assert "scoring the words without evidence" in err
    preds = [json.loads(x) for x in next((tmp_path / "a").rglob("*.predictions.jsonl")).read_text().splitlines()]
    assert all(p["units"] and p["verdict"] != "unverifiable" for p in preds)  # words scored, as the protocol asks
    data = _mushroom_file(tmp_path / "new.jsonl", ["new-1", "new-2"])
    assert cli_main(["evaluate", *common, "--data-dir", str(data), "--out-dir", str(tmp_path / "b")]) == 0
    assert "in-sample" not in capsys.readouterr().err
