"""Issue #24's input probes kept as cheap tests (docs/reliability.md lists them):

* item 2: the Mu-SHROOM Catalan test-file format (tokens and logits stored as Python-repr strings) loads and feeds
  the generator-logit features; such strings are parsed as literals, never evaluated;
* item 3: DOCX/PDF extraction is bounded in uncompressed bytes, pages and time (a zip-bomb DOCX is refused fast,
  with bounded memory; ``POST /v1/evidence`` answers 413/422);
* item 6: every build option and CLI number is type- and range-checked and refused by name (a hypothesis fuzz
  test over option values and generic-dataset gold);
* item 7: loader errors are one line (a traceback only with ``--debug``), and name the line.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from halluscope.core.literals import TextValueError, parse_text_list, parse_text_value
from halluscope.loaders import load_mushroom
from tests.test_retrievers import assemble_pdf

PROJECT_ROOT = Path(__file__).resolve().parent.parent

# -- item 2: the Catalan test-file format ---------------------------------------------------------------------

CA_ANSWER = "La capital de França és Lió, una ciutat gran."
CA_TOKENS = ["La", " capital", " de", " França", " és", " Lió", ",", " una", " ciutat", " gran", "."]
CA_LOGITS = [-0.2, -0.1, -0.05, -0.3, -0.4, -6.5, -0.2, -0.3, -0.3, -0.2, -0.1]


def _catalan_record(item_id: str, tokens=CA_TOKENS, logits=CA_LOGITS) -> dict:
    """A record as the official Catalan test file writes it: tokens and logits as the Python ``repr`` of a list
    (single quotes; not JSON), no labels."""
    assert "'" in repr(tokens) and json.dumps(tokens) != repr(tokens)  # really not JSON
    return {"id": item_id, "lang": "CA", "model_input": "Quina és la capital de França?",
            "model_output_text": CA_ANSWER, "model_id": "some/model",
            "model_output_tokens": repr(tokens), "model_output_logits": repr(logits)}


def _write_catalan(root: Path, records: list[dict]) -> Path:
    path = root / "test" / "mushroom.ca-tst.v1.jsonl"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("".join(json.dumps(r, ensure_ascii=False) + "\n" for r in records), encoding="utf-8")
    return path


def test_the_catalan_test_file_format_loads(tmp_path):
    _write_catalan(tmp_path, [_catalan_record("tst-ca-1"), _catalan_record("tst-ca-2", logits=[
        -0.2, float("nan"), -0.05, -0.3, -0.4, -6.5, -0.2, -0.9, -0.3, -1.1, float("-inf")])])
    examples = load_mushroom(tmp_path, lang="ca", split="test")
    assert [e.id for e in examples] == ["tst-ca-1", "tst-ca-2"]
    assert examples[0].model_output_tokens == CA_TOKENS and examples[0].model_output_logits == CA_LOGITS
    logits = examples[1].model_output_logits  # repr(nan) / repr(-inf) are names, read as the floats
    assert logits[1] != logits[1] and logits[-1] == float("-inf")
    assert all(e.label is None and e.hard_labels == [] for e in examples)


def test_catalan_logits_feed_grounded_and_the_logits_baseline():
    from halluscope.programs.registry import get_program

    grounded = get_program("grounded").make()
    as_lists = grounded(answer=CA_ANSWER, model_output_tokens=CA_TOKENS, model_output_logits=CA_LOGITS)
    as_repr = grounded(answer=CA_ANSWER, model_output_tokens=repr(CA_TOKENS), model_output_logits=repr(CA_LOGITS))
    assert "malformed_logits" not in as_repr.failures and "no_logits" not in as_repr.failures
    assert as_repr.soft_labels == as_lists.soft_labels
    logits = get_program("logits").make()(answer=CA_ANSWER, model_output_tokens=repr(CA_TOKENS),
                                   model_output_logits=repr(CA_LOGITS))
    assert "malformed_logits" not in logits.failures
    assert [CA_ANSWER[s:e] for s, e in logits.hard_labels] == ["Lió"]  # the one low-logit token


def test_detect_on_the_catalan_file_does_not_mark_rows_malformed(tmp_path, capsys):
    """``halluscope detect --lang ca --input`` with the committed cross-lingual grounded artifact (no LM)."""
    from halluscope import cli

    src = _write_catalan(tmp_path, [_catalan_record(f"tst-ca-{i}") for i in range(3)])
    out = tmp_path / "out.jsonl"
    assert cli.main(["detect", "--lang", "ca", "--input", str(src), "--output", str(out), "--no-progress",
                     "--compiled-dir", str(PROJECT_ROOT / "compiled")]) == 0
    rows = [json.loads(line) for line in out.read_text(encoding="utf-8").splitlines()]
    assert len(rows) == 3 and all(r["ok"] for r in rows)
    for row in rows:
        assert not {"malformed_logits", "no_logits", "logits_length"} & set(row["failures"]), row["failures"]


def test_repr_fields_are_parsed_as_literals_never_evaluated(tmp_path):
    marker = tmp_path / "pwned"
    hostile = f"__import__('os').system('touch {marker}')"
    _write_catalan(tmp_path, [{**_catalan_record("tst-ca-1"), "model_output_tokens": hostile}])
    with pytest.raises(ValueError, match=r"mushroom\.ca-tst\.v1\.jsonl: line 1: field 'model_output_tokens': "
                                         r"expected a list"):
        load_mushroom(tmp_path, lang="ca", split="test")
    assert not marker.exists()


@pytest.mark.parametrize("text,value", [
    ('["a", "b"]', ["a", "b"]),  # JSON first
    ("['a', \"b\", '\\u2581c']", ["a", "b", "\u2581c"]),
    ("(1, -2.5, +3)", [1, -2.5, 3]),
    ("[np.float32(-1.5), numpy.float64(2.0), np.int64(3)]", [-1.5, 2.0, 3]),  # numpy 2's repr of its scalars
    ("[{'start': 0, 'end': 4, 'prob': 1.0}]", [{"start": 0, "end": 4, "prob": 1.0}]),  # pandas' CSV of a list
    ("[None, True, False]", [None, True, False]),
])
def test_parse_text_value_reads_json_and_python_literals(text, value):
    assert parse_text_value(text) == value


@pytest.mark.parametrize("text", [
    "__import__('os').system('true')", "[1, x]", "(lambda: 1)()", "[1 + 2]", "[i for i in range(3)]",
    "open('/etc/passwd').read()", "np.float32(np)", "b'bytes'", "{**{}}", "[" * 100_000, "[1, 2", "",
    "[os.environ]", "{[1]: 2}", "-'a'",
])
def test_parse_text_value_refuses_anything_but_literals(text):
    with pytest.raises(TextValueError):
        parse_text_value(text)


def test_parse_text_list_wants_a_list():
    assert parse_text_list("(1, 2)") == [1, 2]
    with pytest.raises(TextValueError, match="expected a list, got dict"):
        parse_text_list("{'a': 1}")


# -- item 3: bounded PDF/DOCX extraction -----------------------------------------------------------------------

_CT = ('<?xml version="1.0" encoding="UTF-8" standalone="yes"?>'
       '<Types xmlns="http://schemas.openxmlformats.org/package/2006/content-types">'
       '<Default Extension="rels" ContentType="application/vnd.openxmlformats-package.relationships+xml"/>'
       '<Default Extension="xml" ContentType="application/xml"/>'
       '<Override PartName="/word/document.xml" ContentType="application/vnd.openxmlformats-officedocument.'
       'wordprocessingml.document.main+xml"/></Types>')
_RELS = ('<?xml version="1.0" encoding="UTF-8" standalone="yes"?>'
         '<Relationships xmlns="http://schemas.openxmlformats.org/package/2006/relationships">'
         '<Relationship Id="rId1" Type="http://schemas.openxmlformats.org/officeDocument/2006/relationships/'
         'officeDocument" Target="word/document.xml"/></Relationships>')
_DOC_HEAD = ('<?xml version="1.0" encoding="UTF-8" standalone="yes"?><w:document '
             'xmlns:w="http://schemas.openxmlformats.org/wordprocessingml/2006/main"><w:body>')
_PARAGRAPH = "<w:p><w:r><w:t>The Moon orbits the Earth.</w:t></w:r></w:p>"


def _docx(path: Path, *, paragraphs: int = 1, bomb_bytes: int = 0, bomb_in: str = "media", members: int = 0) -> Path:
    """A minimal DOCX; ``bomb_bytes`` more uncompressed bytes, streamed into the zip in 1 MB chunks (the test
    never holds them): zeros in ``word/media/`` (``bomb_in="media"``) or repeated paragraphs in document.xml."""
    import zipfile

    with zipfile.ZipFile(path, "w", zipfile.ZIP_DEFLATED, compresslevel=1) as z:
        z.writestr("[Content_Types].xml", _CT)
        z.writestr("_rels/.rels", _RELS)
        with z.open("word/document.xml", "w", force_zip64=True) as f:
            f.write((_DOC_HEAD + _PARAGRAPH * paragraphs).encode())
            if bomb_in == "document":
                chunk = (_PARAGRAPH * (1_000_000 // len(_PARAGRAPH))).encode()
                for _ in range(bomb_bytes // len(chunk)):
                    f.write(chunk)
            f.write(b"</w:body></w:document>")
        if bomb_in == "media" and bomb_bytes:
            with z.open("word/media/image1.png", "w", force_zip64=True) as f:
                zeros = bytes(1_000_000)
                for _ in range(bomb_bytes // len(zeros)):
                    f.write(zeros)
        for i in range(members):
            z.writestr(f"customXml/item{i}.xml", "<x/>")
    return path


def _pdf(pages: list[bytes], *, flate: bool = False) -> bytes:
    """A PDF whose pages show the given content streams (hand-written objects and xref; Helvetica)."""
    import zlib

    n = len(pages)
    objs = [b"<< /Type /Catalog /Pages 2 0 R >>",
            b"<< /Type /Pages /Kids [%s] /Count %d >>" % (b" ".join(b"%d 0 R" % (4 + 2 * i) for i in range(n)), n),
            b"<< /Type /Font /Subtype /Type1 /BaseFont /Helvetica >>"]
    for i, content in enumerate(pages):
        data = zlib.compress(content, 9) if flate else content
        objs.append(b"<< /Type /Page /Parent 2 0 R /MediaBox [0 0 300 200] /Contents %d 0 R "
                    b"/Resources << /Font << /F1 3 0 R >> >> >>" % (5 + 2 * i))
        objs.append(b"<< /Length %d%s >>\nstream\n" % (len(data), b" /Filter /FlateDecode" if flate else b"")
                    + data + b"\nendstream")
    return assemble_pdf(objs)


def _text_page(text: str) -> bytes:
    return f"BT /F1 12 Tf 20 100 Td ({text}) Tj ET".encode()


def _measured(fn):
    """``(result or exception, seconds, peak bytes Python allocated)`` of ``fn()``."""
    import time
    import tracemalloc

    tracemalloc.start()
    t0 = time.perf_counter()
    try:
        out = fn()
    except Exception as e:  # noqa: BLE001 - the caller asserts on it
        out = e
    seconds = time.perf_counter() - t0
    _, peak = tracemalloc.get_traced_memory()
    tracemalloc.stop()
    return out, seconds, peak


def test_normal_documents_read_within_the_bounds(tmp_path):
    from halluscope.retrievers.files import read_document

    assert read_document(_docx(tmp_path / "ok.docx", paragraphs=3)).count("The Moon orbits the Earth.") == 3
    pdf = tmp_path / "ok.pdf"
    pdf.write_bytes(_pdf([_text_page("First page."), _text_page("Second page.")], flate=True))
    assert read_document(pdf) == "First page.\n\nSecond page."


_BOMB_CHILD = """
import resource, sys, time
resource.setrlimit(resource.RLIMIT_AS, (1_500_000_000, 1_500_000_000))  # 1.5 GB of address space at most
from halluscope.retrievers.files import DocumentTooLarge, read_document
t0 = time.perf_counter()
try:
    read_document(sys.argv[1])
    print("read")
except DocumentTooLarge as e:
    print("refused", round(time.perf_counter() - t0, 3), e)
"""


@pytest.mark.parametrize("bomb_in", ["document", "media"])
def test_a_zip_bomb_docx_is_refused_before_it_inflates(tmp_path, bomb_in):
    """A DOCX of under 2 MB that inflates to 200 MB is refused in a child process capped at 1.5 GB of address space,
    in well under a second of reading. Before the bound, python-docx inflated and parsed all of document.xml
    (20 MB of it alone: 19 s and 320 MB on this machine), and this child ran out of memory or time. (An
    unreferenced 200 MB media member is refused too: a reader that follows other parts would inflate it.)"""
    import subprocess
    import sys

    bomb = _docx(tmp_path / "bomb.docx", bomb_bytes=200_000_000, bomb_in=bomb_in)
    assert bomb.stat().st_size < 2_000_000
    try:
        done = subprocess.run([sys.executable, "-c", _BOMB_CHILD, str(bomb)], capture_output=True, text=True,
                              timeout=60)
    except subprocess.TimeoutExpired:
        pytest.fail("reading the zip bomb ran for 60 s")
    assert done.returncode == 0, done.stderr[-2000:]
    word, seconds, message = done.stdout.split(" ", 2)
    assert word == "refused", done.stdout
    assert "inflates to" in message and "over the 50000000-byte limit on uncompressed content" in message
    assert float(seconds) < 2.0  # the imports of python-docx/lxml included


def test_docx_and_pdf_bounds_on_members_pages_streams_and_time(tmp_path):
    from halluscope.retrievers.files import DocumentTooLarge, DocumentTooSlow, ExtractionLimits, read_document

    with pytest.raises(DocumentTooLarge, match="DOCX with 53 zip members, over the 50-member limit"):
        read_document(_docx(tmp_path / "many.docx", members=50), limits=ExtractionLimits(max_zip_members=50))
    pages = tmp_path / "pages.pdf"
    pages.write_bytes(_pdf([_text_page(f"Page {i}.") for i in range(5)]))
    with pytest.raises(DocumentTooLarge, match="PDF with 5 pages, over the 3-page limit"):
        read_document(pages, limits=ExtractionLimits(max_pages=3))
    stream_bomb = tmp_path / "stream.pdf"  # one page whose content stream inflates to 20 MB
    stream_bomb.write_bytes(_pdf([_text_page("Hi.") + b" " * 20_000_000], flate=True))
    assert stream_bomb.stat().st_size < 100_000
    err, seconds, peak = _measured(lambda: read_document(
        stream_bomb, limits=ExtractionLimits(max_uncompressed_bytes=1_000_000)))
    assert isinstance(err, DocumentTooLarge) and "1000000 uncompressed bytes per stream" in str(err), err
    assert peak < 10_000_000, peak
    with pytest.raises(DocumentTooSlow, match="PDF: text extraction took over 1e-09 s"):
        read_document(pages, limits=ExtractionLimits(max_seconds=1e-9))
    with pytest.raises(DocumentTooSlow, match="DOCX: text extraction took over"):
        read_document(_docx(tmp_path / "slow.docx", paragraphs=10), limits=ExtractionLimits(max_seconds=1e-9))
    for bad in ({"max_pages": 0}, {"max_seconds": -1}, {"max_uncompressed_bytes": True}):
        with pytest.raises(ValueError, match="ExtractionLimits"):
            ExtractionLimits(**bad)


def test_evidence_upload_refuses_a_zip_bomb_with_413_fast(tmp_path):
    import base64

    from fastapi.testclient import TestClient

    from halluscope.artifacts import store as artifacts
    from halluscope.serve import Limits, create_app
    from tests.test_serve import write

    write(tmp_path, "mark-all", "de")
    detectors = [artifacts.load_compiled("mark-all", lang="de", metric="iou", root=tmp_path)]
    # 30 MB of document.xml, over the server's 20 MB bound (before it: about 30 s of CPU and 500 MB to parse)
    bomb = _docx(tmp_path / "bomb.docx", bomb_bytes=30_000_000, bomb_in="document").read_bytes()
    with TestClient(create_app(detectors)) as c:
        def upload(name, data):
            return c.post("/v1/evidence", json={"filename": name, "content_base64": base64.b64encode(data).decode()})

        r, seconds, peak = _measured(lambda: upload("bomb.docx", bomb))
        assert r.status_code == 413, r.text
        assert "bomb.docx: DOCX that inflates to" in r.json()["error"] and "20000000-byte limit" in r.json()["error"]
        assert seconds < 3.0 and peak < 30_000_000, (seconds, peak)
        assert upload("ok.docx", _docx(tmp_path / "ok.docx").read_bytes()).json()["text"] == \
            "The Moon orbits the Earth."  # the server is still up and reading
    pages = _pdf([_text_page(f"Page {i}.") for i in range(4)])
    with TestClient(create_app(detectors, limits=Limits(max_upload_pages=3, max_upload_seconds=30))) as c:
        r = c.post("/v1/evidence", json={"filename": "p.pdf", "content_base64": base64.b64encode(pages).decode()})
        assert r.status_code == 413 and "p.pdf: PDF with 4 pages, over the 3-page limit" in r.json()["error"]
    with TestClient(create_app(detectors, limits=Limits(max_upload_seconds=1e-9))) as c:
        r = c.post("/v1/evidence", json={"filename": "p.pdf", "content_base64": base64.b64encode(pages).decode()})
        assert r.status_code == 422 and "p.pdf: PDF: text extraction took over" in r.json()["error"]



# -- item 6: every build option and CLI number has a type and range, refused by name ------------------------------

def test_every_built_in_program_declares_its_option_types_and_ranges():
    import halluscope.programs  # noqa: F401 - registers the built-in programs
    from halluscope.programs.registry import REGISTRY, undeclared_ranges

    for name, spec in REGISTRY.items():
        if spec.build.__module__.startswith("tests."):  # test fixtures may register their own
            continue
        assert undeclared_ranges(spec) == [], name
        assert spec.check_options({}) == spec.options  # every default fits its type and range


# (argv after the command, option or argument named, what it takes): the probes and their siblings
OPTION_PROBES = [
    (["--program", "spans", "-O", "reasoning=maybe"], "option 'reasoning' of program 'spans'", "true or false"),
    (["--program", "grounded", "-O", "window=-3"], "option 'window' of program 'grounded'", "a whole number in [0, 1000000]"),
    (["--program", "spans", "-O", "fuzzy_threshold=-1"], "option 'fuzzy_threshold'", "a finite number in [0, 1]"),
    (["--program", "medico", "-O", "delta=5"], "option 'delta' of program 'medico'", "a finite number in [0, 1]"),
    (["--program", "medico", "-O", "k=0"], "option 'k' of program 'medico'", "a whole number in [1, 1000000]"),
    (["--program", "finch", "-O", "n_samples=-2"], "option 'n_samples' of program 'finch'", "a whole number in [1, 1000000]"),
    (["--program", "finch", "-O", "tau=0.5"], "option 'tau' of program 'finch'", "a finite number in [0, 0.5)"),
    (["--program", "grounded", "-O", "aggregate=mean"], "option 'aggregate'", "one of 'max', 'top3'"),
    (["--program", "grounded", "-O", "lm=true", "-O", "lm_model=/no/such/model.gguf"],
     "option 'lm_model' of program 'grounded': no GGUF file '/no/such/model.gguf' (the LM signal is on", ""),
    (["--program", "halluclean", "-O", 'max_tokens={"reason": 0}'], "option 'max_tokens'", "stage 'reason'"),
    (["--program", "spans", "--threads", "0"], "argument --threads", "expected a whole number in [1, 1024], got '0'"),
    (["--program", "spans", "--threads", "-4"], "argument --threads", "expected a whole number in [1, 1024], got '-4'"),
    (["--program", "spans", "--limit", "0"], "argument --limit", "a whole number in [1, 1000000000]"),
    (["--program", "spans", "--lm-timeout", "-1"], "argument --lm-timeout", "a finite number in (0, 604800]"),
    (["--program", "spans", "--lm-retries", "-1"], "argument --lm-retries", "a whole number in [0, 100]"),
    (["--program", "spans", "--temperature", "nan"], "argument --temperature", "a finite number in [0, 2]"),
    (["--program", "spans", "--max-failed-share", "1.5"], "argument --max-failed-share", "a finite number in [0, 1]"),
]


@pytest.mark.parametrize("command", ["evaluate", "optimize"])
@pytest.mark.parametrize("argv, named, allowed", OPTION_PROBES, ids=[" ".join(p[0][2:]) for p in OPTION_PROBES])
def test_bad_options_and_numbers_are_refused_up_front_by_name(command, argv, named, allowed, capsys, monkeypatch,
                                                              tmp_path):
    from halluscope import cli

    monkeypatch.chdir(tmp_path)  # nothing may be written: no outputs/, no mlruns/
    monkeypatch.setenv("HALLUSCOPE_DATA_DIR", str(tmp_path / "no-data-loaded"))  # any load would fail differently
    from halluscope.programs.registry import get_program

    if command == "optimize" and get_program(argv[1]).level == "response":
        argv = [*argv, "--metric", "f1"]
    with pytest.raises(SystemExit) as e:
        cli.main([command, "--lang", "de", "--no-mlflow", *argv])
    err = capsys.readouterr().err
    assert e.value.code == 2
    line = err.strip().splitlines()[-1]
    assert "error:" in line and named in line and allowed in line, err
    assert "Traceback" not in err and list(tmp_path.iterdir()) == []


def test_more_cli_numbers_are_range_checked(capsys):
    from halluscope import cli

    for argv, named in [(["detect", "--lang", "de", "--threads", "0", "--answer", "x"], "--threads"),
                        (["serve", "--port", "70000"], "--port"), (["serve", "--max-batch", "0"], "--max-batch"),
                        (["index", "build", "docs", "--out", "x", "--max-mb", "-1"], "--max-mb"),
                        (["optimize", "--folds", "0"], "--folds"), (["optimize", "--val-fraction", "1"], "--val-fraction"),
                        (["optimize", "--seed", "-1"], "--seed"), (["optimize", "--candidates", "x"], "--candidates")]:
        with pytest.raises(SystemExit) as e:
            cli.main(argv)
        assert e.value.code == 2 and f"argument {named}: expected" in capsys.readouterr().err, argv


def _check_type(option_type, value):
    """What an accepted value must satisfy for its declared type and range."""
    if value is None:
        return option_type.nullable
    if option_type.kind == "bool":
        return isinstance(value, bool)
    if option_type.kind in ("int", "float"):
        ok_type = isinstance(value, int) if option_type.kind == "int" else isinstance(value, float)
        lo, hi = option_type.lo, option_type.hi
        return (ok_type and not isinstance(value, bool) and value == value
                and (lo is None or value > lo or (value == lo and not option_type.lo_open))
                and (hi is None or value < hi or (value == hi and not option_type.hi_open)))
    if option_type.kind == "str":
        return isinstance(value, str) and (not option_type.choices or value in option_type.choices)
    return True


def _option_values():
    from hypothesis import strategies as st

    return st.one_of(st.none(), st.booleans(), st.integers(-10**6, 10**6), st.floats(allow_nan=True),
                     st.sampled_from(["true", "false", "maybe", "", "nan", "inf", "-3", "0", "1", "0.5", "2.5",
                                      "1e3", "max", "top3", "bm25", "concat", "qa", "x"]),
                     st.text(max_size=8), st.lists(st.integers(-3, 3), max_size=3),
                     st.dictionaries(st.sampled_from(["reason", "judge", "nope"]), st.integers(-2, 600), max_size=2))


def test_fuzz_option_values_are_converted_into_range_or_refused_by_name():
    """Any value for any option of any built-in program: either accepted, converted to its declared type and
    inside its range, or an InvalidOptionError naming the option and the program; never another exception."""
    from hypothesis import given, settings
    from hypothesis import strategies as st

    import halluscope.programs  # noqa: F401
    from halluscope.programs.registry import REGISTRY, InvalidOptionError

    pairs = sorted((name, option) for name, spec in REGISTRY.items() if not spec.build.__module__.startswith("tests.")
                   for option in spec.parameters)

    @settings(max_examples=400, deadline=None, derandomize=True)
    @given(pair=st.sampled_from(pairs), value=_option_values())
    def check(pair, value):
        name, option = pair
        spec = REGISTRY[name]
        try:
            out = spec.check_options({option: value})
        except InvalidOptionError as e:
            assert f"option {option!r} of program {name!r}: " in str(e)
            return
        assert _check_type(spec.types[option], out[option]), (name, option, value, out[option])

    check()


def test_fuzz_accepted_numeric_options_build_the_program():
    """An accepted number or flag builds the program: the range is what the program takes (no error later)."""
    from hypothesis import given, settings
    from hypothesis import strategies as st

    import halluscope.programs  # noqa: F401
    from halluscope.programs.registry import REGISTRY, InvalidOptionError

    def buildable(name) -> bool:  # a program whose optional extra is not installed here cannot be built at all
        try:
            REGISTRY[name].make()
        except ValueError as e:
            if "pip install" in str(e):
                return False
            raise
        return True

    pairs = sorted((name, option) for name, spec in REGISTRY.items() if not spec.build.__module__.startswith("tests.")
                   and buildable(name) for option, t in spec.types.items() if t.kind in ("bool", "int", "float"))
    assert len({name for name, _ in pairs}) >= 8

    @settings(max_examples=150, deadline=None, derandomize=True)
    @given(pair=st.sampled_from(pairs), value=st.one_of(st.integers(-5, 50), st.floats(-2, 3), st.booleans()))
    def check(pair, value):
        name, option = pair
        try:
            REGISTRY[name].make(**{option: value})
        except InvalidOptionError:
            pass

    check()


# -- item 6: generic-dataset gold is range-checked, naming file, line and column ----------------------------------

def _generic_csv(tmp_path, spans_text: str, answer: str = "Paris is in Spain.") -> Path:
    path = tmp_path / "gold.csv"
    path.write_text(f'answer,spans\n"Paris is in France.","[]"\n"{answer}","{spans_text}"\n', encoding="utf-8")
    return path


@pytest.mark.parametrize("spans, problem", [
    ("[[5, 2]]", "got [5, 2]"),  # reversed
    ("[[0, 999]]", "got [0, 999]"),  # past the answer's end
    ("[[-1, 3]]", "got [-1, 3]"),
    ("[[1.5, 3]]", "whole numbers"),
    ("[[1, 2, 3]]", "expected [start, end]"),
])
def test_generic_gold_spans_out_of_range_are_refused_with_file_line_and_column(tmp_path, spans, problem):
    from halluscope.loaders.generic import load_generic

    path = _generic_csv(tmp_path, spans)
    with pytest.raises(ValueError) as e:
        load_generic(path, {"hard_labels": "spans"}, cache_dir=tmp_path / "cache")
    msg = str(e.value)
    assert msg.startswith(f"{path}: row 1 (line 3, id 'gold-1'): column 'spans'"), msg
    assert problem in msg and "\n" not in msg


def test_generic_gold_as_python_repr_and_soft_labels_are_checked(tmp_path):
    from halluscope.loaders.generic import load_generic

    ok = tmp_path / "repr.csv"  # pandas writes a list column as its Python repr
    ok.write_text('answer,soft\n"Paris is in Spain.","[{\'start\': 12, \'end\': 17, \'prob\': 0.75}]"\n', encoding="utf-8")
    [ex] = load_generic(ok, {"soft_labels": "soft"}, cache_dir=tmp_path / "cache")
    assert ex.soft_labels == [{"start": 12, "end": 17, "prob": 0.75}] and ex.hard_labels == [[12, 17]]
    bad = tmp_path / "prob.jsonl"
    bad.write_text('{"answer": "abc", "soft_labels": []}\n\n{"answer": "abc", "soft_labels": '
                   '[{"start": 0, "end": 2, "prob": 1.5}]}\n', encoding="utf-8")
    with pytest.raises(ValueError, match=r"prob\.jsonl: row 1 \(line 3, id 'prob-1'\): column 'soft_labels': "
                                         r"field 'soft_labels'\[0\]: expected 0 <= prob <= 1, got 1.5"):
        load_generic(bad, cache_dir=tmp_path / "cache")


def test_fuzz_generic_gold_is_accepted_in_range_or_refused_by_row_and_column():
    """Random span lists for a random answer: accepted spans lie inside the answer with start < end; anything
    else is a ValueError naming the row, its line and the column (never another exception, never scored)."""
    from hypothesis import given, settings
    from hypothesis import strategies as st

    from halluscope.loaders.generic import _case

    spans = st.lists(st.one_of(st.tuples(st.integers(-5, 40), st.integers(-5, 40)).map(list),
                               st.lists(st.integers(0, 9), max_size=3), st.text(max_size=3), st.none()), max_size=4)
    cell = st.one_of(spans, spans.map(json.dumps), spans.map(repr), st.text(max_size=12))

    @settings(max_examples=300, deadline=None, derandomize=True)
    @given(answer=st.text(min_size=0, max_size=30), value=cell)
    def check(answer, value):
        row = {"answer": answer, "spans": value}
        try:
            case = _case(row, 4, {"answer": "answer", "hard_labels": "spans"}, stem="f", where="f.csv", lang=None,
                         task=None, context=None, line=6)
        except ValueError as e:
            assert str(e).startswith("f.csv: row 4 (line 6, id 'f-4'): column 'spans'"), str(e)
            return
        for s, e in case["hard_labels"] or []:
            assert isinstance(s, int) and isinstance(e, int) and 0 <= s < e <= len(answer)

    check()


# -- item 7: loader errors are one line (a traceback only with --debug) and name the line -------------------------

def _mushroom_root(tmp_path: Path, lines: list[str], lang: str = "de") -> Path:
    root = tmp_path / "mushroom"
    path = root / "val" / f"mushroom.{lang}-val.v2.extra.jsonl"
    path.parent.mkdir(parents=True)
    path.write_text("".join(line + "\n" for line in lines), encoding="utf-8")
    return root


def _mushroom_line(item_id: str = "val-de-1", **kw) -> str:
    rec = {"id": item_id, "lang": "DE", "model_input": "Wo liegt Paris?", "model_output_text": "Paris liegt in Spanien.",
           "hard_labels": [[15, 22]], "soft_labels": [{"start": 15, "end": 22, "prob": 1.0}]}
    rec.update(kw)
    return json.dumps(rec, ensure_ascii=False)


def _write(path: Path, data: bytes | str) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(data if isinstance(data, bytes) else data.encode("utf-8"))
    return path


def _bad_inputs(tmp_path: Path) -> list[tuple[list[str], str]]:
    """(argv, what the one line must say) for bad data given to ``evaluate``/``optimize``."""
    generic = ["--dataset", "generic", "--data-dir"]
    g = tmp_path / "generic"
    return [
        (generic + [str(_write(g / "binary.csv", bytes(range(256)) * 4))], "binary.csv: line 1: a NUL byte"),
        (generic + [str(_write(g / "latin1.csv", "answer\nok\nCaf\xe9 cr\xe8me\n".encode("latin-1")))],
         "latin1.csv: line 3: not UTF-8 text (byte 0xe9 at column 4)"),
        (generic + [str(_write(g / "broken.jsonl", '{"answer": "a"}\n{"answer": "b", \n'))],
         "broken.jsonl: line 2: malformed JSON"),
        (generic + [str(_write(g / "array.jsonl", '\n["answer", "a"]\n'))],
         "array.jsonl: line 2: expected a JSON object, got list"),
        (generic + [str(_write(g / "doc.json", '[\n  {"answer": "a"},\n  {"answer": }\n]\n'))],
         "doc.json: line 3: malformed JSON"),
        (generic + [str(_write(g / "binary.parquet", b"PAR1 not really parquet"))],
         "binary.parquet: cannot be read as parquet"),
        (generic + [str(_write(g / "binary.jsonl", b"\x89PNG\r\n\x1a\n\x00\x00\x00\rIHDR"))],
         "binary.jsonl: line 1: not UTF-8 text"),
        (generic + [str(_write(g / "labels.csv", "answer,label\nx,1\ny,perhaps\n"))],
         "labels.csv: row 1 (line 3, id 'labels-1'): column 'label': 'perhaps' is not a label"),
        (generic + [str(_write(g / "spans.csv", 'answer,hard_labels\nabc,"[[5, 2]]"\n'))],
         "spans.csv: row 0 (line 2, id 'spans-0'): column 'hard_labels'"),
        (generic + [str(g / "missing.csv")], "no such data file or folder"),
        (generic + [str(_write(g / "data.xml", "<x/>"))], "unknown file type '.xml'"),
        (["--data-dir", str(tmp_path / "nowhere")], "no such Mu-SHROOM file or directory"),
        (["--data-dir", str(_mushroom_root(tmp_path / "m1", [_mushroom_line()], lang="en"))],
         "no Mu-SHROOM val file for language 'de'"),
        (["--data-dir", str(_mushroom_root(tmp_path / "m2", [_mushroom_line(), "{oops"]))],
         "mushroom.de-val.v2.extra.jsonl: line 2: malformed JSON"),
        (["--data-dir", str(_mushroom_root(tmp_path / "m3", [_mushroom_line(hard_labels=[[15, 99]])]))],
         "line 1: item 'val-de-1': field 'hard_labels'[0]: expected 0 <= start < end <= 23"),
        (["--data-dir", str(_mushroom_root(tmp_path / "m4", [_mushroom_line(), _mushroom_line()]))],
         "line 2: item 'val-de-1': duplicate id (first on line 1)"),
        (["--data-dir", str(_mushroom_root(tmp_path / "m5", [_mushroom_line(model_output_logits="[1, x]")]))],
         "line 1: field 'model_output_logits': expected a list"),
        (["--data-dir", str(_mushroom_root(tmp_path / "m6", [_mushroom_line()])), "--context", "native"],
         "context folder not found"),
    ]


@pytest.mark.parametrize("command", ["evaluate", "optimize"])
def test_bad_data_is_one_line_without_a_traceback(tmp_path, capsys, monkeypatch, command):
    """20 of 74 bad inputs used to print their message under a 25-81-line traceback; every one here is a single
    ``<command>: error: ...`` line naming the file and line (exit 2). ``--debug`` shows the traceback."""
    from halluscope import cli
    from halluscope.cli.common import InputError

    monkeypatch.chdir(tmp_path)
    base = {"evaluate": ["evaluate", "--program", "mark-all", "--no-progress", "--no-mlflow", "--context", "none"],
            "optimize": ["optimize", "--program", "grounded", "--no-mlflow", "--context", "none"]}[command]
    cases = _bad_inputs(tmp_path / "data")
    for argv, says in cases:
        lang = [] if "generic" in argv else ["--lang", "de"]
        full = [*base, *lang, *argv]
        assert cli.main(full) == 2, argv
        err = capsys.readouterr().err
        lines = [line for line in err.splitlines() if line.strip()]
        assert len(lines) == 1 and lines[0].startswith(f"halluscope {command}: error: "), (argv, err)
        assert says in lines[0], (argv, lines[0])
    argv, says = cases[2]  # the malformed JSONL, with --debug: the traceback and the original error as its cause
    with pytest.raises(InputError, match="line 2: malformed JSON") as e:
        cli.main([*base, *argv, "--debug"])
    assert isinstance(e.value.__cause__, ValueError)


def test_optimize_test_file_errors_are_one_line(tmp_path, capsys, monkeypatch):
    from halluscope.cli.optimize import main

    monkeypatch.chdir(tmp_path)
    root = _mushroom_root(tmp_path, [_mushroom_line(f"val-de-{i}") for i in range(4)])
    bad = _write(tmp_path / "test" / "mushroom.de-tst.v1.extra.jsonl", _mushroom_line() + "\n{oops\n")
    base = ["--program", "grounded", "--no-mlflow", "--context", "none", "--lang", "de", "--data-dir", str(root),
            "--folds", "2"]
    for test, says in [(bad, "argument --test: " + str(bad) + ": line 2: malformed JSON"),
                       (tmp_path / "nope.jsonl", "argument --test: no such Mu-SHROOM file or directory")]:
        assert main([*base, "--test", str(test)]) == 2
        lines = [line for line in capsys.readouterr().err.splitlines() if line.strip()]
        assert lines[-1].startswith("optimize.py: error: argument --test: ") and says in lines[-1], lines
        assert not any("Traceback" in line for line in lines)
