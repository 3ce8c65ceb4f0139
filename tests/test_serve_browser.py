"""The web page of ``halluscope serve`` in a real browser: the operating system's headless Chromium, driven by
Selenium through the OS chromedriver (Debian: ``apt-get install chromium chromium-driver``). No browser is
downloaded. Screenshots go to ``outputs/serve/``.

The server runs in this process (uvicorn on a thread) with a deterministic no-LM fixture program whose detection
has every part the page shows (spans of several probabilities, units, rationale, revision, evidence), and the
span detector on a scripted LM.
"""

from __future__ import annotations

import contextlib

import os
import shutil
import socket
import threading
import time
from pathlib import Path

import dspy
import httpx
import pytest
import uvicorn

from halluscope.artifacts import store as A
from halluscope.core.contract import Detection, Evidence, Span, Unit, to_prediction
from halluscope.programs.registry import REGISTRY, ProgramSpec, register_program
from halluscope.serve import create_app
from halluscope.lm.scripted import scripted_lm

CHROMIUM = next((p for p in (os.environ.get("HALLUSCOPE_CHROMIUM"), shutil.which("chromium"),
                             shutil.which("chromium-browser"), "/usr/bin/chromium") if p and Path(p).is_file()), None)
CHROMEDRIVER = next((p for p in (os.environ.get("HALLUSCOPE_CHROMEDRIVER"), shutil.which("chromedriver"),
                                 "/usr/bin/chromedriver") if p and Path(p).is_file()), None)

pytestmark = pytest.mark.skipif(
    CHROMIUM is None or CHROMEDRIVER is None,
    reason="no system Chromium/chromedriver: install them with `apt-get install chromium chromium-driver` "
           "(Debian/Ubuntu; .ci/run does this when it runs as root)")

webdriver = pytest.importorskip("selenium.webdriver", reason="selenium is in the test extra: pip install -e '.[test]'")
from selenium.webdriver.common.by import By  # noqa: E402
from selenium.webdriver.common.keys import Keys  # noqa: E402
from selenium.webdriver.support import expected_conditions as EC  # noqa: E402
from selenium.webdriver.support.ui import WebDriverWait  # noqa: E402

SHOTS = Path(__file__).resolve().parent.parent / "outputs" / "serve"
ANSWER = "The capital of Australia is Sydney, which became the capital in 1901."
REVISION = "The capital of Australia is Canberra, which became the capital in 1913."
EVIDENCE = "Canberra is the capital city of Australia. It was selected as the site of the capital in 1908."


class PageFixture(dspy.Module):
    """A no-LM detector with every part of the contract filled in, at fixed offsets of ``ANSWER``."""

    def forward(self, answer: str = "", context: str = "", **_):
        i, j = answer.find("Sydney"), answer.find("1901")
        spans = [Span(i, i + 6, 0.9)] + ([Span(j, j + 4, 0.35)] if j >= 0 else [])
        cut = answer.find(",")
        units = [Unit("claim", 0, cut, answer[:cut], "contradiction", 0.9, "evidence names Canberra"),
                 Unit("claim", cut + 2, len(answer), answer[cut + 2:], "neutral", 0.35)]
        return to_prediction(Detection(
            answer=answer, spans=spans if i >= 0 else [], label=True, score=0.9, units=units,
            rationale="The evidence says Canberra, not Sydney.", revision=REVISION,
            evidence=[Evidence(context or EVIDENCE, source="context", id="passage-1", score=1.0)]))


def _register_fixture() -> None:
    if "page-fixture" not in REGISTRY:
        register_program(ProgramSpec(name="page-fixture", build=PageFixture, description="browser-test fixture",
                             uses_lm=False))


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@contextlib.contextmanager
def _serving(app):
    """``app`` served by uvicorn in a thread on a free loopback port until the block ends; yields its base URL."""
    port = _free_port()
    srv = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=port, log_level="warning"))
    thread = threading.Thread(target=srv.run, daemon=True)
    thread.start()
    base = f"http://127.0.0.1:{port}"
    for _ in range(200):
        try:
            if httpx.get(base + "/healthz", timeout=1).status_code == 200:
                break
        except httpx.HTTPError:
            time.sleep(0.05)
    try:
        yield base
    finally:
        srv.should_exit = True
        thread.join(10)


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    _register_fixture()
    root = tmp_path_factory.mktemp("compiled")
    A.write_artifact(PageFixture(), {"source": "fixture"}, program_name="page-fixture", lang="en", metric="iou",
                     root=root)
    from halluscope.programs.spans.program import SpanDetector

    A.write_artifact(SpanDetector(), {"source": "fixture"}, program_name="spans", lang="de", metric="iou", root=root)
    detectors = [A.load_compiled("page-fixture", lang="en", metric="iou", root=root),
                 A.load_compiled("spans", lang="de", metric="iou", root=root)]
    lm = scripted_lm({"spans": [{"text": "Bonn", "probability": 0.8}]})
    with _serving(create_app(detectors, lm=lm, adapter=dspy.JSONAdapter())) as base:
        yield base


@pytest.fixture(scope="module")
def browser():
    from selenium.webdriver.chrome.service import Service

    os.environ.setdefault("SE_OFFLINE", "true")  # never let Selenium Manager fetch anything
    opts = webdriver.ChromeOptions()
    opts.binary_location = CHROMIUM
    for arg in ("--headless=new", "--no-sandbox", "--disable-dev-shm-usage", "--disable-gpu",
                "--window-size=375,1400", "--no-first-run", "--disable-extensions"):
        opts.add_argument(arg)
    opts.set_capability("goog:loggingPrefs", {"browser": "ALL"})
    driver = webdriver.Chrome(options=opts, service=Service(CHROMEDRIVER))
    driver.set_page_load_timeout(30)
    # a phone's viewport (Chromium keeps desktop windows wider than 375 px)
    driver.execute_cdp_cmd("Emulation.setDeviceMetricsOverride",
                           {"width": 375, "height": 1400, "deviceScaleFactor": 1, "mobile": True})
    yield driver
    driver.quit()


def _open(browser, server):
    browser.get(server + "/")
    WebDriverWait(browser, 10).until(lambda d: len(d.find_elements(By.CSS_SELECTOR, "#artifact option")) == 2)


def _wait_result(browser):
    WebDriverWait(browser, 20).until(EC.visibility_of_element_located((By.ID, "result")))
    WebDriverWait(browser, 20).until(lambda d: d.find_element(By.ID, "status").text == "Done.")


def test_page_highlights_spans_by_probability_at_375px(browser, server, tmp_path):
    _open(browser, server)
    labels = [o.text for o in browser.find_elements(By.CSS_SELECTOR, "#artifact option")]
    assert labels[0].startswith("page-fixture · lang en · v0001") and labels[1].startswith("spans · lang de")
    browser.find_element(By.ID, "example").click()
    assert browser.find_element(By.ID, "answer").get_property("value") == ANSWER
    import docx

    from tests.test_retrievers import text_pdf

    notes = tmp_path / "notes.txt"
    notes.write_text("Parliament House is in Canberra.\n", encoding="utf-8")
    (tmp_path / "moon.pdf").write_bytes(text_pdf("The Moon orbits the Earth every 27 days."))
    document = docx.Document()
    document.add_paragraph("Canberra was founded in 1913.")
    document.save(str(tmp_path / "history.docx"))
    # uploaded evidence files: text, PDF and DOCX, each read by the server (POST /v1/evidence)
    browser.find_element(By.ID, "evidence-files").send_keys(
        "\n".join(str(tmp_path / n) for n in ("notes.txt", "moon.pdf", "history.docx")))
    browser.find_element(By.ID, "submit").click()
    _wait_result(browser)

    marks = browser.find_elements(By.CSS_SELECTOR, "#highlighted mark.span")
    assert [m.text for m in marks] == ["Sydney", "1901"]
    assert [float(m.get_attribute("data-prob")) for m in marks] == [0.9, 0.35]
    assert marks[0].get_attribute("title") == "p = 0.90 · claim 1: contradiction"
    assert marks[1].get_attribute("title") == "p = 0.35 · claim 2: neutral"
    alphas = [float(m.value_of_css_property("background-color").rstrip(")").split(",")[-1]) for m in marks]
    assert alphas[0] > alphas[1] > 0  # more probable = more intense
    assert "hard" in marks[0].get_attribute("class") and "soft" in marks[1].get_attribute("class")
    assert browser.find_element(By.ID, "highlighted").text == ANSWER  # the text itself is untouched

    assert browser.find_element(By.ID, "rationale").text == "The evidence says Canberra, not Sydney."
    rows = [[td.text for td in tr.find_elements(By.TAG_NAME, "td")]
            for tr in browser.find_elements(By.CSS_SELECTOR, "#units tbody tr")]
    assert rows[0][1:] == ["claim", "The capital of Australia is Sydney", "contradiction", "0.90"]
    assert rows[1][3:] == ["neutral", "0.35"]
    assert [e.text for e in browser.find_elements(By.CSS_SELECTOR, "#revision del")] == ["Sydney,", "1901."]
    assert [e.text for e in browser.find_elements(By.CSS_SELECTOR, "#revision ins")] == ["Canberra,", "1913."]
    evidence = browser.find_element(By.ID, "evidence-list").text
    assert EVIDENCE in evidence and "passage-1" in evidence
    assert "Parliament House is in Canberra." in evidence  # the files' text reached the detector
    assert "The Moon orbits the Earth every 27 days." in evidence and "Canberra was founded in 1913." in evidence
    assert "page-fixture en iou v0001" in browser.find_element(By.ID, "provenance").text

    # fits 375 px: nothing scrolls sideways
    assert browser.execute_script("return window.innerWidth") == 375
    assert browser.execute_script("return document.documentElement.scrollWidth") <= 375
    SHOTS.mkdir(parents=True, exist_ok=True)
    browser.save_screenshot(str(SHOTS / "page-375px.png"))
    assert (SHOTS / "page-375px.png").stat().st_size > 10_000
    errors = [e for e in browser.get_log("browser") if e["level"] == "SEVERE"]
    assert not errors, errors  # no script errors, no blocked (CSP) or failed fetches


def test_page_names_an_unreadable_evidence_file(browser, server, tmp_path):
    _open(browser, server)
    browser.find_element(By.ID, "example").click()
    (tmp_path / "scan.pdf").write_bytes(b"%PDF-1.4 not really a pdf")
    browser.find_element(By.ID, "evidence-files").send_keys(str(tmp_path / "scan.pdf"))
    browser.find_element(By.ID, "submit").click()
    WebDriverWait(browser, 10).until(lambda d: d.find_element(By.ID, "status").text.startswith("Error:"))
    status = browser.find_element(By.ID, "status").text
    assert "scan.pdf: unreadable PDF" in status, status
    assert browser.find_element(By.ID, "submit").is_enabled()  # the page stays usable


def test_page_is_keyboard_usable_with_the_scripted_lm(browser, server):
    _open(browser, server)
    select = browser.find_element(By.ID, "artifact")
    select.send_keys(Keys.ARROW_DOWN)  # keyboard choice of the second detector: spans, scripted LM
    WebDriverWait(browser, 5).until(lambda d: select.get_property("value") == "1")
    answer = browser.find_element(By.ID, "answer")
    answer.clear()
    answer.send_keys("Die Hauptstadt von Deutschland ist Bonn.")
    answer.send_keys(Keys.CONTROL, Keys.ENTER)  # Ctrl+Enter submits
    _wait_result(browser)
    assert browser.switch_to.active_element.get_attribute("id") == "result"  # focus moved to the result
    browser.switch_to.active_element.send_keys(Keys.TAB)
    focused = browser.switch_to.active_element
    assert focused.tag_name == "mark" and focused.text == "Bonn"
    assert focused.get_attribute("aria-label").startswith("hallucinated, probability 0.80")
    assert browser.find_element(By.ID, "units-box").get_property("hidden") is True
    assert browser.find_element(By.ID, "revision-box").get_property("hidden") is True
    browser.execute_cdp_cmd("Emulation.setDeviceMetricsOverride",
                            {"width": 1024, "height": 900, "deviceScaleFactor": 1, "mobile": False})
    browser.save_screenshot(str(SHOTS / "page-1024px-keyboard.png"))


def test_page_reports_errors_and_needs_a_key_when_set(browser, tmp_path):
    _register_fixture()
    A.write_artifact(PageFixture(), {"source": "fixture"}, program_name="page-fixture", lang="en", metric="iou",
                     root=tmp_path)
    app = create_app([A.load_compiled("page-fixture", lang="en", metric="iou", root=tmp_path)], api_key="k-123")
    port = _free_port()
    srv = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=port, log_level="warning"))
    thread = threading.Thread(target=srv.run, daemon=True)
    thread.start()
    try:
        for _ in range(200):
            try:
                httpx.get(f"http://127.0.0.1:{port}/healthz", timeout=1)
                break
            except httpx.HTTPError:
                time.sleep(0.05)
        browser.get(f"http://127.0.0.1:{port}/")
        WebDriverWait(browser, 10).until(lambda d: "needs an API key" in d.find_element(By.ID, "status").text)
        assert browser.find_element(By.ID, "key-row").get_property("open") is True
        key = browser.find_element(By.ID, "api-key")
        key.send_keys("k-123")
        key.send_keys(Keys.TAB)  # change event: the detectors are listed with the key
        WebDriverWait(browser, 10).until(lambda d: len(d.find_elements(By.CSS_SELECTOR, "#artifact option")) == 1)
        answer = browser.find_element(By.ID, "answer")
        browser.execute_script("arguments[0].value = arguments[1]", answer, "x" * 20_001)  # over the limit
        browser.find_element(By.ID, "submit").click()
        WebDriverWait(browser, 10).until(lambda d: d.find_element(By.ID, "status").text.startswith("Error:"))
        assert "answer" in browser.find_element(By.ID, "status").text
    finally:
        srv.should_exit = True
        thread.join(10)


def test_docs_page_renders_offline(browser, server):
    """/docs draws the API from this server's own copy of Swagger UI: every route shows, nothing is fetched
    from elsewhere (the browser log has no failed request)."""
    browser.get_log("browser")  # drain what earlier tests logged
    browser.get(server + "/docs")
    WebDriverWait(browser, 20).until(lambda d: d.find_elements(By.CSS_SELECTOR, ".opblock-summary-path"))
    paths = {e.text.replace("\u200b", "") for e in browser.find_elements(By.CSS_SELECTOR, ".opblock-summary-path")}
    assert {"/v1/detect", "/v1/detect/batch", "/v1/evidence", "/v1/artifacts", "/healthz"} <= paths
    assert "halluscope" in browser.find_element(By.CSS_SELECTOR, ".info .title").text
    SHOTS.mkdir(parents=True, exist_ok=True)
    browser.save_screenshot(str(SHOTS / "docs.png"))
    errors = [e for e in browser.get_log("browser") if e["level"] == "SEVERE"]
    assert not errors, errors


def test_page_summary_counts_what_the_cli_counts(browser, server):
    _open(browser, server)
    browser.find_element(By.ID, "example").click()
    browser.find_element(By.ID, "submit").click()
    _wait_result(browser)
    summary = browser.find_element(By.ID, "summary").text
    # the same labelled line as `halluscope detect --format text` (contract.describe_counts)
    assert "1 hallucinated span (p > 0.5) · 2 marked spans (p > 0) · 1 of 2 units flagged (p > 0.5)" in summary


@pytest.fixture(scope="module")
def grounded_server():
    """The committed grounded artifacts for German and English, as `halluscope serve --lang de --lang en` serves
    them: the page's default is the answer's language (#34)."""
    from halluscope.artifacts.store import load_compiled

    detectors = [load_compiled("grounded", lang=lang, metric="iou") for lang in ("de", "en")]
    with _serving(create_app(detectors)) as base:
        # the first auto request loads the language identifier's model (seconds): not inside the page's waits
        httpx.post(base + "/v1/detect", json={"answer": "Warm up the identifier, please.", "lang": "auto",
                                              "context": "Warm up."}, timeout=120)
        yield base


def test_page_defaults_to_the_answers_language_and_says_cannot_verify_without_evidence(browser, grounded_server):
    browser.get(grounded_server + "/")
    WebDriverWait(browser, 10).until(lambda d: len(d.find_elements(By.CSS_SELECTOR, "#artifact option")) == 3)
    assert browser.find_element(By.ID, "artifact").get_property("value") == "auto"
    answer = browser.find_element(By.ID, "answer")
    answer.clear()
    answer.send_keys("The Golden Gate Bridge in Los Angeles opened in 1947.")
    browser.find_element(By.ID, "evidence").send_keys("The Golden Gate Bridge in San Francisco opened in 1937.")
    browser.find_element(By.ID, "submit").click()
    _wait_result(browser)
    assert browser.find_element(By.ID, "summary").text.startswith("Hallucination detected")
    assert "grounded en iou" in browser.find_element(By.ID, "provenance").text
    assert "language en (auto" in browser.find_element(By.ID, "provenance").text
    browser.find_element(By.ID, "evidence").clear()
    answer.clear()
    answer.send_keys("Paris is the capital of France.")
    browser.find_element(By.ID, "submit").click()
    WebDriverWait(browser, 20).until(lambda d: d.find_element(By.ID, "summary").text.startswith("Cannot verify"))
    assert "no evidence" in browser.find_element(By.ID, "summary").text
    assert browser.find_elements(By.CSS_SELECTOR, "#highlighted mark.span") == []
