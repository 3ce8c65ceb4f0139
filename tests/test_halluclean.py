"""HalluClean, the direct-ask baselines, their loaders and the revision metrics (scripted LMs only)."""

from __future__ import annotations

import json
import logging

import dspy
import pytest
from dspy.utils.exceptions import AdapterParseError

from halluscope.core.contract import Span
from halluscope.lm.scripted import scripted_lm
from halluscope.loaders.halluclean import (
    HALLUCLEAN_DEMO_NOTICE,
    HALLUCLEAN_FILES,
    HALLUCLEAN_TASKS,
    canonical_task,
    halluclean_demo,
    load_halluclean,
    load_halluclean_or_demo,
    resolve_halluclean_dir,
)
from halluscope.metrics.revision import (
    SUCCESS_THRESHOLD,
    hallucination_reduction_rate,
    normalize_tokens,
    revision_similarity,
    revision_success_rate,
)
from halluscope.programs.halluclean.program import (
    DEFAULT_MAX_TOKENS,
    TASKS,
    DirectAsk,
    HalluClean,
    halluclean_report,
    resolve_task,
    route_inputs,
    same_text,
)
from halluscope.programs.registry import get_program
from halluscope.signatures.halluclean import Judge, Plan, Reason, Revise, parse_verdict
from halluscope.signatures.halluclean import DirectAsk as DirectAskSig

STAGES = ("plan", "analysis", "verdict", "revision")


def stage_of(call) -> str:
    for s in STAGES:
        if s in call.outputs:
            return s
    raise AssertionError(f"unexpected call with outputs {call.outputs}")


def responder(verdict="Yes", revision="The capital of Australia is Canberra.", plan="1. Check the capital.",
              analysis="The answer says Sydney; the knowledge says Canberra."):
    values = {"plan": plan, "analysis": analysis, "verdict": verdict, "revision": revision}

    def respond(call):
        s = stage_of(call)
        v = values[s]
        return {s: v(call) if callable(v) else v}

    return respond


def run(program, adapter=None, **inputs):
    lm = scripted_lm(inputs.pop("respond", None) or responder())
    with dspy.context(lm=lm, adapter=adapter or dspy.JSONAdapter()):
        pred = program(**inputs)
    return pred, lm.engine.calls


QA = dict(question="What is the capital of Australia?", answer="The capital of Australia is Sydney.",
          context="Canberra is the capital city of Australia.", task="qa", lang="en")


# ==================================================================================================
# The verdict parser
# ==================================================================================================

@pytest.mark.parametrize("text", [
    "Yes", "yes", "YES", "Yes.", "**Yes**", "'yes'", '"Yes"', "Yes, the answer is hallucinated.",
    "Answer: Yes", "Hallucination: yes", "yes/no", "Yes and no", "true", "Y", "Ja", "JA!", "oui", "Sí", "si",
    "sì", "sim", "да", "Так", "Tak", "ano", "igen", "evet", "Ναι", "نعم", "हाँ", "是", "是的，有幻觉", "有",
    "はい", "네", "kyllä",
])
def test_parse_verdict_yes(text):
    assert parse_verdict(text) is True


@pytest.mark.parametrize("text", [
    "No", "no", "NO.", "**No**", "No, there is no hallucination.", "Answer: No", "The answer is no", "no/yes",
    "false", "n", "Nein", "nee", "nej", "nei", "ei", "Non", "não", "нет", "Ні", "nie", "ne", "nem", "hayır",
    "όχι", "لا", "नहीं", "否", "不是", "这不是幻觉", "没有幻觉", "いいえ", "아니요", "không",
])
def test_parse_verdict_no(text):
    assert parse_verdict(text) is False


@pytest.mark.parametrize("text", [
    "", "   ", None, "maybe", "I don't know", "Hallucinated", "unclear", "42", "***", "yesterday", "nobody",
    "Noah", "yessir", "Not sure",
])
def test_parse_verdict_undecided(text):
    assert parse_verdict(text) is None


def test_parse_verdict_first_decisive_word_wins_and_bools_pass():
    assert parse_verdict("Well... no. Yes? No.") is False
    assert parse_verdict("I think yes, no doubt") is True
    assert parse_verdict(True) is True and parse_verdict(False) is False


# ==================================================================================================
# Task routing
# ==================================================================================================

ROUTED = {  # task -> (example fields, the labelled lines the input must show, in order)
    "qa": (dict(question="Q?", answer="A.", context="K."), ["Knowledge: K.", "Question: Q?", "Answer: A."]),
    "dialogue": (dict(question="[Human]: Hi", answer="Hello.", context="K."),
                 ["Knowledge: K.", "Dialogue history: [Human]: Hi", "Response: Hello."]),
    "summarization": (dict(question="", answer="Short.", context="A long document."),
                      ["Document: A long document.", "Summary: Short."]),
    "mwp": (dict(question="Tom buys pens. How much?", answer="", context=""), ["Problem: Tom buys pens. How much?"]),
    "self_contradiction": (dict(question="Prefix text.", answer="It is tall.", context="It is short."),
                           ["Text so far: Prefix text.", "Sentence A: It is tall.", "Sentence B: It is short."]),
    "generic": (dict(question="P?", answer="R.", context="C."), ["Context: C.", "Prompt: P?", "Response: R."]),
}


def test_every_task_has_a_route_and_a_distinct_description():
    assert set(TASKS) == set(HALLUCLEAN_TASKS) | {"generic"}
    descriptions = [r.description for r in TASKS.values()]
    assert len(set(descriptions)) == len(descriptions)
    assert all(20 < len(d) < 300 for d in descriptions)  # concise


@pytest.mark.parametrize("task", list(ROUTED))
def test_route_inputs_labels_fields_in_order(task):
    fields, lines = ROUTED[task]
    shared = route_inputs(TASKS[task], **fields)
    assert shared["task"] == TASKS[task].description
    assert shared["input"] == "\n".join(lines)


@pytest.mark.parametrize("task", list(ROUTED))
def test_every_halluclean_stage_receives_the_routed_inputs(task):
    fields, lines = ROUTED[task]
    pred, calls = run(HalluClean(), **fields, task=task)
    expected_input = "\n".join(lines)
    revisable = bool(fields["answer"])
    assert [stage_of(c) for c in calls] == ["plan", "analysis", "verdict"] + (["revision"] if revisable else [])
    for c in calls:
        assert c.inputs["task"] == TASKS[task].description
        assert c.inputs["input"] == expected_input
    assert calls[1].inputs["plan"] == "1. Check the capital."
    assert calls[2].inputs["analysis"].startswith("The answer says Sydney")
    assert pred.route == task
    # no other task's description leaks into the prompts
    for other, route in TASKS.items():
        if other != task:
            assert not any(c.has(route.description) for c in calls)


@pytest.mark.parametrize("task", list(ROUTED))
def test_routing_works_with_the_chat_adapter_too(task):
    fields, lines = ROUTED[task]
    pred, calls = run(HalluClean(), adapter=dspy.ChatAdapter(), **fields, task=task,
                      respond=responder(verdict="No"))
    assert len(calls) == 3 and all(c.chat_format for c in calls)
    assert all(c.inputs["input"] == "\n".join(lines) for c in calls)
    assert pred.label is False


def test_task_resolution_option_beats_example_and_unknown_falls_back_to_generic():
    assert resolve_task(None, "qa").name == "qa"
    assert resolve_task("dialogue", "qa").name == "dialogue"
    assert resolve_task(None, "DA").name == "dialogue"
    assert resolve_task(None, "sum").name == "summarization"
    assert resolve_task(None, "SC").name == "self_contradiction"
    assert resolve_task(None, "mushroom").name == "generic"
    assert resolve_task(None, None).name == "generic"
    with pytest.raises(ValueError, match="unknown task"):
        HalluClean(task="poetry")
    # the build option routes a case whose own task says otherwise
    _, calls = run(HalluClean(task="summarization"), **QA)
    assert calls[0].inputs["task"] == TASKS["summarization"].description
    assert calls[0].inputs["input"].startswith("Document: Canberra")


def test_missing_fields_still_run_with_what_they_have():
    pred, calls = run(HalluClean(), question="Who wrote it?", answer="Tolkien.", context="", task="qa")
    assert calls[0].inputs["input"] == "Question: Who wrote it?\nAnswer: Tolkien."
    _, calls = run(HalluClean(), question="", answer="Sure, here you go.", context="", task="dialogue",
                   respond=responder(verdict="No"))
    assert calls[0].inputs["input"] == "Response: Sure, here you go."
    # the checked part is shown even when empty
    pred, calls = run(HalluClean(), question="Q?", answer="", context="", task="qa")
    assert calls[0].inputs["input"] == "Question: Q?\nAnswer: (empty)"
    assert pred.label is True and pred.revision_status == "not_revisable" and len(calls) == 3
    # no task at all: generic; unknown extra inputs are ignored
    pred, calls = run(HalluClean(), question="P", answer="R", something_else=1)
    assert pred.route == "generic" and calls[0].inputs["task"] == TASKS["generic"].description


# ==================================================================================================
# Judge, revision gate, revision and spans
# ==================================================================================================

def test_revision_runs_only_when_judged_hallucinated():
    pred, calls = run(HalluClean(), **QA, respond=responder(verdict="No"))
    assert [stage_of(c) for c in calls] == ["plan", "analysis", "verdict"]
    assert pred.label is False and pred.score == 0.0 and pred.revision is None
    assert pred.revision_status == "not_flagged" and pred.spans == [] and pred.failures == {}

    pred, calls = run(HalluClean(), **QA, respond=responder(verdict="Yes"))
    assert [stage_of(c) for c in calls] == ["plan", "analysis", "verdict", "revision"]
    revise = calls[3]
    assert revise.inputs["text"] == QA["answer"]
    assert revise.inputs["analysis"] == "The answer says Sydney; the knowledge says Canberra."
    assert pred.label is True and pred.score == 1.0
    assert pred.revision == "The capital of Australia is Canberra." and pred.revision_status == "revised"
    assert pred.rationale == "The answer says Sydney; the knowledge says Canberra."
    assert pred.plan == "1. Check the capital." and pred.verdict == "Yes" and pred.decided is True


def test_revise_false_disables_the_revision_stage():
    pred, calls = run(HalluClean(revise=False), **QA)
    assert len(calls) == 3 and pred.label is True
    assert pred.revision is None and pred.revision_status == "disabled"


def test_diff_of_a_real_revision_maps_to_spans_of_the_answer():
    answer = "Unleashed is an action movie and Gerard Butler starred in it."
    revision = "Unleashed is a thriller movie and Vincent Regan starred in it."
    pred, _ = run(HalluClean(), question="[Human]: Who stars in Unleashed?", answer=answer,
                  context="Vincent Regan starred in Unleashed", task="dialogue",
                  respond=responder(verdict="Yes", revision=revision))
    det = pred.detection
    got = [answer[s.start:s.end] for s in det.spans]
    assert got == ["an action", "Gerard Butler"]
    assert det.spans == [Span(13, 22, 1.0), Span(33, 46, 1.0)]
    assert pred.hard_labels == [[13, 22], [33, 46]]
    assert det.revision == revision and det.label is True


def test_no_change_revision_is_not_a_fix():
    answer = QA["answer"]
    for same in (answer, "  The capital of   Australia is\nSydney.  "):
        pred, calls = run(HalluClean(), **QA, respond=responder(revision=same))
        assert len(calls) == 4
        assert pred.revision is None and pred.detection.revision is None
        assert pred.revision_status == "no_change" and pred.spans == []
        assert pred.label is True  # still detected
        assert pred.failures == {}
    pred, _ = run(HalluClean(), **QA, respond=responder(revision="   "))
    assert pred.revision is None and pred.revision_status == "empty"
    assert same_text("a  b\n", " a b") and not same_text("a b", "a b.")


def test_undecided_judge_counts_a_failure_with_label_false_score_half():
    pred, calls = run(HalluClean(), **QA, respond=responder(verdict="perhaps"))
    assert len(calls) == 3  # no revision
    assert pred.label is False and pred.score == 0.5 and pred.decided is False
    assert pred.failures == {"verdict": 1} and pred.verdict == "perhaps"


def test_judge_in_another_language_is_parsed():
    pred, _ = run(HalluClean(revise=False), **QA, respond=responder(verdict="Nein, alles korrekt."))
    assert pred.label is False and pred.decided is True and pred.failures == {}
    pred, _ = run(HalluClean(revise=False), **QA, respond=responder(verdict="是的"))
    assert pred.label is True


class _Raises:
    """A stand-in predictor whose output never parses."""

    def __init__(self, sig):
        self.sig = sig
        self.demos = []

    def __call__(self, **_):
        raise AdapterParseError(adapter_name="JSONAdapter", signature=self.sig, lm_response="garbage")


def test_stage_parse_errors_are_counted_and_the_pipeline_goes_on():
    prog = HalluClean()
    prog.plan = _Raises(Plan)
    pred, calls = run(prog, **QA)
    assert [stage_of(c) for c in calls] == ["analysis", "verdict", "revision"]
    assert calls[0].inputs["plan"] == ""  # goes on with what it has
    assert pred.failures == {"parse": 1} and pred.label is True

    prog = HalluClean()
    prog.judge = _Raises(Judge)
    pred, calls = run(prog, **QA)
    assert len(calls) == 2 and pred.label is False and pred.score == 0.5 and pred.failures == {"parse": 1}

    prog = HalluClean()
    prog.revise = _Raises(Revise)
    pred, calls = run(prog, **QA)
    assert pred.label is True and pred.revision is None and pred.revision_status == "failed"
    assert pred.failures == {"parse": 1}


def test_mwp_and_sc_revision_rules():
    # MWP: the checked thing is the problem; there is no answer to revise
    pred, calls = run(HalluClean(), question="Tom buys pens. How much?", answer="", context="", task="mwp")
    assert len(calls) == 3 and pred.label is True and pred.revision_status == "not_revisable"
    # SC: sentence A (the answer) is revised; the spans index into it
    pred, calls = run(HalluClean(), question="The tower is in Paris.", answer="It is 330 metres tall.",
                      context="It is 120 metres tall.", task="self_contradiction",
                      respond=responder(revision="It is tall."))
    assert len(calls) == 4 and calls[3].inputs["text"] == "It is 330 metres tall."
    assert [pred.detection.answer[s["start"]:s["end"]] for s in pred.spans] == ["330 metres"]


# ==================================================================================================
# Direct ask baselines
# ==================================================================================================

@pytest.mark.parametrize("verdict,label,score", [("Yes", True, 1.0), ("no.", False, 0.0), ("hmm", False, 0.5)])
def test_direct_ask_makes_exactly_one_call(verdict, label, score):
    for routing in (False, True):
        pred, calls = run(DirectAsk(routing=routing), **QA, respond=lambda c: {"verdict": verdict})
        assert len(calls) == 1 and list(calls[0].outputs) == ["verdict"]
        assert pred.label is label and pred.score == score
        assert pred.failures == ({} if score != 0.5 else {"verdict": 1})
        assert pred.spans == [] and pred.revision is None


def test_direct_ask_without_routing_uses_the_generic_prompt_for_every_task():
    for task, (fields, _) in ROUTED.items():
        _, calls = run(DirectAsk(routing=False), **fields, task=task, respond=lambda c: {"verdict": "No"})
        assert calls[0].inputs == route_inputs(TASKS["generic"], **fields)
        _, calls = run(DirectAsk(routing=True), **fields, task=task, respond=lambda c: {"verdict": "No"})
        assert calls[0].inputs == route_inputs(TASKS[task], **fields)


def test_direct_ask_parse_error_is_a_failure():
    prog = DirectAsk(routing=True)
    prog.ask = _Raises(DirectAskSig)
    pred, calls = run(prog, **QA)
    assert calls == [] and pred.label is False and pred.score == 0.5 and pred.failures == {"parse": 1}


# ==================================================================================================
# Registration and optimisability
# ==================================================================================================

def test_programs_are_registered_as_response_level_f1():
    for name in ("halluclean", "direct", "direct+routing"):
        spec = get_program(name)
        assert spec.level == "response" and spec.default_metric == "f1" and spec.uses_lm
    spec = get_program("halluclean")
    assert spec.options["task"] is None and spec.options["revise"] is True and spec.report is halluclean_report
    assert get_program("direct+routing").options["task"] is None
    prog = spec.build(task="qa", revise=False)
    assert isinstance(prog, HalluClean) and prog.task == "qa" and prog.do_revise is False
    assert get_program("direct").build().routing is False and get_program("direct+routing").build(task="mwp").task == "mwp"


def test_detection_predictors_are_plain_predict_with_stage_budgets():
    prog = get_program("halluclean").build()
    named = dict(prog.named_predictors())
    assert list(named) == ["plan", "reason", "judge", "revise"]
    assert all(type(p) is dspy.Predict for p in named.values())
    assert {n: p.config["max_tokens"] for n, p in named.items()} == DEFAULT_MAX_TOKENS
    assert named["judge"].signature.instructions == Judge.instructions
    custom = HalluClean(max_tokens={"reason": 512})
    assert custom.reason.config["max_tokens"] == 512 and custom.plan.config["max_tokens"] == 128
    # optimizers rewrite instructions and demos; the program still runs with them and saves its state
    prog.judge.signature = prog.judge.signature.with_instructions("Say Yes if anything is made up.")
    pred, calls = run(prog, **QA, respond=responder(verdict="No"))
    assert calls[2].has("Say Yes if anything is made up.") and pred.label is False
    state = prog.dump_state()
    assert set(state) >= {"plan", "reason", "judge", "revise"}


def test_halluclean_runs_under_dspy_evaluate_with_threads():
    examples = halluclean_demo("qa", notice=False) + halluclean_demo("self_contradiction", notice=False)

    def respond(call):
        s = stage_of(call)
        if s == "verdict":
            text = call.inputs["input"]
            bad = "Answer: The capital of Australia is Sydney" in text or "Sentence A: It is about 330" in text
            return {"verdict": "Yes" if bad else "No"}
        return {s: "x" if s != "revision" else "The capital of Australia is Canberra."}

    lm = scripted_lm(respond)
    from halluscope.metrics.adapters import f1_metric

    with dspy.context(lm=lm, adapter=dspy.JSONAdapter()):
        res = dspy.Evaluate(devset=examples, metric=f1_metric, num_threads=2, display_progress=False)(HalluClean())
    assert res.score == 100.0
    # 4 cases x 3 detection calls + 2 revisions
    assert len(lm.engine.calls) == 14


# ==================================================================================================
# Loaders
# ==================================================================================================

FIXTURES = {
    "QA": [
        {"knowledge": "K1", "question": "Q1", "right_answer": "R1", "hallucinated_answer": "H1", "id": 1},
        {"knowledge": "K2", "question": "Q2", "right_answer": "R2", "hallucinated_answer": "H2", "id": 2},
    ],
    "DA": [{"knowledge": "K", "dialogue_history": "[Human]: hi", "right_response": "R", "hallucinated_response": "H",
            "id": 7}],
    "SUM": [{"document": "D", "right_summary": "R", "hallucinated_summary": "H", "id": 3}],
    "MWP": [  # all unanswerable first, as in the real file
        {"id": 10, "question": "P10", "answer": None, "answerable": False, "label": "yes"},
        {"id": 11, "question": "P11", "answer": None, "answerable": False, "label": "yes"},
        {"id": 12, "question": "P12", "answer": None, "answerable": False, "label": "yes"},
        {"id": 13, "question": "P13", "answer": 4, "answerable": True, "label": "no"},
        {"id": 14, "question": "P14", "answer": 5, "answerable": True, "label": "no"},
    ],
    "SC": {
        "topic.1": {"target": "Tell me about X", "prefix": "Pre1", "orig": "O1", "alt": "A1", "tag": "strong"},
        "topic.2": {"target": "Tell me about X", "prefix": "Pre2", "orig": "O2", "alt": "A2", "tag": "strong"},
        "topic.3": {"target": "Tell me about Y", "prefix": "Pre3", "orig": "O3", "alt": "A3", "tag": "ok"},
    },
}


@pytest.fixture
def data_dir(tmp_path):
    d = tmp_path / "halluclean"
    d.mkdir()
    for name, data in FIXTURES.items():
        (d / f"{name}.dev.json").write_text(json.dumps(data), encoding="utf-8")
    return d


def test_load_qa_dialogue_summarization_give_two_labelled_cases_per_item(data_dir):
    qa = load_halluclean(data_dir, "qa")
    assert [(e.id, e.answer, e.label) for e in qa] == [
        ("qa-1-right", "R1", False), ("qa-1-hallucinated", "H1", True),
        ("qa-2-right", "R2", False), ("qa-2-hallucinated", "H2", True)]
    e = qa[1]
    assert (e.task, e.lang, e.question, e.context, e.reference) == ("qa", "en", "Q1", "K1", "R1")
    assert set(e.inputs().keys()) == {"question", "answer", "lang", "context", "task"}
    assert "label" not in e.inputs() and "reference" not in e.inputs()

    da = load_halluclean(data_dir, "DA")
    assert [(e.question, e.context, e.answer, e.label, e.reference) for e in da] == [
        ("[Human]: hi", "K", "R", False, "R"), ("[Human]: hi", "K", "H", True, "R")]
    summ = load_halluclean(data_dir, "summarization")
    assert [(e.question, e.context, e.answer, e.label) for e in summ] == [("", "D", "R", False), ("", "D", "H", True)]


def test_load_mwp_unanswerable_is_positive_and_limit_is_balanced(data_dir):
    mwp = load_halluclean(data_dir, "mwp")
    assert len(mwp) == 5
    assert [(e.question, e.label) for e in mwp] == [
        ("P13", False), ("P10", True), ("P14", False), ("P11", True), ("P12", True)]
    assert all(e.answer == "" and e.context == "" and e.reference is None for e in mwp)
    assert [e.label for e in load_halluclean(data_dir, "mwp", limit=2)] == [False, True]
    assert [e.label for e in load_halluclean(data_dir, "mwp", limit=4)] == [False, True, False, True]


def test_load_sc_maps_prefix_orig_alt_and_strong_tag(data_dir):
    sc = load_halluclean(data_dir, "sc")
    assert [(e.question, e.answer, e.context, e.label) for e in sc] == [
        ("Pre3", "O3", "A3", False), ("Pre1", "O1", "A1", True), ("Pre2", "O2", "A2", True)]
    assert sc[1].id == "sc-topic.1" and sc[1].target == "Tell me about X" and sc[1].task == "self_contradiction"
    assert [e.label for e in load_halluclean(data_dir, "self_contradiction", limit=2)] == [False, True]


def test_limit_counts_cases_and_accepts_the_parent_folder(data_dir):
    assert [e.id for e in load_halluclean(data_dir.parent, "qa", limit=3)] == [
        "qa-1-right", "qa-1-hallucinated", "qa-2-right"]
    assert load_halluclean(data_dir, "qa", limit=0) == []
    with pytest.raises(ValueError):
        load_halluclean(data_dir, "qa", limit=-1)


def test_loader_errors_name_the_missing_file_and_bad_item(tmp_path, data_dir):
    empty = tmp_path / "empty"
    empty.mkdir()
    with pytest.raises(FileNotFoundError, match=r"QA\.dev\.json"):
        load_halluclean(empty, "qa")
    (data_dir / "DA.dev.json").write_text(json.dumps([{"knowledge": "K", "right_response": "R"}]))
    with pytest.raises(ValueError, match=r"DA\.dev\.json: item 0: .*hallucinated_response"):
        load_halluclean(data_dir, "dialogue")
    with pytest.raises(ValueError, match="unknown HalluClean task"):
        load_halluclean(data_dir, "poetry")
    assert canonical_task("SUM") == "summarization" and canonical_task("Self-Contradiction") == "self_contradiction"
    assert set(HALLUCLEAN_FILES) == set(HALLUCLEAN_TASKS)


def _load_error(path, task) -> str:
    with pytest.raises(ValueError) as e:
        load_halluclean(path.parent, task)
    msg = str(e.value)
    assert "\n" not in msg and str(path) in msg, msg
    return msg


def test_a_utf8_byte_order_mark_is_accepted(data_dir):
    qa = data_dir / "QA.dev.json"
    plain = [(e.id, e.question, e.answer) for e in load_halluclean(data_dir, "qa")]
    qa.write_bytes(b"\xef\xbb\xbf" + qa.read_bytes())
    assert [(e.id, e.question, e.answer) for e in load_halluclean(data_dir, "qa")] == plain


def test_text_that_is_not_utf8_names_the_file_line_and_column(data_dir):
    qa = data_dir / "QA.dev.json"
    qa.write_bytes(b'[{"id": "1", "question": "Q",\n  "right_answer": "caf\xe9", "hallucinated_answer": "H"}]')
    msg = _load_error(qa, "qa")
    assert "line 2" in msg and "column 23" in msg and "0xe9" in msg and "UTF-8" in msg
    qa.write_bytes(b"\xef\xbb\xbf[\xff]")  # after a byte-order mark: still line 1, column 2
    msg = _load_error(qa, "qa")
    assert "line 1" in msg and "column 2" in msg and "0xff" in msg


def test_malformed_json_names_the_file_line_and_column(data_dir):
    qa = data_dir / "QA.dev.json"
    qa.write_text('[{"id": "1",\n  "question": "Q" "right_answer": "R"}]', encoding="utf-8")
    msg = _load_error(qa, "qa")
    assert "line 2" in msg and "column 19" in msg and "malformed JSON" in msg


@pytest.mark.parametrize("task, file, rec, field", [
    ("qa", "QA", {"id": "1", "question": ["Q"], "right_answer": "R", "hallucinated_answer": "H"}, "question"),
    ("qa", "QA", {"id": "1", "question": "Q", "right_answer": {"t": "R"}, "hallucinated_answer": "H"},
     "right_answer"),
    ("summarization", "SUM", {"document": True, "right_summary": "R", "hallucinated_summary": "H"}, "document"),
    ("self_contradiction", "SC", [{"prefix": "P", "orig": "O", "alt": ["A"], "tag": "ok"}], "alt"),
])
def test_a_field_that_is_not_text_names_the_file_item_and_field(data_dir, task, file, rec, field):
    f = data_dir / f"{file}.dev.json"
    f.write_text(json.dumps(rec if isinstance(rec, list) else [rec]), encoding="utf-8")
    msg = _load_error(f, task)
    assert "item 0" in msg and f"field {field!r}" in msg and "expected text" in msg


def test_numbers_as_text_and_ids_of_items_without_one_are_kept(data_dir):
    (data_dir / "QA.dev.json").write_text(json.dumps(
        [{"question": "How many?", "right_answer": 8, "hallucinated_answer": 9.5, "knowledge": None}]))
    qa = load_halluclean(data_dir, "qa")
    assert [(e.id, e.answer, e.context) for e in qa] == [
        ("qa-QA.dev.json item 0-right", "8", ""), ("qa-QA.dev.json item 0-hallucinated", "9.5", "")]


def test_resolve_dir_and_demo_fallback(tmp_path, data_dir, monkeypatch, caplog):
    assert resolve_halluclean_dir(data_dir.parent) == data_dir
    assert resolve_halluclean_dir(data_dir) == data_dir
    with pytest.raises(FileNotFoundError):
        resolve_halluclean_dir(tmp_path / "nope")
    examples, is_demo = load_halluclean_or_demo(data_dir, "qa", limit=2)
    assert not is_demo and examples[0].answer == "R1"

    monkeypatch.setattr("halluscope.loaders.halluclean.resolve_halluclean_dir", lambda d=None: None)
    with caplog.at_level(logging.WARNING, logger="halluscope.loaders"):
        examples, is_demo = load_halluclean_or_demo(None, "qa")
    assert is_demo and HALLUCLEAN_DEMO_NOTICE in caplog.text  # logged (the CLI shows it on stderr)


@pytest.mark.parametrize("task", HALLUCLEAN_TASKS)
def test_demo_has_one_case_of_each_class_per_task(task, caplog):
    with caplog.at_level(logging.WARNING, logger="halluscope.loaders"):
        demo = halluclean_demo(task)
    assert "BUILT-IN DEMO" in caplog.text
    assert [e.label for e in demo] == [False, True]
    assert all(e.task == task and e.demo for e in demo)
    caplog.clear()
    with caplog.at_level(logging.WARNING, logger="halluscope.loaders"):
        assert halluclean_demo(task, notice=False)  # quiet on request
    assert caplog.text == ""


# ==================================================================================================
# Revision metrics
# ==================================================================================================

def test_revision_similarity_hand_computed():
    assert normalize_tokens("The Song, \"Shatter Me\"!") == ["song", "shatter", "me"]
    # short reference (2 tokens): recall of its tokens in the revision
    assert revision_similarity("The song is Shatter Me by Lindsey Stirling.", "Shatter Me") == 1.0
    assert revision_similarity("Evander Kane plays for Sabres.", "Buffalo Sabres") == 0.5
    # long reference: unigram F1. ref 10 tokens (articles dropped), revision 10, 9 in common -> 18/20
    ref = "Unleashed is a thriller movie and Vincent Regan starred in it."
    rev = "Unleashed is an action movie and Vincent Regan starred in it."
    assert revision_similarity(rev, ref) == pytest.approx(0.9)
    # unrevised hallucination: 7 in common -> 14/20
    hal = "Unleashed is an action movie and Gerard Butler starred in it."
    assert revision_similarity(hal, ref) == pytest.approx(0.7)
    assert revision_similarity("", "") == 1.0 and revision_similarity("x", "") == 0.0
    assert revision_similarity(None, "abc") == 0.0


def test_revision_success_rate_hand_computed():
    refs = ["Shatter Me", "Buffalo Sabres", "Canberra", None]
    revs = ["It is Shatter Me.", "Evander Kane plays for Sabres.", None, "anything"]
    # 1.0 pass, 0.5 fail, None fail, no reference skipped -> 1/3
    assert revision_success_rate(revs, refs) == pytest.approx(1 / 3)
    assert revision_success_rate(revs, refs, threshold=0.5) == pytest.approx(2 / 3)
    assert revision_success_rate([], []) is None and revision_success_rate(["a"], [None]) is None
    assert SUCCESS_THRESHOLD == 0.6
    with pytest.raises(ValueError):
        revision_success_rate(["a"], [])


def _ex(answer, **kw):
    return dspy.Example(question=kw.get("question", "Q"), answer=answer, lang="en", context="C", task="qa",
                        label=kw.get("label", True), reference=kw.get("reference")).with_inputs(
        "question", "answer", "lang", "context", "task")


def test_hallucination_reduction_rate_hand_computed():
    examples = [_ex("a1"), _ex("a2"), _ex("a3"), _ex(""), _ex("a5"), _ex("a6"), _ex("a7"), _ex("a8")]
    predictions = [
        dspy.Prediction(label=True, revision="fixed-ok"),        # resolved
        dspy.Prediction(label=True, revision="still-bad"),       # still flagged
        dspy.Prediction(label=True, revision=None, revision_status="no_change"),  # still flagged, no call
        dspy.Prediction(label=True, revision=None),              # empty answer: not revisable
        dspy.Prediction(label=False, revision=None),             # not detected
        None,                                                    # failed example
        dspy.Prediction(label=True, revision="judge-crashes"),   # judge failure: still flagged
        dspy.Prediction(label=True, revision="judge-undecided"),  # judge failure: still flagged
    ]
    seen = []

    def judge(question, answer, lang, context, task):
        seen.append((question, answer, lang, context, task))
        if answer == "judge-crashes":
            raise RuntimeError("boom")
        if answer == "judge-undecided":
            return dspy.Prediction(label=False, decided=False)
        return dspy.Prediction(label=answer != "fixed-ok")

    r = hallucination_reduction_rate(examples, predictions, judge)
    assert r == {"detected": 6, "revisable": 5, "revised": 4, "resolved": 1, "judge_calls": 4,
                 "judge_failures": 2, "rate": pytest.approx(1 / 5)}
    assert seen[0] == ("Q", "fixed-ok", "en", "C", "qa")
    assert [s[1] for s in seen] == ["fixed-ok", "still-bad", "judge-crashes", "judge-undecided"]
    # a bool-returning judge, and no revisable case -> rate None
    assert hallucination_reduction_rate(examples[:1], predictions[:1], lambda **kw: False)["rate"] == 1.0
    assert hallucination_reduction_rate(examples[3:6], predictions[3:6], judge)["rate"] is None


def test_reduction_rate_runs_the_judge_under_the_given_lm():
    judge_lm = scripted_lm(lambda c: {s: ("No" if s == "verdict" else "x") for s in c.outputs})
    main_lm = scripted_lm(lambda c: {s: ("Yes" if s == "verdict" else "x") for s in c.outputs})
    examples = [_ex("The capital is Sydney.")]
    predictions = [dspy.Prediction(label=True, revision="The capital is Canberra.")]
    with dspy.context(lm=main_lm, adapter=dspy.JSONAdapter()):
        r = hallucination_reduction_rate(examples, predictions, HalluClean(revise=False), lm=judge_lm)
    assert r["rate"] == 1.0 and len(judge_lm.engine.calls) == 3 and main_lm.engine.calls == []
    assert judge_lm.engine.calls[0].inputs["input"].endswith("Answer: The capital is Canberra.")


def test_halluclean_report_counts_statuses_r_and_q():
    examples = [
        _ex("Unleashed is an action movie and Gerard Butler starred in it.",
            reference="Unleashed is a thriller movie and Vincent Regan starred in it."),
        _ex("Sydney", reference="Canberra"),
        _ex("Canberra", label=False, reference="Canberra"),
    ]
    predictions = [
        dspy.Prediction(label=True, revision="Unleashed is a thriller movie and Vincent Regan starred in it.",
                        revision_status="revised"),
        dspy.Prediction(label=True, revision=None, revision_status="no_change"),
        dspy.Prediction(label=False, revision=None, revision_status="not_flagged"),
    ]
    rep = halluclean_report(examples, predictions, judge=lambda **kw: False)
    assert rep["revision_revised"] == 1 and rep["revision_no_change"] == 1 and rep["revision_not_flagged"] == 1
    assert rep["Q"] == 0.5 and rep["Q_n"] == 2  # the revised one matches, the unchanged one fails
    assert rep["Q_unrevised"] == 0.5  # Gerard Butler version: F1 0.7 >= 0.6; "Sydney" vs "Canberra": 0
    assert rep["R"] == 0.5 and rep["R_revisable"] == 2 and rep["R_resolved"] == 1


def test_halluclean_report_skips_r_without_an_lm():
    with dspy.context(lm=None):
        rep = halluclean_report([_ex("x", reference="y")],
                                [dspy.Prediction(label=True, revision="y", revision_status="revised")])
    assert rep["R"] is None and "no LM" in rep["R_skipped"] and rep["Q"] == 1.0


def test_mipro_compiles_the_detection_stages_with_a_scripted_lm():
    def respond(call):
        if "verdict" in call.outputs:
            return {"verdict": "Yes" if "Sydney" in call.inputs.get("input", "").split("Answer:")[-1] else "No"}
        for k in ("plan", "analysis", "revision"):
            if k in call.outputs:
                return {k: "x"}
        return {"proposed_instruction": "Check every fact against the knowledge.", "observations": "QA.",
                "summary": "QA.", "program_description": "Detects hallucinations.", "module_description": "A stage."}

    lm = scripted_lm(respond)
    examples = [e.copy(id=f"{e.id}-{i}") for i, e in enumerate(halluclean_demo("qa", notice=False) * 4)]
    from halluscope.metrics.adapters import f1_metric

    with dspy.context(lm=lm, adapter=dspy.JSONAdapter()):
        opt = dspy.MIPROv2(metric=f1_metric, auto=None, num_candidates=2, max_bootstrapped_demos=1,
                           max_labeled_demos=1, verbose=False, num_threads=1)
        compiled = opt.compile(get_program("halluclean").build(revise=False), trainset=examples[:4], valset=examples[4:],
                               num_trials=2, minibatch=False)
        pred = compiled(**QA)
    assert isinstance(compiled, HalluClean)
    assert [n for n, _ in compiled.named_predictors()] == ["plan", "reason", "judge", "revise"]
    assert any("proposed_instruction" in c.outputs for c in lm.engine.calls)  # instructions were proposed
    assert pred.label is True and pred.revision_status == "disabled"
