"""``halluscope detect --output``: an unusable path is a usage error (exit 2) before any work (#10)."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from halluscope.artifacts.store import write_artifact
from halluscope.cli import detect as detect_cli
from halluscope.cli import main
from halluscope.programs import registry


@pytest.fixture
def setup(tmp_path, monkeypatch):
    monkeypatch.setenv("HALLUSCOPE_HOME", str(tmp_path / "home"))
    root = tmp_path / "compiled"
    write_artifact(registry.get_program("mark-all").make(), {"source": "test"}, program_name="mark-all", lang="en",
                   metric="iou", root=root)
    inp = tmp_path / "in.jsonl"
    inp.write_text("".join(json.dumps({"id": f"r{i}", "answer": f"Answer {i}."}) + "\n" for i in range(3)),
                   encoding="utf-8")
    return root, inp


def _argv(root: Path, inp: Path, out, *extra) -> list[str]:
    return ["detect", "--program", "mark-all", "--lang", "en", "--metric", "iou", "--compiled-dir", str(root),
            "--input", str(inp), "--output", str(out), "--no-progress", *extra]


def _no_work(monkeypatch):
    """Fail the test if detect gets as far as loading the artifact or detecting anything."""
    def refuse(*a, **k):
        raise AssertionError("detect did work before checking --output")
    monkeypatch.setattr(detect_cli, "load_detector", refuse)
    monkeypatch.setattr(detect_cli, "detect_jsonl", refuse)
    monkeypatch.setattr(detect_cli, "detect", refuse)


def _usage_error(capsys, argv) -> str:
    with pytest.raises(SystemExit) as e:
        main(argv)
    assert e.value.code == 2
    err = capsys.readouterr().err
    assert err.startswith("halluscope detect: error: argument --output: ") and err.count("\n") == 1, err
    return err


def test_output_that_is_a_folder_is_refused_before_any_work(setup, tmp_path, capsys, monkeypatch):
    root, inp = setup
    _no_work(monkeypatch)
    folder = tmp_path / "outdir"
    folder.mkdir()
    err = _usage_error(capsys, _argv(root, inp, folder))
    assert f"{folder} is a folder" in err and "detections.jsonl" in err
    err = _usage_error(capsys, _argv(root, inp, str(tmp_path / "new") + "/"))  # a folder by its spelling
    assert "is a folder" in err and not (tmp_path / "new").exists()


def test_output_in_a_folder_that_cannot_be_created_is_refused(setup, tmp_path, capsys, monkeypatch):
    root, inp = setup
    _no_work(monkeypatch)
    blocker = tmp_path / "a_file"
    blocker.write_text("x")
    err = _usage_error(capsys, _argv(root, inp, blocker / "sub" / "out.jsonl"))
    assert "cannot create the folder" in err and str(blocker / "sub") in err
    assert blocker.read_text() == "x"


def test_output_that_is_the_input_or_not_a_regular_file_is_refused(setup, tmp_path, capsys, monkeypatch):
    root, inp = setup
    _no_work(monkeypatch)
    before = inp.read_text()
    err = _usage_error(capsys, _argv(root, inp, inp))
    assert "is the --input file" in err and inp.read_text() == before
    fifo = tmp_path / "fifo"
    os.mkfifo(fifo)
    assert "not a regular file" in _usage_error(capsys, _argv(root, inp, fifo))


def test_output_in_a_folder_that_is_not_writable_is_refused(setup, tmp_path, capsys, monkeypatch):
    """The permission check itself, made deterministic (tests often run as root, who may write anywhere):
    os.access says the folder is read-only."""
    import halluscope.cli.detect as detect_cli

    root, inp = setup
    _no_work(monkeypatch)
    ro = tmp_path / "ro"
    ro.mkdir()
    real_access = os.access
    monkeypatch.setattr(detect_cli.os, "access",
                        lambda p, mode, **kw: False if Path(p) == ro else real_access(p, mode, **kw))
    assert "is not writable" in _usage_error(capsys, _argv(root, inp, ro / "out.jsonl"))
    assert not (ro / "out.jsonl").exists()


def test_output_with_an_answer_is_checked_too(setup, tmp_path, capsys, monkeypatch):
    root, _ = setup
    _no_work(monkeypatch)
    folder = tmp_path / "outdir"
    folder.mkdir()
    with pytest.raises(SystemExit) as e:
        main(["detect", "--program", "mark-all", "--lang", "en", "--metric", "iou", "--compiled-dir", str(root),
              "--answer", "Paris.", "--output", str(folder)])
    assert e.value.code == 2 and "is a folder" in capsys.readouterr().err


def test_usable_outputs_still_work(setup, tmp_path, capsys):
    root, inp = setup
    out = tmp_path / "new" / "deeper" / "out.jsonl"  # its folder is created
    assert main(_argv(root, inp, out)) == 0
    assert [json.loads(line)["id"] for line in out.read_text().splitlines()] == ["r0", "r1", "r2"]
    out.write_text("old\n")  # an existing file is replaced, as before
    assert main(_argv(root, inp, out)) == 0
    assert out.read_text().count("\n") == 3 and "old" not in out.read_text()
    capsys.readouterr()
