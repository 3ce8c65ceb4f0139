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

from halluscope.literals import TextValueError, parse_text_list, parse_text_value
from halluscope.loaders import load_mushroom

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
    from halluscope.programs.registry import get

    grounded = get("grounded").make()
    as_lists = grounded(answer=CA_ANSWER, model_output_tokens=CA_TOKENS, model_output_logits=CA_LOGITS)
    as_repr = grounded(answer=CA_ANSWER, model_output_tokens=repr(CA_TOKENS), model_output_logits=repr(CA_LOGITS))
    assert "malformed_logits" not in as_repr.failures and "no_logits" not in as_repr.failures
    assert as_repr.soft_labels == as_lists.soft_labels
    logits = get("logits").make()(answer=CA_ANSWER, model_output_tokens=repr(CA_TOKENS),
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
    out, offsets = b"%PDF-1.4\n", []
    for i, o in enumerate(objs, 1):
        offsets.append(len(out))
        out += b"%d 0 obj\n" % i + o + b"\nendobj\n"
    xref = len(out)
    out += b"xref\n0 %d\n0000000000 65535 f \n" % (len(objs) + 1) + b"".join(b"%010d 00000 n \n" % o for o in offsets)
    return out + b"trailer\n<< /Size %d /Root 1 0 R >>\nstartxref\n%d\n%%%%EOF\n" % (len(objs) + 1, xref)


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

    from halluscope import artifacts
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

