"""An installed halluscope whose home (``$HALLUSCOPE_HOME``, else the working folder) cannot be written: the
commands that need to write nothing still work, the others fail in one line naming the folder, never with a
traceback. A folder under a file stands in for a read-only one (root ignores permissions, a file does not)."""

from __future__ import annotations

import json
import logging

import dspy
import pytest

from halluscope.lm.scripted import scripted_lm


@pytest.fixture
def blocked_home(tmp_path, monkeypatch):
    """``$HALLUSCOPE_HOME`` under a file (nothing can be made there), the process in an empty folder."""
    blocker = tmp_path / "a-file"
    blocker.write_text("x")
    home = blocker / "home"
    work = tmp_path / "work"
    work.mkdir()
    for name in ("HALLUSCOPE_COMPILED_DIR", "HALLUSCOPE_CACHE_DIR", "MLFLOW_TRACKING_URI"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("HALLUSCOPE_HOME", str(home))
    monkeypatch.chdir(work)
    monkeypatch.setattr(dspy, "cache", dspy.cache)  # configure() replaces DSPy's global cache: restored after
    return home


def test_configure_without_a_writable_home_caches_in_memory_and_says_so(blocked_home, caplog):
    from halluscope.lm.models import configure

    lm = scripted_lm(lambda call: {})
    with caplog.at_level(logging.WARNING, logger="halluscope.lm.models"):
        assert configure(lm) is lm
    assert dspy.settings.lm is lm
    assert dspy.cache.enable_disk_cache is False and dspy.cache.enable_memory_cache is True
    warned = [r.getMessage() for r in caplog.records]
    assert len(warned) == 1 and "\n" not in warned[0]
    assert str(blocked_home / ".cache" / "dspy") in warned[0] and "HALLUSCOPE_HOME" in warned[0]


def test_configure_with_an_unusable_cache_dir_it_was_given_is_one_line(tmp_path, monkeypatch):
    from halluscope.lm.models import CacheFolderError, configure

    monkeypatch.setattr(dspy, "cache", dspy.cache)
    (tmp_path / "f").write_text("x")
    with pytest.raises(CacheFolderError, match=r"cannot use the LM cache folder .*f/c: .*--cache-dir"):
        configure(scripted_lm(lambda call: {}), cache_dir=tmp_path / "f" / "c")


def test_detect_with_an_lm_program_in_an_unwritable_home_works(blocked_home, monkeypatch, capsys):
    """``detect --program spans`` configures the LM (DSPy's disk cache lives under the home): it runs anyway."""
    from halluscope.cli import main

    monkeypatch.setattr("halluscope.cli.common.check_lm", lambda lm, timeout=None: None)
    lm = scripted_lm({"spans": [{"text": "Germany", "probability": 0.9}]})
    monkeypatch.setattr("halluscope.lm.models.make_lm", lambda spec, **kw: lm)
    rc = main(["detect", "--program", "spans", "--lang", "en", "--answer", "Paris is in Germany.",
               "--context", "Paris is in France.", "--adapter", "json"])
    out, err = capsys.readouterr()
    assert rc == 0, err
    assert "Traceback" not in err
    row = json.loads(out.splitlines()[-1])
    assert row["ok"] is True and row["hard_labels"] == [[12, 19]]  # "Germany", from the scripted LM
    assert not blocked_home.parent.is_dir()  # nothing was made


def test_detect_with_an_unusable_cache_dir_option_is_one_line_exit_2(tmp_path, monkeypatch, capsys):
    from halluscope.cli import main

    (tmp_path / "f").write_text("x")
    monkeypatch.setattr(dspy, "cache", dspy.cache)
    monkeypatch.setattr("halluscope.lm.models.make_lm", lambda spec, **kw: scripted_lm(lambda call: {}))
    rc = main(["detect", "--program", "spans", "--lang", "en", "--answer", "Paris is in Germany.",
               "--cache-dir", str(tmp_path / "f" / "c")])
    err = capsys.readouterr().err
    assert rc == 2
    assert "Traceback" not in err and "cannot use the LM cache folder" in err
    assert [l for l in err.splitlines() if "cache folder" in l] == [err.strip().splitlines()[-1]]


def test_the_tracking_check_in_an_unwritable_home_is_one_line(blocked_home):
    from halluscope.tracking.runs import TrackingStoreError, check_tracking_store

    with pytest.raises(TrackingStoreError, match=r"cannot use the tracking store sqlite:///.*a-file/home/mlruns"):
        check_tracking_store()


def test_evaluate_in_an_unwritable_home_is_one_line_exit_2(blocked_home, tmp_path, capsys):
    from halluscope.cli import main

    with pytest.raises(SystemExit) as exit_:
        main(["evaluate", "--lang", "de", "--limit", "2", "--out-dir", str(tmp_path / "out")])
    err = capsys.readouterr().err
    assert exit_.value.code == 2
    assert not (tmp_path / "out").exists()
    assert "Traceback" not in err
    line = err.strip().splitlines()[-1]
    assert line.startswith("halluscope evaluate: error: argument --tracking-uri: cannot use the tracking store")
    assert "--no-mlflow" in line and "$HALLUSCOPE_HOME" in line


def test_compare_reads_and_makes_no_store(blocked_home, tmp_path, monkeypatch, capsys):
    """compare is a reader: without a store there are no runs to show, in an unwritable home or a fresh one."""
    from halluscope.cli import main

    assert main(["compare", "--no-plot"]) == 1
    out, err = capsys.readouterr()
    assert "Traceback" not in err and "no halluscope runs in sqlite:///" in out
    fresh = tmp_path / "fresh"
    monkeypatch.setenv("HALLUSCOPE_HOME", str(fresh))
    assert main(["compare", "--no-plot"]) == 1
    assert "no halluscope runs" in capsys.readouterr().out
    assert not fresh.exists()


def test_the_demo_set_in_an_unwritable_home_is_one_line_naming_the_folder_and_the_way_out(blocked_home):
    from halluscope.loaders.demo import demo_data_dir

    with pytest.raises(OSError) as err:
        demo_data_dir()
    message = str(err.value)
    assert "\n" not in message and not message.startswith("[Errno")
    assert f"cannot write the built-in demo set to {blocked_home / 'demo_data'}" in message
    assert "$HALLUSCOPE_HOME" in message and "--data-dir" in message


def test_evaluate_without_data_in_an_unwritable_home_is_one_line_exit_2(blocked_home, tmp_path, capsys):
    from halluscope.cli import main

    rc = main(["evaluate", "--lang", "de", "--limit", "2", "--no-mlflow", "--out-dir", str(tmp_path / "out")])
    err = capsys.readouterr().err
    assert rc == 2 and "Traceback" not in err
    assert not (tmp_path / "out").exists()  # a refused run leaves no empty output folder behind
    assert err.strip().splitlines()[-1].startswith(
        f"halluscope evaluate: error: cannot write the built-in demo set to {blocked_home / 'demo_data'}")


def test_evaluate_says_where_its_default_output_folder_lives(blocked_home, capsys):
    from halluscope.cli import main

    with pytest.raises(SystemExit) as exit_:
        main(["evaluate", "--lang", "de", "--limit", "2", "--no-mlflow"])
    err = capsys.readouterr().err.strip().splitlines()
    assert exit_.value.code == 2 and len(err) == 1
    assert err[0].startswith(f"halluscope evaluate: error: argument --out-dir: cannot use {blocked_home / 'outputs'}")
    assert "$HALLUSCOPE_HOME" in err[0]


def test_detect_trace_in_an_unwritable_home_is_one_line_exit_2(blocked_home, capsys):
    from halluscope.cli import main

    with pytest.raises(SystemExit) as exit_:
        main(["detect", "--trace", "--lang", "en", "--answer", "Paris is in Germany."])
    err = capsys.readouterr().err
    assert exit_.value.code == 2 and "Traceback" not in err
    assert err.strip().splitlines()[-1].startswith("halluscope detect: error: argument --tracking-uri: cannot use")


def test_ui_in_an_unwritable_home_is_one_line_exit_2(blocked_home, monkeypatch, capsys):
    from halluscope.cli import main

    started = []
    monkeypatch.setattr("halluscope.cli.ui.run_group", lambda cmd, env=None: started.append(cmd) or 0)
    rc = main(["ui"])
    err = capsys.readouterr().err
    assert rc == 2 and not started and "Traceback" not in err
    line = err.strip().splitlines()[-1]
    assert line.startswith(f"halluscope ui: error: cannot make the MLflow store in {blocked_home / 'mlruns'}")
    assert "--tracking-uri" in line and "$HALLUSCOPE_HOME" in line


def test_two_writers_that_list_the_same_versions_never_share_a_number(tmp_path, monkeypatch):
    """Two optimize runs of one program/language/metric into one home: both list the store before either writes
    (a barrier holds them there), so both pick v0001; the rename that loses takes the next number, neither version
    overwrites the other, and each manifest names its own folder."""
    import threading

    from halluscope.artifacts import store
    from halluscope.programs.registry import get_program

    real_list = store.list_versions
    barrier = threading.Barrier(2, timeout=30)
    first = threading.local()
    listings = []

    def listed_together(*args, **kwargs):
        out = real_list(*args, **kwargs)
        listings.append(len(out))
        if not getattr(first, "done", False):  # each writer's first listing waits for the other's
            first.done = True
            barrier.wait()
        return out

    monkeypatch.setattr(store, "list_versions", listed_together)
    written, errors = {}, []

    def write(tag):
        try:
            written[tag] = store.write_artifact(get_program("mark-all").make(), {"source": tag},
                                                program_name="mark-all", lang="en", metric="iou", root=tmp_path)
        except BaseException as e:  # noqa: BLE001 - reported below
            errors.append(e)

    threads = [threading.Thread(target=write, args=(tag,)) for tag in ("a", "b")]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    assert not errors
    assert sorted(w.manifest["version"] for w in written.values()) == [1, 2]
    assert listings[:2] == [0, 0] and len(listings) == 3  # both saw an empty store; the loser listed again
    base = store.artifact_dir("mark-all", "en", "iou", tmp_path)
    assert sorted(p.name for p in base.iterdir()) == ["v0001", "v0002"]  # no temp folder left behind
    for tag, w in written.items():
        on_disk = json.loads((w.path / "manifest.json").read_text())
        assert on_disk["source"] == tag and w.path.name == f"v{on_disk['version']:04d}"


def test_register_in_an_unwritable_home_is_one_line_exit_2(blocked_home, capsys):
    from halluscope.cli import main

    with pytest.raises(SystemExit) as exit_:
        main(["register", "--lang", "de"])  # the bundled German grounded version
    err = capsys.readouterr().err
    assert exit_.value.code == 2 and "Traceback" not in err
    line = err.strip().splitlines()[-1]
    assert line.startswith("halluscope register: error: argument --tracking-uri: cannot use the tracking store")
    assert str(blocked_home / "mlruns") in line and "$HALLUSCOPE_HOME" in line
