"""``halluscope lm-server``: a GGUF model as an OpenAI-compatible chat server, built by halluscope's model factory.

    halluscope lm-server --port 8080                           # the embedded SmolLM2-135M-Instruct
    halluscope lm-server --model /models/other.gguf --host 0.0.0.0 --port 8080 --name other
    halluscope evaluate --program spans --lang de --lm openai/smollm2 --api-base http://127.0.0.1:8080/v1

Why not ``python -m llama_cpp.server``: it cannot be given llama.cpp's ``use_extra_bufts`` parameter, so on a CPU
that advertises AMX inside a virtual machine that does not enable it the server dies on its first request. This
one loads the model through :func:`halluscope.lm.llamacpp.load_llama` (the safe parameters unless the probe showed
the fast path works) and serves it with :mod:`halluscope.serve.openai_compat`: ``POST /v1/chat/completions``
(``json_schema`` and ``json_object`` response formats constrain decoding with a grammar; ``max_tokens``,
``temperature``, ``top_p``, ``stop``, ``seed``) and ``GET /v1/models``; one request inside the model at a time.
The model is loaded before the port is bound: a missing or non-GGUF ``--model`` is one line and exit status 2.
"""

from __future__ import annotations

import sys

from halluscope.cli.common import THREADS, ranged, whole

__all__ = ["add_parser", "cmd_lm_server"]


def add_parser(subparsers) -> None:
    p = subparsers.add_parser("lm-server", help="serve a GGUF model (default: the embedded one) as an "
                                                "OpenAI-compatible chat server")
    p.add_argument("--model", default=None, metavar="PATH.gguf", help="GGUF file (default: the embedded model)")
    p.add_argument("--name", default=None, help="model id it reports in /v1/models (default: the file's stem)")
    p.add_argument("--host", default="127.0.0.1", help="interface to listen on (default 127.0.0.1)")
    p.add_argument("--port", type=ranged(whole(1, 65535)), default=8080, help="port (default 8080)")
    p.add_argument("--n-ctx", type=ranged(whole(64, 1 << 20)), default=8192, help="context size in tokens (default 8192)")
    p.add_argument("--n-threads", type=THREADS, default=None, help="llama.cpp threads (default: its choice)")
    p.add_argument("--log-level", default="warning", choices=["critical", "error", "warning", "info", "debug"],
                   help="uvicorn's log level (default warning)")
    p.add_argument("--debug", action="store_true", help="show the traceback of an error")
    p.set_defaults(func=cmd_lm_server)


def cmd_lm_server(args) -> int:
    import uvicorn

    from halluscope.serve.openai_compat import LlamaBackend, create_openai_app

    backend = LlamaBackend(args.model, n_ctx=args.n_ctx, n_threads=args.n_threads)  # ModelFileError: exit 2
    name = args.name or backend.name
    params = "fast path (use_extra_bufts on)" if backend.llm.model_params.use_extra_bufts else \
        "safe parameters (use_extra_bufts off)"
    print(f"halluscope lm-server: {backend.model_path.name} as {name!r} on http://{args.host}:{args.port}/v1 "
          f"(llama.cpp {params})", file=sys.stderr, flush=True)
    uvicorn.run(create_openai_app(backend, model_name=name), host=args.host, port=args.port,
                log_level=args.log_level)
    return 0
