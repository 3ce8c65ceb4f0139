"""Bounded free-text outputs (#21 round four): the rationale of JointCQ's calibrated verifier and the explanation of
FINCH-ZK's calibrated judge are declared with a ``max_length``; for the embedded engine the JSON schema its grammar
is built from carries it as ``maxLength``, so a looping small model closes the string within the token budget and
its decision survives. Other backends get DSPy's schema unchanged, and a longer text from an unconstrained LM still
parses."""

import dspy

from halluscope.core.decisions import with_logprob_decisions
from halluscope.lm.models import (GuardedJSONAdapter, LlamaCppEngine, SchemaJSONAdapter, bound_text_outputs,
                                  response_schema, text_bounds)
from halluscope.lm.scripted import ScriptedEngine, _install_tap

DIST = {"correct": 0.6, "hallucinated": 0.3, "unverifiable": 0.1}
LOOP = "a fictional character created by X, " * 12  # 432 characters


class _Sig(dspy.Signature):
    """x"""

    claim: str = dspy.InputField()
    label: str = dspy.OutputField()
    why: str = dspy.OutputField(desc="why", max_length=50)


def test_text_bounds_reads_max_length_and_bound_text_outputs_sets_it():
    assert text_bounds(_Sig) == {"why": 50}
    schema = {"type": "object", "properties": {"label": {"type": "string"}, "why": {"type": "string"}}}
    out = bound_text_outputs(schema, _Sig)
    assert out["properties"]["why"] == {"type": "string", "maxLength": 50}
    assert out["properties"]["label"] == {"type": "string"} and "maxLength" not in schema["properties"]["why"]
    tighter = {"type": "object", "properties": {"why": {"type": "string", "maxLength": 20}}}
    assert bound_text_outputs(tighter, _Sig)["properties"]["why"]["maxLength"] == 20
    # parsing is not bounded: an LM that was not constrained keeps its longer text (with brackets and all)
    assert dspy.JSONAdapter().parse(_Sig, '{"label": "a", "why": "see [1] ' + "w" * 80 + '"}')["why"].startswith("see [1] w")


def test_only_the_embedded_engine_claims_to_enforce_max_length():
    from halluscope.lm.openai_client import OpenAICompatEngine

    assert LlamaCppEngine.enforces_max_length is True
    assert not getattr(OpenAICompatEngine, "enforces_max_length", False)


class _SchemaEngine(ScriptedEngine):
    """The scripted engine, taking a response schema (and enforcing maxLength, as the embedded engine does when
    ``enforces``), keeping each schema it got."""

    supports_response_schema = True
    supported_params = ScriptedEngine.supported_params | {"response_format"}
    enforces_max_length = True

    def __post_init__(self):
        super().__post_init__()
        self.formats = []

    def complete(self, request):
        self.formats.append(response_schema(request.config.response_format))
        return super().complete(request)


def _jointcq(engine_cls, adapter):
    from halluscope.programs.registry import get_program

    _install_tap()
    engine = engine_cls({"pairs": lambda call: [{"claim": "Berlin holds item 0", "query": "item 0"}],
                         "label": "correct", "rationale": LOOP}, logprobs=lambda call: {"label": DIST})
    program = get_program("jointcq").make(decisions=True)
    program.verify.fields = {"label": {"weights": dict.fromkeys(DIST, 1.0)}}
    with dspy.context(lm=dspy.LM("scripted/test", engine=engine, cache=False),
                      adapter=with_logprob_decisions(adapter)):
        pred = program(question="Where is item 0?", answer="Berlin holds item 0.", context="Item 0 is in Paris.")
    verify = [f for f in engine.formats if f and "label" in f["schema"]["properties"]]
    pairs = [f for f in engine.formats if f and "pairs" in f["schema"]["properties"]]
    return pred, verify, pairs


def test_jointcq_calibrated_verifier_asks_the_engine_for_a_bounded_rationale_and_keeps_its_label():
    from halluscope.signatures.jointcq import RATIONALE_CHARS

    for adapter in (GuardedJSONAdapter(), SchemaJSONAdapter()):
        pred, verify, pairs = _jointcq(_SchemaEngine, adapter)
        assert verify and all(f["schema"]["properties"]["rationale"]["maxLength"] == RATIONALE_CHARS for f in verify)
        assert "maxLength" not in str(verify[0]["schema"]["properties"]["label"])
        assert pairs and "maxLength" not in str(pairs[0]["schema"]["properties"]["pairs"])  # generation untouched
        assert not pred.failures and [c["label"] for c in pred.claims] == ["correct"]
        assert pred.claims[0]["rationale"] == LOOP.strip()  # what the LM wrote, not cut by the parser


def test_a_backend_that_does_not_enforce_max_length_gets_the_schema_unchanged():
    class _Plain(_SchemaEngine):
        enforces_max_length = False

    pred, verify, _ = _jointcq(_Plain, GuardedJSONAdapter())
    assert verify and all("maxLength" not in str(f["schema"]) for f in verify)
    assert not pred.failures


def test_finch_calibrated_judge_bounds_its_explanation_not_the_default_judges():
    from halluscope.signatures.finch import EXPLANATION_CHARS, JudgeBlock, JudgeBlockDecision

    assert text_bounds(JudgeBlockDecision) == {"explanation": EXPLANATION_CHARS}
    assert list(JudgeBlockDecision.output_fields) == ["explanation", "rating"]  # the rating follows the explanation
    assert text_bounds(JudgeBlock) == {}


def test_spans_prompt_writes_the_quote_schema_out_without_a_reference_to_copy():
    """The 135M model quoted "#/$defs/QuotedSpan" from the prompt's schema (#21 round four): the extractor's
    output type now has no $defs/$ref, in the prompt or in the engine's schema, and still parses to QuotedSpan."""
    from dspy.adapters.json_adapter import _get_structured_outputs_response_format

    from halluscope.signatures.spans import ExtractSpans, QuotedSpan

    prompt = dspy.JSONAdapter().format_field_structure(ExtractSpans)
    assert "$ref" not in prompt and "$defs" not in prompt and '\\"text\\"' in prompt
    schema = _get_structured_outputs_response_format(ExtractSpans).model_json_schema()
    assert "$defs" not in schema and schema["properties"]["spans"]["items"]["required"] == ["text", "probability"]
    parsed = dspy.JSONAdapter().parse(ExtractSpans, '{"spans": [{"text": "Berlin", "probability": 0.9}]}')
    assert parsed["spans"] == [QuotedSpan(text="Berlin", probability=0.9)]


def test_medico_detect_bounds_its_rationale_which_follows_the_verdict():
    from halluscope.signatures.medico import RATIONALE_CHARS, Detect, IdentifySpans

    assert text_bounds(Detect) == {"rationale": RATIONALE_CHARS}
    assert list(Detect.output_fields) == ["verdict", "rationale"]  # a cut rationale would lose the verdict
    assert text_bounds(IdentifySpans) == {}
