"""optimize/: folds, artifacts (hash, signature, versions, refusals), tracking, the optimize/detect/compare
commands — all with the scripted LM (no model, no network)."""

from __future__ import annotations

import json
import pickle
from pathlib import Path

import dspy
import pytest

from halluscope.lm.scripted import ScriptedEngine, scripted_lm
from halluscope.artifacts import store as A
from halluscope.optimize.cv import (FoldSizeError, OptimizerConfig, check_fold_sizes, compile_program, make_folds,
                         train_val_split)

# ------------------------------------------------------------------------------------------------------
# helpers
# ------------------------------------------------------------------------------------------------------


def _ex(i: int, hallucinated: bool) -> dspy.Example:
    answer = f"Answer number {i} says Paris."
    hard = [[len(answer) - 6, len(answer) - 1]] if hallucinated else []
    return dspy.Example(id=f"x-{i}", lang="de", question=f"q{i}?", answer=answer, context="",
                        hard_labels=hard, soft_labels=[{"start": s, "end": e, "prob": 1.0} for s, e in hard],
                        label=hallucinated).with_inputs("question", "answer", "lang", "context")


def _responder(call):
    """Quotes the last word of the answer; plausible text for the optimizer's own calls."""
    if "spans" in call.outputs:
        words = call.inputs.get("answer", "").strip().rstrip(".").split()
        return {"spans": [{"text": words[-1], "probability": 0.9}] if words else []}
    return {"proposed_instruction": "Quote every wrong name, number or date in the answer.",
            "observations": "Short factual answers.", "summary": "Short factual answers.",
            "program_description": "Finds wrong spans.", "module_description": "Extracts wrong spans."}


@pytest.fixture
def scripted():
    lm = scripted_lm(_responder)
    with dspy.context(lm=lm, adapter=dspy.JSONAdapter()):
        yield lm


@pytest.fixture
def spans_program():
    from halluscope.programs.registry import get_program

    return get_program("spans").build()


def _manifest(score: float | None = None, metric: str = "iou") -> dict:
    m = {"program_options": {"reasoning": False, "use_context": True}, "note": "test"}
    if score is not None:
        m["cv"] = {"mean": {"compiled": {metric: {"mean": score, "sd": 0.0}}}}
    return m


def _write(program, root, score=None, **kw):
    return A.write_artifact(program, _manifest(score), program_name=kw.get("name", "spans"), lang="de",
                            metric="iou", root=root)


def _rehash(version_dir: Path) -> None:
    """Recompute the content hash after an edit (simulates a *consistent* artifact, e.g. old code)."""
    man = json.loads((version_dir / "manifest.json").read_text())
    data = (version_dir / "program.json").read_bytes()
    man["content_hash"] = A.content_hash(data, man)
    (version_dir / "manifest.json").write_text(json.dumps(man))


# ------------------------------------------------------------------------------------------------------
# folds and splits
# ------------------------------------------------------------------------------------------------------


def test_folds_partition_deterministic_balanced_and_stratified():
    examples = [_ex(i, i % 4 != 0) for i in range(21)]  # 15 hallucinated, 6 correct
    folds = make_folds(examples, k=3, seed=1)
    assert folds == make_folds(examples, k=3, seed=1)
    assert sorted(i for f in folds for i in f) == list(range(21))
    assert max(map(len, folds)) - min(map(len, folds)) <= 1
    for f in folds:  # both classes in every fold, shares balanced
        n_correct = sum(1 for i in f if not examples[i].label)
        assert n_correct == 2
        assert f == sorted(f)
    assert make_folds(examples, k=3, seed=2) != folds


def test_folds_without_both_classes_and_errors():
    examples = [_ex(i, True) for i in range(5)]
    folds = make_folds(examples, k=2, seed=0)
    assert sorted(map(len, folds)) == [2, 3]
    with pytest.raises(ValueError):
        make_folds(examples, k=1)
    with pytest.raises(FoldSizeError):
        make_folds(examples[:1], k=2)


def test_train_val_split_is_seeded_disjoint_and_stratified():
    examples = [_ex(i, i % 2 == 0) for i in range(10)]
    train, val = train_val_split(examples, 0.5, seed=3)
    assert (train, val) == train_val_split(examples, 0.5, seed=3)
    assert len(train) == 5 and len(val) == 5
    assert not {e.id for e in train} & {e.id for e in val}
    assert sum(e.label for e in val) in (2, 3)
    tr, va = train_val_split(examples[:2], 0.5, seed=0)
    assert len(tr) == 1 and len(va) == 1


def test_fold_too_small_names_smallest_workable_setting():
    cfg = OptimizerConfig()
    check_fold_sizes(4, 2, cfg)  # 2 compile items per fold: one to bootstrap, one to validate
    with pytest.raises(FoldSizeError) as e:
        check_fold_sizes(3, 2, cfg)
    msg = str(e.value)
    assert "MIPROv2 needs at least 2" in msg and "--limit 4" in msg and "--folds 1" in msg
    with pytest.raises(FoldSizeError, match="too few"):
        check_fold_sizes(1, 1, cfg)
    check_fold_sizes(2, 2, OptimizerConfig(name="bootstrap"))


def test_optimizer_config_validation():
    with pytest.raises(ValueError, match="go together"):
        OptimizerConfig(candidates=3)
    cfg = OptimizerConfig(candidates=3, trials=4)
    assert cfg.auto is None and "candidates=3, trials=4" in cfg.describe()
    with pytest.raises(ValueError, match="unknown optimizer"):
        OptimizerConfig(name="copro")  # GEPA and ReAnchor are offered since #21 (tests/test_reanchor_gepa.py)


# ------------------------------------------------------------------------------------------------------
# artifacts
# ------------------------------------------------------------------------------------------------------


def test_write_artifact_versions_files_and_manifest(tmp_path, spans_program):
    a1 = _write(spans_program, tmp_path, 0.2)
    a2 = _write(spans_program, tmp_path, 0.1)
    assert a1.path.name == "v0001" and a2.path.name == "v0002"
    assert sorted(p.name for p in a1.path.iterdir()) == ["manifest.json", "program.json"]
    assert not [p for p in a1.path.parent.iterdir() if p.name.startswith(".tmp")]
    state = json.loads((a1.path / "program.json").read_text())  # plain JSON state, never a pickle
    assert "extract" in state and state["extract"]["lm"] is None
    man = json.loads((a1.path / "manifest.json").read_text())
    for key in ("format", "program", "lang", "metric", "version", "predictors", "program_sha256", "created_at",
                "content_hash", "program_options"):
        assert key in man
    assert man["predictors"]["extract"]["inputs"] == ["question", "answer", "context", "language"]
    assert man["predictors"]["extract"]["outputs"] == ["spans"]
    assert man["content_hash"] == A.content_hash((a1.path / "program.json").read_bytes(), man)
    assert [v.version for v in A.list_versions("spans", "de", "iou", root=tmp_path)] == [1, 2]


def test_write_never_overwrites_existing_version(tmp_path, spans_program, monkeypatch):
    a1 = _write(spans_program, tmp_path)
    before = (a1.path / "manifest.json").read_bytes()
    real = A.list_versions
    monkeypatch.setattr(A, "list_versions", lambda *a, **k: [])  # a stale listing: v0001 looks free
    a2 = _write(spans_program, tmp_path)
    monkeypatch.setattr(A, "list_versions", real)
    assert a2.path.name == "v0002"
    assert (a1.path / "manifest.json").read_bytes() == before


def test_load_best_pinned_and_missing(tmp_path, spans_program):
    _write(spans_program, tmp_path, 0.2)
    _write(spans_program, tmp_path, 0.5)
    _write(spans_program, tmp_path, 0.3)
    best = A.load_compiled("spans", lang="de", metric="iou", root=tmp_path)
    assert best.manifest["version"] == 2
    assert A.load_compiled("spans", lang="de", metric="iou", version=3, root=tmp_path).manifest["version"] == 3
    assert A.load_compiled("spans", lang="de", metric="iou", version="v0001", root=tmp_path).version == 1
    with pytest.raises(A.ArtifactNotFoundError, match="v0009"):
        A.load_compiled("spans", lang="de", metric="iou", version=9, root=tmp_path)
    with pytest.raises(A.ArtifactNotFoundError, match="optimize.py"):
        A.load_compiled("spans", lang="en", metric="iou", root=tmp_path)
    with pytest.raises(ValueError):
        A.load_compiled("spans", lang="de", metric="iou", version="latest", root=tmp_path)


def test_real_data_versions_beat_demo_versions(tmp_path, spans_program):
    real = _manifest(0.1)
    real["source"] = "mushroom/de/val/context=native"
    demo = _manifest(0.9)
    demo["source"] = "demo/de/val/context=native"
    A.write_artifact(spans_program, real, program_name="spans", lang="de", metric="iou", root=tmp_path)
    A.write_artifact(spans_program, demo, program_name="spans", lang="de", metric="iou", root=tmp_path)
    assert A.load_compiled("spans", lang="de", metric="iou", root=tmp_path).version == 1
    assert A.load_compiled("spans", lang="de", metric="iou", version=2, root=tmp_path).version == 2


def test_unscored_versions_fall_back_to_newest(tmp_path, spans_program):
    _write(spans_program, tmp_path)
    _write(spans_program, tmp_path)
    assert A.load_compiled("spans", lang="de", metric="iou", root=tmp_path).version == 2


def test_loaded_state_round_trips(tmp_path, spans_program):
    spans_program.extract.signature = spans_program.extract.signature.with_instructions("Quote wrong facts.")
    spans_program.extract.demos = [dspy.Example(question="q", answer="a", context="", language="de", spans=[])]
    _write(spans_program, tmp_path)
    loaded = A.load_compiled("spans", lang="de", metric="iou", root=tmp_path).program
    assert loaded.extract.signature.instructions == "Quote wrong facts."
    assert len(loaded.extract.demos) == 1


def test_tampered_program_or_manifest_is_refused(tmp_path, spans_program):
    a = _write(spans_program, tmp_path, 0.1)
    prog = a.path / "program.json"
    state = json.loads(prog.read_text())
    state["extract"]["signature"]["instructions"] += " Also mark everything."
    prog.write_text(json.dumps(state))
    with pytest.raises(A.ArtifactIntegrityError, match="content hash mismatch"):
        A.load_compiled("spans", lang="de", metric="iou", root=tmp_path)

    b = _write(spans_program, tmp_path, 0.1)
    man = json.loads((b.path / "manifest.json").read_text())
    man["cv"]["mean"]["compiled"]["iou"]["mean"] = 0.99  # inflate the score to win "best"
    (b.path / "manifest.json").write_text(json.dumps(man))
    with pytest.raises(A.ArtifactIntegrityError):
        A.load_compiled("spans", lang="de", metric="iou", root=tmp_path)

    c = _write(spans_program, tmp_path)
    man = json.loads((c.path / "manifest.json").read_text())
    del man["content_hash"]
    (c.path / "manifest.json").write_text(json.dumps(man))
    with pytest.raises(A.ArtifactIntegrityError):
        A.load_compiled("spans", lang="de", metric="iou", version=c.version, root=tmp_path)
    (c.path / "program.json").unlink()
    with pytest.raises(A.ArtifactIntegrityError, match="not a complete artifact"):
        A.load_compiled("spans", lang="de", metric="iou", version=c.version, root=tmp_path)


def test_signature_mismatch_is_refused(tmp_path, spans_program, monkeypatch):
    # An artifact compiled for other field names (consistent hash): the code's SpanDetector must refuse it.
    other = dspy.Module()
    other.extract = dspy.Predict("question, answer, context, lang -> spans")  # 'lang' instead of 'language'
    _write(other, tmp_path)
    with pytest.raises(A.ArtifactMismatchError, match="input fields"):
        A.load_compiled("spans", lang="de", metric="iou", root=tmp_path)

    # An honest artifact, then the code renames a field: refused although DSPy would load it by position.
    good = tmp_path / "good"
    _write(spans_program, good)
    from halluscope.programs import registry
    from halluscope.programs.spans.program import SpanDetector

    spec = registry.get_program("spans")

    def renamed(reasoning=False, use_context=True):
        p = SpanDetector(reasoning=reasoning, use_context=use_context)
        p.extract.signature = dspy.Signature("question, answer, reference, language -> spans")
        return p

    import dataclasses

    monkeypatch.setitem(registry.REGISTRY, "spans", dataclasses.replace(spec, build=renamed, option_types={}))
    with pytest.raises(A.ArtifactMismatchError, match="reference"):
        A.load_compiled("spans", lang="de", metric="iou", root=good)


def test_lm_inside_state_and_wrong_program_are_refused(tmp_path, spans_program):
    a = _write(spans_program, tmp_path)
    prog = a.path / "program.json"
    state = json.loads(prog.read_text())
    state["extract"]["lm"] = {"model": "openai/gpt-4o-mini", "api_base": "http://evil"}
    prog.write_text(json.dumps(state))
    _rehash(a.path)
    with pytest.raises(A.ArtifactMismatchError, match="carries an LM"):
        A.load_compiled("spans", lang="de", metric="iou", root=tmp_path)

    b = _write(spans_program, tmp_path / "x")
    man = json.loads((b.path / "manifest.json").read_text())
    man["metric"] = "corr"
    (b.path / "manifest.json").write_text(json.dumps(man))
    _rehash(b.path)
    with pytest.raises(A.ArtifactMismatchError, match="metric"):
        A.load_compiled("spans", lang="de", metric="iou", root=tmp_path / "x")


def test_loading_never_unpickles(tmp_path, spans_program, monkeypatch):
    _write(spans_program, tmp_path)
    import cloudpickle

    def boom(*a, **k):
        raise AssertionError("pickle used")

    monkeypatch.setattr(pickle, "load", boom)
    monkeypatch.setattr(pickle, "loads", boom)
    monkeypatch.setattr(cloudpickle, "load", boom)
    monkeypatch.setattr(cloudpickle, "loads", boom)
    assert A.load_compiled("spans", lang="de", metric="iou", root=tmp_path) is not None
    (tmp_path / "spans" / "de" / "iou" / "v0002").mkdir()
    (tmp_path / "spans" / "de" / "iou" / "v0002" / "program.pkl").write_bytes(b"not loaded")
    with pytest.raises(A.ArtifactIntegrityError):
        A.load_compiled("spans", lang="de", metric="iou", version=2, root=tmp_path)


def test_invalid_path_parts_are_rejected(tmp_path, spans_program):
    with pytest.raises(ValueError):
        A.write_artifact(spans_program, {}, program_name="spans", lang="../x", metric="iou", root=tmp_path)


# ------------------------------------------------------------------------------------------------------
# compiling with the scripted LM
# ------------------------------------------------------------------------------------------------------


def test_compile_mipro_and_bootstrap_with_scripted_lm(scripted, spans_program):
    from halluscope.metrics.adapters import get_metric

    examples = [_ex(i, i % 3 != 0) for i in range(6)]
    prog, info = compile_program(spans_program, examples, get_metric("iou"),
                                 OptimizerConfig(candidates=2, trials=2, seed=0), task_lm=scripted)
    assert info["n_train"] == 3 and info["n_val"] == 3 and 0.0 <= info["val_score"] <= 1.0
    assert not hasattr(prog, "trial_logs")
    prog2, info2 = compile_program(spans_program, examples, get_metric("iou"),
                                   OptimizerConfig(name="bootstrap"), task_lm=scripted)
    assert info2["n_train"] == 6
    assert len(prog2.extract.demos) >= 1


# ------------------------------------------------------------------------------------------------------
# the optimize command end to end (scripted LM, demo data, temp dirs)
# ------------------------------------------------------------------------------------------------------


def _opt_args(tmp_path, *extra):
    return ["--metric", "iou", "--lang", "de", "--adapter", "json", "--compiled-dir", str(tmp_path / "compiled"),
            "--report-dir", str(tmp_path / "reports"), "--tracking-uri", f"sqlite:///{tmp_path / 'mlflow.db'}",
            "--candidates", "2", "--trials", "2", "--folds", "2", "--quiet", *extra]


def _run_optimize(argv, lm):
    """The optimize command (argparse -> OptimizeConfig -> run_optimize -> printed summary) with ``lm``."""
    from halluscope.cli.optimize import build_parser, run

    p = build_parser()
    return run(p.parse_args(argv), p, task_lm=lm)


@pytest.fixture
def demo_env(monkeypatch):
    monkeypatch.delenv("HALLUSCOPE_DATA_DIR", raising=False)
    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)


def test_optimize_end_to_end_artifact_mlflow_detect_compare(tmp_path, demo_env, capsys, monkeypatch):
    lm = scripted_lm(_responder)
    assert _run_optimize(_opt_args(tmp_path), lm) == 0
    out = capsys.readouterr().out
    assert "zero-shot vs compiled, 2-fold cross-validation" in out and "mean ± sd" in out
    assert "compared: zero-shot = the uncompiled 'spans' program" in out

    # the scripted compile changed nothing (its manifest's "changes" is empty): never served by default, pinned here
    art = A.load_compiled("spans", lang="de", metric="iou", version=1, root=tmp_path / "compiled")
    m = art.manifest
    assert m["version"] == 1 and m["source"].startswith("demo/de/val")
    assert len(m["cv"]["folds"]) == 2 and "iou" in m["cv"]["mean"]["compiled"]
    assert m["zero_shot"]["iou"]["mean"] == m["cv"]["mean"]["zero_shot"]["iou"]["mean"]
    for key in ("data", "task_lm", "prompt_lm", "optimizer", "dspy_version", "git_commit", "usage", "compared"):
        assert key in m
    assert m["data"]["n"] == 7 and len(m["data"]["data_hash"]) == 64
    assert m["optimizer"]["candidates"] == 2 and m["dspy_version"] == dspy.__version__
    assert m["usage"]["lm_calls"] > 0

    # detect (Python API and the halluscope command) on a JSONL file
    from halluscope.artifacts.compiled import detect_jsonl

    inp = tmp_path / "answers.jsonl"
    inp.write_text(json.dumps({"id": "a1", "question": "Q?", "answer": "Die Provinz heißt Álava."}) + "\n"
                   + json.dumps({"model_output_text": "Berlin ist groß.", "model_input": "Q2"}) + "\n")
    with dspy.context(lm=lm, adapter=dspy.JSONAdapter()):
        stats = detect_jsonl(art.program, inp, tmp_path / "out.jsonl", progress=False)
    rows = [json.loads(x) for x in (tmp_path / "out.jsonl").read_text().splitlines()]
    assert stats["items"] == 2 and stats["failed"] == 0
    assert rows[0]["id"] == "a1" and rows[0]["hard_labels"] == [[18, 23]] and "soft_labels" in rows[0]

    import halluscope.cli as hcli
    import halluscope.cli.detect as detect_cmd

    def fake_setup(args, needed=True):
        dspy.configure(lm=lm, adapter=dspy.JSONAdapter())
        return lm

    monkeypatch.setattr(detect_cmd, "setup_lm", fake_setup)
    pinned = ["--program", "spans", "--version", "1"]
    rc = hcli.main(["detect", "--lang", "de", *pinned, "--compiled-dir", str(tmp_path / "compiled"), "--input",
                    str(inp), "--output", str(tmp_path / "cli.jsonl"), "--no-progress"])
    assert rc == 0 and len((tmp_path / "cli.jsonl").read_text().splitlines()) == 2
    rc = hcli.main(["detect", "--lang", "de", *pinned, "--compiled-dir", str(tmp_path / "compiled"), "--answer",
                    "Die Provinz heißt Álava."])
    assert rc == 0 and '"hard_labels": [[18, 23]]' in capsys.readouterr().out

    # the MLflow run and the compare command
    rc = hcli.main(["compare", "--tracking-uri", f"sqlite:///{tmp_path / 'mlflow.db'}", "--plot",
                    str(tmp_path / "plot.png")])
    out = capsys.readouterr().out
    assert rc == 0 and "optimize" in out and "spans" in out and "MIPROv2" in out
    assert (tmp_path / "plot.png").stat().st_size > 1000

    from mlflow.tracking import MlflowClient

    client = MlflowClient(f"sqlite:///{tmp_path / 'mlflow.db'}")
    exp = client.get_experiment_by_name("halluscope/spans/de")
    run = client.search_runs([exp.experiment_id],
                             filter_string="tags.`halluscope.kind` = 'optimize'")[0]  # the parent run
    assert run.info.status == "FINISHED"
    assert "cv/compiled/iou" in run.data.metrics and "fold1/zero_shot/iou" in run.data.metrics
    assert run.data.params["optimizer"] == "mipro"
    logged = {f.path for f in client.list_artifacts(run.info.run_id, "compiled")}
    assert logged == {"compiled/program.json", "compiled/manifest.json"}


def test_rerun_is_served_from_cache(tmp_path, demo_env, capsys):
    """Same command, same (cached) LM: the second run reaches the engine zero times (MIPROv2 included)."""
    cache = dspy.cache
    try:
        dspy.configure_cache(enable_disk_cache=True, enable_memory_cache=False, disk_cache_dir=str(tmp_path / "c"))
        engine = ScriptedEngine(_responder)
        lm = dspy.LM("scripted/cached", engine=engine, cache=True)
        args = _opt_args(tmp_path, "--no-mlflow")
        assert _run_optimize(args, lm) == 0
        first = len(engine.calls)
        assert first > 0
        assert _run_optimize(args, lm) == 0
        assert len(engine.calls) == first
        out = capsys.readouterr().out
        assert "0 new" in out and "every LM call was served from DSPy's cache" in out
        assert [v.version for v in A.list_versions("spans", "de", "iou", root=tmp_path / "compiled")] == [1, 2]
        m1, m2 = (json.loads((tmp_path / "compiled/spans/de/iou" / v / "program.json").read_text())
                  for v in ("v0001", "v0002"))
        assert m1["extract"] == m2["extract"]  # same compiled state
    finally:
        dspy.cache = cache


def test_lm_failing_mid_run_writes_no_artifact(tmp_path, demo_env, capsys):
    n = {"calls": 0}

    def flaky(call):
        n["calls"] += 1
        if n["calls"] > 25:
            raise RuntimeError("server went away")
        return _responder(call)

    rc = _run_optimize(_opt_args(tmp_path, "--max-errors", "3"), scripted_lm(flaky))
    out = capsys.readouterr().out
    assert rc == 1
    assert "NO ARTIFACT WRITTEN" in out
    assert not (tmp_path / "compiled" / "spans" / "de" / "iou").exists() or not A.list_versions(
        "spans", "de", "iou", root=tmp_path / "compiled", include_invalid=True)
    report = json.loads(next((tmp_path / "reports").glob("*/report.json")).read_text())
    assert report["status"] == "FAILED" and "server went away" in report["error"]
    assert report["usage"]["lm_errors"] > 0
    from mlflow.tracking import MlflowClient

    client = MlflowClient(f"sqlite:///{tmp_path / 'mlflow.db'}")
    run = client.search_runs([client.get_experiment_by_name("halluscope/spans/de").experiment_id],
                             filter_string="tags.`halluscope.kind` = 'optimize'")[0]  # the parent run
    assert run.info.status == "FAILED"


def test_fold_too_small_is_a_clear_cli_error(tmp_path, demo_env, capsys):
    with pytest.raises(SystemExit) as e:
        _run_optimize(_opt_args(tmp_path, "--limit", "3"), scripted_lm(_responder))
    assert e.value.code == 2
    err = capsys.readouterr().err
    assert "compiles on only 1 item" in err and "--limit 4" in err


@pytest.mark.parametrize("argv, needle", [
    (["--metric", "bleu"], "invalid choice: 'bleu'"),
    (["--lang", "xx"], "invalid choice: 'xx'"),
    (["--program", "nope"], "invalid choice: 'nope'"),
    (["--optimizer", "copro"], "unknown optimizer 'copro'"),
])
def test_bad_choices_are_argparse_errors_listing_choices(argv, needle, capsys):
    from halluscope.cli.optimize import main

    with pytest.raises(SystemExit) as e:
        main(argv)
    assert e.value.code == 2
    err = capsys.readouterr().err
    assert needle in err and "choose from" in err


def test_lone_trials_are_refused(capsys):
    # (a program with neither an LM nor a fit hook is refused once, by plan_run: test_optimize_stages)
    from halluscope.cli.optimize import build_parser, validate_args

    p = build_parser()
    with pytest.raises(SystemExit):
        validate_args(p, p.parse_args(["--trials", "3"]))
    assert "go together" in capsys.readouterr().err


# ------------------------------------------------------------------------------------------------------
# tracking
# ------------------------------------------------------------------------------------------------------


def test_redaction_of_params_and_values(monkeypatch):
    from halluscope.tracking.runs import metric_key, redact, redact_params

    monkeypatch.setenv("MY_SERVICE_API_KEY", "s3cr3t-value-123")
    p = redact_params({"api_key": "abc", "lm": "openai/gpt-4o", "note": "key sk-ABCDEFGHIJKLMNOPQRSTUV here",
                       "cfg": {"api_key": "zzz-top-secret"}, "other": "uses s3cr3t-value-123", "n": 3})
    assert p["api_key"] == "***" and p["lm"] == "openai/gpt-4o" and "sk-ABC" not in p["note"]
    assert "zzz-top-secret" not in p["cfg"] and "s3cr3t" not in p["other"] and p["n"] == "3"
    assert redact("hf_abcdefghijklmnopqrstuvwx") == "***"
    assert metric_key("cv", "compiled", "iou+corr") == "cv/compiled/iou_plus_corr"


def test_track_run_logs_params_metrics_files_and_skips_secret_files(tmp_path, monkeypatch):
    from mlflow.tracking import MlflowClient

    from halluscope.tracking.runs import track_run

    monkeypatch.setenv("OPENAI_API_KEY", "sk-test-0123456789abcdefXYZ")
    ok = tmp_path / "summary.json"
    ok.write_text('{"iou": 0.5}')
    bad = tmp_path / "leak.json"
    bad.write_text('{"key": "sk-test-0123456789abcdefXYZ"}')
    uri = f"sqlite:///{tmp_path / 'm.db'}"
    run_id = track_run("evaluate", program="spans", lang="de",
                       params={"lm": "local", "api_key": "sk-test-0123456789abcdefXYZ"},
                       metrics={"iou": 0.5, "bad": float("nan"), "label": "x"}, artifacts=[ok, bad],
                       tracking_uri=uri, step_metrics={"fold/iou": [(1, 0.4), (2, 0.6)]}, strict=True)
    client = MlflowClient(uri)
    run = client.get_run(run_id)
    assert run.data.params["api_key"] == "***" and run.data.metrics["iou"] == 0.5
    assert "bad" not in run.data.metrics
    assert [m.step for m in client.get_metric_history(run_id, "fold/iou")] == [1, 2]
    assert {f.path for f in client.list_artifacts(run_id)} == {"summary.json"}
    assert client.get_experiment(run.info.experiment_id).name == "halluscope/spans/de"
    assert track_run("evaluate", program="spans", lang="de", params={}, metrics={},
                     tracking_uri="badscheme://nowhere") is None  # tracking failure never takes a run down


def test_no_cv_with_test_file(tmp_path, demo_env, capsys):
    from halluscope.loaders.demo import demo_data_dir

    test_file = demo_data_dir() / "val" / "mushroom.de-val.v2.extra.jsonl"
    assert _run_optimize(_opt_args(tmp_path, "--folds", "1", "--test", str(test_file), "--no-mlflow"),
                         scripted_lm(_responder)) == 0
    out = capsys.readouterr().out
    assert "cross-validation" not in out and f"== test {test_file}" in out
    art = A.load_compiled("spans", lang="de", metric="iou", version=1, root=tmp_path / "compiled")
    assert art.manifest["cv"] is None and A.selection_score(art.manifest) is None
    t = art.manifest["test"]
    assert t["n"] == 7 and t["split"] == "val" and "iou" in t["compiled"] and "iou" in t["zero_shot"]


def test_unlabelled_test_file_is_refused(tmp_path, demo_env):
    f = tmp_path / "mushroom.de-tst.v1.jsonl"
    f.write_text(json.dumps({"id": "tst-de-1", "lang": "DE", "model_input": "Q?", "model_output_text": "A."}) + "\n")
    with pytest.raises(SystemExit, match="no gold labels"):
        _run_optimize(_opt_args(tmp_path, "--folds", "1", "--test", str(f), "--context", "none", "--no-mlflow"),
                      scripted_lm(_responder))


def test_detect_routes_halluclean_artifacts_by_their_task():
    from halluscope.core.contract import Detection, to_prediction
    from halluscope.artifacts.compiled import detect

    seen = {}

    class Recorder(dspy.Module):
        def forward(self, **kw):
            seen.update(kw)
            return to_prediction(Detection(answer=kw["answer"]))

    detect(Recorder(), "It is in Berlin.", lang="qa")
    assert seen["task"] == "qa" and seen["lang"] == "qa"
    detect(Recorder(), "Es ist in Berlin.", lang="de")
    assert seen["task"] == "" and seen["lang"] == "de"
    detect(Recorder(), "x", lang="en", task="dialogue")
    assert seen["task"] == "dialogue"


def test_default_program_is_grounded_on_the_embedded_model_for_span_data(tmp_path, demo_env, capsys, monkeypatch):
    """The README's main command (no --program, --lm local) fits the grounded combiner — what detect then loads
    by default — and says so; any other LM, an injected LM, response-level data or metric keeps spans."""
    from halluscope.cli.optimize import build_parser, default_program, main

    p = build_parser()
    pick = lambda *argv, **kw: default_program(p.parse_args(list(argv)), **kw)[0]  # noqa: E731
    assert pick("--lang", "de") == "grounded"
    assert pick("--lang", "de", "--lm", "local:/models/other.gguf") == "grounded"
    assert pick("--lang", "de", "--lm", "openai/gpt-4o-mini") == "spans"
    assert pick("--lang", "de", injected_lm=True) == "spans"
    assert pick("--lang", "de", "--metric", "f1") == "spans"
    assert pick("--task", "qa", "--metric", "f1") == "spans"
    assert pick("--lang", "de", "--program", "finch") == "finch"

    monkeypatch.chdir(tmp_path)
    assert main(["--metric", "iou", "--lang", "de", "--no-mlflow", "--quiet"]) == 0
    err = capsys.readouterr().err
    assert "program grounded (the default with the embedded model" in err
    bundled = max(v.version for v in A.list_versions("grounded", "de", "iou", root=A.bundled_dir()))
    # numbered after the bundled versions (one number names one version across both stores)
    assert [v.version for v in A.list_versions("grounded", "de", "iou", root=tmp_path / "compiled")] == [bundled + 1]
    assert not (tmp_path / "compiled" / "spans").exists()
    det = A.load_compiled("grounded", lang="de", metric="iou", root=tmp_path / "compiled")
    assert det.manifest["program"] == "grounded" and det.manifest["cv"]["k"] == 5  # the default: the bundled ones'
    # demo data: the bundled real-data version stays served (same rule across both stores)
    assert A.best_version(A.list_versions("grounded", "de", "iou")).origin == "bundled"


def test_one_optimize_run_checks_and_looks_up_each_thing_once(tmp_path, demo_env, monkeypatch):
    """One pass through the main path (#22): over a whole optimize run (2-fold CV, a --test file, MLflow) the
    fold sizes are checked once, the program and the dataset are each looked up once in the registry, and the
    --test file goes through the dataset registry (the run's dataset loads it). Before #22: check_fold_sizes 3
    times, the program lookup 3 times, the dataset lookup 3 times, and --test read by load_mushroom directly."""
    import halluscope.optimize.cv as cv
    import halluscope.optimize.run as run_mod
    from halluscope.core import extensions
    from halluscope.loaders.demo import demo_data_dir
    from halluscope.loaders.dataset_registry import DatasetSpec

    calls: dict[str, int] = {}
    real_check, real_get, real_load = cv.check_fold_sizes, extensions.get, DatasetSpec.load

    def counted_check(*a, **kw):
        calls["check_fold_sizes"] = calls.get("check_fold_sizes", 0) + 1
        return real_check(*a, **kw)

    def counted_get(kind, name):
        calls[f"get {kind}"] = calls.get(f"get {kind}", 0) + 1
        return real_get(kind, name)

    def counted_load(self, data_dir=None, **kw):
        calls[f"load {self.name}"] = calls.get(f"load {self.name}", 0) + 1
        return real_load(self, data_dir, **kw)

    monkeypatch.setattr(cv, "check_fold_sizes", counted_check)
    monkeypatch.setattr(run_mod, "check_fold_sizes", counted_check)
    monkeypatch.setattr(extensions, "get", counted_get)
    monkeypatch.setattr(DatasetSpec, "load", counted_load)
    test_file = demo_data_dir() / "val" / "mushroom.de-val.v2.extra.jsonl"
    assert _run_optimize(_opt_args(tmp_path, "--test", str(test_file)),
                         scripted_lm(_responder)) == 0
    assert calls.pop("check_fold_sizes") == 1
    assert calls.pop("get programs") == 1 and calls.pop("get datasets") == 1
    assert calls.pop("load mushroom") == 2  # the training data and the --test file, both by the dataset
    assert calls.pop("get optimizers") == 1 + 3  # the fold-size check, then each compile (2 folds + the final)
    assert not calls, calls
