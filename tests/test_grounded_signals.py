"""``grounded`` as signal plug-ins (#36 item 1): a signal is one module registered as kind ``"signals"``, a plugin
adds one with one file, the ``-O`` switches and every committed manifest map onto the signal list, one prompt
builder for the LM passes, no feature column computed outside the signal modules, and the served artifacts'
``detect`` output unchanged (digests made by the code before the refactor)."""

from __future__ import annotations

import ast
import importlib.util
import json
import subprocess
import sys
import textwrap
from pathlib import Path

import numpy as np
import pytest

from halluscope.core import extensions
from halluscope.programs.grounded.program import GroundedDetector, build_grounded, fit_grounded, translate_options
from halluscope.programs.grounded.signals import DEFAULT_SIGNALS, signals_for
from halluscope.programs.grounded.signals.base import Signal, register_signal, signal_names
from halluscope.programs.grounded.signals.hidden import HiddenScorer
from halluscope.programs.grounded.signals.lmscore import LMScorer, lm_prompt
from halluscope.programs.registry import get_program
from tests.test_grounded import fixture_examples, inputs

ROOT = Path(__file__).resolve().parent.parent
GROUNDED = ROOT / "programs" / "grounded"


# -- adding a signal is one file and one test ------------------------------------------------------------------

class Shouting(Signal):
    """A toy signal declared here only: a word written in capitals."""

    name, columns, cost, order = "toy-shouting", ("is_upper",), "none", 90

    def compute(self, item):
        return {"is_upper": [1.0 if len(u.text) > 1 and u.text.isupper() else 0.0 for u in item.units]}


@pytest.fixture
def shouting():
    register_signal(Shouting)
    yield Shouting
    extensions.table("signals").pop(Shouting.name, None)


def _shouted(examples):
    """The wrong entity of every hallucinated fixture answer written in capitals (its gold span is that word)."""
    out = []
    for ex in examples:
        answer = ex.answer
        for s, e in ex.hard_labels:
            answer = answer[:s] + answer[s:e].upper() + answer[e:]
        out.append(ex.copy(answer=answer))
    return out


def test_a_signal_registered_from_a_test_file_adds_a_column_the_combiner_fits_and_uses(shouting):
    assert Shouting.name in signal_names()
    det = GroundedDetector(signals=[*DEFAULT_SIGNALS, Shouting.name])
    assert det.features[-1] == "is_upper" and det.signal(Shouting.name) is not None
    examples = _shouted(fixture_examples(16))
    info = fit_grounded(det, examples, "iou")
    assert info["weights"]["is_upper"] > 0.5  # the capitals single out the hallucinated words
    without = GroundedDetector()
    fit_grounded(without, examples, "iou")
    bad = next(ex for ex in examples if ex.hard_labels)
    s, e = bad.hard_labels[0]
    unit = lambda p: next(u for u in p.detection.units if u.start == s)  # noqa: E731
    assert unit(det(**inputs(bad))).score > unit(without(**inputs(bad))).score
    again = GroundedDetector(signals=[*DEFAULT_SIGNALS, Shouting.name]).load_state(det.dump_state())
    assert again(**inputs(bad)).detection.to_json() == det(**inputs(bad)).detection.to_json()
    with pytest.raises(ValueError, match="differ"):  # a program built without the signal refuses the state
        GroundedDetector().load_state(det.dump_state())


PLUGIN = textwrap.dedent('''
    from halluscope.programs.grounded.signals.base import Signal

    class Exclaim(Signal):
        name, columns, cost, order = "exclaim", ("in_exclaim",), "none", 95
        weights = {"in_exclaim": 0.25}

        def compute(self, item):
            return {"in_exclaim": [1.0 if item.answer[u.end:u.end + 1] == "!" else 0.0 for u in item.units]}
''')


def test_a_plugin_package_adds_a_signal_through_its_entry_point(tmp_path):
    site = tmp_path / "site"
    site.mkdir()
    (site / "sig_plugin.py").write_text(PLUGIN, encoding="utf-8")
    dist = site / "sig_plugin-0.1.dist-info"
    dist.mkdir()
    (dist / "METADATA").write_text("Metadata-Version: 2.1\nName: sig-plugin\nVersion: 0.1\n", encoding="utf-8")
    (dist / "entry_points.txt").write_text("[halluscope.signals]\nexclaim = sig_plugin:Exclaim\n", encoding="utf-8")
    code = textwrap.dedent('''
        from halluscope.programs.grounded.program import GroundedDetector
        from halluscope.programs.grounded.signals import DEFAULT_SIGNALS
        from halluscope.programs.grounded.signals.base import signal_names

        assert signal_names()[-1] == "exclaim", signal_names()
        det = GroundedDetector(signals=[*DEFAULT_SIGNALS, "exclaim"])
        feats = det.item_features(answer="Paris is in Spain!", context="Paris is in France.", lang="en")
        col = feats.X[:, det.features.index("in_exclaim")].tolist()
        assert col == [0.0, 0.0, 0.0, 1.0], col
        assert det.combiner.weights[1 + det.features.index("in_exclaim")] == 0.25  # its hand-set weight
        print("OK")
    ''')
    import os
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(site), str(ROOT), os.environ.get("PYTHONPATH", "")])}
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=300)
    assert proc.returncode == 0 and "OK" in proc.stdout, proc.stdout[-2000:] + proc.stderr[-3000:]


def test_every_built_in_signal_declares_what_a_signal_declares():
    builtins = ["base", "support", "numbers", "align", "encoder", "idf", "genlogits", "lm", "hidden", "detectors"]
    assert signal_names()[:len(builtins)] == builtins
    seen: dict[str, str] = {}
    for name in builtins:
        cls = extensions.get("signals", name)
        assert cls.name == name and cls.cost in ("none", "lm", "encoder", "detectors"), name
        assert cls.__doc__ or sys.modules[cls.__module__].__doc__, name  # says what it computes
        assert set(cls.option_types) == set(cls.defaults()), name  # every option typed, with its default
        for col in cls.columns:
            assert col not in seen, f"{col} declared by {seen.get(col)} and {name}"
            seen[col] = name
        assert set(cls.weights) <= set(cls.columns), name
    # the opt-in signals say why, with a measured number, in their module docstring
    for name in ("align", "encoder", "hidden", "lm"):
        doc = sys.modules[extensions.get("signals", name).__module__].__doc__ + \
            (extensions.get("signals", name).__doc__ or "")
        assert "BENCHMARKS.md" in doc and any(ch.isdigit() for ch in doc), name
    assert not {"align", "encoder", "lm", "hidden", "detectors"} & set(DEFAULT_SIGNALS)


# -- the -O options and the committed manifests map onto the signal list ----------------------------------------

def test_the_flat_options_translate_into_signals():
    names = lambda opts: [s if isinstance(s, str) else s[0] for s in translate_options(opts)["signals"]]  # noqa: E731
    assert names({}) == ["base", "support", "numbers", "idf", "genlogits"] == ["base", *DEFAULT_SIGNALS[1:]]
    assert names({"align": True}) == ["base", "support", "numbers", "align", "idf", "genlogits"]
    assert names({"encoder": True})[3:5] == ["align", "encoder"]  # the encoder ranks the alignment: it implies it
    assert names({"lm": True, "hidden": True, "detectors": "spans", "numbers": False, "genlogits": False}) == \
        ["base", "support", "idf", "lm", "hidden", "detectors"]
    lm = dict(s for s in translate_options({"lm": True, "lm_model": "m.gguf", "lm_item_tokens": 0})["signals"]
              if not isinstance(s, str))["lm"]
    assert lm == {"model": "m.gguf", "cache_dir": "", "evidence_tokens": 300, "item_tokens": 0}
    t = translate_options({"rules": "numbers", "head": "trees", "resp_cov": True, "unit_pool": "x", "fit_units": True})
    assert t["rules"] == "numbers" and t["head"]["kind"] == "trees" and t["head"]["resp_cov"] is True
    assert t["units"] == {"fit": True, "pool": "x", "pool_weight": 1.0, "from": "auto"}
    # -O through the registry: each switch is a signal, its options the signal's
    det = get_program("grounded").make(align="true", lm="true", lm_evidence_tokens="200", fuzzy="false")
    assert det.signal_names == ["base", "support", "numbers", "align", "idf", "genlogits", "lm"]
    assert det.signal("lm").options["evidence_tokens"] == 200 and det.signal("support").options["fuzzy"] is False


def _manifests():
    return sorted((ROOT / "compiled" / "grounded").glob("*/*/v*/manifest.json"))


@pytest.mark.parametrize("path", _manifests(), ids=lambda p: "/".join(p.parts[-4:-1]))
def test_every_committed_manifest_builds_the_signals_its_feature_list_names(path):
    manifest = json.loads(path.read_text(encoding="utf-8"))
    state = json.loads((path.parent / "program.json").read_text(encoding="utf-8"))["grounded"]
    det = get_program("grounded").make(**manifest["program_options"])
    det.load_state({"grounded": state})
    assert det.features == state["features"]
    assert [c for s in det.signals for c in s.feature_columns()] == state["features"]
    assert [s.name for s in det.signals] == [s.name for s in signals_for(state["features"])]


# -- one prompt builder -----------------------------------------------------------------------------------------

class _Recorder:
    """A backend that records the texts it tokenizes (one token per character)."""

    name = "recorder"

    def __init__(self):
        self.texts: list[str] = []

    def tokenize(self, text):
        self.texts.append(text)
        return [ord(c) % 50 for c in text]

    def detokenize(self, tokens):
        return "".join(chr(97 + t % 26) for t in tokens).encode("ascii")

    def logprobs(self, tokens, start):
        return [-1.0] * len(tokens)

    def forward(self, tokens, start):
        n = len(tokens) - start
        return np.zeros((n, 4), np.float32), np.full(n, -1.0, np.float32), np.ones(n, np.float32)


def test_both_lm_passes_read_the_answer_after_the_one_prompt(tmp_path):
    question, context, answer = "Where is Paris?", "Paris is the capital of France.", "Paris is in France."
    lm, hid = _Recorder(), _Recorder()
    LMScorer(cache_dir=tmp_path / "lm", backend=lm).token_logprobs(question, answer, context)
    HiddenScorer(cache_dir=tmp_path / "hs", backend=hid).token_outputs(question, answer, context)
    assert lm_prompt(question, context) == f"Evidence: {context}\nQuestion: {question}\nAnswer:"
    assert lm_prompt(question) == f"Question: {question}\nAnswer:"
    prompts = {t for t in lm.texts + hid.texts if t.endswith("Answer:")}
    assert prompts == {lm_prompt(question), lm_prompt(question, ""), lm_prompt(question, context)}
    assert lm_prompt(question, context) in hid.texts and lm_prompt(question, context) in lm.texts


# -- no module outside the signal modules computes a feature column ---------------------------------------------

def _column_names() -> set[str]:
    cols = set()
    for name in signal_names():
        cols |= set(extensions.get("signals", name).columns)
    return cols


def _writes_column(tree: ast.AST, cols: set[str]) -> list[str]:
    """What in ``tree`` writes a feature column: a subscript assignment whose index names one (``cols["unsup"] =``,
    ``X[:, features.index("hs_probe")] =``), or a dict display keyed by one (a key that is also a signal's name,
    ``"idf"``, names the signal: a dict of signals or of the compiled state's parts is no row)."""
    found = []

    def names_col(node):
        return [n.value for n in ast.walk(node) if isinstance(n, ast.Constant) and n.value in cols]

    for node in ast.walk(tree):
        targets = node.targets if isinstance(node, ast.Assign) else [node.target] if isinstance(
            node, (ast.AugAssign, ast.AnnAssign)) else []
        for t in targets:
            if isinstance(t, ast.Subscript) and names_col(t.slice):
                found.append(f"line {node.lineno}: assigns {names_col(t.slice)}")
        if isinstance(node, ast.Dict):
            keys = [k.value for k in node.keys if isinstance(k, ast.Constant) and k.value in cols
                    and k.value not in signal_names()]
            if keys:
                found.append(f"line {node.lineno}: a dict keyed by {keys}")
    return found


def test_no_module_outside_the_signal_modules_computes_a_feature_column():
    cols = _column_names()
    assert len(cols) >= 40
    offenders = {}
    for path in sorted(GROUNDED.glob("*.py")):
        found = _writes_column(ast.parse(path.read_text(encoding="utf-8")), cols)
        if found:
            offenders[path.name] = found
    assert not offenders, f"feature columns written outside programs/grounded/signals/: {offenders}"
    # features.py only assembles: it names no column at all
    text = (GROUNDED / "features.py").read_text(encoding="utf-8")
    assert not [c for c in cols if f'"{c}"' in text and c not in signal_names()]
    # and the rule sees a write when there is one (a module that sets a column by name)
    assert _writes_column(ast.parse('X[:, f.index("unsup")] = 0\nrow = {"idf_unsup": 1.0}'), cols) == \
        ['line 1: assigns [\'unsup\']', 'line 2: a dict keyed by [\'idf_unsup\']']


# -- the served artifacts' output is what it was --------------------------------------------------------------

def test_served_artifacts_detect_as_the_code_before_the_signal_refactor_did():
    spec = importlib.util.spec_from_file_location("check_artifact_outputs", ROOT / "scripts" / "check_artifact_outputs.py")
    check = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(check)
    fixture = json.loads((Path(__file__).parent / "fixtures" / "grounded_detect_digests.json").read_text("utf-8"))
    import halluscope.compiled

    got = check.fixture_digests(fixture["items"], Path(halluscope.compiled.__file__).parent)
    assert got == fixture["digests"], ("a served grounded artifact's detect output changed; if a new version is "
                                      "served on purpose, regenerate: python scripts/check_artifact_outputs.py "
                                      "--write-fixture tests/fixtures/grounded_detect_digests.json")


def test_build_grounded_is_the_registered_build_and_keeps_every_option():
    spec = get_program("grounded")
    assert spec.build is build_grounded and isinstance(spec.make(), GroundedDetector)
    assert len(spec.options) == 51 and all(spec.option_help[k] for k in spec.options)  # every -O option kept
    import inspect
    assert len(inspect.signature(GroundedDetector.__init__).parameters) - 1 <= 10
