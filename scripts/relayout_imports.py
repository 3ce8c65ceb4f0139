"""Rewrite pre-#22 halluscope module paths to the folder = import path layout (a merge helper for #22).

    python scripts/relayout_imports.py $(git diff --name-only main...BRANCH -- '*.py' '*.md')

Code written against the old layout (``halluscope.contract``, ``halluscope.lm``, ``halluscope.optimize.tracking``,
``halluscope.programs.span_detector``, ``from halluscope import paths``, ...) names the module where it now lives
(``halluscope.core.contract``, ``halluscope.lm.models``, ``halluscope.tracking.runs``,
``halluscope.programs.spans.program``, ``from halluscope.core import paths``). Idempotent: a path already in the
new layout (``halluscope.lm.models``, ``halluscope.programs.finch.sampling``) is left alone. Prints the files it
changed. Run it on the files a pre-#22 branch changed, not on the whole tree: a bare ``halluscope.lm`` or
``halluscope.artifacts`` (a string, a comment) was a module then and is a package now, and is rewritten as the old
module. Review the result: a name that moved inside a module (finch's scoring and sampling helpers are no longer
in ``finch.program``) is not this script's business.
"""

from __future__ import annotations

import re
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

MOVED = {
    "contract": "core.contract", "text": "core.text", "literals": "core.literals", "paths": "core.paths",
    "redact": "core.redact", "parallel": "core.parallel", "tasks": "core.tasks", "decisions": "core.decisions",
    "retrieval": "core.retrieval", "files": "core.fileio",
    "lm_server": "lm.openai_client", "lm": "lm.models", "testing": "lm.scripted",
    "artifacts": "artifacts.store", "detector": "artifacts.compiled",
    "runner": "evaluation.runner", "scale": "evaluation.scale",
    "model_registry": "tracking.model_registry", "mlflow_model": "tracking.mlflow_model",
    "optimize.tracking": "tracking.runs", "optimize.tracing": "tracking.traces", "optimize.compare": "tracking.views",
    "programs.span_detector": "programs.spans.program", "programs.halluclean": "programs.halluclean.program",
    "programs.finch": "programs.finch.program", "programs.jointcq_align": "programs.jointcq.align",
    "programs.jointcq_filter": "programs.jointcq.demo_filter", "programs.jointcq": "programs.jointcq.program",
    "programs.medico_ensemble": "programs.medico.ensemble", "programs.medico": "programs.medico.program",
    "programs.baselines": "programs.baselines.program", "programs.grounded.detector": "programs.grounded.program",
    "loaders.registry": "loaders.dataset_registry",
}
# `from halluscope import X` for a module X that moved
FROM = {"paths": ("core", "paths"), "artifacts": ("artifacts", "store"), "lm": ("lm", "models"),
        "runner": ("evaluation", "runner"), "redact": ("core", "redact"), "contract": ("core", "contract"),
        "text": ("core", "text"), "decisions": ("core", "decisions"), "testing": ("lm", "scripted")}

_PATH = re.compile(r"\bhalluscope\.(" + "|".join(re.escape(k) for k in sorted(MOVED, key=len, reverse=True))
                   + r")(?![\w])(\.\w+)?")
_FROM = re.compile(r"from halluscope import (" + "|".join(FROM) + r")\b( as \w+)?(?=\s*(#|$|\)))", re.M)


def _submodule_exists(dotted: str) -> bool:
    """Whether ``halluscope.<dotted>`` is a module or package of the new layout (its folder in the tree)."""
    parts = dotted.split(".")
    base = ROOT.joinpath(*parts)
    return base.with_suffix(".py").is_file() or (base / "__init__.py").is_file()


_IMPORTED = re.compile(r"\s+import\s+\(?\s*(\w+)")


def _path(m: re.Match) -> str:
    old, rest = m.group(1), m.group(2) or ""
    if rest and _submodule_exists(old + rest):  # already the new layout (halluscope.lm.models, ...finch.sampling)
        return m.group(0)
    imported = _IMPORTED.match(m.string, m.end())
    if not rest and imported and _submodule_exists(f"{old}.{imported.group(1)}"):
        return m.group(0)  # from halluscope.lm import models: the new layout too
    return f"halluscope.{MOVED[old]}{rest}"


def _from(m: re.Match) -> str:
    pkg, mod = FROM[m.group(1)]
    alias = m.group(2) or (f" as {m.group(1)}" if mod != m.group(1) else "")
    return f"from halluscope.{pkg} import {mod}{alias}"


def rewrite(text: str) -> str:
    return _FROM.sub(_from, _PATH.sub(_path, text))


def main(argv: list[str]) -> int:
    for name in argv:
        path = Path(name)
        if not path.is_file():
            continue
        old = path.read_text(encoding="utf-8")
        new = rewrite(old)
        if new != old:
            path.write_text(new, encoding="utf-8")
            print(name)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
