"""MEDICO retrieval benchmark: one knowledge base from ALL items' reference texts pooled, retrieval must find
each item's own passage among the others. No LM is used.

    .venv/bin/python scripts/bench_medico.py --dataset halluclean --task qa --data-dir ../shared/data/halluclean
    .venv/bin/python scripts/bench_medico.py --dataset halluclean --task dialogue --data-dir ../shared/data/halluclean
    .venv/bin/python scripts/bench_medico.py --dataset mushroom --lang en --data-dir ../shared/data/mushroom

It writes the pooled corpus (``outputs/medico/<name>.corpus.jsonl``), builds the index with the same code as
``halluscope index build`` (``outputs/medico/<name>-kb``, reused when unchanged) and prints hit rate@k and MRR
(reciprocal rank of the item's own document among all passages, 0 when it is not retrieved at all), querying
with the question (HalluClean QA: the question; dialogue: the dialogue history; Mu-SHROOM: the model input).
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

from halluscope.core.fileio import write_text_atomic
from halluscope.retrievers.kb import KBRetriever, build_index

FILES = {"qa": ("QA.dev.json", "question"), "dialogue": ("DA.dev.json", "dialogue_history")}


def halluclean_items(data_dir: Path, task: str) -> list[tuple[str, str, str]]:
    """(doc id, reference text, query) per item, items with the same reference text merged to one document."""
    name, qfield = FILES[task]
    recs = json.loads((data_dir / name).read_text(encoding="utf-8"))
    return [(f"{task}-{i}", r["knowledge"], r[qfield]) for i, r in enumerate(recs)]


def mushroom_items(data_dir: Path, lang: str, context: str) -> list[tuple[str, str, str]]:
    out = []
    with open(data_dir / "val" / f"mushroom.{lang}-val.v2.extra.jsonl", encoding="utf-8") as f:
        for line in f:
            r = json.loads(line)
            ctx = data_dir / "context" / "val" / context / lang / f"{r['id']}.context.txt"
            if ctx.is_file() and ctx.read_text(encoding="utf-8").strip():
                out.append((r["id"], ctx.read_text(encoding="utf-8"), r["model_input"]))
    return out


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--dataset", choices=["halluclean", "mushroom"], default="halluclean")
    ap.add_argument("--task", choices=list(FILES), default="qa")
    ap.add_argument("--lang", default="en")
    ap.add_argument("--context", default="native", choices=["native", "translated-en"])
    ap.add_argument("--data-dir", required=True)
    ap.add_argument("--k", type=int, default=5)
    ap.add_argument("--out", default="outputs/medico")
    args = ap.parse_args(argv)
    data = Path(args.data_dir)
    if args.dataset == "halluclean":
        items, name = halluclean_items(data, args.task), f"halluclean-{args.task}"
    else:
        items, name = mushroom_items(data, args.lang, args.context), f"mushroom-{args.lang}-{args.context}"
    # identical reference texts (HaluEval repeats some) are one document; every item owning it counts as a hit
    doc_of_text: dict[str, str] = {}
    for doc, text, _ in items:
        doc_of_text.setdefault(text, doc)
    out = Path(args.out)
    corpus = out / f"{name}.corpus.jsonl"
    write_text_atomic(corpus, "".join(json.dumps({"id": d, "text": t}, ensure_ascii=False) + "\n"
                                      for t, d in doc_of_text.items()))
    t0 = time.time()
    built = build_index(corpus, out / f"{name}-kb")
    t_build = time.time() - t0
    kb = KBRetriever(built.folder)
    hits, rr = 0, 0.0
    t0 = time.time()
    for _, text, query in items:
        want = doc_of_text[text]
        ranked = kb.retrieve(query, k=len(kb.index))
        docs = list(dict.fromkeys(e.id.rsplit("#", 1)[0] for e in ranked))
        rank = docs.index(want) + 1 if want in docs else None
        hits += bool(rank and rank <= args.k)
        rr += 1.0 / rank if rank else 0.0
    t_query = time.time() - t0
    n = len(items)
    print(json.dumps({"corpus": name, "items": n, "documents": built.documents, "passages": built.passages,
                      f"hit@{args.k}": round(hits / n, 4), "mrr": round(rr / n, 4),
                      "index": str(built.folder), "reused": built.reused, "build_s": round(t_build, 2),
                      "query_ms": round(1000 * t_query / n, 2)}))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
