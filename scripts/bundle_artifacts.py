"""Write (or ``--check``) the list of artifacts the wheel ships: pyproject.toml's package data of
``halluscope.compiled``, one served-by-default version per program/language-or-task/metric of ``compiled/``.

    python scripts/bundle_artifacts.py            # rewrite the list after committing or retiring a version
    python scripts/bundle_artifacts.py --check    # exit 1 when the list is stale (tests/test_bundled_artifacts.py)
"""

from __future__ import annotations

import argparse
import re
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
BEGIN = '"halluscope.compiled" = [  # served default artifacts: python scripts/bundle_artifacts.py writes this list'
END = "]  # end of the bundled artifacts"


def served(root: Path = ROOT / "compiled") -> list[str]:
    """``program/key/metric/vNNNN`` of every version served by default under ``root``: with no optional extra
    installed and with every one (so a wheel serves the best version whatever its user installs, and the list does
    not depend on what is installed where it is written)."""
    from halluscope.artifacts.store import best_version, list_versions
    from halluscope.programs.registry import extra_names

    out = []
    for metric_dir in sorted(p for p in root.glob("*/*/*") if p.is_dir()):
        program, key, metric = metric_dir.relative_to(root).parts
        versions = list_versions(program, key, metric, root=root)
        for installed in (set(), set(extra_names())):
            best = best_version(versions, installed=installed)
            if best is not None and f"{program}/{key}/{metric}/{best.name}" not in out:
                out.append(f"{program}/{key}/{metric}/{best.name}")
    return out


def block(versions: list[str], root: Path = ROOT / "compiled") -> str:
    """The package-data block: each version's JSON files, and the weights files of those that have them."""
    lines = [BEGIN, *(f'    "{v}/*.json",' for v in versions),
             *(f'    "{v}/*.safetensors",' for v in versions if any((root / v).glob("*.safetensors"))), END]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--check", action="store_true", help="fail when pyproject's list differs from what is served")
    args = ap.parse_args(argv)
    pyproject = ROOT / "pyproject.toml"
    text = pyproject.read_text(encoding="utf-8")
    pattern = re.compile(re.escape(BEGIN) + r".*?" + re.escape(END), re.S)
    if not pattern.search(text):
        print(f"pyproject.toml has no bundled-artifacts block starting {BEGIN!r}", file=sys.stderr)
        return 2
    want = block(served())
    if pattern.search(text).group(0) == want:
        print("pyproject.toml's bundled artifacts are up to date")
        return 0
    if args.check:
        print("pyproject.toml's bundled artifacts are stale: run python scripts/bundle_artifacts.py", file=sys.stderr)
        return 1
    pyproject.write_text(pattern.sub(lambda _: want, text), encoding="utf-8")
    print(f"wrote {len(served())} bundled artifacts into pyproject.toml")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
