"""``halluscope index build``: a BM25 knowledge-base index for MEDICO's ``kb`` source, built once, reused.

    halluscope index build docs/ --out indexes/docs          # a folder of .txt/.md/.pdf/.docx files
    halluscope index build corpus.jsonl --out indexes/wiki   # one {"id", "text"} object a line
    halluscope evaluate --program medico -O sources=kb -O kb=indexes/docs ...

Running it again on an unchanged corpus reuses the index (same content hash); ``--force`` rebuilds.
"""

from __future__ import annotations

import sys

from halluscope.cli.common import POSITIVE_INT, ranged
from halluscope.programs.registry import number
from halluscope.retrievers.kb import build_index


def add_parser(subparsers) -> None:
    i = subparsers.add_parser("index", help="build a knowledge-base index (BM25 over ≤256-token passages)")
    isub = i.add_subparsers(dest="index_command", required=True)
    b = isub.add_parser("build", help="index a folder of documents or a JSONL of {id, text} documents",
                        description="Index a folder of documents (.txt/.md/.pdf/.docx) or a JSONL file of "
                                    "{id, text} documents for MEDICO's kb source.")
    b.add_argument("source", help="a folder (.txt/.md/.pdf/.docx, recursively) or a .jsonl file of {id, text}")
    b.add_argument("--out", required=True, help="index folder to write (reused when the corpus is unchanged)")
    b.add_argument("--max-tokens", type=POSITIVE_INT, default=256, help="passage length in tokens (default 256)")
    b.add_argument("--max-mb", type=ranged(number(0, 10**6, lo_open=True)), default=20.0, help="size limit per file in MB (default 20)")
    b.add_argument("--force", action="store_true", help="rebuild even when the corpus is unchanged")
    b.set_defaults(func=cmd_index_build)


def cmd_index_build(args) -> int:
    try:
        result = build_index(args.source, args.out, max_tokens=args.max_tokens, max_mb=args.max_mb, force=args.force)
    except (OSError, ValueError) as e:
        print(f"halluscope index build: {e}", file=sys.stderr)
        return 2
    for path, why in result.skipped:
        print(f"skipped {path}: {why}", file=sys.stderr)
    verb = "reused (corpus unchanged)" if result.reused else "built"
    print(f"index {verb}: {result.folder} — {result.documents} documents, {result.passages} passages, "
          f"{len(result.skipped)} skipped, content hash {result.hash[:12]}")
    return 0
