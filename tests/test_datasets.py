"""The dataset registry and the generic loader: what --lang/--task/--split/--column mean per dataset, each local
file format through HuggingFace ``datasets``, column-mapping errors, and the commands reading the registry."""

from __future__ import annotations

import json
import logging

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from halluscope.cli import main
from halluscope.loaders import (
    DEMO_NOTICE,
    ArgRole,
    DatasetArgumentError,
    DatasetSpec,
    dataset_names,
    get_dataset,
    level_of,
    register_dataset,
)
from halluscope.loaders.demo import write_demo_data
from halluscope.loaders.generic import ColumnError, decode_label, load_generic, open_rows, parse_column_mapping
from halluscope.metrics.adapters import METRIC_LEVEL
from halluscope.core.tasks import HALLUCLEAN_TASKS

# Two answers in the generic loader's fixture: one right, one with a hallucinated span ("Spain" at 12..17).
ROWS = [
    {"uid": "a1", "prompt": "Where is Paris?", "response": "Paris is in France.", "gold": "correct",
     "language": "en", "spans": [], "note": "first"},
    {"uid": "a2", "prompt": "Where is Paris?", "response": "Paris is in Spain.", "gold": "hallucinated",
     "language": "en", "spans": [[12, 17]], "note": "second"},
    {"uid": "b1", "prompt": "Wo liegt Paris?", "response": "Paris liegt in Spanien.", "gold": "1",
     "language": "de", "spans": [[15, 22]], "note": "third"},
]
MAPPING = {"id": "uid", "question": "prompt", "answer": "response", "label": "gold", "lang": "language",
           "hard_labels": "spans"}


def write(tmp_path, fmt: str):
    """ROWS as a file of format ``fmt``; the CSV/TSV hold the span lists as JSON text."""
    path = tmp_path / f"answers.{fmt}"
    if fmt == "jsonl":
        path.write_text("".join(json.dumps(r) + "\n" for r in ROWS), encoding="utf-8")
    elif fmt == "json":
        path.write_text(json.dumps(ROWS), encoding="utf-8")
    elif fmt in ("csv", "tsv"):
        sep = "," if fmt == "csv" else "\t"
        cols = list(ROWS[0])
        lines = [sep.join(cols)]
        for r in ROWS:
            cells = [json.dumps(r[c]) if c == "spans" else str(r[c]) for c in cols]
            lines.append(sep.join(f'"{c.replace(chr(34), chr(34) * 2)}"' if sep in c or '"' in c else c
                                  for c in cells))
        path.write_text("\n".join(lines) + "\n", encoding="utf-8")
    elif fmt == "parquet":
        pq.write_table(pa.Table.from_pylist(ROWS), path)
    return path


# -- the registry --------------------------------------------------------------------------------------------

def test_the_built_in_datasets_are_registered_with_their_levels():
    assert dataset_names()[:3] == ["mushroom", "halluclean", "generic"]
    assert [get_dataset(n).level for n in ("mushroom", "halluclean", "generic")] == ["span", "response", "auto"]
    assert get_dataset("mushroom").submission is not None and get_dataset("halluclean").submission is None
    assert get_dataset("generic").columns and not get_dataset("mushroom").columns
    with pytest.raises(KeyError, match="unknown dataset 'nope'.*mushroom, halluclean, generic"):
        get_dataset("nope")


def test_register_dataset_refuses_a_taken_name_and_bad_specs():
    spec = get_dataset("generic")
    with pytest.raises(ValueError, match="already registered"):
        register_dataset(spec)
    with pytest.raises(TypeError):
        register_dataset("generic")
    with pytest.raises(ValueError, match="level"):
        DatasetSpec(name="x", description="", loader=lambda *a, **k: ([], ""), level="token")
    with pytest.raises(ValueError, match="default split"):
        DatasetSpec(name="x", description="", loader=lambda *a, **k: ([], ""), level="span", splits=("a",),
                    default_split="b")


def test_check_args_reads_what_lang_and_task_mean_per_dataset():
    hc, mush, gen = get_dataset("halluclean"), get_dataset("mushroom"), get_dataset("generic")
    assert hc.check_args(task="QA") == (None, "qa", "dev")  # aliases resolved, the default split filled in
    assert hc.check_args(task="SC")[1] == "self_contradiction"
    assert mush.check_args(lang="de") == ("de", None, "val")
    assert gen.check_args(lang="xx", task="anything", split="train") == ("xx", "anything", "train")
    with pytest.raises(DatasetArgumentError, match=r"^argument --lang: --dataset halluclean does not use --lang"):
        hc.check_args(lang="en", task="qa")
    with pytest.raises(DatasetArgumentError, match=r"^argument --task: --dataset mushroom does not use --task"):
        mush.check_args(lang="de", task="qa")
    with pytest.raises(DatasetArgumentError, match="required with --dataset halluclean.*" + ", ".join(HALLUCLEAN_TASKS)):
        hc.check_args()
    with pytest.raises(DatasetArgumentError, match="unknown HalluClean task 'poetry'"):
        hc.check_args(task="poetry")
    with pytest.raises(DatasetArgumentError, match="invalid choice: 'qa' for --dataset mushroom.*de, en"):
        mush.check_args(lang="qa")
    with pytest.raises(DatasetArgumentError, match="--split: invalid choice: 'dev'.*val, test"):
        mush.check_args(split="dev")
    with pytest.raises(DatasetArgumentError, match="--column: --dataset mushroom has a fixed schema"):
        mush.check_args(columns={"answer": "x"})


def test_a_dataset_that_does_not_use_an_argument_refuses_it_whatever_registers_it():
    spec = DatasetSpec(name="tiny", description="", loader=lambda *a, **k: ([], "tiny"), level="response",
                       task=ArgRole("the task", choices=("a", "b")))
    assert spec.check_args(task="a") == (None, "a", None)
    with pytest.raises(DatasetArgumentError, match="--dataset tiny does not use --lang"):
        spec.load(lang="en")
    with pytest.raises(DatasetArgumentError, match=r"the task; choose from a, b"):
        spec.check_args(task="c")


def test_metric_problem_takes_the_metric_level_from_the_metrics_layer(tmp_path):
    hc, mush, gen = get_dataset("halluclean"), get_dataset("mushroom"), get_dataset("generic")
    assert mush.metric_problem("iou", METRIC_LEVEL["iou"]) is None
    assert hc.metric_problem("f1", METRIC_LEVEL["f1"]) is None
    assert "--dataset halluclean is response-level" in hc.metric_problem("iou", METRIC_LEVEL["iou"])
    # generic: the rows decide
    with_spans = load_generic(write(tmp_path, "jsonl"), MAPPING, cache_dir=tmp_path / "cache")
    labels_only = load_generic(write(tmp_path, "jsonl"), {k: v for k, v in MAPPING.items() if k != "hard_labels"},
                               cache_dir=tmp_path / "cache")
    assert level_of(with_spans) == "span" and level_of(labels_only) == "response"
    assert gen.metric_problem("iou", "span") is None  # not loaded yet: let through
    assert gen.metric_problem("iou", "span", with_spans) is None
    assert "rows carry no span labels" in gen.metric_problem("iou", "span", labels_only)


def test_artifact_key_is_the_task_else_the_language():
    assert get_dataset("halluclean").key(None, "qa") == "qa"
    assert get_dataset("mushroom").key("de", None) == "de"
    assert get_dataset("mushroom").key(None, None, [{"lang": "fr"}]) == "fr"
    assert get_dataset("generic").key(None, None, [{"lang": ""}]) == "all"


def test_load_checks_arguments_before_calling_the_loader():
    calls = []
    spec = DatasetSpec(name="t", description="", level="span", splits=("val",), default_split="val",
                       lang=ArgRole("lang", choices=("de",)),
                       loader=lambda data_dir, **kw: (calls.append((data_dir, kw)) or [], "t"))
    assert spec.load("root", lang="de", limit=3) == ([], "t")
    assert calls == [("root", {"lang": "de", "task": None, "split": "val", "context": None, "limit": 3,
                               "columns": {}})]
    with pytest.raises(DatasetArgumentError, match="--limit: must be at least 1"):
        spec.load(limit=0)
    with pytest.raises(DatasetArgumentError):
        spec.load(lang="en")
    assert len(calls) == 1


def test_built_in_loaders_through_the_registry_and_the_demo_notice_is_logged(tmp_path, caplog, monkeypatch):
    monkeypatch.delenv("HALLUSCOPE_DATA_DIR", raising=False)
    monkeypatch.delenv("HALLUSCOPE_HALLUCLEAN_DIR", raising=False)
    monkeypatch.setenv("HALLUSCOPE_HOME", str(tmp_path))
    with caplog.at_level(logging.WARNING, logger="halluscope"):
        examples, source = get_dataset("mushroom").load(limit=2)
    assert source == "demo/en/val/context=none" and len(examples) == 2 and examples[0].lang == "en"
    assert DEMO_NOTICE in caplog.text
    caplog.clear()
    with caplog.at_level(logging.WARNING, logger="halluscope"):
        examples, source = get_dataset("halluclean").load(task="DA")
    assert source == "halluclean-demo/dialogue" and [e.label for e in examples] == [False, True]
    assert "BUILT-IN DEMO" in caplog.text

    root = write_demo_data(tmp_path / "mushroom")
    examples, source = get_dataset("mushroom").load(root, lang="de", context="native", limit=3)
    assert source == "mushroom/de/val/context=native" and all(e.lang == "de" and e.hard_labels is not None
                                                              for e in examples)
    with pytest.raises(DatasetArgumentError, match="--lang: required with a Mu-SHROOM data folder"):
        get_dataset("mushroom").load(root)
    # --lang all: every language with a file in the folder (one cross-lingual artifact, keyed "all")
    every, source = get_dataset("mushroom").load(root, lang="all", context="native")
    langs = {e.lang for e in every}
    assert source == "mushroom/all/val/context=native" and len(langs) > 1 and "de" in langs
    assert len(every) == sum(len(get_dataset("mushroom").load(root, lang=x, context="native")[0]) for x in langs)
    assert get_dataset("mushroom").key("all", None) == "all"


# -- the generic loader --------------------------------------------------------------------------------------

@pytest.mark.parametrize("fmt", ["jsonl", "json", "csv", "tsv", "parquet"])
def test_generic_loader_reads_every_local_format_into_the_common_schema(tmp_path, fmt):
    examples = load_generic(write(tmp_path, fmt), MAPPING, cache_dir=tmp_path / "cache")
    assert [e.id for e in examples] == ["a1", "a2", "b1"]
    first, second, third = examples
    assert (first.question, first.answer, first.lang, first.context) == ("Where is Paris?", "Paris is in France.",
                                                                          "en", "")
    assert set(first.inputs().keys()) == {"question", "answer", "lang", "context", "task"}
    assert [e.label for e in examples] == [False, True, True]
    assert second.hard_labels == [[12, 17]] and second.answer[12:17] == "Spain"
    assert second.soft_labels == [{"start": 12, "end": 17, "prob": 1.0}]  # derived from the hard labels
    assert first.hard_labels == [] and first.soft_labels == []
    assert second.note == "second"  # unmapped columns are kept as metadata


def test_generic_loader_defaults_filters_and_limit(tmp_path):
    path = tmp_path / "mushroom-like.jsonl"
    rows = [{"model_input": "Q?", "model_output_text": "A.", "lang": "EN", "soft_labels": [
        {"start": 0, "end": 1, "prob": 0.8}]}, {"model_input": "Q2?", "model_output_text": "B.", "lang": "de"}]
    path.write_text("".join(json.dumps(r) + "\n" for r in rows), encoding="utf-8")
    examples = load_generic(path, cache_dir=tmp_path / "cache")  # Mu-SHROOM's column names need no mapping
    assert [(e.id, e.question, e.answer, e.lang) for e in examples] == [("mushroom-like-0", "Q?", "A.", "en"),
                                                                        ("mushroom-like-1", "Q2?", "B.", "de")]
    assert examples[0].hard_labels == [[0, 1]] and examples[0].label is True
    assert examples[1].label is None  # no span columns in that row: unlabelled
    assert [e.id for e in load_generic(path, lang="de", cache_dir=tmp_path / "cache")] == ["mushroom-like-1"]
    assert len(load_generic(path, limit=1, cache_dir=tmp_path / "cache")) == 1
    tasked = load_generic(path, task="qa", context="none", cache_dir=tmp_path / "cache")
    assert all(e.task == "qa" for e in tasked)  # no task column: set on every row


def test_label_encodings():
    assert [decode_label(v) for v in (True, 1, "1", "Yes", " hallucinated ", "unfaithful")] == [True] * 6
    assert [decode_label(v) for v in (False, 0, "0", "no", "Not_Hallucinated", "faithful")] == [False] * 6
    assert [decode_label(v) for v in (None, float("nan"), "")] == [None] * 3
    with pytest.raises(ValueError, match="'maybe' is not a label"):
        decode_label("maybe")
    with pytest.raises(ValueError, match="0 or 1"):
        decode_label(2)


def test_column_mapping_errors_name_the_problem(tmp_path):
    assert parse_column_mapping(["answer=response", " label = gold "]) == {"answer": "response", "label": "gold"}
    with pytest.raises(ColumnError, match="'answer' is not FIELD=COLUMN"):
        parse_column_mapping(["answer"])
    with pytest.raises(ColumnError, match="unknown field 'reply'; map one of: id, question, answer"):
        parse_column_mapping(["reply=response"])
    with pytest.raises(ColumnError, match="field 'answer' mapped twice"):
        parse_column_mapping(["answer=a", "answer=b"])
    path = write(tmp_path, "jsonl")
    with pytest.raises(ColumnError, match="has no column 'nope' \\(mapped to 'answer'\\); its columns are: uid, "):
        load_generic(path, {"answer": "nope"}, cache_dir=tmp_path / "cache")
    with pytest.raises(ColumnError, match="no column for the required field 'answer'.*--column answer=COLUMN"):
        load_generic(path, cache_dir=tmp_path / "cache")
    bad = tmp_path / "bad.jsonl"
    bad.write_text(json.dumps({"answer": "x", "label": "perhaps"}) + "\n", encoding="utf-8")
    with pytest.raises(ValueError, match=r"row 0 .*column 'label': 'perhaps' is not a label"):
        load_generic(bad, cache_dir=tmp_path / "cache")


def test_missing_files_and_unknown_types(tmp_path):
    with pytest.raises(FileNotFoundError, match="no such data file or folder"):
        open_rows(tmp_path / "missing.csv")
    odd = tmp_path / "data.xml"
    odd.write_text("<x/>", encoding="utf-8")
    with pytest.raises(ValueError, match="unknown file type '.xml'"):
        open_rows(odd)
    with pytest.raises(DatasetArgumentError, match="--data-dir: --dataset generic needs the data"):
        get_dataset("generic").load(None)


# -- the commands read the registry --------------------------------------------------------------------------

def _usage_error(capsys, argv) -> str:
    with pytest.raises(SystemExit) as e:
        main(argv)
    assert e.value.code == 2
    return capsys.readouterr().err


def test_cli_column_mapping_errors_exit_2_with_a_clear_message(tmp_path, capsys):
    path = write(tmp_path, "csv")
    base = ["evaluate", "--program", "mark-all", "--dataset", "generic", "--data-dir", str(path), "--no-mlflow"]
    err = _usage_error(capsys, base + ["--column", "answer=nope"])
    assert "halluscope evaluate: error: argument --column: " in err and "has no column 'nope'" in err
    assert "its columns are: uid, prompt, response, gold, language, spans, note" in err
    err = _usage_error(capsys, base + ["--column", "reply=response"])
    assert "argument --column: unknown field 'reply'" in err
    err = _usage_error(capsys, base)  # no answer column, none mapped
    assert "no column for the required field 'answer'" in err
    err = _usage_error(capsys, ["evaluate", "--program", "mark-all", "--lang", "de", "--column", "answer=x",
                                "--no-mlflow"])
    assert "--dataset mushroom has a fixed schema" in err


def test_cli_refuses_lang_for_a_dataset_that_does_not_use_it(capsys):
    err = _usage_error(capsys, ["evaluate", "--program", "mark-all", "--dataset", "halluclean", "--task", "qa",
                                "--lang", "en", "--no-mlflow"])
    assert "argument --lang: --dataset halluclean does not use --lang (got 'en'); drop it" in err
    err = _usage_error(capsys, ["evaluate", "--program", "mark-all", "--dataset", "halluclean", "--no-mlflow"])
    assert "argument --task: required with --dataset halluclean" in err
    err = _usage_error(capsys, ["detect", "--lang", "qa", "--answer", "x"])
    assert "argument --lang: invalid choice: 'qa' for --dataset mushroom" in err
    err = _usage_error(capsys, ["detect", "--dataset", "mushroom", "--task", "qa", "--answer", "x"])
    assert "--dataset mushroom does not use --task" in err
    err = _usage_error(capsys, ["detect", "--list"])  # without --list, --lang auto is the default (#34)
    assert "give --lang LANG or --task TASK" in err


def test_cli_optimize_refuses_span_metrics_on_response_level_data(tmp_path, capsys):
    err = _usage_error(capsys, ["optimize", "--program", "spans", "--metric", "iou", "--task", "qa", "--no-mlflow"])
    assert "'iou' scores spans, but --dataset halluclean is response-level" in err
    path = write(tmp_path, "jsonl")
    err = _usage_error(capsys, ["optimize", "--program", "spans", "--metric", "iou", "--dataset", "generic",
                                "--data-dir", str(path), "--column", "answer=response", "--no-mlflow"])
    assert "--dataset generic is response-level: its rows carry no span labels" in err


def test_cli_evaluate_on_a_generic_csv_writes_predictions_and_no_submission(tmp_path, capsys):
    path = write(tmp_path, "csv")
    out = tmp_path / "out"
    rc = main(["evaluate", "--program", "mark-all", "--dataset", "generic", "--data-dir", str(path),
               "--column", "answer=response", "--column", "label=gold", "--column", "id=uid", "--lang", "de",
               "--column", "lang=language", "--out-dir", str(out), "--no-progress", "--no-mlflow"])
    assert rc == 0
    assert "evaluating mark-all on 1 items of generic/answers.csv/lang=de" in capsys.readouterr().err
    files = sorted(p.name for p in out.rglob("*") if p.is_file())
    assert files == ["mark-all.predictions.jsonl", "mark-all.summary.json"]
    rows = [json.loads(line) for line in next(out.rglob("*.predictions.jsonl")).read_text().splitlines()]
    assert [r["id"] for r in rows] == ["b1"]
    summary = json.loads(next(out.rglob("*.summary.json")).read_text())["summary"]
    assert summary["n"] == 1 and summary["accuracy"] == 1.0 and "iou" not in summary


def test_loaders_keep_no_metric_facts_and_import_no_metrics():
    """Which metrics fit a level is the metrics layer's fact (METRIC_LEVEL); the loaders neither copy nor import it."""
    import ast
    from pathlib import Path

    folder = Path(__file__).resolve().parent.parent / "loaders"
    for path in folder.glob("*.py"):
        tree = ast.parse(path.read_text(encoding="utf-8"))
        for node in ast.walk(tree):
            if isinstance(node, ast.ImportFrom):
                assert not (node.module or "").startswith("halluscope.metrics"), path.name
            if isinstance(node, ast.Import):
                assert not any(a.name.startswith("halluscope.metrics") for a in node.names), path.name
            if isinstance(node, ast.Name):
                assert node.id not in ("SPAN_METRICS", "RESPONSE_METRICS", "METRIC_LEVEL", "ALL_METRICS"), path.name
