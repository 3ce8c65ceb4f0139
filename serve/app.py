"""The HTTP API and web page of ``halluscope serve``.

Endpoints (all JSON; the schema is at ``/openapi.json``, and the Swagger UI page at ``/docs`` renders it
offline from an installed copy of Swagger UI (:func:`swagger_assets`; off when none is installed))::

    POST /v1/detect          {answer, question?, context?, evidence?, lang?, task?, program?, version?, inputs?}
                             -> Detection.to_dict() (with "verdict": hallucinated / correct / unverifiable and
                                "verdict_reason") + {"counts", "counts_text" (contract.counts: hard/soft spans,
                                units flagged, labelled), "marks" (contract.display_marks: what to highlight),
                                "artifact": {program, key, metric, version, content_hash}, "seconds"}; with
                                lang "auto" (or no lang when several languages are loaded) also "lang_auto":
                                {lang, confidence, key}: the answer's language, identified offline
                                (core/langid), and the artifact key chosen (``all`` when unsure or not loaded)
    POST /v1/detect/batch    {"items": [<detect request>, ...]} (at most Limits.max_batch items)
                             -> {"results": [{"ok": true, ...} | {"ok": false, "status", "error"}], ...}
    POST /v1/evidence        {filename, content_base64} (a TXT/Markdown/PDF/DOCX file, at most Limits.max_upload_bytes)
                             -> {filename, type, bytes, chars, text}: the file's text, read on the server
    GET  /v1/artifacts       what is loaded: program, language/task, metric, version, hash, scores
    GET  /healthz            {"status": "ok", ...}
    GET  /                   the web page (plain HTML/CSS/JS shipped in the package; no network fetches)

Concurrency: programs that use no LM run in parallel on the thread pool; programs that call the LM take one
slot of ``lm_concurrency`` (default 1) first, so no two requests are inside the embedded llama.cpp model at
once (its engine also holds its own lock). A request waits for a slot at most ``Limits.timeout_s``.

Limits (:class:`Limits`): request body bytes (413; for ``/v1/evidence`` the base64 of ``max_upload_bytes``), an
uploaded PDF/DOCX's uncompressed bytes and pages (413) and extraction time (422), field lengths and batch size
(422 naming the field), a
per-request timeout (504; the work already started finishes in the background and its result is dropped, the
LM slot stays taken until it does). Bad input never stops the server: every error is a JSON body
``{"error": "...", "detail": ...}`` with a 4xx status, an unexpected failure inside a program a logged 500.

An API key, when set, is required on every ``/v1`` route as ``X-API-Key: KEY`` or ``Authorization: Bearer
KEY``; ``halluscope serve`` refuses to bind to a non-loopback address without one.
"""

# no "from __future__ import annotations": FastAPI reads the route annotations (local request models) at run time

import asyncio
import hmac
import importlib.util
import logging
import time
from dataclasses import asdict, dataclass
from functools import partial
from importlib import resources
from pathlib import Path
from typing import Any, Sequence

import dspy
from fastapi import Depends, FastAPI, HTTPException, Request
from fastapi.exceptions import RequestValidationError
from fastapi.openapi.docs import get_swagger_ui_html
from fastapi.responses import JSONResponse, Response
from pydantic import BaseModel, ConfigDict, Field
from starlette.concurrency import run_in_threadpool

from halluscope import __version__
from halluscope.artifacts.store import selection_score
from halluscope.core.contract import Evidence, counts, describe_counts, display_marks
from halluscope.artifacts.compiled import CompiledDetector, detect
from halluscope.programs.registry import get_program as get_spec
from halluscope.retrievers.files import ExtractionLimits
from halluscope.serve.evidence import EvidenceFileError, read_uploaded
from halluscope.core.tasks import HALLUCLEAN_TASKS

__all__ = ["Limits", "LoadedDetector", "create_app"]

log = logging.getLogger("halluscope.serve")

STATIC_FILES = {"index.html": "text/html; charset=utf-8", "app.js": "text/javascript; charset=utf-8",
                "style.css": "text/css; charset=utf-8"}
# The page may load only its own files: no CDN, no network fetches besides this server's API.
CSP = ("default-src 'self'; script-src 'self'; style-src 'self'; img-src 'self' data:; connect-src 'self'; "
       "frame-ancestors 'none'; base-uri 'none'; form-action 'self'")


@dataclass(frozen=True)
class Limits:
    """Bounds on what one request may ask for."""

    max_body_bytes: int = 1_000_000  # whole request body (413 beyond)
    max_answer_chars: int = 20_000
    max_question_chars: int = 5_000
    max_evidence_chars: int = 100_000  # context + all evidence passages together
    max_evidence_items: int = 50
    max_batch: int = 32
    max_upload_bytes: int = 5_000_000  # one evidence file sent to /v1/evidence (413 beyond)
    # reading an uploaded PDF/DOCX (retrievers.files.ExtractionLimits): uncompressed bytes (a DOCX's zip members
    # together, a PDF's streams each) and pages (413 beyond), seconds of extraction (422 beyond)
    max_upload_uncompressed_bytes: int = 20_000_000
    max_upload_pages: int = 300
    max_upload_seconds: float = 20.0
    timeout_s: float = 120.0  # per request (per item in a batch), waiting for the LM included


@dataclass(frozen=True)
class LoadedDetector:
    """A compiled detector as the server addresses it: by program and key (language or HalluClean task)."""

    detector: CompiledDetector
    uses_lm: bool
    extra_inputs: tuple[str, ...]

    @property
    def program(self) -> str:
        return self.detector.name

    @property
    def key(self) -> str:
        return self.detector.lang

    def describe(self) -> dict:
        m = self.detector.manifest
        cv = ((m.get("cv") or {}).get("mean") or {})
        metric = self.detector.metric
        scores = {stage: (vals.get(metric) or {}) for stage, vals in cv.items() if isinstance(vals, dict)}
        return {
            "program": self.program,
            "key": self.key,
            "lang": "" if self.key in HALLUCLEAN_TASKS else self.key,
            "task": self.key if self.key in HALLUCLEAN_TASKS else "",
            "metric": metric,
            "version": self.detector.version,
            "content_hash": self.detector.content_hash,
            "created_at": m.get("created_at"),
            "source": m.get("source"),
            "optimizer": (m.get("optimizer") or {}).get("description"),
            "compiled_with": (m.get("task_lm") or {}).get("model"),
            "selection_score": selection_score(m),
            "scores": scores,  # cross-validated {stage: {"mean", "sd"}} of the artifact's metric
            "uses_lm": self.uses_lm,
            "extra_inputs": list(self.extra_inputs),
        }


@dataclass(frozen=True)
class _AutoChoice:
    """A loaded detector chosen by ``lang: "auto"``, with what the identifier said."""

    loaded: "LoadedDetector"
    lang_auto: dict


def _with_auto(ld, auto: dict) -> _AutoChoice:
    return _AutoChoice(loaded=ld, lang_auto=auto)


def auto_key(req, keys: list[str]) -> dict:
    """``{"lang", "confidence", "key"}``: the language of the request's question and answer
    (:func:`halluscope.core.langid.identify`) and the loaded language key that serves it: its own, else ``all``,
    else (neither loaded) the only key when one is loaded; an :class:`ApiError` 422 naming the keys otherwise."""
    from halluscope.core.langid import identify

    code, conf = identify(f"{req.question or ''}\n{req.answer or ''}")
    key = code if code in keys else "all" if "all" in keys else keys[0] if len(keys) == 1 else None
    if key is None:
        raise ApiError(422, f"lang auto: the answer's language is {code or 'unsure'} and no artifact for it or "
                            f"for all is loaded ({', '.join(keys) or 'none'}); name one with lang")
    return {"lang": code, "confidence": round(conf, 4), "key": key}


def loaded(detector: CompiledDetector) -> LoadedDetector:
    spec = get_spec(detector.name)
    return LoadedDetector(detector=detector, uses_lm=spec.needs_lm(detector.manifest.get("program_options")),
                          extra_inputs=tuple(spec.extra_inputs))


class ApiError(Exception):
    def __init__(self, status: int, message: str, **detail: Any):
        super().__init__(message)
        self.status, self.message, self.detail = status, message, detail


def _request_models(limits: Limits):
    """The request bodies, with this server's limits in their JSON schema (so /docs shows them)."""

    class EvidencePassage(BaseModel):
        model_config = ConfigDict(extra="forbid")

        text: str = Field(description="the passage")
        source: str = Field("evidence", max_length=64, description="where it came from: evidence, file, kb, ...")
        id: str = Field("", max_length=255, description="an id within the source, e.g. the file name")

    class DetectRequest(BaseModel):
        model_config = ConfigDict(extra="forbid")

        answer: str = Field(max_length=limits.max_answer_chars, description="the answer to check")
        question: str = Field("", max_length=limits.max_question_chars, description="the question it answers")
        context: str = Field("", max_length=limits.max_evidence_chars,
                             description="reference text the detector may use (retrieved context)")
        evidence: list[str | EvidencePassage] = Field(
            default_factory=list, max_length=limits.max_evidence_items,
            description="evidence passages, joined to the context: plain text, or {text, source, id} to say where "
                        "each came from (the page sends uploaded files as source 'file', id the file name)")
        lang: str | None = Field(None, max_length=32, description="language (Mu-SHROOM code) of the artifact; "
                                                                  "auto: the answer's language, identified offline")
        task: str | None = Field(None, max_length=32, description="HalluClean task of a response-level artifact")
        program: str | None = Field(None, max_length=64, description="program name (default: the only one loaded)")
        version: int | None = Field(None, ge=1, description="artifact version (default: the one loaded)")
        inputs: dict[str, Any] = Field(default_factory=dict,
                                       description="program-specific inputs, e.g. model_output_tokens/_logits "
                                                   "for the logits program")

    class BatchRequest(BaseModel):
        model_config = ConfigDict(extra="forbid")

        items: list[DetectRequest] = Field(min_length=1, max_length=limits.max_batch)

    class EvidenceRequest(BaseModel):
        model_config = ConfigDict(extra="forbid")

        filename: str = Field(min_length=1, max_length=255,
                              description="the file's name; its suffix gives the type (.txt .md .pdf .docx ...)")
        content_base64: str = Field(description=f"the file's bytes, base64 (at most {limits.max_upload_bytes} "
                                                f"bytes before encoding)")

    return DetectRequest, BatchRequest, EvidenceRequest


def upload_body_bytes(limits: Limits) -> int:
    """The body limit of ``/v1/evidence``: the base64 of the largest file, and room for the JSON around it."""
    return (limits.max_upload_bytes + 2) // 3 * 4 + 4096


class _BodyTooLarge(Exception):
    pass


class BodyLimitMiddleware:
    """Refuse request bodies over ``max_bytes`` with 413: by Content-Length before reading, and while reading
    a body sent without one (chunked)."""

    def __init__(self, app, max_bytes: int, path_limits: dict[str, int] | None = None):
        self.app, self.default_max, self.path_limits = app, max_bytes, dict(path_limits or {})

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        max_bytes = self.path_limits.get(scope.get("path", ""), self.default_max)
        headers = dict(scope.get("headers") or [])
        declared = headers.get(b"content-length")
        if declared is not None:
            try:
                n = int(declared)
            except ValueError:
                return await _send_json(send, 400, {"error": "invalid Content-Length header"})
            if n > max_bytes:
                return await _send_json(send, 413, self._message(n, max_bytes))
        received = 0
        too_large = answered = False

        async def limited_receive():
            nonlocal received, too_large
            message = await receive()
            if message["type"] == "http.request":
                received += len(message.get("body", b""))
                if received > max_bytes:
                    too_large = True
                    raise _BodyTooLarge
            return message

        async def guarded_send(message):
            # The app may turn the read error into its own response (FastAPI answers 400): send ours instead.
            nonlocal answered
            if not too_large:
                await send(message)
            elif message["type"] == "http.response.start" and not answered:
                answered = True
                await _send_json(send, 413, self._message(received, max_bytes))

        try:
            await self.app(scope, limited_receive, guarded_send)
        except _BodyTooLarge:
            if not answered:
                await _send_json(send, 413, self._message(received, max_bytes))

    @staticmethod
    def _message(n: int, limit: int) -> dict:
        return {"error": f"request body too large: {n} bytes, the limit is {limit}", "detail": {"limit_bytes": limit}}


async def _send_json(send, status: int, body: dict) -> None:
    data = JSONResponse(body).body
    await send({"type": "http.response.start", "status": status,
                "headers": [(b"content-type", b"application/json"), (b"content-length", str(len(data)).encode())]})
    await send({"type": "http.response.body", "body": data})


def _field_errors(exc: RequestValidationError) -> tuple[str, list[dict]]:
    """One readable line naming each bad field (``items.2.answer: String should have at most 20000
    characters``), and the errors without the echoed input (which may be huge)."""
    errors, lines = [], []
    for e in exc.errors():
        loc = [str(p) for p in e.get("loc", ()) if p != "body"]
        where = ".".join(loc) or "body"
        msg = e.get("msg", "invalid")
        if e.get("type") == "json_invalid":
            where, msg = "body", f"malformed JSON ({(e.get('ctx') or {}).get('error', 'cannot be parsed')})"
        lines.append(f"{where}: {msg}")
        errors.append({"field": where, "message": msg, "type": e.get("type")})
    return "; ".join(lines), errors


def create_app(
    detectors: Sequence[CompiledDetector],
    *,
    lm: dspy.LM | None = None,
    adapter: dspy.Adapter | None = None,
    api_key: str | None = None,
    limits: Limits = Limits(),
    lm_concurrency: int = 1,
    startup_seconds: float | None = None,
) -> FastAPI:
    """The FastAPI app serving ``detectors`` (already loaded and verified).

    ``lm``/``adapter``: what LM programs run with (default: whatever :func:`halluscope.configure` set).
    ``api_key``: required on ``/v1`` routes when given. ``lm_concurrency``: requests allowed inside LM programs
    at once (1 for the embedded model; more for a server that batches).
    """
    if not detectors:
        raise ValueError("nothing to serve: give at least one compiled detector")
    if lm_concurrency < 1:
        raise ValueError(f"lm_concurrency must be at least 1, not {lm_concurrency}")
    table: dict[tuple[str, str, int], LoadedDetector] = {}
    for d in detectors:
        ld = loaded(d)
        table[(ld.program, ld.key, ld.detector.version)] = ld
    DetectRequest, BatchRequest, EvidenceRequest = _request_models(limits)
    extraction = ExtractionLimits(max_uncompressed_bytes=limits.max_upload_uncompressed_bytes,
                                  max_pages=limits.max_upload_pages, max_seconds=limits.max_upload_seconds)
    started_at = time.time()
    lm_slots = asyncio.Semaphore(lm_concurrency)
    stats = {"requests": 0, "errors": 0, "timeouts": 0}

    app = FastAPI(title="halluscope", version=__version__, docs_url=None, redoc_url=None,
                  description="Find hallucinated spans in LLM answers with compiled halluscope detectors.")
    app.state.detectors = table
    app.state.limits = limits

    async def require_key(request: Request) -> None:
        if api_key is None:
            return
        given = request.headers.get("x-api-key")
        auth = request.headers.get("authorization", "")
        if given is None and auth.lower().startswith("bearer "):
            given = auth[7:].strip()
        if not given or not hmac.compare_digest(given.encode(), api_key.encode()):
            raise ApiError(401, "missing or wrong API key: send it as 'X-API-Key: KEY' or 'Authorization: Bearer KEY'")

    @app.exception_handler(ApiError)
    async def _api_error(_request: Request, exc: ApiError):
        stats["errors"] += 1
        return JSONResponse({"error": exc.message, "detail": exc.detail}, status_code=exc.status)

    @app.exception_handler(RequestValidationError)
    async def _validation_error(_request: Request, exc: RequestValidationError):
        stats["errors"] += 1
        message, errors = _field_errors(exc)
        return JSONResponse({"error": message, "detail": errors}, status_code=422)

    @app.exception_handler(HTTPException)
    async def _http_error(_request: Request, exc: HTTPException):
        return JSONResponse({"error": str(exc.detail), "detail": None}, status_code=exc.status_code,
                            headers=getattr(exc, "headers", None))

    def choose(req) -> LoadedDetector:
        loaded_list = ", ".join(f"{p}/{k}/v{v:04d}" for p, k, v in sorted(table))
        programs = sorted({p for p, _, _ in table})
        program = req.program
        if program is None:
            if len(programs) > 1:
                raise ApiError(422, f"program: several programs are loaded ({', '.join(programs)}); name one",
                               loaded=loaded_list)
            program = programs[0]
        if program not in programs:
            raise ApiError(404, f"program {program!r} is not loaded; loaded: {loaded_list}", loaded=loaded_list)
        if req.lang and req.task and req.lang != req.task:
            raise ApiError(422, "give lang or task, not both")
        key = req.task or req.lang
        keys = sorted({k for p, k, _ in table if p == program})
        auto = None
        if key == "auto" or (key is None and len([k for k in keys if k not in HALLUCLEAN_TASKS]) > 1):
            auto = auto_key(req, [k for k in keys if k not in HALLUCLEAN_TASKS])
            key = auto["key"]
        if key is None:
            if len(keys) > 1:
                raise ApiError(422, f"lang: {program} is loaded for several languages/tasks ({', '.join(keys)}); "
                                    f"name one", loaded=loaded_list)
            key = keys[0]
        if key not in keys:
            raise ApiError(404, f"{program} is not loaded for {'task' if req.task else 'lang'} {key!r}; "
                                f"loaded: {', '.join(keys)}", loaded=loaded_list)
        versions = sorted(v for p, k, v in table if p == program and k == key)
        version = req.version if req.version is not None else versions[-1] if len(versions) == 1 else None
        if version is None:
            raise ApiError(422, f"version: {program}/{key} is loaded in versions {versions}; name one")
        if version not in versions:
            raise ApiError(404, f"version {version} of {program}/{key} is not loaded; loaded: "
                                f"{', '.join(f'v{v:04d}' for v in versions)}", loaded=loaded_list)
        ld = table[(program, key, version)]
        return ld if auto is None else _with_auto(ld, auto)

    def prepare(ld: LoadedDetector, req):
        """The detection call for ``req`` (checked inputs and evidence size), not yet run."""
        unknown = sorted(set(req.inputs) - set(ld.extra_inputs))
        if unknown:
            raise ApiError(422, f"inputs: {ld.program} takes no input(s) {unknown}; it takes "
                                f"{list(ld.extra_inputs) or 'none'}")
        passages = [Evidence(text=req.context, source="context")] if req.context else []
        for i, p in enumerate(req.evidence):
            item = Evidence(text=p, source="evidence", id=f"evidence[{i}]") if isinstance(p, str) else \
                Evidence(text=p.text, source=p.source or "evidence", id=p.id or f"evidence[{i}]")
            if item.text:
                passages.append(item)
        context = "\n\n".join(p.text for p in passages)
        if len(context) > limits.max_evidence_chars:
            raise ApiError(422, f"evidence: context and evidence together have {len(context)} characters, "
                                f"the limit is {limits.max_evidence_chars}")
        is_task = ld.key in HALLUCLEAN_TASKS
        call = partial(detect, ld.detector, req.answer, question=req.question, context=context,
                       lang=None if is_task else ld.key, task=ld.key if is_task else None, **req.inputs)
        return partial(with_passages, call, passages)

    def in_lm_context(call):
        if lm is None and adapter is None:
            return call()
        overrides = {k: v for k, v in (("lm", lm), ("adapter", adapter)) if v is not None}
        with dspy.context(**overrides):
            return call()

    async def detect_one(req) -> dict:
        t0 = time.perf_counter()
        ld = choose(req)
        auto = getattr(ld, "lang_auto", None)
        ld = getattr(ld, "loaded", ld)
        call = prepare(ld, req)
        loop = asyncio.get_running_loop()
        deadline = loop.time() + limits.timeout_s
        if ld.uses_lm:
            try:
                await asyncio.wait_for(lm_slots.acquire(), limits.timeout_s)
            except TimeoutError:
                stats["timeouts"] += 1
                raise ApiError(503, f"the language model stayed busy for {limits.timeout_s:g} s; try again later")
        task = asyncio.ensure_future(run_in_threadpool(in_lm_context, call))
        if ld.uses_lm:
            task.add_done_callback(lambda _t: lm_slots.release())  # only when the work is really over
        try:
            det = await asyncio.wait_for(asyncio.shield(task), max(0.0, deadline - loop.time()))
        except TimeoutError:
            stats["timeouts"] += 1
            task.add_done_callback(_drop_result)
            raise ApiError(504, f"detection took longer than the {limits.timeout_s:g} s limit")
        except Exception as e:  # a program bug: logged, contained, reported
            log.exception("detection failed in %s/%s", ld.program, ld.key)
            raise ApiError(500, f"detection failed: {type(e).__name__}: {str(e)[:300]}")
        row = det.to_dict()
        return {**row, "counts": counts(row), "counts_text": describe_counts(counts(row)),
                "marks": display_marks(row), **({"lang_auto": auto} if auto else {}),
                "artifact": _artifact_ref(ld), "seconds": round(time.perf_counter() - t0, 4)}

    @app.post("/v1/detect", dependencies=[Depends(require_key)], summary="Detect hallucinated spans in one answer")
    async def detect_route(req: DetectRequest) -> dict:
        stats["requests"] += 1
        return await detect_one(req)

    @app.post("/v1/detect/batch", dependencies=[Depends(require_key)],
              summary=f"Detect on up to {limits.max_batch} answers; one result per item, in order")
    async def batch_route(req: BatchRequest) -> dict:
        stats["requests"] += 1
        t0 = time.perf_counter()

        async def one(item):
            try:
                return {"ok": True, **(await detect_one(item))}
            except ApiError as e:
                return {"ok": False, "status": e.status, "error": e.message}

        results = await asyncio.gather(*(one(item) for item in req.items))
        return {"results": results, "ok": sum(r["ok"] for r in results),
                "failed": sum(not r["ok"] for r in results), "seconds": round(time.perf_counter() - t0, 4)}

    @app.post("/v1/evidence", dependencies=[Depends(require_key)],
              summary="The text of an evidence file (TXT, Markdown, PDF, DOCX), read on the server")
    async def evidence_route(req: EvidenceRequest) -> dict:
        stats["requests"] += 1
        try:
            return await run_in_threadpool(read_uploaded, req.filename, req.content_base64,
                                           max_bytes=limits.max_upload_bytes, max_chars=limits.max_evidence_chars,
                                           extraction=extraction)
        except EvidenceFileError as e:
            raise ApiError(e.status, e.message) from None

    @app.get("/v1/artifacts", dependencies=[Depends(require_key)], summary="The compiled artifacts loaded")
    async def artifacts_route() -> dict:
        return {"artifacts": [table[k].describe() for k in sorted(table)],
                "limits": asdict(limits), "lm_concurrency": lm_concurrency}

    @app.get("/healthz", summary="Liveness: the server answers and has detectors loaded")
    async def healthz() -> dict:
        return {"status": "ok", "loaded": len(table), "uptime_s": round(time.time() - started_at, 1),
                "startup_s": startup_seconds, **stats, "lm_busy": lm_slots.locked()}

    @app.get("/", include_in_schema=False)
    async def index() -> Response:
        return _static("index.html")

    @app.get("/static/{name}", include_in_schema=False)
    async def static(name: str) -> Response:
        if name not in STATIC_FILES:
            raise ApiError(404, f"no static file {name!r}")
        return _static(name)

    docs = swagger_assets()
    app.state.docs_url = "/docs" if docs is not None else None
    if docs is not None:  # the Swagger UI page, its script and style from an installed package: no CDN

        @app.get("/docs", include_in_schema=False)
        async def docs_page() -> Response:
            return get_swagger_ui_html(openapi_url=app.openapi_url, title="halluscope API",
                                       swagger_js_url="/docs/assets/swagger-ui-bundle.js",
                                       swagger_css_url="/docs/assets/swagger-ui.css",
                                       swagger_favicon_url="/docs/assets/favicon.png")

        @app.get("/docs/assets/{name}", include_in_schema=False)
        async def docs_asset(name: str) -> Response:
            if name not in SWAGGER_FILES:
                raise ApiError(404, f"no docs asset {name!r}")
            return Response((docs / name).read_bytes(), media_type=SWAGGER_FILES[name],
                            headers={"Cache-Control": "max-age=86400", "X-Content-Type-Options": "nosniff"})

    app.add_middleware(BodyLimitMiddleware, max_bytes=limits.max_body_bytes,
                       path_limits={"/v1/evidence": max(limits.max_body_bytes, upload_body_bytes(limits))})
    return app


SWAGGER_FILES = {"swagger-ui-bundle.js": "text/javascript; charset=utf-8", "swagger-ui.css": "text/css; charset=utf-8",
                 "favicon.png": "image/png"}


def swagger_assets() -> Path | None:
    """The folder of an installed Swagger UI (5.x: it renders the OpenAPI 3.1 that FastAPI writes), or None.

    The one installed here is the copy litellm ships for its proxy (litellm comes with dspy), found without
    importing litellm; without it ``/docs`` is off and the schema stays at ``/openapi.json``."""
    spec = importlib.util.find_spec("litellm")
    if spec is None or not spec.origin:
        return None
    folder = Path(spec.origin).parent / "proxy" / "swagger"
    return folder if all((folder / name).is_file() for name in SWAGGER_FILES) else None


def with_passages(call, passages: list[Evidence]):
    """Run ``call`` (a detection on the joined context); when the program named no passages of its own (none,
    or only the joined context), its ``evidence`` becomes the passages as sent, each with its source."""
    det = call()
    joined = "\n\n".join(p.text for p in passages)
    if passages and (not det.evidence or (len(det.evidence) == 1 and det.evidence[0].source == "context"
                                          and det.evidence[0].text == joined and not det.evidence[0].id)):
        det.evidence = list(passages)
    return det


def _drop_result(task: asyncio.Future) -> None:
    """Retrieve a timed-out task's outcome so asyncio does not warn about it; log a failure."""
    if not task.cancelled() and task.exception() is not None:
        log.warning("a timed-out detection later failed: %r", task.exception())


def _artifact_ref(ld: LoadedDetector) -> dict:
    return {"program": ld.program, "key": ld.key, "metric": ld.detector.metric, "version": ld.detector.version,
            "content_hash": ld.detector.content_hash}


_STATIC_CACHE: dict[str, bytes] = {}


def _static(name: str) -> Response:
    if name not in _STATIC_CACHE:
        _STATIC_CACHE[name] = resources.files("halluscope.serve").joinpath("static", name).read_bytes()
    return Response(_STATIC_CACHE[name], media_type=STATIC_FILES[name],
                    headers={"Content-Security-Policy": CSP, "X-Content-Type-Options": "nosniff",
                             "Cache-Control": "no-cache"})
