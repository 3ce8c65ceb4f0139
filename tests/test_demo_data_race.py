"""Issue #24: concurrent first runs in a fresh home folder write the demo set once, without crashing (before,
one process's rmtree removed another's temp file: FileNotFoundError in 2 of 20 runs at 4-wide)."""

from __future__ import annotations

import threading
import time

import pytest

import halluscope.loaders.demo as demo


@pytest.mark.parametrize("stale", [False, True])
def test_eight_writers_at_once_write_the_demo_set_once(tmp_path, monkeypatch, stale):
    """8 threads take the first-use path at once (the lock is an flock on the folder's lock file, which holds
    between threads as between processes); each file write is slowed down and the starts staggered so that the
    writers overlap (before the fix: FileNotFoundError, a late writer's rmtree removing an early one's files)."""
    from halluscope.loaders.mushroom import load_mushroom

    ref = len(load_mushroom(demo.demo_data_dir(tmp_path / "ref"), lang="de"))
    root = tmp_path / "home" / "demo_data"
    if stale:  # written by another version of the generator: rewritten once
        demo.demo_data_dir(root)
        (root / "VERSION").write_text("stale\n")
    real = demo.write_text_atomic
    writes = []

    def slow_write(path, text):  # the window in which another writer's rmtree used to remove this file
        writes.append(path)
        time.sleep(0.002)
        return real(path, text)

    monkeypatch.setattr(demo, "write_text_atomic", slow_write)
    go, errors, counts = threading.Event(), [], []

    def one(i):
        go.wait()
        time.sleep(0.01 * i)  # staggered: a late writer finds the set half-written by an early one
        try:
            counts.append(len(load_mushroom(demo.demo_data_dir(root), lang="de")))
        except Exception as e:  # noqa: BLE001 - collected for the assertion
            errors.append(f"{type(e).__name__}: {e}")

    threads = [threading.Thread(target=one, args=(i,)) for i in range(8)]
    for t in threads:
        t.start()
    go.set()
    for t in threads:
        t.join(timeout=300)
    assert errors == []
    assert counts == [ref] * 8
    assert (root / "VERSION").read_text().strip() == demo.DEMO_VERSION
    assert not list(root.rglob("*.tmp"))  # no temp file left behind
    n_files = sum(1 for p in root.rglob("*") if p.is_file() and not p.name.startswith("."))
    assert len(writes) == n_files  # written once, not once per writer
