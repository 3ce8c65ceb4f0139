"""FINCH-ZK: hand-computed scoring and round-robin cases, and scripted-LM tests of the whole program."""

from __future__ import annotations

import dspy
import pytest

from halluscope.lm.scripted import scripted_lm
from halluscope.core.text import Segment, segment
from halluscope.programs.finch.program import FinchZK
from halluscope.programs.finch.sampling import (DEFAULT_SAMPLERS, VARIANTS, Sample, parse_sampler_spec,
                                                representatives, round_robin, sampler_lm)
from halluscope.programs.finch.scoring import (NO_VOTE_SCORE, block_label, block_score, number_blocks, reconstruct,
                                               response_label, response_score)
from halluscope.programs.registry import get_program
from halluscope.signatures.finch import parse_rating

# -- rating parsing -----------------------------------------------------------------------------------


@pytest.mark.parametrize("raw, expected", [
    ("accurate", "accurate"),
    ("Contradiction", "contradiction"),
    (" **NEUTRAL.** ", "neutral"),
    ('"accurate"', "accurate"),
    ("[contradiction]", "contradiction"),
    ("Contra diction", "contradiction"),  # inner spacing is form, not content
    ("inaccurate", "unknown"),  # a substring match would wrongly say "accurate"
    ("contradicts", "unknown"),
    ("accurate, mostly", "unknown"),
    ("", "unknown"),
    (None, "unknown"),
    (3, "unknown"),
])
def test_parse_rating(raw, expected):
    assert parse_rating(raw) == expected


# -- round robin --------------------------------------------------------------------------------------


def test_round_robin_seed0_hand_written_orders():
    # random.Random(0) shuffles VARIANTS to
    #   [expand_before, long, cot, identity, expand_after, rephrase, break_down]
    # and then the models [A, B, C] to [A, C, B]; sample i = (variants[i % 7], models[i % 3]).
    got = round_robin(VARIANTS, ["A", "B", "C"], 10, seed=0)
    assert got == [
        ("expand_before", "A"), ("long", "C"), ("cot", "B"), ("identity", "A"), ("expand_after", "C"),
        ("rephrase", "B"), ("break_down", "A"), ("expand_before", "C"), ("long", "B"), ("cot", "A"),
    ]


def test_round_robin_seed1_and_balance():
    # random.Random(1): variants -> [rephrase, break_down, expand_after, long, identity, expand_before, cot],
    # models -> [A, C, B].
    got = round_robin(VARIANTS, ["A", "B", "C"], 10, seed=1)
    assert [v for v, _ in got[:7]] == ["rephrase", "break_down", "expand_after", "long", "identity",
                                       "expand_before", "cot"]
    assert [m for _, m in got[:3]] == ["A", "C", "B"]
    assert got[7:] == [("rephrase", "C"), ("break_down", "B"), ("expand_after", "A")]
    # every model used 3 or 4 times, every variant once or twice; inputs not mutated
    counts = {m: sum(1 for _, x in got if x == m) for m in "ABC"}
    assert sorted(counts.values()) == [3, 3, 4]


def test_round_robin_edge_cases():
    assert round_robin(VARIANTS, ["A"], 0) == []
    assert round_robin(["v"], ["A", "B"], 3, seed=5) in ([("v", "A"), ("v", "B"), ("v", "A")],
                                                         [("v", "B"), ("v", "A"), ("v", "B")])
    models = ["A", "B"]
    round_robin(VARIANTS, models, 4, seed=3)
    assert models == ["A", "B"]
    with pytest.raises(ValueError):
        round_robin([], ["A"], 2)
    with pytest.raises(ValueError):
        round_robin(VARIANTS, ["A"], -1)


# -- scoring ------------------------------------------------------------------------------------------


def test_block_score_weighted_mean_hand_computed():
    # (4*1 + 2*0 + 1*0.5) / (4 + 2 + 1)
    assert block_score(["contradiction", "accurate", "neutral"]) == pytest.approx(4.5 / 7)
    # (2*0 + 2*0 + 4*1) / 8
    assert block_score(["accurate", "accurate", "contradiction"]) == pytest.approx(0.5)
    assert block_score(["neutral"]) == 0.5
    assert block_score(["accurate", "accurate"]) == 0.0
    assert block_score(["contradiction"]) == 1.0
    # (1*0.5 + 1*0.5 + 2*0) / 4
    assert block_score(["neutral", "neutral", "accurate"]) == pytest.approx(0.25)


def test_unknown_ratings_have_no_weight():
    assert block_score(["contradiction", "unknown", "garbage", None]) == 1.0
    assert block_score(["contradiction", "accurate", "neutral", "maybe"]) == pytest.approx(4.5 / 7)
    # raw strings are parsed leniently
    assert block_score(["Contradiction.", "ACCURATE"]) == pytest.approx(4 / 6)


def test_block_without_known_rating_is_neutral():
    assert NO_VOTE_SCORE == 0.5
    assert block_score([]) == 0.5
    assert block_score(["unknown", "??"]) == 0.5
    assert block_label(block_score(["unknown"])) == "neutral"


@pytest.mark.parametrize("score, label", [
    (0.0, "accurate"), (0.33, "accurate"), (0.3301, "neutral"), (0.5, "neutral"),
    (4.5 / 7, "neutral"), (0.6699, "neutral"), (0.67, "contradiction"), (1 - 0.33, "contradiction"),
    (4 / 6, "neutral"), (1.0, "contradiction"),
])
def test_block_label_thresholds(score, label):
    assert block_label(score, 0.33) == label


def test_block_label_other_tau_and_validation():
    assert block_label(0.2, 0.2) == "accurate"
    assert block_label(0.8, 0.2) == "contradiction"
    assert block_label(0.79, 0.2) == "neutral"
    assert block_label(0.5, 0.0) == "neutral"
    for bad in (0.5, -0.1, 0.7):
        with pytest.raises(ValueError):
            block_label(0.5, bad)


def test_response_score_and_label():
    assert response_score([0.0, 1.0, 0.5]) == pytest.approx(0.5)
    assert response_score([]) == 0.0
    assert response_label(["accurate", "neutral", "contradiction"]) is True
    assert response_label(["accurate", "neutral"]) is False
    assert response_label([]) is False


# -- reconstruction and helpers -----------------------------------------------------------------------


def test_reconstruct_replaces_only_the_given_blocks():
    answer = "  One.  Two!\n\nThree?  "
    blocks = segment(answer, "en")
    assert [b.text for b in blocks] == ["One.", "Two!", "Three?"]
    assert reconstruct(answer, blocks, {}) == answer
    assert reconstruct(answer, blocks, {1: "2!"}) == "  One.  2!\n\nThree?  "
    assert reconstruct(answer, blocks, {0: "1.", 2: "3?"}) == "  1.  Two!\n\n3?  "
    assert reconstruct("ab", [(0, 1), (1, 2)], {0: "", 1: "Z"}) == "Z"


def test_reconstruct_rejects_bad_blocks():
    with pytest.raises(ValueError):
        reconstruct("abcdef", [(2, 4), (0, 3)], {})
    with pytest.raises(ValueError):
        reconstruct("abc", [(0, 5)], {})
    with pytest.raises(ValueError):
        reconstruct("abc", [Segment(0, 3, "abc")], {1: "x"})


def test_number_blocks_and_representatives():
    assert number_blocks(["A b.", "C\nd."]) == "[1] A b.\n[2] C d."
    s = [Sample(0, "identity", "m1", "p", "a0"), Sample(1, "cot", "m1", "p", "a1"),
         Sample(2, "long", "m2", "p", "a2"), Sample(3, "long", "m3", "p", "a3")]
    assert [x.index for x in representatives(s, 3)] == [0, 2, 3]
    assert [x.index for x in representatives(s, 4)] == [0, 2, 3, 1]
    assert representatives(s, 0) == []


def test_sampler_specs():
    assert parse_sampler_spec("local?temperature=0.7&seed=1") == ("local", {"temperature": 0.7, "seed": 1})
    assert parse_sampler_spec("openai/gpt-4o-mini") == ("openai/gpt-4o-mini", {})
    assert parse_sampler_spec("self?cache=false&x=abc") == ("self", {"cache": False, "x": "abc"})
    base = scripted_lm({"answer": "x"})
    lm = sampler_lm("self?temperature=1.0&seed=7", base=base)
    assert lm is not base and lm.kwargs["temperature"] == 1.0 and lm.kwargs["seed"] == 7
    assert lm.engine is base.engine
    assert sampler_lm({"lm": "self", "seed": 3}, base=base).kwargs["seed"] == 3
    assert sampler_lm("self", base=base) is base
    assert sampler_lm(base) is base


# -- the program with scripted LMs --------------------------------------------------------------------

QUESTION = "When was the Eiffel Tower built, and where is it?"
ANSWER = "The Eiffel Tower is in Paris.  It was built in 1920.\nIt is made of iron."
BLOCKS = ["The Eiffel Tower is in Paris.", "It was built in 1920.", "It is made of iron."]
SAMPLE_TEXT = "The Eiffel Tower, in Paris, was completed in 1889 and is made of wrought iron."


def _rating_for(block: str) -> str:
    return "contradiction" if "1920" in block else "accurate"


def make_responder(log=None, fail_rephrase=False, sample_text=SAMPLE_TEXT, rating_for=_rating_for):
    def respond(call):
        out = call.outputs
        if "rephrased_question" in out:
            if fail_rephrase:
                raise RuntimeError("rephrase down")
            return {"rephrased_question": "In which year was the Eiffel Tower constructed, and where?"}
        if "background" in out:
            return {"background": "The Eiffel Tower is a landmark."}
        if "details" in out:
            return {"details": "Give the exact year."}
        if "sub_questions" in out:
            return {"sub_questions": ["When was it built?", "Where is it?"]}
        if "ratings" in out:
            lines = call.inputs["blocks"].splitlines()
            return {"ratings": [
                {"block": i, "explanation": f"sample vs block {i}", "rating": _rating_for_line(line, rating_for)}
                for i, line in enumerate(lines, 1)]}
        if "verdict" in out:
            return {"verdict": {"explanation": "the sample says 1889", "rating": rating_for(call.inputs["block"])}}
        if "summary" in out:
            return {"summary": "The year is wrong; it was 1889."}
        if "corrected_block" in out:
            return {"corrected_block": "It was built in 1889."}
        if "improved_answer" in out:
            return {"improved_answer": "REFLECTED by target", "changes": "fixed the year"}
        if "answer" in out:
            return {"answer": sample_text}
        raise AssertionError(f"unexpected call {out}")

    return respond


def _rating_for_line(line: str, rating_for) -> str:
    return rating_for(line)


def _calls(lm, field):
    return [c for c in lm.engine.calls if field in c.outputs]


@pytest.fixture
def lm():
    return scripted_lm(make_responder())


def run(program, lm, **inputs):
    with dspy.context(lm=lm, adapter=dspy.JSONAdapter()):
        return program(**inputs)


def test_batch_judging_makes_one_call_per_sample(lm):
    prog = FinchZK(n_samples=5, batch_judge=True, correct=False)
    pred = run(prog, lm, question=QUESTION, answer=ANSWER, lang="en")
    assert len(_calls(lm, "ratings")) == 5
    assert not _calls(lm, "verdict")
    assert pred.calls["judge"] == 5 and pred.calls["samples"] == 5
    assert [u["text"] for u in pred.units] == BLOCKS
    assert [u["label"] for u in pred.units] == ["accurate", "contradiction", "accurate"]
    assert [u["score"] for u in pred.units] == [0.0, 1.0, 0.0]
    assert all(u["kind"] == "block" for u in pred.units)
    # spans carry the block scores; hard labels = blocks with score > 0.5
    start = ANSWER.index("It was built")
    assert pred.hard_labels == [[start, start + len(BLOCKS[1])]]
    assert pred.label is True
    assert pred.score == 1.0  # #34: the mean of the blocks (1/3) lifted to the hard span's probability
    assert pred.revision is None  # correct=False
    assert "sample vs block 2" in pred.rationale


def test_per_pair_judging_makes_blocks_times_samples_calls(lm):
    prog = FinchZK(n_samples=4, batch_judge=False, correct=False)
    pred = run(prog, lm, question=QUESTION, answer=ANSWER, lang="en")
    assert len(_calls(lm, "verdict")) == 3 * 4
    assert not _calls(lm, "ratings")
    assert pred.calls["judge"] == 12
    assert [u["label"] for u in pred.units] == ["accurate", "contradiction", "accurate"]
    # the per-pair judge sees the full answer as context
    assert all(c.inputs["answer"] == ANSWER for c in _calls(lm, "verdict"))


def test_samples_follow_round_robin_with_variants_and_sampler_settings(lm):
    prog = FinchZK(n_samples=10, correct=False, seed=0)
    pred = run(prog, lm, question=QUESTION, answer=ANSWER, lang="en")
    plan = round_robin(VARIANTS, range(len(DEFAULT_SAMPLERS)), 10, seed=0)
    assert [(s["variant"], s["model"]) for s in pred.samples] == [(v, DEFAULT_SAMPLERS[m]) for v, m in plan]
    # each of the four LM-written variants is made once, by the configured LM
    for field in ("rephrased_question", "background", "details", "sub_questions"):
        assert len(_calls(lm, field)) == 1
    prompts = {s["variant"]: s["prompt"] for s in pred.samples}
    assert prompts["identity"] == QUESTION
    assert prompts["rephrase"] == "In which year was the Eiffel Tower constructed, and where?"
    assert prompts["expand_before"].startswith("The Eiffel Tower is a landmark.") and QUESTION in prompts[
        "expand_before"]
    assert prompts["expand_after"].endswith("Give the exact year.")
    assert "- When was it built?" in prompts["break_down"]
    assert "step by step" in prompts["cot"]
    # each sample ran with its sampler's temperature and seed
    sample_calls = _calls(lm, "answer")
    settings = [parse_sampler_spec(DEFAULT_SAMPLERS[m])[1] for _, m in plan]
    assert sorted((c.temperature, c.seed) for c in sample_calls) == sorted(
        (o["temperature"], o["seed"]) for o in settings)
    assert {c.temperature for c in sample_calls} == {0.7, 1.0} and len({c.seed for c in sample_calls}) == 4


def test_repeated_variant_and_sampler_pair_gets_a_rollout_id(lm):
    # one sampler, 9 samples over 7 variants: samples 7 and 8 repeat the pairs of samples 0 and 1
    prog = FinchZK(samplers=["self?temperature=0.7&seed=1"], n_samples=9, correct=False, num_threads=1)
    seen = []

    def fake_answer(request, config):
        seen.append((request, config.get("rollout_id")))
        return dspy.Prediction(answer=SAMPLE_TEXT)

    prog.sampler.answer = fake_answer
    run(prog, lm, question=QUESTION, answer=ANSWER)
    assert [r for _, r in seen] == [None] * 7 + [1, 1]
    assert seen[7][0] == seen[0][0] and seen[8][0] == seen[1][0]


def test_failed_variant_falls_back_to_the_question():
    lm = scripted_lm(make_responder(fail_rephrase=True))
    pred = run(FinchZK(n_samples=7, correct=False), lm, question=QUESTION, answer=ANSWER)
    assert pred.failures["variant"] == 1
    assert {s["variant"]: s["prompt"] for s in pred.samples}["rephrase"] == QUESTION
    assert len(pred.samples) == 7


def test_failing_sampler_is_dropped_counted_and_others_vote(lm):
    def broken(call):
        raise RuntimeError("sampler down")

    bad = scripted_lm(broken, model="scripted/bad")
    prog = FinchZK(samplers=["self?temperature=0.7&seed=1", bad], n_samples=4, correct=False)
    pred = run(prog, lm, question=QUESTION, answer=ANSWER)
    assert pred.failures["sampler"] == 2
    assert len(pred.samples) == 2 and len(bad.engine.calls) == 2
    assert all("scripted/bad" not in s["model"] for s in pred.samples)
    assert len(_calls(lm, "ratings")) == 2  # only the surviving samples are judged
    assert [u["label"] for u in pred.units] == ["accurate", "contradiction", "accurate"]
    assert len(pred.ratings[0]) == 2


def test_blank_sample_is_a_failed_sample():
    lm = scripted_lm(make_responder(sample_text="   "))
    pred = run(FinchZK(n_samples=3, correct=False), lm, question=QUESTION, answer=ANSWER)
    assert pred.failures["sampler"] == 3
    assert pred.samples == [] and not _calls(lm, "ratings")
    assert [u["label"] for u in pred.units] == ["neutral"] * 3
    assert [u["score"] for u in pred.units] == [0.5] * 3
    assert pred.label is False and pred.hard_labels == []
    assert "all 3 samples failed" in pred.rationale


def test_empty_answer_has_no_blocks_and_makes_no_calls(lm):
    for empty in ("", "   \n "):
        pred = run(FinchZK(n_samples=3), lm, question=QUESTION, answer=empty)
        assert pred.units == [] and pred.spans == [] and pred.hard_labels == []
        assert pred.label is False and pred.score == 0.0
        assert "nothing to check" in pred.rationale
    assert lm.engine.calls == []


def test_answer_without_boundary_is_one_block(lm):
    text = "the tower was built in 1920 by engineers"
    pred = run(FinchZK(n_samples=2, correct=False), lm, question=QUESTION, answer=text)
    assert len(pred.units) == 1
    assert (pred.units[0]["start"], pred.units[0]["end"]) == (0, len(text))
    assert pred.units[0]["label"] == "contradiction"
    assert pred.hard_labels == [[0, len(text)]]


def test_unknown_and_mixed_ratings_in_the_program():
    # ratings per sample for block 2: contradiction, accurate, neutral, "maybe" -> 4.5/7 = neutral
    order = iter(["contradiction", "accurate", "neutral", "maybe"])

    def respond(call):
        if "ratings" in call.outputs:
            r = next(order)
            return {"ratings": [{"block": 1, "explanation": "", "rating": "accurate"},
                                {"block": 2, "explanation": "e", "rating": r},
                                {"block": 2, "explanation": "dup ignored", "rating": "contradiction"},
                                {"block": 9, "explanation": "out of range", "rating": "contradiction"}]}
        return make_responder()(call)

    lm = scripted_lm(respond)
    pred = run(FinchZK(n_samples=4, correct=False, num_threads=1), lm, question=QUESTION, answer=ANSWER)
    assert pred.units[1]["score"] == pytest.approx(4.5 / 7)
    assert pred.units[1]["label"] == "neutral"
    assert pred.units[2]["score"] == 0.5 and pred.units[2]["label"] == "neutral"  # block 3 never rated
    # 1 unparseable rating (block 2) + 4 missing ones (block 3)
    assert pred.failures["unknown_rating"] == 5
    # #34: block 2's 4.5/7 is a hard span (p > 0.5), so the answer is labelled hallucinated (one verdict per
    # output: no "correct" label above a hard span), its score lifted to that span's probability
    assert pred.hard_labels and pred.label is True and pred.score == pytest.approx(4.5 / 7)


def test_cut_off_batch_verdict_costs_one_vote_not_the_call():
    # a batch output cut off by max_tokens: the last item has no rating (seen on the embedded model)
    def respond(call):
        if "ratings" in call.outputs:
            return {"ratings": [{"block": 1, "explanation": "ok", "rating": "accurate"},
                                {"block": 2, "explanation": "the sample says 1889", "rating": "contradiction"},
                                {"block": 3, "explanation": "it is not tr"}]}
        return make_responder()(call)

    lm = scripted_lm(respond)
    pred = run(FinchZK(n_samples=2, correct=False), lm, question=QUESTION, answer=ANSWER)
    assert "judge" not in pred.failures
    assert pred.failures["unknown_rating"] == 2
    assert [u["label"] for u in pred.units] == ["accurate", "contradiction", "neutral"]
    assert [u["score"] for u in pred.units] == [0.0, 1.0, 0.5]


def test_failed_judge_call_is_counted_and_other_samples_vote():
    calls = []

    def respond(call):
        if "ratings" in call.outputs:
            calls.append(call)
            if len(calls) == 1:
                raise RuntimeError("judge down")
        return make_responder()(call)

    lm = scripted_lm(respond)
    pred = run(FinchZK(n_samples=3, correct=False, num_threads=1), lm, question=QUESTION, answer=ANSWER)
    assert pred.failures["judge"] == 1 and pred.failures["unknown_rating"] == 3
    assert [u["label"] for u in pred.units] == ["accurate", "contradiction", "accurate"]
    assert any("judge down" in e for e in pred.errors)


def test_correction_touches_only_flagged_blocks_and_reflection_uses_the_improver(lm):
    improver = scripted_lm(lambda c: {"improved_answer": "REFLECTED by improver", "changes": "year fixed"},
                           model="scripted/improver")
    prog = FinchZK(n_samples=3, correct=True, improver=improver, reflect_samples=2)
    pred = run(prog, lm, question=QUESTION, answer=ANSWER, lang="en")
    # one flagged block: one summary and one correction, by the configured (target) LM
    assert len(_calls(lm, "summary")) == 1 and len(_calls(lm, "corrected_block")) == 1
    assert _calls(lm, "summary")[0].inputs["block"] == BLOCKS[1]
    expected = ANSWER.replace("It was built in 1920.", "It was built in 1889.")
    assert pred.corrected_answer == expected  # unflagged text (and odd whitespace) byte-identical
    # reflection ran on the improver, with the corrected answer and 2 representative samples
    assert not _calls(lm, "improved_answer")
    (refl,) = improver.engine.calls
    assert "improved_answer" in refl.outputs
    assert expected.split("\n")[0] in refl.inputs["answer"]
    assert pred.revision == "REFLECTED by improver"
    assert pred.changes == "year fixed"
    assert pred.units[1]["rationale"] == "The year is wrong; it was 1889."
    assert "Block 2 (1.00): The year is wrong" in pred.rationale
    assert len(refl.inputs["samples"]) == 2
    # seed 0, 3 samples: expand_before, long, cot -> one LM-written variant
    assert pred.calls == {"variants": 1, "samples": 3, "judge": 3, "summary": 1, "correct": 1, "reflect": 1}


def test_reflection_defaults_to_the_configured_lm(lm):
    pred = run(FinchZK(n_samples=2, correct=True), lm, question=QUESTION, answer=ANSWER)
    assert len(_calls(lm, "improved_answer")) == 1
    assert pred.revision == "REFLECTED by target"


def test_nothing_flagged_means_no_correction(lm):
    lm = scripted_lm(make_responder(rating_for=lambda b: "accurate"))
    pred = run(FinchZK(n_samples=2, correct=True), lm, question=QUESTION, answer=ANSWER)
    assert pred.revision is None and pred.label is False and pred.score == 0.0
    assert not _calls(lm, "summary") and not _calls(lm, "improved_answer")


def test_blank_correction_keeps_the_block():
    def respond(call):
        if "corrected_block" in call.outputs:
            return {"corrected_block": "  "}
        return make_responder()(call)

    lm = scripted_lm(respond)
    pred = run(FinchZK(n_samples=2, correct=True), lm, question=QUESTION, answer=ANSWER)
    assert pred.corrected_answer == ANSWER
    assert pred.failures["correct"] == 1


def test_registry_build_and_optimizable_predictors():
    spec = get_program("finch")
    assert spec.level == "span" and spec.default_metric == "iou"
    for key in ("batch_judge", "n_samples", "samplers", "correct"):
        assert key in spec.options
    prog = spec.build(n_samples="4", batch_judge="false", correct="true", samplers="self?seed=1,self?seed=2")
    assert isinstance(prog, FinchZK)
    assert prog.n_samples == 4 and prog.batch_judge is False and prog.sampler.samplers == ["self?seed=1",
                                                                                           "self?seed=2"]
    names = [n for n, _ in prog.named_predictors()]
    assert names == ["judge", "summarize", "correct_block", "reflect"]
    assert [n for n, _ in spec.build(correct=False).named_predictors()] == ["judge"]


def test_report_means_calls_per_item(lm):
    prog = FinchZK(n_samples=2, correct=False)
    preds = [run(prog, lm, question=QUESTION, answer=ANSWER), None,
             run(prog, lm, question=QUESTION, answer="")]
    rep = get_program("finch").report([None] * 3, preds)
    assert rep["finch_lm_calls_per_item"] == sum(preds[0].calls.values()) / 2
    assert rep["finch_judge_calls_per_item"] == 1.0
