"""One extension shape (#22): programs, datasets, retrievers and optimizers are registered, found and listed the
same way (``halluscope.core.extensions``), and an installed plugin registers through its entry points, without
``--import``. The plugin here is a real (tiny) distribution: a ``*.dist-info`` folder with ``entry_points.txt`` on
``sys.path``, found by ``importlib.metadata`` in a fresh interpreter."""

from __future__ import annotations

import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from halluscope.core import extensions

PLUGIN_MODULE = textwrap.dedent('''
    """A toy halluscope plugin: one extension of each kind."""
    import dspy

    from halluscope.core.contract import Detection, Evidence, Span, to_prediction
    from halluscope.loaders.dataset_registry import DatasetSpec
    from halluscope.optimize.cv import OptimizerSpec
    from halluscope.programs.registry import ProgramSpec


    class Everything(dspy.Module):
        def __init__(self, prob: float = 0.9):
            super().__init__()
            self.prob = prob

        def forward(self, answer="", **_):
            return to_prediction(Detection(answer=answer, spans=[Span(0, len(answer), self.prob)], label=True))


    PROGRAM = ProgramSpec(name="toy-everything", build=Everything, description="marks the whole answer",
                          uses_lm=False)


    def load(data_dir=None, **_):
        return [dspy.Example(id="t1", answer="Paris", question="", lang="en", context="", task="mushroom",
                             hard_labels=[[0, 5]], soft_labels=[]).with_inputs("answer")], "toy"


    DATASET = DatasetSpec(name="toy-data", description="one item", loader=load, level="span")


    class Echo:
        source = "echo"

        def __init__(self, arg):
            self.arg = arg

        def retrieve(self, query, *, k=5, context=""):
            return [Evidence(text=f"{self.arg}:{query}", source=self.source, id="echo#0", score=1.0)][:k]


    def compile_unchanged(student, trainset, metric, cfg, **_):
        return student, {"n_train": len(trainset), "n_val": 0}


    OPTIMIZER = OptimizerSpec("toy-unchanged", compile_unchanged, "the toy optimizer")
''')

ENTRY_POINTS = textwrap.dedent('''
    [halluscope.programs]
    toy-everything = toy_plugin:PROGRAM
    toy-broken = toy_plugin_missing:PROGRAM

    [halluscope.datasets]
    toy-data = toy_plugin:DATASET

    [halluscope.retrievers]
    echo = toy_plugin:Echo

    [halluscope.optimizers]
    toy-unchanged = toy_plugin:OPTIMIZER
''')


def _install_plugin(site: Path) -> Path:
    site.mkdir(parents=True, exist_ok=True)
    (site / "toy_plugin.py").write_text(PLUGIN_MODULE, encoding="utf-8")
    dist = site / "toy_plugin-0.1.dist-info"
    dist.mkdir()
    (dist / "METADATA").write_text("Metadata-Version: 2.1\nName: toy-plugin\nVersion: 0.1\n", encoding="utf-8")
    (dist / "entry_points.txt").write_text(ENTRY_POINTS, encoding="utf-8")
    return site


def _run(code: str, site: Path) -> subprocess.CompletedProcess:
    import os

    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(site), os.environ.get("PYTHONPATH", "")])}
    return subprocess.run([sys.executable, "-c", textwrap.dedent(code)], capture_output=True, text=True, env=env,
                          timeout=300)


def test_an_installed_plugin_registers_every_kind_through_entry_points(tmp_path):
    site = _install_plugin(tmp_path / "site")
    proc = _run('''
        from halluscope.core import extensions
        from halluscope.retrievers import make_retriever, retriever_names
        from halluscope.loaders import dataset_names, get_dataset
        from halluscope.optimize import OptimizerConfig, compile_program, get_optimizer, optimizer_names
        from halluscope.programs import get_program, program_names

        assert "toy-everything" in program_names() and "spans" in program_names(), program_names()
        program = get_program("toy-everything").make()
        assert program(answer="Paris").detection.hard_labels == [[0, 5]]
        assert dataset_names()[-1] == "toy-data" and get_dataset("toy-data").load()[1] == "toy"
        assert "echo" in retriever_names() and make_retriever("echo:x").retrieve("q")[0].text == "x:q"
        assert optimizer_names()[-1] == "toy-unchanged" and OptimizerConfig(name="toy-unchanged").name == "toy-unchanged"
        same, info = compile_program(program, get_dataset("toy-data").load()[0], lambda g, p, t=None: 1.0,
                                     OptimizerConfig(name="toy-unchanged"))
        assert info["n_train"] == 1, info
        assert "toy-broken" not in program_names()  # its module is missing: a warning, and the others still load
        print("OK")
    ''', site)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-3000:]
    assert "OK" in proc.stdout
    assert "plugin toy-broken" in proc.stderr and "ModuleNotFoundError" in proc.stderr, proc.stderr[-2000:]


def test_a_plugin_program_is_a_command_line_choice_without_import(tmp_path):
    site = _install_plugin(tmp_path / "site")
    proc = _run('''
        import sys
        from halluscope.cli import main
        sys.exit(main(["evaluate", "--help"]))
    ''', site)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert "toy-everything" in proc.stdout


@pytest.mark.parametrize("kind", sorted(extensions.KINDS))
def test_every_kind_has_one_shape(kind):
    """register / get / names behave alike for every kind, and an unknown name is a KeyError naming the others."""
    marker = object()
    extensions.names(kind)  # the built-ins loaded
    before = dict(extensions.table(kind))
    try:
        assert extensions.register(kind, "zz-test", marker) is marker
        assert extensions.get(kind, "zz-test") is marker
        assert extensions.names(kind)[-1] == "zz-test"
        with pytest.raises(KeyError, match=f"unknown {kind[:-1]} 'nope'; choose one of: .*zz-test"):
            extensions.get(kind, "nope")
    finally:
        extensions.table(kind).clear()
        extensions.table(kind).update(before)


def test_an_unknown_kind_is_refused():
    with pytest.raises(ValueError, match="unknown extension kind 'detectors'; the kinds are: programs, datasets"):
        extensions.get("detectors", "x")


def test_a_registration_before_the_first_lookup_is_not_replaced_by_the_built_ins():
    proc = subprocess.run([sys.executable, "-c",
                           "from halluscope.core.retrieval import make_retriever, register_retriever\n"
                           "class Mine:\n    source = 'mine'\n    def __init__(self, arg): pass\n"
                           "register_retriever('kb', Mine)\n"
                           "print(type(make_retriever('kb:x')).__name__)"],
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert proc.stdout.strip() == "Mine"


def test_a_retriever_needs_no_import_of_the_retrievers_package():
    """Before #22, ``make_retriever("kb:...")`` worked only after ``import halluscope.retrievers``."""
    proc = subprocess.run([sys.executable, "-c", "from halluscope.core.retrieval import retriever_names\n"
                                                 "print(retriever_names())"],
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert proc.stdout.strip() == "['context', 'files', 'kb', 'kg', 'search']"


# -- one front per kind, named alike: get_<kind>(name) is extensions.get(kind, name) -------------------------------

def _echo_factory(arg):
    class Echo:
        source = "echo"

        def retrieve(self, query, *, k=5, context=""):
            from halluscope.core.contract import Evidence
            return [Evidence(text=f"{arg}:{query}", source="echo", id="echo#0", score=1.0)][:k]

    return Echo()


def _toy(kind):
    """A plug-in of ``kind``, the front's register, get and names functions (from the documented package)."""
    import dspy

    if kind == "programs":
        from halluscope.programs import ProgramSpec, get_program, program_names, register_program

        class Nothing(dspy.Module):
            def forward(self, answer="", **_):
                from halluscope.core.contract import Detection, to_prediction
                return to_prediction(Detection(answer=answer, spans=[], label=False))

        spec = ProgramSpec(name="zz-toy", build=Nothing, description="flags nothing", uses_lm=False)
        return spec, register_program, get_program, program_names
    if kind == "datasets":
        from halluscope.loaders import DatasetSpec, dataset_names, get_dataset, register_dataset

        spec = DatasetSpec(name="zz-toy", description="nothing", loader=lambda *a, **k: ([], "toy"), level="response")
        return spec, register_dataset, get_dataset, dataset_names
    if kind == "retrievers":
        from halluscope.retrievers import get_retriever, register_retriever, retriever_names
        return _echo_factory, lambda f: register_retriever("zz-toy", f), get_retriever, retriever_names
    from halluscope.optimize import OptimizerSpec, get_optimizer, optimizer_names, register_optimizer

    spec = OptimizerSpec("zz-toy", lambda student, trainset, *a, **k: (student, {"n_train": len(trainset)}), "toy")
    return spec, register_optimizer, get_optimizer, optimizer_names


@pytest.mark.parametrize("kind", ["programs", "datasets", "retrievers", "optimizers"])
def test_a_registered_plugin_is_reached_through_its_front_and_through_extensions_get(kind):
    spec, register, get, names = _toy(kind)
    extensions.names(kind)  # the built-ins loaded
    before = dict(extensions.table(kind))
    try:
        register(spec)
        assert get("zz-toy") is spec
        assert extensions.get(kind, "zz-toy") is spec
        assert "zz-toy" in names() and "zz-toy" in extensions.names(kind)
        with pytest.raises(KeyError, match=f"unknown {kind[:-1]} 'zz-nope'; choose one of: .*zz-toy"):
            get("zz-nope")
    finally:
        extensions.table(kind).clear()
        extensions.table(kind).update(before)


def test_make_retriever_builds_from_the_factory_get_retriever_returns():
    from halluscope.retrievers import get_retriever, make_retriever, register_retriever

    before = dict(extensions.table("retrievers"))
    try:
        register_retriever("zz-echo", _echo_factory)
        assert get_retriever("zz-echo") is _echo_factory
        assert make_retriever("zz-echo:abc").retrieve("q")[0].text == "abc:q"
    finally:
        extensions.table("retrievers").clear()
        extensions.table("retrievers").update(before)


def test_every_builtin_registers_in_the_module_that_defines_it():
    """Each built-in's register call sits in the module defining it: a retriever's class, a dataset's loader, the
    optimizers' compile functions (not a package ``__init__``, not the end of the cross-validation module); a
    program registers inside its own package."""
    code = textwrap.dedent('''
        import sys
        from halluscope.core import extensions
        calls = {}
        real = extensions.register
        def spy(kind, name, spec):
            frame = sys._getframe(1)  # the front (register_program, register_dataset, ...), then its caller
            if frame.f_code.co_name.startswith("register_"):
                frame = frame.f_back
            calls[(kind, name)] = frame.f_globals["__name__"]
            return real(kind, name, spec)
        extensions.register = spy
        for kind in ("programs", "datasets", "retrievers", "optimizers"):
            for name in extensions.names(kind):
                print(kind, name, calls[(kind, name)], sep="|")
    ''')
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    where = {tuple(line.split("|")[:2]): line.split("|")[2] for line in proc.stdout.split()}
    expected = {("retrievers", "context"): "halluscope.core.retrieval",
                **{("retrievers", n): f"halluscope.retrievers.{n}" for n in ("kb", "files", "kg", "search")},
                **{("datasets", n): f"halluscope.loaders.{n}" for n in ("mushroom", "halluclean", "generic")},
                **{("optimizers", n): "halluscope.optimize.optimizers"
                   for n in ("mipro", "bootstrap", "gepa", "reanchor", "pairs", "fit")}}
    assert {k: where.get(k) for k in expected} == expected
    programs = {k[1]: v for k, v in where.items() if k[0] == "programs"}
    assert len(programs) >= 10, programs
    assert all(v.startswith("halluscope.programs.") and v != "halluscope.programs" for v in programs.values()), programs
