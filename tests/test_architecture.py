"""The house rules of the package, checked on the source: one namespace, layers without loops.

The import graph is read from the source with ``ast`` (every ``import``/``from ... import`` of a
``halluscope`` module, at any depth in the file), so a local import inside a function counts too.
"""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

import pytest

import halluscope

ROOT = Path(__file__).resolve().parent.parent

# package -> folder in the repository (pyproject's package-dir)
FOLDERS = {
    "halluscope": ROOT / "src" / "halluscope",
    "halluscope.signatures": ROOT / "signatures",
    "halluscope.programs": ROOT / "programs",
    "halluscope.programs.grounded": ROOT / "programs" / "grounded",
    "halluscope.metrics": ROOT / "metrics",
    "halluscope.loaders": ROOT / "loaders",
    "halluscope.optimize": ROOT / "optimize",
    "halluscope.retrievers": ROOT / "retrievers",
}

# The layers, bottom up: a module may import its own layer and the layers below, never above.
CORE = {"halluscope.contract", "halluscope.text", "halluscope.lm", "halluscope.lm_server", "halluscope.files", "halluscope.literals", "halluscope.paths", "halluscope.redact",
        "halluscope.parallel", "halluscope.retrieval", "halluscope.tasks", "halluscope.testing",
        "halluscope.decisions"}
LAYER_OF_PACKAGE = {
    "halluscope.signatures": 1,
    "halluscope.programs": 2,
    "halluscope.programs.grounded": 2,
    "halluscope.metrics": 2,
    "halluscope.loaders": 2,
    "halluscope.retrievers": 2,
    "halluscope.optimize": 3,
    "halluscope.cli": 4,
    "halluscope.serve": 4,  # the HTTP server: built on the roof (detector, artifacts); the CLI starts it
}
ABOVE = {  # roof modules in src/halluscope
    "halluscope.runner": 3, "halluscope.detector": 3, "halluscope.artifacts": 3,
    "halluscope.model_registry": 3, "halluscope.mlflow_model": 3,
    "halluscope.scale": 3,
}


def _modules() -> dict[str, Path]:
    mods = {}
    for pkg, folder in FOLDERS.items():
        for path in folder.rglob("*.py"):
            rel = path.relative_to(folder).with_suffix("")
            parts = [p for p in rel.parts if p != "__init__"]
            mods[".".join([pkg, *parts])] = path
    return mods


MODULES = _modules()


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
    if mod in CORE:
        return 0
    if mod in ABOVE:
        return ABOVE[mod]
    for pkg, layer in LAYER_OF_PACKAGE.items():
        if mod == pkg or mod.startswith(pkg + "."):
            return layer
    raise AssertionError(f"{mod} is in no layer: add it to CORE, ABOVE or LAYER_OF_PACKAGE in this test")


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


def test_core_imports_no_programs_optimize_metrics_loaders_or_cli():
    banned = ("halluscope.programs", "halluscope.optimize", "halluscope.metrics", "halluscope.loaders",
              "halluscope.cli", "halluscope.signatures")
    bad = [f"{m} imports {d}" for m in CORE & set(GRAPH) for d in GRAPH[m] if d.startswith(banned)]
    assert not bad, bad


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
    GRAPH["halluscope.contract"].add("halluscope.text")  # text imports contract: a loop
    try:
        assert _cycle() is not None
    finally:
        GRAPH["halluscope.contract"].discard("halluscope.text")


@pytest.mark.parametrize("mod", sorted(CORE & set(MODULES)))
def test_core_module_imports_alone(mod):
    """In a fresh interpreter, importing a core module loads none of the layers above it."""
    code = (f"import sys, {mod}\n"
            "above = sorted(m for m in sys.modules if m.startswith(('halluscope.programs', 'halluscope.optimize', "
            "'halluscope.metrics', 'halluscope.loaders', 'halluscope.cli', 'halluscope.artifacts')))\n"
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
    import tomllib

    cfg = tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))["tool"]["setuptools"]
    assert {p.split(".")[0] for p in cfg["packages"]} == {"halluscope"}
    assert set(cfg["package-dir"]) <= set(cfg["packages"])
    for pkg, folder in FOLDERS.items():
        assert cfg["package-dir"][pkg] == str(folder.relative_to(ROOT))
    found = {str(p.parent.relative_to(ROOT / "src")).replace("/", ".") for p in (ROOT / "src").rglob("__init__.py")}
    missing = {p for p in found if p not in cfg["packages"]}
    assert not missing, f"subpackages not listed in pyproject: {missing}"


def test_wheel_installs_only_the_halluscope_package(tmp_path):
    """``pip install .`` (not editable) puts only ``halluscope`` and its dist-info into site-packages."""
    import zipfile

    import shutil

    src = tmp_path / "src-copy"  # a copy: setuptools leaves a build/ folder in the tree it builds
    src.mkdir()
    for name in ("pyproject.toml", "README.md"):
        shutil.copy(ROOT / name, src / name)
    for folder in {f.relative_to(ROOT).parts[0] for f in FOLDERS.values()}:
        shutil.copytree(ROOT / folder, src / folder, ignore=shutil.ignore_patterns("__pycache__"))
    proc = subprocess.run([sys.executable, "-m", "pip", "wheel", "--no-deps", "--quiet", "-w", str(tmp_path),
                           str(src)], capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-2000:]
    (wheel,) = tmp_path.glob("halluscope-*.whl")
    names = zipfile.ZipFile(wheel).namelist()
    top = {n.split("/", 1)[0] for n in names}
    assert top == {"halluscope", next(t for t in top if t.endswith(".dist-info"))}, top
    for sub in ("cli", "programs", "signatures", "metrics", "loaders", "optimize"):
        assert f"halluscope/{sub}/__init__.py" in names, sub
    assert not any(n.startswith("halluscope/tests") for n in names)
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
