"""Tests for loaders.mushroom and loaders.demo (fixtures are written into tmp_path)."""

from __future__ import annotations

import json
import warnings
from pathlib import Path

import dspy
import pytest

from halluscope.core.contract import Detection, Span, hard_labels_from_soft, to_prediction
from halluscope.loaders import (
    DEMO_ITEMS,
    DEMO_NOTICE,
    DEMO_VERSION,
    LANGS,
    VAL_LANGS,
    MushroomDataWarning,
    demo_data_dir,
    last_load_stats,
    load_gold_records,
    load_mushroom,
    resolve_data_dir,
    write_demo_data,
    write_submission,
)

PROJECT_ROOT = Path(__file__).resolve().parent.parent
REAL_DATA = PROJECT_ROOT.parent / "shared" / "data" / "mushroom"
INPUTS = {"question", "answer", "lang", "context"}


# --------------------------------------------------------------------------- fixtures


def _span(text: str, sub: str) -> list[int]:
    start = text.index(sub)
    return [start, start + len(sub)]


def _labelled(item_id, lang, question, answer, marks: dict[str, list[str]]) -> dict:
    """An official-format record; soft/hard labels derived from per-annotator substrings."""
    annotations = {a: [_span(answer, s) for s in subs] for a, subs in marks.items()}
    counts = [0] * len(answer)
    for spans in annotations.values():
        for s, e in spans:
            for i in range(s, e):
                counts[i] += 1
    soft, i = [], 0
    while i < len(answer):
        j = i
        while j < len(answer) and counts[j] == counts[i]:
            j += 1
        if counts[i]:
            soft.append({"start": i, "prob": counts[i] / len(marks), "end": j})
        i = j
    return {
        "id": item_id,
        "lang": lang.upper(),
        "model_input": question,
        "model_output_text": answer,
        "model_id": "fixture/model",
        "soft_labels": soft,
        "hard_labels": hard_labels_from_soft(soft),
        "model_output_logits": [1.0] * len(answer.split()),
        "model_output_tokens": answer.split(),
        "wikipedia_url": f"https://{lang}.wikipedia.org/wiki/X",
        "annotations": annotations,
    }


EN_1 = _labelled(
    "val-en-1", "en", "What is the capital of France?", "\nThe capital of France is Lyon.",
    {"ann_a": ["Lyon"], "ann_b": ["Lyon."], "ann_c": ["is Lyon"]},
)
EN_2 = _labelled(  # no hallucination
    "val-en-2", "en", "How many legs does a spider have?", "A spider has eight legs.",
    {"ann_a": [], "ann_b": []},
)
EN_3 = _labelled(
    "val-en-3", "en", "Who wrote Hamlet?", "Hamlet was written by Charles Dickens.",
    {"ann_a": ["Charles Dickens"], "ann_b": ["Dickens"], "ann_c": ["Charles Dickens"]},
)
ZH_1 = _labelled(
    "val-zh-1", "zh", "北京是哪个国家的首都？", "北京是日本的首都。",
    {"ann_a": ["日本"], "ann_b": ["日本的"], "ann_c": ["日本"]},
)
AR_1 = _labelled(
    "val-ar-1", "ar", "ما هي عاصمة فرنسا؟", "عاصمة فرنسا هي روما.",
    {"ann_a": ["روما"], "ann_b": ["روما"], "ann_c": ["هي روما"]},
)
FIXTURE = {"en": [EN_1, EN_2, EN_3], "zh": [ZH_1], "ar": [AR_1]}


def _jsonl(path: Path, records) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("".join(json.dumps(r, ensure_ascii=False) + "\n" for r in records), "utf-8")
    return path


def _make_root(root: Path, split: str = "val", contexts: bool = True) -> Path:
    for lang, recs in FIXTURE.items():
        _jsonl(root / split / f"mushroom.{lang}-{split}.v2.extra.jsonl", recs)
        if contexts:
            for rec in recs:
                for variant in ("native", "translated-en"):
                    f = root / "context" / split / variant / lang / f"{rec['id']}.context.txt"
                    f.parent.mkdir(parents=True, exist_ok=True)
                    f.write_text(f"{variant} context for {rec['id']}\n", "utf-8")
    return root


@pytest.fixture
def root(tmp_path) -> Path:
    return _make_root(tmp_path / "mushroom")


# --------------------------------------------------------------------------- loading


def test_fields_and_types(root):
    exs = load_mushroom(root, lang="en")
    assert [e.id for e in exs] == ["val-en-1", "val-en-2", "val-en-3"]
    for e, rec in zip(exs, FIXTURE["en"]):
        assert isinstance(e, dspy.Example)
        assert e.task == "mushroom"
        assert e.lang == "en"  # lower-cased from "EN"
        assert e.question == rec["model_input"]
        assert e.answer == rec["model_output_text"]
        assert e.context == ""
        assert e.hard_labels == rec["hard_labels"]
        assert all(isinstance(s, list) and len(s) == 2 for s in e.hard_labels)
        assert e.soft_labels == rec["soft_labels"]
        assert all(set(d) == {"start", "end", "prob"} for d in e.soft_labels)
        assert all(isinstance(d["prob"], float) for d in e.soft_labels)
        assert e.annotations == rec["annotations"]
        assert isinstance(e.label, bool) and e.label == bool(rec["hard_labels"])
        assert e.model_id == "fixture/model"
        assert e.model_output_tokens == rec["model_output_tokens"]
        assert e.model_output_logits == rec["model_output_logits"]
    assert exs[0].label is True and exs[1].label is False
    assert exs[1].hard_labels == [] and exs[1].soft_labels == []


def test_inputs_keys(root):
    for e in load_mushroom(root):
        assert set(e.inputs().keys()) == INPUTS
        assert "hard_labels" in e.labels().keys()


def test_offsets_preserved_not_stripped(root):
    (e,) = [x for x in load_mushroom(root, lang="en") if x.id == "val-en-1"]
    assert e.answer.startswith("\n")
    (s, t), = e.hard_labels
    assert e.answer[s:t] == "Lyon"
    (z,) = load_mushroom(root, lang="zh")
    assert [z.answer[s:t] for s, t in z.hard_labels] == ["日本"]
    (a,) = load_mushroom(root, lang="ar")
    assert [a.answer[s:t] for s, t in a.hard_labels] == ["روما"]


def test_lang_filter_and_validation(root, tmp_path):
    assert {e.lang for e in load_mushroom(root, lang="zh")} == {"zh"}
    assert [e.id for e in load_mushroom(root, lang="AR")] == ["val-ar-1"]
    # Directory without lang: every language present, in LANGS order.
    assert [e.lang for e in load_mushroom(root)] == ["ar", "en", "en", "en", "zh"]
    # A single file holding several languages is filtered by lang.
    mixed = _jsonl(tmp_path / "mixed.jsonl", [EN_1, ZH_1, AR_1, EN_3])
    assert [e.id for e in load_mushroom(mixed, lang="en")] == ["val-en-1", "val-en-3"]
    assert len(load_mushroom(mixed)) == 4
    with pytest.raises(ValueError) as err:
        load_mushroom(root, lang="xx")
    for code in LANGS:
        assert code in str(err.value)
    with pytest.raises(ValueError, match="split"):
        load_mushroom(root, lang="en", split="train")
    with pytest.raises(ValueError, match="context"):
        load_mushroom(root, lang="en", context="english")


def test_file_vs_directory_resolution(root, tmp_path):
    f = root / "val" / "mushroom.en-val.v2.extra.jsonl"
    assert [e.id for e in load_mushroom(f)] == [e.id for e in load_mushroom(root, lang="en")]
    # A flat folder with the plain naming.
    flat = tmp_path / "flat"
    _jsonl(flat / "mushroom.zh-val.v2.jsonl", [ZH_1])
    assert [e.id for e in load_mushroom(flat, lang="zh")] == ["val-zh-1"]
    # The .extra naming wins over the plain one under <root>/<split>/.
    _jsonl(root / "val" / "mushroom.en-val.v2.jsonl", [EN_2])
    assert len(load_mushroom(root, lang="en")) == 3
    with pytest.raises(FileNotFoundError) as err:
        load_mushroom(root, lang="de")
    msg = str(err.value)
    for tried in (
        root / "val" / "mushroom.de-val.v2.extra.jsonl",
        root / "val" / "mushroom.de-val.v2.jsonl",
        root / "mushroom.de-val.v2.extra.jsonl",
        root / "mushroom.de-val.v2.jsonl",
    ):
        assert str(tried) in msg
    with pytest.raises(FileNotFoundError):
        load_mushroom(tmp_path / "nope.jsonl")
    with pytest.raises(FileNotFoundError, match="no Mu-SHROOM test files"):
        load_mushroom(tmp_path / "flat", split="test")


def test_context_variants(root):
    none = load_mushroom(root, lang="en")
    assert all(e.context == "" for e in none)
    native = load_mushroom(root, lang="zh", context="native")
    assert native[0].context == "native context for val-zh-1\n"
    en = load_mushroom(root, lang="ar", context="translated-en")
    assert en[0].context == "translated-en context for val-ar-1\n"
    # From a file path, the root (and so root/context) is inferred.
    f = root / "val" / "mushroom.en-val.v2.extra.jsonl"
    assert load_mushroom(f, context="native")[0].context == "native context for val-en-1\n"
    assert last_load_stats()["missing_context"] == 0


def test_context_dir_override(root, tmp_path):
    other = tmp_path / "ctx"
    f = other / "val" / "native" / "zh" / "val-zh-1.context.txt"
    f.parent.mkdir(parents=True)
    f.write_text("elsewhere", "utf-8")
    (e,) = load_mushroom(root, lang="zh", context="native", context_dir=other)
    assert e.context == "elsewhere"


def test_missing_context_folder_is_an_error(tmp_path):
    root = _make_root(tmp_path / "m", contexts=False)
    with pytest.raises(FileNotFoundError) as err:
        load_mushroom(root, lang="en", context="native")
    assert str(root / "context" / "val" / "native" / "en") in str(err.value)


def test_missing_single_context_file_gives_empty_string(root):
    (root / "context" / "val" / "native" / "en" / "val-en-2.context.txt").unlink()
    with pytest.warns(MushroomDataWarning, match="val-en-2"):
        exs = load_mushroom(root, lang="en", context="native")
    assert [e.context == "" for e in exs] == [False, True, False]
    assert last_load_stats()["missing_context"] == 1
    assert last_load_stats()["items"] == 3


def test_limit(root):
    assert [e.id for e in load_mushroom(root, lang="en", limit=2)] == ["val-en-1", "val-en-2"]
    assert load_mushroom(root, lang="en", limit=0) == []
    assert len(load_mushroom(root, lang="en", limit=99)) == 3
    assert [e.id for e in load_mushroom(root, limit=2)] == ["val-ar-1", "val-en-1"]
    with pytest.raises(ValueError):
        load_mushroom(root, lang="en", limit=-1)


def test_malformed_line_names_file_and_line(tmp_path):
    f = tmp_path / "bad.jsonl"
    f.write_text(json.dumps(EN_1) + "\n{not json\n", "utf-8")
    with pytest.raises(ValueError) as err:
        load_mushroom(f)
    assert "line 2" in str(err.value) and "bad.jsonl" in str(err.value)
    with pytest.raises(ValueError, match="line 2"):
        load_gold_records(f)


def test_missing_model_output_is_skipped_with_warning(tmp_path):
    broken = {k: v for k, v in EN_3.items() if k != "model_output_text"}
    f = _jsonl(tmp_path / "x.jsonl", [EN_1, broken, EN_2])
    with pytest.warns(MushroomDataWarning, match="val-en-3"):
        exs = load_mushroom(f)
    assert [e.id for e in exs] == ["val-en-1", "val-en-2"]
    assert last_load_stats()["skipped_no_output"] == 1


def test_test_split_without_labels(tmp_path):
    keep = ("id", "lang", "model_input", "model_output_text", "model_id")
    recs = [{k: r[k] for k in keep} for r in (EN_1, EN_2)]
    root = tmp_path / "m"
    _jsonl(root / "test" / "mushroom.en-test.v2.jsonl", recs)
    exs = load_mushroom(root, lang="en", split="test")
    assert len(exs) == 2
    for e in exs:
        assert e.hard_labels == [] and e.soft_labels == [] and e.annotations == {}
        assert e.label is None
        assert "model_output_logits" not in e.toDict()
        assert set(e.inputs().keys()) == INPUTS


def test_load_gold_records(root):
    recs = load_gold_records(root / "val" / "mushroom.en-val.v2.extra.jsonl")
    assert recs == FIXTURE["en"]
    assert load_gold_records(root, lang="zh") == [ZH_1]


def test_resolve_data_dir(monkeypatch, tmp_path):
    monkeypatch.delenv("HALLUSCOPE_DATA_DIR", raising=False)
    assert resolve_data_dir() is None
    monkeypatch.setenv("HALLUSCOPE_DATA_DIR", str(tmp_path / "env"))
    assert resolve_data_dir() == tmp_path / "env"
    assert resolve_data_dir(tmp_path / "arg") == tmp_path / "arg"
    assert resolve_data_dir(str(tmp_path / "arg")) == tmp_path / "arg"


def test_write_submission_round_trip(tmp_path):
    answer = "The capital of France is Lyon."
    s = answer.index("Lyon")
    det = Detection(answer=answer, spans=[Span(s, s + 4, 0.9), Span(0, 3, 0.2)])
    preds = [
        det,
        to_prediction(det),
        {"hard_labels": [[1, 2]], "soft_labels": [{"start": 1, "end": 2, "prob": 0.7}]},
        {"hard_labels": []},
        dspy.Prediction(soft_labels=[{"start": 0, "end": 4, "prob": 0.6}]),
    ]
    ids = ["a", "b", "c", "d", "e"]
    out = write_submission(tmp_path / "sub" / "en.jsonl", ids, preds)
    lines = [json.loads(x) for x in out.read_text("utf-8").splitlines()]
    assert [x["id"] for x in lines] == ids
    assert all(set(x) == {"id", "hard_labels", "soft_labels"} for x in lines)
    assert lines[0]["hard_labels"] == [[s, s + 4]] == lines[1]["hard_labels"]
    assert lines[0]["soft_labels"] == det.soft_labels == lines[1]["soft_labels"]
    assert lines[2] == {"id": "c", "hard_labels": [[1, 2]],
                        "soft_labels": [{"start": 1, "end": 2, "prob": 0.7}]}
    assert lines[3] == {"id": "d", "hard_labels": [], "soft_labels": []}
    assert lines[4]["hard_labels"] == [[0, 4]]
    # Atomic write: nothing but the output in the folder.
    assert [p.name for p in out.parent.iterdir()] == ["en.jsonl"]
    # Overwrite works, length mismatch is an error and leaves the old file intact.
    write_submission(out, ["z"], [{"hard_labels": []}])
    assert json.loads(out.read_text("utf-8"))["id"] == "z"
    with pytest.raises(ValueError):
        write_submission(out, ["a", "b"], [{"hard_labels": []}])
    assert json.loads(out.read_text("utf-8"))["id"] == "z"


# --------------------------------------------------------------------------- demo set


def _soft_from_annotations(annotations: dict, n_chars: int) -> list[dict]:
    n = len(annotations)
    probs = [sum(any(s <= i < e for s, e in spans) for spans in annotations.values()) / n
             for i in range(n_chars)] if n else [0.0] * n_chars
    soft, i = [], 0
    while i < n_chars:
        j = i
        while j < n_chars and probs[j] == probs[i]:
            j += 1
        if probs[i] > 0:
            soft.append({"start": i, "end": j, "prob": probs[i]})
        i = j
    return soft


def _hard_from_soft(soft: list[dict]) -> list[list[int]]:
    hard: list[list[int]] = []
    for d in sorted(soft, key=lambda d: d["start"]):
        if d["prob"] > 0.5:
            if hard and hard[-1][1] == d["start"]:
                hard[-1][1] = d["end"]
            else:
                hard.append([d["start"], d["end"]])
    return hard


@pytest.fixture(scope="module")
def demo_root(tmp_path_factory) -> Path:
    return write_demo_data(tmp_path_factory.mktemp("demo"))


def test_demo_sizes_and_languages():
    by_lang: dict[str, int] = {}
    for it in DEMO_ITEMS:
        by_lang[it.lang] = by_lang.get(it.lang, 0) + 1
    assert {"en", "de", "fr", "zh", "ar"} <= set(by_lang)
    assert by_lang["en"] >= 6 and by_lang["de"] >= 6
    assert all(n >= 3 for n in by_lang.values())
    assert any(not it.hallucinated for it in DEMO_ITEMS)
    assert len({it.id for it in DEMO_ITEMS}) == len(DEMO_ITEMS)
    assert str(len(DEMO_ITEMS)) in DEMO_NOTICE and "HALLUSCOPE_DATA_DIR" in DEMO_NOTICE


@pytest.mark.parametrize("lang", sorted({it.lang for it in DEMO_ITEMS}))
def test_demo_loads_and_labels_are_consistent(demo_root, lang):
    items = {it.id: it for it in DEMO_ITEMS if it.lang == lang}
    for variant in ("none", "native", "translated-en"):
        exs = load_mushroom(demo_root, lang=lang, context=variant)
        assert [e.id for e in exs] == list(items)
        assert last_load_stats()["missing_context"] == 0
    for e in exs:
        it = items[e.id]
        n = len(e.answer)
        assert e.answer == it.answer and e.context.strip()
        assert 2 <= len(e.annotations) <= 3
        spans = list(e.hard_labels) + [[d["start"], d["end"]] for d in e.soft_labels]
        spans += [sp for v in e.annotations.values() for sp in v]
        assert all(0 <= s < t <= n for s, t in spans), e.id
        # Soft labels = share of annotators per character (maximal runs); hard = prob > 0.5.
        soft = _soft_from_annotations(e.annotations, n)
        assert e.soft_labels == soft, e.id
        assert e.hard_labels == _hard_from_soft(soft), e.id
        # The deliberate errors are exactly what the hard labels point at.
        assert [e.answer[s:t] for s, t in e.hard_labels] == list(it.hallucinated), e.id
        assert e.label == bool(it.hallucinated)
        # Tokens tile the answer; hallucinated tokens have lower logits than the others.
        assert "".join(e.model_output_tokens) == e.answer
        assert len(e.model_output_logits) == len(e.model_output_tokens)
        pos, bad, good = 0, [], []
        for tok, logit in zip(e.model_output_tokens, e.model_output_logits):
            hit = any(pos < t and s < pos + len(tok) for s, t in e.hard_labels)
            (bad if hit else good).append(logit)
            pos += len(tok)
        if bad:
            assert max(bad) < min(good), e.id
        assert e.model_id and e.wikipedia_url.startswith(f"https://{lang}.wikipedia.org/")


def test_demo_data_dir_idempotent_and_versioned(tmp_path):
    out = demo_data_dir(tmp_path / "demo_data")
    assert out == tmp_path / "demo_data"
    assert (out / "VERSION").read_text("utf-8").strip() == DEMO_VERSION
    f = out / "val" / "mushroom.en-val.v2.extra.jsonl"
    mtime = f.stat().st_mtime_ns
    assert demo_data_dir(out) == out and f.stat().st_mtime_ns == mtime
    # A stale version is rewritten, and stale files disappear.
    (out / "VERSION").write_text("0-old\n", "utf-8")
    stale = out / "val" / "mushroom.sv-val.v2.extra.jsonl"
    stale.write_text("{}\n", "utf-8")
    demo_data_dir(out)
    assert (out / "VERSION").read_text("utf-8").strip() == DEMO_VERSION
    assert not stale.exists()
    assert len(load_mushroom(out)) == len(DEMO_ITEMS)


# --------------------------------------------------------------------------- real data


@pytest.mark.skipif(not REAL_DATA.is_dir(), reason=f"Mu-SHROOM data not found at {REAL_DATA}")
def test_real_validation_data():
    with warnings.catch_warnings():
        warnings.simplefilter("error", MushroomDataWarning)
        for lang in VAL_LANGS:
            exs = load_mushroom(REAL_DATA, lang=lang)
            assert 49 <= len(exs) <= 50, lang
            assert len({e.id for e in exs}) == len(exs)
            for e in exs:
                assert e.lang == lang and e.answer
                n = len(e.answer)
                assert all(0 <= s < t <= n for s, t in e.hard_labels), e.id
                assert all(0 <= d["start"] < d["end"] <= n for d in e.soft_labels), e.id
                assert e.label == bool(e.hard_labels)
                assert set(e.inputs().keys()) == INPUTS
    native = load_mushroom(REAL_DATA, lang="de", context="native", limit=3)
    assert all(e.context for e in native)
