"""JointCQ with scripted LMs: every branch of generate → search → verify → align → aggregate, the
criteria-guided filtering (metric, compile, fine-tuning export) and the optimize command on tiny fixtures."""

from __future__ import annotations

import json

import dspy
import pytest

from halluscope.core.contract import Evidence
from halluscope.programs.jointcq.program import jointcq_report
from halluscope.programs.jointcq.align import (CORRECT, HALLUCINATED, UNCHECKED, UNVERIFIABLE, aggregate, align_claim,
                                               asserted_spans, claim_score, parse_label, similarity)
from halluscope.programs.jointcq.demo_filter import (CriteriaJudge, compile_claim_queries, coverage, criteria_metric,
                                                export_filtered_pairs)
from halluscope.programs.registry import get_program
from halluscope.core.retrieval import register_retriever
from halluscope.retrievers.kb import build_index
from halluscope.signatures.jointcq import ClaimQuery, ClaimsAndQueries
from halluscope.lm.scripted import scripted_lm
from halluscope.core.text import segment

Q = "Tell me about Paris."
ANSWER = "Paris is the capital of Germany. The city has about two million inhabitants."
CONTEXT = "Berlin is the capital of Germany.\n\nParis has about two million inhabitants.\n\nParis is in France."
PAIRS = [("Paris is the capital of Germany.", "capital of Germany"),
         ("Paris has about two million inhabitants.", "Paris population")]


# -- recording / failing retrievers (registered once; the program takes a spec string) -------------------------

class Recorder:
    source = "rec"
    queries: list[str] = []

    def retrieve(self, query, *, k=5, context=""):
        Recorder.queries.append(query)
        return [Evidence(text=f"snippet {i} for {query}", source="rec", id=f"r{i}") for i in range(k + 3)]


class Flaky:
    """Raises for queries that mention 'boom'; finds nothing for 'nothing'."""

    source = "flaky"

    def retrieve(self, query, *, k=5, context=""):
        if "boom" in query:
            raise TimeoutError("search server timed out")
        return [] if "nothing" in query else [Evidence(text="Paris is in France.", source="flaky", id="f1")]


register_retriever("jcq-rec", lambda arg: Recorder())
register_retriever("jcq-flaky", lambda arg: Flaky())


def responder(pairs=PAIRS, label=lambda claim: "Hallucinated." if "Germany" in claim else "**correct**",
              batch=None, criteria=None):
    def respond(call):
        out = call.outputs
        if "pairs" in out:
            return {"pairs": [ClaimQuery(claim=c, query=q) for c, q in (pairs(call) if callable(pairs) else pairs)]}
        if "verdicts" in out:
            return {"verdicts": batch(call)}
        if "label" in out:
            return {"label": label(call.inputs["claim"]), "rationale": "see [1]"}
        if "entailed" in out or "relevant" in out:
            return criteria(call) if criteria else {k: "yes" for k in out}
        raise AssertionError(out)

    return respond


def run(module, lm, answer=ANSWER, question=Q, context=CONTEXT, lang="en"):
    with dspy.context(lm=lm):
        return module(question=question, answer=answer, lang=lang, context=context, task="qa")


# -- deterministic parts ---------------------------------------------------------------------------------------

@pytest.mark.parametrize("raw, want", [
    ("correct", (CORRECT, True)), ("**Hallucinated.**", (HALLUCINATED, True)), ("Label: supported", (CORRECT, True)),
    ("false", (HALLUCINATED, True)), ("contradicted by [2]", (HALLUCINATED, True)),
    ("not enough information", (UNVERIFIABLE, True)), ("The claim is not correct", (HALLUCINATED, True)),
    ("cannot be verified", (UNVERIFIABLE, True)), ("Unverifiable", (UNVERIFIABLE, True)), ("yes", (CORRECT, True)),
    (True, (CORRECT, True)), ("correct, hallucinated or unverifiable", (UNVERIFIABLE, False)),
    ("maybe?", (UNVERIFIABLE, False)), ("", (UNVERIFIABLE, False)), (None, (UNVERIFIABLE, False)),
])
def test_parse_label_is_lenient_and_says_when_it_did_not_recognise(raw, want):
    assert parse_label(raw) == want


def test_claim_score():
    assert claim_score(HALLUCINATED) == 1.0 and claim_score(CORRECT) == 0.0 and claim_score(UNVERIFIABLE, 0.2) == 0.2


def test_alignment_picks_the_sentence_and_the_asserted_words():
    sents = segment(ANSWER, "en")
    al = align_claim("Paris is the capital of Germany.", sents, Q)
    assert al.sentence == 0 and al.similarity == 1.0
    assert [ANSWER[s:e] for s, e in al.spans] == ["capital of Germany"]  # "Paris" is the question's (presupposed)
    al = align_claim("Paris has about two million inhabitants.", sents, Q)
    # "about" is a question word: presupposed
    assert al.sentence == 1 and [ANSWER[s:e] for s, e in al.spans] == ["two million inhabitants"]
    assert align_claim("Tokyo hosted the Olympic Games in 1964.", sents, Q).sentence is None  # below 0.5
    assert align_claim("Tokyo hosted the Olympic Games in 1964.", sents, Q, threshold=0.0).sentence is not None
    assert similarity("a b c", "") == 0.0 and similarity("Capital, Germany!", "germany capital") == 1.0
    assert similarity("two million inhabitant", "about two million inhabitants") == 1.0  # inflection
    assert similarity("Founded in 1964.", "Founded in 1965.") == 0.5  # numbers only exactly
    assert similarity("Paris is the capital.", "The capital.", question="Where is Paris?") == 1.0
    # a claim whose words are all the question's: the whole sentence is asserted
    assert align_claim("Paris.", segment("Paris.", "en"), Q).spans == ((0, 6),)


def test_alignment_of_cjk_claims():
    text = "巴黎是德国的首都。它有两百万人口。"
    sents = segment(text, "zh")
    al = align_claim("巴黎是德国的首都", sents, "巴黎在哪里？")
    assert al.sentence == 0 and [text[s:e] for s, e in al.spans] == ["是德国的首都"]
    assert asserted_spans("人口", sents[1]) == [(14, 16)]


def test_aggregate_sentence_and_response_labels():
    labels, scores, resp, score = aggregate(3, [(0, CORRECT, 0.0), (0, HALLUCINATED, 1.0), (1, UNVERIFIABLE, 0.3)])
    assert labels == [HALLUCINATED, UNVERIFIABLE, UNCHECKED] and scores == [1.0, 0.3, 0.0] and resp and score == 1.0
    labels, _, resp, score = aggregate(2, [(0, CORRECT, 0.0), (None, HALLUCINATED, 1.0)])
    assert labels == [CORRECT, UNCHECKED] and resp is True and score == 1.0  # an unaligned claim counts ...
    _, _, resp, score = aggregate(2, [(0, CORRECT, 0.0), (None, HALLUCINATED, 1.0)], unaligned_counts=False)
    assert resp is False and score == 0.0  # ... unless told not to
    assert aggregate(1, [(0, UNVERIFIABLE, 0.3)])[2] is False  # unverifiable is never hallucinated
    assert aggregate(2, [])[:3] == ([UNCHECKED, UNCHECKED], [0.0, 0.0], False)


# -- the program -----------------------------------------------------------------------------------------------

def test_claims_verified_aligned_and_aggregated_in_the_common_contract():
    lm = scripted_lm(responder())
    pred = run(get_program("jointcq").make(), lm)
    det = pred.detection
    assert det.label is True and det.score == 1.0
    assert [ANSWER[s:e] for s, e in det.hard_labels] == ["capital of Germany"]
    assert [(u.kind, u.label, ANSWER[u.start:u.end]) for u in det.units] == [
        ("sentence", HALLUCINATED, "Paris is the capital of Germany."),
        ("sentence", CORRECT, "The city has about two million inhabitants."),
        ("claim", HALLUCINATED, "Paris is the capital of Germany."),
        ("claim", CORRECT, "The city has about two million inhabitants.")]
    assert det.units[2].text == PAIRS[0][0] and det.units[2].rationale == "see [1]"
    # the half-score sentence span around the asserted words
    assert {(s.start, s.end, s.prob) for s in det.spans} >= {(0, 32, 0.5), (13, 31, 1.0)}
    # exact counts: ONE generate call, one verify call per claim, one search call per claim
    assert pred.calls == {"generate": 1, "verify": 2} and pred.lm_requests == 3 == len(lm.engine.calls)
    assert pred.search_calls == 2 == pred.judgements and det.failures == {}
    assert pred.counts == {"label_hallucinated": 1, "label_correct": 1, "status_ok": 2}
    verify = {c.inputs["claim"]: c for c in lm.engine.calls if "label" in c.outputs}  # threads: any order
    assert verify[PAIRS[0][0]].inputs["snippets"].startswith("[1] Berlin is the capital of Germany.")  # query found it
    assert det.evidence and {e.source for e in det.evidence} == {"context"}
    assert pred.pairs == [{"claim": c, "query": q} for c, q in PAIRS]
    assert pred.claims[0]["searched_with"] == "capital of Germany" and pred.claims[0]["sentence"] == 0


def test_queries_are_searched_top_k_and_the_without_queries_ablation_searches_claims():
    lm = scripted_lm(responder())
    Recorder.queries = []
    pred = run(get_program("jointcq").make(retriever="jcq-rec", top_k=4), lm)
    assert Recorder.queries == ["capital of Germany", "Paris population"]
    verify = [c for c in lm.engine.calls if "label" in c.outputs]
    assert all(c.inputs["snippets"].count("\n") == 3 for c in verify)  # top_k = 4 snippets of 7 found
    assert len(pred.detection.evidence) == 8
    Recorder.queries = []
    run(get_program("jointcq").make(retriever="jcq-rec", use_queries=False), lm)
    assert Recorder.queries == [c for c, _ in PAIRS]
    # a claim without a query is searched with the claim itself and counted
    Recorder.queries = []
    pred = run(get_program("jointcq").make(retriever="jcq-rec"), scripted_lm(responder(pairs=[(PAIRS[0][0], "")])))
    assert Recorder.queries == [PAIRS[0][0]] and pred.counts["query_fallback"] == 1


def test_no_factual_claim_is_a_valid_result_not_an_error():
    lm = scripted_lm(responder(pairs=[]))
    pred = run(get_program("jointcq").make(), lm, answer="I am not sure, sorry.")
    det = pred.detection
    assert det.label is False and det.spans == [] and det.failures == {}
    assert det.rationale == "no factual claim: nothing to check"
    assert pred.calls == {"generate": 1} and pred.search_calls == 0 and pred.judgements == 0
    assert [u.label for u in det.units] == [UNCHECKED]
    # an empty answer makes no call at all
    pred = run(get_program("jointcq").make(), lm, answer="  ")
    assert pred.calls == {} and pred.label is False and len(lm.engine.calls) == 1


def test_unaligned_claims_are_counted_and_kept_as_response_evidence():
    pairs = [("Tokyo hosted the Olympic Games in 1964 in Germany.", "Tokyo Olympics"), PAIRS[1]]
    lm = scripted_lm(responder(pairs=pairs))
    pred = run(get_program("jointcq").make(), lm)
    det = pred.detection
    assert pred.counts["unaligned"] == 1 and pred.claims[0]["sentence"] is None
    claim = [u for u in det.units if u.kind == "claim"][0]
    assert (claim.start, claim.end, claim.label) == (0, 0, HALLUCINATED)  # kept, without offsets
    assert det.hard_labels == [] and det.label is True  # no span, but the response is hallucinated
    assert [u.label for u in det.units if u.kind == "sentence"] == [UNCHECKED, CORRECT]
    pred = run(get_program("jointcq").make(unaligned_counts=False), lm)
    assert pred.label is False and pred.counts["unaligned"] == 1
    # a stricter threshold unaligns more: 3 of the 4 content words of this claim are in its sentence
    lm = scripted_lm(responder(pairs=[pairs[0], ("Paris has roughly two million inhabitants.", "q")]))
    assert run(get_program("jointcq").make(), lm).counts["unaligned"] == 1
    assert run(get_program("jointcq").make(align_threshold=0.8), lm).counts["unaligned"] == 2


def test_a_label_outside_the_three_is_unverifiable_and_counted():
    lm = scripted_lm(responder(label=lambda claim: "maybe?" if "Germany" in claim else "correct"))
    pred = run(get_program("jointcq").make(unverifiable_score=0.2), lm)
    det = pred.detection
    assert det.failures == {"label": 1} and pred.counts["status_label_unparsed"] == 1
    assert det.label is False and det.hard_labels == []
    assert det.units[0].label == UNVERIFIABLE and det.units[0].score == 0.2
    assert {(s.start, s.end, s.prob) for s in det.spans} == {(0, 32, 0.1), (13, 31, 0.2)}  # soft only
    assert pred.claims[0]["rationale"] == "see [1]" and pred.claims[0]["recognised"] is False


def test_a_failing_search_makes_that_claim_unverifiable_and_the_others_go_on():
    pairs = [("Paris is the capital of Germany.", "boom"), ("Paris has two million inhabitants.", "nothing"),
             ("Paris is in France.", "France")]
    lm = scripted_lm(responder(pairs=pairs))
    pred = run(get_program("jointcq").make(retriever="jcq-flaky"), lm, answer="Paris is the capital of Germany. "
               "It has two million inhabitants. It is in France.")
    by = {c["claim"]: c for c in pred.claims}
    assert by[pairs[0][0]]["status"] == "search_failed" and "TimeoutError" in by[pairs[0][0]]["rationale"]
    assert by[pairs[1][0]]["status"] == "no_evidence" and by[pairs[1][0]]["label"] == UNVERIFIABLE
    assert by[pairs[2][0]]["status"] == "ok" and by[pairs[2][0]]["label"] == CORRECT
    assert pred.detection.failures == {"search": 1} and pred.search_calls == 3 == pred.judgements
    assert pred.calls == {"generate": 1, "verify": 1}  # only the claim with evidence is verified
    assert pred.label is False


def test_batched_verification_is_one_call_and_a_skipped_claim_is_unverifiable():
    batch = lambda call: [{"index": 1, "label": "hallucinated", "rationale": "[1] says Berlin"},  # noqa: E731
                          {"index": 5, "label": "correct", "rationale": "no such claim"}]
    lm = scripted_lm(responder(batch=batch))
    pred = run(get_program("jointcq").make(batch_verify=True), lm)
    assert pred.calls == {"generate": 1, "verify": 1} and pred.lm_requests == 2
    assert [c["label"] for c in pred.claims] == [HALLUCINATED, UNVERIFIABLE]
    assert pred.detection.failures == {"label": 1} and pred.label is True
    prompt = [c for c in lm.engine.calls if "verdicts" in c.outputs][0].inputs["claims"]
    assert prompt.startswith("Claim 1: Paris is the capital of Germany.\nSnippets:\n[1]") and "Claim 2:" in prompt


def test_unparseable_model_output_is_a_counted_failure():
    lm = scripted_lm(lambda call: {"pairs": "no list here"} if "pairs" in call.outputs else {})
    pred = run(get_program("jointcq").make(), lm)
    assert pred.detection.failures == {"generate_parse": 1} and pred.label is False and pred.judgements == 0
    lm = scripted_lm(lambda call: {"pairs": [ClaimQuery(claim=PAIRS[0][0], query="q")]} if "pairs" in call.outputs
                     else {"verdicts": "broken"} if "verdicts" in call.outputs else {})
    pred = run(get_program("jointcq").make(batch_verify=True), lm)
    assert pred.detection.failures == {"verify_parse": 1} and pred.claims[0]["status"] == "verify_failed"


def test_knowledge_base_pooled_corpus_as_the_search_corpus(tmp_path):
    corpus = tmp_path / "c.jsonl"
    corpus.write_text("".join(json.dumps({"id": f"d{i}", "text": t}) + "\n" for i, t in enumerate(
        ["Berlin is the capital of Germany.", "Paris has two million inhabitants.", "Tokyo is in Japan."])))
    build_index(corpus, tmp_path / "kb")
    lm = scripted_lm(responder())
    pred = run(get_program("jointcq").make(retriever=f"kb:{tmp_path / 'kb'}", top_k=1), lm, context="")
    verify = {c.inputs["claim"]: c for c in lm.engine.calls if "label" in c.outputs}
    assert verify[PAIRS[0][0]].inputs["snippets"] == "[1] Berlin is the capital of Germany."
    assert {e.source for e in pred.detection.evidence} == {"kb"} and pred.search_calls == 2


def test_bad_options_are_clear_errors(tmp_path):
    with pytest.raises(ValueError, match="unknown retriever"):
        get_program("jointcq").make(retriever="nosuch")
    with pytest.raises(ValueError, match="top_k"):
        get_program("jointcq").make(top_k=0)
    with pytest.raises(ValueError, match="unverifiable_score"):
        get_program("jointcq").make(unverifiable_score=0.7)
    with pytest.raises(ValueError, match="align_threshold"):
        get_program("jointcq").make(align_threshold=1.5)


def test_report_counts_inferences_per_sample_and_search_calls_per_judgement():
    lm = scripted_lm(responder())
    module = get_program("jointcq").make()
    preds = [run(module, lm), run(module, scripted_lm(responder(pairs=[]))), None]
    rep = jointcq_report([None] * 3, preds)
    assert rep["jointcq_inferences_per_sample"] == 2.0  # (3 + 1) / 2 answered items
    assert rep["jointcq_search_calls_per_judgement"] == 1.0 and rep["jointcq_claims_per_sample"] == 1.0
    assert rep["jointcq_generate_calls_per_sample"] == 1.0 and rep["jointcq_verify_calls_per_sample"] == 1.0
    assert rep["jointcq_samples_without_claims"] == 1 and rep["jointcq_label_hallucinated"] == 1
    assert jointcq_report([], [None]) == {}


# -- criteria-guided filtering -------------------------------------------------------------------------------

def pronoun_is_not_decontextualised(call):
    if "entailed" in call.outputs:
        return {"entailed": "yes", "decontextualised": "no" if call.inputs["claim"].startswith("It ") else "Yes."}
    return {"relevant": "yes", "concise": "yes", "searchable": "no" if " " not in call.inputs["query"] else "yes"}


def test_criteria_judge_metric_and_coverage():
    lm = scripted_lm(responder(criteria=pronoun_is_not_decontextualised))
    judge = CriteriaJudge(lm=lm)
    ok = judge.check(Q, ANSWER, PAIRS[0][0], "capital of Germany")
    assert ok == {"entailed": True, "decontextualised": True, "relevant": True, "concise": True, "searchable": True,
                  "passed": True}
    assert judge.check(Q, ANSWER, "It is big.", "Paris size")["decontextualised"] is False
    assert judge.check(Q, ANSWER, PAIRS[0][0], "Germany")["passed"] is False
    assert judge.check(Q, ANSWER, PAIRS[0][0], "")["relevant"] is False  # no query: the query checks fail
    assert judge.stats["pairs_checked"] == 4 and judge.stats["pairs_passed"] == 1
    assert judge.stats["failed_searchable"] == 2 and judge.stats["failed_relevant"] == 1  # the empty query
    assert judge.stats["failed_decontextualised"] == 1

    assert coverage(ANSWER, [c for c, _ in PAIRS]) == 1.0 and coverage(ANSWER, [PAIRS[0][0]]) == 0.5
    assert coverage("", []) == 1.0
    metric = criteria_metric(judge=judge)
    ex = dspy.Example(question=Q, answer=ANSWER)
    good = dspy.Prediction(pairs=[{"claim": c, "query": q} for c, q in PAIRS])
    half = dspy.Prediction(pairs=[{"claim": PAIRS[0][0], "query": "capital of Germany"},
                                  {"claim": "It has two million inhabitants.", "query": "Paris population"}])
    assert metric(ex, good) == 1.0 and metric(ex, good, trace=[]) is True
    assert metric(ex, half) == 0.5 and metric(ex, half, trace=[]) is False
    assert metric(ex, dspy.Prediction(pairs=[good.pairs[0]])) == 0.0  # covers half the answer: fails coverage
    assert criteria_metric(judge=judge, min_coverage=0.5)(ex, dspy.Prediction(pairs=[good.pairs[0]])) == 1.0
    assert metric(ex, dspy.Prediction(pairs=[])) == 0.0
    assert criteria_metric(judge=judge, allow_empty=True)(ex, dspy.Prediction(pairs=[])) == 1.0
    # combined with a task metric
    both = criteria_metric(lambda e, p, trace=None: 0.5, judge=judge)
    assert both(ex, good) == 0.5 and both(ex, good, trace=[]) is False


def test_compiling_the_claim_query_stage_keeps_only_demos_that_pass_the_criteria():
    def pairs(call):  # the second answer yields a claim that is not decontextualised
        a = call.inputs["answer"]
        return [(s.text if not s.text.startswith("The city") else "It has two million inhabitants.",
                 " ".join(s.text.split()[-2:]))
                for s in segment(a, "en")] if "Rome" not in a else [("It is old.", "Rome age")]

    lm = scripted_lm(responder(pairs=pairs, criteria=pronoun_is_not_decontextualised))
    train = [dspy.Example(question=Q, answer=ANSWER),
             dspy.Example(question="Rome?", answer="Rome is old."),
             dspy.Example(question="Berlin?", answer="Berlin is the capital of Germany.")]
    program = get_program("jointcq").make()
    with dspy.context(lm=lm):
        compile_claim_queries(program, train, max_bootstrapped_demos=4)
    assert [d["answer"] for d in program.generate.demos] == ["Berlin is the capital of Germany."]
    with pytest.raises(ValueError, match="optimizer"):
        compile_claim_queries(program, train, optimizer="nope")


def test_export_filtered_pairs_as_chat_finetuning_jsonl(tmp_path):
    lm = scripted_lm(responder(criteria=pronoun_is_not_decontextualised))
    examples = [{"question": Q, "answer": ANSWER},  # generated: passes
                {"question": Q, "answer": ANSWER, "pairs": [{"claim": "It is big.", "query": "Paris size"},
                                                            *({"claim": c, "query": q} for c, q in PAIRS)]},
                {"question": "Q?", "answer": "Nothing.", "pairs": []}]
    with dspy.context(lm=lm):
        stats = export_filtered_pairs(examples, tmp_path / "ft" / "sample.jsonl")
        per_pair = export_filtered_pairs(examples, tmp_path / "pair.jsonl", keep="pair")
    rows = [json.loads(x) for x in (tmp_path / "ft" / "sample.jsonl").read_text().splitlines()]
    assert len(rows) == 1 and stats["samples"] == 3 and stats["samples_kept"] == 1 and stats["no_pairs"] == 1
    assert stats["failed_decontextualised"] == 1 and stats["pairs"] == 5 and stats["pairs_passed"] == 4
    roles = [m["role"] for m in rows[0]["messages"]]
    assert roles == ["system", "user", "assistant"]
    assert rows[0]["messages"][0]["content"].startswith("Extract every factual claim")
    assert rows[0]["messages"][1]["content"] == f"Question: {Q}\nAnswer: {ANSWER}"
    assert json.loads(rows[0]["messages"][2]["content"]) == [{"claim": c, "query": q} for c, q in PAIRS]
    rows = [json.loads(x) for x in (tmp_path / "pair.jsonl").read_text().splitlines()]
    assert per_pair["samples_kept"] == 2 and len(json.loads(rows[1]["messages"][2]["content"])) == 2
    with pytest.raises(ValueError, match="keep"):
        export_filtered_pairs([], tmp_path / "x.jsonl", keep="all")
    assert ClaimsAndQueries.instructions.startswith("Extract every factual claim")


# -- optimize.py on tiny fixtures ----------------------------------------------------------------------------

def _claims_of_answer(call):
    return [(s.text, " ".join(s.text.split()[:4])) for s in segment(call.inputs["answer"], "en")]


def _verify_by_context(call):
    return "hallucinated" if any(w in call.inputs["claim"] for w in ("Sydney", "Lyon", "1900")) else "correct"


def _optimize(tmp_path, lm, *argv):
    from halluscope.cli.optimize import build_parser, run

    p = build_parser()
    args = p.parse_args(["--program", "jointcq", "--compiled-dir", str(tmp_path / "compiled"), "--report-dir",
                         str(tmp_path / "reports"), "--no-mlflow", "--quiet", "--folds", "2", *argv])
    return run(args, p, task_lm=lm, prompt_lm=lm)


@pytest.fixture
def no_data_env(monkeypatch):
    for var in ("HALLUSCOPE_DATA_DIR", "HALLUSCOPE_HALLUCLEAN_DIR", "MLFLOW_TRACKING_URI"):
        monkeypatch.delenv(var, raising=False)


def test_optimize_jointcq_f1_on_halluclean_qa(tmp_path, no_data_env, capsys):
    from halluscope.artifacts.store import load_compiled

    recs = [{"knowledge": f"{city} is the capital of {country}.", "question": f"What is the capital of {country}?",
             "right_answer": f"The capital of {country} is {city}.",
             "hallucinated_answer": f"The capital of {country} is {wrong}.", "id": i}
            for i, (city, country, wrong) in enumerate([("Canberra", "Australia", "Sydney"),
                                                        ("Paris", "France", "Lyon"), ("Ottawa", "Canada", "Lyon")])]
    (tmp_path / "QA.dev.json").write_text(json.dumps(recs))
    lm = scripted_lm(responder(pairs=_claims_of_answer, label=lambda c: _verify_by_context(type("C", (), {
        "inputs": {"claim": c}})())))
    rc = _optimize(tmp_path, lm, "--metric", "f1", "--task", "qa", "--data-dir", str(tmp_path))
    out = capsys.readouterr().out
    assert rc == 0, out
    assert "zero-shot vs compiled, 2-fold" in out and "fit hook" in out
    art = load_compiled("jointcq", lang="qa", metric="f1", root=tmp_path / "compiled")
    assert art.manifest["optimizer"]["name"] == "fit" and art.manifest["cv"]["mean"]["compiled"]["f1"]["mean"] == 1.0
    assert len(art.program.generate.demos) == 2  # criteria-filtered demos of the claim-query stage, as JSON state
    assert art.program.verify.demos == []  # the verifier is not compiled


def test_optimize_jointcq_iou_on_mushroom_en(tmp_path, no_data_env, capsys):
    from halluscope.artifacts.store import load_compiled

    lm = scripted_lm(responder(pairs=_claims_of_answer, label=lambda c: _verify_by_context(type("C", (), {
        "inputs": {"claim": c}})())))
    rc = _optimize(tmp_path, lm, "--metric", "iou", "--lang", "en", "-O", "filter_demos=1")
    out = capsys.readouterr().out
    assert rc == 0, out
    art = load_compiled("jointcq", lang="en", metric="iou", root=tmp_path / "compiled")
    assert art.manifest["metric"] == "iou" and "iou" in art.manifest["cv"]["mean"]["compiled"]
    assert len(art.program.generate.demos) == 1 and art.program.filter_demos == 1
    with dspy.context(lm=lm):
        pred = art.program(question="What is the capital of Australia?", answer="The capital of Australia is Sydney.",
                           lang="en", context="Canberra is the capital of Australia.")
    assert pred.label is True and pred.hard_labels


def test_parse_errors_in_the_verifier_and_the_criteria_judges_are_counted(monkeypatch):
    from dspy.utils.exceptions import AdapterParseError

    def broken(**kwargs):
        raise AdapterParseError(adapter_name="ChatAdapter", signature=ClaimsAndQueries, lm_response="???")

    module = get_program("jointcq").make()
    monkeypatch.setattr(module, "verify", broken)
    pred = run(module, scripted_lm(responder()))
    assert pred.detection.failures == {"verify_parse": 2} and pred.label is False
    assert {c["status"] for c in pred.claims} == {"verify_failed"} and pred.calls["verify"] == 2

    judge = CriteriaJudge(lm=scripted_lm(responder()))
    monkeypatch.setattr(judge, "claim_check", broken)
    assert judge.check(Q, ANSWER, PAIRS[0][0], "capital of Germany") == {
        "entailed": False, "decontextualised": False, "relevant": True, "concise": True, "searchable": True,
        "passed": False}
    monkeypatch.setattr(judge, "query_check", broken)
    assert judge.check(Q, ANSWER, PAIRS[0][0], "capital of Germany")["relevant"] is False
    assert judge.stats["unparsed_judgements"] == 3 and judge.stats["pairs_passed"] == 0


def test_a_repeated_claim_is_checked_once_and_counted():
    pairs = [PAIRS[0], (" paris is the capital of  GERMANY.", "again"), PAIRS[0], ("", "orphan query")]
    lm = scripted_lm(responder(pairs=pairs))
    pred = run(get_program("jointcq").make(), lm)
    assert pred.judgements == 1 and pred.search_calls == 1 and pred.calls == {"generate": 1, "verify": 1}
    assert pred.counts["repeated_claims_dropped"] == 2 and pred.detection.failures == {"empty_claim": 1}
    assert len(pred.detection.spans) == len(set(pred.detection.spans))


def test_halluscope_evaluate_jointcq_prints_and_records_the_paper_efficiency_counts(tmp_path, no_data_env, capsys,
                                                                                      monkeypatch):
    """The CLI path the benchmark uses: evaluate on a HalluClean QA file with a scripted LM; the summary
    carries inferences per sample and search calls per judgement (the paper's 4.93 / 1), counted exactly."""
    import halluscope.cli.evaluate as ev
    from halluscope.cli import main as cli_main

    recs = [{"knowledge": f"{city} is the capital of {country}.", "question": f"What is the capital of {country}?",
             "right_answer": f"The capital of {country} is {city}.",
             "hallucinated_answer": f"The capital of {country} is {wrong}.", "id": i}
            for i, (city, country, wrong) in enumerate([("Canberra", "Australia", "Sydney"),
                                                        ("Paris", "France", "Lyon")])]
    (tmp_path / "QA.dev.json").write_text(json.dumps(recs))
    lm = scripted_lm(responder(pairs=_claims_of_answer, label=lambda c: _verify_by_context(type("C", (), {
        "inputs": {"claim": c}})())))

    def scripted_setup(args, needed=True):
        dspy.configure(lm=lm, adapter=dspy.JSONAdapter())
        return lm

    monkeypatch.setattr(ev, "setup_lm", scripted_setup)
    rc = cli_main(["evaluate", "--program", "jointcq", "--dataset", "halluclean", "--task", "qa", "--data-dir",
                   str(tmp_path), "--out-dir", str(tmp_path / "out"), "--no-mlflow", "--no-progress"])
    out = capsys.readouterr().out
    assert rc == 0, out
    summary = json.loads(next((tmp_path / "out").rglob("jointcq.summary.json")).read_text())["summary"]
    assert summary["n"] == 4 and summary["f1"] == 1.0  # 2 right + 2 hallucinated answers, each one claim
    # one claim-query call + one verification per claim (one sentence = one claim) = 2 inferences per sample
    assert summary["jointcq_inferences_per_sample"] == 2.0
    assert summary["jointcq_search_calls_per_judgement"] == 1.0 and summary["jointcq_claims_per_sample"] == 1.0
    assert "jointcq_inferences_per_sample" in out and "jointcq_search_calls_per_judgement" in out
