"""The house rules of the package, checked on the source: one namespace, layers without loops.

The import graph is read from the source with ``ast`` (every ``import``/``from ... import`` of a
``halluscope`` module, at any depth in the file), so a local import inside a function counts too.
"""

from __future__ import annotations

import ast
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest

import halluscope

ROOT = Path(__file__).resolve().parent.parent
PYPROJECT = tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))
SETUPTOOLS = PYPROJECT["tool"]["setuptools"]

# package -> folder in the repository: pyproject's package-dir, so every package folder is covered
FOLDERS = {pkg: ROOT / folder for pkg, folder in SETUPTOOLS["package-dir"].items()}

# The layers, bottom up: pyproject's [tool.halluscope.layers] is the one list (docs/architecture.md is checked
# against it below). A folder is one layer: the layer of a module is the layer of the top-level package it is in.
LAYER_OF_PACKAGE = PYPROJECT["tool"]["halluscope"]["layers"]


def _in(mod: str, *packages: str) -> bool:
    return any(mod == p or mod.startswith(p + ".") for p in packages)


def _modules() -> dict[str, Path]:
    mods = {}
    for pkg, folder in FOLDERS.items():
        for path in folder.rglob("*.py"):
            rel = path.relative_to(folder).with_suffix("")
            parts = [p for p in rel.parts if p != "__init__"]
            mods[".".join([pkg, *parts])] = path
    return mods


MODULES = _modules()
CORE = {m for m in MODULES if _in(m, "halluscope.core", "halluscope.lm")}


def _imports(name: str, path: Path) -> set[str]:
    tree = ast.parse(path.read_text(encoding="utf-8"))
    package = name if path.name == "__init__.py" else name.rsplit(".", 1)[0]
    out = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            targets = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                parts = package.split(".")
                base = ".".join(parts[: len(parts) - node.level + 1] + ([base] if base else []))
            targets = [base] + [f"{base}.{a.name}" for a in node.names]
        else:
            continue
        for t in targets:
            if t in MODULES and t != name:
                out.add(t)
    return out


GRAPH = {name: _imports(name, path) for name, path in MODULES.items()}


def _layer(mod: str) -> int | None:
    if mod == "halluscope" or mod == "halluscope.__main__":
        return None  # the facade and the entry point re-export from every layer
    top = ".".join(mod.split(".")[:2])
    if top in LAYER_OF_PACKAGE:
        return LAYER_OF_PACKAGE[top]
    raise AssertionError(f"{mod} is in no layer: give its folder a layer in LAYER_OF_PACKAGE (and docs/architecture.md)")


def test_every_module_has_a_layer():
    for mod in MODULES:
        _layer(mod)


def test_no_import_points_upwards():
    bad = []
    for mod, deps in GRAPH.items():
        lm = _layer(mod)
        if lm is None:
            continue
        for dep in deps:
            ld = _layer(dep)
            if ld is not None and ld > lm:
                bad.append(f"{mod} (layer {lm}) imports {dep} (layer {ld})")
    assert not bad, "\n".join(sorted(bad))


def test_core_imports_no_other_layer():
    bad = [f"{m} imports {d}" for m in CORE for d in GRAPH[m] if d not in CORE and d != "halluscope"]
    assert not bad, bad


def test_every_package_folder_is_in_pyproject_and_has_a_layer():
    """A folder of the tree that holds Python files is a listed package with a layer: a new folder (a program
    folder, a new top-level package) forgotten in pyproject fails here, not silently in the wheel."""
    listed = set(SETUPTOOLS["packages"])
    for pkg, folder in FOLDERS.items():
        assert folder.is_dir(), f"{pkg}: no folder {folder}"
        for init in folder.rglob("__init__.py"):
            sub = ".".join([pkg, *init.parent.relative_to(folder).parts])
            assert sub in listed, f"{sub} ({init.parent.relative_to(ROOT)}) is not in pyproject's packages"
        for py in folder.rglob("*.py"):
            assert (py.parent / "__init__.py").is_file(), f"{py.relative_to(ROOT)}: its folder has no __init__.py"
    mapped = {f.relative_to(ROOT).parts[0] for f in FOLDERS.values()}
    for init in ROOT.glob("*/__init__.py"):  # every top-level package folder but the tests installs
        assert init.parent.name in mapped | {"tests"}, f"{init.parent.name}/ is not mapped in pyproject's package-dir"
    for pkg in FOLDERS:
        if pkg != "halluscope":
            _layer(pkg)
    assert sorted(p.name for p in (ROOT / "src" / "halluscope").iterdir() if p.suffix == ".py") == \
        ["__init__.py", "__main__.py"], "src/halluscope holds only the facade"


def _private_imports(mod: str, source: str) -> list[str]:
    """``from halluscope.<other package>... import _name`` in ``source`` (module ``mod``)."""
    top, bad = ".".join(mod.split(".")[:2]), []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.ImportFrom) and not node.level and (node.module or "").startswith("halluscope."):
            private = [a.name for a in node.names if a.name.startswith("_") and not a.name.startswith("__")]
            if private and ".".join(node.module.split(".")[:2]) != top:
                bad.append(f"{mod} imports {private} from {node.module}")
    return bad


def test_no_private_name_crosses_a_package():
    """``from halluscope.<package>.<module> import _name`` only inside the same top-level package: a helper
    another package needs is public (no reaching into ``tracking._experiment_id`` from elsewhere, #22)."""
    bad = [line for mod, path in MODULES.items() for line in _private_imports(mod, path.read_text(encoding="utf-8"))]
    assert not bad, "\n".join(bad)
    planted = "from halluscope.tracking.runs import _x, open_client\nfrom halluscope.serve.app import _y\n"
    assert _private_imports("halluscope.serve.openai_compat", planted) == [
        "halluscope.serve.openai_compat imports ['_x'] from halluscope.tracking.runs"]


#: the one module that may build a ``llama_cpp.Llama`` (the model factory, #33)
LLAMA_FACTORY = "halluscope.lm.llamacpp"


def _llama_constructions(mod: str, source: str) -> list[str]:
    """Where ``source`` (module ``mod``) imports ``Llama`` from llama_cpp or names ``<x>.Llama``: each a way to
    build a llama.cpp model without the factory's safe parameters."""
    bad = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.ImportFrom) and (node.module or "").split(".")[0] == "llama_cpp":
            if any(a.name in ("Llama", "*") for a in node.names):
                bad.append(f"{mod}:{node.lineno} imports Llama from {node.module}")
        elif isinstance(node, ast.Attribute) and node.attr == "Llama":
            bad.append(f"{mod}:{node.lineno} uses .Llama")
        elif isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id == "Llama":
            bad.append(f"{mod}:{node.lineno} calls Llama(...)")
    return sorted(bad)


def test_every_llama_cpp_model_is_built_by_the_factory():
    """No module but :mod:`halluscope.lm.llamacpp` builds a ``llama_cpp.Llama``: a model built elsewhere would get
    llama.cpp's default ``use_extra_bufts`` and crash on a CPU that advertises AMX in a VM that does not enable it
    (#33). Use ``halluscope.lm.llamacpp.load_llama``."""
    bad = [line for mod, path in MODULES.items() if mod != LLAMA_FACTORY
           for line in _llama_constructions(mod, path.read_text(encoding="utf-8"))]
    assert not bad, "\n".join(bad)
    assert _llama_constructions(LLAMA_FACTORY, MODULES[LLAMA_FACTORY].read_text(encoding="utf-8"))  # it does
    planted = ("from llama_cpp import Llama as L\nimport llama_cpp\nllama_cpp.Llama(model_path='x')\n"
               "Llama(model_path='y')\nfrom llama_cpp import LLAMA_POOLING_TYPE_NONE\n")
    assert _llama_constructions("m", planted) == ["m:1 imports Llama from llama_cpp", "m:3 uses .Llama",
                                                  "m:4 calls Llama(...)"]


def _cycle() -> list[str] | None:
    graph = {m: {d for d in deps if d != "halluscope"} for m, deps in GRAPH.items() if m != "halluscope"}
    state: dict[str, int] = {}
    stack: list[str] = []

    def visit(m):
        state[m] = 1
        stack.append(m)
        for d in sorted(graph.get(m, ())):
            if state.get(d) == 1:
                return stack[stack.index(d):] + [d]
            if d not in state:
                found = visit(d)
                if found:
                    return found
        state[m] = 2
        stack.pop()
        return None

    for m in sorted(graph):
        if m not in state:
            found = visit(m)
            if found:
                return found
    return None


def test_no_import_cycle():
    cycle = _cycle()
    assert cycle is None, " -> ".join(cycle)


def test_cycle_detector_finds_a_planted_cycle():
    GRAPH["halluscope.core.contract"].add("halluscope.core.text")  # text imports contract: a loop
    try:
        assert _cycle() is not None
    finally:
        GRAPH["halluscope.core.contract"].discard("halluscope.core.text")


@pytest.mark.parametrize("mod", sorted(CORE & set(MODULES)))
def test_core_module_imports_alone(mod):
    """In a fresh interpreter, importing a core module loads none of the layers above it."""
    code = (f"import sys, {mod}\n"
            "above = sorted(m for m in sys.modules if m.startswith(('halluscope.programs', 'halluscope.optimize', "
            "'halluscope.metrics', 'halluscope.loaders', 'halluscope.cli', 'halluscope.artifacts.store')))\n"
            "print(above); sys.exit(1 if above else 0)")
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stdout + proc.stderr


def test_public_api_names_resolve():
    for name in halluscope.__all__:
        assert getattr(halluscope, name) is not None, name
    assert halluscope.get_program("mark-all").name == "mark-all"
    with pytest.raises(AttributeError, match="no attribute 'nope'"):
        halluscope.nope  # noqa: B018


def test_no_public_name_is_shadowed_by_a_submodule():
    """Importing ``halluscope.<x>`` sets the attribute ``x`` on the package: a submodule named like a public
    function would replace it (``halluscope.detect`` the module instead of ``detect`` the function)."""
    import pkgutil

    submodules = {m.name for m in pkgutil.iter_modules(halluscope.__path__)}
    assert not submodules & set(halluscope.__all__), submodules & set(halluscope.__all__)


def test_only_halluscope_is_a_top_level_package():
    assert {p.split(".")[0] for p in SETUPTOOLS["packages"]} == {"halluscope"}
    assert set(SETUPTOOLS["package-dir"]) <= set(SETUPTOOLS["packages"])
    for pkg in SETUPTOOLS["package-dir"]:  # folder = import path: halluscope.X lives in X/
        if pkg != "halluscope":
            assert SETUPTOOLS["package-dir"][pkg] == pkg.split(".", 1)[1].replace(".", "/"), pkg


BUNDLED = SETUPTOOLS["package-data"]["halluscope.compiled"]  # the served artifacts the wheel ships


def _tree_files() -> set[str]:
    """Where each file of the package folders lands in the wheel: ``programs/spans/program.py`` ->
    ``halluscope/programs/spans/program.py``; the web page's static files are package data."""
    out = set()
    for pkg, folder in FOLDERS.items():
        for path in folder.rglob("*"):
            rel = path.relative_to(folder)
            if path.is_file() and "__pycache__" not in rel.parts and (path.suffix == ".py" or (
                    rel.parts[0] == "static" and pkg == "halluscope.serve" and path.suffix in (".html", ".js", ".css"))
                    or (pkg == "halluscope.compiled" and any(rel.match(g) for g in BUNDLED))):
                out.add("/".join([*pkg.split("."), *rel.parts]))
    return out


def test_wheel_holds_exactly_the_tree(tmp_path):
    """``pip wheel .`` builds a wheel whose files are exactly the package folders' files: a folder forgotten in
    pyproject (its files missing) or a file from outside them fails here. Only ``halluscope`` and its dist-info
    land in site-packages."""
    import shutil
    import zipfile

    src = tmp_path / "src-copy"  # a copy: setuptools leaves a build/ folder in the tree it builds
    src.mkdir()
    for name in ("pyproject.toml", "README.md"):
        shutil.copy(ROOT / name, src / name)
    for folder in {f.relative_to(ROOT).parts[0] for f in FOLDERS.values()}:
        shutil.copytree(ROOT / folder, src / folder, ignore=shutil.ignore_patterns("__pycache__"))
    # a developer's checkout keeps the egg-info of its editable install; its SOURCES.txt still names an artifact
    # that is no longer served: only the package-data lists may decide what ships
    unserved = next(p for p in sorted((ROOT / "compiled").rglob("*.json"))
                    if not any(p.relative_to(ROOT / "compiled").match(g) for g in BUNDLED))
    (src / "halluscope.egg-info").mkdir()
    (src / "halluscope.egg-info" / "SOURCES.txt").write_text(f"pyproject.toml\n{unserved.relative_to(ROOT).as_posix()}\n")
    proc = subprocess.run([sys.executable, "-m", "pip", "wheel", "--no-deps", "--quiet", "-w", str(tmp_path),
                           str(src)], capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-2000:]
    (wheel,) = tmp_path.glob("halluscope-*.whl")
    names = zipfile.ZipFile(wheel).namelist()
    top = {n.split("/", 1)[0] for n in names}
    assert top == {"halluscope", next(t for t in top if t.endswith(".dist-info"))}, top
    in_wheel = {n for n in names if n.startswith("halluscope/")}
    tree = _tree_files()
    assert not tree - in_wheel, f"in the tree, not in the wheel (a package missing from pyproject?): " \
                                f"{sorted(tree - in_wheel)[:20]}"
    assert not in_wheel - tree, f"in the wheel, not in the package folders: {sorted(in_wheel - tree)[:20]}"
    for name in ("index.html", "app.js", "style.css"):  # the web page of halluscope serve (package data)
        assert f"halluscope/serve/static/{name}" in names, name


def test_cli_runs_from_another_directory_and_writes_there(tmp_path):
    """Outputs land under the working directory (or $HALLUSCOPE_HOME), never next to the package."""
    import os

    from halluscope.loaders.demo import write_demo_data

    data = write_demo_data(tmp_path / "data")
    work = tmp_path / "work"
    work.mkdir()
    env = {k: v for k, v in os.environ.items() if not k.startswith("HALLUSCOPE_")}
    proc = subprocess.run([sys.executable, "-m", "halluscope", "evaluate", "--program", "mark-all", "--lang", "de",
                           "--data-dir", str(data), "--no-mlflow", "--no-progress"],
                          cwd=work, env=env, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
    written = list((work / "outputs").rglob("mark-all.submission.jsonl"))
    assert len(written) == 1
    assert not (ROOT / "src" / "halluscope" / "outputs").exists()


def test_the_docs_list_the_same_layers_as_pyproject():
    """docs/architecture.md's table names every package folder with the layer pyproject gives it, and no other."""
    import re

    text = (ROOT / "docs" / "architecture.md").read_text(encoding="utf-8")
    documented = {}
    for layer, folders in re.findall(r"(?m)^\| (\d) \| ((?:`[\w/]+/`(?:, )?)+) \|", text):
        for folder in re.findall(r"`(\w+)/`", folders):
            documented[f"halluscope.{folder}"] = int(layer)
    assert documented == LAYER_OF_PACKAGE
    assert set(LAYER_OF_PACKAGE) == set(SETUPTOOLS["package-dir"]) - {"halluscope"}
