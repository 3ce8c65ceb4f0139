"""A minimal OpenAI-compatible chat server, for running halluscope's ``--lm openai/NAME --api-base URL`` path
offline, against the embedded GGUF or a deterministic stand-in.

    halluscope lm-server --port 8081                                # the embedded SmolLM2 GGUF (the command)
    python -m halluscope.serve.openai_compat --port 8081            # the same, by its module
    halluscope evaluate --lm openai/smollm2 --api-base http://127.0.0.1:8081/v1 --limit 3

It speaks the part of the API DSPy/LiteLLM use: ``POST /v1/chat/completions`` (``messages``, ``max_tokens`` or
``max_completion_tokens``, ``temperature``, ``top_p``, ``stop``, ``seed``, ``response_format``) and
``GET /v1/models``. A ``json_schema`` response format constrains decoding the way llama.cpp's own server does
(a grammar from the schema). Backends:

* :class:`LlamaBackend` — a GGUF through llama-cpp-python (built by :func:`halluscope.lm.llamacpp.load_llama`, so
  with parameters that cannot crash), one request inside the model at a time;
* :class:`SchemaBackend` — answers with a JSON object valid under the request's schema (from a responder
  function, else each field's simplest value): tests of the client path that need no model.

Fault injection for tests of the client's retries and timeouts: ``fail_first`` (answer the first N requests
with HTTP 500) and ``delay_s`` (sleep before answering). Every request's body, without its messages, is kept in
``app.state.requests``; the API key is never stored.
"""

# no "from __future__ import annotations": FastAPI reads the route annotations at run time

import asyncio
import json
import threading
import time
import uuid
from pathlib import Path
from typing import Any, Callable

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse
from starlette.concurrency import run_in_threadpool

from halluscope.lm.llamacpp import check_gguf, load_llama
from halluscope.lm.models import response_schema, smollm2_path
from halluscope.programs.registry import ranged, whole

__all__ = ["Completion", "LlamaBackend", "SchemaBackend", "create_openai_app", "schema_instance"]


class Completion(dict):
    """``{"text", "finish_reason", "prompt_tokens", "completion_tokens"}``."""


def _schema_of(body: dict) -> dict | None:
    rf = response_schema(body.get("response_format"))
    return (rf or {}).get("schema") if rf else None


def _budget(body: dict, default: int = 512) -> int:
    return int(body.get("max_tokens") or body.get("max_completion_tokens") or default)


class LlamaBackend:
    """A GGUF model (default: the embedded SmolLM2) answering chat requests; one request at a time."""

    def __init__(self, model_path: str | Path | None = None, n_ctx: int = 8192, n_threads: int | None = None):
        # the compiled extension: loaded only when this backend is used; a bad path is a ModelFileError
        self.model_path = check_gguf(model_path if model_path else smollm2_path())
        self.llm = load_llama(self.model_path, n_ctx=n_ctx, n_threads=n_threads, seed=0)
        self.lock = threading.Lock()
        self.name = self.model_path.stem

    def __call__(self, body: dict) -> Completion:
        kwargs: dict[str, Any] = {"max_tokens": _budget(body), "temperature": float(body.get("temperature") or 0.0)}
        for k in ("top_p", "stop", "seed"):
            if body.get(k) is not None:
                kwargs[k] = body[k]
        rf = response_schema(body.get("response_format"))
        if rf is not None:
            kwargs["response_format"] = rf
        messages = [{"role": m.get("role", "user"), "content": _text(m.get("content"))} for m in body["messages"]]
        with self.lock:
            out = self.llm.create_chat_completion(messages=messages, **kwargs)
        choice, usage = out["choices"][0], out.get("usage") or {}
        return Completion(text=choice["message"].get("content") or "", finish_reason=choice.get("finish_reason") or "stop",
                          prompt_tokens=usage.get("prompt_tokens", 0), completion_tokens=usage.get("completion_tokens", 0))


def _text(content: Any) -> str:
    if isinstance(content, list):  # OpenAI content parts
        return "".join(p.get("text", "") for p in content if isinstance(p, dict))
    return content or ""


def schema_instance(schema: dict, defs: dict | None = None) -> Any:
    """The simplest value valid under a JSON schema (objects with every required property, empty lists,
    empty strings, zeros, the first enum value)."""
    defs = defs if defs is not None else schema.get("$defs") or schema.get("definitions") or {}
    if "$ref" in schema:
        return schema_instance(defs[schema["$ref"].rsplit("/", 1)[-1]], defs)
    for key in ("anyOf", "oneOf", "allOf"):
        if schema.get(key):
            return schema_instance(schema[key][0], defs)
    if "enum" in schema:
        return schema["enum"][0]
    if "const" in schema:
        return schema["const"]
    kind = schema.get("type")
    if isinstance(kind, list):
        kind = next((k for k in kind if k != "null"), "null")
    if kind == "object" or "properties" in schema:
        props = schema.get("properties") or {}
        return {k: schema_instance(v, defs) for k, v in props.items() if k in schema.get("required", props)}
    return {"array": [], "string": "", "integer": 0, "number": 0.0, "boolean": False, "null": None}.get(kind, "")


class SchemaBackend:
    """Answers every request with a JSON object valid under its schema: ``responder(body, schema)`` when given
    (its dict is overlaid on the simplest valid object), else the simplest valid object itself."""

    name = "schema-stand-in"

    def __init__(self, responder: Callable[[dict, dict], dict] | None = None):
        self.responder = responder

    def __call__(self, body: dict) -> Completion:
        schema = _schema_of(body)
        value = schema_instance(schema) if schema else {}
        if self.responder is not None:
            value = {**value, **self.responder(body, schema or {})}
        text = json.dumps(value, ensure_ascii=False) if schema or self.responder else "free text, no schema was sent"
        return Completion(text=text, finish_reason="stop", prompt_tokens=sum(len(_text(m.get("content"))) // 4
                                                                              for m in body.get("messages", [])),
                          completion_tokens=max(1, len(text) // 4))


def create_openai_app(backend: Callable[[dict], Completion], *, model_name: str | None = None,
                      fail_first: int = 0, delay_s: float = 0.0) -> FastAPI:
    """The OpenAI-compatible app around ``backend`` (see the module docstring)."""
    app = FastAPI(title="halluscope OpenAI-compatible test server")
    app.state.requests = []  # request bodies without messages, in arrival order
    app.state.failures_left = fail_first
    name = model_name or getattr(backend, "name", "model")

    @app.get("/v1/models")
    async def models() -> dict:
        return {"object": "list", "data": [{"id": name, "object": "model", "owned_by": "halluscope"}]}

    @app.post("/v1/chat/completions")
    async def chat(request: Request):
        try:
            body = await request.json()
        except ValueError:
            return JSONResponse({"error": {"message": "malformed JSON", "type": "invalid_request_error"}}, 400)
        if not isinstance(body, dict) or not isinstance(body.get("messages"), list):
            return JSONResponse({"error": {"message": "messages is required", "type": "invalid_request_error"}}, 400)
        app.state.requests.append({k: v for k, v in body.items() if k != "messages"})
        if app.state.failures_left > 0:
            app.state.failures_left -= 1
            return JSONResponse({"error": {"message": "injected failure", "type": "server_error"}}, 500)
        if delay_s:
            await asyncio.sleep(delay_s)
        out = await run_in_threadpool(backend, body)
        return {
            "id": f"chatcmpl-{uuid.uuid4().hex[:12]}", "object": "chat.completion", "created": int(time.time()),
            "model": body.get("model", name),
            "choices": [{"index": 0, "message": {"role": "assistant", "content": out["text"]},
                         "finish_reason": out["finish_reason"]}],
            "usage": {"prompt_tokens": out["prompt_tokens"], "completion_tokens": out["completion_tokens"],
                      "total_tokens": out["prompt_tokens"] + out["completion_tokens"]},
        }

    return app


def main(argv: list[str] | None = None) -> int:
    import uvicorn

    from halluscope.cli import Parser

    p = Parser(prog="python -m halluscope.serve.openai_compat",
               description="A minimal OpenAI-compatible server for a GGUF model (default: the "
                           "embedded SmolLM2-135M-Instruct).")
    p.add_argument("--model", default=None, help="GGUF file (default: the embedded model)")
    p.add_argument("--name", default=None, help="model id it reports (default: the file's stem)")
    p.add_argument("--host", default="127.0.0.1")
    p.add_argument("--port", type=ranged(whole(0, 65535)), default=8081)
    p.add_argument("--n-ctx", type=ranged(whole(1)), default=8192)
    p.add_argument("--n-threads", type=ranged(whole(1)), default=None,
                   help="llama.cpp threads (default: llama.cpp's choice)")
    args = p.parse_args(argv)
    backend = LlamaBackend(args.model, n_ctx=args.n_ctx, n_threads=args.n_threads)
    uvicorn.run(create_openai_app(backend, model_name=args.name), host=args.host, port=args.port, log_level="warning")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
