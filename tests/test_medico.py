"""MEDICO with a scripted LM: every branch of retrieval, fusion, detection, ensemble and correction."""

from __future__ import annotations

import json
import math
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import dspy
import pytest

from halluscope.programs.medico.program import (Medico, fit_combiner, medico_report, preservation, quoted,
                                        verdict_probability)
from halluscope.programs.registry import get_program
from halluscope.retrievers.kb import build_index
from halluscope.lm.scripted import scripted_lm

Q = "What is the capital of France?"
CONTEXT = "Paris is the capital and largest city of France.\n\nLyon is a city in France known for its food."
WRONG = "The capital of France is Lyon, a city on the Rhône."


def responder(revise=lambda a: a.replace("Lyon", "Paris"), summary="Paris is the capital of France."):
    """Detect flags answers that mention Lyon or Marseille; IdentifySpans quotes them; Revise applies ``revise``."""

    def respond(call):
        out = call.outputs
        if "verdict" in out:
            bad = [w for w in ("Lyon", "Marseille") if w in call.inputs["answer"]]
            return {"verdict": bool(bad), "rationale": (f'The answer says "{bad[0]}" but [1] says "Paris".'
                                                        if bad else "Supported by [1].")}
        if "summary" in out:
            return {"summary": summary}
        if "spans" in out:
            return {"spans": [w for w in ("Lyon", "Marseille") if w in call.inputs["answer"]]}
        if "revision" in out:
            return {"revision": revise(call.inputs["answer"])}
        raise AssertionError(out)

    return respond


def run(module, lm, **inputs):
    with dspy.context(lm=lm):
        return module(question=inputs.get("question", Q), answer=inputs.get("answer", WRONG), lang="en",
                      context=inputs.get("context", CONTEXT), task="qa")


def test_helpers():
    assert preservation("abcd", "abcd") == 1.0 and preservation("abcd", "abXd") == 0.75
    assert preservation("ab", "completely different") == 0.0 and preservation("", "") == 1.0
    assert verdict_probability(True) == pytest.approx(0.7311, abs=1e-4)
    assert verdict_probability(False, tau=0.1) < 1e-4 and verdict_probability(None) == 0.5
    assert quoted('says "Lyon" and “Rhône” and «Nice» and 「東京」') == ["Lyon", "Rhône", "Nice", "東京"]


def test_approved_in_the_first_round_with_spans_and_evidence():
    lm = scripted_lm(responder())
    pred = run(get_program("medico").make(), lm)
    det = pred.detection
    assert det.label is True and det.score == pytest.approx(verdict_probability(True))
    assert [WRONG[s.start:s.end] for s in det.spans] == ["Lyon"]  # "Paris" (an evidence quote) does not map
    assert pred.unmatched_quotes == 1
    assert det.evidence and det.evidence[0].source == "context" and "Paris" in det.evidence[0].text
    assert det.revision == "The capital of France is Paris, a city on the Rhône."
    assert pred.correction == "approved" and len(pred.rounds) == 1
    r = pred.rounds[0]
    assert r["accepted"] and r["approved"] and r["spans"] == ["Lyon"]
    assert r["preservation"] == pytest.approx(preservation(WRONG, det.revision))
    detect_calls = [c for c in lm.engine.calls if "verdict" in c.outputs]
    assert detect_calls[0].inputs["evidence"].startswith("[1] (context) Paris is the capital")
    assert det.to_dict()["evidence"][0]["source"] == "context"


def test_supported_answer_is_not_flagged_and_correction_can_be_disabled():
    lm = scripted_lm(responder())
    pred = run(get_program("medico").make(), lm, answer="The capital of France is Paris.")
    assert pred.label is False and pred.correction == "not_flagged" and pred.rounds == [] and pred.revision is None
    pred = run(get_program("medico").make(correct=False), lm)
    assert pred.label is True and pred.correction == "disabled" and pred.revision is None
    assert run(get_program("medico").make(), lm, answer="  ").correction == "not_flagged"


def test_revision_rejected_by_preservation_every_round():
    lm = scripted_lm(responder(revise=lambda a: "Paris."))
    pred = run(get_program("medico").make(max_rounds=3, delta=0.5), lm)
    assert pred.correction == "max_rounds" and pred.revision is None and len(pred.rounds) == 3
    assert all(not r["accepted"] and "below delta 0.5" in r["reason"] for r in pred.rounds)
    assert all(r["preservation"] < 0.5 for r in pred.rounds)
    revise_calls = [c for c in lm.engine.calls if "revision" in c.outputs]
    assert [c.temperature for c in revise_calls][1:] == [0.7, 0.7]  # retried as a fresh sample
    # the same revision passes a looser gate
    assert run(get_program("medico").make(max_rounds=3, delta=0.0), lm).rounds[0]["accepted"]


def test_max_rounds_when_the_detector_never_approves():
    lm = scripted_lm(responder(revise=lambda a: a.replace("Lyon", "Marseille").replace("Marseille,", "Marseille,")))
    pred = run(get_program("medico").make(max_rounds=3), lm)
    assert pred.correction == "max_rounds" and len(pred.rounds) == 3
    first = pred.rounds[0]
    assert first["accepted"] and not first["approved"] and first["reason"] == "still flagged"
    assert pred.revision == "The capital of France is Marseille, a city on the Rhône."
    assert [r["reason"] for r in pred.rounds[1:]] == ["unchanged", "unchanged"]
    report = medico_report([None], [pred])
    assert report["flagged"] == 1 and report["approved_after_round_3"] == 0.0 and report["mean_preservation"] > 0.5


def test_approved_after_two_rounds_is_reported_per_round():
    lm = scripted_lm(responder(revise=lambda a: a.replace("Lyon", "Marseille") if "Lyon" in a
                               else a.replace("Marseille", "Paris")))
    pred = run(get_program("medico").make(), lm)
    assert pred.correction == "approved" and [r["approved"] for r in pred.rounds] == [False, True]
    assert pred.revision.startswith("The capital of France is Paris")
    rep = medico_report([None, None], [pred, run(get_program("medico").make(), lm, answer="Paris.")])
    assert rep["flagged"] == 1 and rep["approved_after_round_1"] == 0.0 and rep["approved_after_round_2"] == 1.0


class _Boom(BaseHTTPRequestHandler):
    def do_GET(self):  # noqa: N802
        self.send_response(500)
        self.end_headers()

    def log_message(self, *args):
        pass


def test_failed_sources_are_counted_named_and_detection_goes_on(tmp_path):
    server = ThreadingHTTPServer(("127.0.0.1", 0), _Boom)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        url = f"http://127.0.0.1:{server.server_address[1]}/s"
        module = get_program("medico").make(sources="context,kb,files,search", kb=str(tmp_path / "no-index"),
                                    files=str(tmp_path / "missing.pdf"), search=url)
        pred = run(module, scripted_lm(responder()))
    finally:
        server.shutdown()
        server.server_close()
    assert set(pred.failed_sources) == {"kb", "files", "search"}
    assert "halluscope index build" in pred.failed_sources["kb"] and "HTTP 500" in pred.failed_sources["search"]
    assert pred.failures == {"source_kb": 1, "source_files": 1, "source_search": 1}
    assert pred.label is True and pred.detection.evidence[0].source == "context"
    assert medico_report([None], [pred])["failed_source_search"] == 1
    with pytest.raises(ValueError, match="unknown evidence source"):
        get_program("medico").make(sources="context,wiki")


def test_kb_files_kg_pooled_reranked_and_top_l(tmp_path):
    corpus = tmp_path / "c.jsonl"
    corpus.write_text("".join(json.dumps(d) + "\n" for d in [
        {"id": "fr", "text": "Paris is the capital of France."}, {"id": "de", "text": "Berlin is the capital of Germany."},
        {"id": "x", "text": "Bananas are yellow."}]))
    build_index(corpus, tmp_path / "ix")
    (tmp_path / "docs").mkdir()
    (tmp_path / "docs" / "a.md").write_text("France's capital city is Paris.")
    (tmp_path / "docs" / "empty.txt").write_text("")
    (tmp_path / "kg.tsv").write_text("Paris\tcapital_of\tFrance\n")
    module = get_program("medico").make(sources="kb,files,kg", kb=str(tmp_path / "ix"), files=str(tmp_path / "docs"),
                                kg=str(tmp_path / "kg.tsv"), top_l=3)
    pred = run(module, scripted_lm(responder()), context="")
    texts = [e.text for e in pred.detection.evidence]
    assert len(texts) == 3 and "Bananas are yellow." not in texts and texts[0] == "Paris is the capital of France."
    module.top_l = 10
    pred = run(module, scripted_lm(responder()), context="")
    assert {e.source for e in pred.detection.evidence} == {"kb", "file", "kg"}
    assert "1 skipped" in pred.source_notes["files"] and pred.failed_sources == {}


def test_summary_fusion_and_its_fallback():
    lm = scripted_lm(responder(summary="Paris is the capital."))
    pred = run(get_program("medico").make(fuse="summary", correct=False), lm)
    assert [c.inputs["evidence"] for c in lm.engine.calls if "verdict" in c.outputs] == ["Paris is the capital."]
    lm = scripted_lm(responder(summary=""))
    pred = run(get_program("medico").make(fuse="summary", correct=False), lm)
    assert pred.failures == {"fuse": 1}
    assert [c.inputs["evidence"] for c in lm.engine.calls if "verdict" in c.outputs][0].startswith("[1] (context)")


def test_ensemble_fitted_saved_as_json_and_used(tmp_path):
    (tmp_path / "kg.tsv").write_text("Paris\tcapital_of\tFrance\n")
    train = [dspy.Example(question=Q, answer=a, context=CONTEXT, label=lab).with_inputs("question", "answer", "context")
             for a, lab in [(WRONG, True), ("Paris is the capital.", False), ("It is Marseille.", True),
                            ("The capital is Paris.", False), ("Lyon.", None)]]
    lm = scripted_lm(responder())
    module = get_program("medico").make(sources="context,kg", kg=str(tmp_path / "kg.tsv"))
    assert module.dump_state()["combiner"] == {"fitted": False}
    with dspy.context(lm=lm):
        info = fit_combiner(module, train, "f1")
    assert info["n"] == 4 and info["features"] == ["context", "kg", "fused"] and info["train_accuracy"] == 1.0
    state = json.loads(json.dumps(module.dump_state()))
    fresh = get_program("medico").make(sources="context,kg", kg=str(tmp_path / "kg.tsv"))
    fresh.load_state(state)
    assert fresh.combiner == module.combiner
    pred = run(fresh, lm, answer=WRONG)
    assert set(pred.source_p) == {"fused", "context", "kg"} and pred.label is True and pred.score > 0.5
    assert pred.score == pytest.approx(fresh.combine(pred.source_p))
    assert run(fresh, lm, answer="The capital is Paris.").label is False
    assert run(get_program("medico").make(sources="context,kg", kg=str(tmp_path / "kg.tsv"), ensemble=False)
               .load_state(state), lm).source_p == {"fused": pytest.approx(verdict_probability(True))}
    with pytest.raises(ValueError, match="no training example"):
        fit_combiner(module, train[-1:], "f1")


def test_registered_with_a_fit_hook_and_documented_options():
    spec = get_program("medico")
    assert spec.fit is fit_combiner and spec.level == "response" and spec.default_metric == "f1"
    assert all(spec.option_help[name] for name in spec.options)
    assert isinstance(spec.make(), Medico)


def test_zero_evidence_source():
    lm = scripted_lm(responder())
    pred = run(get_program("medico").make(sources="none", correct=False), lm)
    assert pred.detection.evidence == [] and pred.failed_sources == {} and pred.label is True
    assert [c.inputs["evidence"] for c in lm.engine.calls if "verdict" in c.outputs] == [""]


def test_optimize_fits_the_combiner_and_the_artifact_loads_it(tmp_path):
    """``python optimize.py --program medico`` path: the fit hook replaces the prompt optimizer; the fitted
    combiner is in the JSON artifact and comes back with load_compiled."""
    from halluscope.artifacts.store import load_compiled
    from halluscope.optimize.run import FINISHED, OptimizeConfig, run_optimize

    examples = [dspy.Example(id=f"e{i}", question=Q, answer=a, context=CONTEXT, lang="en", task="qa",
                             label=lab).with_inputs("question", "answer", "lang", "context", "task")
                for i, (a, lab) in enumerate([(WRONG, True), ("Paris is the capital.", False),
                                              ("It is Marseille.", True), ("The capital is Paris.", False)] * 2)]
    lm = scripted_lm(responder())
    config = OptimizeConfig(program="medico", metric="f1", lang="qa", source="fixture", folds=2,
                            program_options={"correct": False}, compiled_dir=tmp_path / "compiled",
                            report_dir=tmp_path / "reports", mlflow=False)
    with dspy.context(lm=lm):
        res = run_optimize(config, examples, task_lm=lm, prompt_lm=lm)
    assert res.status == FINISHED, res.error
    assert res.final.combiner["fitted"] and res.final.combiner["features"] == ["context", "fused"]
    state = json.loads((res.artifact.path / "program.json").read_text())
    assert state["combiner"] == res.final.combiner
    with dspy.context(lm=lm):
        loaded = load_compiled("medico", lang="qa", metric="f1", root=tmp_path / "compiled")
        assert loaded.program.combiner == res.final.combiner


def _logprob_lm(p_true: float):
    """The scripted LM, plus token log-probabilities on Detect outputs: the verdict token has p_true / 1-p_true."""
    import dataclasses
    import math

    from dspy.lm15 import TokenLogprob, TopLogprob

    from halluscope.lm.scripted import ScriptedEngine

    class LogprobEngine(ScriptedEngine):
        def complete(self, request):
            resp = super().complete(request)
            text = resp.message.parts[0].text
            if "[[ ## verdict ## ]]" not in text:
                return resp
            head, rest = text.split("[[ ## verdict ## ]]", 1)
            value = rest.strip().split()[0]
            lt, lf = math.log(p_true), math.log(1 - p_true)
            toks = [TokenLogprob(head + "[[ ## verdict ## ]]\n", -0.01),
                    TokenLogprob(value, lt if value == "True" else lf,
                                 top=(TopLogprob("True", lt), TopLogprob("False", lf), TopLogprob("Maybe", -9.0))),
                    TokenLogprob(rest.split(value, 1)[1], -0.5)]
            return dataclasses.replace(resp, logprobs=tuple(toks))

    scripted_lm(responder())  # installs the signature tap the engine reads
    return dspy.LM("scripted/logprobs", engine=LogprobEngine(responder()), cache=False)


def test_likelihood_from_token_logprobs_where_the_lm_gives_them():
    from halluscope.programs.medico.program import logprob_probability

    pred = run(get_program("medico").make(correct=False), _logprob_lm(0.9))
    assert pred.likelihood == "logprobs" and pred.score == pytest.approx(0.9, abs=1e-6) and pred.label is True
    pred = run(get_program("medico").make(correct=False, tau=0.5), _logprob_lm(0.9))
    assert pred.score == pytest.approx(1 / (1 + (0.1 / 0.9) ** 2), abs=1e-6)  # sharpened by the temperature
    pred = run(get_program("medico").make(correct=False), scripted_lm(responder()))
    assert pred.likelihood == "verdict" and pred.score == pytest.approx(verdict_probability(True))
    # JSON-style output, the other side missing from the alternatives
    entries = {"content": [{"token": '{"verdict": ', "logprob": -0.1, "top_logprobs": []},
                           {"token": "false", "logprob": math.log(0.8), "top_logprobs": []}]}
    assert logprob_probability(entries) == pytest.approx(0.2)
    assert logprob_probability({"content": []}) is None and logprob_probability(None) is None
    # llama.cpp under a JSON grammar (seen on the embedded model): the grammar forces a space where the model
    # wanted "True", and at the forced "true" its own distribution holds digits: the decision is the space's
    forced = {"content": [{"token": '{"verdict":', "logprob": -0.1, "top_logprobs": []},
                          {"token": " ", "logprob": -3.3, "top_logprobs": [{"token": ' "', "logprob": -1.3},
                                                                          {"token": "True", "logprob": math.log(0.3)},
                                                                          {"token": " False", "logprob": math.log(0.1)}]},
                          {"token": "true", "logprob": -10.0, "top_logprobs": [{"token": "1", "logprob": -0.4}]}]}
    assert logprob_probability(forced) == pytest.approx(0.75)  # 0.3 / (0.3 + 0.1), not e^-10


def test_apply_ranking_keeps_valid_numbers_first_then_the_rest():
    from halluscope.programs.medico.program import apply_ranking

    assert apply_ranking(4, [3, 1]) == [2, 0, 1, 3]
    assert apply_ranking(3, [2, 2, 9, 0, -1, "x", "3"]) == [1, 2, 0]  # repeats, out of range, junk dropped
    assert apply_ranking(2, []) == [0, 1] and apply_ranking(0, [1]) == []


def test_lm_rerank_orders_the_pool_and_falls_back_to_bm25_when_unparseable():
    context = "Lyon is a city in France known for its food.\n\nParis is the capital and largest city of France."

    def ranked(ranking):
        base = responder()

        def respond(call):
            return {"ranking": ranking} if "ranking" in call.outputs else base(call)
        return respond

    lm = scripted_lm(ranked([2, 1]))
    pred = run(get_program("medico").make(rerank="lm", correct=False), lm, context=context)
    rerank_calls = [c for c in lm.engine.calls if "ranking" in c.outputs]
    assert len(rerank_calls) == 1
    shown = rerank_calls[0].inputs["passages"].splitlines()
    assert len(shown) == 2 and shown[0].startswith("[1] (context)")
    texts = [line.split(") ", 1)[1] for line in shown]
    assert texts[0].startswith("Paris")  # BM25's order: the question's words are in the Paris paragraph
    assert [e.text for e in pred.detection.evidence] == texts[::-1] and pred.failures == {}  # the LM's order wins
    assert "reranker.rank" in dict(get_program("medico").make(rerank="lm").named_predictors())
    assert "reranker.rank" not in dict(get_program("medico").make().named_predictors())  # other settings: state unchanged
    # top_l after the LM's order; rerank_pool limits what the LM sees
    lm = scripted_lm(ranked([2, 1]))
    pred = run(get_program("medico").make(rerank="lm", top_l=1, correct=False), lm, context=context)
    assert [e.text for e in pred.detection.evidence] == texts[1:]
    pred = run(get_program("medico").make(rerank="lm", top_l=1, rerank_pool=1, correct=False), lm, context=context)
    assert [e.text for e in pred.detection.evidence] == texts[:1]  # a pool of one: nothing to ask the LM
    assert len([c for c in lm.engine.calls if "ranking" in c.outputs]) == 1
    # an unparseable ranking keeps the BM25 order and is counted
    lm = scripted_lm(ranked("not a list"))
    bm25 = run(get_program("medico").make(correct=False), scripted_lm(responder()), context=context)
    pred = run(get_program("medico").make(rerank="lm", correct=False), lm, context=context)
    assert pred.failures == {"rerank": 1}
    assert [e.text for e in pred.detection.evidence] == [e.text for e in bm25.detection.evidence]
    with pytest.raises(ValueError, match="expected one of 'bm25', 'lm', 'none'"):
        get_program("medico").make(rerank="cross-encoder")


class _Slow(BaseHTTPRequestHandler):
    def do_GET(self):  # noqa: N802
        import time

        time.sleep(1.0)
        try:
            self.send_response(200)
            self.end_headers()
            self.wfile.write(b"[]")
        except OSError:  # the client gave up (timed out) and closed the connection
            pass

    def log_message(self, *args):
        pass


def _bad_source(kind: str, tmp_path, url: str) -> dict:
    """Options of a medico whose one extra source (beside the working context) is broken in the way ``kind`` says."""
    from pypdf import PdfWriter

    d = tmp_path / "docs"
    d.mkdir()
    if kind == "encrypted_pdf":
        writer = PdfWriter()
        writer.add_blank_page(200, 200)
        writer.encrypt("secret", algorithm="RC4-128")
        with open(d / "locked.pdf", "wb") as f:
            writer.write(f)
    elif kind == "unreadable_pdf":
        (d / "broken.pdf").write_bytes(b"%PDF-1.4 not a pdf at all")
    elif kind == "empty_file":
        (d / "empty.txt").write_bytes(b"")
    elif kind == "binary_file":
        (d / "blob.md").write_bytes(b"\x00\x01binary\x00" * 20)
    elif kind == "huge_file":
        (d / "big.txt").write_text("Paris " * 400)
        return {"sources": "context,files", "files": str(d), "files_max_mb": 0.001}
    if kind.endswith(("_pdf", "_file")):
        return {"sources": "context,files", "files": str(d)}
    if kind == "missing_index":
        return {"sources": "context,kb", "kb": str(tmp_path / "no-index")}
    if kind == "kg_wrong_arity":
        (tmp_path / "kg.tsv").write_text("Paris\tcapital_of\tFrance\nLyon\tcity_in\n")
        return {"sources": "context,kg", "kg": str(tmp_path / "kg.tsv")}
    if kind == "search_off":
        return {"sources": "context,search"}
    return {"sources": "context,search", "search": url, "search_timeout": 0.3}  # search_timeout / search_500


@pytest.mark.parametrize("kind,source,reason", [
    ("encrypted_pdf", "files", "encrypted PDF"),
    ("unreadable_pdf", "files", "unreadable PDF"),
    ("empty_file", "files", "empty file"),
    ("binary_file", "files", "binary file"),
    ("huge_file", "files", "over the 0.001 MB limit"),
    ("missing_index", "kb", "halluscope index build"),
    ("kg_wrong_arity", "kg", "kg.tsv: line 2: expected 3 tab-separated fields"),
    ("search_off", "search", "web search is off"),
    ("search_timeout", "search", "did not answer within 0.3 s"),
    ("search_500", "search", "HTTP 500"),
])
def test_every_bad_input_is_a_counted_named_source_and_detection_goes_on(kind, source, reason, tmp_path,
                                                                          monkeypatch, caplog):
    monkeypatch.delenv("HALLUSCOPE_SEARCH_URL", raising=False)
    server = ThreadingHTTPServer(("127.0.0.1", 0), _Slow if kind == "search_timeout" else _Boom)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        options = _bad_source(kind, tmp_path, f"http://127.0.0.1:{server.server_address[1]}/s")
        with caplog.at_level("WARNING", logger="halluscope.programs.medico.program"):
            lm = scripted_lm(responder())
            module = get_program("medico").make(correct=False, **options)
            preds = [run(module, lm), run(module, lm)]
    finally:
        server.shutdown()
        server.server_close()
    for pred in preds:
        assert list(pred.failed_sources) == [source] and reason in pred.failed_sources[source]
        assert pred.failures == {f"source_{source}": 1}  # counted, and in Detection.to_dict() for `detect`
        assert pred.label is True and {e.source for e in pred.detection.evidence} == {"context"}
        assert pred.detection.evidence[0].text.startswith("Paris")
    assert len(lm.engine.calls) == 2  # one Detect per item: the broken source cost no LM call
    warned = [r.getMessage() for r in caplog.records if f"source {source!r}" in r.getMessage()]
    assert len(warned) == 1 and reason in warned[0]  # named once, with its reason, not once per item


def test_optimize_py_fits_the_ensemble_under_cv_and_halluscope_detect_serves_it(tmp_path, monkeypatch, capsys):
    """``python optimize.py --program medico --task qa --metric f1`` (argparse -> run_optimize, the CLI path) on a
    HalluClean-format fixture with a knowledge base pooled from every item's knowledge, then ``halluscope detect
    --program medico`` on the artifact; with the index gone, detect still answers and names the failed source."""
    import halluscope.cli as hcli
    import halluscope.cli.detect as detect_cmd
    from halluscope.artifacts.store import load_compiled
    from halluscope.cli.optimize import build_parser
    from halluscope.cli.optimize import run as optimize_run

    facts = [("France", "Paris", "Lyon"), ("Italy", "Rome", "Marseille"), ("Germany", "Berlin", "Lyon"),
             ("Spain", "Madrid", "Marseille")]
    data = tmp_path / "halluclean"
    data.mkdir()
    (data / "QA.dev.json").write_text(json.dumps([
        {"id": i, "knowledge": f"{right} is the capital of {country}.", "question": f"What is the capital of {country}?",
         "right_answer": f"The capital is {right}.", "hallucinated_answer": f"The capital is {wrong}."}
        for i, (country, right, wrong) in enumerate(facts)]))
    corpus = tmp_path / "pooled.jsonl"
    corpus.write_text("".join(json.dumps({"id": f"qa-{i}", "text": f"{r} is the capital of {c}."}) + "\n"
                              for i, (c, r, _) in enumerate(facts)))
    kb = build_index(corpus, tmp_path / "kb").folder
    lm = scripted_lm(responder())
    p = build_parser()
    args = p.parse_args(["--program", "medico", "--task", "qa", "--metric", "f1", "--data-dir", str(data),
                         "--folds", "2", "-O", "sources=context,kb", "-O", f"kb={kb}", "-O", "correct=false",
                         "--compiled-dir", str(tmp_path / "compiled"), "--report-dir", str(tmp_path / "reports"),
                         "--no-mlflow", "--quiet"])
    assert optimize_run(args, p, task_lm=lm) == 0
    out = capsys.readouterr().out
    assert "zero-shot vs compiled, 2-fold cross-validation" in out
    assert "fit hook fitted on the other folds" in out  # the ensemble is scored on held-out folds only
    art = load_compiled("medico", lang="qa", metric="f1", root=tmp_path / "compiled")
    combiner = art.program.combiner
    assert combiner["fitted"] and combiner["features"] == ["context", "kb", "fused"] and combiner["n"] == 8
    assert art.manifest["cv"]["folds"] and "f1" in art.manifest["cv"]["mean"]["compiled"]

    def fake_setup(args, needed=True):
        dspy.configure(lm=lm)
        return lm

    monkeypatch.setattr(detect_cmd, "setup_lm", fake_setup)
    argv = ["detect", "--program", "medico", "--task", "qa", "--metric", "f1", "--compiled-dir",
            str(tmp_path / "compiled"), "--question", "What is the capital of Italy?", "--answer",
            "The capital is Marseille.", "--context", "Rome is the capital of Italy."]
    assert hcli.main(argv) == 0
    row = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert row["label"] is True and row["score"] > 0.5 and row["failures"] == {}
    assert row["answer"][row["spans"][0]["start"]:row["spans"][0]["end"]] == "Marseille"
    assert {e["source"] for e in row["evidence"]} == {"context", "kb"}
    assert row["evidence"][0]["text"] == "Rome is the capital of Italy."
    import shutil

    shutil.rmtree(kb)  # a missing index at detect time: the source is counted and named, detection goes on
    assert hcli.main(argv) == 0
    captured = capsys.readouterr()
    row = json.loads(captured.out.strip().splitlines()[-1])
    assert row["label"] is True and row["failures"] == {"source_kb": 1}
    assert {e["source"] for e in row["evidence"]} == {"context"}
    assert "evidence source 'kb' is off" in captured.err and "halluscope index build" in captured.err


def _halluclean_qa(tmp_path):
    data = tmp_path / "halluclean"
    data.mkdir()
    facts = [("France", "Paris", "Lyon"), ("Italy", "Rome", "Marseille"), ("Germany", "Berlin", "Lyon"),
             ("Spain", "Madrid", "Marseille")]
    (data / "QA.dev.json").write_text(json.dumps([
        {"id": i, "knowledge": f"{right} is the capital of {country}.", "question": f"What is the capital of {country}?",
         "right_answer": f"The capital is {right}.", "hallucinated_answer": f"The capital is {wrong}."}
        for i, (country, right, wrong) in enumerate(facts)]))
    return data


@pytest.mark.parametrize("optimizer", [None, "bootstrap"])
def test_optimize_py_with_an_optimizer_bootstraps_detect_demos_then_fits_the_ensemble(tmp_path, monkeypatch, capsys,
                                                                                       optimizer):
    """#11: ``--optimizer bootstrap`` compiles MEDICO's prompts (Detect demos) and then the fit hook fits the
    ensemble on the compiled detector; without ``--optimizer`` the fit hook alone runs (no demos)."""
    import dataclasses

    from halluscope.artifacts.store import load_compiled
    from halluscope.cli.optimize import build_parser
    from halluscope.cli.optimize import run as optimize_run
    from halluscope.programs import registry

    seen_demos = []

    def recording_fit(module, trainset, metric_name="f1"):
        seen_demos.append(len(module.detect.demos))  # what the ensemble's features are computed with
        return fit_combiner(module, trainset, metric_name)

    monkeypatch.setitem(registry.REGISTRY, "medico", dataclasses.replace(get_program("medico"), fit=recording_fit))
    lm = scripted_lm(responder())
    p = build_parser()
    args = p.parse_args(["--program", "medico", "--task", "qa", "--metric", "f1", "--data-dir",
                         str(_halluclean_qa(tmp_path)), "--folds", "2", "-O", "correct=false",
                         "--compiled-dir", str(tmp_path / "compiled"), "--report-dir", str(tmp_path / "reports"),
                         "--no-mlflow", "--quiet", *(["--optimizer", optimizer] if optimizer else [])])
    assert optimize_run(args, p, task_lm=lm) == 0
    captured = capsys.readouterr()
    art = load_compiled("medico", lang="qa", metric="f1", root=tmp_path / "compiled")
    state = json.loads((art.path / "program.json").read_text())
    assert state["combiner"]["fitted"] and len(state["combiner"]["weights"]) == 2 and state["combiner"]["n"] == 8
    desc = art.manifest["optimizer"]["description"]
    assert len(seen_demos) == 3  # two folds and the final compile
    if optimizer is None:
        assert art.manifest["optimizer"]["name"] == "fit" and desc == "fit (the program's own fit hook)"
        assert state["detect"]["demos"] == [] and seen_demos == [0, 0, 0]
        assert "no --optimizer was chosen" in captured.err
    else:
        assert desc.startswith("BootstrapFewShot(max_bootstrapped_demos=2") and desc.endswith(
            "then fit (the program's own fit hook, on the compiled program)")
        assert art.manifest["optimizer"]["name"] == "bootstrap" and art.manifest["optimizer"]["then_fit"] is True
        demos = state["detect"]["demos"]
        assert len(demos) == 2 and all("verdict" in d and "rationale" in d for d in demos)
        assert seen_demos == [2, 2, 2]  # the ensemble was fitted on the compiled detector, in every compile
        assert art.program.detect.demos and art.program.combiner == state["combiner"]
        assert "compiled = BootstrapFewShot" in captured.out and "then fit" in captured.out
        assert "weights" in art.manifest["final"]


def test_label_agrees_with_the_score_when_the_verdict_is_read_with_a_low_likelihood():
    """#34: a "True" verdict whose token probability is 0.36 is not labelled hallucinated beside a score of 0.36;
    no span is shown for it either (the spans are the rationale's quotes of a labelled answer)."""
    pred = run(get_program("medico").make(correct=False), _logprob_lm(0.36))
    assert pred.likelihood == "logprobs" and pred.score == pytest.approx(0.36, abs=1e-6)
    assert pred.label is False and pred.hard_labels == [] and pred.detection.verdict == "correct"
    pred = run(get_program("medico").make(correct=False), _logprob_lm(0.64))
    assert pred.label is True and pred.score > 0.5


def test_evidence_sources_come_from_the_retriever_registry(tmp_path):
    """MEDICO builds its sources through the retriever registry (core.retrieval.make_retriever), so a retriever a
    plugin registers is a source like the built-in ones, with its argument and keyword options passed on."""
    from halluscope.core import extensions
    from halluscope.core.retrieval import register_retriever
    from halluscope.retrievers.files import FileRetriever

    made = []

    class Wiki:
        source = "wiki"

        def __init__(self, arg):
            made.append(arg)

        def retrieve(self, query, k=5, context=""):
            return []

    register_retriever("wiki", Wiki)
    try:
        m = Medico(sources="context,wiki")
        assert made == [""] and set(m.retrievers) == {"context", "wiki"} and not m.source_errors
        with pytest.raises(ValueError, match="choose from .*wiki"):
            Medico(sources="wikipedia")
    finally:
        extensions.table("retrievers").pop("wiki", None)
    # the built-in files source gets MEDICO's files option as its argument and files_max_mb as a keyword
    (tmp_path / "note.txt").write_text("The Golden Gate Bridge is in San Francisco.", encoding="utf-8")
    m = Medico(sources="files", files=str(tmp_path / "note.txt"), files_max_mb=2.5)
    assert isinstance(m.retrievers["files"], FileRetriever) and m.retrievers["files"].max_mb == 2.5, m.source_errors
