"""The client for OpenAI-compatible servers (``--lm openai/NAME --api-base URL``, also ``hosted_vllm/NAME``).

llama-cpp-python's server, llama.cpp's ``llama-server``, vLLM, Ollama, LM Studio and hosted APIs each accept a
different part of the OpenAI API. :class:`OpenAICompatEngine` is a DSPy engine (``dspy.LM(model, engine=...)``,
like the embedded :class:`halluscope.lm.models.LlamaCppEngine`) that speaks to any of them over HTTP:

* **structured output negotiation**: a request that asks for JSON is sent with the strongest form the server
  accepts, tried in the order of :data:`FORMATS` — ``json_schema`` (OpenAI's structured outputs), ``json_object``
  with a ``schema`` (llama-cpp-python, llama.cpp), a GBNF ``grammar`` made from the schema (llama.cpp), plain
  ``json_object``, none. A 4xx/5xx whose error names the format (``response_format``, ``json_schema``, ``grammar``,
  ...) moves to the next form at once (it is not retried as it was); what a server took is remembered per
  base URL + model for the process (:func:`server_capabilities`);
* **output budget**: ``max_tokens`` is always sent (``max_completion_tokens``, what an ``openai/`` model string
  sends through LiteLLM, is ignored by llama.cpp's servers), and ``stop`` when the request has one. A server that
  generates more than it was asked is remembered and gets ``max_completion_tokens`` as well from then on, and is
  counted (``stats.over_budget``); a generation cut at the budget (``finish_reason=length``) is counted
  (``stats.cut_generations``) and reported to the adapter, which makes it a parse failure of that call
  (:class:`halluscope.lm.models.TruncatedOutputError`);
* **retries**: connection errors, timeouts, HTTP 429 (its ``Retry-After`` honoured, capped) and 5xx are retried
  ``retries`` times with exponential backoff, then raised as DSPy's LM errors with one clean line (server text
  without tracebacks, credentials redacted); a reply that is not a usable chat completion (HTML, an empty choice
  list, a stream although ``stream: false`` was asked, no message) is a non-retried error naming what was wrong;
* **credentials in the URL** (``http://user:pw@host/v1``, ``?api_key=...``) are moved into an ``Authorization``
  header (:func:`split_url_credentials`) and registered as secrets, so they never reach an error, a log, a cache
  key or an MLflow param; the engine keeps and shows only the clean URL.
"""

from __future__ import annotations

import base64
import json
import math
import logging
import re
import threading
import time
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import parse_qsl, urlencode, urlsplit, urlunsplit

import httpx
from dspy import lm15
from dspy.lm15 import Message, Response, TokenLogprob, TopLogprob, Usage, response_to_events

from halluscope.core.redact import redact, redact_url, register_secret

logger = logging.getLogger(__name__)

__all__ = ["FORMATS", "OpenAICompatEngine", "ServerURL", "split_url_credentials", "server_capabilities",
           "SERVER_PREFIXES", "note_finish", "last_finish"]

#: Model-string prefixes whose ``api_base`` is served by :class:`OpenAICompatEngine`.
SERVER_PREFIXES = ("openai/", "hosted_vllm/")

#: Structured-output forms, strongest first.
FORMATS = ("json_schema", "json_object_schema", "grammar", "json_object", "none")

# What a server accepted, per (base URL, model): index into FORMATS, and whether it needs max_completion_tokens.
_CAPS: dict[tuple[str, str], dict[str, Any]] = {}
_CAPS_LOCK = threading.Lock()

# Words in an error that mean the server refused the structured-output part of the request.
_FORMAT_WORDS = re.compile(r"(?i)response_format|json_schema|json_object|grammar|\bschema\b|guided_")
_QUERY_KEYS = re.compile(r"(?i)^(api[_-]?key|apikey|key|token|access[_-]?token|auth)$")

# The finish reason of the last generation this thread received from an engine (see note_finish).
_FINISH = threading.local()


def note_finish(reason: str | None) -> None:
    """Record the finish reason of the generation just received in this thread (engines call it; the adapter
    reads it with :func:`last_finish` to refuse a generation cut at ``max_tokens``)."""
    _FINISH.reason = reason


def last_finish() -> str | None:
    return getattr(_FINISH, "reason", None)


def token_logprobs(logprobs: Any) -> tuple[TokenLogprob, ...] | None:
    """llama-cpp-python's OpenAI-style ``{"content": [{"token", "logprob", "top_logprobs": [...]}]}`` as DSPy's
    :class:`TokenLogprob` tuple (None when absent; entries without a finite logprob are skipped)."""
    content = (logprobs or {}).get("content") if isinstance(logprobs, dict) else None
    if not content:
        return None
    out = []
    for e in content:
        try:
            lp = float(e["logprob"])
        except (KeyError, TypeError, ValueError):
            continue
        if not math.isfinite(lp):
            continue
        alts = []
        for a in e.get("top_logprobs") or []:
            try:
                alp = float(a["logprob"])
            except (KeyError, TypeError, ValueError):
                continue
            if math.isfinite(alp):
                alts.append(TopLogprob(str(a.get("token", "")), alp))
        out.append(TokenLogprob(str(e.get("token", "")), lp, top=tuple(alts)))
    return tuple(out)


def server_capabilities() -> dict[str, dict[str, Any]]:
    """What each server took so far: ``{"<clean base URL> <model>": {"format": ..., "max_completion_tokens": bool}}``."""
    with _CAPS_LOCK:
        return {f"{b} {m}": {"format": FORMATS[c["level"]], "max_completion_tokens": c["mct"]}
                for (b, m), c in _CAPS.items()}


def reset_server_capabilities() -> None:
    """Forget what servers accepted (tests)."""
    with _CAPS_LOCK:
        _CAPS.clear()


@dataclass(frozen=True)
class ServerURL:
    """A base URL without credentials, and the headers that carry them."""

    base: str
    headers: dict[str, str] = field(default_factory=dict)
    secrets: tuple[str, ...] = ()


def split_url_credentials(url: str) -> ServerURL:
    """``http://user:pw@host/v1?api_key=K`` -> ``ServerURL("http://host/v1", {"Authorization": ...})``.

    ``user:pw`` becomes HTTP Basic authorization; a key in the query (``api_key``, ``key``, ``token``,
    ``access_token``, ``auth``) becomes ``Authorization: Bearer``; other query parameters stay. The credentials
    are registered with :func:`halluscope.core.redact.register_secret`. Raises ValueError (redacted) for a URL that is
    not http(s) or has no host.

    >>> split_url_credentials("http://127.0.0.1:8080/v1/").base
    'http://127.0.0.1:8080/v1'
    """
    parts = urlsplit(str(url).strip())
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise ValueError(f"--api-base must be an http(s) URL with a host, not {redact_url(url)!r}")
    headers: dict[str, str] = {}
    secrets: list[str] = []
    if parts.username is not None or parts.password is not None:
        from urllib.parse import unquote

        user, pw = unquote(parts.username or ""), unquote(parts.password or "")
        secrets += [s for s in (pw, f"{user}:{pw}", parts.password or "") if s]
        if pw:
            token = base64.b64encode(f"{user}:{pw}".encode()).decode()
            headers["Authorization"] = f"Basic {token}"
            secrets.append(token)
        elif user:  # http://TOKEN@host: a bare token as the user name
            headers["Authorization"] = f"Bearer {user}"
            secrets.append(user)
    kept = []
    for k, v in parse_qsl(parts.query, keep_blank_values=True):
        if _QUERY_KEYS.match(k) and v:
            headers["Authorization"] = f"Bearer {v}"
            secrets.append(v)
        else:
            kept.append((k, v))
    netloc = parts.hostname + (f":{parts.port}" if parts.port else "")
    if ":" in parts.hostname:  # IPv6
        netloc = f"[{parts.hostname}]" + (f":{parts.port}" if parts.port else "")
    base = urlunsplit((parts.scheme, netloc, parts.path.rstrip("/"), urlencode(kept), ""))
    for s in secrets:
        register_secret(s)
    return ServerURL(base, headers, tuple(secrets))


def clean_error_text(text: str, limit: int = 200) -> str:
    """One line from a server's error body: the ``error.message``/``detail`` of a JSON body, else the text without
    HTML tags and traceback lines (``Traceback``, ``File "..."``, indented frames), whitespace collapsed, cut to
    ``limit`` characters and redacted."""
    msg: Any = text
    try:
        body = json.loads(text)
    except (ValueError, TypeError):
        body = None
    if isinstance(body, dict):
        err = body.get("error", body.get("detail", body.get("message")))
        if isinstance(err, dict):
            err = err.get("message") or err.get("msg") or json.dumps(err)
        if isinstance(err, list):  # FastAPI/pydantic validation errors
            err = "; ".join(f"{'.'.join(str(x) for x in e.get('loc', []))}: {e.get('msg', '')}"
                            if isinstance(e, dict) else str(e) for e in err)
        msg = err if err is not None else text
    msg = re.sub(r"<[^>]+>", " ", str(msg))
    lines = [ln.strip() for ln in msg.splitlines()]
    lines = [ln for ln in lines if ln and not ln.startswith(("Traceback", "File ", "^", "~")) and ln != "File"]
    one = re.sub(r"\s+", " ", " ".join(lines)).strip()
    if len(one) > limit:
        one = one[: limit - 1] + "…"
    return redact(one) or "(empty body)"


@dataclass
class ServerStats:
    calls: int = 0
    retries: int = 0
    input_tokens: int = 0
    output_tokens: int = 0
    cut_generations: int = 0  # generations cut at max_tokens (finish_reason=length)
    truncated: int = 0  # prompts cut to fit the context (as LlamaCppEngine counts them): never, by a client
    over_budget: int = 0  # generations longer than the max_tokens sent (the server ignored it)
    downgrades: int = 0  # structured-output forms given up after the server refused them
    errors: int = 0  # requests that failed after the retries


class OpenAICompatEngine:
    """A ``dspy.LM`` engine for an OpenAI-compatible chat-completions server (see the module docstring).

    Args:
        base_url: the server's base URL (``http://host:port/v1``); credentials in it move to a header.
        model: the model name sent in each request (the model string without its ``openai/`` prefix).
        api_key: sent as ``Authorization: Bearer`` (not when the URL already carries credentials).
        timeout: seconds per request in all: connect, headers and the whole body (a server trickling its answer
            byte by byte fails at this bound, not per byte).
        retries: retries of a failed request (connection, timeout, 429, 5xx); 0 = one attempt.
        backoff: seconds before the first retry, doubled each time (capped at ``max_backoff``).
        transport: an ``httpx`` transport (tests: ``httpx.MockTransport``).
    """

    supports_response_schema = True
    supported_params = frozenset({"response_format", "temperature", "top_p", "max_tokens", "stop", "seed",
                                  "logprobs", "top_logprobs"})
    #: token alternatives per position a request asks for at most: OpenAI's limit, which vLLM, llama.cpp's server
    #: and Ollama follow or exceed by configuration only (``core.decisions.max_top_logprobs`` reads it)
    max_top_logprobs = 20

    def __init__(self, base_url: str, model: str, *, api_key: str | None = None, timeout: float = 120.0,
                 retries: int = 3, backoff: float = 1.0, max_backoff: float = 30.0, transport=None):
        url = split_url_credentials(base_url)
        self.base_url = url.base
        self.model = model
        self.timeout = float(timeout)
        self.retries = max(0, int(retries))
        self.backoff = float(backoff)
        self.max_backoff = float(max_backoff)
        self.stats = ServerStats()
        self._headers = dict(url.headers)
        register_secret(api_key)  # hidden everywhere even when the URL's own credentials are the ones sent
        if api_key and api_key != "not-needed" and "Authorization" not in self._headers:
            self._headers["Authorization"] = f"Bearer {api_key}"
        elif "Authorization" not in self._headers:
            self._headers["Authorization"] = "Bearer not-needed"  # some servers insist on a header
        self._client = httpx.Client(timeout=httpx.Timeout(self.timeout), headers=self._headers,
                                    transport=transport, follow_redirects=False)
        self._stats_lock = threading.Lock()
        self._warned: set[str] = set()

    def __repr__(self) -> str:  # never the headers
        return f"OpenAICompatEngine({self.base_url!r}, model={self.model!r})"

    def __deepcopy__(self, memo):  # one connection pool and one set of stats, shared like the embedded engine
        return self

    def __reduce__(self):  # a pickle would carry the credentials
        raise TypeError("OpenAICompatEngine is not picklable (it holds the server's credentials)")

    # -- capabilities ------------------------------------------------------------------------------
    @property
    def _key(self) -> tuple[str, str]:
        return (self.base_url, self.model)

    def _caps(self) -> dict[str, Any]:
        with _CAPS_LOCK:
            return dict(_CAPS.setdefault(self._key, {"level": 0, "mct": False}))

    def _set_caps(self, **kw) -> None:
        with _CAPS_LOCK:
            _CAPS.setdefault(self._key, {"level": 0, "mct": False}).update(kw)

    def _warn_once(self, key: str, message: str) -> None:
        if key not in self._warned:
            self._warned.add(key)
            logger.warning(message)

    # -- the request body --------------------------------------------------------------------------
    @staticmethod
    def _schema_of(response_format: Any) -> tuple[bool, dict | None, str]:
        """(JSON asked?, its schema or None, the schema's name)."""
        if not response_format:
            return False, None, "output"
        rf = dict(response_format)
        if rf.get("type") == "json_schema":
            inner = rf.get("json_schema") or rf
            return True, inner.get("schema"), str(inner.get("name") or "output")
        if rf.get("type") == "json_object":
            return True, rf.get("schema"), "output"
        return False, None, "output"

    @staticmethod
    def _grammar(schema: dict) -> str | None:
        try:
            from llama_cpp.llama_grammar import json_schema_to_gbnf

            return json_schema_to_gbnf(json.dumps(schema))
        except Exception:  # noqa: BLE001 - no llama-cpp-python, or a schema it cannot convert: skip this form
            return None

    def _format_fields(self, level: int, schema: dict | None, name: str) -> dict | None:
        """The body fields of structured-output form ``FORMATS[level]``; None when it does not apply."""
        form = FORMATS[level]
        if form == "json_schema":
            return {"response_format": {"type": "json_schema",
                                        "json_schema": {"name": re.sub(r"[^A-Za-z0-9_-]", "_", name)[:64],
                                                        "schema": schema, "strict": True}}} if schema else None
        if form == "json_object_schema":
            return {"response_format": {"type": "json_object", "schema": schema}} if schema else None
        if form == "grammar":
            g = self._grammar(schema) if schema else None
            return {"grammar": g} if g else None
        if form == "json_object":
            return {"response_format": {"type": "json_object"}}
        return {}

    def _body(self, request) -> tuple[dict, dict | None, str, bool]:
        cfg = request.config
        messages: list[dict] = []
        if request.system is not None:
            system = request.system if isinstance(request.system, str) else "".join(p.text for p in request.system)
            messages.append({"role": "system", "content": system})
        messages.extend({"role": m.role, "content": m.text or ""} for m in request.messages)
        body: dict[str, Any] = {"model": self.model, "messages": messages, "stream": False,
                                "max_tokens": int(cfg.max_tokens or 512),
                                "temperature": 0.0 if cfg.temperature is None else float(cfg.temperature)}
        if cfg.top_p is not None:
            body["top_p"] = float(cfg.top_p)
        if cfg.stop:
            body["stop"] = list(cfg.stop)
        if cfg.seed is not None:
            body["seed"] = int(cfg.seed)
        if cfg.logprobs:
            body.update(logprobs=True, top_logprobs=min(max(int(cfg.logprobs), 1), self.max_top_logprobs))
        wants_json, schema, name = self._schema_of(cfg.response_format)
        return body, schema, name, wants_json

    # -- the engine protocol ----------------------------------------------------------------------
    def complete(self, request) -> Response:
        body, schema, name, wants_json = self._body(request)
        note_finish(None)
        attempt = 0
        while True:
            caps = self._caps()
            level = caps["level"]
            send = dict(body)
            if caps["mct"]:
                send["max_completion_tokens"] = send["max_tokens"]
            if wants_json:
                while level < len(FORMATS) - 1 and self._format_fields(level, schema, name) is None:
                    level += 1
                send.update(self._format_fields(level, schema, name) or {})
            try:
                out = self._post(send)
            except _FormatRefused as e:  # raised only while a form is sent, so a weaker one exists
                nxt = level + 1
                while nxt < len(FORMATS) - 1 and self._format_fields(nxt, schema, name) is None:
                    nxt += 1
                self._set_caps(level=max(nxt, self._caps()["level"]))
                with self._stats_lock:
                    self.stats.downgrades += 1
                logger.warning("%s does not accept structured output as %s (%s); using %s from now on",
                               self.base_url, FORMATS[level], e.reason, FORMATS[nxt])
                continue  # the weaker form at once: not a retry
            except _Retryable as e:
                if attempt < self.retries:
                    delay = e.retry_after if e.retry_after is not None else self.backoff * (2 ** attempt)
                    time.sleep(min(max(delay, 0.0), self.max_backoff))
                    attempt += 1
                    with self._stats_lock:
                        self.stats.retries += 1
                    continue
                self._count_error()
                tries = f" (after {attempt + 1} attempts)" if attempt else ""
                raise e.as_error(tries) from None
            except lm15.LM15Error:
                self._count_error()
                raise
            return self._response(out, body["max_tokens"], bool(body.get("logprobs")))

    def _count_error(self) -> None:
        with self._stats_lock:
            self.stats.errors += 1

    def _post(self, body: dict) -> dict:
        url = self.endpoint("chat/completions")
        where = self.base_url
        try:
            r = self._send(url, body)
        except (httpx.TimeoutException, _Deadline):
            raise _Retryable(lm15.TimeoutError, f"timed out: no complete answer from {where} within "
                                                f"{self.timeout:g} s") from None
        except httpx.HTTPError as e:
            reason = clean_error_text(str(e) or type(e).__name__, 120)
            raise _Retryable(lm15.TransportError, f"cannot reach {where}: {reason}") from None
        text = r.text
        ctype = r.headers.get("content-type", "")
        if r.status_code >= 400:
            reason = clean_error_text(text)
            msg = f"{where} answered HTTP {r.status_code}: {reason}"
            if r.status_code in (400, 422, 500, 501) and _FORMAT_WORDS.search(text) and (
                    "response_format" in body or "grammar" in body):
                raise _FormatRefused(f"HTTP {r.status_code}: {reason}", msg, r.status_code)
            if r.status_code == 429:
                raise _Retryable(lm15.RateLimitError, msg, status=429, retry_after=_retry_after(r))
            if r.status_code >= 500 or r.status_code == 408:
                raise _Retryable(lm15.ServerError, msg, status=r.status_code, retry_after=_retry_after(r))
            if r.status_code in (401, 403):
                raise lm15.AuthError(msg + " (check --api-key or the credentials in --api-base)",
                                     status=r.status_code)
            if r.status_code == 404:
                raise lm15.InvalidRequestError(msg + f" (is --api-base the server's /v1 URL? it POSTs {url})", status=404)
            raise lm15.InvalidRequestError(msg, status=r.status_code)
        if "text/event-stream" in ctype or text.lstrip().startswith("data:"):
            raise lm15.ProviderError(f"{where} streamed its answer (text/event-stream) although stream=false was "
                                     "asked; this server cannot be used", status=r.status_code)
        try:
            out = json.loads(text)
        except ValueError:
            what = "HTML" if "html" in ctype or text.lstrip().lower().startswith(("<!doctype", "<html")) else \
                "a body that is not JSON"
            raise lm15.ProviderError(f"{where} answered {what} (HTTP {r.status_code}, {len(text)} bytes), not a chat "
                                     f"completion: is --api-base the server's /v1 URL?", status=r.status_code) from None
        if not isinstance(out, dict):
            raise lm15.ProviderError(f"{where} answered JSON that is not a chat completion object")
        choices = out.get("choices")
        if not isinstance(choices, list) or not choices:
            raise lm15.ProviderError(f"{where} answered a chat completion with no choices")
        msg = choices[0].get("message") if isinstance(choices[0], dict) else None
        if not isinstance(msg, dict) or not isinstance(msg.get("content", ""), (str, type(None))):
            raise lm15.ProviderError(f"{where} answered a choice without a message")
        return out

    def _send(self, url: str, body: dict) -> httpx.Response:
        """POST ``body`` and read the whole answer within ``self.timeout`` seconds **in all** (connect, headers and
        body together). httpx's timeouts bound each socket operation only, so a server that sends its headers and
        then one byte every few seconds would hold a request forever; here the request runs in a worker thread
        that the caller waits for at most ``timeout`` seconds (:class:`_Deadline` then). The abandoned worker stops
        at its next chunk or socket timeout and closes its connection."""
        box: dict[str, Any] = {}
        cancelled = threading.Event()

        def work() -> None:
            try:
                with self._client.stream("POST", url, json=body) as r:
                    chunks = []
                    for chunk in r.iter_bytes():
                        if cancelled.is_set():
                            return
                        chunks.append(chunk)
                    headers = [(k, v) for k, v in r.headers.multi_items()
                               if k.lower() not in ("content-encoding", "content-length", "transfer-encoding")]
                    box["response"] = httpx.Response(r.status_code, headers=headers, content=b"".join(chunks))
            except BaseException as e:  # noqa: BLE001 - handed to the caller's thread
                box["error"] = e

        worker = threading.Thread(target=work, name="halluscope-lm-request", daemon=True)
        worker.start()
        worker.join(self.timeout)
        if worker.is_alive():
            cancelled.set()
            raise _Deadline()
        if "error" in box:
            raise box["error"]
        return box["response"]

    def endpoint(self, path: str) -> str:
        """The URL of ``path`` under the base URL: joined to the base's path, the base's query (what remains after
        the credentials moved to a header) kept after it: ``http://h/v1?x=1`` + ``chat/completions`` ->
        ``http://h/v1/chat/completions?x=1``."""
        parts = urlsplit(self.base_url)
        return urlunsplit((parts.scheme, parts.netloc, parts.path.rstrip("/") + "/" + path.lstrip("/"),
                           parts.query, ""))

    def _response(self, out: dict, max_tokens: int, logprobs: bool) -> Response:
        choice = out["choices"][0]
        usage = out.get("usage") or {}
        n_out = _int(usage.get("completion_tokens"))
        finish = choice.get("finish_reason") or "stop"
        if finish == "tool_calls":
            finish = "tool_call"
        if finish not in ("stop", "length", "tool_call", "content_filter", "error"):
            finish = "stop"
        with self._stats_lock:
            self.stats.calls += 1
            self.stats.input_tokens += _int(usage.get("prompt_tokens"))
            self.stats.output_tokens += n_out
            if finish == "length":
                self.stats.cut_generations += 1
            if n_out > max_tokens:
                self.stats.over_budget += 1
        if n_out > max_tokens:
            if not self._caps()["mct"]:
                self._set_caps(mct=True)
            self._warn_once("budget", f"{self.base_url} generated {n_out} tokens although max_tokens={max_tokens} "
                                      "was sent: it ignores max_tokens (max_completion_tokens is sent as well from "
                                      "now on; counted in the engine's stats.over_budget)")
        note_finish(finish)
        return Response(
            id=out.get("id"), model=str(out.get("model") or self.model),
            message=Message.assistant(choice["message"].get("content") or ""),
            logprobs=token_logprobs(choice.get("logprobs")) if logprobs else None,
            finish_reason=finish,
            usage=Usage(input_tokens=_int(usage.get("prompt_tokens")), output_tokens=n_out,
                        total_tokens=_int(usage.get("total_tokens")) or _int(usage.get("prompt_tokens")) + n_out),
        )

    def check(self, timeout: float | None = None) -> None:
        """One tiny request without retries (``halluscope.lm.models.check_lm``); raises an LM error when it fails."""
        saved, self.retries = (self.retries, self.timeout), 0
        client = self._client
        try:
            if timeout:
                self.timeout = float(timeout)
                self._client = httpx.Client(timeout=httpx.Timeout(float(timeout)), headers=self._headers,
                                            transport=getattr(client, "_transport", None))
            req = lm15.Request(model=self.model, messages=(Message.user("Reply with OK."),),
                               config=lm15.Config(max_tokens=4, temperature=0.0))
            self.complete(req)
        finally:
            if self._client is not client:
                self._client.close()
            self._client, (self.retries, self.timeout) = client, saved

    def stream(self, request):  # DSPy streams only when asked; halluscope never does
        return response_to_events(self.complete(request))

    def close(self) -> None:
        pass


def _int(x: Any) -> int:
    try:
        return max(0, int(x))
    except (TypeError, ValueError):
        return 0


def _retry_after(r: httpx.Response) -> float | None:
    v = r.headers.get("retry-after")
    try:
        return float(v) if v is not None else None
    except ValueError:
        return None


class _Retryable(Exception):
    def __init__(self, kind, message: str, *, status: int | None = None, retry_after: float | None = None):
        super().__init__(message)
        self.kind, self.message, self.status, self.retry_after = kind, message, status, retry_after

    def as_error(self, suffix: str = "") -> lm15.LM15Error:
        if issubclass(self.kind, lm15.ProviderError):
            return self.kind(self.message + suffix, status=self.status)
        return self.kind(self.message + suffix)


class _Deadline(Exception):
    """A request that did not complete within the engine's timeout (headers and body together)."""


class _FormatRefused(Exception):
    def __init__(self, reason: str, message: str, status: int):
        super().__init__(message)
        self.reason, self.message, self.status = reason, message, status
