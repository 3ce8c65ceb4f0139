"""Issue #10: a bad tracking store fails fast (bounded retries and timeouts), and concurrent runs on one fresh SQLite
store are all recorded."""

from __future__ import annotations

import multiprocessing as mp
import time

import pytest


def test_an_unusable_sqlite_store_fails_fast(tmp_path):
    from halluscope.tracking.runs import track_run

    (tmp_path / "dir.db").mkdir()  # a folder where the database file should be: sqlite cannot open it
    t0 = time.perf_counter()
    assert track_run("evaluate", program="spans", lang="de", params={}, metrics={"iou": 0.5},
                     tracking_uri=f"sqlite:///{tmp_path / 'dir.db'}") is None
    assert time.perf_counter() - t0 < 20  # MLflow's own retries alone sleep about 100 s


def test_an_unreachable_tracking_server_fails_fast():
    from halluscope.tracking.runs import track_run

    t0 = time.perf_counter()
    assert track_run("evaluate", program="spans", lang="de", params={}, metrics={"iou": 0.5},
                     tracking_uri="http://127.0.0.1:9") is None
    assert time.perf_counter() - t0 < 30  # MLflow's defaults retry for about 4 minutes


def _track_one(uri: str, i: int, q) -> None:
    from halluscope.tracking.runs import track_run

    q.put(track_run("evaluate", program="spans", lang="de", params={"i": i}, metrics={"iou": i / 10},
                    tracking_uri=uri))


def test_four_processes_on_one_fresh_sqlite_store_are_all_recorded(tmp_path):
    from mlflow.tracking import MlflowClient

    uri = f"sqlite:///{tmp_path / 'fresh.db'}"
    ctx = mp.get_context("spawn")
    q = ctx.Queue()
    procs = [ctx.Process(target=_track_one, args=(uri, i, q)) for i in range(4)]
    for p in procs:
        p.start()
    for p in procs:
        p.join(timeout=240)
    ids = [q.get(timeout=5) for _ in procs]
    assert all(ids) and len(set(ids)) == 4, ids
    client = MlflowClient(uri)
    runs = client.search_runs([e.experiment_id for e in client.search_experiments()])
    assert sorted(r.data.params["i"] for r in runs) == ["0", "1", "2", "3"]
    assert all(r.info.status == "FINISHED" for r in runs)
