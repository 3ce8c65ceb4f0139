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

``--write-fixture PATH`` writes the small CI version instead: the handful of answers of :data:`FIXTURE_ITEMS`
(numbers in other formats, a substituted name, a negation, evidence in another script, no evidence, no units,
generator logits, Chinese) and the digest of every served artifact's outputs on them, which
``tests/test_grounded_signals.py`` recomputes (run it with the code before a change, ``--code``).

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


#: the CI fixture's answers: each exercises a signal or a fallback (the logits are the generator's, made up)
FIXTURE_ITEMS = [
    {"id": "numbers", "lang": "en", "question": "How long is the Seine and where does it rise?",
     "answer": "The Seine is 777 kilometres long and rises at Source-Seine in 1864.",
     "context": "The Seine (777 km) rises at Source-Seine, northwest of Dijon. Its source was bought by Paris in 1864."},
    {"id": "substitution", "lang": "en", "question": "Where is the Eiffel Tower?",
     "answer": "The Eiffel Tower is in Berlin. It was not built in 1889.",
     "context": "The Eiffel Tower is a wrought-iron tower in Paris. It was built in 1889 for the World's Fair.",
     "model_output_tokens": ["The", " Eiffel", " Tower", " is", " in", " Berlin", ".", " It", " was", " not", " built",
                             " in", " 1889", "."],
     "model_output_logits": [9.1, 12.0, 15.2, 8.8, 7.5, 3.1, 10.0, 6.2, 7.7, 2.5, 8.1, 9.0, 4.2, 11.0]},
    {"id": "supported", "lang": "de", "question": "Welche Hauptstadt hat Frankreich?",
     "answer": "Die Hauptstadt von Frankreich ist Paris, mit 2,1 Millionen Einwohnern.",
     "context": "Paris ist die Hauptstadt Frankreichs und hat rund 2,1 Mio. Einwohner."},
    {"id": "other-script", "lang": "en", "question": "Population of Tokyo?",
     "answer": "Tokyo had 14 million people in 2020.", "context": "东京在2020年有1400万人口。"},
    {"id": "no-evidence", "lang": "en", "question": "Who wrote Faust?", "answer": "Goethe wrote Faust in 1808.",
     "context": ""},
    {"id": "no-units", "lang": "en", "question": "?", "answer": "?!", "context": "Anything."},
    {"id": "chinese", "lang": "zh", "question": "长城有多长？", "answer": "长城全长约21196公里，始建于秦朝。",
     "context": "长城总长度为21196.18千米，始建于春秋战国时期。"},
    {"id": "long", "lang": "en", "question": "Tell me about Marie Curie.",
     "answer": "Marie Curie was a Polish physicist. She won two Nobel Prizes. She was born in Warsaw in 1867 and "
               "died in 1934 in France.",
     "context": "Marie Skłodowska-Curie (born 7 November 1867 in Warsaw, died 4 July 1934) was a Polish and "
                "naturalised-French physicist and chemist. She was the first person to win a Nobel Prize twice."},
]


def served(root: Path, installed: set[str] | None = None) -> list[tuple[str, str, int]]:
    """``(key, metric, version)`` of every grounded artifact ``load_compiled`` serves from the store ``root`` (with
    what is installed; ``installed``: as if exactly these optional extras were)."""
    from halluscope.artifacts.store import best_version, list_versions

    out = []
    for kdir in sorted(p for p in (root / "grounded").iterdir() if p.is_dir()):
        for mdir in sorted(p for p in kdir.iterdir() if p.is_dir()):
            best = best_version(list_versions("grounded", kdir.name, mdir.name, root=root), installed=installed)
            if best is not None:
                out.append((kdir.name, mdir.name, best.version))
    return out


def _rounded(x, places: int = 9):
    if isinstance(x, float):
        return round(x, places)
    if isinstance(x, dict):
        return {k: _rounded(v, places) for k, v in x.items()}
    if isinstance(x, list):
        return [_rounded(v, places) for v in x]
    return x


def stable_json(text: str) -> str:
    """A detect output's JSON with every float rounded to 9 decimals: the last-bit differences between numpy
    versions (a fresh install on another Python resolves a newer numpy; an unrounded score then differs in its 16th
    digit) do not count, any real change does."""
    import json
    return json.dumps(_rounded(json.loads(text)), ensure_ascii=False)


def fixture_digests(items: list[dict], root: Path) -> dict[str, str]:
    """``{"<key>/<metric>/v<N>": sha256}`` of the ``detect`` outputs on ``items`` (:func:`stable_json`) of every
    artifact served where no optional extra is installed (the versions that need one, ``grounded`` with the
    encoder's torch model, are left out: their floats depend on the machine's torch kernels)."""
    from halluscope.artifacts.compiled import detect
    from halluscope.artifacts.store import load_compiled

    out = {}
    for key, metric, version in served(root, installed=set()):
        det = load_compiled("grounded", lang=key, metric=metric, version=version, root=root)
        h = hashlib.sha256()
        for it in items:
            extra = {k: it[k] for k in ("model_output_tokens", "model_output_logits") if k in it}
            h.update(stable_json(detect(det, it["answer"], question=it["question"], context=it["context"],
                                        lang=it["lang"], **extra).to_json()).encode() + b"\n")
        out[f"{key}/{metric}/v{version:04d}"] = h.hexdigest()
    return out


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--data", default="../shared/data/mushroom", help="the Mu-SHROOM data root")
    ap.add_argument("--out", default="", help="the digest file to write")
    ap.add_argument("--write-fixture", default="", help="write the CI fixture (items and digests) here instead")
    ap.add_argument("--limit", type=int, default=0, help="items per language for a language's own artifact (0: all)")
    ap.add_argument("--per-lang", type=int, default=5, help="items per language for 'all' and the task keys")
    ap.add_argument("--keys", default="", help="comma-separated keys to check (default: every grounded key)")
    ap.add_argument("--all-versions", action="store_true", help="every version, not only the served one")
    ap.add_argument("--retired", action="store_true", help="with --all-versions, the retired versions too (the "
                    "hidden-state ones run the embedded LM over every item)")
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
    if args.write_fixture:
        import json
        Path(args.write_fixture).write_text(json.dumps({"items": FIXTURE_ITEMS,
                                                        "digests": fixture_digests(FIXTURE_ITEMS, root)},
                                                       ensure_ascii=False, indent=1) + "\n", encoding="utf-8")
        return 0
    if not args.out:
        ap.error("give --out (the digest file) or --write-fixture")
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
                            if args.retired or not retired_reason(v.path)]
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
