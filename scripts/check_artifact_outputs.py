"""Digest of what every served ``grounded`` artifact's ``detect`` says on the Mu-SHROOM validation items, to check
that a refactor leaves the artifacts' output byte-identical.

For each key of ``compiled/grounded/`` the version ``load_compiled`` serves (``--all-versions``: every version not
retired) is loaded through the library path (:func:`halluscope.artifacts.store.load_compiled`) and run with
:func:`halluscope.artifacts.compiled.detect` over the validation items of its language (contexts from
``context/val/native``, the generator's tokens and logits passed along); ``all`` and the HalluClean task keys (qa,
dialogue, summarization) run on the first ``--per-lang`` items of every language. Each output is
``Detection.to_json()``; the file written has one line per artifact, ``<key>/<metric>/v<N> <items> <sha256>``, and
with ``--items`` one line per item too. Run it before and after a change and compare the files::

    taskset -c 1 python scripts/check_artifact_outputs.py --data ../shared/data/mushroom --out before.txt
    ... change ...
    taskset -c 1 python scripts/check_artifact_outputs.py --data ../shared/data/mushroom --out after.txt
    cmp before.txt after.txt

``--code DIR`` runs another checkout's code (e.g. ``git worktree add /tmp/base <commit>``) with this environment's
packages: the ``halluscope`` package folders are taken from ``DIR`` (its pyproject ``package-dir``).
"""

from __future__ import annotations

import argparse
import hashlib
import sys
from pathlib import Path


def use_code(root: Path) -> None:
    """Import ``halluscope`` from the checkout ``root`` instead of the installed one (must run before any import)."""
    import importlib.abc
    import importlib.util
    import tomllib

    dirs = tomllib.loads((root / "pyproject.toml").read_text())["tool"]["setuptools"]["package-dir"]
    mapping = {pkg: (root / d).resolve() for pkg, d in dirs.items()}

    class Finder(importlib.abc.MetaPathFinder):
        def find_spec(self, fullname, path=None, target=None):
            parts = fullname.split(".")
            for n in range(len(parts), 0, -1):
                base = ".".join(parts[:n])
                if base in mapping:
                    folder = mapping[base].joinpath(*parts[n:])
                    if (folder / "__init__.py").is_file():
                        return importlib.util.spec_from_file_location(fullname, folder / "__init__.py",
                                                                      submodule_search_locations=[str(folder)])
                    if folder.with_suffix(".py").is_file():
                        return importlib.util.spec_from_file_location(fullname, folder.with_suffix(".py"))
                    return None
            return None

    sys.meta_path.insert(0, Finder())


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--data", default="../shared/data/mushroom", help="the Mu-SHROOM data root")
    ap.add_argument("--out", required=True, help="the digest file to write")
    ap.add_argument("--limit", type=int, default=0, help="items per language for a language's own artifact (0: all)")
    ap.add_argument("--per-lang", type=int, default=5, help="items per language for 'all' and the task keys")
    ap.add_argument("--keys", default="", help="comma-separated keys to check (default: every grounded key)")
    ap.add_argument("--all-versions", action="store_true", help="every version, not only the served one")
    ap.add_argument("--items", action="store_true", help="also write one digest line per item")
    ap.add_argument("--code", default="", help="a checkout whose halluscope code to run")
    args = ap.parse_args(argv)
    if args.code:
        use_code(Path(args.code))

    from halluscope.artifacts.compiled import detect
    from halluscope.artifacts.store import list_versions, load_compiled, retired_reason
    from halluscope.loaders.mushroom import VAL_LANGS, load_mushroom
    import halluscope.compiled

    root = Path(halluscope.compiled.__file__).parent  # the bundled store of the code that runs
    items: dict[str, list] = {}

    def val(lang: str, n: int) -> list:
        if lang not in items:
            items[lang] = load_mushroom(args.data, lang=lang, split="val", context="native")
        return items[lang][:n] if n else items[lang]

    keys = [k for k in args.keys.split(",") if k] or sorted(p.name for p in (root / "grounded").iterdir() if p.is_dir())
    lines = []
    for key in keys:
        for mdir in sorted(p for p in (root / "grounded" / key).iterdir() if p.is_dir()):
            metric = mdir.name
            if args.all_versions:
                versions = [v.version for v in list_versions("grounded", key, metric, root=root)
                            if not retired_reason(v.path)]
            else:
                versions = [load_compiled("grounded", lang=key, metric=metric, root=root).version]
            for version in versions:
                det = load_compiled("grounded", lang=key, metric=metric, version=version, root=root)
                exs = val(key, args.limit) if key in VAL_LANGS else \
                    [ex for lang in VAL_LANGS for ex in val(lang, args.per_lang)]
                total = hashlib.sha256()
                for ex in exs:
                    out = detect(det, ex.answer, question=ex.get("question", ""), context=ex.get("context", ""),
                                 lang=ex.lang, model_output_tokens=ex.get("model_output_tokens"),
                                 model_output_logits=ex.get("model_output_logits")).to_json()
                    total.update(out.encode() + b"\n")
                    if args.items:
                        lines.append(f"  {key}/{metric}/v{version:04d} {ex.get('id')} "
                                     f"{hashlib.sha256(out.encode()).hexdigest()[:16]}")
                lines.append(f"{key}/{metric}/v{version:04d} {len(exs)} {total.hexdigest()}")
                print(lines[-1], flush=True)
    Path(args.out).write_text("\n".join(lines) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
