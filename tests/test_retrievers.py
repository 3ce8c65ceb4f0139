"""MEDICO's retrievers, offline: knowledge base, user files, knowledge graph, web search (a fake local server)."""

from __future__ import annotations

import json
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

import halluscope.retrievers  # noqa: F401  (registers kb, files, kg, search)
from halluscope.cli import main as cli_main
from halluscope.core.retrieval import CachedRetriever, Retriever, make_retriever
from halluscope.retrievers.bm25 import BM25Index, chunk, n_tokens, passages_of, tokenize
from halluscope.retrievers.files import FileRetriever, NoUsableFilesError
from halluscope.retrievers.kb import KBRetriever, build_index
from halluscope.retrievers.kg import KGRetriever, TripleFormatError, linearize
from halluscope.retrievers.search import SearchError, SearchRetriever


def assemble_pdf(objs: list[bytes]) -> bytes:
    """A PDF file of the objects ``objs`` (object 1 the catalog), with its xref table and trailer."""
    out, offsets = b"%PDF-1.4\n", []
    for i, o in enumerate(objs, 1):
        offsets.append(len(out))
        out += b"%d 0 obj\n" % i + o + b"\nendobj\n"
    xref = len(out)
    out += b"xref\n0 %d\n0000000000 65535 f \n" % (len(objs) + 1) + b"".join(b"%010d 00000 n \n" % o for o in offsets)
    return out + b"trailer\n<< /Size %d /Root 1 0 R >>\nstartxref\n%d\n%%%%EOF\n" % (len(objs) + 1, xref)


def text_pdf(text: str) -> bytes:
    """A minimal one-page PDF showing ``text`` in Helvetica (hand-written objects and xref)."""
    stream = f"BT /F1 12 Tf 20 100 Td ({text}) Tj ET".encode()
    objs = [b"<< /Type /Catalog /Pages 2 0 R >>", b"<< /Type /Pages /Kids [3 0 R] /Count 1 >>",
            b"<< /Type /Page /Parent 2 0 R /MediaBox [0 0 300 200] /Contents 4 0 R "
            b"/Resources << /Font << /F1 5 0 R >> >> >>",
            b"<< /Length %d >>\nstream\n" % len(stream) + stream + b"\nendstream",
            b"<< /Type /Font /Subtype /Type1 /BaseFont /Helvetica >>"]
    return assemble_pdf(objs)


# -- tokens, chunks, BM25 ---------------------------------------------------------------------------------------

def test_tokenize_lowercases_words_and_makes_cjk_bigrams():
    assert tokenize("The Eiffel TOWER") == ["the", "eiffel", "tower"]
    assert tokenize("東京タワー") == ["東京", "京タ", "タワ", "ワー"]
    assert tokenize("中 in 北京") == ["中", "in", "北京"]


def test_chunks_stay_within_the_token_limit_and_keep_the_text():
    text = "Short paragraph.\n\n" + " ".join(f"w{i}." if i % 10 == 9 else f"w{i}" for i in range(600))
    chunks = chunk(text, 256)
    assert all(n_tokens(c) <= 256 for c in chunks) and len(chunks) == 3
    assert all(c in text for c in chunks)
    assert chunks[1].endswith(".")  # cut at a sentence end
    assert [n_tokens(c) for c in chunk("中" * 600, 256)] == [256, 256, 88]  # each CJK character is a token
    assert chunk("", 256) == [] and chunk("  \n\n ", 256) == []
    with pytest.raises(ValueError):
        chunk("x", 0)


def test_bm25_index_ranks_and_round_trips_without_pickle(tmp_path):
    idx = BM25Index(passages_of([("a", "Paris is the capital of France."), ("b", "Berlin is the capital of Germany."),
                                 ("c", "東京は日本の首都です。")]))
    assert [p.doc for p, _ in idx.search("capital of Germany", 2)] == ["b", "a"]
    assert [p.doc for p, _ in idx.search("日本の首都", 1)] == ["c"]
    assert idx.search("unrelated zebra") == []
    idx.save(tmp_path / "ix")
    assert not list((tmp_path / "ix").rglob("*.pkl")) and not list((tmp_path / "ix").rglob("*.pickle"))
    again = BM25Index.load(tmp_path / "ix")
    assert [p.id for p, _ in again.search("capital of Germany", 2)] == ["b#0", "a#0"]


# -- knowledge base -------------------------------------------------------------------------------------------

@pytest.fixture
def corpus_jsonl(tmp_path):
    path = tmp_path / "corpus.jsonl"
    docs = [{"id": "moon", "text": "The Moon orbits the Earth in about 27 days."},
            {"id": "mars", "text": "Mars has two small moons, Phobos and Deimos."},
            {"id": "tokyo", "text": "東京は日本の首都です。"}]
    path.write_text("".join(json.dumps(d, ensure_ascii=False) + "\n" for d in docs), encoding="utf-8")
    return path


def test_kb_index_from_jsonl_is_built_once_and_reused(corpus_jsonl, tmp_path):
    out = tmp_path / "index"
    first = build_index(corpus_jsonl, out)
    assert (first.documents, first.passages, first.reused) == (3, 3, False)
    second = build_index(corpus_jsonl, out)
    assert second.reused and second.hash == first.hash
    kb = make_retriever(f"kb:{out}")
    assert isinstance(kb, KBRetriever) and isinstance(kb, Retriever)
    ev = kb.retrieve("How many moons does Mars have?", k=2)
    assert ev[0].id == "mars#0" and ev[0].source == "kb" and ev[0].score > 0
    assert kb.retrieve("日本の首都", k=1)[0].id == "tokyo#0"
    corpus_jsonl.write_text(corpus_jsonl.read_text() + '{"id": "sun", "text": "The Sun is a star."}\n')
    third = build_index(corpus_jsonl, out)
    assert not third.reused and third.documents == 4 and third.hash != first.hash
    assert make_retriever(f"kb:{out}").retrieve("Sun star", k=1)[0].id == "sun#0"


def test_kb_from_a_folder_with_a_bad_file_and_the_cli(tmp_path, capsys):
    docs = tmp_path / "docs"
    (docs / "sub").mkdir(parents=True)
    (docs / "a.txt").write_text("Ada Lovelace wrote the first computer program.", encoding="utf-8")
    (docs / "sub" / "b.md").write_text("# Turing\n\nAlan Turing proposed the Turing test.", encoding="utf-8")
    (docs / "empty.txt").write_bytes(b"")
    assert cli_main(["index", "build", str(docs), "--out", str(tmp_path / "ix")]) == 0
    captured = capsys.readouterr()
    assert "index built" in captured.out and "2 documents" in captured.out and "empty file" in captured.err
    assert cli_main(["index", "build", str(docs), "--out", str(tmp_path / "ix")]) == 0
    assert "reused" in capsys.readouterr().out
    ev = make_retriever(f"kb:{tmp_path / 'ix'}").retrieve("who proposed the Turing test", k=1)
    assert ev[0].id == "sub/b.md#0"


def test_kb_bad_inputs_are_clear_errors(tmp_path, capsys):
    with pytest.raises(FileNotFoundError, match="halluscope index build"):
        make_retriever(f"kb:{tmp_path / 'nowhere'}")
    with pytest.raises(ValueError, match="no index folder"):
        make_retriever("kb")
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"id": "x", "text": "ok"}\n{"id": "y"}\n')
    with pytest.raises(ValueError, match="line 2"):
        build_index(bad, tmp_path / "ix")
    assert cli_main(["index", "build", str(tmp_path / "missing"), "--out", str(tmp_path / "ix")]) == 2
    assert "does not exist" in capsys.readouterr().err


# -- user files -----------------------------------------------------------------------------------------------

@pytest.fixture
def user_files(tmp_path):
    import docx
    from pypdf import PdfWriter

    d = tmp_path / "files"
    d.mkdir()
    (d / "notes.txt").write_text("The Danube flows through Vienna and Budapest.", encoding="utf-8")
    (d / "guide.md").write_text("# Rivers\n\nThe Rhine ends in the North Sea.", encoding="utf-8")
    (d / "moon.pdf").write_bytes(text_pdf("The Moon orbits the Earth every 27 days."))
    document = docx.Document()
    document.add_paragraph("Mount Everest is 8849 metres high.")
    document.save(str(d / "everest.docx"))
    writer = PdfWriter()
    writer.add_blank_page(200, 200)
    writer.encrypt("secret", algorithm="RC4-128")
    with open(d / "locked.pdf", "wb") as f:
        writer.write(f)
    (d / "broken.pdf").write_bytes(b"%PDF-1.4 this is not really a pdf")
    (d / "empty.md").write_bytes(b"")
    (d / "blob.txt").write_bytes(b"\x00\x01\x02binary\x00" * 10)
    (d / "image.png").write_bytes(b"\x89PNG\r\n")
    return d


def test_files_reads_txt_md_pdf_docx_and_reports_skipped(user_files):
    r = make_retriever(f"files:{user_files}")
    assert isinstance(r, FileRetriever)
    assert {p.rsplit("/", 1)[-1] for p in r.read} == {"notes.txt", "guide.md", "moon.pdf", "everest.docx"}
    reasons = {p.rsplit("/", 1)[-1]: why for p, why in r.skipped}
    assert set(reasons) == {"locked.pdf", "broken.pdf", "empty.md", "blob.txt", "image.png"}
    assert "encrypted" in reasons["locked.pdf"] and "unreadable PDF" in reasons["broken.pdf"]
    assert "empty" in reasons["empty.md"] and "binary" in reasons["blob.txt"] and "unsupported" in reasons["image.png"]
    assert "5 skipped" in r.report()
    assert r.retrieve("How high is Mount Everest?", k=1)[0].id.endswith("everest.docx#0")
    assert r.retrieve("moon orbit earth days", k=1)[0].id.endswith("moon.pdf#0")
    assert r.retrieve("Vienna", k=5)[0].source == "file"


def test_files_list_size_limit_and_nothing_usable(user_files, tmp_path):
    r = make_retriever(f"files:{user_files / 'notes.txt'},{user_files / 'guide.md'}")
    assert len(r.read) == 2 and r.skipped == []
    big = tmp_path / "big.txt"
    big.write_text("x " * 600_000)
    small = FileRetriever([big, user_files / "notes.txt"], max_mb=1)
    assert "over the 1 MB limit" in small.skipped[0][1]
    with pytest.raises(NoUsableFilesError, match="empty file"):
        FileRetriever(str(user_files / "empty.md"))
    with pytest.raises(FileNotFoundError, match="does not exist"):
        FileRetriever(str(tmp_path / "missing.pdf"))


# -- knowledge graph -----------------------------------------------------------------------------------------

def test_kg_tsv_and_ntriples_are_linearised_and_retrieved(tmp_path):
    tsv = tmp_path / "kg.tsv"
    tsv.write_text("# comment\nMarie Curie\tborn_in\tWarsaw\nMarie Curie\twon\tNobel Prize in Physics\n"
                   "Warsaw\tcapital_of\tPoland\n", encoding="utf-8")
    kg = make_retriever(f"kg:{tsv}")
    assert isinstance(kg, KGRetriever)
    ev = kg.retrieve("Where was Marie Curie born?", k=2)
    assert ev[0].text == "Marie Curie born in Warsaw." and ev[0].id == "kg.tsv:2" and ev[0].source == "kg"
    templated = KGRetriever(tsv, templates={"born_in": "{s} was born in {o}."})
    assert templated.retrieve("Marie Curie born", k=1)[0].text == "Marie Curie was born in Warsaw."
    nt = tmp_path / "kg.nt"
    nt.write_text('<http://dbpedia.org/resource/Ada_Lovelace> <http://dbpedia.org/ontology/birthPlace> '
                  '<http://dbpedia.org/resource/London> .\n'
                  '<http://dbpedia.org/resource/Ada_Lovelace> <http://xmlns.com/foaf/0.1/name> "Ada \\"Augusta\\" '
                  'King"@en .\n', encoding="utf-8")
    ev = KGRetriever(nt).retrieve("Ada Lovelace birth place", k=1)
    assert ev[0].text == "Ada Lovelace birth place London."
    assert linearize('<http://x/a_b>', '<http://x#name>', '"Ada \\"A\\""@en') == 'a b name Ada "A".'


@pytest.mark.parametrize("name,content,line", [
    ("bad.tsv", "a\tb\tc\na\tb\n", 2),
    ("bad.tsv", "a\tb\tc\td\n", 1),
    ("bad.nt", "<a> <b> <c> .\n<a> <b> .\n", 2),
    ("bad.nt", "<a> <b> <c>\n", 1),
])
def test_kg_wrong_arity_names_file_and_line(tmp_path, name, content, line):
    path = tmp_path / name
    path.write_text(content)
    with pytest.raises(TripleFormatError, match=f"{name}: line {line}"):
        KGRetriever(path)


# -- web search against a fake local server -----------------------------------------------------------------

class _FakeSearch(BaseHTTPRequestHandler):
    seen: list = []

    def do_GET(self):  # noqa: N802
        _FakeSearch.seen.append((self.path, self.headers.get("Authorization")))
        if "q=boom" in self.path:
            self.send_response(500)
            self.end_headers()
            return
        if "q=slow" in self.path:
            time.sleep(1.5)
        if "q=notjson" in self.path:
            body = b"<html>nope</html>"
        else:
            body = json.dumps({"results": [
                {"title": "Moon", "snippet": "The Moon orbits the Earth.", "url": "https://example.org/moon"},
                {"title": "Empty", "snippet": ""},
                {"snippet": "Second result.", "link": "https://example.org/2"}]}).encode()
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args):
        pass


@pytest.fixture
def search_server():
    server = ThreadingHTTPServer(("127.0.0.1", 0), _FakeSearch)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    _FakeSearch.seen.clear()
    yield f"http://127.0.0.1:{server.server_address[1]}/search"
    server.shutdown()
    server.server_close()


def test_search_adapter_against_a_local_fake_server(search_server, monkeypatch):
    monkeypatch.setenv("HALLUSCOPE_SEARCH_KEY", "sekret")
    r = make_retriever(f"search:{search_server}")
    assert isinstance(r, SearchRetriever)
    ev = r.retrieve("moon orbit", k=5)
    assert [e.text for e in ev] == ["Moon: The Moon orbits the Earth.", "Second result."]
    assert ev[0].id == "https://example.org/moon" and ev[0].source == "search" and ev[0].score == 1.0
    path, auth = _FakeSearch.seen[-1]
    assert "q=moon+orbit" in path and "k=5" in path and auth == "Bearer sekret"
    assert len(r.retrieve("moon", k=1)) == 1


def test_search_errors_are_clear(search_server, monkeypatch):
    monkeypatch.delenv("HALLUSCOPE_SEARCH_URL", raising=False)
    with pytest.raises(SearchError, match="web search is off"):
        make_retriever("search")
    r = SearchRetriever(search_server, timeout=0.5)
    with pytest.raises(SearchError, match="HTTP 500"):
        r.retrieve("boom")
    with pytest.raises(SearchError, match="did not answer within 0.5 s"):
        r.retrieve("slow")
    with pytest.raises(SearchError, match="did not return JSON"):
        r.retrieve("notjson")
    with pytest.raises(SearchError, match="cannot be reached"):
        SearchRetriever("http://127.0.0.1:9/none", timeout=2).retrieve("x")


def test_cached_retriever_wraps_the_new_sources(corpus_jsonl, tmp_path):
    build_index(corpus_jsonl, tmp_path / "ix")
    r = make_retriever(f"kb:{tmp_path / 'ix'}", cache=True, cache_dir=tmp_path / "cache")
    assert isinstance(r, CachedRetriever)
    first = r.retrieve("Mars moons", k=1)
    assert r.retrieve("Mars moons", k=1) == first and first[0].id == "mars#0"
