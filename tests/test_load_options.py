"""``detect -O`` / ``serve -O`` / ``load_compiled(options=...)`` (#23 item 7): build options that are safe to
change at load time (``ProgramSpec.load_options``: a knowledge base, files, retriever settings) apply; the
rest are refused by name."""

from __future__ import annotations

import json

import dspy
import pytest

from halluscope.artifacts import store as A
from halluscope.cli import build_parser, main
from halluscope.cli.serve import resolve_detectors
from halluscope.core.contract import Detection, Span, to_prediction
from halluscope.programs.registry import REGISTRY, ProgramSpec, get_program


class KbFixture(dspy.Module):
    """No LM: marks the whole answer with probability ``weight``, and says which ``kb`` it read."""

    def __init__(self, kb: str = "", k: int = 5, weight: float = 0.9):
        super().__init__()
        self.kb, self.k, self.weight = kb, int(k), float(weight)

    def forward(self, answer: str = "", **_):
        return to_prediction(Detection(answer=answer, spans=[Span(0, len(answer), self.weight)],
                                       rationale=f"kb={self.kb} k={self.k}"))


@pytest.fixture
def root(tmp_path, monkeypatch):
    monkeypatch.setitem(REGISTRY, "kb-fixture", ProgramSpec(name="kb-fixture", build=KbFixture, uses_lm=False,
                                                            description="load-option fixture",
                                                            load_options=("kb", "k")))
    A.write_artifact(get_program("kb-fixture").make(kb="compiled-kb"), {"source": "fixture",
                                                               "program_options": {"kb": "compiled-kb"}},
                     program_name="kb-fixture", lang="en", metric="iou", root=tmp_path)
    return tmp_path


def test_load_options_apply_and_are_recorded_without_touching_the_artifact(root):
    d = A.load_compiled("kb-fixture", lang="en", metric="iou", root=root, options={"kb": "/data/kb", "k": 8})
    assert (d.program.kb, d.program.k) == ("/data/kb", 8)
    assert d.manifest["load_options"] == {"kb": "/data/kb", "k": 8}
    assert d.manifest["program_options"]["kb"] == "/data/kb"
    plain = A.load_compiled("kb-fixture", lang="en", metric="iou", root=root)
    assert plain.program.kb == "compiled-kb" and "load_options" not in plain.manifest
    assert plain.content_hash == d.content_hash  # the files on disk are what was compiled


@pytest.mark.parametrize("options, words", [
    ({"weight": 0.1}, ["kb-fixture: option weight cannot be set when loading", "options that can: kb, k"]),
    ({"kbb": "x"}, ["unknown option kbb", "options that can: kb, k"]),
])
def test_other_options_are_refused_by_name(root, options, words):
    with pytest.raises(A.LoadOptionError) as e:
        A.load_compiled("kb-fixture", lang="en", metric="iou", root=root, options=options)
    assert all(w in str(e.value) for w in words)


def test_detect_dash_o(root, capsys):
    base = ["detect", "--program", "kb-fixture", "--lang", "en", "--compiled-dir", str(root), "--answer", "Hi."]
    assert main([*base, "-O", "kb=/data/kb", "-O", "k=3"]) == 0
    assert json.loads(capsys.readouterr().out)["rationale"] == "kb=/data/kb k=3"
    assert main([*base, "-O", "weight=0.1"]) == 2
    assert "option weight cannot be set when loading" in capsys.readouterr().err
    with pytest.raises(SystemExit) as e:
        main([*base, "-O", "kb"])
    assert e.value.code == 2 and "argument --option/-O" in capsys.readouterr().err


def test_serve_dash_o(root):
    args = build_parser().parse_args(["serve", "--program", "kb-fixture", "--lang", "en", "--compiled-dir",
                                      str(root), "-O", "kb=/srv/kb"])
    (d,) = resolve_detectors(args)
    assert d.program.kb == "/srv/kb"
    args = build_parser().parse_args(["serve", "--program", "kb-fixture", "--lang", "en", "--compiled-dir",
                                      str(root), "-O", "weight=1"])
    with pytest.raises(ValueError, match="option weight cannot be set when loading"):
        resolve_detectors(args)
