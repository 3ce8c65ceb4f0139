"""A scripted LM for deterministic tests of programs and optimizers.

:class:`ScriptedEngine` is a ``dspy.LM`` engine (DSPy 3.4's ``engine=`` protocol). For every call it asks a
*responder* for the output values and answers in the adapter's own format. It never reads DSPy's prompt
wording: which signature is being called, with which input values, through which adapter, comes from a DSPy
callback (:class:`SignatureTap`, ``on_adapter_format_start``) that :func:`scripted_lm` installs in
``dspy.settings.callbacks``; the answer is rendered by the adapter's own
``format_assistant_message_content``. The engine is thread-safe and counts its calls, so it can drive
``dspy.Evaluate`` and optimizers such as MIPROv2 as well as single modules.

A responder is either a callable ``responder(call: Call) -> dict`` or a dict ``{output_field: value}``
where a value may itself be a callable ``value(call) -> value``. Outputs it does not name get a
type-appropriate default ("" for text, [] for lists, ...), so scripts stay short. A callable responder may
instead return a ``str``: the engine answers with that text verbatim (garbage, truncated JSON), not in the
adapter's format.

``scripted_lm(responder, logprobs=fn)`` also answers requests for token log-probabilities: ``fn(call)`` returns
``{field: {label: probability}}`` for the decision fields of that call, and the response carries one token per
value with those labels as its alternatives (what :mod:`halluscope.core.decisions` reads); without ``logprobs`` the
engine, like a backend without them, returns none.
"""

from __future__ import annotations

import threading
import typing
from dataclasses import dataclass, field
from typing import Any, Callable

import dspy
from dspy.lm15 import Message, Response, TokenLogprob, TopLogprob, Usage, response_to_events
from dspy.utils.callback import BaseCallback

__all__ = ["Call", "ScriptedEngine", "SignatureTap", "TwoCallProgram", "scripted_lm"]


class SignatureTap(BaseCallback):
    """Remembers, per thread, the signature, input values and adapter of the adapter call being formatted
    (the LM call that follows in the same thread is the one it belongs to)."""

    def __init__(self) -> None:
        self._local = threading.local()

    def on_adapter_format_start(self, call_id: str, instance: Any, inputs: dict[str, Any]) -> None:
        self._local.current = (instance, inputs.get("signature"), dict(inputs.get("inputs") or {}))

    def current(self) -> tuple[Any, Any, dict]:
        cur = getattr(self._local, "current", None)
        if cur is None or cur[1] is None:
            raise RuntimeError("ScriptedEngine: no adapter call was seen in this thread; is the SignatureTap "
                               "still in dspy.settings.callbacks? (scripted_lm() installs it)")
        return cur


TAP = SignatureTap()


def _install_tap() -> None:
    callbacks = list(dspy.settings.get("callbacks") or [])
    if not any(cb is TAP for cb in callbacks):
        dspy.settings.configure(callbacks=[*callbacks, TAP])


@dataclass
class Call:
    """One LM call as the scripted engine saw it."""

    outputs: dict[str, str]  # output field name -> its type, as text ("str", "list[QuotedSpan]", ...)
    inputs: dict[str, Any]  # input field name -> value the program passed
    system: str
    user: str
    temperature: float | None = None
    seed: int | None = None
    chat_format: bool = False
    top_logprobs: int | None = None  # the token alternatives the request asked for (None: no log-probabilities)
    reply: str = ""  # the text the engine answered (its usage counts len(reply) // 4 output tokens)

    def has(self, text: str) -> bool:
        """Whether ``text`` occurs anywhere in the prompt (system or last user message)."""
        return text in self.system or text in self.user


def _type_name(annotation: Any) -> str:
    return getattr(annotation, "__name__", None) if typing.get_origin(annotation) is None else str(annotation)


def _default(annotation: Any) -> Any:
    origin = typing.get_origin(annotation) or annotation
    if origin in (list, tuple, set):
        return []
    if origin is dict:
        return {}
    if origin is bool:
        return False
    if origin in (int, float):
        return 0
    return ""


@dataclass
class ScriptedEngine:
    responder: Callable[[Call], dict] | dict
    calls: list[Call] = field(default_factory=list)
    logprobs: Callable[[Call], dict] | None = None
    #: alternatives per position it returns at most, as a backend caps ``top_logprobs`` (the most likely kept)
    max_top_logprobs: int = 20
    supports_response_schema = False
    supported_params = frozenset({"temperature", "max_tokens", "stop", "seed", "logprobs", "top_logprobs"})

    def __post_init__(self):
        self._lock = threading.Lock()

    def _tokens(self, call: Call, text: str, values: dict) -> tuple | None:
        """One token per decision value (its alternatives: the ``min(call.top_logprobs, max_top_logprobs)`` most
        likely of ``self.logprobs(call)``), the rest as single tokens."""
        import math
        import re

        dists = self.logprobs(call) if self.logprobs is not None else {}
        cuts = []
        for name, dist in (dists or {}).items():
            value = str(values.get(name, ""))
            m = re.search(rf'"{re.escape(name)}"\s*:\s*"?|\[\[ ## {re.escape(name)} ## \]\]\s*', text)
            at = text.find(value, m.end()) if m and value else -1
            if at >= 0:
                kept = sorted(((lab, p) for lab, p in dist.items() if p > 0), key=lambda lp: -lp[1])
                kept = kept[: min(call.top_logprobs or len(kept), self.max_top_logprobs)]
                top = tuple(TopLogprob(str(lab), math.log(p)) for lab, p in kept)
                cuts.append((at, at + len(value), top))
        out, pos = [], 0
        for start, end, top in sorted(cuts):
            if start > pos:
                out.append(TokenLogprob(text[pos:start], -0.01))
            lp = next((t.logprob for t in top if t.token == text[start:end]), -0.01)
            out.append(TokenLogprob(text[start:end], lp, top=top))
            pos = end
        if pos < len(text):
            out.append(TokenLogprob(text[pos:], -0.01))
        return tuple(out)

    def complete(self, request) -> Response:
        adapter, signature, inputs = TAP.current()
        system = request.system if isinstance(request.system, str) else "".join(
            p.text for p in (request.system or []))
        user = request.messages[-1].text or "" if request.messages else ""
        fields = signature.output_fields
        call = Call({k: _type_name(f.annotation) for k, f in fields.items()},
                    {k: v for k, v in inputs.items() if k in signature.input_fields}, system, user,
                    request.config.temperature, request.config.seed,
                    chat_format=not isinstance(adapter, dspy.JSONAdapter),
                    top_logprobs=int(request.config.logprobs) if request.config.logprobs else None)
        with self._lock:
            self.calls.append(call)
        if callable(self.responder):
            values = self.responder(call)
        else:
            values = {k: (v(call) if callable(v) else v) for k, v in self.responder.items()}
        if isinstance(values, str):  # verbatim text: what a broken model or server answers
            text, logprobs = values, None
        else:
            values = {k: values[k] if k in values else _default(f.annotation) for k, f in fields.items()}
            text = adapter.format_assistant_message_content(signature, values)
            logprobs = self._tokens(call, text, values) if request.config.logprobs and self.logprobs else None
        call.reply = text
        return Response(id=None, model="scripted", message=Message.assistant(text), finish_reason="stop",
                        logprobs=logprobs,
                        usage=Usage(input_tokens=len(system + user) // 4, output_tokens=len(text) // 4,
                                    total_tokens=(len(system + user) + len(text)) // 4))

    def stream(self, request):
        return response_to_events(self.complete(request))

    def close(self) -> None:
        pass


def scripted_lm(responder, model: str = "scripted/test", logprobs: Callable[[Call], dict] | None = None,
                cache: bool = False) -> dspy.LM:
    """A ``dspy.LM`` (never cached unless ``cache``) answering through :class:`ScriptedEngine`;
    ``lm.engine.calls`` logs calls. ``logprobs``: see the module docstring.

    Installs :data:`TAP` in ``dspy.settings.callbacks`` (once), which is how the engine learns the signature."""
    _install_tap()
    return dspy.LM(model, engine=ScriptedEngine(responder, logprobs=logprobs), cache=cache)


class _Ask(dspy.Signature):
    """Answer."""

    question: str = dspy.InputField()
    answer: str = dspy.OutputField()


class TwoCallProgram(dspy.Module):
    """A detector-shaped program that makes two LM calls per item, the second with a longer prompt (so token counts
    differ between calls): what usage-counting tests and ``scripts/bench_usage_count.py`` run on a scripted LM."""

    def __init__(self):
        super().__init__()
        self.ask = dspy.Predict(_Ask)

    def forward(self, question, answer=None, context=None):
        self.ask(question=question)
        out = self.ask(question=question + " Say it again, at more length.")
        return dspy.Prediction(spans=[], hard_labels=[], soft_labels=[], label=out.answer == "yes")
