"""``grounded``'s ``encoder_prob`` signal (#37): the trained encoder's word probability as a unit column, from a
provider (a fake one here: no torch needed), its fallback without the extra or an artifact, and the out-of-fold
file the benchmark feeds it (scripts/bench_grounded.py --encoder-probs)."""

from __future__ import annotations

import importlib
import json
import logging
import sys
from pathlib import Path

import pytest

from halluscope.core import extensions
from halluscope.programs.grounded.program import fit_grounded
from halluscope.programs.grounded.signals import DEFAULT_SIGNALS
from halluscope.programs.grounded.signals.base import signal_class, signal_names
from halluscope.programs.grounded.signals.encoder_prob import EncoderProbSignal, read_oof, unit_max
from halluscope.programs.grounded.units import AnswerUnit
from halluscope.programs.registry import InvalidOptionError, get_program
from tests.test_grounded import fixture_examples, inputs

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "scripts"))


def _gold_provider(examples, hot=0.9, cold=0.1):
    """A fake encoder: ``hot`` on the words inside the gold spans, ``cold`` elsewhere (per character range)."""
    spans = {ex.answer: [tuple(s) for s in ex.hard_labels] for ex in examples}
    calls = []

    def provider(question, answer, context, lang):
        calls.append(answer)
        out, pos = [], 0
        for word in answer.split():
            a = answer.index(word, pos)
            b = pos = a + len(word)
            out.append((a, b, hot if any(s < b and a < e for s, e in spans.get(answer, [])) else cold))
        return out
    provider.calls = calls
    return provider


def test_the_signal_is_found_by_name_and_is_opt_in():
    assert "encoder_prob" in signal_names() and signal_class("encoder_prob") is EncoderProbSignal
    assert extensions.get("signals", "encoder_prob") is EncoderProbSignal
    assert "encoder_prob" not in DEFAULT_SIGNALS
    doc = sys.modules[EncoderProbSignal.__module__].__doc__
    assert "BENCHMARKS.md" in doc and "served where the ``encoder`` extra is installed" in doc  # and where measured
    assert "enc_p" not in get_program("grounded").make().features
    det = get_program("grounded").make(encoder_prob="true")
    assert det.signal("encoder_prob") is not None and det.features.count("enc_p") == 1
    with pytest.raises(InvalidOptionError, match="no encoder artifact folder .* at '/nowhere/v0001'"):
        get_program("grounded").make(encoder_prob=True, encoder_artifact="/nowhere/v0001")


def test_an_encoder_artifact_is_a_folder_path_or_a_version_of_the_store(tmp_path, monkeypatch):
    from halluscope.programs.encoder.program import encoder_artifact_dir

    monkeypatch.delenv("HALLUSCOPE_COMPILED_DIR", raising=False)
    monkeypatch.setenv("HALLUSCOPE_HOME", str(tmp_path / "home"))
    monkeypatch.chdir(tmp_path)
    (tmp_path / "mine" / "v0001").mkdir(parents=True)
    assert encoder_artifact_dir("mine/v0001") == Path("mine/v0001")           # a folder here: as given
    assert encoder_artifact_dir("/srv/enc/v0003") == Path("/srv/enc/v0003")   # absolute: as given
    assert encoder_artifact_dir("de/iou/v0009") == tmp_path / "home" / "compiled" / "encoder" / "de" / "iou" / "v0009"
    with pytest.raises(InvalidOptionError, match=r"at 'de/iou/v0009' \(.*home/compiled/encoder/de/iou/v0009\)"):
        get_program("grounded").make(encoder_prob=True, encoder_artifact="de/iou/v0009")
    # a version the user's store lacks is found in the package's bundled store (the served encoder ships there)
    bundled = Path(__file__).resolve().parents[1] / "compiled"
    assert encoder_artifact_dir("all/iou/v0001") == bundled / "encoder" / "all" / "iou" / "v0001"
    (tmp_path / "home" / "compiled" / "encoder" / "all" / "iou" / "v0001").mkdir(parents=True)
    assert encoder_artifact_dir("all/iou/v0001") == tmp_path / "home" / "compiled" / "encoder" / "all" / "iou" / "v0001"


def test_a_unit_gets_the_highest_probability_of_the_encoder_words_it_overlaps():
    def u(a, b):
        return AnswerUnit(a, b, "word", "x" * (b - a), "x" * (b - a))
    words = [(0, 4, 0.2), (5, 7, 0.6), (7, 10, 0.9), (12, 15, 0.4)]
    assert unit_max([u(0, 4), u(5, 10), u(10, 12), u(11, 13)], words) == [0.2, 0.9, 0.0, 0.4]


def test_the_column_comes_from_the_provider_and_the_combiner_fits_a_weight_for_it():
    examples = fixture_examples(16)
    det = get_program("grounded").make(encoder_prob=True)
    provider = det.signal("encoder_prob").provider = _gold_provider(examples)
    bad = next(ex for ex in examples if ex.hard_labels)
    feats = det.item_features(**{k: v for k, v in inputs(bad).items() if k != "task"})
    col = feats.X[:, det.features.index("enc_p")]
    s, e = bad.hard_labels[0]
    for unit, p in zip(feats.units, col):
        assert p == (0.9 if unit.start < e and s < unit.end else 0.1)
    assert "encoder_prob_missing" not in feats.failures and provider.calls == [bad.answer]
    info = fit_grounded(det, examples, "iou")
    assert info["weights"]["enc_p"] > 0.5  # the fake encoder singles out the gold words
    pred = det(**inputs(bad))
    assert "encoder_prob_missing" not in pred.notes and "encoder_prob_missing" not in pred.failures


def test_without_the_extra_or_an_artifact_the_column_is_imputed_with_one_warning(monkeypatch, caplog, tmp_path):
    import importlib.util

    examples = fixture_examples(16)
    det = get_program("grounded").make(encoder_prob=True)
    det.signal("encoder_prob").provider = _gold_provider(examples)
    fit_grounded(det, examples, "iou")
    mean = det.combiner.mean[det.features.index("enc_p")]
    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "torch" else real(name, *a))
    (tmp_path / "manifest.json").write_text("{}")
    cases = [{}, {"encoder_artifact": str(tmp_path)}]  # no artifact named; one named but torch missing
    for options in cases:
        fresh = get_program("grounded").make(encoder_prob=True, **options).load_state(det.dump_state())
        caplog.clear()
        with caplog.at_level(logging.WARNING):
            preds = [fresh(**inputs(ex)) for ex in examples[:3]]
        warned = [r.getMessage() for r in caplog.records if "encoder_prob" in r.getMessage()]
        assert len(warned) == 1 and "\n" not in warned[0], warned  # once, not per item
        assert ("no trained encoder artifact" if not options else "needs torch") in warned[0]
        for p in preds:
            assert p.notes.get("encoder_prob_missing") == 1 and "encoder_prob_missing" not in p.failures
        feats = fresh.item_features(**{k: v for k, v in inputs(examples[0]).items() if k != "task"})
        assert all(x == mean for x in fresh.impute_missing(feats)[:, fresh.features.index("enc_p")])


# -- the out-of-fold file of scripts/bench_encoder.py --save-probs -------------------------------------------

def _rows(path: Path, rows: list[dict]) -> Path:
    path.write_text("".join(json.dumps(r) + "\n" for r in rows), encoding="utf-8")
    return path


def test_the_oof_file_is_read_by_id_and_keyed_so_equal_answers_keep_their_own_probabilities(tmp_path):
    import dspy

    bench = importlib.import_module("bench_grounded")
    exs = [dspy.Example(id=f"val-ar-{i}", lang="ar", question=q, answer="same answer", context="")
           for i, q in enumerate(["q one", "q two"])]
    exs.append(dspy.Example(id="val-ar-2", lang="ar", question="q one", answer="other", context=""))
    rows = read_oof(_rows(tmp_path / "oof.jsonl", [
        {"id": "val-ar-0", "lang": "ar", "fold": 0, "answer": "same answer", "probs": [[0, 4, 0.1], [5, 11, 0.2]]},
        {"id": "val-ar-1", "lang": "ar", "fold": 1, "answer": "same answer", "probs": [[0, 4, 0.7], [5, 11, 0.8]]},
        {"id": "val-ar-2", "lang": "ar", "fold": 1, "answer": "other", "probs": [[0, 5, 0.5]]}]))
    provider = bench.oof_provider(rows, exs)
    assert provider("q one", "same answer", "ctx", "ar") == [(0, 4, 0.1), (5, 11, 0.2)]
    assert provider("q two", "same answer", "", "ar") == [(0, 4, 0.7), (5, 11, 0.8)]
    assert provider("q one", "other", "", "ar") == [(0, 5, 0.5)]
    with pytest.raises(ValueError, match="no row for item 'val-ar-9'"):
        bench.oof_provider(rows, exs + [dspy.Example(id="val-ar-9", lang="ar", question="", answer="x")])
    with pytest.raises(ValueError, match="line 2: id 'val-ar-0' repeats"):
        read_oof(_rows(tmp_path / "dup.jsonl", [rows["val-ar-0"], rows["val-ar-0"]]))
    (tmp_path / "bad.jsonl").write_text('{"id": "a", "fold": 0, "probs": [[0, 1, 0.5]]}\n{"id": "b"}\n')
    with pytest.raises(ValueError, match="bad.jsonl: line 2: not an out-of-fold row"):
        read_oof(tmp_path / "bad.jsonl")
    (tmp_path / "nofold.jsonl").write_text('{"id": "a", "fold": [0], "probs": [[0, 1, 0.5]]}\n')
    with pytest.raises(ValueError, match="nofold.jsonl: line 1: not an out-of-fold row"):
        read_oof(tmp_path / "nofold.jsonl")
    # a leave-one-language-out file (bench_encoder_loo.py --save-probs) names the held-out language as its fold
    loo = read_oof(_rows(tmp_path / "loo.jsonl", [
        {"id": "val-ar-0", "lang": "ar", "fold": "ar", "answer": "same answer", "probs": [[0, 4, 0.9]]}]))
    assert loo["val-ar-0"]["fold"] == "ar" and loo["val-ar-0"]["probs"] == [[0, 4, 0.9]]


def test_split_agreement_says_whether_the_grounded_folds_are_the_encoders():
    import dspy

    bench = importlib.import_module("bench_grounded")
    exs = [dspy.Example(id=f"x{i}", answer="a") for i in range(10)]
    folds = bench.folds_of(10, 5, 0)
    rows = {exs[i].id: {"fold": j} for j, f in enumerate(folds) for i in f}
    assert bench.split_agreement(rows, {"de": exs}, 5, 0) == (10, 10)
    assert bench.split_agreement(rows, {"de": exs}, 5, 1)[0] < 10


# -- encoder_oof: the combiner fitted (and cross-validated) on out-of-fold probabilities --------------------

def test_oof_rows_of_one_answer_asked_twice_are_averaged_word_by_word(tmp_path):
    from halluscope.programs.grounded.signals.encoder_prob import oof_table

    table = oof_table(read_oof(_rows(tmp_path / "oof.jsonl", [
        {"id": "a", "lang": "ar", "fold": 0, "answer": "same answer", "probs": [[0, 4, 0.1], [5, 11, 0.2]]},
        {"id": "b", "lang": "ar", "fold": 1, "answer": "same answer", "probs": [[0, 4, 0.7], [5, 11, 0.8]]},
        {"id": "c", "lang": "de", "fold": 1, "answer": "same answer", "probs": [[0, 4, 0.5], [5, 11, 0.5]]}])))
    assert [t[:2] for t in table[("ar", "same answer")]] == [(0, 4), (5, 11)]
    assert [t[2] for t in table[("ar", "same answer")]] == pytest.approx([0.4, 0.5])
    assert table[("de", "same answer")] == [(0, 4, 0.5), (5, 11, 0.5)]


def test_with_encoder_oof_a_fit_reads_the_file_and_a_loaded_artifact_does_not(tmp_path):
    examples = fixture_examples(16)
    held, train = examples[0], examples[1:]
    # the out-of-fold file singles out the gold words; the "encoder" (provider) says 0.5 everywhere
    oof = _gold_provider(examples, hot=0.95, cold=0.05)
    path = _rows(tmp_path / "oof.jsonl", [
        {"id": f"x{i}", "lang": ex.get("lang", "") or "", "fold": i % 5, "answer": ex.answer,
         "probs": [list(t) for t in oof("", ex.answer, "", "")]} for i, ex in enumerate(examples)])
    det = get_program("grounded").make(encoder_prob=True, encoder_oof=str(path))
    flat = det.signal("encoder_prob").provider = _gold_provider(examples, hot=0.5, cold=0.5)
    info = fit_grounded(det, train, "iou")
    assert flat.calls == []  # every training answer took its out-of-fold row
    assert info["weights"]["enc_p"] > 0.5
    got = info["signal_inputs"]["encoder_prob"]
    assert got["oof"] == str(path) and got["oof_answers"] == len({ex.answer for ex in examples})
    assert len(got["oof_sha256"]) == 64
    assert info["signal_checks"]["encoder_prob"] == {"answers": len(train), "from_oof": len(train)}
    # the fitted program (as cross-validation scores it) gives a held-out item of the file its row too
    col = det.item_features(**{k: v for k, v in inputs(held).items() if k != "task"}).X[:, det.features.index("enc_p")]
    assert set(col) <= {0.95, 0.05} and flat.calls == []
    # a loaded artifact never reads the file (it may not exist where the artifact is served): the encoder answers
    path.unlink()
    fresh = get_program("grounded").make(encoder_prob=True, encoder_oof=str(path)).load_state(det.dump_state())
    fresh.signal("encoder_prob").provider = flat
    col = fresh.item_features(**{k: v for k, v in inputs(held).items() if k != "task"}).X[:, fresh.features.index("enc_p")]
    assert set(col) == {0.5} and flat.calls == [held.answer]


def test_a_bad_oof_file_stops_the_fit_with_one_line_naming_it(tmp_path):
    examples = fixture_examples(8)
    (tmp_path / "bad.jsonl").write_text('{"id": "a", "fold": 0, "probs": [[0, 1, "x"]]}\n')
    for path, msg in ((tmp_path / "bad.jsonl", r"bad.jsonl: line 1: not an out-of-fold row"),
                      (tmp_path / "none.jsonl", r"cannot read the out-of-fold file .*none.jsonl")):
        det = get_program("grounded").make(encoder_prob=True, encoder_oof=str(path))
        det.signal("encoder_prob").provider = _gold_provider(examples)
        with pytest.raises(ValueError, match=msg) as e:
            fit_grounded(det, examples, "iou")
        assert "\n" not in str(e.value)


def test_the_encoders_answers_are_remembered_per_artifact_and_item(monkeypatch):
    from halluscope.programs.grounded.signals import encoder_prob

    monkeypatch.setattr(encoder_prob, "_MEMO", {})
    calls = []

    def provider(q, a, c, lang):
        calls.append(a)
        return [(0, len(a), 0.5)]
    one, other = encoder_prob.memoized("all/iou/v0001", provider), encoder_prob.memoized("mine/iou/v0002", provider)
    assert one("q", "an answer", "ctx", "de") == [(0, 9, 0.5)] and one("q", "an answer", "ctx", "de") == [(0, 9, 0.5)]
    assert calls == ["an answer"]                      # the second fold's fit reads the first's
    one("q", "an answer", "other evidence", "de")      # another item (the evidence differs): computed
    other("q", "an answer", "ctx", "de")               # another encoder: computed
    assert len(calls) == 3
    monkeypatch.setattr(encoder_prob, "MEMO_ITEMS", 3)
    one("q", "a fourth", "", "de")                      # full: cleared, then remembered again
    assert len(encoder_prob._MEMO) == 1


def test_every_grounded_of_a_process_shares_one_loaded_encoder_per_artifact(tmp_path, monkeypatch):
    from halluscope.programs.encoder import program as enc
    from halluscope.programs.grounded.signals import encoder_prob

    monkeypatch.setattr(encoder_prob, "_ENCODERS", {})
    loads = []
    monkeypatch.setattr(enc, "load_encoder_dir", lambda ref: loads.append(ref) or object())
    for name, sha in (("a", "11"), ("b", "22")):
        (tmp_path / name).mkdir()
        (tmp_path / name / "manifest.json").write_text(json.dumps({"files": {"encoder.safetensors": sha}}))
    one = encoder_prob.shared_encoder(str(tmp_path / "a"))
    assert encoder_prob.shared_encoder(str(tmp_path / "a")) is one and len(loads) == 1   # eight languages, one copy
    assert encoder_prob.shared_encoder(str(tmp_path / "b")) is not one and len(loads) == 2
    key = encoder_prob.artifact_key(str(tmp_path / "a"))
    (tmp_path / "a" / "manifest.json").write_text(json.dumps({"files": {"encoder.safetensors": "33"}}))
    assert encoder_prob.artifact_key(str(tmp_path / "a")) != key  # other weights in the same folder: another key
