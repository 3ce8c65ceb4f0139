"""The Ray engine (:mod:`halluscope.evaluation.scale`): order, ids, failed rows, resume, hash refusal, a killed worker.

One local Ray session (2 CPUs) serves the whole module; the tests without Ray come first. Programs that need
no LM keep it fast; ``tests/ray_plugin.py`` is a program that kills its worker once, imported by each actor.
"""

from __future__ import annotations

import importlib
import json
import logging
import os
import re
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from halluscope.artifacts.store import ArtifactIntegrityError, write_artifact
from halluscope.core.contract import Detection
from halluscope.artifacts.compiled import detect_jsonl
from halluscope.programs import registry
from halluscope.evaluation.scale import (OUTPUT_COLUMNS, GateCallback, LMGate, RayOptions, ResumeError, detect_ray,
                              flatten_detection, load_artifact, parts_dir, read_output)

ROOT = Path(__file__).resolve().parent.parent


# ------------------------------------------------------------------------------------------------------
# without Ray
# ------------------------------------------------------------------------------------------------------


def test_importing_the_cli_does_not_import_ray():
    code = "import sys, halluscope.cli, halluscope.evaluation.scale; print('ray' in sys.modules)"
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip() == "False"


def test_flatten_detection_makes_json_columns():
    det = Detection(answer="Paris is in Spain.", spans=[(12, 17, 0.8)], label=True, score=0.8,
                    failures={"parse": 1})
    flat = flatten_detection(det.to_dict())
    assert set(flat) <= set(OUTPUT_COLUMNS)
    assert json.loads(flat["spans"]) == [{"start": 12, "end": 17, "prob": 0.8}]
    assert json.loads(flat["hard_labels"]) == [[12, 17]]
    assert json.loads(flat["failures"]) == {"parse": 1}
    assert flat["label"] is True and flat["score"] == 0.8 and flat["answer"] == det.answer


def test_lm_gate_never_exceeds_its_concurrency():
    gate = LMGate(concurrency=2)
    seen = []

    def call():
        gate.acquire()
        seen.append(gate.in_flight)
        time.sleep(0.01)
        gate.release()

    threads = [threading.Thread(target=call) for _ in range(12)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert max(seen) <= 2 and gate.stats() == {"started": 12, "in_flight": 0, "max_in_flight": 2}


def test_lm_gate_spaces_calls_to_the_rate():
    now = [100.0]
    sleeps = []

    def sleep(s):
        sleeps.append(round(s, 6))
        now[0] += s

    gate = LMGate(per_minute=120, clock=lambda: now[0], sleep=sleep)  # one call every 0.5 s
    for _ in range(4):
        gate.acquire()
        gate.release()
    assert sleeps == [0.5, 0.5, 0.5]


def test_gate_callback_holds_a_slot_per_lm_call_and_releases_it_on_error():
    events = []
    cb = GateCallback(lambda: events.append("acquire"), lambda: events.append("release"))
    cb.on_lm_start("a", None, {})
    cb.on_lm_start("b", None, {})
    cb.on_lm_end("a", None)
    cb.on_lm_end("b", None, exception=RuntimeError("timeout"))
    cb.on_lm_end("never-started", None)  # releases nothing it did not acquire
    assert events == ["acquire", "acquire", "release", "release"]


def test_ray_logs_at_warning_level_unless_verbose(monkeypatch):
    import halluscope.evaluation.scale as scale

    calls = []

    class FakeRay:
        @staticmethod
        def is_initialized():
            return False

        @staticmethod
        def init(**kwargs):
            calls.append(kwargs)

    monkeypatch.setattr(scale, "_ray", lambda: FakeRay)
    monkeypatch.delenv("RAY_BACKEND_LOG_LEVEL", raising=False)
    scale.init_ray(RayOptions(workers=1))
    assert calls[-1]["log_to_driver"] is False and calls[-1]["logging_level"] == logging.WARNING
    assert os.environ["RAY_BACKEND_LOG_LEVEL"] == "fatal"  # the C++ core's spurious shutdown errors
    monkeypatch.delenv("RAY_BACKEND_LOG_LEVEL")
    scale.init_ray(RayOptions(workers=1, verbose=True))
    assert calls[-1]["log_to_driver"] is True and calls[-1]["logging_level"] == logging.INFO
    assert "RAY_BACKEND_LOG_LEVEL" not in os.environ


def test_sigterm_stops_a_job_like_ctrl_c():
    import signal

    from halluscope.core.signals import stop_on_sigterm

    before = signal.getsignal(signal.SIGTERM)
    with pytest.raises(KeyboardInterrupt):
        with stop_on_sigterm():
            os.kill(os.getpid(), signal.SIGTERM)
            time.sleep(5)  # the handler interrupts this
    assert signal.getsignal(signal.SIGTERM) is before


def test_ray_options_refuse_bad_values():
    for kwargs in ({"workers": 0}, {"batch_size": 0}, {"cpus_per_worker": 0}, {"lm_concurrency": 0},
                   {"lm_per_minute": 0}):
        with pytest.raises(ValueError):
            RayOptions(**kwargs)


# ------------------------------------------------------------------------------------------------------
# fixtures
# ------------------------------------------------------------------------------------------------------


def _artifact(root: Path, program: str = "mark-all", source: str = "test"):
    return write_artifact(registry.get_program(program).make(), {"source": source}, program_name=program, lang="en",
                          metric="iou", root=root)


def _jsonl(path: Path, rows: list) -> Path:
    path.write_text("".join((r if isinstance(r, str) else json.dumps(r)) + "\n" for r in rows), encoding="utf-8")
    return path


def _rows(n: int) -> list[dict]:
    return [{"id": f"row-{i:03d}", "answer": f"The answer number {i}.", "question": "q"} for i in range(n)]


OPTS = dict(workers=2, batch_size=4, progress=False)


@pytest.fixture(scope="module")
def ray_session():
    ray = pytest.importorskip("ray", reason='the Ray engine tests need the extra: pip install -e ".[ray]"')
    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False,
             runtime_env={"env_vars": {"PYTHONPATH": str(ROOT)}})  # actors import tests.ray_plugin
    yield ray
    ray.shutdown()


@pytest.fixture(scope="module")
def plugin(ray_session):
    """``tests.ray_plugin`` registered in this process for the module only (the registry is restored)."""
    saved = dict(registry.REGISTRY)
    mod = importlib.reload(importlib.import_module("tests.ray_plugin"))
    yield mod
    registry.REGISTRY.clear()
    registry.REGISTRY.update(saved)


# ------------------------------------------------------------------------------------------------------
# with Ray
# ------------------------------------------------------------------------------------------------------


def test_jsonl_to_parquet_keeps_order_and_ids_and_writes_failed_rows(ray_session, tmp_path):
    det = _artifact(tmp_path / "compiled")
    rows = _rows(11)
    rows[3] = "{this is not json"
    rows[5] = {"id": "no-answer", "question": "where is the answer?"}
    rows[8] = {"answer": "A row without an id."}
    src = _jsonl(tmp_path / "in.jsonl", rows)
    out = tmp_path / "out.parquet"
    stats = detect_ray(det, src, out, opts=RayOptions(**OPTS))
    got = read_output(out)
    assert [r["id"] for r in got] == ["row-000", "row-001", "row-002", "4", "row-004", "no-answer", "row-006",
                                      "row-007", "9", "row-009", "row-010"]
    assert stats["rows"] == 11 and stats["ok"] == 9 and stats["failed"] == 2 and stats["output_failed"] == 2
    bad = {r["id"]: r["error"] for r in got if not r["ok"]}
    assert "malformed JSON" in bad["4"] and "missing field 'answer'" in bad["no-answer"]
    # the ok rows are exactly what the in-process engine writes
    good = [r for r in rows if isinstance(r, dict) and "answer" in r and "id" in r]
    ref = {r["id"]: r for r in _in_process(det, tmp_path, good)}
    for r in got:
        if r["ok"] and r["id"] in ref:
            for k in ("spans", "soft_labels", "hard_labels", "label", "score", "units", "failures"):
                assert r[k] == ref[r["id"]][k], k
            assert r["artifact_hash"] == det.content_hash and r["lm_calls"] == 0
    import pyarrow.parquet as pq

    assert pq.read_table(out).column_names == list(OUTPUT_COLUMNS)


def test_ray_jobs_draw_a_progress_bar_of_items(ray_session, tmp_path, capfd):
    """Issue #35: a Ray job showed no progress; the driver draws one bar in items as batches arrive (stderr),
    for detect and evaluate, and none with progress=False."""
    from halluscope.evaluation.scale import evaluate_ray
    from tests.test_optimize_stages import _examples

    det = _artifact(tmp_path / "compiled")
    src = _jsonl(tmp_path / "in.jsonl", _rows(10))
    detect_ray(det, src, tmp_path / "out.parquet", opts=RayOptions(**{**OPTS, "progress": True}))
    err = capfd.readouterr().err
    assert "detect (ray, 2 workers)" in err and "10/10" in err and "item" in err, err[-2000:]
    res = evaluate_ray("mark-all", {}, _examples(6), opts=RayOptions(**{**OPTS, "progress": True}))
    err = capfd.readouterr().err
    assert res.n == 6 and "evaluate (ray, 2 workers)" in err and "6/6" in err, err[-2000:]
    detect_ray(det, src, tmp_path / "quiet.parquet", opts=RayOptions(**OPTS))
    assert "(ray, 2 workers)" not in capfd.readouterr().err


def _in_process(det, tmp_path: Path, rows: list[dict], extra=()) -> list[dict]:
    src = _jsonl(tmp_path / "ref.jsonl", rows)
    detect_jsonl(det, src, tmp_path / "ref.out.jsonl", progress=False, extra_inputs=extra)
    return [json.loads(line) for line in (tmp_path / "ref.out.jsonl").read_text().splitlines()]


def test_parquet_input_with_extra_inputs_to_jsonl(ray_session, tmp_path):
    import pyarrow as pa
    import pyarrow.parquet as pq

    det = _artifact(tmp_path / "compiled", program="logits")
    rows = [{"id": f"p{i}", "answer": "Paris is big", "model_output_tokens": ["Paris", " is", " big"],
             "model_output_logits": [5.0, 4.0, float(i)]} for i in range(6)]
    pq.write_table(pa.Table.from_pylist(rows), tmp_path / "in.parquet")
    out = tmp_path / "out.jsonl"
    extra = ("model_output_tokens", "model_output_logits")
    stats = detect_ray(det, tmp_path / "in.parquet", out, opts=RayOptions(**OPTS), extra_inputs=extra)
    got = read_output(out)
    ref = _in_process(det, tmp_path, rows, extra)
    assert stats["ok"] == 6 and [r["id"] for r in got] == [r["id"] for r in ref]
    for a, b in zip(got, ref):
        assert a["spans"] == b["spans"] and a["score"] == b["score"]
    assert any(r["spans"] for r in got)


def test_corrupt_parquet_is_refused_by_name_and_nothing_is_written(ray_session, tmp_path):
    det = _artifact(tmp_path / "compiled")
    bad = tmp_path / "rows.parquet"
    bad.write_bytes(b"PAR1 this is not a parquet file")
    out = tmp_path / "out.parquet"
    with pytest.raises(ValueError, match="rows.parquet: not a readable Parquet file"):
        detect_ray(det, bad, out, opts=RayOptions(**OPTS))
    assert not out.exists() and not parts_dir(out).exists()


def test_a_stopped_job_resumes_and_skips_the_rows_already_written(ray_session, tmp_path):
    det = _artifact(tmp_path / "compiled")
    src = _jsonl(tmp_path / "in.jsonl", _rows(30))
    out = tmp_path / "out.parquet"

    class Stop(Exception):
        pass

    def stop_after_two(n):
        if n == 2:
            raise Stop

    with pytest.raises(Stop):
        detect_ray(det, src, out, opts=RayOptions(**OPTS), on_batch=stop_after_two)
    assert not out.exists()
    sizes = [len(read_output_part(p)) for p in parts_dir(out).glob("part-*.parquet")]
    written = sum(sizes)
    assert len(sizes) == 2 and all(0 < n <= 4 for n in sizes)  # two batches written; those in flight are lost
    stats = detect_ray(det, src, out, opts=RayOptions(**OPTS))
    assert stats["skipped"] == written and stats["ok"] == 30 - written
    assert [r["id"] for r in read_output(out)] == [f"row-{i:03d}" for i in range(30)]
    again = detect_ray(det, src, out, opts=RayOptions(**OPTS))
    assert again["skipped"] == 30 and again["ok"] == 0 and again["output_rows"] == 30


def read_output_part(path: Path) -> list[dict]:
    import pyarrow.parquet as pq

    return pq.read_table(path).to_pylist()


def test_a_changed_artifact_or_input_is_refused_on_resume(ray_session, tmp_path):
    root = tmp_path / "compiled"
    det = _artifact(root)
    src = _jsonl(tmp_path / "in.jsonl", _rows(5))
    out = tmp_path / "out.parquet"
    detect_ray(det, src, out, opts=RayOptions(**OPTS))
    before = sorted(p.name for p in parts_dir(out).iterdir())
    recompiled = _artifact(root, source="recompiled")  # v0002: another content hash
    assert recompiled.content_hash != det.content_hash
    with pytest.raises(ResumeError, match="artifact changed between runs"):
        detect_ray(recompiled, src, out, opts=RayOptions(**OPTS))
    _jsonl(src, _rows(6))
    with pytest.raises(ResumeError, match="input changed"):
        detect_ray(det, src, out, opts=RayOptions(**OPTS))
    assert sorted(p.name for p in parts_dir(out).iterdir()) == before


def test_actors_refuse_an_artifact_whose_hash_is_not_the_jobs(tmp_path):
    det = _artifact(tmp_path / "compiled")
    assert load_artifact(det.path, det.content_hash).content_hash == det.content_hash
    with pytest.raises(ArtifactIntegrityError, match="changed during the job"):
        load_artifact(det.path, "0" * 64)


def test_a_worker_killed_mid_batch_loses_nothing(plugin, tmp_path):
    det = _artifact(tmp_path / "compiled", program=plugin.NAME)
    marker = tmp_path / "crashed"
    rows = _rows(12)
    rows[6]["answer"] = f"crash-once:{marker}"
    rows[9]["answer"] = "raise"
    src = _jsonl(tmp_path / "in.jsonl", rows)
    out = tmp_path / "out.parquet"
    stats = detect_ray(det, src, out, opts=RayOptions(**OPTS, imports=("tests.ray_plugin",)))
    assert marker.exists()  # the worker process did die mid-batch
    got = read_output(out)
    assert [r["id"] for r in got] == [r["id"] for r in rows]
    assert stats["ok"] == 11 and stats["failed"] == 1
    assert [r["id"] for r in got if not r["ok"]] == ["row-009"] and "failed on purpose" in got[9]["error"]


def test_every_lm_call_of_every_actor_passes_the_global_gate(plugin, tmp_path):
    det = _artifact(tmp_path / "compiled", program=plugin.LM_NAME)
    src = _jsonl(tmp_path / "in.jsonl", _rows(8))
    out = tmp_path / "out.parquet"
    stats = detect_ray(det, src, out, opts=RayOptions(**OPTS, imports=("tests.ray_plugin",), lm_concurrency=1,
                                                      lm_per_minute=6000))
    assert stats["ok"] == 8 and stats["lm_calls"] == 8 and stats["lm_input_tokens"] > 0
    assert stats["lm_gate"] == {"started": 8, "in_flight": 0, "max_in_flight": 1}
    assert [r["lm_calls"] for r in read_output(out)] == [1] * 8 and all(r["label"] for r in read_output(out))


def test_ray_lm_gate_is_shared_by_concurrent_callers(ray_session):
    ray = ray_session
    gate = ray.remote(num_cpus=0, max_concurrency=32)(LMGate).remote(2, None)

    @ray.remote(num_cpus=0)
    def call(g):
        ray.get(g.acquire.remote())
        # hold the permit until a second caller holds one too (a fixed sleep let a loaded machine, whose Ray workers
        # start seconds apart, run the callers one after another): deterministic, bounded by the deadline
        deadline = time.monotonic() + 60
        while ray.get(g.stats.remote())["max_in_flight"] < 2 and time.monotonic() < deadline:
            time.sleep(0.02)
        g.release.remote()

    ray.get([call.remote(gate) for _ in range(10)])
    time.sleep(0.2)
    stats = ray.get(gate.stats.remote())
    assert stats["started"] == 10 and stats["max_in_flight"] == 2


def test_cli_detect_and_evaluate_with_the_ray_engine(ray_session, tmp_path, capsys, monkeypatch):
    from halluscope.cli import main
    from halluscope.loaders.demo import write_demo_data
    from halluscope.loaders.mushroom import load_mushroom
    from halluscope.evaluation.runner import run_eval

    root = tmp_path / "compiled"
    _artifact(root)
    src = _jsonl(tmp_path / "in.jsonl", _rows(5) + [{"id": "x"}])
    out = tmp_path / "out.parquet"
    args = ["detect", "--program", "mark-all", "--lang", "en", "--metric", "iou", "--compiled-dir", str(root),
            "--input", str(src), "--output", str(out), "--engine", "ray", "--workers", "2", "--batch-size", "2",
            "--no-progress"]
    assert main(args) == 1  # one row failed (no answer): written, and the exit status says so
    printed = capsys.readouterr().out
    assert "6 rows: 0 already done" in printed and "1 failed" in printed and "rows/s" in printed
    assert [r["id"] for r in read_output(out)] == ["row-000", "row-001", "row-002", "row-003", "row-004", "x"]
    assert main(args) == 1  # the rerun finds the job finished (from job.json), the failed row still counted
    assert "nothing to do" in capsys.readouterr().out
    assert main([*args, "--retry-failed"]) == 1
    assert "6 rows: 5 already done, 1 run now (0 ok, 1 failed)" in capsys.readouterr().out

    monkeypatch.delenv("HALLUSCOPE_DATA_DIR", raising=False)
    data = write_demo_data(tmp_path / "demo")
    rc = main(["evaluate", "--program", "logits", "--lang", "de", "--data-dir", str(data), "--engine", "ray",
               "--workers", "2", "--batch-size", "2", "--out-dir", str(tmp_path / "ev"), "--no-progress",
               "--no-mlflow"])
    assert rc == 0
    summary = json.loads(next((tmp_path / "ev").rglob("logits.summary.json")).read_text())["summary"]
    ref = run_eval(registry.get_program("logits").make(), load_mushroom(data, lang="de"), progress=False,
                   extra_inputs=registry.get_program("logits").extra_inputs).summary()
    for k in ("n", "iou", "corr", "lm_calls"):
        assert summary[k] == ref[k], k


def test_a_sigtermed_job_keeps_its_parts_resumes_and_a_finished_one_is_found_at_once(ray_session, tmp_path,
                                                                                    monkeypatch):
    import signal

    import halluscope.evaluation.scale as scale

    det = _artifact(tmp_path / "compiled")
    src = _jsonl(tmp_path / "in.jsonl", _rows(12))
    out = tmp_path / "out.parquet"

    def terminate(seq):  # SIGTERM to this process after the first part, as `kill PID` would
        if seq == 1:
            os.kill(os.getpid(), signal.SIGTERM)
            time.sleep(5)

    with pytest.raises(KeyboardInterrupt):
        detect_ray(det, src, out, opts=RayOptions(**OPTS), on_batch=terminate)
    kept = list(parts_dir(out).glob("part-*.parquet"))
    assert kept and not out.exists()
    stats = detect_ray(det, src, out, opts=RayOptions(**OPTS))
    assert stats["skipped"] >= 4 and stats["output_rows"] == 12
    assert [r["id"] for r in read_output(out)] == [f"row-{i:03d}" for i in range(12)]

    def no_ray(_opts):
        raise AssertionError("a finished job must not start Ray")

    monkeypatch.setattr(scale, "init_ray", no_ray)
    t0 = time.perf_counter()
    again = detect_ray(det, src, out, opts=RayOptions(**OPTS))
    assert time.perf_counter() - t0 < 1.0
    assert again["already_finished"] and again["output_rows"] == 12 and again["output_failed"] == 0
    out.write_bytes(b"")  # the output changed since: the job is merged again (with Ray)
    assert scale.finished_job(parts_dir(out), out) is None


def test_a_successful_cli_run_prints_no_error_lines(tmp_path):
    """Ray's own logs stay at warning level: a run that succeeds prints no error-level line (no
    ``E core_worker.cc``, no ``Failed to kill actor``), and exits 0."""
    pytest.importorskip("ray")
    root = tmp_path / "compiled"
    _artifact(root)
    src = _jsonl(tmp_path / "in.jsonl", _rows(6))
    proc = subprocess.run([sys.executable, "-m", "halluscope", "detect", "--program", "mark-all", "--lang", "en",
                           "--compiled-dir", str(root), "--input", str(src), "--output", str(tmp_path / "o.parquet"),
                           "--engine", "ray", "--workers", "1", "--batch-size", "2", "--no-progress"],
                          capture_output=True, text=True, timeout=400, cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr[-3000:]
    bad = [line for line in (proc.stdout + proc.stderr).splitlines()
           if re.search(r"(^|\s)E\d{4}|\bERROR\b|core_worker\.cc|Failed to kill|Traceback", line)]
    assert bad == []
    assert "6 rows: 0 already done, 6 run now (6 ok, 0 failed)" in proc.stdout


def test_ray_jobs_fail_when_every_row_has_unusable_output(plugin, tmp_path, capsys, monkeypatch):
    """Issues #20/#24: a detection that records a parse failure (no exception) is a failed row; detect and
    evaluate on Ray exit 1 with the reason in one line when more than --max-failed-share of the rows failed."""
    from halluscope.cli import main
    from halluscope.loaders.demo import write_demo_data

    root = tmp_path / "compiled"
    write_artifact(registry.get_program(plugin.GARBAGE_NAME).make(), {"source": "test"}, program_name=plugin.GARBAGE_NAME,
                   lang="en", metric="iou", root=root)
    src = _jsonl(tmp_path / "in.jsonl", _rows(4))
    out = tmp_path / "out.jsonl"
    rc = main(["detect", "--program", plugin.GARBAGE_NAME, "--lang", "en", "--compiled-dir", str(root),
               "--input", str(src), "--output", str(out), "--engine", "ray", "--workers", "2", "--batch-size", "2",
               "--import", "tests.ray_plugin", "--no-progress", "--max-failed-share", "0.5"])
    err = capsys.readouterr().err
    assert rc == 1
    assert "RUN FAILED: 4 of 4 rows failed (unusable output: parse x4; more than --max-failed-share 0.5)" in err
    got = read_output(out)
    assert [r["ok"] for r in got] == [False] * 4 and all(r["error"] == "unusable output: parse" for r in got)

    monkeypatch.delenv("HALLUSCOPE_DATA_DIR", raising=False)
    data = write_demo_data(tmp_path / "demo")
    rc = main(["evaluate", "--program", plugin.GARBAGE_NAME, "--lang", "de", "--data-dir", str(data),
               "--engine", "ray", "--workers", "2", "--batch-size", "2", "--import", "tests.ray_plugin",
               "--out-dir", str(tmp_path / "ev"), "--no-progress", "--no-mlflow"])
    err = capsys.readouterr().err
    assert rc == 1 and "RUN FAILED" in err and "unusable output: parse x" in err
    # the compiled artifact itself (--artifact PATH): each actor loads it by path and content hash
    version = root / plugin.GARBAGE_NAME / "en" / "iou" / "v0001"
    rc = main(["evaluate", "--artifact", str(version), "--lang", "de", "--data-dir", str(data), "--engine", "ray",
               "--workers", "2", "--batch-size", "2", "--import", "tests.ray_plugin", "--out-dir",
               str(tmp_path / "ev2"), "--no-progress", "--no-mlflow"])
    err = capsys.readouterr().err
    assert rc == 1 and "scoring the compiled artifact" in err and "unusable output: parse x" in err
