"""Issue #34: one verdict per output, "cannot verify" without evidence.

The invariant (core/contract.py): a response labelled correct holds no hard span, for every registered program,
whatever its LM answers (a property test over fuzzed LM outputs, scripted LMs) and whatever the spans a detection
is built with (fuzzed Detection inputs); ``grounded`` and ``medico`` also keep ``label == (score > 0.5)``.
"""

from __future__ import annotations

import random
import re

import dspy
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from halluscope.core.contract import Detection, Span
from halluscope.lm.scripted import scripted_lm
from halluscope.programs.registry import get_program, program_names

ANSWER = "The Golden Gate Bridge in Los Angeles opened in 1947 and is 1,280 metres long."
CONTEXT = ("The Golden Gate Bridge is a suspension bridge in San Francisco, California. It opened in 1937, and "
           "its main span is 1,280 metres long.")
QUESTION = "When did the Golden Gate Bridge open?"


def consistent(pred) -> bool:
    return bool(pred.label) or not pred.hard_labels


# -- the contract, fuzzed ------------------------------------------------------------------------------------

@settings(max_examples=300, deadline=None)
@given(n=st.integers(0, 80),
       spans=st.lists(st.tuples(st.integers(-5, 90), st.integers(-5, 90),
                                st.one_of(st.floats(allow_nan=True), st.sampled_from([0.5, 0.5000001, 1.0]))),
                      max_size=8),
       label=st.booleans(), score=st.one_of(st.floats(allow_nan=True), st.sampled_from([0.0, 0.5, 1.0])))
def test_no_detection_is_labelled_correct_while_holding_a_hard_span(n, spans, label, score):
    d = Detection(answer="x" * n, spans=spans, label=label, score=score)
    assert d.label or not d.hard_labels
    if d.hard_labels:
        assert d.score > 0.5 and d.verdict == "hallucinated"
    back = Detection.from_dict(d.to_dict())
    assert (back.label, back.score, back.hard_labels) == (d.label, d.score, d.hard_labels)


# -- every registered program, its LM answering at random ------------------------------------------------------

def _signature_type(name: str):
    """A type the scripted engine names as text (``QuotedSpans``, ``list[halluscope.signatures.jointcq.ClaimQuery]``)
    back as the class the signatures define (None when it is not one of theirs)."""
    import importlib
    import pkgutil

    import halluscope.signatures as sigs

    short = name.rsplit(".", 1)[-1]
    for info in pkgutil.iter_modules(sigs.__path__):
        mod = importlib.import_module(f"halluscope.signatures.{info.name}")
        if isinstance(getattr(mod, short, None), type):
            return getattr(mod, short)
    return None


def fuzz_responder(rng: random.Random, answer: str):
    """An LM answering every output field with a random value of its type (structured ones filled field by field,
    quotes taken from the answer), so that each program meets labels, spans and scores it did not choose."""
    import typing

    import pydantic

    words = answer.split()

    def quote() -> str:
        i = rng.randrange(len(words))
        return " ".join(words[i:i + rng.randint(1, 3)])

    def of(ann, depth=0):
        origin, args = typing.get_origin(ann), typing.get_args(ann)
        if origin is typing.Literal:
            return rng.choice(args)
        if origin in (list, tuple, set) or (isinstance(ann, type) and issubclass(ann, list)):
            item = args[0] if args else _signature_type(ann.__name__[:-1]) if isinstance(ann, type) else str
            return [of(item or str, depth + 1) for _ in range(rng.randint(0, 3))]
        if isinstance(ann, type) and issubclass(ann, pydantic.BaseModel):
            return {k: of(f.annotation, depth + 1) for k, f in ann.model_fields.items()}
        if ann is bool:
            return rng.random() < 0.5
        if ann is float:
            return rng.choice([rng.random(), 0.5, 1.0, 0.0])
        if ann is int:
            return rng.randint(0, 3)
        return rng.choice(["Yes", "No", "True", "False", "hallucinated", "accurate", "contradiction", "correct",
                           f'"{quote()}"', quote(), ""])

    def value(kind: str):
        lits = re.findall(r"'([^']*)'", kind)
        if kind.startswith("Literal") and lits:
            return rng.choice(lits)
        inner = re.fullmatch(r"list\[(.+)\]", kind)
        t = _signature_type(inner.group(1) if inner else kind)
        if t is not None:
            return of(list[t] if inner else t)
        return of({"bool": bool, "float": float, "int": int}.get(kind, list[str] if kind.startswith("list") else str))

    def respond(call):
        return {name: value(kind) for name, kind in call.outputs.items()}

    return respond


LM_FREE_OPTIONS = {"grounded": {}, "mark-all": {}, "logits": {}}
SMALL = {"finch": {"n_samples": 2, "correct": False}, "medico": {"correct": False}}


@pytest.mark.parametrize("name", sorted(program_names()))
@settings(max_examples=8, deadline=None, suppress_health_check=list(HealthCheck))
@given(seed=st.integers(0, 10_000), with_context=st.booleans(), with_question=st.booleans())
def test_every_program_labelled_correct_holds_no_hard_span(name, seed, with_context, with_question):
    rng = random.Random(seed)
    spec = get_program(name)
    try:
        module = spec.make(**SMALL.get(name, {}))
    except Exception as e:  # noqa: BLE001 - a program that needs options it cannot default is skipped, named
        pytest.skip(f"{name} cannot be built with its defaults: {e}")
    inputs = {"question": QUESTION if with_question else "", "answer": ANSWER,
              "context": CONTEXT if with_context else "", "lang": "en"}
    with dspy.context(lm=scripted_lm(fuzz_responder(rng, ANSWER)), adapter=None):
        try:
            pred = module(**inputs)
        except Exception as e:  # noqa: BLE001 - a raised item is a failed item, not a verdict: nothing to check
            pytest.skip(f"{name} raised on fuzzed LM output: {type(e).__name__}")
    assert consistent(pred), (name, pred.label, pred.hard_labels, pred.score)
    if name in ("grounded", "medico"):
        assert bool(pred.label) == (pred.score > 0.5), (name, pred.label, pred.score)


# -- grounded: "cannot verify" without evidence --------------------------------------------------------------

FAST = {"align": True, "rules": True}


def test_grounded_without_evidence_is_unverifiable_and_paints_no_word():
    m = get_program("grounded").make(**FAST)
    pred = m(question="", answer="Paris is the capital of France.", context="", lang="en")
    d = pred.detection
    assert d.verdict == "unverifiable" and d.label is False and d.score == 0.5
    assert pred.spans == [] and pred.hard_labels == [] and pred.units == []
    assert pred.notes.get("no_evidence") == 1 and pred.rationale.startswith("cannot verify")
    row = d.to_dict()
    assert row["verdict"] == "unverifiable" and "no evidence" in row["verdict_reason"]


def test_grounded_evidence_free_scoring_on_request_and_when_fitted_without_evidence():
    m = get_program("grounded").make(evidence_free=True, **FAST)
    pred = m(question="", answer="Paris is the capital of France.", context="", lang="en")
    assert pred.units and pred.spans  # every word scored, as Mu-SHROOM's --context none protocol asks
    assert pred.notes.get("no_evidence") == 1
    # a program fitted on items that all lack evidence scores without evidence, and says so in its state
    ex = [dspy.Example(question="q", answer=f"Paris has {n} bridges.", context="", lang="en",
                       soft_labels=[{"start": 10, "end": 12, "prob": 1.0}], hard_labels=[[10, 12]]).with_inputs(
        "question", "answer", "context", "lang") for n in range(10, 30)]
    fitted = get_program("grounded").make(**FAST)
    get_program("grounded").fit(fitted, ex, "iou")
    assert fitted.evidence_free is True
    state = fitted.dump_state()
    again = get_program("grounded").make(**FAST)
    again.load_state(state)
    assert again.evidence_free is True
    assert again(question="", answer="Paris has 12 bridges.", context="", lang="en").units


def test_grounded_label_agrees_with_its_spans_on_a_swapped_city_and_year_with_or_without_question():
    m = get_program("grounded").make(**FAST)
    for q in (QUESTION, ""):
        pred = m(question=q, answer="The Golden Gate Bridge in Los Angeles opened in 1947.", context=CONTEXT,
                 lang="en")
        assert pred.hard_labels and pred.label is True and pred.score > 0.5


def test_grounded_unit_labels_spans_and_rationale_count_come_from_one_number():
    m = get_program("grounded").make(**FAST)
    pred = m(question="", answer=ANSWER, context=CONTEXT, lang="en")
    flagged = [u for u in pred.units if u["label"] in ("unsupported", "verbatim")]
    assert all(u["score"] > 0.5 for u in flagged)
    assert all(u["score"] <= 0.5 for u in pred.units if u["label"] == "supported")
    assert pred.rationale.startswith(f"{len(flagged)} of {len(pred.units)} units flagged (p > 0.5")
    hard = {i for a, b in pred.hard_labels for i in range(a, b)}
    for u in pred.units:  # a unit is inside a hard span exactly when it is labelled unsupported (or verbatim)
        assert (u["label"] in ("unsupported", "verbatim")) == any(i in hard for i in range(u["start"], u["end"]))


def test_contract_settles_a_program_that_forgets_the_invariant():
    d = Detection(answer=ANSWER, spans=[Span(0, 3, 0.9)], label=False, score=0.1)
    assert d.label is True and d.score == 0.9


def _with_head(p_intercept: float):
    """The untrained program with a response head that says the same for every answer (its intercept)."""
    from halluscope.programs.grounded.combiner import Combiner
    from halluscope.programs.grounded.response import ResponseHead

    m = get_program("grounded").make(**FAST)
    feats = m.response_features
    m.head = ResponseHead(Combiner(feats, [p_intercept] + [0.0] * len(feats)), threshold=0.5)
    return m


def test_a_longer_answer_the_head_judges_correct_keeps_no_hard_span_its_flagged_units_are_doubtful():
    m = _with_head(-6.0)  # the head: correct, always
    answer = "The bridge opened in 1937. It was painted by Pablo Picasso in Los Angeles."
    pred = m(question="", answer=answer, context=CONTEXT, lang="en")
    assert pred.label is False and pred.hard_labels == [] and pred.score <= 0.5
    doubtful = [u["text"] for u in pred.units if u["label"] == "doubtful"]
    assert "Picasso" in doubtful and all(u["score"] <= 0.5 for u in pred.units)
    assert "held at 0.5 (doubtful)" in pred.rationale
    from halluscope.core.contract import display_marks
    shown = {answer[x["start"]:x["end"]] for x in display_marks(pred.detection) if x["kind"] == "possibly"}
    assert "Picasso" in shown and "1937" not in shown


def test_a_one_sentence_answer_is_decided_by_its_flagged_words_whatever_the_head_says():
    m = _with_head(-6.0)
    pred = m(question="", answer="The Golden Gate Bridge in Los Angeles opened in 1947.", context=CONTEXT, lang="en")
    assert pred.label is True and pred.hard_labels and pred.score > 0.5
    assert "decide the label" in pred.rationale
    # and a head that says hallucinated labels an answer without flagged words hallucinated, no span invented
    pred = _with_head(6.0)(question="", answer="The Golden Gate Bridge opened in 1937.", context=CONTEXT, lang="en")
    assert pred.label is True and pred.score > 0.5


def test_outside_the_heads_language_the_flagged_words_decide_a_longer_answer():
    m = _with_head(-6.0)  # fitted on English answers: it decides English ones only
    answer = "The bridge opened in 1937. It was painted by Pablo Picasso in Los Angeles."
    pred = m(question="", answer=answer, context=CONTEXT, lang="de")
    assert pred.label is True and pred.hard_labels
    assert "not in English" in pred.rationale
